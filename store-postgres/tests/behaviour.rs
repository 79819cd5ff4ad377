//! What this backend promises beyond the conformance suite: readers woken by
//! NOTIFY long before the poll interval, group commit, numbers never
//! reused after a delete or an expiry (and `next_seq` saying so without a
//! write), the schema option, and the server's clock deciding expiry.

mod common;

use std::time::{Duration, Instant};

use mcp_persist_core::{Backend, Key, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_postgres::PostgresStore;

fn key(text: &str) -> Key {
    Key::new(text).expect("valid key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_wakes_a_reader_on_another_pool_at_once() {
    let schema = common::unique_schema("notify");
    let writer = common::open(&schema).await;
    // A poll interval far longer than the test: only a notification can
    // wake the reader in time.
    let reader = PostgresStore::builder(&common::url())
        .schema(&schema)
        .poll_interval(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect");
    writer
        .append(&key("tail"), vec![b"0".to_vec()], None)
        .await
        .expect("append");
    for round in 0..5u8 {
        let last = reader
            .read_after(&key("tail"), 0, usize::MAX)
            .await
            .expect("read")
            .last()
            .map_or(0, |r| r.seq);
        let waiting = {
            let reader = reader.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let got = reader
                    .wait_after(&key("tail"), last, 10, Duration::from_secs(30))
                    .await
                    .expect("wait");
                (got, started.elapsed())
            })
        };
        // Appends to another log do not end the wait.
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer
            .append(&key("other"), vec![b"x".to_vec()], None)
            .await
            .expect("append");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiting.is_finished(),
            "an append to another log ended the wait"
        );
        let appended = Instant::now();
        writer
            .append(&key("tail"), vec![vec![round]], None)
            .await
            .expect("append");
        let (got, _) = waiting.await.expect("task");
        let latency = appended.elapsed();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data, vec![round]);
        assert!(latency < Duration::from_secs(2), "woken after {latency:?}");
    }
    assert!(reader.is_listening());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_share_transactions() {
    let store = common::open(&common::unique_schema("group")).await;
    let mut tasks = Vec::new();
    for t in 0..64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20u32 {
                store
                    .append(
                        &key(&format!("log-{t}")),
                        vec![i.to_be_bytes().to_vec()],
                        None,
                    )
                    .await
                    .expect("append");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let stats = store.write_stats();
    assert_eq!(stats.appends, 64 * 20);
    assert!(
        stats.transactions * 4 < stats.appends,
        "appends were not grouped: {stats:?}"
    );
}

#[tokio::test]
async fn numbers_and_versions_never_repeat() {
    let store = common::open(&common::unique_schema("norepeat")).await;
    let log = key("l");
    let first = store
        .append(&log, vec![b"a".to_vec(), b"b".to_vec()], None)
        .await
        .expect("append");
    store.delete_log(&log).await.expect("delete");
    let second = store
        .append(&log, vec![b"c".to_vec()], None)
        .await
        .expect("append");
    assert!(second[0] > first[1], "{second:?} after {first:?}");
    store.trim(&log, second[0] + 1).await.expect("trim");
    let third = store
        .append(&log, vec![b"d".to_vec()], Some(Duration::from_millis(50)))
        .await
        .expect("append");
    assert!(third[0] > second[0]);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        store
            .read_after(&log, 0, 10)
            .await
            .expect("read")
            .is_empty(),
        "expired"
    );
    let fourth = store
        .append(&log, vec![b"e".to_vec()], None)
        .await
        .expect("append");
    assert!(fourth[0] > third[0]);
    let read = store.read_after(&log, 0, 10).await.expect("read");
    assert_eq!(read.len(), 1, "an expired log starts again empty");

    let k = key("k");
    let v1 = store
        .put(&k, b"1".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    assert!(store.delete(&k, Some(v1)).await.expect("delete"));
    let v2 = store
        .put(&k, b"2".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    assert!(v2 > v1);
    let v3 = store
        .put(
            &k,
            b"3".to_vec(),
            PutOptions::default().with_ttl(Duration::from_millis(50)),
        )
        .await
        .expect("put");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store.get(&k).await.expect("get").is_none());
    let v4 = store
        .put(&k, b"4".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    assert!(v4 > v3);
}

/// `next_seq` reads the log's header: numbers go on after a delete and an
/// expiry, as long as the header is kept, and start at 1 again once the
/// sweep removed it. Asking creates no header.
#[tokio::test]
async fn next_seq_follows_the_header_and_writes_nothing() {
    let schema = common::unique_schema("next_seq");
    let store = common::open(&schema).await;
    let log = key("l");
    let headers = || {
        let schema = schema.clone();
        async move {
            let (client, connection) =
                tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
                    .await
                    .expect("admin");
            tokio::spawn(connection);
            let n: i64 = client
                .query_one(&format!("SELECT count(*) FROM \"{schema}\".logs"), &[])
                .await
                .expect("count")
                .get(0);
            n
        }
    };
    let said = |want: u64| {
        let store = store.clone();
        let log = log.clone();
        async move {
            assert_eq!(
                store.next_seq(&log).await.expect("next_seq"),
                Some(want),
                "next_seq"
            );
            let got = store
                .append(&log, vec![b"x".to_vec()], Some(Duration::from_millis(50)))
                .await
                .expect("append");
            assert_eq!(got, vec![want], "the append after next_seq");
        }
    };
    assert_eq!(store.next_seq(&log).await.expect("next_seq"), Some(1));
    assert_eq!(headers().await, 0, "asking created a header");
    said(1).await;
    store.delete_log(&log).await.expect("delete");
    said(2).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    said(3).await;
    // Expired long enough ago for the sweep: the header goes, numbers restart.
    common::admin(&format!(
        "UPDATE \"{schema}\".logs SET expires_at = clock_timestamp() - interval '1 day'"
    ))
    .await;
    assert_eq!(store.next_seq(&log).await.expect("next_seq"), Some(4));
    assert!(store.sweep_expired().await.expect("sweep") >= 1);
    assert_eq!(headers().await, 0, "the sweep kept the header");
    said(1).await;
}

#[tokio::test]
async fn schemas_keep_apps_apart_and_the_url_names_one() {
    let (a, b) = (
        common::unique_schema("app_a"),
        common::unique_schema("app_b"),
    );
    let mut url = url::Url::parse(&common::url()).expect("url");
    url.query_pairs_mut().append_pair("schema", &a);
    let store_a = PostgresStore::connect(url.as_str()).await.expect("connect");
    assert_eq!(store_a.schema(), a);
    let store_b = common::open(&b).await;
    store_a
        .put(&key("k"), b"a".to_vec(), PutOptions::default())
        .await
        .expect("put");
    assert!(store_b.get(&key("k")).await.expect("get").is_none());
    assert_eq!(store_b.list("").await.expect("list"), Vec::<Key>::new());
}

#[tokio::test]
async fn expiry_follows_the_servers_clock() {
    // The server computes and compares expiry instants itself: a TTL written
    // here is a timestamptz computed by the server.
    let schema = common::unique_schema("clock");
    let store = common::open(&schema).await;
    store
        .put(
            &key("k"),
            b"v".to_vec(),
            PutOptions::default().with_ttl(Duration::from_secs(3600)),
        )
        .await
        .expect("put");
    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("admin");
    tokio::spawn(connection);
    let left: f64 = client
        .query_one(
            &format!(
                "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM \"{schema}\".kv"
            ),
            &[],
        )
        .await
        .expect("query")
        .get(0);
    assert!((3590.0..=3600.1).contains(&left), "{left}");
    // Moving the stored expiry into the server's past hides the record.
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".kv SET expires_at = clock_timestamp() - interval '1 second'"
        ))
        .await
        .expect("update");
    assert!(store.get(&key("k")).await.expect("get").is_none());
}

