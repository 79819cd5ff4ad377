//! Two server instances sharing one Redis: what one stores, the other
//! serves.
//!
//! Instance A stores SSE events of a stream; instance B, with its own
//! connection, replays them after a `Last-Event-ID` and tails the stream
//! while A appends more, the way a load-balanced MCP server resumes a
//! client's stream on whichever instance the client reconnects to.
//!
//! ```text
//! cargo run -p mcp-persist-store-redis --example fleet
//! ```
//!
//! Connects to `MCP_PERSIST_REDIS_URL`, else `redis://127.0.0.1:6379/`
//! (`cargo xtask services` starts a server and prints the variable).

use std::time::Duration;

use anyhow::Result;
use mcp_persist_core::{EventLogConfig, Stores};
use mcp_persist_store_redis::RedisStore;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("MCP_PERSIST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let config = EventLogConfig::new(Duration::from_secs(600), 1_000);

    // Two instances, two connections, one Redis, one key prefix.
    let instance_a = Stores::new(
        RedisStore::standalone(url.clone())
            .key_prefix("example-fleet:")
            .connect()
            .await?,
    )
    .events(config)?;
    let instance_b = Stores::new(
        RedisStore::standalone(url)
            .key_prefix("example-fleet:")
            .connect()
            .await?,
    )
    .events(config)?;

    let stream = "stream-42";
    let first = instance_a
        .append(stream, None, &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}))
        .await?;
    instance_a
        .append(stream, None, &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 2}}))
        .await?;
    println!("instance A stored two events; the client saw {first}");

    // The client reconnects to instance B with Last-Event-ID = first.
    let missed = instance_b.replay_after(&first.to_string(), None).await?;
    for event in &missed {
        println!("instance B replays {} {}", event.id, event.payload);
    }

    // B tails the stream while A keeps appending.
    let last = missed.last().map(|e| e.id.clone()).unwrap_or(first);
    let tail = tokio::spawn(async move { instance_b.tail(&last, Duration::from_secs(5)).await });
    instance_a
        .append(
            stream,
            None,
            &json!({"jsonrpc": "2.0", "id": 7, "result": {"content": []}}),
        )
        .await?;
    for event in tail.await?? {
        println!("instance B tails {} {}", event.id, event.payload);
    }

    instance_a.delete_stream(stream).await?;
    Ok(())
}
