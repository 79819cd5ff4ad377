//! Behaviour of the Redis backend beyond the core suite: hash tags on a
//! Cluster, records written by something else, blocking reads that never
//! hold up the shared connection, and typed errors for bad settings.

mod common;

use mcp_persist_core::conformance::key;
use std::time::Duration;

use common::{Endpoint, Topology, unique_prefix};
use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_redis::RedisStore;
use redis::aio::ConnectionLike;

/// Keys whose braces would split a naive layout across Cluster slots.
const BRACE_KEYS: [&str; 6] = ["}starts", "{}", "a}b{c}", "{x}", "}", "x}:ver"];

async fn brace_keys_work_on(topology: Topology) {
    let Some(endpoint) = Endpoint::of(topology) else {
        return;
    };
    let store = endpoint.open(&unique_prefix("braces")).await;
    for key in BRACE_KEYS {
        let v1 = store
            .put(
                &mcp_persist_core::conformance::key(key),
                b"1".to_vec(),
                PutOptions::new(PutMode::Create).with_ttl(Some(Duration::from_secs(60))),
            )
            .await
            .unwrap_or_else(|e| panic!("create {key:?}: {e}"));
        let v2 = store
            .put(
                &mcp_persist_core::conformance::key(key),
                b"2".to_vec(),
                PutOptions::new(PutMode::Update(v1)),
            )
            .await
            .unwrap_or_else(|e| panic!("update {key:?}: {e}"));
        assert!(
            store
                .delete(&mcp_persist_core::conformance::key(key), Some(v2))
                .await
                .expect("delete")
        );
        let v3 = store
            .put(
                &mcp_persist_core::conformance::key(key),
                b"3".to_vec(),
                PutOptions::new(PutMode::Create),
            )
            .await
            .expect("create again");
        assert!(v3 > v2, "version of {key:?} did not survive the delete");
        let seqs = store
            .append(
                &mcp_persist_core::conformance::key(key),
                vec![b"a".to_vec(), b"b".to_vec()],
                Some(Duration::from_secs(60)),
            )
            .await
            .expect("append");
        assert_eq!(
            store
                .read_after(&mcp_persist_core::conformance::key(key), seqs[0], 10)
                .await
                .expect("read")[0]
                .data,
            b"b"
        );
    }
    let mut expected: Vec<&str> = BRACE_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(store.list("").await.expect("list"), expected);
}

#[tokio::test]
async fn keys_with_braces_work_standalone() {
    brace_keys_work_on(Topology::Standalone).await;
}

#[tokio::test]
async fn keys_with_braces_stay_in_one_cluster_slot() {
    brace_keys_work_on(Topology::Cluster).await;
}

/// A raw connection to the standalone test server.
async fn raw(endpoint: &Endpoint) -> Option<redis::aio::MultiplexedConnection> {
    let Endpoint::Standalone(url) = endpoint else {
        return None;
    };
    let client = redis::Client::open(url.as_str()).expect("url");
    Some(
        client
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection"),
    )
}

async fn raw_cmd(conn: &mut impl ConnectionLike, args: &[&[u8]]) -> redis::Value {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("ascii command"));
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.expect("raw command")
}

