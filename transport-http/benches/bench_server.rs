//! Benchmarks of the durable server, each against its baseline in the same
//! run. Run in release mode: `cargo xtask bench`, or
//! `cargo bench -p mcp-persist-transport-http --bench bench_server`.
//!
//! * **Progress events per second** delivered end to end (tool handler to
//!   rmcp client, over HTTP and SSE) by rmcp's in-memory defaults, by the
//!   durable server without an event store, and by the durable server with
//!   each backend's event store (every event committed before it is sent;
//!   Redis when `MCP_PERSIST_REDIS_URL` names a server, as `cargo xtask bench`
//!   arranges). Each row is measured in rounds beside rmcp's defaults, in
//!   alternating order, and reads the medians: the process slows as it
//!   serves (stores keep their events; the baseline measured again at the
//!   end shows by how much), and a single pair of measurements varied by
//!   a tenth from one run to the next.
//!   `-- only=WORD` measures only the rows whose name holds `WORD`.
//! * **Per event on rmcp's session worker**: one `store_event` on the
//!   memory event store, against encoding the message alone, single
//!   threaded (rmcp waits for it before it sends each event), and what
//!   the one-stream row would read with that time added to every event's
//!   stock rmcp delivers, against what the 0.95 aim leaves it.
//! * **Added latency of a cross-instance restore**: the first request on an
//!   instance that must restore the session from the store, against the
//!   same request once the session is there.
//! * **Failover time**: an rmcp client receiving progress from instance A
//!   has its connections cut and carries on at instance B (same SQLite
//!   store): the time from the cut to its first event through B, with the
//!   server's default SSE retry interval (3 s) and with 200 ms. rmcp's
//!   client reconnects at once after a broken connection; it waits the
//!   advertised interval only when a server ends a stream cleanly.
//! * **A killed instance's calls**: instance A (a child process) is killed
//!   with SIGKILL mid-call; the time until the client, moved to B, gets the
//!   "re-issue" error, with the default liveness grace and with the former
//!   default of 3 s as the baseline. And a live instance whose store writes
//!   stall for 1 s: whether its call is kept (the client gets its result) or
//!   ended as if it were dead, with the default grace and with 1 s.
//!   `-- failover` runs these measurements alone.
//! * **Per-request session check**: the warm request latency with the
//!   default strict sessions (an ended session is gone on every instance at
//!   once, one store read per request) against coalesced sessions (the
//!   opt-out), per backend. `-- sessions` runs this measurement alone.
#![allow(deprecated)] // The demo server's sampling tool; see server.rs.

#[path = "../examples/server/main.rs"]
#[allow(dead_code, unreachable_pub)]
mod demo;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use mcp_persist_core::{KvStore, LogStore, MemoryStore, Stores};
use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    model::{ClientCapabilities, ClientInfo, Implementation, ProgressNotificationParam},
    service::NotificationContext,
    transport::StreamableHttpClientTransport,
};
use tokio::sync::mpsc;

/// Progress notifications per measured call.
const EVENTS: usize = 2_000;
/// Measured calls per configuration (after one warm-up call).
const ROUNDS: usize = 3;
/// Rounds of stock rmcp and each event-store row measured back to back.
const ROW_ROUNDS: usize = 3;
/// Restores measured per backend.
const RESTORES: usize = 30;

#[derive(Clone)]
struct Counter(mpsc::UnboundedSender<()>);

impl ClientHandler for Counter {
    fn get_info(&self) -> ClientInfo {
        ClientInfo::new(
            ClientCapabilities::default(),
            Implementation::new("bench", "1.0"),
        )
    }

    async fn on_progress(
        &self,
        _params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(());
    }
}

fn options() -> anyhow::Result<demo::Options> {
    demo::Options::parse(Vec::new())
}

fn pipelined() -> anyhow::Result<demo::Options> {
    demo::Options::parse(vec!["--pipelined-events".to_owned()])
}

/// Warm `tools/list` requests timed per configuration.
const WARM_REQUESTS: usize = 300;

/// p50 and p99 latency of a `tools/list` on a warm session.
async fn warm_latency(router: axum::Router) -> anyhow::Result<(Duration, Duration)> {
    let (url, task) = serve(router).await?;
    let http = reqwest::Client::new();
    let init = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    });
    let (session, _) = raw(&http, &url, None, init).await?;
    let session = session.context("no session id")?;
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    raw(&http, &url, Some(&session), initialized).await?;
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    for _ in 0..20 {
        raw(&http, &url, Some(&session), list.clone()).await?;
    }
    let mut samples = Vec::with_capacity(WARM_REQUESTS);
    for _ in 0..WARM_REQUESTS {
        let start = Instant::now();
        raw(&http, &url, Some(&session), list.clone()).await?;
        samples.push(start.elapsed());
    }
    task.abort();
    samples.sort();
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    Ok((samples[samples.len() / 2], p99))
}

/// Clients, each with its own session and stream, in the concurrent run.
const STREAMS: usize = 64;
/// Progress notifications per client in the concurrent run.
const EVENTS_EACH: usize = 200;

