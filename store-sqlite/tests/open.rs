//! Opening databases: what is refused and left untouched, the file's mode,
//! WAL, damaged rows, and reclaiming expired rows.

use mcp_persist_core::conformance::key;
use std::{path::Path, time::Duration};

use mcp_persist_core::{Backend, Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_sqlite::{Durability, SCHEMA_VERSION, SqliteOptions, SqliteStore};
use rusqlite::Connection;

/// Every file of the database (main, `-wal`, `-shm`) that exists, with its bytes.
fn snapshot(db: &Path) -> Vec<(String, Vec<u8>)> {
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .filter_map(|suffix| {
            let path = format!("{}{suffix}", db.display());
            std::fs::read(&path).ok().map(|bytes| (path, bytes))
        })
        .collect()
}

async fn store_with_a_record(db: &Path) {
    let store = SqliteStore::open(db).await.expect("open");
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    store.close().await.expect("close");
}

#[tokio::test]
async fn newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("newer.db");
    store_with_a_record(&db).await;
    {
        let raw = Connection::open(&db).expect("raw open");
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("set a newer user_version");
    }
    let before = snapshot(&db);
    let err = SqliteStore::open(&db)
        .await
        .expect_err("a newer schema must be refused");
    match err {
        Error::NewerSchema {
            found, supported, ..
        } => {
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("want NewerSchema, got {other:?}"),
    }
    assert_eq!(snapshot(&db), before, "the newer database was modified");
    // The data is still there for the newer version.
    let raw = Connection::open(&db).expect("raw open");
    let value: Vec<u8> = raw
        .query_row("SELECT value FROM kv WHERE key = 'k'", [], |row| row.get(0))
        .expect("the record is still there");
    assert_eq!(value, b"v");
}

#[tokio::test]
async fn another_applications_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("other.db");
    {
        let raw = Connection::open(&db).expect("raw open");
        raw.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
            .expect("someone else's schema");
    }
    let before = snapshot(&db);
    let err = SqliteStore::open(&db)
        .await
        .expect_err("a foreign database must be refused");
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                what: "database",
                ..
            }
        ),
        "got {err:?}"
    );
    assert_eq!(snapshot(&db), before, "the foreign database was modified");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_corrupt_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("garbage.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&db, &garbage).expect("write garbage");
    let err = SqliteStore::open(&db)
        .await
        .expect_err("garbage must be refused");
    match &err {
        Error::Corrupt { key, source, .. } => {
            assert_eq!(key, &db.display().to_string(), "names the database");
            assert!(source.is_some(), "keeps the SQLite error as source");
        }
        other => panic!("want Corrupt, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db).expect("read back"), garbage);
}

#[cfg(unix)]
#[tokio::test]
async fn new_database_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("state");
    let db = folder.join("store.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .put(
            &key("secret"),
            b"token".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&folder), 0o700, "created folder");
    assert_eq!(mode(&db), 0o600, "database file");
    for suffix in ["-wal", "-shm"] {
        let side = Path::new(&format!("{}{suffix}", db.display())).to_path_buf();
        assert_eq!(mode(&side), 0o600, "{suffix} file");
    }
}

#[tokio::test]
async fn database_is_in_wal_mode_with_our_schema() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("wal.db");
    let store = SqliteStore::open(&db).await.expect("open");
    let raw = Connection::open(&db).expect("raw open");
    let mode: String = raw
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal");
    let version: u32 = raw
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    drop(raw);
    store.close().await.expect("close");
    // Reopening an up-to-date database migrates nothing and keeps working.
    let store = SqliteStore::open(&db).await.expect("reopen");
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put after reopen");
}

