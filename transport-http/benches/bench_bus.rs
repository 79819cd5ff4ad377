//! Benchmark of the fleet notification bus, against an in-process broadcast
//! channel in the same run. Run in release mode: `cargo xtask bench bus`, or
//! `cargo bench -p mcp-persist-transport-http --bench bench_bus`.
//!
//! Two instances share one store, each through its own handle (its own
//! connection, or pool and `LISTEN` connection for Postgres, and for SQLite
//! its own writer thread, as two processes would have), each with `LISTENERS / 2` local listeners. Instance A
//! publishes `NOTICES` resource updates, one every `GAP`; the figure is the
//! time from the start of `publish` to each listener receiving the notice,
//! over every (notice, listener) pair: p50, p99 and the worst.
//!
//! The baseline is a tokio broadcast channel with `LISTENERS` receivers in
//! one process, the least a fleet bus could cost.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use mcp_persist_core::{BusRetention, FleetNotice, MemoryStore, Stores};
use mcp_persist_transport_http::server::FleetBus;
use tokio::sync::broadcast;

/// Listeners in all, spread evenly over the two instances.
const LISTENERS: usize = 100;
/// Notices published per backend (after warm-up).
const NOTICES: usize = 200;
/// The pause between two notices: latency, not throughput, is measured.
const GAP: Duration = Duration::from_millis(5);
/// Notices sent before measuring.
const WARM_UP: usize = 10;

/// When each notice's publish started, by its number.
type Sent = Arc<Mutex<HashMap<usize, Instant>>>;

fn number(notice: &FleetNotice) -> Option<usize> {
    match notice {
        FleetNotice::ResourceUpdated { uri } => uri.strip_prefix("bench://")?.parse().ok(),
        _ => None,
    }
}

fn notice(i: usize) -> FleetNotice {
    FleetNotice::ResourceUpdated {
        uri: format!("bench://{i}"),
    }
}

/// Collects, per listener, the latency of every notice numbered `WARM_UP..`
/// until the last one comes.
fn listener(
    mut rx: broadcast::Receiver<FleetNotice>,
    sent: Sent,
) -> tokio::task::JoinHandle<Vec<Duration>> {
    tokio::spawn(async move {
        let mut out = Vec::with_capacity(NOTICES);
        let last = WARM_UP + NOTICES - 1;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
                Ok(Ok(n)) => {
                    let arrived = Instant::now();
                    let Some(i) = number(&n) else { continue };
                    if i >= WARM_UP
                        && let Some(at) = sent.lock().expect("not poisoned").get(&i).copied()
                    {
                        out.push(arrived.saturating_duration_since(at));
                    }
                    if i == last {
                        return out;
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return out,
            }
        }
    })
}

struct Figures {
    p50: Duration,
    p99: Duration,
    max: Duration,
    delivered: usize,
}

fn figures(mut all: Vec<Duration>) -> Figures {
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Figures {
        p50: at(0.50),
        p99: at(0.99),
        max: all.last().copied().unwrap_or_default(),
        delivered: all.len(),
    }
}

async fn gather(handles: Vec<tokio::task::JoinHandle<Vec<Duration>>>) -> anyhow::Result<Figures> {
    let mut all = Vec::with_capacity(LISTENERS * NOTICES);
    for h in handles {
        all.extend(h.await?);
    }
    Ok(figures(all))
}

/// The in-process broadcast channel.
async fn baseline() -> anyhow::Result<Figures> {
    let (tx, _) = broadcast::channel(1024);
    let sent: Sent = Arc::default();
    let handles: Vec<_> = (0..LISTENERS)
        .map(|_| listener(tx.subscribe(), sent.clone()))
        .collect();
    for i in 0..WARM_UP + NOTICES {
        sent.lock().expect("not poisoned").insert(i, Instant::now());
        let _ = tx.send(notice(i));
        tokio::time::sleep(GAP).await;
    }
    gather(handles).await
}