/// Events per second through one server over `STREAMS` sessions at once,
/// each calling a tool that sends `EVENTS_EACH` progress notifications.
async fn concurrent_rate(router: axum::Router) -> anyhow::Result<f64> {
    let (url, task) = serve(router).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut clients = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        clients.push(
            Counter(tx.clone())
                .serve(StreamableHttpClientTransport::from_uri(url.clone()))
                .await?,
        );
    }
    let start = Instant::now();
    let mut calls = Vec::with_capacity(STREAMS);
    for client in &clients {
        let args = serde_json::json!({"count": EVENTS_EACH, "delay_ms": 0, "tag": "many"});
        let serde_json::Value::Object(args) = args else {
            unreachable!("an object literal")
        };
        let peer = client.peer().clone();
        calls.push(tokio::spawn(async move {
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }));
    }
    for _ in 0..STREAMS * EVENTS_EACH {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .context("progress did not arrive")?
            .context("clients closed")?;
    }
    let rate = (STREAMS * EVENTS_EACH) as f64 / start.elapsed().as_secs_f64();
    for call in calls {
        call.await??;
    }
    for client in clients {
        client.cancel().await?;
    }
    task.abort();
    Ok(rate)
}

async fn serve(router: axum::Router) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    // Without TCP_NODELAY, a response written in two parts waits for the
    // client's delayed ACK (about 40 ms on Linux) and every latency below
    // would measure that.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, task))
}

/// Events per second through one server, best of `ROUNDS` calls.
/// One row's rates over its rounds, stock rmcp's beside it.
#[derive(Default)]
struct Figure {
    stock: Vec<f64>,
    durable: Vec<f64>,
}

impl Figure {
    /// The median of the rounds' ratios to the stock rate measured beside
    /// each.
    fn ratio(&self) -> f64 {
        median_rate(
            self.durable
                .iter()
                .zip(&self.stock)
                .map(|(d, s)| d / s)
                .collect(),
        )
    }
}

fn median_rate(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn progress_rate(router: axum::Router) -> anyhow::Result<f64> {
    let (url, task) = serve(router).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = Counter(tx)
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await?;
    let mut best = 0f64;
    for round in 0..=ROUNDS {
        let args = serde_json::json!({"count": EVENTS, "delay_ms": 0, "tag": "bench"});
        let serde_json::Value::Object(args) = args else {
            unreachable!("an object literal")
        };
        let start = Instant::now();
        client
            .call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await?;
        for _ in 0..EVENTS {
            tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .context("progress did not arrive")?
                .context("client closed")?;
        }
        let rate = EVENTS as f64 / start.elapsed().as_secs_f64();
        if round > 0 {
            best = best.max(rate);
        }
    }
    client.cancel().await?;
    task.abort();
    Ok(best)
}

async fn raw(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: serde_json::Value,
) -> anyhow::Result<(Option<String>, String)> {
    let mut request = http
        .post(url)
        .header("x-demo-user", "bench")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25");
    }
    let response = request.send().await?;
    anyhow::ensure!(response.status().is_success(), "HTTP {}", response.status());
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((session, response.text().await?))
}

/// Progress events stored in each pass of [`store_cost`].
const STORE_COST_EVENTS: usize = 100_000;

/// What the durable layer adds to each event on rmcp's session worker
/// (which waits for `store_event` before it sends the event): the time of
/// one `store_event` on the in-memory event store, and of encoding the
/// message alone (rmcp encodes it once more for the SSE body), in µs, each
/// the median of five passes over [`STORE_COST_EVENTS`] progress events,
/// a new stream every [`EVENTS`] as the end-to-end rows open one per call.
async fn store_cost() -> anyhow::Result<(f64, f64)> {
    use rmcp::{
        model::{
            NumberOrString, ProgressNotification, ProgressToken, ServerJsonRpcMessage,
            ServerNotification,
        },
        transport::streamable_http_server::session::{EventStore as _, ServerSseMessage},
    };
    let note = ServerNotification::ProgressNotification(ProgressNotification::new(
        ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(1)), 5.0)
            .with_total(EVENTS as f64)
            .with_message("bench"),
    ));
    let message = ServerSseMessage::from_message(ServerJsonRpcMessage::notification(note));
    let per_event = |elapsed: Duration| elapsed.as_secs_f64() * 1e6 / STORE_COST_EVENTS as f64;
    let (mut stored, mut encoded) = (Vec::new(), Vec::new());
    for pass in 0..5 {
        // A store of its own for each pass: the events of the passes
        // before would make each pass's appends slower than the last's.
        let events =
            Stores::new(MemoryStore::new()).events(mcp_persist_core::EventLogConfig::default())?;
        let store = mcp_persist_transport_http::server::DurableEventStore::new(
            events,
            Duration::from_secs(1),
        );
        let start = Instant::now();
        for i in 0..STORE_COST_EVENTS {
            let stream = format!("{pass}-{}", i / EVENTS);
            std::hint::black_box(
                store
                    .store_event(&stream, &message)
                    .await
                    .map_err(|e| anyhow::anyhow!(e))?,
            );
        }
        stored.push(per_event(start.elapsed()));
        let start = Instant::now();
        for _ in 0..STORE_COST_EVENTS {
            std::hint::black_box(serde_json::to_vec(&message.message)?);
        }
        encoded.push(per_event(start.elapsed()));
    }
    Ok((median_rate(stored), median_rate(encoded)))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median latency of a `tools/list` that restores the session on a second