#[tokio::test]
async fn damaged_rows_are_corrupt_naming_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("rows.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .put(&key("bad"), b"x".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    store
        .put(
            &key("good"),
            b"y".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    store
        .append(&key("log/bad"), vec![b"r".to_vec()], None)
        .await
        .expect("append");
    {
        let raw = Connection::open(&db).expect("raw open");
        raw.execute_batch(
            "UPDATE kv SET value = 'not a blob' WHERE key = 'bad';
             UPDATE log_records SET data = 42;",
        )
        .expect("damage rows");
    }
    let err = store.get(&key("bad")).await.expect_err("a damaged value");
    assert!(
        matches!(&err, Error::Corrupt { key, source: Some(_), .. } if key == "bad"),
        "got {err:?}"
    );
    let err = store
        .read_after(&key("log/bad"), 0, 10)
        .await
        .expect_err("a damaged record");
    assert!(
        matches!(&err, Error::Corrupt { key, .. } if key == "log/bad"),
        "got {err:?}"
    );
    // Other records still work, and the damaged one can be replaced.
    assert_eq!(
        store
            .get(&key("good"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"y"
    );
    store
        .put(
            &key("bad"),
            b"fixed".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("overwrite the damaged record");
    assert_eq!(
        store
            .get(&key("bad"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"fixed"
    );
}

/// Moves every expiry in `table` two minutes into the past: the rows look as
/// if they had expired longer ago than the sweep's margin.
fn expired_long_ago(db: &Path, table: &str) {
    Connection::open(db)
        .expect("raw open")
        .execute(
            &format!(
                "UPDATE {table} SET expires_at = expires_at - 120000 WHERE expires_at IS NOT NULL"
            ),
            [],
        )
        .expect("age the expiries");
}

fn row_count(db: &Path, table: &str) -> i64 {
    Connection::open(db)
        .expect("raw open")
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .expect("count")
}

#[tokio::test]
async fn sweep_reclaims_expired_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("sweep.db");
    let options = SqliteOptions::default().sweep_interval(None);
    let store = SqliteStore::open_with(&db, options).await.expect("open");
    let short = Some(Duration::from_millis(1));
    store
        .put(
            &key("gone"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(short),
        )
        .await
        .expect("put");
    store
        .put(
            &key("kept"),
            b"y".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    store
        .append(&key("gone"), vec![b"a".to_vec(), b"b".to_vec()], short)
        .await
        .expect("append");
    store
        .append(&key("kept"), vec![b"c".to_vec()], None)
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.get(&key("gone")).await.expect("get"), None);
    assert_eq!(row_count(&db, "kv"), 2, "expired rows stay until swept");
    expired_long_ago(&db, "kv");
    expired_long_ago(&db, "logs");
    // One sweep for both: the expired record and the expired log.
    assert_eq!(store.sweep_expired().await.expect("sweep"), 2);
    assert_eq!(row_count(&db, "kv"), 1);
    assert_eq!(row_count(&db, "logs"), 1);
    assert_eq!(row_count(&db, "log_records"), 1);
    assert_eq!(
        store
            .read_after(&key("kept"), 0, 10)
            .await
            .expect("read")
            .len(),
        1
    );
}

#[tokio::test]
async fn idle_writer_sweeps_on_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("auto.db");
    let options = SqliteOptions::default().sweep_interval(Some(Duration::from_millis(50)));
    let store = SqliteStore::open_with(&db, options).await.expect("open");
    store
        .put(
            &key("gone"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(Duration::from_millis(1))),
        )
        .await
        .expect("put");
    store
        .append(
            &key("gone"),
            vec![b"a".to_vec()],
            Some(Duration::from_millis(1)),
        )
        .await
        .expect("append");
    expired_long_ago(&db, "kv");
    expired_long_ago(&db, "logs");
    // Await the condition, bounded: the sweep runs every 50 ms.
    for _ in 0..200 {
        if row_count(&db, "kv") == 0 && row_count(&db, "log_records") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the periodic sweep never removed the expired rows");
}

#[tokio::test]
async fn normal_durability_and_in_memory_stores_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("normal.db");
    let options = SqliteOptions::default().durability(Durability::Normal);
    let store = SqliteStore::open_with(&db, options).await.expect("open");
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    store.close().await.expect("close");
    let store = SqliteStore::open(&db).await.expect("reopen");
    assert_eq!(
        store
            .get(&key("k"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"v"
    );
    assert_eq!(store.path(), Some(db.as_path()));

    let memory = SqliteStore::open_in_memory().await.expect("in memory");
    assert_eq!(memory.path(), None);
    memory
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    assert_eq!(
        memory
            .get(&key("k"))
            .await
            .expect("get")
            .expect("kept")
            .value,
        b"v"
    );
    let other = SqliteStore::open_in_memory().await.expect("in memory");
    assert_eq!(
        other.get(&key("k")).await.expect("get"),
        None,
        "in-memory stores are private"
    );
}
