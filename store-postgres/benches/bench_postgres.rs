//! `PostgresStore` against the raw tokio-postgres client issuing the same
//! statements to the same server, in the same run.
//!
//! * **append**: one task appending one 128-byte record per call, against
//!   one raw connection sending the same `SELECT schema.append(...)` call
//!   (one autocommit statement per record), one after the other.
//! * **put**: one task overwriting a key, against the same
//!   `SELECT schema.kv_put(...)` on one raw connection.
//! * **64 appenders**: 64 concurrent tasks appending to their own logs
//!   through the store (group commit: the appends queued while a commit runs
//!   share the next one), against 64 raw tasks on 16 connections each
//!   committing its own statement, and against every one of those records
//!   appended in one batched transaction (one statement): the ceiling.
//!
//! Every measurement runs several rounds, and the best of each is reported;
//! within a one-task round the store and the raw client alternate in short
//! slices, so that both meet the same disk (fsync times drift). append and put must reach 80% of the raw
//! client, else the program fails.
//!
//! Needs `MCP_PERSIST_POSTGRES_URL` (`cargo xtask bench postgres` starts a
//! server). Run with:
//!
//! ```text
//! cargo bench -p mcp-persist-store-postgres --bench bench_postgres
//! ```

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use mcp_persist_core::{Key, KvStore, LogStore, PutOptions};
use mcp_persist_store_postgres::PostgresStore;
use tokio_postgres::{Client, NoTls};

const RECORD_BYTES: usize = 128;
const SEQUENTIAL_OPS: usize = 1_000;
const TASKS: usize = 64;
const PER_TASK: usize = 150;
const RAW_CONNECTIONS: usize = 16;
const ROUNDS: usize = 5;
/// Slices of each one-task round, store and raw client alternating.
const SLICES: usize = 20;
const FLOOR: f64 = 0.80;

fn key(text: &str) -> Key {
    Key::new(text).expect("valid key")
}