/// instance, and of the same request once the session is there.
async fn restore_latency(stores: Stores) -> anyhow::Result<(Duration, Duration)> {
    let opts = options()?;
    let a = demo::durable_router(stores.clone(), &opts, Arc::default())?;
    let b = demo::durable_router(stores, &opts, Arc::default())?;
    let ((url_a, task_a), (url_b, task_b)) = (serve(a).await?, serve(b).await?);
    let http = reqwest::Client::new();
    let init = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    });
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (mut restores, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..RESTORES {
        let (session, _) = raw(&http, &url_a, None, init.clone()).await?;
        let session = session.context("no session id")?;
        raw(&http, &url_a, Some(&session), initialized.clone()).await?;
        let start = Instant::now();
        raw(&http, &url_b, Some(&session), list.clone()).await?;
        restores.push(start.elapsed());
        let start = Instant::now();
        raw(&http, &url_b, Some(&session), list.clone()).await?;
        warm.push(start.elapsed());
    }
    task_a.abort();
    task_b.abort();
    Ok((median(restores), median(warm)))
}

/// A TCP proxy in front of the instances: new connections go to the
/// current target; `move_to` cuts every open one.
struct Proxy {
    addr: std::net::SocketAddr,
    target: Arc<std::sync::Mutex<std::net::SocketAddr>>,
    open: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn new(target: std::net::SocketAddr) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = Arc::new(std::sync::Mutex::new(target));
        let open: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (target, open) = (target.clone(), open.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let _ = inbound.set_nodelay(true);
                    let to = *target.lock().unwrap_or_else(|p| p.into_inner());
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                            let _ = outbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    open.lock().unwrap_or_else(|p| p.into_inner()).push(task);
                }
            }
        });
        Ok(Proxy {
            addr,
            target,
            open,
            accept,
        })
    }

    /// Sends new connections to `target`; open ones stay.
    fn point_to(&self, target: std::net::SocketAddr) {
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = target;
    }

    fn move_to(&self, target: std::net::SocketAddr) {
        self.point_to(target);
        for task in self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Median time from cutting the client's connections to A until its first
/// progress event through B, with `retry_ms` advertised (`None`: the
/// server's default).
async fn failover(db: &std::path::Path, retry_ms: Option<u64>) -> anyhow::Result<Duration> {
    let stores = Stores::new(mcp_persist_store_sqlite::SqliteStore::open(db).await?);
    let router = |stores: Stores| -> anyhow::Result<axum::Router> {
        let mut builder = mcp_persist_transport_http::server::DurableServer::builder(stores);
        if let Some(ms) = retry_ms {
            builder = builder.http_config(
                mcp_persist_transport_http::server::StreamableHttpServerConfig::default()
                    .with_sse_retry(Some(Duration::from_millis(ms))),
            );
        }
        let server = builder.build()?;
        let service = server.service(|| Ok(demo::DemoHandler::new(Arc::default())));
        Ok(axum::Router::new().nest_service("/mcp", service))
    };
    let (url_a, task_a) = serve(router(stores.clone())?).await?;
    let (url_b, task_b) = serve(router(stores)?).await?;
    let addr = |url: &str| -> anyhow::Result<std::net::SocketAddr> {
        Ok(url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .parse()?)
    };
    let mut samples = Vec::new();
    for _ in 0..3 {
        let proxy = Proxy::new(addr(&url_a)?).await?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let client = Counter(tx)
            .serve(StreamableHttpClientTransport::from_uri(format!(
                "http://{}/mcp",
                proxy.addr
            )))
            .await?;
        let args = serde_json::json!({"count": 200, "delay_ms": 10, "tag": "failover"});
        let serde_json::Value::Object(args) = args else {
            unreachable!("an object literal")
        };
        let call = {
            let peer = client.peer().clone();
            tokio::spawn(async move {
                peer.call_tool(
                    rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
                )
                .await
            })
        };
        for _ in 0..20 {
            tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .context("progress did not arrive")?
                .context("client closed")?;
        }
        let moved = Instant::now();
        proxy.move_to(addr(&url_b)?);
        // Events that came through A before the cut may still be queued.
        while rx.try_recv().is_ok() {}
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .context("no progress after the failover")?
            .context("client closed")?;
        samples.push(moved.elapsed());
        call.await??;
        client.cancel().await?;
    }
    task_a.abort();
    task_b.abort();
    Ok(median(samples))
}

/// The environment variable that makes this binary a demo server process
/// (the instance the failover measurement kills).
const SERVER_ARGS_VAR: &str = "MCP_PERSIST_BENCH_SERVER_ARGS";

/// A demo server in a child process (this binary, re-executed).
struct Child {
    addr: std::net::SocketAddr,
    process: tokio::process::Child,
}

impl Child {
    async fn start(args: &[String]) -> anyhow::Result<Child> {
        use tokio::io::AsyncBufReadExt as _;
        let mut process = tokio::process::Command::new(std::env::current_exe()?)
            .env(SERVER_ARGS_VAR, args.join("\u{1f}"))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = process.stdout.take().context("child stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix("LISTENING ") {
                    return Ok::<_, anyhow::Error>(addr.trim().parse()?);
                }
            }
            anyhow::bail!("the server process exited before listening")
        })
        .await
        .context("the server process did not start")??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Child { addr, process })
    }

    /// SIGKILL, and wait for the process to be gone.
    async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.start_kill()?;
        self.process.wait().await?;
        Ok(())
    }
}

