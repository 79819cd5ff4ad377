//! Benchmarks of durable tasks, against rmcp's in-memory `TaskManager` in
//! the same run. Run in release mode: `cargo xtask bench tasks`, or
//! `cargo bench -p mcp-persist-transport-http --bench bench_tasks`.
//!
//! Both runtimes sit behind the same rmcp handler and HTTP server, and are
//! driven by raw 2026-07-28 requests over loopback:
//!
//! * **create**: median time from sending a task-creating `tools/call` to
//!   receiving its `CreateTaskResult` (the durable runtime commits the task
//!   first);
//! * **get**: `tasks/get` answered per second on a running task, with
//!   `CONCURRENCY` requests in flight.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, Stores};
use mcp_persist_transport_http::server::{DurableServer, DurableTasks};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        CreateTaskResult, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig,
        UpdateTaskParams,
    },
    service::RequestContext,
    task_manager::{TaskManager, TaskOptions},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};

/// Creates measured per runtime (after warm-up).
const CREATES: usize = 200;
/// How long `tasks/get` is driven per runtime.
const GET_FOR: Duration = Duration::from_secs(3);
/// `tasks/get` requests in flight.
const CONCURRENCY: usize = 8;

#[derive(Clone)]
enum Runtime {
    Rmcp(TaskManager),
    Durable(DurableTasks),
}

#[derive(Clone)]
struct Handler(Runtime);

/// The operation every benchmark task runs: it waits `ms` milliseconds.
fn wait(ms: u64) -> rmcp::task_manager::TaskFuture {
    Box::pin(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(CallToolResult::success(vec![]))
    })
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let ms = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("ms"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let created = match &self.0 {
            Runtime::Rmcp(m) => {
                CreateTaskResult::new(m.spawn(TaskOptions::default(), move |_| wait(ms)))
            }
            Runtime::Durable(d) => {
                d.spawn(&cx, TaskOptions::default(), move |_| wait(ms))
                    .await?
            }
        };
        Ok(CallToolResponse::Task(created))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        match &self.0 {
            Runtime::Rmcp(m) => m.get_task(&request.task_id).map(GetTaskResult::new),
            Runtime::Durable(d) => d.get_task(request, &cx).await,
        }
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match &self.0 {
            Runtime::Rmcp(m) => m.update_task(&request.task_id, request.input_responses),
            Runtime::Durable(d) => d.update_task(request, &cx).await,
        }
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match &self.0 {
            Runtime::Rmcp(m) => m.cancel_task(&request.task_id),
            Runtime::Durable(d) => d.cancel_task(request, &cx).await,
        }
    }
}

async fn serve(router: axum::Router) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, task))
}

async fn rpc(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    mut params: Value,
) -> anyhow::Result<Value> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "bench", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    });
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let text = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .find(|d| d.contains("\"id\""))
        .map_or(text.as_str(), str::trim);
    let message: Value =
        serde_json::from_str(data).with_context(|| format!("not JSON-RPC: {text}"))?;
    anyhow::ensure!(message.get("error").is_none(), "{method} failed: {message}");
    Ok(message["result"].clone())
}

struct Figures {
    create: Duration,
    gets_per_s: f64,
}

async fn measure(runtime: Runtime) -> anyhow::Result<Figures> {
    let handler = Handler(runtime);
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let (url, server) = serve(axum::Router::new().nest_service("/mcp", service)).await?;
    let http = reqwest::Client::new();
    let create = |id: u64, ms: u64| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let start = Instant::now();
            let result = rpc(
                &http,
                &url,
                id,
                "tools/call",
                json!({ "name": "wait", "arguments": { "ms": ms } }),
            )
            .await?;
            anyhow::ensure!(result["resultType"] == "task", "not a task: {result}");
            anyhow::Ok((
                start.elapsed(),
                result["taskId"].as_str().unwrap_or_default().to_owned(),
            ))
        }
    };
    for id in 0..20 {
        create(id, 0).await?;
    }
    let mut samples = Vec::with_capacity(CREATES);
    for id in 0..CREATES as u64 {
        samples.push(create(1000 + id, 0).await?.0);
    }
    samples.sort();
    let create_median = samples[samples.len() / 2];

    // One task that runs for the whole measurement.
    let (_, task) = create(9_999, 600_000).await?;
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + GET_FOR;
    let mut workers = Vec::new();
    for w in 0..CONCURRENCY {
        let (http, url, task, done) = (http.clone(), url.clone(), task.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut id = 100_000 * (w as u64 + 1);
            while Instant::now() < deadline {
                id += 1;
                let result = rpc(&http, &url, id, "tasks/get", json!({ "taskId": task })).await?;
                anyhow::ensure!(result["status"] == "working", "{result}");
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    server.abort();
    Ok(Figures {
        create: create_median,
        gets_per_s: done.load(Ordering::Relaxed) as f64 / GET_FOR.as_secs_f64(),
    })
}

async fn durable(stores: Stores) -> anyhow::Result<Runtime> {
    let server = DurableServer::builder(stores).build()?;
    Ok(Runtime::Durable(server.tasks().start().await?))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    println!(
        "durable tasks against rmcp's TaskManager: median create latency ({CREATES} creates), \
         tasks/get per second ({CONCURRENCY} in flight, {} s)",
        GET_FOR.as_secs()
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>12}",
        "runtime", "create", "vs rmcp", "gets/s", "vs rmcp"
    );
    let baseline = measure(Runtime::Rmcp(TaskManager::new())).await?;
    let row = |name: &str, f: &Figures| {
        println!(
            "{name:<22} {:>9.3} ms {:>12.2} {:>12.0} {:>12.2}",
            f.create.as_secs_f64() * 1e3,
            f.create.as_secs_f64() / baseline.create.as_secs_f64(),
            f.gets_per_s,
            f.gets_per_s / baseline.gets_per_s
        );
    };
    row("rmcp TaskManager", &baseline);
    let memory = measure(durable(Stores::new(MemoryStore::new())).await?).await?;
    row("durable, memory", &memory);
    let file = Stores::new(mcp_persist_store_file::FileStore::open(dir.path().join("file")).await?);
    row("durable, file", &measure(durable(file).await?).await?);
    let sqlite =
        Stores::new(mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("t.db")).await?);
    let sqlite = measure(durable(sqlite).await?).await?;
    row("durable, sqlite", &sqlite);
    match std::env::var("MCP_PERSIST_REDIS_URL") {
        Ok(url) => {
            let store = mcp_persist_store_redis::RedisStore::standalone(url)
                .key_prefix(format!("bench-tasks:{}:", std::process::id()))
                .connect()
                .await?;
            row(
                "durable, redis",
                &measure(durable(Stores::new(store)).await?).await?,
            );
        }
        Err(_) => {
            println!("MCP_PERSIST_REDIS_URL is not set: no Redis row (run `cargo xtask bench`)")
        }
    }
    println!(
        "aim: sqlite tasks/get at least half the durable in-memory rate: {:.2} ({})",
        sqlite.gets_per_s / memory.gets_per_s,
        if sqlite.gets_per_s >= memory.gets_per_s / 2.0 {
            "met"
        } else {
            "not met"
        }
    );
    println!(
        "create: sqlite adds {:.3} ms over the durable in-memory runtime (one commit)",
        (sqlite.create.as_secs_f64() - memory.create.as_secs_f64()) * 1e3
    );
    Ok(())
}
