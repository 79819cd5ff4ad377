//! Shared test fixtures: server instances (in-process or child processes
//! killed with SIGKILL), a switchable TCP load balancer, and rmcp clients.
#![allow(dead_code, deprecated, unreachable_pub)]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use mcp_persist_core::Stores;
use rmcp::{
    ClientHandler, ErrorData, RoleClient, ServiceExt,
    model::{
        ClientCapabilities, ClientInfo, CreateMessageRequestParams, CreateMessageResult,
        Implementation, ProgressNotificationParam, SamplingMessage,
    },
    service::{NotificationContext, RequestContext, RunningService},
    transport::{
        StreamableHttpClientTransport, common::client_side_sse::FixedInterval,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
};

#[path = "../../examples/server/main.rs"]
pub mod demo;

/// The environment variable that turns the test binary into a demo server.
pub const DEMO_ARGS_VAR: &str = "MCP_PERSIST_DEMO_SERVER_ARGS";

/// One server instance.
pub enum Instance {
    InProcess {
        addr: SocketAddr,
        task: JoinHandle<()>,
    },
    Process {
        addr: SocketAddr,
        child: tokio::process::Child,
    },
}

impl Instance {
    /// An in-process instance over `stores`.
    pub async fn in_process(stores: Stores, args: &[&str]) -> anyhow::Result<Instance> {
        let options = demo::Options::parse(args.iter().map(|s| s.to_string()))?;
        let counters = Arc::new(demo::Counters::default());
        let router = demo::durable_router(stores, &options, counters)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Instance::InProcess { addr, task })
    }

    /// A child process running the demo server (this test binary re-executed).
    pub async fn process(args: &[&str]) -> anyhow::Result<Instance> {
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .args([
                "--exact",
                "demo_server_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(DEMO_ARGS_VAR, args.join("\u{1f}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                // libtest may print "test demo_server_process ... " first.
                if let Some((_, addr)) = line.split_once("LISTENING ") {
                    return Ok::<_, anyhow::Error>(addr.trim().parse::<SocketAddr>()?);
                }
            }
            anyhow::bail!("demo server exited before listening")
        })
        .await
        .context("demo server did not start")??;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Instance::Process { addr, child })
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Instance::InProcess { addr, .. } | Instance::Process { addr, .. } => *addr,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr())
    }

    /// Ends the instance abruptly: SIGKILL for a process; for an in-process
    /// instance the server task is aborted, so it accepts nothing more.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        match self {
            Instance::InProcess { task, .. } => {
                task.abort();
                let _ = (&mut *task).await;
            }
            Instance::Process { child, .. } => {
                child.start_kill()?; // SIGKILL on unix
                child.wait().await?;
            }
        }
        Ok(())
    }
}

/// The name libtest knows test `name` of module `module` (its
/// `module_path!()`) by: the path without the crate's name, as `--exact`
/// wants it when a test re-executes its binary to run one test as a child.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, rest)) => format!("{rest}::{name}"),
        None => name.to_owned(),
    }
}

/// A 2026-07-28 request as `alice` (the demo server's `x-demo-user`), from a
/// client named `client` that declares the tasks extension, over raw HTTP;
/// the JSON-RPC response (the first SSE event that carries an `id`).
pub async fn rpc_as_alice(
    http: &reqwest::Client,
    url: &str,
    client: &str,
    method: &str,
    mut params: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": client, "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    });
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let text = http
        .post(url)
        .header("mcp-name", name)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("x-demo-user", "alice")
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    let message = if text.trim_start().starts_with('{') {
        text
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| d.contains("\"id\""))
            .with_context(|| format!("no response: {text}"))?
            .to_owned()
    };
    Ok(serde_json::from_str(&message)?)
}

/// Runs the demo server in this process when the test binary was started
/// as one (see [`Instance::process`]); returns `false` otherwise.
pub fn run_demo_server_if_asked() -> bool {
    let Ok(args) = std::env::var(DEMO_ARGS_VAR) else {
        return false;
    };
    let args: Vec<String> = args
        .split('\u{1f}')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async move { demo::run(demo::Options::parse(args)?).await });
    if let Err(e) = result {
        eprintln!("demo server failed: {e:#}");
        std::process::exit(1);
    }
    true
}

