//! Throughput of `RedisStore` against raw Redis in the same run.
//!
//! * **Log appends**: 64 concurrent appenders, each appending one 128-byte
//!   record per call to its own log, against `redis-benchmark` sending
//!   pipelined `XADD`s to the same server (one connection, 64 commands in
//!   flight, as the store's one connection has). Measured twice: without a
//!   TTL (the same server work as the baseline: one `XADD` per record), and
//!   with one (what an event store does for every SSE event: the `XADD` and
//!   the log's `PEXPIRE`, atomically).
//! * **KV**: 64 concurrent tasks doing compare-and-swap `put`s, then `get`s,
//!   against pipelined `SET` and `GET` from `redis-benchmark`.
//!
//! Needs `MCP_PERSIST_REDIS_URL` (a server the benchmark may write to) and
//! `redis-benchmark` (from `MCP_PERSIST_REDIS_BENCHMARK_BIN` or `PATH`).
//! `cargo xtask bench` provides both. Run in release mode:
//!
//! ```text
//! cargo run --release -p mcp-persist-store-redis --example bench
//! ```

use std::{
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use mcp_persist_core::{KvStore, LogStore, PutMode};
use mcp_persist_store_redis::RedisStore;

const TASKS: usize = 64;
const RECORD_BYTES: usize = 128;
/// Appends per task and run: 64 x 2500 = 160,000 in all.
const APPENDS_PER_TASK: usize = 2_500;
/// KV operations per task and kind.
const KV_PER_TASK: usize = 1_500;
const RAW_REQUESTS: usize = 200_000;

fn main() -> Result<()> {
    let Ok(url) = std::env::var("MCP_PERSIST_REDIS_URL") else {
        if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0") {
            bail!("MCP_PERSIST_REDIS_URL is not set; run `cargo xtask bench`");
        }
        println!("MCP_PERSIST_REDIS_URL is not set; skipping (run `cargo xtask bench`)");
        return Ok(());
    };
    let port = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .context("the benchmark needs a redis://host:port/ URL")?;
    let benchmark = std::env::var("MCP_PERSIST_REDIS_BENCHMARK_BIN")
        .unwrap_or_else(|_| "redis-benchmark".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    let mut nonce = [0u8; 4];
    getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let run: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let prefix = format!("bench:{run}:");
    let payload = "x".repeat(RECORD_BYTES);

    println!("redis bench: {TASKS} concurrent tasks, {RECORD_BYTES}-byte records, port {port}");
    let store = runtime.block_on(RedisStore::standalone(url).key_prefix(&prefix).connect())?;

    let raw_xadd = redis_benchmark(
        &benchmark,
        port,
        &["XADD", &format!("{prefix}raw{{x}}"), "0-*", "d", &payload],
    )?;
    let ours_append_plain = runtime.block_on(appends(&store, None))?;
    let ours_append = runtime.block_on(appends(&store, Some(Duration::from_secs(600))))?;
    let raw_set = redis_benchmark(
        &benchmark,
        port,
        &["SET", &format!("{prefix}raw-kv{{x}}"), &payload],
    )?;
    let raw_get = redis_benchmark(&benchmark, port, &["GET", &format!("{prefix}raw-kv{{x}}")])?;
    let (ours_put, ours_get) = runtime.block_on(kv(&store))?;

    println!();
    println!("| operation | RedisStore ops/s | raw redis-benchmark ops/s | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, ours, raw) in [
        ("log append, no TTL (XADD)", ours_append_plain, raw_xadd),
        (
            "log append with TTL (XADD + PEXPIRE)",
            ours_append,
            raw_xadd,
        ),
        ("kv put (CAS script)", ours_put, raw_set),
        ("kv get", ours_get, raw_get),
    ] {
        println!(
            "| {name} | {ours:.0} | {raw:.0} | {:.0}% |",
            100.0 * ours / raw
        );
    }

    runtime.block_on(cleanup(&store))?;
    Ok(())
}

/// Runs `redis-benchmark` with one connection and 64 pipelined commands in
/// flight and returns its requests per second.
fn redis_benchmark(bin: &str, port: u16, command: &[&str]) -> Result<f64> {
    let output = Command::new(bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "1", "-P", &TASKS.to_string()])
        .args(["-n", &RAW_REQUESTS.to_string(), "--csv"])
        .args(command)
        .output()
        .with_context(|| format!("running {bin} (install Debian's redis-tools)"))?;
    if !output.status.success() {
        bail!("{bin} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The last CSV line: "<command>","<rps>",...
    let rps = stdout
        .lines()
        .filter(|l| !l.starts_with("\"test\""))
        .filter_map(|l| l.split("\",\"").nth(1))
        .filter_map(|f| f.trim_matches('"').parse::<f64>().ok())
        .next_back()
        .with_context(|| format!("no requests per second in {bin}'s output: {stdout}"))?;
    Ok(rps)
}

async fn appends(store: &RedisStore, ttl: Option<Duration>) -> Result<f64> {
    let record = vec![b'x'; RECORD_BYTES];
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for t in 0..TASKS {
        let store = store.clone();
        let record = record.clone();
        tasks.push(tokio::spawn(async move {
            let log = format!("events/{t}");
            for _ in 0..APPENDS_PER_TASK {
                store.append(&log, vec![record.clone()], ttl).await?;
            }
            Ok::<_, mcp_persist_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((TASKS * APPENDS_PER_TASK) as f64 / started.elapsed().as_secs_f64())
}

async fn kv(store: &RedisStore) -> Result<(f64, f64)> {
    let value = vec![b'x'; RECORD_BYTES];
    let store = Arc::new(store.clone());

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("kv/{t}");
            let mut version = store
                .put(&key, value.clone(), PutMode::Overwrite, None)
                .await?;
            for _ in 1..KV_PER_TASK {
                version = store
                    .put(&key, value.clone(), PutMode::Update(version), None)
                    .await?;
            }
            Ok::<_, mcp_persist_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let puts = (TASKS * KV_PER_TASK) as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let key = format!("kv/{t}");
            for _ in 0..KV_PER_TASK {
                store.get(&key).await?;
            }
            Ok::<_, mcp_persist_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let gets = (TASKS * KV_PER_TASK) as f64 / started.elapsed().as_secs_f64();
    Ok((puts, gets))
}

/// Removes what the benchmark wrote.
async fn cleanup(store: &RedisStore) -> Result<()> {
    for t in 0..TASKS {
        LogStore::delete(store, &format!("events/{t}")).await?;
        KvStore::delete(store, &format!("kv/{t}"), None).await?;
    }
    // The raw baseline's keys are not the store's: remove them directly.
    let url = std::env::var("MCP_PERSIST_REDIS_URL")?;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let prefix = store.key_prefix();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{prefix}raw{{x}}"))
        .arg(format!("{prefix}raw-kv{{x}}"))
        .query_async(&mut conn)
        .await?;
    Ok(())
}
