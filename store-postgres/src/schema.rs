//! The store's schema: its tables and functions, their version in the
//! database, and migrations that two processes may run at once.

use mcp_persist_core::{Error, Result, registry::OpenMode};

use tokio_postgres::GenericClient;

use crate::error::{self, Target};

/// The schema version this build writes and understands, kept in the
/// store's `meta` table (row `schema_version`).
pub const SCHEMA_VERSION: u32 = 2;

/// The tables a store of [`SCHEMA_VERSION`] has; opening checks they are all
/// there.
const TABLES: &[&str] = &["meta", "kv", "logs", "log_records"];

/// A schema name: lowercase ASCII letters, digits and `_`, starting with a
/// letter or `_`, at most 48 bytes (so that the notification channel and
/// lock names built from it fit Postgres's 63-byte identifiers).
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "Postgres schema name",
            format!(
                "`{name}` is not one: use 1 to 48 lowercase ASCII letters, digits and `_`, \
                 starting with a letter (not `pg_`), e.g. `mcp_persist` or `app1`"
            ),
        ))
    }
}

/// The names the SQL of one schema is built from.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// The schema, quoted.
    pub(crate) quoted: String,
    /// The schema, as given.
    pub(crate) plain: String,
    /// The `LISTEN` channel of appends.
    pub(crate) channel: String,
    /// The advisory lock class of this schema (its migration lock and its
    /// per-key locks).
    pub(crate) lock_class: i32,
}

impl Names {
    pub(crate) fn new(schema: &str) -> Names {
        // FNV-1a: a stable number per schema name, whatever the build.
        let mut h: u32 = 0x811c_9dc5;
        for b in "mcp-persist:".bytes().chain(schema.bytes()) {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        Names {
            quoted: format!("\"{schema}\""),
            plain: schema.to_owned(),
            channel: format!("mcp_persist.{schema}"),
            lock_class: h.cast_signed(),
        }
    }

    /// `sql` with `{s}` replaced by the quoted schema, `{lock}` by the lock
    /// class and `{channel}` by the channel as a string literal.
    pub(crate) fn sql(&self, sql: &str) -> String {
        sql.replace("{s}", &self.quoted)
            .replace("{lock}", &self.lock_class.to_string())
            .replace("{channel}", &format!("'{}'", self.channel))
    }
}

/// `MIGRATIONS[n]` takes a schema from version `n` to `n + 1`, inside the
/// migration's transaction. Entries are only ever appended.
const MIGRATIONS: &[&str] = &[V1, V2];

const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION as usize);