async fn raw_client(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn rate(ops: usize, took: Duration) -> f64 {
    ops as f64 / took.as_secs_f64()
}

struct Bench {
    url: String,
    schema: String,
    store: PostgresStore,
    record: Vec<u8>,
    /// One raw connection for the one-task baselines, and its statements.
    raw: Client,
    raw_append: tokio_postgres::Statement,
    raw_put: tokio_postgres::Statement,
}

impl Bench {
    fn append_sql(&self) -> String {
        format!("SELECT \"{}\".append($1, $2, $3, $4, $5)", self.schema)
    }

    async fn store_append(&self, round: usize, ops: usize) -> Result<Duration> {
        let log = key(&format!("seq-store-{round}"));
        let started = Instant::now();
        for _ in 0..ops {
            self.store
                .append(&log, vec![self.record.clone()], None)
                .await?;
        }
        Ok(started.elapsed())
    }

    async fn raw_append(&self, round: usize, ops: usize) -> Result<Duration> {
        let name = format!("seq-raw-{round}");
        let started = Instant::now();
        for _ in 0..ops {
            let names = vec![name.as_str()];
            let datas = vec![self.record.as_slice()];
            let ttls: Vec<Option<i64>> = vec![None];
            self.raw
                .query_one(
                    &self.raw_append,
                    &[&names, &vec![1i32], &datas, &ttls, &true],
                )
                .await?;
        }
        Ok(started.elapsed())
    }

    async fn store_put(&self, round: usize, ops: usize) -> Result<Duration> {
        let k = key(&format!("put-store-{round}"));
        let started = Instant::now();
        for _ in 0..ops {
            self.store
                .put(&k, self.record.clone(), PutOptions::default())
                .await?;
        }
        Ok(started.elapsed())
    }

    async fn raw_put(&self, round: usize, ops: usize) -> Result<Duration> {
        let k = format!("put-raw-{round}");
        let started = Instant::now();
        for _ in 0..ops {
            self.raw
                .query_one(
                    &self.raw_put,
                    &[&k, &self.record, &0i32, &None::<i64>, &None::<i64>],
                )
                .await?;
        }
        Ok(started.elapsed())
    }

    /// The store and the raw client in alternating slices of one round, so
    /// that both meet the same disk: fsync times drift over seconds.
    async fn one_task(&self, round: usize) -> Result<[f64; 4]> {
        let slice = SEQUENTIAL_OPS / SLICES;
        let mut took = [Duration::ZERO; 4];
        for _ in 0..SLICES {
            took[0] += self.store_append(round, slice).await?;
            took[1] += self.raw_append(round, slice).await?;
            took[2] += self.store_put(round, slice).await?;
            took[3] += self.raw_put(round, slice).await?;
        }
        Ok(took.map(|t| rate(slice * SLICES, t)))
    }

    async fn store_concurrent(&self, round: usize) -> Result<(f64, f64)> {
        let before = self.store.write_stats();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (store, record) = (self.store.clone(), self.record.clone());
            tasks.push(tokio::spawn(async move {
                let log = key(&format!("conc-store-{round}-{t}"));
                for _ in 0..PER_TASK {
                    store.append(&log, vec![record.clone()], None).await?;
                }
                Ok::<_, mcp_persist_core::Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        let took = started.elapsed();
        let after = self.store.write_stats();
        let group = (after.appends - before.appends) as f64
            / (after.transactions - before.transactions).max(1) as f64;
        Ok((rate(TASKS * PER_TASK, took), group))
    }

    async fn raw_concurrent(&self, round: usize) -> Result<f64> {
        let mut clients = Vec::new();
        for _ in 0..RAW_CONNECTIONS {
            let client = Arc::new(raw_client(&self.url).await?);
            let stmt = client.prepare(&self.append_sql()).await?;
            clients.push((client, stmt));
        }
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (client, stmt) = clients[t % RAW_CONNECTIONS].clone();
            let record = self.record.clone();
            tasks.push(tokio::spawn(async move {
                let name = format!("conc-raw-{round}-{t}");
                for _ in 0..PER_TASK {
                    let names = vec![name.as_str()];
                    let datas = vec![record.as_slice()];
                    let ttls: Vec<Option<i64>> = vec![None];
                    client
                        .query_one(&stmt, &[&names, &vec![1i32], &datas, &ttls, &true])
                        .await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        Ok(rate(TASKS * PER_TASK, started.elapsed()))
    }

    async fn one_transaction(&self, round: usize) -> Result<f64> {
        let client = raw_client(&self.url).await?;
        let stmt = client.prepare(&self.append_sql()).await?;
        let names: Vec<String> = (0..TASKS)
            .flat_map(|t| (0..PER_TASK).map(move |_| format!("batch-{round}-{t}")))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts = vec![1i32; names.len()];
        let datas: Vec<&[u8]> = vec![self.record.as_slice(); names.len()];
        let ttls: Vec<Option<i64>> = vec![None; names.len()];
        let started = Instant::now();
        client
            .query_one(&stmt, &[&names, &counts, &datas, &ttls, &true])
            .await?;
        Ok(rate(names.len(), started.elapsed()))
    }
}

fn best(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

fn main() -> Result<()> {
    let url = std::env::var("MCP_PERSIST_POSTGRES_URL")
        .context("MCP_PERSIST_POSTGRES_URL is not set: run `cargo xtask bench postgres`")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let schema = format!("bench_{}", std::process::id());
        let store = PostgresStore::builder(&url)
            .schema(&schema)
            .operation_timeout(Duration::from_secs(30))
            .connect()
            .await?;
        let raw = raw_client(&url).await?;
        let raw_append = raw
            .prepare(&format!("SELECT \"{schema}\".append($1, $2, $3, $4, $5)"))
            .await?;
        let raw_put = raw
            .prepare(&format!("SELECT \"{schema}\".kv_put($1, $2, $3, $4, $5)"))
            .await?;
        let bench = Bench {
            url: url.clone(),
            schema: schema.clone(),
            store,
            record: (0..RECORD_BYTES).map(|i| (i * 7 % 251) as u8).collect(),
            raw,
            raw_append,
            raw_put,
        };
        let (mut sa, mut ra, mut sp, mut rp) = (vec![], vec![], vec![], vec![]);
        let (mut sc, mut groups, mut rc, mut one) = (vec![], vec![], vec![], vec![]);
        for round in 0..ROUNDS {
            let [a, b, c, d] = bench.one_task(round).await?;
            sa.push(a);
            ra.push(b);
            sp.push(c);
            rp.push(d);
            let (rate, group) = bench.store_concurrent(round).await?;
            sc.push(rate);
            groups.push(group);
            rc.push(bench.raw_concurrent(round).await?);
            one.push(bench.one_transaction(round).await?);
        }
        let (sa, ra, sp, rp) = (best(&sa), best(&ra), best(&sp), best(&rp));
        println!("postgres: best of {ROUNDS} rounds, {RECORD_BYTES}-byte records, synchronous_commit on");
        println!(
            "  append, one task        store {sa:>9.0}/s   raw client {ra:>9.0}/s   {:>5.1}%",
            100.0 * sa / ra
        );
        println!(
            "  put, one task           store {sp:>9.0}/s   raw client {rp:>9.0}/s   {:>5.1}%",
            100.0 * sp / rp
        );
        println!(
            "  append, {TASKS} tasks       store {:>9.0}/s (group commit, {:.1} appends per transaction)",
            best(&sc),
            best(&groups)
        );
        println!(
            "                          raw client, {RAW_CONNECTIONS} connections, one statement each {:>9.0}/s",
            best(&rc)
        );
        println!(
            "                          one batched transaction of all {} {:>9.0}/s",
            TASKS * PER_TASK,
            best(&one)
        );
        // Leave the server as found.
        let client = raw_client(&url).await?;
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await?;
        let mut short = Vec::new();
        if sa < FLOOR * ra {
            short.push("append");
        }
        if sp < FLOOR * rp {
            short.push("put");
        }
        if !short.is_empty() {
            bail!(
                "{} below {:.0}% of the raw client",
                short.join(" and "),
                FLOOR * 100.0
            );
        }
        Ok(())
    })
}