/// Numbers are per log and contiguous, whatever other logs append in
/// between, as on every other backend: `mcp-persist copy` moves a log to
/// another backend with the same numbers, so the same event ids.
#[tokio::test]
async fn numbers_are_per_log_and_contiguous() {
    let store = common::open(&common::unique_schema("contiguous")).await;
    let (a, b) = (key("a"), key("b"));
    let mut issued = Vec::new();
    for round in 0..3u8 {
        issued.extend(
            store
                .append(&a, vec![vec![round], vec![round]], None)
                .await
                .expect("append"),
        );
        store
            .append(&b, vec![vec![round]], None)
            .await
            .expect("append");
    }
    assert_eq!(
        issued,
        [1, 2, 3, 4, 5, 6],
        "log a, with log b appended in between"
    );
    let read: Vec<u64> = store
        .read_after(&b, 0, 10)
        .await
        .expect("read")
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(read, [1, 2, 3]);
}

/// An unsynced put commits with `synchronous_commit = off` (it does not
/// wait for the WAL flush); a put after it on the same pool waits again.
/// A trigger deferred to the commit notes the setting each commit saw.
#[tokio::test]
async fn an_unsynced_put_alone_commits_without_waiting_for_the_flush() {
    let schema = common::unique_schema("unsynced_put");
    let store = PostgresStore::builder(&common::url())
        .schema(&schema)
        .pool_size(1)
        .connect()
        .await
        .expect("connect");
    common::admin(&format!(
        "CREATE TABLE {schema}.seen (n serial, key text, setting text);
         CREATE FUNCTION {schema}.note() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN
             INSERT INTO {schema}.seen (key, setting)
             VALUES (NEW.key, current_setting('synchronous_commit'));
             RETURN NULL;
         END $f$;
         CREATE CONSTRAINT TRIGGER note AFTER INSERT OR UPDATE ON {schema}.kv
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.note();"
    ))
    .await;
    let synced = PutOptions::default();
    store
        .put(&key("a"), b"1".to_vec(), synced)
        .await
        .expect("put");
    let version = store
        .put(&key("a"), b"2".to_vec(), synced.unsynced())
        .await
        .expect("unsynced put");
    // Preconditions hold as for any put.
    assert!(matches!(
        store
            .put(
                &key("b"),
                b"x".to_vec(),
                PutOptions::new(PutMode::Update(version)).unsynced()
            )
            .await,
        Err(mcp_persist_core::Error::Conflict { .. })
    ));
    store
        .put(&key("a"), b"3".to_vec(), synced)
        .await
        .expect("put");
    assert_eq!(
        store.get(&key("a")).await.expect("get").map(|e| e.value),
        Some(b"3".to_vec())
    );

    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let task = tokio::spawn(connection);
    let seen: Vec<(String, String)> = client
        .query(
            &format!("SELECT key, setting FROM {schema}.seen ORDER BY n"),
            &[],
        )
        .await
        .expect("read")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    drop(client);
    let _ = task.await;
    let on = |k: &str, s: &str| (k.to_owned(), s.to_owned());
    assert_eq!(seen, vec![on("a", "on"), on("a", "off"), on("a", "on")]);
}
