//! Opening connections: file mode, pragmas, and the versioned schema.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use mcp_persist_core::{Error, Result};
use rusqlite::{Connection, ErrorCode, OpenFlags, types::ValueRef};

use crate::{
    Durability, SqliteOptions, checksum,
    error::{Ctx, Lock, SetupError},
};

/// The schema version this build writes and understands, kept in the
/// database's `user_version`.
pub const SCHEMA_VERSION: u32 = 2;

/// Marks a database as ours in its header (`PRAGMA application_id`): "MCPp".
pub(crate) const APPLICATION_ID: i32 = 0x4d43_5070;

/// One step of the schema: SQL, then (for steps that compute values from
/// existing rows) code, both inside the migration's transaction.
struct Migration {
    sql: &'static str,
    then: Option<fn(&Connection, Ctx<'_>) -> Result<()>>,
}

/// `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`. Entries are
/// only ever appended: a released migration never changes.
const MIGRATIONS: &[Migration] = &[
    // 0 -> 1: key-value records, one version clock, logs and their records.
    Migration {
        sql: V1,
        then: None,
    },
    // 1 -> 2: a checksum beside every value and record (see `checksum`),
    // computed for the rows already there.
    Migration {
        sql: "ALTER TABLE kv ADD COLUMN checksum INTEGER;
              ALTER TABLE log_records ADD COLUMN checksum INTEGER;",
        then: Some(checksum_existing_rows),
    },
];

const V1: &str = r#"
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
    "#;

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
    drop(file);
    // SQLite creates `-wal` and `-shm` with the mode of the database file, so
    // the database is made private before SQLite opens it; side files left
    // by an earlier run are fixed too.
    #[cfg(unix)]
    for suffix in ["", "-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        make_private(Path::new(&side)).map_err(io)?;
    }
    Ok(())
}

/// Narrows an existing file readable or writable by others to 0600, with a
/// warning: the database may hold secrets. A missing file is fine.
#[cfg(unix)]
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if mode & 0o077 == 0 {
        return Ok(());
    }
    match fs::set_permissions(path, fs::Permissions::from_mode(0o600)) {
        Ok(()) => {
            tracing::warn!(
                path = %path.display(),
                was = format_args!("{mode:o}"),
                "the SQLite database file was readable by other users; it may hold secrets, \
                 so its mode is now 600"
            );
            Ok(())
        }
        // Someone else's file: keep working, but say so loudly.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::error!(
                path = %path.display(),
                mode = format_args!("{mode:o}"),
                error = %e,
                "the SQLite database file is readable by other users and cannot be made \
                 private; it may hold secrets: chmod 600 it as its owner"
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
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
    // (switching to WAL rewrites the header). One read transaction, so that
    // the three reads see one state even while another process migrates.
    let found = in_read_transaction(&conn, ctx, || check_schema(&conn, ctx))?;
    let deadline = Instant::now() + options.busy_timeout;
    if path.is_some() {
        enable_wal(&conn, ctx, deadline)?;
    }
    let synchronous = match options.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(|e| ctx.sql(e))?;
    // An up-to-date database needs no write lock to open.
    if found < SCHEMA_VERSION {
        migrate(&conn, ctx, deadline)?;
    }
    Ok(conn)
}

/// How long to pause between two attempts at a lock SQLite refused without
/// waiting (it does so when waiting could deadlock).
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(2);

