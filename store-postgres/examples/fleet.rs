//! Two server instances sharing one Postgres database: what one stores, the
//! other serves, and a fleet notice published on one reaches the other at
//! once, woken by `LISTEN/NOTIFY`.
//!
//! Instance A appends SSE events to a stream; instance B, with its own pool
//! and its own listening connection, replays them after a `Last-Event-ID`,
//! the way a load-balanced MCP server resumes a client's stream on whichever
//! instance the client reconnects to. Then A publishes a fleet notice and B,
//! already waiting on the bus, gets it.
//!
//! ```text
//! cargo run -p mcp-persist-store-postgres --example fleet
//! ```
//!
//! Connects to `MCP_PERSIST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres` (`cargo xtask services`
//! starts a server and prints the variable). It works in the schema
//! `example_fleet`, and drops nothing: run it twice and B replays both runs.

use std::time::{Duration, Instant};

use anyhow::Result;
use mcp_persist_core::{BusRetention, EventLogConfig, FleetNotice, Stores};
use mcp_persist_store_postgres::PostgresStore;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("MCP_PERSIST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let open = || async {
        PostgresStore::builder(&url)
            .schema("example_fleet")
            .connect()
            .await
    };
    // Two instances: two pools, one database, one schema.
    let a = Stores::new(open().await?);
    let b = Stores::new(open().await?);
    let config = EventLogConfig::new(Duration::from_secs(600), 1_000);
    let (events_a, events_b) = (a.events(config)?, b.events(config)?);

    let first = events_a
        .append("stream-1", None, &json!({"step": 1}))
        .await?;
    for step in 2..=4 {
        events_a
            .append("stream-1", None, &json!({"step": step}))
            .await?;
    }
    // The client reconnects to B with `Last-Event-ID: <first>`.
    let replayed = events_b.replay_after(&first.to_string(), None).await?;
    println!(
        "instance B replayed {} events after {first}:",
        replayed.len()
    );
    for event in &replayed {
        println!("  {} {}", event.id, event.payload);
    }

    // The fleet bus: B waits, A publishes, B is woken by NOTIFY.
    let (bus_a, bus_b) = (
        a.bus(BusRetention::default())?,
        b.bus(BusRetention::default())?,
    );
    let head = bus_b.head().await?;
    let waiting = tokio::spawn(async move { bus_b.wait(head, Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let published = Instant::now();
    bus_a
        .publish(FleetNotice::ToolsListChanged, Some("instance-a"))
        .await?;
    let (_, notices) = waiting.await??;
    println!(
        "instance B got {:?} from instance A {:?} after it was published",
        notices.first().map(|(_, m)| &m.notice),
        published.elapsed()
    );
    Ok(())
}