/// Version 1: key-value records with one version sequence, logs with one
/// sequence for their records, and the functions that write them.
const V1: &str = r#"
CREATE TABLE {s}.meta (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
CREATE TABLE {s}.kv (
    key        text COLLATE "C" PRIMARY KEY,
    value      bytea NOT NULL,
    version    bigint NOT NULL,
    expires_at timestamptz
);
CREATE INDEX kv_expiry ON {s}.kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE SEQUENCE {s}.kv_version AS bigint;
CREATE TABLE {s}.logs (
    id         bigint PRIMARY KEY,
    name       text COLLATE "C" NOT NULL UNIQUE,
    expires_at timestamptz,
    -- The last sequence number the log issued: numbers are per log and
    -- contiguous, as on every other backend, so `mcp-persist copy` moves a
    -- log between backends with its event ids unchanged.
    head       bigint NOT NULL DEFAULT 0
);
CREATE INDEX logs_expiry ON {s}.logs (expires_at) WHERE expires_at IS NOT NULL;
CREATE SEQUENCE {s}.log_id AS bigint;
CREATE TABLE {s}.log_records (
    log_id bigint NOT NULL,
    seq    bigint NOT NULL,
    data   bytea NOT NULL,
    PRIMARY KEY (log_id, seq)
);

-- Every write function takes the schema's write fence (lock ({lock}, 1))
-- shared until it commits; opening a store takes it exclusively for an
-- instant, and so waits for the writes still in flight, among them those of
-- a process that died (its transaction goes on on the server until it
-- commits or aborts).

-- A put: the precondition and the write under one per-key lock, the version
-- drawn after the lock (so it is above every version this key ever had).
-- Returns the new version, -1 when a Create found a live record, -2 when an
-- Update found another version (or none).
CREATE FUNCTION {s}.kv_put(k text, v bytea, mode int, expect bigint, ttl_ms bigint)
RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    v_cur bigint;
    v_next bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({lock}, 1);
    PERFORM pg_advisory_xact_lock({lock}, hashtext(k));
    SELECT version INTO v_cur FROM {s}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp())
     FOR UPDATE;
    IF mode = 1 AND v_cur IS NOT NULL THEN
        RETURN -1;
    END IF;
    IF mode = 2 AND v_cur IS DISTINCT FROM expect THEN
        RETURN -2;
    END IF;
    v_next := nextval('{s}.kv_version');
    INSERT INTO {s}.kv (key, value, version, expires_at)
    VALUES (k, v, v_next, clock_timestamp() + ttl_ms * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
       SET value = excluded.value, version = excluded.version,
           expires_at = excluded.expires_at;
    RETURN v_next;
END
$f$;

-- Appends of a group commit, in one transaction: `names[i]` gets
-- `counts[i]` records, taken in order from `datas`; `ttls[i]` (ms, or NULL)
-- sets the log's expiry. Returns every sequence number, in `datas` order.
CREATE FUNCTION {s}.append(names text[], counts int[], datas bytea[], ttls bigint[], synced boolean)
RETURNS bigint[] LANGUAGE plpgsql AS $f$
DECLARE
    v_name text;
    v_id bigint;
    v_exp timestamptz;
    v_head bigint;
    v_seqs bigint[] := '{}';
    i int;
    k int;
    j int := 0;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({lock}, 1);
    IF NOT synced THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Lock every log of the batch first, in one order, so that batches
    -- never deadlock; appends to one log are serialized up to commit, and
    -- numbers taken from the log's head under the lock grow in commit order.
    FOR v_name IN SELECT DISTINCT x FROM unnest(names) AS x ORDER BY 1 LOOP
        LOOP
            PERFORM 1 FROM {s}.logs WHERE name = v_name FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO {s}.logs (id, name) VALUES (nextval('{s}.log_id'), v_name)
            ON CONFLICT (name) DO NOTHING;
        END LOOP;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        SELECT id, expires_at, head INTO v_id, v_exp, v_head FROM {s}.logs WHERE name = names[i];
        IF v_exp IS NOT NULL AND v_exp <= clock_timestamp() THEN
            -- An expired log starts again empty (its numbers go on).
            DELETE FROM {s}.log_records WHERE log_id = v_id;
            UPDATE {s}.logs SET expires_at = NULL WHERE id = v_id;
        END IF;
        FOR k IN 1 .. counts[i] LOOP
            j := j + 1;
            v_head := v_head + 1;
            INSERT INTO {s}.log_records (log_id, seq, data) VALUES (v_id, v_head, datas[j]);
            v_seqs := v_seqs || v_head;
        END LOOP;
        -- The same log may come again later in the batch: it reads this head.
        UPDATE {s}.logs SET head = v_head WHERE id = v_id;
        IF ttls[i] IS NOT NULL THEN
            UPDATE {s}.logs SET expires_at = clock_timestamp() + ttls[i] * interval '1 millisecond'
             WHERE id = v_id;
        END IF;
        PERFORM pg_notify({channel}, names[i]);
    END LOOP;
    RETURN v_seqs;
END
$f$;

-- Deletes a log: its header first (waiting for an append in progress), then
-- its records, seen by a fresh snapshot. The header stays, expired, until
-- the sweep reclaims it, so a log appended to again before then goes on
-- above its old numbers.
CREATE FUNCTION {s}.delete_log(n text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({lock}, 1);
    UPDATE {s}.logs SET expires_at = clock_timestamp() WHERE name = n RETURNING id INTO v_id;
    IF FOUND THEN
        DELETE FROM {s}.log_records WHERE log_id = v_id;
    END IF;
END
$f$;

-- Removes what expired more than `margin_ms` ago; returns how many records
-- and logs.
CREATE FUNCTION {s}.sweep(margin_ms bigint) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    v_cutoff timestamptz := clock_timestamp() - margin_ms * interval '1 millisecond';
    v_removed bigint;
    v_log record;
BEGIN
    DELETE FROM {s}.kv WHERE expires_at <= v_cutoff;
    GET DIAGNOSTICS v_removed = ROW_COUNT;
    FOR v_log IN DELETE FROM {s}.logs WHERE expires_at <= v_cutoff RETURNING id LOOP
        DELETE FROM {s}.log_records WHERE log_id = v_log.id;
        v_removed := v_removed + 1;
    END LOOP;
    RETURN v_removed;
END
$f$;
"#;

/// Version 2: an append to a log whose header holds a negative number
/// (damage: no store writes one) fails with `data_corrupted` before it
/// writes anything, instead of appending below zero.
const V2: &str = r#"
CREATE OR REPLACE FUNCTION {s}.append(names text[], counts int[], datas bytea[], ttls bigint[], synced boolean)
RETURNS bigint[] LANGUAGE plpgsql AS $f$
DECLARE
    v_name text;
    v_id bigint;
    v_exp timestamptz;
    v_head bigint;
    v_seqs bigint[] := '{}';
    i int;
    k int;
    j int := 0;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({lock}, 1);
    IF NOT synced THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Lock every log of the batch first, in one order, so that batches
    -- never deadlock; appends to one log are serialized up to commit, and
    -- numbers taken from the log's head under the lock grow in commit order.
    FOR v_name IN SELECT DISTINCT x FROM unnest(names) AS x ORDER BY 1 LOOP
        LOOP
            PERFORM 1 FROM {s}.logs WHERE name = v_name FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO {s}.logs (id, name) VALUES (nextval('{s}.log_id'), v_name)
            ON CONFLICT (name) DO NOTHING;
        END LOOP;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        SELECT id, expires_at, head INTO v_id, v_exp, v_head FROM {s}.logs WHERE name = names[i];
        IF v_head < 0 THEN
            -- No store writes a negative head: the header was changed
            -- outside mcp-persist. Refused before anything is written
            -- (version 1 appended below zero, and then refused the numbers).
            RAISE EXCEPTION 'log % has a negative last sequence number in its header', names[i]
                USING ERRCODE = 'data_corrupted', DETAIL = v_head::text;
        END IF;
        IF v_exp IS NOT NULL AND v_exp <= clock_timestamp() THEN
            -- An expired log starts again empty (its numbers go on).
            DELETE FROM {s}.log_records WHERE log_id = v_id;
            UPDATE {s}.logs SET expires_at = NULL WHERE id = v_id;
        END IF;
        FOR k IN 1 .. counts[i] LOOP
            j := j + 1;
            v_head := v_head + 1;
            INSERT INTO {s}.log_records (log_id, seq, data) VALUES (v_id, v_head, datas[j]);
            v_seqs := v_seqs || v_head;
        END LOOP;
        -- The same log may come again later in the batch: it reads this head.
        UPDATE {s}.logs SET head = v_head WHERE id = v_id;
        IF ttls[i] IS NOT NULL THEN
            UPDATE {s}.logs SET expires_at = clock_timestamp() + ttls[i] * interval '1 millisecond'
             WHERE id = v_id;
        END IF;
        PERFORM pg_notify({channel}, names[i]);
    END LOOP;
    RETURN v_seqs;
END
$f$;
"#;

/// What a schema holds, read without writing anything.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// No schema of that name.
    Nothing,
    /// The schema exists and holds no table.
    EmptySchema,
    /// The schema holds tables but no store of ours.
    Foreign(i64),
    /// A store at this version.
    Store(i64),
}

async fn inspect(client: &impl GenericClient, names: &Names, target: &Target) -> Result<Found> {
    let row = client
        .query_one(
            "SELECT n.oid IS NOT NULL, \
                    (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid \
                       AND c.relkind IN ('r', 'p', 'v', 'm', 'f')), \
                    to_regclass($2) IS NOT NULL \
             FROM (SELECT 1) AS one LEFT JOIN pg_namespace n ON n.nspname = $1",
            &[&names.plain, &format!("{}.meta", names.quoted)],
        )
        .await
        .map_err(|e| error::map(e, target, "(schema)"))?;
    let (exists, tables, meta): (bool, i64, bool) = (row.get(0), row.get(1), row.get(2));
    if !exists {
        return Ok(Found::Nothing);
    }
    if !meta {
        return Ok(if tables == 0 {
            Found::EmptySchema
        } else {
            Found::Foreign(tables)
        });
    }
    let version: Option<i64> = client
        .query_opt(
            &names.sql("SELECT value FROM {s}.meta WHERE name = 'schema_version'"),
            &[],
        )
        .await
        .map_err(|e| error::map(e, target, "(schema)"))?
        .map(|row| row.get(0));
    match version {
        Some(v) if v >= 0 => Ok(Found::Store(v)),
        Some(v) => Err(error::bad_row(
            &format!("schema {}", names.plain),
            format!("the schema version {v} in its meta table, which no store writes"),
        )),
        None => Ok(Found::Foreign(tables)),
    }
}

fn newer(names: &Names, found: i64) -> Error {
    tracing::error!(
        schema = %names.plain,
        found,
        supported = SCHEMA_VERSION,
        "Postgres store written by a newer mcp-persist; left untouched"
    );
    Error::NewerSchema {
        key: format!("schema {}", names.plain),
        found: u32::try_from(found).unwrap_or(u32::MAX),
        supported: SCHEMA_VERSION,
    }
}

fn foreign(names: &Names, tables: i64) -> Error {
    Error::invalid(
        "Postgres schema",
        format!(
            "schema `{}` holds {tables} tables of another application and no mcp-persist \
             store; mcp-persist does not write into it: pick another schema name \
             (`?schema=NAME` in the URL)",
            names.plain
        ),
    )
}

/// Checks the store's schema, creating it (only under [`OpenMode::Create`])
/// or migrating it (not under [`OpenMode::ReadOnly`], which refuses an older
/// store instead). An up-to-date store takes no lock and writes nothing; a
/// newer or foreign one is refused untouched.
pub(crate) async fn prepare(
    client: &mut tokio_postgres::Client,
    names: &Names,
    target: &Target,
    mode: OpenMode,
) -> Result<()> {
    match inspect(client, names, target).await? {
        Found::Store(v) if v == i64::from(SCHEMA_VERSION) => {
            check_tables(client, names, target).await?;
            return settle(client, names, target).await;
        }
        Found::Store(v) if v > i64::from(SCHEMA_VERSION) => return Err(newer(names, v)),
        Found::Foreign(tables) => return Err(foreign(names, tables)),
        // Only `Create` makes a store; a read-only open creates nothing
        // either (it used to create the schema of a mistyped name).
        Found::Nothing | Found::EmptySchema if mode != OpenMode::Create => {
            return Err(Error::NotFound {
                what: "store",
                detail: Some(format!(
                    "not a store: {target} holds no mcp-persist store in schema `{}` \
                     (nothing was created)",
                    names.plain
                )),
            });
        }
        Found::Store(v) if mode == OpenMode::ReadOnly => {
            tracing::warn!(
                schema = %names.plain,
                found = v,
                supported = SCHEMA_VERSION,
                "a read-only open of an older Postgres store refused; opening it writable migrates it"
            );
            return Err(Error::Unsupported {
                operation: "a read-only open of a store written by an older version \
                            (opening would migrate its schema; nothing was changed)",
                backend: error::NAME,
            });
        }
        _ => {}
    }
    migrate(client, names, target).await?;
    settle(client, names, target).await
}

/// Waits for the writes in flight in this schema (see the write fence in
/// [`V1`]): what a process that died was committing is settled, committed
/// or rolled back, before this one reads anything. Takes a lock for an
/// instant and writes nothing.
async fn settle(client: &impl GenericClient, names: &Names, target: &Target) -> Result<()> {
    client
        .execute("SELECT pg_advisory_xact_lock($1, 1)", &[&names.lock_class])
        .await
        .map_err(|e| error::map(e, target, "(schema)"))?;
    Ok(())
}

async fn check_tables(client: &impl GenericClient, names: &Names, target: &Target) -> Result<()> {
    let wanted: Vec<String> = TABLES
        .iter()
        .map(|t| format!("{}.{t}", names.quoted))
        .collect();
    let row = client
        .query_one(
            "SELECT array_agg(t) FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NULL",
            &[&wanted],
        )
        .await
        .map_err(|e| error::map(e, target, "(schema)"))?;
    let missing: Option<Vec<String>> = row.get(0);
    match missing {
        Some(missing) if !missing.is_empty() => Err(Error::corrupt(
            format!("schema {}", names.plain),
            format!(
                "the store's table(s) {} are missing: dropped outside mcp-persist. Restore \
                 the schema `{}` from a backup, or drop it (DROP SCHEMA {} CASCADE, which \
                 loses its state) so that the next open creates it afresh; nothing was written",
                missing.join(", "),
                names.plain,
                names.plain
            ),
        )),
        _ => Ok(()),
    }
}

/// Creates or migrates the schema in one transaction under the schema's
/// advisory lock, so that processes opening at once wait for each other and
/// the later ones find the work done.
async fn migrate(
    client: &mut tokio_postgres::Client,
    names: &Names,
    target: &Target,
) -> Result<()> {
    let map = |e| error::map(e, target, "(schema)");
    let tx = client.transaction().await.map_err(map)?;
    tx.execute("SELECT pg_advisory_xact_lock($1, 0)", &[&names.lock_class])
        .await
        .map_err(map)?;
    let from = match inspect(&tx, names, target).await? {
        Found::Nothing => {
            tracing::info!(schema = %names.plain, "creating the Postgres schema");
            tx.batch_execute(&format!("CREATE SCHEMA {}", names.quoted))
                .await
                .map_err(map)?;
            0
        }
        Found::EmptySchema => 0,
        Found::Foreign(tables) => return Err(foreign(names, tables)),
        Found::Store(v) if v > i64::from(SCHEMA_VERSION) => return Err(newer(names, v)),
        Found::Store(v) => v,
    };
    if from == i64::from(SCHEMA_VERSION) {
        // Another process did it while this one waited for the lock.
        tx.commit().await.map_err(map)?;
        return check_tables(client, names, target).await;
    }
    for (n, step) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(from).unwrap_or(usize::MAX))
    {
        tracing::info!(schema = %names.plain, from = n, to = n + 1, "migrating the Postgres schema");
        tx.batch_execute(&names.sql(step)).await.map_err(map)?;
    }
    tx.execute(
        &names.sql(
            "INSERT INTO {s}.meta (name, value) VALUES ('schema_version', $1) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        ),
        &[&i64::from(SCHEMA_VERSION)],
    )
    .await
    .map_err(map)?;
    tx.commit().await.map_err(map)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for good in ["mcp_persist", "app1", "_x", &"a".repeat(48)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "App",
            "1a",
            "a-b",
            "a b",
            "pg_catalog",
            "é",
            &"a".repeat(49),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_stable_and_distinct() {
        let a = Names::new("app1");
        assert_eq!(a.lock_class, Names::new("app1").lock_class);
        assert_ne!(a.lock_class, Names::new("app2").lock_class);
        assert_eq!(a.sql("SELECT {s}.kv_put()"), "SELECT \"app1\".kv_put()");
        assert!(a.channel.len() <= 63);
        // Every migration names only its own schema's objects.
        for step in MIGRATIONS {
            let sql = a.sql(step);
            assert!(!sql.contains("{s}") && !sql.contains("{lock}") && !sql.contains("{channel}"));
        }
    }
}