/// Runs `f` until it stops failing with `SQLITE_BUSY`, pausing between
/// attempts, or until `deadline`. Every attempt is a statement in
/// autocommit mode or a transaction `f` ends itself: no lock is held while
/// pausing, so two processes doing this cannot wait for each other.
fn retry_busy<T>(
    ctx: Ctx<'_>,
    lock: Lock,
    deadline: Instant,
    mut f: impl FnMut() -> Result<T, rusqlite::Error>,
) -> Result<T> {
    loop {
        match f() {
            Err(e) if is_busy(&e) => {
                if Instant::now() >= deadline {
                    return Err(ctx.lock_timeout(lock, &e));
                }
                std::thread::sleep(LOCK_RETRY_PAUSE);
            }
            other => return other.map_err(|e| ctx.sql(e)),
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Switches the database to WAL, verified. The switch itself is one statement
/// outside any transaction; SQLite answers it with `SQLITE_BUSY` without
/// waiting when another process is switching at the same moment (waiting
/// could deadlock), so it is retried until the deadline. Once another process
/// has switched, the same statement finds WAL and succeeds.
fn enable_wal(conn: &Connection, ctx: Ctx<'_>, deadline: Instant) -> Result<()> {
    let mode: String = retry_busy(ctx, Lock::JournalMode, deadline, || {
        conn.pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
    })?;
    if mode.eq_ignore_ascii_case("wal") {
        Ok(())
    } else {
        Err(Error::backend(
            crate::error::NAME,
            SetupError::NoWal {
                path: ctx.db.to_owned(),
                mode,
            },
        ))
    }
}

/// Runs `f` inside a read-only (deferred) transaction. It never becomes a
/// write transaction, so it cannot deadlock against a writer.
fn in_read_transaction<T>(
    conn: &Connection,
    ctx: Ctx<'_>,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    conn.execute_batch("BEGIN DEFERRED")
        .map_err(|e| ctx.sql(e))?;
    let result = f();
    // Ending a read transaction releases its read lock and cannot fail for
    // want of a lock; a failure here is reported like any other.
    let end = conn.execute_batch(if result.is_ok() { "COMMIT" } else { "ROLLBACK" });
    let value = result?;
    end.map_err(|e| ctx.sql(e))?;
    Ok(value)
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
    // A value planted over the size limit is refused, not loaded into memory.
    let limit = i32::try_from(crate::ops::READ_LENGTH_LIMIT).unwrap_or(i32::MAX);
    conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, limit)
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
/// second process opening at the same moment waits and then finds the work
/// done. The write lock is taken first, before anything is read, so the
/// transaction never upgrades from a read lock (which SQLite refuses without
/// waiting when another process writes); the schema is read again under it.
fn migrate(conn: &Connection, ctx: Ctx<'_>, deadline: Instant) -> Result<()> {
    retry_busy(ctx, Lock::SchemaSetup, deadline, || {
        conn.execute_batch("BEGIN IMMEDIATE")
    })?;
    let result = (|| {
        let from = check_schema(conn, ctx)?;
        for (n, step) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            tracing::info!(db = ctx.db, from = n, to = n + 1, "migrating SQLite schema");
            conn.execute_batch(step.sql).map_err(|e| ctx.sql(e))?;
            if let Some(then) = step.then {
                then(conn, ctx)?;
            }
        }
        if from < SCHEMA_VERSION {
            conn.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| ctx.sql(e))?;
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(|e| ctx.sql(e))?;
        }
        conn.execute_batch("COMMIT").map_err(|e| {
            if is_busy(&e) {
                ctx.lock_timeout(Lock::SchemaSetup, &e)
            } else {
                ctx.sql(e)
            }
        })
    })();
    if result.is_err() && !conn.is_autocommit() {
        // Best effort: the error already says what went wrong.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Computes the checksum of every row written before checksums existed.
/// A row whose columns do not have the schema's types keeps no checksum, so
/// reading it reports the damage.
fn checksum_existing_rows(conn: &Connection, ctx: Ctx<'_>) -> Result<()> {
    let mut sums = Vec::new();
    let mut skipped = 0u64;
    {
        let mut stmt = conn
            .prepare("SELECT rowid, key, version, value FROM kv")
            .map_err(|e| ctx.sql(e))?;
        let mut rows = stmt.query([]).map_err(|e| ctx.sql(e))?;
        while let Some(row) = rows.next().map_err(|e| ctx.sql(e))? {
            let rowid: i64 = row.get(0).map_err(|e| ctx.sql(e))?;
            match (row.get_ref(1), row.get_ref(2), row.get_ref(3)) {
                (
                    Ok(ValueRef::Text(key)),
                    Ok(ValueRef::Integer(version)),
                    Ok(ValueRef::Blob(value)),
                ) => match std::str::from_utf8(key) {
                    Ok(key) => sums.push((rowid, checksum::of_value(key, version, value))),
                    Err(_) => skipped += 1,
                },
                _ => skipped += 1,
            }
        }
    }
    let mut update = conn
        .prepare("UPDATE kv SET checksum = ?2 WHERE rowid = ?1")
        .map_err(|e| ctx.sql(e))?;
    for (rowid, sum) in sums.drain(..) {
        update.execute([rowid, sum]).map_err(|e| ctx.sql(e))?;
    }
    {
        let mut stmt = conn
            .prepare(
                "SELECT r.rowid, l.name, r.seq, r.data \
                 FROM log_records r JOIN logs l ON l.id = r.log_id",
            )
            .map_err(|e| ctx.sql(e))?;
        let mut rows = stmt.query([]).map_err(|e| ctx.sql(e))?;
        while let Some(row) = rows.next().map_err(|e| ctx.sql(e))? {
            let rowid: i64 = row.get(0).map_err(|e| ctx.sql(e))?;
            match (row.get_ref(1), row.get_ref(2), row.get_ref(3)) {
                (Ok(ValueRef::Text(log)), Ok(ValueRef::Integer(seq)), Ok(ValueRef::Blob(data))) => {
                    match std::str::from_utf8(log) {
                        Ok(log) => sums.push((rowid, checksum::of_record(log, seq, data))),
                        Err(_) => skipped += 1,
                    }
                }
                _ => skipped += 1,
            }
        }
    }
    let mut update = conn
        .prepare("UPDATE log_records SET checksum = ?2 WHERE rowid = ?1")
        .map_err(|e| ctx.sql(e))?;
    for (rowid, sum) in sums {
        update.execute([rowid, sum]).map_err(|e| ctx.sql(e))?;
    }
    if skipped > 0 {
        tracing::warn!(
            db = ctx.db,
            rows = skipped,
            "SQLite rows of the wrong shape were left without a checksum; reading them reports them as corrupt"
        );
    }
    Ok(())
}