/// Starts an rmcp client on `url` calling `slow_progress` (`count` events
/// 50 ms apart) and waits for `events` of them.
async fn long_call(
    url: String,
    count: usize,
    events: usize,
) -> anyhow::Result<(
    rmcp::service::RunningService<RoleClient, Counter>,
    tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, rmcp::ServiceError>>,
)> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = Counter(tx)
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await?;
    let args = serde_json::json!({"count": count, "delay_ms": 50, "tag": "failover"});
    let serde_json::Value::Object(args) = args else {
        unreachable!("an object literal")
    };
    let call = {
        let peer = client.peer().clone();
        tokio::spawn(async move {
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        })
    };
    for _ in 0..events {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .context("progress did not arrive")?
            .context("client closed")?;
    }
    Ok((client, call))
}

/// Times (sorted) from a SIGKILL of the instance running a call until its
/// client, moved to the other instance, gets the "re-issue" error; `grace`
/// is passed to both instances (`None`: the default).
async fn killed(dir: &std::path::Path, grace_ms: Option<u64>) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::new();
    for round in 0..3 {
        let db = dir.join(format!("killed-{}-{round}.db", grace_ms.unwrap_or(0)));
        let mut args = vec![
            "--backend".to_owned(),
            "sqlite".to_owned(),
            "--store".to_owned(),
            db.display().to_string(),
        ];
        if let Some(ms) = grace_ms {
            args.extend(["--liveness-grace-ms".to_owned(), ms.to_string()]);
        }
        let mut a = Child::start(&args).await?;
        let mut b = Child::start(&args).await?;
        let proxy = Proxy::new(a.addr).await?;
        // 4 s of progress: both instances have heartbeats older than any
        // grace measured here.
        let (client, call) = long_call(format!("http://{}/mcp", proxy.addr), 1000, 80).await?;
        // The balancer already sends new connections to B, so the client's
        // reconnect (at once, when its stream breaks with A's death) is not
        // refused and backed off: what is measured is the server's doing.
        proxy.point_to(b.addr);
        a.kill().await?;
        let killed = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .context("the killed instance's call never ended")??;
        let took = killed.elapsed();
        match outcome {
            Err(e) if e.to_string().contains("re-issue") => samples.push(took),
            other => anyhow::bail!("expected the re-issue error, got {other:?}"),
        }
        let _ = client.cancel().await;
        b.kill().await?;
    }
    samples.sort();
    Ok(samples)
}

/// A backend whose writes wait while a stall is on; reads go through.
struct Stalling<S> {
    inner: Arc<S>,
    until: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl<S> Stalling<S> {
    fn stall(&self, how_long: Duration) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(tokio::time::Instant::now() + how_long);
    }

