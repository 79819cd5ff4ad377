//! Damage is not a crash: bytes or numbers changed in the database behind the
//! store's back are a typed [`Error::Corrupt`] naming the key or log, never a
//! different value, never a panic, and one damaged row fails its own
//! operations alone: the writer goes on serving every other key.
//!
//! Each test opens the database with a raw rusqlite connection to plant the
//! damage, as a bad disk, a stray tool or a hostile local user could.

use mcp_persist_core::conformance::key;
use std::path::Path;

use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_sqlite::SqliteStore;
use rusqlite::Connection;

fn raw(db: &Path) -> Connection {
    Connection::open(db).expect("raw open")
}

fn create() -> PutOptions {
    PutOptions::new(PutMode::Create)
}

fn assert_corrupt(err: &Error, name: &str) {
    assert!(
        matches!(err, Error::Corrupt { key, .. } if key == name),
        "want Corrupt naming {name:?}, got {err:?}"
    );
}

/// The writer is alive: a write to an undamaged key commits and reads back.
async fn writer_alive(store: &SqliteStore, name: &str) {
    store
        .put(&key(name), b"alive".to_vec(), create())
        .await
        .unwrap_or_else(|e| panic!("the next write failed: {e}"));
    assert_eq!(
        store
            .get(&key(name))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"alive"
    );
    store
        .append(&key(format!("{name}/log")), vec![b"alive".to_vec()], None)
        .await
        .unwrap_or_else(|e| panic!("the next append failed: {e}"));
}

#[tokio::test]
async fn a_last_sequence_number_at_the_maximum_fails_that_append_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("seq.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .append(&key("full"), vec![b"a".to_vec()], None)
        .await
        .expect("append");
    raw(&db)
        .execute(
            "UPDATE logs SET last_seq = ?1 WHERE name = 'full'",
            [i64::MAX],
        )
        .expect("plant");
    for _ in 0..2 {
        let err = store
            .append(&key("full"), vec![b"b".to_vec()], None)
            .await
            .expect_err("no sequence number is left");
        assert_corrupt(&err, "full");
        // Asked without appending, the same: never a number that repeats.
        let err = store
            .next_seq(&key("full"))
            .await
            .expect_err("no next number");
        assert_corrupt(&err, "full");
    }
    writer_alive(&store, "other").await;
    // Reads of the damaged log still work: its records are intact.
    let records = store.read_after(&key("full"), 0, 10).await.expect("read");
    assert_eq!(records.len(), 1);
}

