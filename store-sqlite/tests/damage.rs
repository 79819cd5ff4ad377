//! Damage is not a crash: bytes or numbers changed in the database behind the
//! store's back are a typed [`Error::Corrupt`] naming the key or log, never a
//! different value, never a panic, and one damaged row fails its own
//! operations alone: the writer goes on serving every other key.
//!
//! Each test opens the database with a raw rusqlite connection to plant the
//! damage, as a bad disk, a stray tool or a hostile local user could.

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
async fn writer_alive(store: &SqliteStore, key: &str) {
    store
        .put(key, b"alive".to_vec(), create())
        .await
        .unwrap_or_else(|e| panic!("the next write failed: {e}"));
    assert_eq!(
        store.get(key).await.expect("get").expect("present").value,
        b"alive"
    );
    store
        .append(&format!("{key}/log"), vec![b"alive".to_vec()], None)
        .await
        .unwrap_or_else(|e| panic!("the next append failed: {e}"));
}

#[tokio::test]
async fn a_last_sequence_number_at_the_maximum_fails_that_append_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("seq.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .append("full", vec![b"a".to_vec()], None)
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
            .append("full", vec![b"b".to_vec()], None)
            .await
            .expect_err("no sequence number is left");
        assert_corrupt(&err, "full");
    }
    writer_alive(&store, "other").await;
    // Reads of the damaged log still work: its records are intact.
    let records = store.read_after("full", 0, 10).await.expect("read");
    assert_eq!(records.len(), 1);
}

#[tokio::test]
async fn negative_stored_numbers_are_corrupt_and_the_writer_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("negative.db");
    let store = SqliteStore::open(&db).await.expect("open");
    store
        .append("neg", vec![b"a".to_vec()], None)
        .await
        .expect("append");
    store
        .put("key", b"v".to_vec(), create())
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
        .append("neg", vec![b"b".to_vec()], None)
        .await
        .expect_err("negative last sequence number");
    assert_corrupt(&err, "neg");
    let err = store.get("key").await.expect_err("negative version");
    assert_corrupt(&err, "key");
    let err = store
        .put("key", b"w".to_vec(), PutOptions::new(PutMode::Overwrite))
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
        .put("key", b"v".to_vec(), create())
        .await
        .expect("put");
    for planted in [i64::MAX, -7, 0] {
        raw(&db)
            .execute(
                "UPDATE counters SET value = ?1 WHERE name = 'kv_version'",
                [planted],
            )
            .expect("plant");
        let err = store
            .put("key", b"w".to_vec(), PutOptions::new(PutMode::Update(v)))
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
        store.get("key").await.expect("get").expect("kept").value,
        b"v"
    );
    raw(&db)
        .execute(
            "UPDATE counters SET value = 10 WHERE name = 'kv_version'",
            [],
        )
        .expect("repair");
    let w = store
        .put("key", b"w".to_vec(), PutOptions::new(PutMode::Update(v)))
        .await
        .expect("put after repair");
    assert!(w > v);
}