/// A TCP load balancer in front of the instances: every new connection goes
/// to the current target; `cut` drops every open connection.
pub struct Balancer {
    pub addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Balancer {
    pub async fn new(target: SocketAddr) -> anyhow::Result<Balancer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = Arc::new(Mutex::new(target));
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let target = target.clone();
            let connections = connections.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = *target.lock().expect("lock");
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(to).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().expect("lock").push(task);
                }
            }
        });
        Ok(Balancer {
            addr,
            target,
            connections,
            accept,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Sends new connections to `target`.
    pub fn switch(&self, target: SocketAddr) {
        *self.target.lock().expect("lock") = target;
    }

    /// Drops every open connection, as a crashed instance or a network cut would.
    pub fn cut(&self) {
        for task in self.connections.lock().expect("lock").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// One progress notification as a client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub message: Option<String>,
}

/// An rmcp client handler that declares sampling (answering "pong") and
/// reports progress notifications.
#[derive(Clone)]
pub struct TestClient {
    pub progress: mpsc::UnboundedSender<Progress>,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientInfo {
        let capabilities = ClientCapabilities::builder().enable_sampling().build();
        ClientInfo::new(capabilities, Implementation::new("mcp-persist-test", "1.0"))
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text("pong"),
            "test-model".into(),
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(Progress {
            progress: params.progress,
            message: params.message,
        });
    }
}

pub type Client = RunningService<RoleClient, TestClient>;

/// Connects an rmcp client to `url` as `user`.
pub async fn connect(
    url: &str,
    user: &str,
) -> anyhow::Result<(Client, mpsc::UnboundedReceiver<Progress>)> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-demo-user", user.parse()?);
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(0)
        .build()?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    let mut retry = FixedInterval::default();
    retry.max_times = Some(50);
    retry.duration = Duration::from_millis(100);
    config.retry_config = Arc::new(retry);
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let (tx, rx) = mpsc::unbounded_channel();
    let client = TestClient { progress: tx }.serve(transport).await?;
    Ok((client, rx))
}

/// Calls a demo tool and returns the text of its answer.
pub async fn call(client: &Client, name: &str, args: serde_json::Value) -> anyhow::Result<String> {
    let serde_json::Value::Object(args) = args else {
        anyhow::bail!("arguments must be an object");
    };
    let result = client
        .call_tool(rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(args))
        .await?;
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("");
    anyhow::ensure!(result.is_error != Some(true), "tool {name} failed: {text}");
    Ok(text)
}

/// The per-process counters reported by the demo's `stats` tool.
pub async fn stats(client: &Client) -> anyhow::Result<(u64, u64)> {
    let text = call(client, "stats", serde_json::json!({})).await?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    Ok((
        v["initialize"].as_u64().context("initialize")?,
        v["restored"].as_u64().context("restored")?,
    ))
}

/// Raw HTTP: an `initialize` as `user`; returns the session id.
pub async fn raw_initialize(
    http: &reqwest::Client,
    url: &str,
    user: &str,
) -> anyhow::Result<String> {
    raw_initialize_as(http, url, user, "raw").await
}

/// Raw HTTP: an `initialize` as `user` from a client named `client`
/// (protocol 2025-11-25, header and body agreeing); returns the session id.
pub async fn raw_initialize_as(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    client: &str,
) -> anyhow::Result<String> {
    let response = http
        .post(url)
        .header("x-demo-user", user)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            serde_json::json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": client, "version": "1"}}
            })
            .to_string(),
        )
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "initialize answered {}",
        response.status()
    );
    let session = response
        .headers()
        .get("mcp-session-id")
        .context("no session id")?
        .to_str()?
        .to_owned();
    let _ = response.text().await?;
    raw_post(
        http,
        url,
        user,
        &session,
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    Ok(session)
}

/// Raw HTTP: a POST on a session; returns status and body.
pub async fn raw_post(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    session: &str,
    body: serde_json::Value,
) -> anyhow::Result<(u16, String)> {
    let response = http
        .post(url)
        .header("x-demo-user", user)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// Raw HTTP: a resuming GET; returns status and body (read to its end).
pub async fn raw_resume(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    session: &str,
    last_event_id: &str,
) -> anyhow::Result<(u16, String)> {
    let response = http
        .get(url)
        .header("x-demo-user", user)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "text/event-stream")
        .header("last-event-id", last_event_id)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// The ids of the SSE events in `body` that carry data, in order: the
/// priming event that opens a resumed stream (the resumed-from id, empty
/// data) is not an event of the call.
pub fn event_ids(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| {
            event.lines().any(|l| {
                l.strip_prefix("data:")
                    .is_some_and(|d| !d.trim().is_empty())
            })
        })
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("id:")))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// A child process running one test of this binary (re-executed with
/// `--exact test`), with `env` set, that reports in JSON lines on stdout.
pub struct JsonChild {
    pub child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl JsonChild {
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> anyhow::Result<JsonChild> {
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().context("child stdout")?;
        Ok(JsonChild {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The next JSON line the child prints (libtest's own lines skipped).
    pub async fn json(&mut self) -> anyhow::Result<serde_json::Value> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .context("the child said nothing for a minute")??
                .context("the child ended")?;
            // libtest may print "test name ... " first, on the same line.
            if let Some(at) = line.find('{')
                && let Ok(value) = serde_json::from_str::<serde_json::Value>(&line[at..])
            {
                return Ok(value);
            }
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

/// The JSON-RPC response in a JSON or SSE body.
pub fn response_of(text: &str) -> anyhow::Result<serde_json::Value> {
    let message = if text.trim_start().starts_with('{') {
        text.to_owned()
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| d.contains("\"result\"") || d.contains("\"error\""))
            .with_context(|| format!("no response in {text}"))?
            .to_owned()
    };
    Ok(serde_json::from_str(&message)?)
}
