//! With the default liveness settings: the calls of an instance killed with
//! SIGKILL end with an error the client can act on while the client is
//! still waiting for them (within the 3 s budget this test gives it), and a
//! live instance whose store writes stall for a second keeps its calls and
//! its tasks (nobody ends or takes them over).
//!
//! `cargo xtask bench server` reports how long each takes.

use crate::support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::support::{Balancer, Instance, demo, rpc_as_alice};
use anyhow::Context as _;
use async_trait::async_trait;
use mcp_persist_core::{
    Backend, KvEntry, KvStore, LogRecord, LogStore, PutOptions, Result, Stores, Version,
};
use serde_json::{Value, json};
use tokio::time::Instant;

/// How long a client of this test waits for its call after the instance
/// running it was killed, before it gives up on the server.
const CLIENT_BUDGET: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_call_ends_while_its_client_still_waits() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    // The defaults: no liveness setting at all.
    let args = ["--backend", "sqlite", "--store", db.as_str()];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let balancer = Balancer::new(a.addr()).await?;
    let (client, mut progress) = support::connect(&balancer.url(), "alice").await?;
    let call = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let args = json!({ "count": 1000, "delay_ms": 50, "tag": "killed" });
            let Value::Object(args) = args else {
                unreachable!("an object literal")
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }
    });
    // Long enough for both instances to have a grace period of heartbeats.
    for _ in 0..40 {
        tokio::time::timeout(Duration::from_secs(10), progress.recv())
            .await?
            .context("client closed")?;
    }
    a.kill().await?;
    let killed = Instant::now();
    balancer.switch(b.addr());
    balancer.cut();
    let outcome = tokio::time::timeout(CLIENT_BUDGET, call)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the killed instance's call was still open {CLIENT_BUDGET:?} after the kill"
            )
        })??;
    let error = outcome.expect_err("a call whose instance died cannot succeed");
    let text = error.to_string();
    assert!(text.contains("re-issue"), "{text}");
    eprintln!("the call ended {:?} after the kill", killed.elapsed());
    Ok(())
}

/// A backend whose writes wait while a stall is on (reads go through).
struct Stalling<S> {
    inner: Arc<S>,
    until: Mutex<Option<Instant>>,
}

impl<S> Stalling<S> {
    fn stall(&self, how_long: Duration) {
        *self.until.lock().expect("lock") = Some(Instant::now() + how_long);
    }

    async fn wait(&self) {
        let until = *self.until.lock().expect("lock");
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

#[async_trait]
impl<S: Backend> Backend for Stalling<S> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[async_trait]
impl<S: KvStore + LogStore> KvStore for Stalling<S> {
    async fn get(&self, key: &mcp_persist_core::Key) -> Result<Option<KvEntry>> {
        KvStore::get(&*self.inner, key).await
    }

    async fn put(
        &self,
        key: &mcp_persist_core::Key,
        value: Vec<u8>,
        options: PutOptions,
    ) -> Result<Version> {
        self.wait().await;
        self.inner.put(key, value, options).await
    }

    async fn delete(
        &self,
        key: &mcp_persist_core::Key,
        if_version: Option<Version>,
    ) -> Result<bool> {
        self.wait().await;
        self.inner.delete(key, if_version).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<mcp_persist_core::Key>> {
        self.inner.list(prefix).await
    }
}

#[async_trait]
impl<S: KvStore + LogStore> LogStore for Stalling<S> {
    async fn append(
        &self,
        log: &mcp_persist_core::Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.wait().await;
        self.inner.append(log, records, ttl).await
    }

    async fn append_unsynced(
        &self,
        log: &mcp_persist_core::Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.wait().await;
        self.inner.append_unsynced(log, records, ttl).await
    }

    async fn read_after(
        &self,
        log: &mcp_persist_core::Key,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogRecord>> {
        self.inner.read_after(log, after, limit).await
    }

    async fn wait_after(
        &self,
        log: &mcp_persist_core::Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        self.inner.wait_after(log, after, limit, timeout).await
    }

    async fn trim(&self, log: &mcp_persist_core::Key, before: u64) -> Result<u64> {
        self.wait().await;
        self.inner.trim(log, before).await
    }

    async fn delete_log(&self, log: &mcp_persist_core::Key) -> Result<()> {
        self.wait().await;
        self.inner.delete_log(log).await
    }
}

/// Serves the demo server with its task runtime over `stores`, default
/// liveness settings.
async fn serve(
    stores: Stores,
) -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let options = demo::Options::parse(Vec::new())?;
    let router = demo::durable_router_with_tasks(stores, &options, Arc::default()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((addr, task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_instance_whose_writes_stall_a_second_keeps_its_work() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    let stalling = Arc::new(Stalling {
        inner: Arc::new(mcp_persist_store_sqlite::SqliteStore::open(&db).await?),
        until: Mutex::new(None),
    });
    let kv: Arc<dyn KvStore> = stalling.clone();
    let log: Arc<dyn LogStore> = stalling.clone();
    let (a, _a) = serve(Stores::from_parts(kv, Some(log))).await?;
    let (b, _b) = serve(Stores::new(
        mcp_persist_store_sqlite::SqliteStore::open(&db).await?,
    ))
    .await?;
    let (url_a, url_b) = (format!("http://{a}/mcp"), format!("http://{b}/mcp"));
    // A server that panics while answering never answers: fail, not hang.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;

    // A task on A, polled on B...
    let created = rpc_as_alice(
        &http,
        &url_a,
        "stall-test",
        "tools/call",
        json!({ "name": "long_job", "arguments": { "steps": 60, "step_ms": 100, "tag": "stall" } }),
    )
    .await?;
    let task = created["result"]["taskId"]
        .as_str()
        .with_context(|| format!("not a task: {created}"))?
        .to_owned();
    // ...and a call on A, whose client moves to B and replays A's stream
    // from there while A writes it.
    let balancer = Balancer::new(a).await?;
    let (client, mut progress) = support::connect(&balancer.url(), "alice").await?;
    let call = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let args = json!({ "count": 100, "delay_ms": 50, "tag": "stalled" });
            let Value::Object(args) = args else {
                unreachable!("an object literal")
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }
    });
    // Both instances have heartbeats a grace period old by then.
    for _ in 0..40 {
        tokio::time::timeout(Duration::from_secs(10), progress.recv())
            .await?
            .context("client closed")?;
    }
    balancer.switch(b);
    balancer.cut();
    tokio::time::timeout(Duration::from_secs(10), progress.recv())
        .await?
        .context("no progress through B")?;

    // A's store writes stall for a second: no heartbeat, no event, no
    // lease renewal. B looks at A all along (its replay is quiet, its
    // task sweep runs).
    stalling.stall(Duration::from_secs(1));
    let result = tokio::time::timeout(Duration::from_secs(30), call).await???;
    let text: String = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(
        text.contains("stalled"),
        "the call ended with its own result: {text}"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let answer = rpc_as_alice(
            &http,
            &url_b,
            "stall-test",
            "tasks/get",
            json!({ "taskId": task }),
        )
        .await?;
        let status = answer["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if matches!(status.as_str(), "completed" | "failed" | "cancelled") {
            break answer["result"].clone();
        }
        anyhow::ensure!(Instant::now() < deadline, "the task never ended: {answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("(run 1)"),
        "the task was not taken over: {text}"
    );
    Ok(())
}