    async fn wait(&self) {
        let until = *self.until.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

#[async_trait::async_trait]
impl<S: mcp_persist_core::Backend> mcp_persist_core::Backend for Stalling<S> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[async_trait::async_trait]
impl<S: KvStore + LogStore> KvStore for Stalling<S> {
    async fn get(
        &self,
        key: &mcp_persist_core::Key,
    ) -> mcp_persist_core::Result<Option<mcp_persist_core::KvEntry>> {
        KvStore::get(&*self.inner, key).await
    }

    async fn put(
        &self,
        key: &mcp_persist_core::Key,
        value: Vec<u8>,
        options: mcp_persist_core::PutOptions,
    ) -> mcp_persist_core::Result<mcp_persist_core::Version> {
        self.wait().await;
        self.inner.put(key, value, options).await
    }

    async fn delete(
        &self,
        key: &mcp_persist_core::Key,
        if_version: Option<mcp_persist_core::Version>,
    ) -> mcp_persist_core::Result<bool> {
        self.wait().await;
        self.inner.delete(key, if_version).await
    }

    async fn list(&self, prefix: &str) -> mcp_persist_core::Result<Vec<mcp_persist_core::Key>> {
        self.inner.list(prefix).await
    }
}

#[async_trait::async_trait]
impl<S: KvStore + LogStore> LogStore for Stalling<S> {
    async fn append(
        &self,
        log: &mcp_persist_core::Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> mcp_persist_core::Result<Vec<u64>> {
        self.wait().await;
        self.inner.append(log, records, ttl).await
    }

    async fn append_unsynced(
        &self,
        log: &mcp_persist_core::Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> mcp_persist_core::Result<Vec<u64>> {
        self.wait().await;
        self.inner.append_unsynced(log, records, ttl).await
    }

    async fn read_after(
        &self,
        log: &mcp_persist_core::Key,
        after: u64,
        limit: usize,
    ) -> mcp_persist_core::Result<Vec<mcp_persist_core::LogRecord>> {
        self.inner.read_after(log, after, limit).await
    }

    async fn wait_after(
        &self,
        log: &mcp_persist_core::Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> mcp_persist_core::Result<Vec<mcp_persist_core::LogRecord>> {
        self.inner.wait_after(log, after, limit, timeout).await
    }

    async fn trim(
        &self,
        log: &mcp_persist_core::Key,
        before: u64,
    ) -> mcp_persist_core::Result<u64> {
        self.wait().await;
        self.inner.trim(log, before).await
    }

    async fn delete_log(&self, log: &mcp_persist_core::Key) -> mcp_persist_core::Result<()> {
        self.wait().await;
        self.inner.delete_log(log).await
    }
}

/// A call on instance A whose client replays it from B; A's store writes
/// then stall for `stall`. Whether the call ended with its own result
/// (`true`) or as if A were dead, and when, after the stall began.
async fn stalled(
    db: &std::path::Path,
    stall: Duration,
    grace_ms: Option<u64>,
) -> anyhow::Result<(bool, Duration)> {
    let stalling = Arc::new(Stalling {
        inner: Arc::new(mcp_persist_store_sqlite::SqliteStore::open(db).await?),
        until: std::sync::Mutex::new(None),
    });
    let kv: Arc<dyn KvStore> = stalling.clone();
    let log: Arc<dyn LogStore> = stalling.clone();
    let mut flags = Vec::new();
    if let Some(ms) = grace_ms {
        flags.extend(["--liveness-grace-ms".to_owned(), ms.to_string()]);
    }
    let opts = demo::Options::parse(flags)?;
    let (url_a, task_a) = serve(demo::durable_router(
        Stores::from_parts(kv, Some(log)),
        &opts,
        Arc::default(),
    )?)
    .await?;
    let (url_b, task_b) = serve(demo::durable_router(
        Stores::new(mcp_persist_store_sqlite::SqliteStore::open(db).await?),
        &opts,
        Arc::default(),
    )?)
    .await?;
    let proxy = Proxy::new(addr_of(&url_a)?).await?;
    // 4 s of progress before the stall, 2 s after it.
    let (client, call) = long_call(format!("http://{}/mcp", proxy.addr), 120, 80).await?;
    proxy.move_to(addr_of(&url_b)?);
    // The client replays A's stream from B; then A stalls.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stalling.stall(stall);
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(120), call)
        .await
        .context("the stalled instance's call never ended")??;
    let took = started.elapsed();
    let _ = client.cancel().await;
    task_a.abort();
    task_b.abort();
    match outcome {
        Ok(_) => Ok((true, took)),
        Err(e) if e.to_string().contains("re-issue") => Ok((false, took)),
        Err(e) => Err(e.into()),
    }
}

fn addr_of(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    Ok(url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()?)
}

/// Serves the demo server in this process when started as a child by
/// [`Child::start`].
fn run_server_if_asked() -> anyhow::Result<bool> {
    let Ok(args) = std::env::var(SERVER_ARGS_VAR) else {
        return Ok(false);
    };
    let args: Vec<String> = args
        .split('\u{1f}')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(demo::run(demo::Options::parse(args)?))?;
    Ok(true)
}

fn main() -> anyhow::Result<()> {
    if run_server_if_asked()? {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "failover") {
        return failovers(&tempfile::tempdir()?).await;
    }
    if std::env::args().any(|a| a == "sessions") {
        let url = std::env::var("MCP_PERSIST_REDIS_URL").ok();
        return session_checks(&tempfile::tempdir()?, &url).await;
    }
    // `-- only=memory` (repeatable) measures the event-store rows whose
    // name holds one of the words, beside stock rmcp, and nothing else.
    let only: Vec<String> = std::env::args()
        .filter_map(|a| a.strip_prefix("only=").map(str::to_owned))
        .collect();
    let dir = tempfile::tempdir()?;
    let opts = options()?;
    let root = dir.path().to_path_buf();
    let file = |name: &'static str| {
        let path = root.join(name);
        async move {
            anyhow::Ok(Stores::new(
                mcp_persist_store_file::FileStore::open(path).await?,
            ))
        }
    };
    let sqlite = |name: &'static str| {
        let path = root.join(name);
        async move {
            anyhow::Ok(Stores::new(
                mcp_persist_store_sqlite::SqliteStore::open(path).await?,
            ))
        }
    };
    // Events need not outlive a power cut (a client that lost them starts
    // a new request): synchronous=NORMAL survives a process crash.
    let sqlite_normal = |name: &'static str| {
        let path = root.join(name);
        async move {
            let options = mcp_persist_store_sqlite::SqliteOptions::default()
                .durability(mcp_persist_store_sqlite::Durability::Normal);
            anyhow::Ok(Stores::new(
                mcp_persist_store_sqlite::SqliteStore::open_with(path, options).await?,
            ))
        }
    };
    // Redis when `cargo xtask bench` started one; each use gets its own
    // key prefix.
    let redis_url = std::env::var("MCP_PERSIST_REDIS_URL").ok();
    let redis_uses = std::sync::atomic::AtomicUsize::new(0);
    let redis = || async {
        let Some(url) = redis_url.clone() else {
            return anyhow::Ok(None);
        };
        let n = redis_uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store = mcp_persist_store_redis::RedisStore::standalone(url)
            .key_prefix(format!("bench-server:{}:{n}:", std::process::id()))
            .connect()
            .await?;
        anyhow::Ok(Some(Stores::new(store)))
    };
    if redis_url.is_none() {
        println!("MCP_PERSIST_REDIS_URL is not set: no Redis rows (run `cargo xtask bench`)");
    }

    println!(
        "progress events delivered end to end ({EVENTS} per call, best of {ROUNDS}; each row the median of {ROW_ROUNDS} rounds beside stock rmcp, in alternating order)"
    );
    println!(
        "{:<36} {:>12} {:>10} {:>16} {:>10}",
        "server", "events/s", "vs rmcp", "64 streams ev/s", "vs rmcp"
    );
    let baseline = progress_rate(demo::rmcp_default_router(&opts, Arc::default())).await?;
    let baseline_many = concurrent_rate(demo::rmcp_default_router(&opts, Arc::default())).await?;
    println!(
        "{:<36} {:>12.0} {:>10.2} {:>16.0} {:>10.2}",
        "rmcp in-memory defaults", baseline, 1.0, baseline_many, 1.0
    );
    let no_events = {
        let server = mcp_persist_transport_http::server::DurableServer::builder(Stores::new(
            MemoryStore::new(),
        ))
        .without_events()
        .build()?;
        let counters = Arc::new(demo::Counters::default());
        let service = server.service(move || Ok(demo::DemoHandler::new(counters.clone())));
        progress_rate(axum::Router::new().nest_service("/mcp", service)).await?
    };
    println!(
        "{:<36} {:>12.0} {:>10.2}",
        "durable, no event store",
        no_events,
        no_events / baseline
    );
    let piped = pipelined()?;
    let mut written = options()?;
    written.written_events = true;
    let (base_p50, base_p99) = warm_latency(demo::durable_router(
        Stores::new(MemoryStore::new()),
        &opts,
        Arc::default(),
    )?)
    .await?;
    let mut latencies: Vec<(&str, (Duration, Duration))> = Vec::new();
    let mut rates: Vec<(&str, f64, f64)> = Vec::new();
    for (name, stores, options) in [
        (
            "durable, memory event store",
            Some(Stores::new(MemoryStore::new())),
            &opts,
        ),
        (
            // Memory has nothing to sync: the same as synced, measured so
            // every level has a row on every backend.
            "durable, memory, written",
            Some(Stores::new(MemoryStore::new())),
            &written,
        ),
        (
            "durable, memory, pipelined",
            Some(Stores::new(MemoryStore::new())),
            &piped,
        ),
        (
            "durable, file event store",
            Some(file("file").await?),
            &opts,
        ),
        (
            "durable, file, written",
            Some(file("file-w").await?),
            &written,
        ),
        (
            "durable, file, pipelined",
            Some(file("file-p").await?),
            &piped,
        ),
        (
            "durable, sqlite event store",
            Some(sqlite("s.db").await?),
            &opts,
        ),
        (
            "durable, sqlite, written",
            Some(sqlite("sw.db").await?),
            &written,
        ),
        (
            "durable, sqlite, pipelined",
            Some(sqlite("sp.db").await?),
            &piped,
        ),
        (
            "durable, sqlite synchronous=NORMAL",
            Some(sqlite_normal("n.db").await?),
            &opts,
        ),
        (
            "durable, sqlite NORMAL, pipelined",
            Some(sqlite_normal("np.db").await?),
            &piped,
        ),
        ("durable, redis event store", redis().await?, &opts),
        ("durable, redis, written", redis().await?, &written),
        ("durable, redis, pipelined", redis().await?, &piped),
    ] {
        let Some(stores) = stores else { continue };
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        // Stock rmcp and the row measured back to back, ROW_ROUNDS times,
        // in alternating order (stock first in even rounds), each row's
        // figure the median over its rounds: the process slows as it serves
        // (see the row measured again last), and one pair measured once
        // read 0.70 and 0.88 for two configurations that are the same on
        // the memory store.
        let mut one = Figure::default();
        let mut many = Figure::default();
        for round in 0..ROW_ROUNDS {
            for durable in [round % 2 == 1, round % 2 == 0] {
                if durable {
                    one.durable.push(
                        progress_rate(demo::durable_router(
                            stores.clone(),
                            options,
                            Arc::default(),
                        )?)
                        .await?,
                    );
                    many.durable.push(
                        concurrent_rate(demo::durable_router(
                            stores.clone(),
                            options,
                            Arc::default(),
                        )?)
                        .await?,
                    );
                } else {
                    one.stock.push(
                        progress_rate(demo::rmcp_default_router(&opts, Arc::default())).await?,
                    );
                    many.stock.push(
                        concurrent_rate(demo::rmcp_default_router(&opts, Arc::default())).await?,
                    );
                }
            }
        }
        latencies.push((
            name,
            warm_latency(demo::durable_router(stores, options, Arc::default())?).await?,
        ));
        println!(
            "{name:<36} {:>12.0} {:>10.2} {:>16.0} {:>10.2}",
            median_rate(one.durable.clone()),
            one.ratio(),
            median_rate(many.durable.clone()),
            many.ratio()
        );
        rates.push((name, one.ratio(), many.ratio()));
    }
    // The baseline once more, last, against the first: how much a process
    // that has served every row above has slowed (heaps grow, stores keep
    // their events). Ratios against the first baseline alone understated
    // the rows measured late by as much.
    let baseline_last = progress_rate(demo::rmcp_default_router(&opts, Arc::default())).await?;
    let baseline_many_last =
        concurrent_rate(demo::rmcp_default_router(&opts, Arc::default())).await?;
    println!(
        "{:<36} {:>12.0} {:>10.2} {:>16.0} {:>10.2}",
        "rmcp in-memory defaults, last (drift)",
        baseline_last,
        baseline_last / baseline,
        baseline_many_last,
        baseline_many_last / baseline_many
    );

    println!();
    println!(
        "warm tools/list latency added over the in-memory event store (p50 {:.2} ms, p99 {:.2} ms; {WARM_REQUESTS} requests)",
        base_p50.as_secs_f64() * 1e3,
        base_p99.as_secs_f64() * 1e3
    );
    println!("{:<36} {:>12} {:>12}", "server", "p50 added", "p99 added");
    for &(name, (p50, p99)) in &latencies {
        println!(
            "{name:<36} {:>9.2} ms {:>9.2} ms",
            (p50.as_secs_f64() - base_p50.as_secs_f64()) * 1e3,
            (p99.as_secs_f64() - base_p99.as_secs_f64()) * 1e3
        );
    }

    // The issue's aims, against the in-memory event store of this run
    // (each row's ratio to its own stock baseline, over the memory row's).
    let rate_of = |name: &str| rates.iter().find(|r| r.0 == name).map(|r| (r.1, r.2));
    let latency_of = |name: &str| latencies.iter().find(|l| l.0 == name).map(|l| l.1);
    if let Some((memory_one, memory_many)) = rate_of("durable, memory event store") {
        println!();
        for name in [
            "durable, memory, pipelined",
            "durable, file, pipelined",
            "durable, sqlite, pipelined",
            "durable, redis, pipelined",
        ] {
            if let Some((one, _)) = rate_of(name) {
                let ratio = one / memory_one;
                println!(
                    "aim: {name}, one stream, at least 80% of the in-memory event store: {:.0}% ({})",
                    ratio * 100.0,
                    if ratio >= 0.8 { "met" } else { "not met" }
                );
            }
        }
        if let Some((_, many)) = rate_of("durable, sqlite event store") {
            let ratio = many / memory_many;
            println!(
                "aim: sqlite synced, 64 streams, at least 30% of the in-memory aggregate: {:.0}% ({})",
                ratio * 100.0,
                if ratio >= 0.3 { "met" } else { "not met" }
            );
        }
    }
    // Against what a user would run instead: stock rmcp with its in-memory
    // defaults, measured in this run.
    let against_stock = |name: &str, what: &str, ratio: f64, aim: f64| {
        println!(
            "aim: {name}, {what}, at least {aim:.2} of stock rmcp: {ratio:.2} ({})",
            if ratio >= aim { "met" } else { "not met" }
        );
    };
    if let Some((one, _)) = rate_of("durable, memory event store") {
        against_stock(
            "durable, memory event store",
            "events/s on one stream",
            one,
            0.95,
        );
    }
    for name in [
        "durable, file, pipelined",
        "durable, sqlite, pipelined",
        "durable, redis, pipelined",
    ] {
        if let Some((one, _)) = rate_of(name) {
            against_stock(name, "events/s on one stream", one, 0.85);
        }
    }
    if let Some((_, many)) = rate_of("durable, sqlite event store") {
        against_stock(
            "durable, sqlite synced",
            "events/s over 64 streams",
            many,
            0.6,
        );
    }
    if let Some((_, p99)) = latency_of("durable, sqlite, pipelined") {
        let added = p99.saturating_sub(base_p99);
        println!(
            "aim: sqlite pipelined p99 added request latency under 1 ms: {:.2} ms ({})",
            added.as_secs_f64() * 1e3,
            if added < Duration::from_millis(1) {
                "met"
            } else {
                "not met"
            }
        );
    }

    let (stored, encoded) = store_cost().await?;
    let per_event = 1e6 / baseline;
    println!(
        "per event on rmcp's session worker: store_event on the memory event store {stored:.2} µs (encoding the message alone {encoded:.2} µs); stock rmcp delivers an event every {per_event:.2} µs end to end"
    );
    // rmcp's session worker sends an event only once `store_event` has
    // returned: with its time added to every event's, one stream reads this
    // share of stock rmcp's rate, and the 0.95 aim leaves it this long.
    println!(
        "estimate: with store_event's time added to every event's, the memory event store would read {:.2} of stock rmcp on one stream; 0.95 leaves store_event {:.2} µs, {:.1} times what encoding the message alone takes",
        per_event / (per_event + stored),
        per_event * (1.0 / 0.95 - 1.0),
        per_event * (1.0 / 0.95 - 1.0) / encoded
    );
    if !only.is_empty() {
        return Ok(());
    }
    println!();
    println!(
        "cross-instance restore: median tools/list latency on the second instance ({RESTORES} sessions)"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>14}",
        "backend", "restoring", "warm", "added"
    );
    for (name, stores) in [
        ("memory", Some(Stores::new(MemoryStore::new()))),
        ("file", Some(file("file-r").await?)),
        ("sqlite", Some(sqlite("r.db").await?)),
        ("redis", redis().await?),
    ] {
        let Some(stores) = stores else { continue };
        let (restore, warm) = restore_latency(stores).await?;
        println!(
            "{name:<12} {:>11.2} ms {:>11.2} ms {:>11.2} ms",
            restore.as_secs_f64() * 1e3,
            warm.as_secs_f64() * 1e3,
            restore.saturating_sub(warm).as_secs_f64() * 1e3
        );
    }

