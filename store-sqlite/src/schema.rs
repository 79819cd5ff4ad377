//! Opening connections: file mode, pragmas, and the versioned schema.

use std::{fs, path::Path};

use mcp_persist_core::{Error, Result};
use rusqlite::{Connection, OpenFlags};

use crate::{
    Durability, SqliteOptions,
    error::{Ctx, SetupError},
};

/// The schema version this build writes and understands, kept in the
/// database's `user_version`.
pub const SCHEMA_VERSION: u32 = 1;

/// Marks a database as ours in its header (`PRAGMA application_id`): "MCPp".
pub(crate) const APPLICATION_ID: i32 = 0x4d43_5070;

/// `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`. Entries are
/// only ever appended: a released migration never changes.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: key-value records, one version clock, logs and their records.
    r#"
    CREATE TABLE kv (
        key        TEXT PRIMARY KEY NOT NULL,
        value      BLOB NOT NULL,
        version    INTEGER NOT NULL,
        expires_at INTEGER
    );
    CREATE INDEX kv_expiry ON kv (expires_at) WHERE expires_at IS NOT NULL;
    CREATE TABLE counters (
        name  TEXT PRIMARY KEY NOT NULL,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO counters (name, value) VALUES ('kv_version', 0);
    CREATE TABLE logs (
        id         INTEGER PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        last_seq   INTEGER NOT NULL,
        expires_at INTEGER
    );
    CREATE INDEX logs_expiry ON logs (expires_at) WHERE expires_at IS NOT NULL;
    CREATE TABLE log_records (
        log_id INTEGER NOT NULL,
        seq    INTEGER NOT NULL,
        data   BLOB NOT NULL,
        PRIMARY KEY (log_id, seq)
    );
    "#,
];

const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION as usize);

/// Creates the database file (mode 0600, in a folder created 0700 if missing)
/// without touching an existing one.
pub(crate) fn prepare_file(path: &Path) -> Result<()> {
    let io = |source| {
        Error::backend(
            crate::error::NAME,
            SetupError::File {
                path: path.display().to_string(),
                source,
            },
        )
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.exists()
    {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent).map_err(io)?;
    }
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(io)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{:o}", mode & 0o777),
                "the SQLite database file is readable by other users; it may hold secrets, \
                 consider chmod 600"
            );
        }
    }
    drop(file);
    Ok(())
}

/// Opens the connection that writes, checks the schema before changing
/// anything, switches to WAL (verified) and migrates forward.
pub(crate) fn open_writer(
    path: Option<&Path>,
    options: &SqliteOptions,
    ctx: Ctx<'_>,
) -> Result<Connection> {
    let conn = match path {
        Some(path) => {
            prepare_file(path)?;
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
        }
        None => Connection::open_in_memory_with_flags(
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
    }
    .map_err(|e| ctx.sql(e))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| ctx.sql(e))?;
    // Refuse a newer or foreign database before anything is written to it
    // (switching to WAL rewrites the header).
    check_schema(&conn, ctx)?;

    if path.is_some() {
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
            .map_err(|e| ctx.sql(e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::backend(
                crate::error::NAME,
                SetupError::NoWal {
                    path: ctx.db.to_owned(),
                    mode,
                },
            ));
        }
    }
    let synchronous = match options.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(|e| ctx.sql(e))?;
    migrate(&conn, ctx)?;
    Ok(conn)
}

/// Opens a connection that only reads (the writer keeps the WAL files alive).
pub(crate) fn open_reader(
    path: &Path,
    options: &SqliteOptions,
    ctx: Ctx<'_>,
) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| ctx.sql(e))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| ctx.sql(e))?;
    Ok(conn)
}

/// Reads `user_version` and `application_id` and refuses what this build
/// must not touch.
fn check_schema(conn: &Connection, ctx: Ctx<'_>) -> Result<u32> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| ctx.sql(e))?;
    let app_id: i32 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(|e| ctx.sql(e))?;
    let version = u32::try_from(version).map_err(|_| {
        Error::corrupt(
            ctx.db,
            format!("user_version {version} is not a schema version"),
        )
    })?;
    if app_id != APPLICATION_ID && app_id != 0 {
        return Err(foreign(ctx, format!("its application_id is {app_id:#x}")));
    }
    if version > SCHEMA_VERSION {
        tracing::error!(
            db = ctx.db,
            found = version,
            supported = SCHEMA_VERSION,
            "SQLite database written by a newer mcp-persist; left untouched"
        );
        return Err(Error::NewerSchema {
            key: ctx.db.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if app_id == 0 {
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
                [],
                |row| row.get(0),
            )
            .map_err(|e| ctx.sql(e))?;
        if version != 0 || tables != 0 {
            return Err(foreign(
                ctx,
                format!("it already holds {tables} tables or indexes"),
            ));
        }
    }
    Ok(version)
}

fn foreign(ctx: Ctx<'_>, why: String) -> Error {
    Error::invalid(
        "database",
        format!(
            "{} is a SQLite database of another application ({why}); \
             mcp-persist does not write into it",
            ctx.db
        ),
    )
}

/// Applies the missing migrations in one `BEGIN IMMEDIATE` transaction, so a
/// second process opening at the same moment waits and then finds the work done.
fn migrate(conn: &Connection, ctx: Ctx<'_>) -> Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| ctx.sql(e))?;
    let result = (|| {
        let from = check_schema(conn, ctx)?;
        for (n, sql) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            tracing::info!(db = ctx.db, from = n, to = n + 1, "migrating SQLite schema");
            conn.execute_batch(sql).map_err(|e| ctx.sql(e))?;
        }
        if from < SCHEMA_VERSION {
            conn.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| ctx.sql(e))?;
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(|e| ctx.sql(e))?;
        }
        conn.execute_batch("COMMIT").map_err(|e| ctx.sql(e))
    })();
    if result.is_err() && !conn.is_autocommit() {
        // Best effort: the error already says what went wrong.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}
