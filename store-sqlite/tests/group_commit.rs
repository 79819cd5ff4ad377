//! Group commit: writes that arrive together share one transaction, each
//! returns only after that transaction committed, and a write that fails its
//! precondition is undone alone.
//!
//! The tests hold SQLite's write lock from a plain connection so that the
//! writer thread is stuck in `BEGIN IMMEDIATE` while the writes queue up;
//! everything they wait for is a condition, never a duration, but for the
//! last test, whose subject is a wait (an unsynced put's moment of waiting
//! for company), and which gives a busy machine five tries.

use mcp_persist_core::conformance::key;
use std::{path::Path, sync::Arc, time::Duration};

use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_sqlite::{SqliteOptions, SqliteStore};
use rusqlite::Connection;
use tokio::task::JoinHandle;

const APPENDERS: usize = 64;

/// Holds the database's write lock until dropped or released.
struct WriteLock(Connection);

impl WriteLock {
    fn take(db: &Path) -> Self {
        let conn = Connection::open(db).expect("raw open");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        WriteLock(conn)
    }

    fn release(self) {
        self.0
            .execute_batch("COMMIT")
            .expect("release the write lock");
    }
}

async fn open(db: &Path) -> SqliteStore {
    // Long enough that the writer never gives up while the test holds the lock.
    let options = SqliteOptions::default().busy_timeout(Duration::from_secs(120));
    SqliteStore::open_with(db, options).await.expect("open")
}