#[tokio::test]
async fn foreign_records_are_corrupt_and_nothing_is_overwritten() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let prefix = unique_prefix("corrupt");
    let store = endpoint.open(&prefix).await;
    let mut raw = raw(&endpoint).await.expect("standalone");

    // A string without our version header.
    let record = format!("{prefix}{{kv:plain}}");
    raw_cmd(&mut raw, &[b"SET", record.as_bytes(), b"written by hand"]).await;
    let err = store.get(&key("plain")).await.expect_err("no header");
    assert!(
        matches!(err, Error::Corrupt { ref key, .. } if key == "plain"),
        "got {err:?}"
    );
    for mode in [PutMode::Create, PutMode::Overwrite] {
        let err = store
            .put(&key("plain"), b"new".to_vec(), PutOptions::new(mode))
            .await
            .expect_err("a corrupt record is not overwritten");
        assert!(matches!(err, Error::Corrupt { .. }), "got {err:?}");
    }
    assert_eq!(
        raw_cmd(&mut raw, &[b"GET", record.as_bytes()]).await,
        redis::Value::BulkString(b"written by hand".to_vec()),
        "the damaged record must be left as it was"
    );
    // Deleting it deliberately makes the key usable again.
    assert!(store.delete(&key("plain"), None).await.expect("delete"));
    store
        .put(
            &key("plain"),
            b"fresh".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("create after delete");

    // A key of another Redis type.
    let record = format!("{prefix}{{kv:list}}");
    raw_cmd(&mut raw, &[b"RPUSH", record.as_bytes(), b"x"]).await;
    let err = store.get(&key("list")).await.expect_err("wrong type");
    assert!(
        matches!(err, Error::Corrupt { ref key, .. } if key == "list"),
        "got {err:?}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the Redis error is kept"
    );

    // A stream entry with an id and fields this store never writes.
    let stream = format!("{prefix}{{log:events}}");
    raw_cmd(
        &mut raw,
        &[b"XADD", stream.as_bytes(), b"*", b"other", b"x"],
    )
    .await;
    let err = store
        .read_after(&key("events"), 0, 10)
        .await
        .expect_err("foreign entry");
    assert!(
        matches!(err, Error::Corrupt { ref key, .. } if key == "events"),
        "got {err:?}"
    );
    let stream = format!("{prefix}{{log:nodata}}");
    raw_cmd(
        &mut raw,
        &[b"XADD", stream.as_bytes(), b"0-1", b"other", b"x"],
    )
    .await;
    let err = store
        .read_after(&key("nodata"), 0, 10)
        .await
        .expect_err("no data field");
    assert!(
        matches!(err, Error::Corrupt { ref key, .. } if key == "nodata"),
        "got {err:?}"
    );
    let err = store
        .append(&key("list"), vec![b"x".to_vec()], None)
        .await
        .err();
    assert!(
        err.is_none(),
        "a log and a record of the same name are distinct"
    );

    // A log key of another type fails only the appends to it, even when
    // they are committed together with appends to healthy logs.
    let stream = format!("{prefix}{{log:wrong}}");
    raw_cmd(&mut raw, &[b"SET", stream.as_bytes(), b"not a stream"]).await;
    let mut appends = Vec::new();
    for i in 0..32 {
        let store = store.clone();
        let log = if i % 4 == 0 {
            "wrong".to_owned()
        } else {
            format!("fine/{i}")
        };
        appends.push(tokio::spawn(async move {
            let result = store
                .append(
                    &mcp_persist_core::conformance::key(&log),
                    vec![b"x".to_vec()],
                    Some(Duration::from_secs(60)),
                )
                .await;
            (log, result)
        }));
    }
    for append in appends {
        let (log, result) = append.await.expect("task");
        if log == "wrong" {
            assert!(
                matches!(result, Err(Error::Corrupt { ref key, .. }) if key == "wrong"),
                "got {result:?}"
            );
        } else {
            assert_eq!(result.expect("a healthy log appends").len(), 1);
        }
    }
    assert_eq!(
        raw_cmd(&mut raw, &[b"GET", stream.as_bytes()]).await,
        redis::Value::BulkString(b"not a stream".to_vec()),
        "the foreign key keeps its value"
    );
    assert_eq!(
        raw_cmd(&mut raw, &[b"PTTL", stream.as_bytes()]).await,
        redis::Value::Int(-1),
        "the foreign key keeps having no expiry"
    );
}

async fn waiting_never_blocks_others_on(topology: Topology) {
    let Some(endpoint) = Endpoint::of(topology) else {
        return;
    };
    let store = endpoint.open(&unique_prefix("tail")).await;
    let first = store
        .append(&key("tail"), vec![b"first".to_vec()], None)
        .await
        .expect("append")[0];
    // Several tails wait at once on the same store handle...
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let tail = store.clone();
        waiting.push(tokio::spawn(async move {
            tail.wait_after(&key("tail"), first, 10, Duration::from_secs(30))
                .await
        }));
    }
    // ...while the same handle keeps working: were the tails blocking its
    // connection, this append would wait for them and they would time out
    // empty.
    tokio::time::sleep(Duration::from_millis(50)).await;
    store
        .put(
            &key("k"),
            b"v".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("put while others wait");
    store
        .append(&key("tail"), vec![b"second".to_vec()], None)
        .await
        .expect("append while others wait");
    for tail in waiting {
        let got = tail.await.expect("task").expect("wait_after");
        assert_eq!(got.len(), 1, "the tail must see the append");
        assert_eq!(got[0].data, b"second");
    }
}

#[tokio::test]
async fn waiting_never_blocks_others_standalone() {
    waiting_never_blocks_others_on(Topology::Standalone).await;
}

#[tokio::test]
async fn waiting_never_blocks_others_on_a_cluster() {
    waiting_never_blocks_others_on(Topology::Cluster).await;
}

