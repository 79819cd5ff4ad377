//! A sequence number at the end of the range, written into a Redis stream
//! by hand (Redis takes any entry id), is damage to the typed stores above:
//! a pipelined event log refuses to continue after it with `Corrupt` naming
//! the log, instead of wrapping around or panicking, and appends nothing.

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