/// Waits (bounded) until the writer is stuck on one operation and `n` more
/// are queued behind it.
async fn until_queued(store: &SqliteStore, n: usize) {
    for _ in 0..6000 {
        let stats = store.write_stats();
        if stats.running == 1 && stats.queued == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} operations never queued up: {:?}", store.write_stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_share_one_commit_and_return_after_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("group.db");
    let store = open(&db).await;
    let before = store.write_stats();

    let lock = WriteLock::take(&db);
    // A first write takes the writer into `BEGIN IMMEDIATE`, where it waits.
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.append(&key("first"), vec![b"0".to_vec()], None).await })
    };
    until_queued(&store, 0).await;
    let appenders: Vec<JoinHandle<_>> = (0..APPENDERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let log = key(format!("stream/{i}"));
                let records = vec![format!("{i}:a").into_bytes(), format!("{i}:b").into_bytes()];
                store.append(&log, records, None).await
            })
        })
        .collect();
    until_queued(&store, APPENDERS).await;
    // Nothing is committed yet, so nothing may have returned.
    assert!(!first.is_finished(), "an append returned before its commit");
    assert!(
        appenders.iter().all(|h| !h.is_finished()),
        "an append returned before its commit"
    );
    lock.release();

    assert_eq!(first.await.expect("task").expect("append"), vec![1]);
    for (i, handle) in appenders.into_iter().enumerate() {
        let seqs = handle.await.expect("task").expect("append");
        assert_eq!(seqs, vec![1, 2], "stream/{i}");
    }
    let after = store.write_stats();
    assert_eq!(after.operations - before.operations, APPENDERS as u64 + 1);
    assert_eq!(
        after.transactions - before.transactions,
        2,
        "the {APPENDERS} queued appends must share one transaction"
    );
    // All of it is durable: a fresh handle reads it back.
    store.close().await.expect("close");
    let reopened = SqliteStore::open(&db).await.expect("reopen");
    for i in 0..APPENDERS {
        let records = reopened
            .read_after(&key(format!("stream/{i}")), 0, 10)
            .await
            .expect("read");
        let data: Vec<Vec<u8>> = records.into_iter().map(|r| r.data).collect();
        assert_eq!(
            data,
            vec![format!("{i}:a").into_bytes(), format!("{i}:b").into_bytes()]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_write_in_a_group_is_undone_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("mixed.db");
    let store = Arc::new(open(&db).await);
    let stale = store
        .put(&key("cas"), b"1".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("create");
    let current = store
        .put(
            &key("cas"),
            b"2".to_vec(),
            PutOptions::new(PutMode::Update(stale)),
        )
        .await
        .expect("update");
    store
        .put(
            &key("taken"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("create");

    let lock = WriteLock::take(&db);
    let blocker = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .append(&key("blocker"), vec![b"0".to_vec()], None)
                .await
        })
    };
    until_queued(&store, 0).await;
    let before = store.write_stats();
    // Queued in this order: a stale CAS, an append, a Create of a taken key,
    // a good CAS, another append.
    let s = Arc::clone(&store);
    let stale_cas = tokio::spawn(async move {
        s.put(
            &key("cas"),
            b"stale".to_vec(),
            PutOptions::new(PutMode::Update(stale)),
        )
        .await
    });
    until_queued(&store, 1).await;
    let s = Arc::clone(&store);
    let append_a =
        tokio::spawn(async move { s.append(&key("mixed"), vec![b"a".to_vec()], None).await });
    until_queued(&store, 2).await;
    let s = Arc::clone(&store);
    let taken = tokio::spawn(async move {
        s.put(
            &key("taken"),
            b"y".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
    });
    until_queued(&store, 3).await;
    let s = Arc::clone(&store);
    let good_cas = tokio::spawn(async move {
        s.put(
            &key("cas"),
            b"3".to_vec(),
            PutOptions::new(PutMode::Update(current)),
        )
        .await
    });
    until_queued(&store, 4).await;
    let s = Arc::clone(&store);
    let append_b =
        tokio::spawn(async move { s.append(&key("mixed"), vec![b"b".to_vec()], None).await });
    until_queued(&store, 5).await;
    lock.release();

    blocker.await.expect("task").expect("blocker");
    let err = stale_cas.await.expect("task").expect_err("stale CAS");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
    assert_eq!(append_a.await.expect("task").expect("append"), vec![1]);
    let err = taken
        .await
        .expect("task")
        .expect_err("create of a taken key");
    assert!(matches!(err, Error::AlreadyExists { .. }), "got {err:?}");
    let v3 = good_cas.await.expect("task").expect("good CAS");
    assert!(v3 > current);
    assert_eq!(append_b.await.expect("task").expect("append"), vec![2]);
    let after = store.write_stats();
    assert_eq!(
        after.transactions - before.transactions,
        2,
        "blocker, then one group"
    );

    let entry = store.get(&key("cas")).await.expect("get").expect("present");
    assert_eq!((entry.value, entry.version), (b"3".to_vec(), v3));
    assert_eq!(
        store
            .get(&key("taken"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"x"
    );
    let mixed: Vec<Vec<u8>> = store
        .read_after(&key("mixed"), 0, 10)
        .await
        .expect("read")
        .into_iter()
        .map(|r| r.data)
        .collect();
    assert_eq!(mixed, vec![b"a".to_vec(), b"b".to_vec()]);
}

/// An unsynced put (a kept answer) waits a moment for the write its caller
/// sends next (the response's synced event) and shares that commit, rather
/// than cost one of its own; alone, it still commits, a moment later.
///
/// The follower comes 200 µs after the unsynced put, long after the writer
/// took the put (a write it did not wait for committed alone by then); the
/// writer waits up to a millisecond. A machine too busy to send the follower
/// within that gets five tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsynced_put_shares_the_commit_of_the_write_behind_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir.path().join("shared.db")).await;

    let mut shared = Vec::new();
    for attempt in 0..5 {
        let before = store.write_stats();
        let answer = {
            let store = store.clone();
            tokio::spawn(async move {
                let options = PutOptions::new(PutMode::Overwrite).unsynced();
                store
                    .put(&key(format!("answer/{attempt}")), b"kept".to_vec(), options)
                    .await
            })
        };
        std::thread::sleep(Duration::from_micros(200));
        store
            .append(
                &key(format!("events/{attempt}")),
                vec![b"response".to_vec()],
                None,
            )
            .await
            .expect("append");
        answer.await.expect("task").expect("unsynced put");
        let after = store.write_stats();
        assert_eq!(after.operations - before.operations, 2);
        shared.push(after.transactions - before.transactions);
        if shared.last() == Some(&1) {
            break;
        }
    }
    assert_eq!(
        shared.last(),
        Some(&1),
        "the unsynced put never shared the next write's commit (commits per try: {shared:?})"
    );

    // Alone, it commits by itself, and it is there.
    let before = store.write_stats();
    let options = PutOptions::new(PutMode::Overwrite).unsynced();
    store
        .put(&key("alone"), b"kept".to_vec(), options)
        .await
        .expect("a lone unsynced put");
    assert_eq!(store.write_stats().transactions - before.transactions, 1);
    let entry = store
        .get(&key("alone"))
        .await
        .expect("get")
        .expect("present");
    assert_eq!(entry.value, b"kept");
}
