//! A sequence number at the end of the range, written into a Redis stream
//! by hand (Redis takes any entry id), is damage to the typed stores above:
//! a pipelined event log refuses to continue after it with `Corrupt` naming
//! the log, instead of wrapping around or panicking, and appends nothing.
//!
//! `next_seq` reads the stream's last generated id, the one the next
//! `XADD ... 0-*` goes above: whatever the stream holds now, after entries
//! removed by hand, at the end of the range, and for keys this store did
//! not write.

mod common;

use std::sync::Arc;

use common::{Endpoint, Topology, unique_prefix};
use mcp_persist_core::{
    Error, EventDurability, EventLog, EventLogConfig, KvStore, LogStore, SessionId,
};
use redis::aio::ConnectionLike;

async fn raw_cmd(conn: &mut impl ConnectionLike, args: &[&[u8]]) -> redis::Value {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("ascii command"));
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.expect("raw command")
}

#[tokio::test]
async fn pipelined_events_after_the_largest_sequence_number_are_corrupt() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let Endpoint::Standalone(url) = &endpoint else {
        unreachable!("asked for the standalone server")
    };
    let prefix = unique_prefix("numbers");
    let store = Arc::new(endpoint.open(&prefix).await);
    let kv: Arc<dyn KvStore> = store.clone();
    let log: Arc<dyn LogStore> = store.clone();
    let session = SessionId::new("numbers-session").expect("id");
    let stream = "numbers-session:common";
    let payload = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message"});

    // A stream written the ordinary way, then an entry at the last id there is.
    let synced = EventLog::new(kv.clone(), log.clone(), EventLogConfig::default());
    synced
        .append(stream, Some(&session), &payload)
        .await
        .expect("first event");
    let name = mcp_persist_core::declare::EVENT.key(&[stream]);
    let first = store.read_after(&name, 0, 10).await.expect("read");
    assert_eq!(first.len(), 1);
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let key = format!("{prefix}{{log:{name}}}");
    let last_id = format!("0-{}", u64::MAX);
    raw_cmd(
        &mut raw,
        &[
            b"XADD",
            key.as_bytes(),
            last_id.as_bytes(),
            b"d",
            &first[0].data,
        ],
    )
    .await;
    let stored = store.read_after(&name, 0, 10).await.expect("read");
    assert_eq!(
        stored.last().map(|r| r.seq),
        Some(u64::MAX),
        "the crafted entry is there"
    );

    // Another instance continues the stream, pipelined.
    let pipelined = EventLog::new(
        kv,
        log,
        EventLogConfig::default().with_durability(EventDurability::PIPELINED),
    );
    for attempt in 0..2 {
        match pipelined.append(stream, Some(&session), &payload).await {
            Err(Error::Corrupt { key, reason, .. }) => {
                assert_eq!(key, name, "attempt {attempt}: {reason}");
            }
            other => panic!("attempt {attempt}: expected Corrupt, got {other:?}"),
        }
    }
    // Longer than the pipeline's commit window: anything scheduled is in.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        store.read_after(&name, 0, 10).await.expect("read"),
        stored,
        "nothing was appended"
    );
}

/// The log's next number as the store says it.
async fn said(store: &impl LogStore, log: &str) -> mcp_persist_core::Result<u64> {
    store
        .next_seq(&mcp_persist_core::conformance::key(log))
        .await
        .map(|next| next.expect("the Redis store answers next_seq"))
}

async fn append_one(store: &impl LogStore, log: &str) -> mcp_persist_core::Result<Vec<u64>> {
    store
        .append(
            &mcp_persist_core::conformance::key(log),
            vec![b"x".to_vec()],
            None,
        )
        .await
}

fn corrupt_naming(result: mcp_persist_core::Result<impl std::fmt::Debug>, log: &str) -> String {
    match result {
        Err(Error::Corrupt { key, reason, .. }) if key == log => reason,
        other => panic!("{log}: expected Corrupt naming it, got {other:?}"),
    }
}