    session_checks(&dir, &redis_url).await?;
    failovers(&dir).await
}

/// A durable server without an event store (so that event commits do not
/// hide the cost measured), with strict or coalesced sessions.
fn check_router(stores: Stores, strict: bool) -> anyhow::Result<axum::Router> {
    let server = mcp_persist_transport_http::server::DurableServer::builder(stores)
        .without_events()
        .strict_sessions(strict)
        .build()?;
    let service = server.service(|| Ok(demo::DemoHandler::new(Arc::default())));
    Ok(axum::Router::new().nest_service("/mcp", service))
}

/// Alternating rounds of the session check measurement.
const CHECK_ROUNDS: usize = 5;

/// Warm request latency with strict sessions (the default) against
/// coalesced ones (the opt-out), per backend (medians of alternating rounds).
async fn session_checks(dir: &tempfile::TempDir, redis_url: &Option<String>) -> anyhow::Result<()> {
    let sqlite = |name: &'static str| {
        let path = dir.path().join(name);
        async move {
            anyhow::Ok(Stores::new(
                mcp_persist_store_sqlite::SqliteStore::open(path).await?,
            ))
        }
    };
    let redis = || async {
        let Some(url) = redis_url.clone() else {
            return anyhow::Ok(None);
        };
        let store = mcp_persist_store_redis::RedisStore::standalone(url)
            .key_prefix(format!("bench-server-check:{}:", std::process::id()))
            .connect()
            .await?;
        anyhow::Ok(Some(Stores::new(store)))
    };
    println!();
    println!(
        "per-request session check: warm tools/list, strict sessions (the default: an ended session is gone everywhere at once) against coalesced (the opt-out), no event store, medians of {CHECK_ROUNDS} alternating rounds"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>14} {:>14}",
        "backend", "strict p50", "coalesced p50", "added p50", "added p99"
    );
    for (name, stores) in [
        ("memory", Some(Stores::new(MemoryStore::new()))),
        ("sqlite", Some(sqlite("check.db").await?)),
        ("redis", redis().await?),
    ] {
        let Some(stores) = stores else { continue };
        // Alternating rounds, medians: a loaded machine drifts between them.
        let (mut strict, mut lax) = (Vec::new(), Vec::new());
        for _ in 0..CHECK_ROUNDS {
            strict.push(warm_latency(check_router(stores.clone(), true)?).await?);
            lax.push(warm_latency(check_router(stores.clone(), false)?).await?);
        }
        let strict_p50 = median(strict.iter().map(|l| l.0).collect());
        let strict_p99 = median(strict.iter().map(|l| l.1).collect());
        let lax_p50 = median(lax.iter().map(|l| l.0).collect());
        let lax_p99 = median(lax.iter().map(|l| l.1).collect());
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{name:<12} {:>11.3} ms {:>11.3} ms {:>11.3} ms {:>11.3} ms",
            ms(strict_p50),
            ms(lax_p50),
            ms(strict_p50) - ms(lax_p50),
            ms(strict_p99) - ms(lax_p99)
        );
    }
    Ok(())
}

