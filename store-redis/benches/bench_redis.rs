//! Throughput of `RedisStore` against raw Redis in the same run.
//!
//! * **Log appends**: 64 concurrent appenders, each appending one 128-byte
//!   record per call to its own log, against `redis-benchmark` sending
//!   pipelined `XADD`s to the same server (one connection, 64 commands in
//!   flight, as the store's one connection has). Measured without a TTL (one
//!   `XADD` per record, the baseline's work) and with one, as an event store
//!   appends: the first append sets the log's expiry in a script, and the
//!   appends in the next sixteenth of the TTL skip that refresh. Two more
//!   baselines: `redis-benchmark` running the smallest script that appends
//!   and refreshes the expiry atomically (what every append with a TTL would
//!   cost without the skip), and the same appends sent as plain `XADD`s
//!   straight through the `redis` crate (what the client library costs
//!   before the store does anything).
//! * **KV**: 64 concurrent tasks doing compare-and-swap `put`s, then `get`s,
//!   against pipelined `SET` and `GET` from `redis-benchmark`, and `get`s
//!   against the same `GET`s straight through the `redis` crate.
//!
//! The store's side runs twice per round: on a current-thread tokio runtime
//! (one thread, as `redis-benchmark` is one thread) and on the default
//! multi-threaded runtime, which on a small machine competes with the Redis
//! server for its cores. Every measurement runs several times, interleaved
//! with its baseline, and the best of each is reported, so that other work on
//! the machine does not decide the ratio.
//!
//! Needs `MCP_PERSIST_REDIS_URL` (a server the benchmark may write to) and
//! `redis-benchmark` (from `MCP_PERSIST_REDIS_BENCHMARK_BIN` or `PATH`).
//! `cargo xtask bench` provides both. Run in release mode:
//!
//! ```text
//! cargo bench -p mcp-persist-store-redis --bench bench_redis
//! ```

use mcp_persist_core::conformance::key;
use std::{
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use mcp_persist_core::{KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_redis::RedisStore;

const TASKS: usize = 64;
const RECORD_BYTES: usize = 128;
/// Appends per task and run: 64 x 2500 = 160,000 in all.
const APPENDS_PER_TASK: usize = 2_500;
/// KV operations per task, kind and round.
const KV_PER_TASK: usize = 1_500;
const RAW_REQUESTS: usize = 200_000;
/// Rounds of every measurement; the best of each is reported.
const ROUNDS: usize = 5;

/// The two runtimes the store is measured on, each with its own store.
struct Side {
    name: &'static str,
    runtime: tokio::runtime::Runtime,
    store: RedisStore,
    append_plain: f64,
    append_ttl: f64,
    client_xadd: f64,
    client_get: f64,
    put: f64,
    get: f64,
}

impl Side {
    fn new(
        name: &'static str,
        runtime: tokio::runtime::Runtime,
        url: &str,
        prefix: &str,
    ) -> Result<Side> {
        let store = runtime.block_on(RedisStore::standalone(url).key_prefix(prefix).connect())?;
        Ok(Side {
            name,
            runtime,
            store,
            append_plain: 0.0,
            append_ttl: 0.0,
            client_xadd: 0.0,
            client_get: 0.0,
            put: 0.0,
            get: 0.0,
        })
    }

    /// One round of every measurement, keeping the best of each.
    fn measure(&mut self) -> Result<()> {
        let store = &self.store;
        self.append_plain = self
            .append_plain
            .max(self.runtime.block_on(appends(store, None))?);
        let ttl = Some(Duration::from_secs(600));
        self.append_ttl = self
            .append_ttl
            .max(self.runtime.block_on(appends(store, ttl))?);
        let prefix = store.key_prefix();
        let client_xadd = client_only(prefix, APPENDS_PER_TASK, false, xadd);
        self.client_xadd = self.client_xadd.max(self.runtime.block_on(client_xadd)?);
        let client_get = client_only(prefix, KV_PER_TASK, true, get);
        self.client_get = self.client_get.max(self.runtime.block_on(client_get)?);
        let (put, get) = self.runtime.block_on(kv(store))?;
        self.put = self.put.max(put);
        self.get = self.get.max(get);
        // Start every round from empty logs.
        self.runtime.block_on(cleanup(store))
    }
}

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
    let mut nonce = [0u8; 4];
    getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let run = mcp_persist_core::kit::hex(&nonce);
    let prefix = format!("bench:{run}:");
    let payload = "x".repeat(RECORD_BYTES);

    println!("redis bench: {TASKS} concurrent tasks, {RECORD_BYTES}-byte records, port {port}");
    let one_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let atomic_append = one_thread.block_on(load_atomic_append())?;
    let mut sides = [
        Side::new("current-thread", one_thread, &url, &prefix)?,
        Side::new(
            "multi-thread",
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?,
            &url,
            &prefix,
        )?,
    ];

    // Each measurement is taken ROUNDS times, ours and the baseline
    // interleaved, and the best of each is kept: other work on the machine
    // only ever slows a run down.
    let (mut raw_xadd, mut raw_atomic, mut raw_set, mut raw_get) = (0f64, 0f64, 0f64, 0f64);
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
        for side in &mut sides {
            side.measure()?;
        }
    }

    println!();
    println!("| operation | runtime | RedisStore ops/s | raw redis-benchmark ops/s | ratio |");
    println!("|---|---|---:|---:|---:|");
    for side in &sides {
        for (name, ours, raw) in [
            ("log append, no TTL vs XADD", side.append_plain, raw_xadd),
            ("log append with TTL vs XADD", side.append_ttl, raw_xadd),
            (
                "log append with TTL vs XADD+PEXPIRE script",
                side.append_ttl,
                raw_atomic,
            ),
            (
                "(the client library alone: redis-rs XADD vs XADD)",
                side.client_xadd,
                raw_xadd,
            ),
            ("kv put (CAS script) vs SET", side.put, raw_set),
            ("kv get vs GET", side.get, raw_get),
            (
                "(the client library alone: redis-rs GET vs GET)",
                side.client_get,
                raw_get,
            ),
        ] {
            println!(
                "| {name} | {} | {ours:.0} | {raw:.0} | {:.0}% |",
                side.name,
                100.0 * ours / raw
            );
        }
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
                store
                    .append(
                        &mcp_persist_core::conformance::key(&log),
                        vec![record.clone()],
                        ttl,
                    )
                    .await?;
            }
            Ok::<_, mcp_persist_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((TASKS * APPENDS_PER_TASK) as f64 / started.elapsed().as_secs_f64())
}

