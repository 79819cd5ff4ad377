//! A server's SSE event log in one SQLite file, kept across restarts.
//!
//! Run it twice: `cargo run -p mcp-persist-store-sqlite --example event_log [DB]`.
//! Each run appends three events and replays the ones after its first, as a
//! client reconnecting with `Last-Event-ID` would get them; the second run's
//! event ids continue where the first run's stopped, because the log (and the
//! stream's token) survived the restart.

use std::path::PathBuf;

use anyhow::Result;
use mcp_persist_core::{EventLogConfig, Stores};
use mcp_persist_store_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("mcp-persist-example.db"));
    let store = SqliteStore::open(&path).await?;
    println!("database: {}", path.display());

    // One backend for every kind of state.
    let stores = Stores::new(store.clone());
    let events = stores.events(EventLogConfig::default())?;

    let mut first = None;
    for n in 0..3 {
        let id = events
            .append("stream-1", None, &serde_json::json!({"progress": n}))
            .await?;
        println!("appended event {id}");
        first.get_or_insert(id);
    }
    let first = first.expect("three events were appended");
    let replayed = events.replay_after(&first.to_string(), None).await?;
    println!("replay after {first}: {} events", replayed.len());
    for event in replayed {
        println!("  {} {}", event.id, event.payload);
    }
    let stats = store.write_stats();
    println!(
        "{} operations committed in {} transactions",
        stats.operations, stats.transactions
    );
    store.close().await?;
    Ok(())
}