#[tokio::test]
async fn negative_stored_numbers_are_corrupt_and_the_writer_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("negative.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .append(&key("neg"), vec![b"a".to_vec()], None)
        .await
        .expect("append");
    store
        .put(&key("key"), b"v".to_vec(), create())
        .await
        .expect("put");
    {
        let raw = raw(&db);
        raw.execute("UPDATE logs SET last_seq = -5 WHERE name = 'neg'", [])
            .expect("plant");
        raw.execute("UPDATE kv SET version = -1 WHERE key = 'key'", [])
            .expect("plant");
    }
    let err = store
        .append(&key("neg"), vec![b"b".to_vec()], None)
        .await
        .expect_err("negative last sequence number");
    assert_corrupt(&err, "neg");
    let err = store
        .next_seq(&key("neg"))
        .await
        .expect_err("negative last sequence number");
    assert_corrupt(&err, "neg");
    let err = store.get(&key("key")).await.expect_err("negative version");
    assert_corrupt(&err, "key");
    let err = store
        .put(
            &key("key"),
            b"w".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect_err("a put over a negative version");
    assert_corrupt(&err, "key");
    writer_alive(&store, "other").await;
}

#[tokio::test]
async fn a_damaged_version_clock_fails_puts_without_reusing_versions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("clock.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let v = store
        .put(&key("key"), b"v".to_vec(), create())
        .await
        .expect("put");
    let max = format!(
        "UPDATE counters SET value = {} WHERE name = 'kv_version'",
        i64::MAX
    );
    for planted in [
        max.as_str(),
        "UPDATE counters SET value = -7 WHERE name = 'kv_version'",
        "UPDATE counters SET value = 0 WHERE name = 'kv_version'",
        "UPDATE counters SET value = 'ten' WHERE name = 'kv_version'",
        "UPDATE counters SET value = 10.5 WHERE name = 'kv_version'",
        "DELETE FROM counters WHERE name = 'kv_version'",
    ] {
        raw(&db).execute_batch(planted).expect("plant");
        let err = store
            .put(
                &key("key"),
                b"w".to_vec(),
                PutOptions::new(PutMode::Update(v)),
            )
            .await
            .expect_err("no greater version can be given");
        assert!(
            matches!(&err, Error::Corrupt { key, reason, .. }
                if key.contains("version clock") && reason.contains("`key`")),
            "clock {planted}: got {err:?}"
        );
    }
    // The record is unchanged, and a repaired clock works again.
    assert_eq!(
        store
            .get(&key("key"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"v"
    );
    raw(&db)
        .execute(
            "INSERT OR REPLACE INTO counters (name, value) VALUES ('kv_version', 10)",
            [],
        )
        .expect("repair");
    let w = store
        .put(
            &key("key"),
            b"w".to_vec(),
            PutOptions::new(PutMode::Update(v)),
        )
        .await
        .expect("put after repair");
    assert!(w > v);
}

/// Flips one bit of the blob in `column` of the rows `filter` selects.
fn flip_a_byte(db: &Path, table: &str, column: &str, filter: &str) {
    let raw = raw(db);
    let bytes: Vec<u8> = raw
        .query_row(
            &format!("SELECT {column} FROM {table} WHERE {filter}"),
            [],
            |row| row.get(0),
        )
        .expect("read the stored bytes");
    let mut damaged = bytes.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x10;
    let changed = raw
        .execute(
            &format!("UPDATE {table} SET {column} = ?1 WHERE {filter}"),
            [&damaged],
        )
        .expect("plant");
    assert_eq!(changed, 1);
    // SQLite itself sees nothing wrong.
    let integrity: String = raw
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check");
    assert_eq!(integrity, "ok");
}

#[tokio::test]
async fn a_flipped_byte_in_a_value_is_corrupt_and_other_keys_still_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("flip.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .put(&key("damaged"), b"hello, world".to_vec(), create())
        .await
        .expect("put");
    store
        .put(&key("intact"), b"still fine".to_vec(), create())
        .await
        .expect("put");
    flip_a_byte(&db, "kv", "value", "key = 'damaged'");
    let err = store
        .get(&key("damaged"))
        .await
        .expect_err("a damaged value");
    assert_corrupt(&err, "damaged");
    assert!(err.to_string().contains("checksum"), "says why: {err}");
    assert_eq!(
        store
            .get(&key("intact"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"still fine"
    );
    // The damaged record can be replaced, and then reads back.
    store
        .put(
            &key("damaged"),
            b"new".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("overwrite the damaged record");
    assert_eq!(
        store
            .get(&key("damaged"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"new"
    );
    writer_alive(&store, "other").await;
}

#[tokio::test]
async fn a_changed_version_or_a_swapped_value_is_corrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("swap.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .put(&key("a"), b"value of a".to_vec(), create())
        .await
        .expect("put");
    store
        .put(&key("b"), b"value of b".to_vec(), create())
        .await
        .expect("put");
    store
        .put(&key("c"), b"value of c".to_vec(), create())
        .await
        .expect("put");
    {
        let raw = raw(&db);
        // b gets a's bytes and checksum; c a later version.
        raw.execute_batch(
            "UPDATE kv SET (value, checksum) = (SELECT value, checksum FROM kv WHERE key = 'a')
                 WHERE key = 'b';
             UPDATE kv SET version = version + 100 WHERE key = 'c';",
        )
        .expect("plant");
    }
    assert_corrupt(&store.get(&key("b")).await.expect_err("swapped"), "b");
    assert_corrupt(
        &store.get(&key("c")).await.expect_err("version changed"),
        "c",
    );
    assert_eq!(
        store
            .get(&key("a"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"value of a"
    );
}

#[tokio::test]
async fn a_flipped_byte_in_a_log_record_is_corrupt_and_other_logs_still_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("log.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let seqs = store
        .append(
            &key("events"),
            vec![b"first event".to_vec(), b"second event".to_vec()],
            None,
        )
        .await
        .expect("append");
    store
        .append(&key("other"), vec![b"intact".to_vec()], None)
        .await
        .expect("append");
    flip_a_byte(
        &db,
        "log_records",
        "data",
        &format!(
            "seq = {} AND log_id = (SELECT id FROM logs WHERE name = 'events')",
            seqs[1]
        ),
    );
    let err = store
        .read_after(&key("events"), 0, 10)
        .await
        .expect_err("a damaged record");
    assert_corrupt(&err, "events");
    assert!(
        err.to_string().contains(&format!("record {}", seqs[1])),
        "names it: {err}"
    );
    // The intact record before it still reads on its own.
    let first = store.read_after(&key("events"), 0, 1).await.expect("read");
    assert_eq!(first[0].data, b"first event");
    assert_eq!(
        store.read_after(&key("other"), 0, 10).await.expect("read")[0].data,
        b"intact"
    );
    // A record moved to another sequence number fails as well.
    raw(&db)
        .execute(
            "UPDATE log_records SET seq = seq + 10 \
             WHERE log_id = (SELECT id FROM logs WHERE name = 'other')",
            [],
        )
        .expect("plant");
    assert_corrupt(
        &store
            .read_after(&key("other"), 0, 10)
            .await
            .expect_err("moved"),
        "other",
    );
    writer_alive(&store, "alive").await;
}

#[tokio::test]
async fn a_planted_value_over_the_size_limit_is_refused_on_read() {
    use mcp_persist_core::backend::DEFAULT_MAX_VALUE_BYTES;
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("big.db");
    let store = SqliteStore::open(&db).await.expect("open");
    for name in ["huge", "just-over"] {
        store
            .put(&key(name), b"small".to_vec(), create())
            .await
            .expect("put");
    }
    store
        .append(&key("log"), vec![b"small".to_vec()], None)
        .await
        .expect("append");
    {
        let raw = raw(&db);
        raw.execute(
            "UPDATE kv SET value = zeroblob(100 * 1024 * 1024) WHERE key = 'huge'",
            [],
        )
        .expect("plant 100 MiB");
        raw.execute(
            "UPDATE kv SET value = zeroblob(?1) WHERE key = 'just-over'",
            [DEFAULT_MAX_VALUE_BYTES as i64 + 1],
        )
        .expect("plant one byte over");
        raw.execute(
            "UPDATE log_records SET data = zeroblob(100 * 1024 * 1024)",
            [],
        )
        .expect("plant 100 MiB record");
    }
    for name in ["huge", "just-over"] {
        let err = store.get(&key(name)).await.expect_err("over the limit");
        assert_corrupt(&err, name);
        assert!(
            err.to_string().contains("over the limit"),
            "says why: {err}"
        );
        if name == "huge" {
            // Refused by SQLite before the 100 MiB were loaded.
            assert!(err.to_string().contains("more than"), "{err}");
        }
    }
    let err = store
        .read_after(&key("log"), 0, 10)
        .await
        .expect_err("over the limit");
    assert_corrupt(&err, "log");
    writer_alive(&store, "other").await;
}

#[tokio::test]
async fn a_newer_user_version_is_refused_and_nothing_changes() {
    use mcp_persist_store_sqlite::SCHEMA_VERSION;
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("newer.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .put(&key("k"), b"v".to_vec(), create())
        .await
        .expect("put");
    store.close().await.expect("close");
    raw(&db)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("plant");
    let files = |db: &Path| -> Vec<(String, Option<Vec<u8>>)> {
        ["", "-wal", "-shm"]
            .iter()
            .map(|s| {
                let p = format!("{}{s}", db.display());
                (p.clone(), std::fs::read(&p).ok())
            })
            .collect()
    };
    let before = files(&db);
    let err = SqliteStore::open(&db).await.expect_err("newer schema");
    assert!(
        matches!(err, Error::NewerSchema { found, supported, .. }
            if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "got {err:?}"
    );
    assert_eq!(files(&db), before, "the newer database was changed");
}

/// The schema of version 1, as the first release created it.
const V1_SCHEMA: &str = "
    CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL,
                     version INTEGER NOT NULL, expires_at INTEGER);
    CREATE INDEX kv_expiry ON kv (expires_at) WHERE expires_at IS NOT NULL;
    CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO counters (name, value) VALUES ('kv_version', 0);
    CREATE TABLE logs (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                       last_seq INTEGER NOT NULL, expires_at INTEGER);
    CREATE INDEX logs_expiry ON logs (expires_at) WHERE expires_at IS NOT NULL;
    CREATE TABLE log_records (log_id INTEGER NOT NULL, seq INTEGER NOT NULL,
                              data BLOB NOT NULL, PRIMARY KEY (log_id, seq));
    PRAGMA application_id = 1296257136;
    PRAGMA user_version = 1;
";

#[tokio::test]
async fn a_version_1_database_gets_checksums_for_its_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("v1.db");
    {
        let raw = raw(&db);
        raw.execute_batch(V1_SCHEMA).expect("version 1 schema");
        raw.execute_batch(
            "INSERT INTO kv (key, value, version) VALUES ('old', x'6f6c64', 3), ('bad', 'text', 4);
             UPDATE counters SET value = 4;
             INSERT INTO logs (id, name, last_seq) VALUES (1, 'old-log', 2);
             INSERT INTO log_records (log_id, seq, data) VALUES (1, 1, x'61'), (1, 2, x'62');",
        )
        .expect("version 1 rows");
    }
    let store = SqliteStore::open(&db).await.expect("open migrates");
    let version: i64 = raw(&db)
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("user_version");
    assert_eq!(version, 2);
    let entry = store.get(&key("old")).await.expect("get").expect("kept");
    assert_eq!(
        (entry.value.as_slice(), entry.version.get()),
        (&b"old"[..], 3)
    );
    assert_corrupt(
        &store.get(&key("bad")).await.expect_err("not a blob"),
        "bad",
    );
    let records = store
        .read_after(&key("old-log"), 0, 10)
        .await
        .expect("read");
    assert_eq!(
        records
            .iter()
            .map(|r| (r.seq, r.data.clone()))
            .collect::<Vec<_>>(),
        vec![(1, b"a".to_vec()), (2, b"b".to_vec())]
    );
    // And the migrated rows are protected like new ones.
    drop(store);
    flip_a_byte(&db, "kv", "value", "key = 'old'");
    let store = SqliteStore::open(&db).await.expect("reopen");
    assert_corrupt(&store.get(&key("old")).await.expect_err("damaged"), "old");
    let next = store
        .append(&key("old-log"), vec![b"c".to_vec()], None)
        .await
        .expect("append after migration");
    assert_eq!(next, vec![3]);
}

#[cfg(unix)]
#[tokio::test]
async fn a_database_readable_by_others_is_made_private_with_its_side_files() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    let set = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    };
    let side = |db: &Path, suffix: &str| Path::new(&format!("{}{suffix}", db.display())).to_owned();
    let dir = tempfile::tempdir().expect("temp dir");

    // An empty file made by someone else with the usual umask.
    let fresh = dir.path().join("fresh.db");
    std::fs::write(&fresh, b"").expect("touch");
    set(&fresh, 0o644);
    let store = SqliteStore::open(&fresh).await.expect("open");
    store
        .put(&key("k"), b"v".to_vec(), create())
        .await
        .expect("put");
    for file in [fresh.clone(), side(&fresh, "-wal"), side(&fresh, "-shm")] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }

    // A database in use, all three files widened behind its back: the next
    // open narrows them again.
    let wide = dir.path().join("wide.db");
    let first = SqliteStore::open(&wide).await.expect("open");
    first
        .put(&key("k"), b"v".to_vec(), create())
        .await
        .expect("put");
    for file in [wide.clone(), side(&wide, "-wal"), side(&wide, "-shm")] {
        set(&file, 0o644);
    }
    let second = SqliteStore::open(&wide).await.expect("second open");
    for file in [wide.clone(), side(&wide, "-wal"), side(&wide, "-shm")] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert_eq!(
        second
            .get(&key("k"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"v"
    );
    drop(first);
}

/// Milliseconds since the Unix epoch, as the store keeps expiry instants.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

fn count(db: &Path, sql: &str) -> i64 {
    raw(db).query_row(sql, [], |row| row.get(0)).expect("count")
}

#[tokio::test]
async fn a_sweep_keeps_what_expired_within_its_margin() {
    use mcp_persist_core::Backend;
    use mcp_persist_store_sqlite::{SWEEP_MARGIN, SqliteOptions};
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("margin.db");
    let options = SqliteOptions::default().sweep_interval(None);
    let store = SqliteStore::open_with(&db, options).await.expect("open");
    let ttl = Some(std::time::Duration::from_secs(3600));
    for name in ["recent", "old"] {
        store
            .put(&key(name), b"v".to_vec(), create().with_ttl(ttl))
            .await
            .expect("put");
        store
            .append(&key(name), vec![b"r".to_vec()], ttl)
            .await
            .expect("append");
    }
    // As after a clock step: "recent" looks expired a moment ago (well within
    // the margin), "old" expired longer ago than the margin.
    let margin = SWEEP_MARGIN.as_millis() as i64;
    let recent = now_ms() - margin / 2;
    let old = now_ms() - margin - 5_000;
    {
        let raw = raw(&db);
        for table in ["kv", "logs"] {
            let column = if table == "kv" { "key" } else { "name" };
            raw.execute(
                &format!("UPDATE {table} SET expires_at = ?1 WHERE {column} = 'recent'"),
                [recent],
            )
            .expect("plant");
            raw.execute(
                &format!("UPDATE {table} SET expires_at = ?1 WHERE {column} = 'old'"),
                [old],
            )
            .expect("plant");
        }
    }
    // Both are expired to readers...
    for name in ["recent", "old"] {
        assert_eq!(store.get(&key(name)).await.expect("get"), None);
        assert!(
            store
                .read_after(&key(name), 0, 10)
                .await
                .expect("read")
                .is_empty()
        );
    }
    // ...but a sweep deletes only the one past the margin.
    assert_eq!(store.sweep_expired().await.expect("sweep"), 2);
    assert_eq!(
        count(&db, "SELECT count(*) FROM kv WHERE key = 'recent'"),
        1
    );
    assert_eq!(count(&db, "SELECT count(*) FROM kv WHERE key = 'old'"), 0);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM log_records WHERE log_id = (SELECT id FROM logs WHERE name = 'recent')"
        ),
        1
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM logs WHERE name = 'old'"),
        0
    );
    // The clock is set right again: the kept rows are live and intact.
    {
        let raw = raw(&db);
        raw.execute(
            "UPDATE kv SET expires_at = ?1 WHERE key = 'recent'",
            [now_ms() + 3_600_000],
        )
        .expect("repair");
        raw.execute(
            "UPDATE logs SET expires_at = ?1 WHERE name = 'recent'",
            [now_ms() + 3_600_000],
        )
        .expect("repair");
    }
    assert_eq!(
        store
            .get(&key("recent"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"v"
    );
    assert_eq!(
        store.read_after(&key("recent"), 0, 10).await.expect("read")[0].data,
        b"r"
    );
}