/// Two instances, each on its own handle of one store.
async fn fleet(a: Stores, b: Stores) -> anyhow::Result<Figures> {
    let retention = BusRetention::default();
    let a = FleetBus::start(a.bus(retention)?).await?;
    let b = FleetBus::start(b.bus(retention)?).await?;
    let sent: Sent = Arc::default();
    let handles: Vec<_> = (0..LISTENERS)
        .map(|i| {
            let on = if i % 2 == 0 { &a } else { &b };
            listener(on.subscribe(), sent.clone())
        })
        .collect();
    for i in 0..WARM_UP + NOTICES {
        sent.lock().expect("not poisoned").insert(i, Instant::now());
        a.publish(notice(i)).await?;
        tokio::time::sleep(GAP).await;
    }
    gather(handles).await
}

fn row(name: &str, f: &Figures, base: &Figures) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<24} {:>9.3} ms {:>9.3} ms {:>9.3} ms {:>10} {:>9.1}x",
        ms(f.p50),
        ms(f.p99),
        ms(f.max),
        f.delivered,
        f.p99.as_secs_f64() / base.p99.as_secs_f64().max(1e-9),
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    println!(
        "fleet bus: publish-to-delivery latency, {LISTENERS} listeners over two instances, \
         {NOTICES} notices {} ms apart",
        GAP.as_millis()
    );
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "bus", "p50", "p99", "max", "delivered", "p99 vs base"
    );
    let base = baseline().await?;
    row("broadcast channel", &base, &base);

    let memory = MemoryStore::new();
    let memory = fleet(Stores::new(memory.clone()), Stores::new(memory)).await?;
    row("memory store", &memory, &base);

    let path = dir.path().join("bus.db");
    let sqlite = fleet(
        Stores::new(mcp_persist_store_sqlite::SqliteStore::open(&path).await?),
        Stores::new(mcp_persist_store_sqlite::SqliteStore::open(&path).await?),
    )
    .await?;
    row("sqlite, two handles", &sqlite, &base);

    let folder = dir.path().join("bus-files");
    let file = fleet(
        Stores::new(mcp_persist_store_file::FileStore::open(&folder).await?),
        Stores::new(mcp_persist_store_file::FileStore::open(&folder).await?),
    )
    .await?;
    row("file, two handles", &file, &base);

    let redis = match std::env::var("MCP_PERSIST_REDIS_URL") {
        Ok(url) => {
            let prefix = format!("bench-bus:{}:", std::process::id());
            let open = || {
                mcp_persist_store_redis::RedisStore::standalone(url.clone())
                    .key_prefix(prefix.clone())
                    .connect()
            };
            let figures = fleet(Stores::new(open().await?), Stores::new(open().await?)).await?;
            row("redis, two connections", &figures, &base);
            Some(figures)
        }
        Err(_) => {
            println!("MCP_PERSIST_REDIS_URL is not set: no Redis row (run `cargo xtask bench`)");
            None
        }
    };

    let postgres = match std::env::var("MCP_PERSIST_POSTGRES_URL") {
        Ok(url) => {
            let schema = format!("bench_bus_{}", std::process::id());
            let open = || {
                mcp_persist_store_postgres::PostgresStore::builder(&url)
                    .schema(schema.clone())
                    .connect()
            };
            let figures = fleet(Stores::new(open().await?), Stores::new(open().await?)).await?;
            row("postgres, two pools", &figures, &base);
            Some(figures)
        }
        Err(_) => {
            println!(
                "MCP_PERSIST_POSTGRES_URL is not set: no Postgres row (run `cargo xtask bench`)"
            );
            None
        }
    };

    let verdict = |f: &Figures, aim: Duration| {
        if f.p99 < aim && f.delivered == LISTENERS * NOTICES {
            "met"
        } else {
            "not met"
        }
    };
    println!(
        "aim: p99 under 50 ms on SQLite: {:.1} ms ({})",
        sqlite.p99.as_secs_f64() * 1e3,
        verdict(&sqlite, Duration::from_millis(50))
    );
    if let Some(redis) = redis {
        println!(
            "aim: p99 under 5 ms on Redis: {:.1} ms ({})",
            redis.p99.as_secs_f64() * 1e3,
            verdict(&redis, Duration::from_millis(5))
        );
    }
    if let Some(postgres) = postgres {
        println!(
            "aim: p99 under 10 ms on Postgres: {:.1} ms ({})",
            postgres.p99.as_secs_f64() * 1e3,
            verdict(&postgres, Duration::from_millis(10))
        );
    }
    Ok(())
}
