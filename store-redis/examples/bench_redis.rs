//! Throughput of `RedisStore` against raw Redis in the same run.
//!
//! * **Log appends**: 64 concurrent appenders, each appending one 128-byte
//!   record per call to its own log, against `redis-benchmark` sending
//!   pipelined `XADD`s to the same server (one connection, 64 commands in
//!   flight, as the store's one connection has). Measured twice: without a
//!   TTL (the same server work as the baseline: one `XADD` per record), and
//!   with one (what an event store does for every SSE event: the `XADD` and
//!   the log's `PEXPIRE`, atomically). The second is also compared with
//!   `redis-benchmark` running the smallest script that does that same work
//!   (`XADD` + `PEXPIRE`), pipelined the same way.
//! * **KV**: 64 concurrent tasks doing compare-and-swap `put`s, then `get`s,
//!   against pipelined `SET` and `GET` from `redis-benchmark`.
//!
//! Every measurement runs three times, interleaved with its baseline, and the
//! best of each is reported, so that other work on the machine does not
//! decide the ratio.
//!
//! Needs `MCP_PERSIST_REDIS_URL` (a server the benchmark may write to) and
//! `redis-benchmark` (from `MCP_PERSIST_REDIS_BENCHMARK_BIN` or `PATH`).
//! `cargo xtask bench` provides both. Run in release mode:
//!
//! ```text
//! cargo run --release -p mcp-persist-store-redis --example bench_redis
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
/// KV operations per task, kind and round.
const KV_PER_TASK: usize = 1_500;
const RAW_REQUESTS: usize = 200_000;
/// Rounds of every measurement; the best of each is reported.
const ROUNDS: usize = 3;

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

    // Each measurement is taken ROUNDS times, ours and the baseline
    // interleaved, and the best of each is kept: other work on the machine
    // only ever slows a run down.
    let atomic_append = runtime.block_on(load_atomic_append())?;
    let (mut raw_xadd, mut raw_atomic, mut raw_set, mut raw_get) = (0f64, 0f64, 0f64, 0f64);
    let (mut ours_append_plain, mut ours_append, mut ours_put, mut ours_get) =
        (0f64, 0f64, 0f64, 0f64);
    for round in 1..=ROUNDS {
        println!("round {round} of {ROUNDS}");
        raw_xadd = raw_xadd.max(redis_benchmark(
            &benchmark,
            port,
            &["XADD", &format!("{prefix}raw{{x}}"), "0-*", "d", &payload],
        )?);
        raw_atomic = raw_atomic.max(redis_benchmark(
            &benchmark,
            port,
            &[
                "EVALSHA",
                &atomic_append,
                "1",
                &format!("{prefix}raw-atomic{{x}}"),
                "600000",
                &payload,
            ],
        )?);
        ours_append_plain = ours_append_plain.max(runtime.block_on(appends(&store, None))?);
        ours_append =
            ours_append.max(runtime.block_on(appends(&store, Some(Duration::from_secs(600))))?);
        raw_set = raw_set.max(redis_benchmark(
            &benchmark,
            port,
            &["SET", &format!("{prefix}raw-kv{{x}}"), &payload],
        )?);
        raw_get = raw_get.max(redis_benchmark(
            &benchmark,
            port,
            &["GET", &format!("{prefix}raw-kv{{x}}")],
        )?);
        let (put, get) = runtime.block_on(kv(&store))?;
        ours_put = ours_put.max(put);
        ours_get = ours_get.max(get);
        // Start every round from empty logs.
        runtime.block_on(cleanup(&store))?;
    }

    println!();
    println!("| operation | RedisStore ops/s | raw redis-benchmark ops/s | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, ours, raw) in [
        ("log append, no TTL vs XADD", ours_append_plain, raw_xadd),
        ("log append with TTL vs XADD", ours_append, raw_xadd),
        (
            "log append with TTL vs XADD+PEXPIRE script",
            ours_append,
            raw_atomic,
        ),
        ("kv put (CAS script) vs SET", ours_put, raw_set),
        ("kv get vs GET", ours_get, raw_get),
    ] {
        println!(
            "| {name} | {ours:.0} | {raw:.0} | {:.0}% |",
            100.0 * ours / raw
        );
    }

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

/// The smallest atomic append with a TTL, for `redis-benchmark` to run as
/// the baseline that does the same server work as the store's append.
const ATOMIC_APPEND: &str = "local id = redis.call('XADD', KEYS[1], '0-*', 'd', ARGV[2]) \
     redis.call('PEXPIRE', KEYS[1], ARGV[1]) return id";

/// Loads [`ATOMIC_APPEND`] and returns its SHA-1.
async fn load_atomic_append() -> Result<String> {
    let url = std::env::var("MCP_PERSIST_REDIS_URL")?;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ATOMIC_APPEND)
        .query_async(&mut conn)
        .await?;
    Ok(sha)
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
        .arg(format!("{prefix}raw-atomic{{x}}"))
        .query_async(&mut conn)
        .await?;
    Ok(())
}