#[tokio::test]
async fn next_seq_is_the_number_redis_gives_the_next_append() {
    let Some(endpoint) = Endpoint::of(Topology::Standalone) else {
        return;
    };
    let Endpoint::Standalone(url) = &endpoint else {
        unreachable!("asked for the standalone server")
    };
    let prefix = unique_prefix("next");
    let store = endpoint.open(&prefix).await;
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let stream = |log: &str| format!("{prefix}{{log:{log}}}");

    // Never written: 1, and asking creates no key.
    assert_eq!(said(&store, "fresh").await.expect("next_seq"), 1);
    assert_eq!(
        raw_cmd(&mut raw, &[b"EXISTS", stream("fresh").as_bytes()]).await,
        redis::Value::Int(0),
        "next_seq created the log's key"
    );

    // Entries added and removed by hand: Redis goes on above the last id it
    // generated, though the stream is empty.
    let key = stream("removed");
    raw_cmd(&mut raw, &[b"XADD", key.as_bytes(), b"0-5", b"d", b"x"]).await;
    raw_cmd(&mut raw, &[b"XDEL", key.as_bytes(), b"0-5"]).await;
    assert_eq!(said(&store, "removed").await.expect("next_seq"), 6);
    assert_eq!(
        append_one(&store, "removed").await.expect("append"),
        vec![6]
    );

    // An empty stream that never had an entry (made for a consumer group).
    let key = stream("grouped");
    raw_cmd(
        &mut raw,
        &[
            b"XGROUP",
            b"CREATE",
            key.as_bytes(),
            b"g",
            b"$",
            b"MKSTREAM",
        ],
    )
    .await;
    assert_eq!(said(&store, "grouped").await.expect("next_seq"), 1);
    assert_eq!(
        append_one(&store, "grouped").await.expect("append"),
        vec![1]
    );

    // The last number there is: said and given, then refused by both, and
    // nothing is added.
    let key = stream("end");
    let below_max = format!("0-{}", u64::MAX - 1);
    raw_cmd(
        &mut raw,
        &[b"XADD", key.as_bytes(), below_max.as_bytes(), b"d", b"x"],
    )
    .await;
    assert_eq!(said(&store, "end").await.expect("next_seq"), u64::MAX);
    assert_eq!(
        append_one(&store, "end").await.expect("append"),
        vec![u64::MAX]
    );
    let reason = corrupt_naming(said(&store, "end").await, "end");
    assert!(reason.contains("exhausted"), "{reason}");
    append_one(&store, "end")
        .await
        .expect_err("no number is left");
    assert_eq!(
        raw_cmd(&mut raw, &[b"XLEN", key.as_bytes()]).await,
        redis::Value::Int(2),
        "something was appended past the end"
    );

    // Ids this store never writes: no number.
    let key = stream("foreign");
    raw_cmd(&mut raw, &[b"XADD", key.as_bytes(), b"*", b"d", b"x"]).await;
    corrupt_naming(said(&store, "foreign").await, "foreign");
    // The append is refused as the same damage, twice, and adds nothing:
    // alone (one `XADD`) and with a TTL (the append script).
    for _ in 0..2 {
        let reason = corrupt_naming(append_one(&store, "foreign").await, "foreign");
        assert!(reason.contains("not written by this store"), "{reason}");
        let with_ttl = store
            .append(
                &mcp_persist_core::conformance::key("foreign"),
                vec![b"x".to_vec(), b"y".to_vec()],
                Some(std::time::Duration::from_secs(60)),
            )
            .await;
        let reason = corrupt_naming(with_ttl, "foreign");
        assert!(reason.contains("not written by this store"), "{reason}");
    }
    assert_eq!(
        raw_cmd(&mut raw, &[b"XLEN", key.as_bytes()]).await,
        redis::Value::Int(1),
        "something was appended after the foreign entry"
    );

    // A key of another type: the append's `Corrupt`, and the key is kept.
    let key = stream("wrong");
    raw_cmd(&mut raw, &[b"SET", key.as_bytes(), b"not a stream"]).await;
    let told = corrupt_naming(said(&store, "wrong").await, "wrong");
    let appended = corrupt_naming(append_one(&store, "wrong").await, "wrong");
    assert_eq!(told, appended);
    assert_eq!(
        raw_cmd(&mut raw, &[b"GET", key.as_bytes()]).await,
        redis::Value::BulkString(b"not a stream".to_vec()),
        "the foreign key keeps its value"
    );
}