/// What the client library costs before the store does anything: 64 tasks
/// sending `per_task` commands each, built by `command` for the task's own
/// key, straight through the `redis` crate's multiplexed connection. With
/// `seed`, each key first holds a record (for `GET`).
async fn client_only(
    prefix: &str,
    per_task: usize,
    seed: bool,
    command: fn(&str, &[u8]) -> redis::Cmd,
) -> Result<f64> {
    let url = std::env::var("MCP_PERSIST_REDIS_URL")?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let record = vec![b'x'; RECORD_BYTES];
    let keys: Vec<String> = (0..TASKS)
        .map(|t| format!("{prefix}client{{{t}}}"))
        .collect();
    if seed {
        for key in &keys {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(&record)
                .query_async(&mut conn)
                .await?;
        }
    }
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for key in &keys {
        let mut conn = conn.clone();
        let (key, record) = (key.clone(), record.clone());
        tasks.push(tokio::spawn(async move {
            // Built for every call, as an application (or the store) does.
            for _ in 0..per_task {
                let _: redis::Value = command(&key, &record).query_async(&mut conn).await?;
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let rate = (TASKS * per_task) as f64 / started.elapsed().as_secs_f64();
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
    Ok(rate)
}

fn xadd(key: &str, record: &[u8]) -> redis::Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(key).arg("0-*").arg("d").arg(record);
    cmd
}

fn get(key: &str, _: &[u8]) -> redis::Cmd {
    let mut cmd = redis::cmd("GET");
    cmd.arg(key);
    cmd
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
                .put(
                    &mcp_persist_core::conformance::key(&key),
                    value.clone(),
                    PutOptions::new(PutMode::Overwrite),
                )
                .await?;
            for _ in 1..KV_PER_TASK {
                version = store
                    .put(
                        &mcp_persist_core::conformance::key(&key),
                        value.clone(),
                        PutOptions::new(PutMode::Update(version)),
                    )
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
                store.get(&mcp_persist_core::conformance::key(&key)).await?;
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
        store.delete_log(&key(format!("events/{t}"))).await?;
        store.delete(&key(format!("kv/{t}")), None).await?;
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