#[tokio::test]
async fn prefixes_isolate_stores_on_one_server() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let a = endpoint.open(&unique_prefix("a")).await;
    let b = endpoint.open(&unique_prefix("b")).await;
    a.put(
        &key("shared/name"),
        b"a".to_vec(),
        PutOptions::new(PutMode::Create),
    )
    .await
    .expect("put a");
    b.put(
        &key("shared/name"),
        b"b".to_vec(),
        PutOptions::new(PutMode::Create),
    )
    .await
    .expect("the same key under another prefix is another key");
    assert_eq!(a.list("").await.expect("list"), vec!["shared/name"]);
    assert_eq!(
        b.get(&key("shared/name"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"b"
    );
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // A port that nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let err = RedisStore::standalone(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, Error::Unavailable { .. }), "got {err:?}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn bad_settings_are_invalid_input() {
    let err = RedisStore::standalone("not a url")
        .connect()
        .await
        .expect_err("bad url");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
    let err = RedisStore::standalone("redis://user:hunter2@127.0.0.1:1/")
        .key_prefix("app{1}:")
        .connect()
        .await
        .expect_err("braces in the prefix");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    let builder = RedisStore::standalone("redis://user:hunter2@127.0.0.1:1/");
    assert!(
        !format!("{builder:?}").contains("hunter2"),
        "the builder prints no password"
    );
    let err = RedisStore::cluster(Vec::<String>::new())
        .connect()
        .await
        .expect_err("no seed nodes");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
}

#[tokio::test]
async fn extreme_arguments_neither_panic_nor_misread() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let store = endpoint.open(&unique_prefix("extreme")).await;
    let seqs = store
        .append(
            &key("l"),
            vec![b"a".to_vec(), b"b".to_vec()],
            Some(Duration::MAX),
        )
        .await
        .expect("a TTL too long for Redis is clamped");
    assert!(
        store
            .read_after(&key("l"), u64::MAX, 10)
            .await
            .expect("read")
            .is_empty()
    );
    assert!(
        store
            .read_after(&key("l"), 0, 0)
            .await
            .expect("read")
            .is_empty()
    );
    // A tail with an endless timeout still returns what is there.
    let got = store
        .wait_after(&key("l"), seqs[0], usize::MAX, Duration::MAX)
        .await
        .expect("wait");
    assert_eq!(got.len(), 1);
    let tail = store.clone();
    let waiting =
        tokio::spawn(async move { tail.wait_after(&key("l"), seqs[1], 1, Duration::MAX).await });
    store
        .append(&key("l"), vec![b"c".to_vec()], None)
        .await
        .expect("append");
    assert_eq!(waiting.await.expect("task").expect("wait")[0].data, b"c");
    assert_eq!(store.trim(&key("l"), u64::MAX).await.expect("trim"), 3);
    assert!(
        store
            .read_after(&key("l"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
    store
        .put(
            &key("k"),
            b"v".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(Duration::MAX)),
        )
        .await
        .expect("a TTL too long for Redis is clamped");
    assert_eq!(
        store
            .get(&key("k"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"v"
    );
}

/// The remaining lifetime of a log's Redis key, in ms (`PTTL`: -1 for no
/// expiry, -2 for no key).
async fn log_pttl(conn: &mut impl ConnectionLike, prefix: &str, log: &str) -> i64 {
    let key = format!("{prefix}{{log:{log}}}");
    match raw_cmd(conn, &[b"PTTL", key.as_bytes()]).await {
        redis::Value::Int(ms) => ms,
        other => panic!("PTTL returned {other:?}"),
    }
}

/// Appends in quick succession skip refreshing the expiry, yet the log
/// still lives at least its TTL past the last of them.
#[tokio::test]
async fn a_log_lives_its_ttl_past_every_append() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let prefix = unique_prefix("ttl");
    let store = endpoint.open(&prefix).await;
    let mut conn = raw(&endpoint).await.expect("standalone");
    let ttl = Duration::from_secs(8);
    for round in 0..20 {
        store
            .append(&key("events"), vec![vec![round]], Some(ttl))
            .await
            .expect("append");
        let after_append = std::time::Instant::now();
        let left = log_pttl(&mut conn, &prefix, "events").await;
        let lower = ttl.saturating_sub(after_append.elapsed()).as_millis() as i64;
        assert!(
            left >= lower,
            "append {round}: the log expires in {left} ms, before its TTL of {ttl:?} has passed"
        );
        assert!(
            left <= (ttl + ttl / 16).as_millis() as i64,
            "append {round}: the log expires in {left} ms, more than a sixteenth past its TTL"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// A log deleted behind the store's back (by another process) while its
/// expiry is fresh is created again with an expiry, never without one.
#[tokio::test]
async fn a_log_recreated_after_a_foreign_delete_keeps_an_expiry() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let prefix = unique_prefix("ttl-gone");
    let store = endpoint.open(&prefix).await;
    let other = endpoint.open(&prefix).await;
    let mut conn = raw(&endpoint).await.expect("standalone");
    let ttl = Duration::from_secs(600);
    store
        .append(&key("events"), vec![b"a".to_vec()], Some(ttl))
        .await
        .expect("first append");
    other
        .delete_log(&key("events"))
        .await
        .expect("delete from another store");
    let seqs = store
        .append(&key("events"), vec![b"b".to_vec()], Some(ttl))
        .await
        .expect("append after the delete");
    assert_eq!(seqs, vec![1], "the log starts again after its delete");
    let left = log_pttl(&mut conn, &prefix, "events").await;
    assert!(
        left > 0,
        "a log created again has no expiry (PTTL {left}); it would never be reclaimed"
    );
    let records = store.read_after(&key("events"), 0, 10).await.expect("read");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].data, b"b");
}