async fn failovers(dir: &tempfile::TempDir) -> anyhow::Result<()> {
    println!();
    println!(
        "failover: connections to A cut mid-call, until the first progress event through B (median of 3, SQLite)"
    );
    for (n, (name, retry)) in [("default retry (3 s)", None), ("200 ms retry", Some(200))]
        .into_iter()
        .enumerate()
    {
        let took = failover(&dir.path().join(format!("failover-{n}.db")), retry).await?;
        println!("{name:<24} {:>9.0} ms", took.as_secs_f64() * 1e3);
    }

    println!();
    println!(
        "killed instance: SIGKILL of A mid-call, until its client (moved to B) gets the re-issue error (median of 3, SQLite)"
    );
    let default_samples = killed(dir.path(), None).await?;
    let baseline_samples = killed(dir.path(), Some(3000)).await?;
    let default_kill = median(default_samples.clone());
    let baseline_kill = median(baseline_samples.clone());
    let all = |samples: &[Duration]| {
        samples
            .iter()
            .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{:<32} {:>9.0} ms (samples {} ms)",
        "default liveness grace",
        default_kill.as_secs_f64() * 1e3,
        all(&default_samples)
    );
    println!(
        "{:<32} {:>9.0} ms (samples {} ms; {:.2} times the default's)",
        "grace 3 s (the former default)",
        baseline_kill.as_secs_f64() * 1e3,
        all(&baseline_samples),
        baseline_kill.as_secs_f64() / default_kill.as_secs_f64()
    );
    println!(
        "aim: a killed instance's calls end within 2 s of the kill: {:.0} ms ({})",
        default_kill.as_secs_f64() * 1e3,
        if default_kill < Duration::from_secs(2) {
            "met"
        } else {
            "not met"
        }
    );

    println!();
    println!("live instance whose store writes stall 1 s mid-call (client replaying from B)");
    let mut kept_by_default = false;
    for (n, (name, grace)) in [
        ("default liveness grace", None),
        ("grace 750 ms (below the stall)", Some(750)),
    ]
    .into_iter()
    .enumerate()
    {
        let (kept, took) = stalled(
            &dir.path().join(format!("stall-{n}.db")),
            Duration::from_secs(1),
            grace,
        )
        .await?;
        if grace.is_none() {
            kept_by_default = kept;
        }
        println!(
            "{name:<32} {:<26} {:>7.0} ms after the stall began",
            if kept {
                "kept (its own result)"
            } else {
                "ended as if dead"
            },
            took.as_secs_f64() * 1e3
        );
    }
    println!(
        "aim: a live instance under a 1 s stall is never taken over: {}",
        if kept_by_default { "met" } else { "not met" }
    );
    Ok(())
}
