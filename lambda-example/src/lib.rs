//! An MCP server that runs as an AWS Lambda function, its state in
//! DynamoDB: `mcp-persist` with `--features server,dynamodb`, and the
//! `lambda_http` runtime.
//!
//! Every invocation may be a cold start, so every invocation is served by
//! a fresh [`DurableServer`]: a legacy session is restored from the table
//! (no `initialize` again), a `Last-Event-ID` replays the events another
//! invocation wrote, and tasks live in the table.
//!
//! # Buffered responses
//!
//! `lambda_http::run` returns a whole response: the body is collected
//! before the invocation ends. What that serves:
//!
//! * every JSON-RPC request on `POST`, 2025-11-25 sessions and 2026-07-28
//!   requests alike: its SSE stream (progress, notifications, the answer)
//!   ends with the answer, so it arrives whole, each event with its id;
//! * `GET` with `Last-Event-ID`: the stored events after it and, once the
//!   request ended, its answer;
//! * a stream that does not end by itself (the standalone `GET` stream, a
//!   `subscriptions/listen`, a tool still running) is cut after
//!   [`Settings::stream_window`]: the client gets what came by then and
//!   resumes with `Last-Event-ID` (every event is committed before it is
//!   sent, so nothing is lost, only late).
//!
//! Lambda's response streaming (`lambda_http::run_with_streaming_response`)
//! would send each event as it is written, so progress arrives live and a
//! listen stream stays open up to the function's timeout; it needs a
//! function URL with `InvokeMode: RESPONSE_STREAM`. The server and store
//! are the same either way.
//!
//! # Tasks
//!
//! Lambda freezes a function's process once it has answered, so work cannot
//! go on after a response. A task is created and committed by the
//! invocation that receives the `tools/call`, which answers at once and then
//! releases its instance lease. The next invocation that asks about the
//! task (`tasks/get`, `tasks/update`, `tasks/cancel`) finds its instance
//! gone, takes it over (it must be registered as resumable) and runs it
//! before answering, for up to [`Settings::task_budget`]; the client's next
//! poll collects the outcome. Work that does not fit in one budget is run
//! again from the start by the next poll: keep task work shorter than the
//! budget, or hand it to a queue.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use mcp_persist::{
    EventLogConfig, Liveness, Stores,
    rmcp::{
        ErrorData, RoleServer, ServerHandler,
        model::{
            CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
            InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
            ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
        },
        service::RequestContext,
        task_manager::{TaskExit, TaskFuture, TaskOptions},
        transport::streamable_http_server::session::SessionRestoreMarker,
    },
    server::{
        DurableServer, DurableTasks, DurableTasksBuilder, FleetBus, StreamableHttpServerConfig,
        TaskContext, client_accepts_tasks,
    },
};

/// What the function reads from its environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `MCP_STORE_URL`: where state lives, as a store URL
    /// (`dynamodb://TABLE?region=R`, `postgres://USER:PASS@HOST/DB`; any
    /// backend of the build).
    pub store_url: String,
    /// `MCP_ALLOWED_HOSTS`: the `Host` values accepted (the function URL's
    /// or the API's domain), comma-separated; rmcp refuses any other host
    /// to stop DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// `MCP_STREAM_WINDOW_MS`: how long a response stream that does not end
    /// by itself is collected (default 2000).
    pub stream_window: Duration,
    /// `MCP_TASK_BUDGET_MS`: how long an invocation that took a task over
    /// runs it before answering (default 10000).
    pub task_budget: Duration,
    /// `MCP_LIVENESS_GRACE_MS`: how long a stopped instance's lease is given
    /// before its streams and tasks are judged orphaned (default 3000).
    pub liveness_grace: Duration,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Settings> {
        let ms = |name: &str, default: u64| -> anyhow::Result<Duration> {
            match std::env::var(name) {
                Ok(v) => {
                    Ok(Duration::from_millis(v.trim().parse().with_context(
                        || format!("{name}={v:?} is not a whole number"),
                    )?))
                }
                Err(_) => Ok(Duration::from_millis(default)),
            }
        };
        let store_url = std::env::var("MCP_STORE_URL").context(
            "MCP_STORE_URL is not set: name the store, e.g. dynamodb://mcp-state?region=eu-west-1",
        )?;
        let allowed_hosts = std::env::var("MCP_ALLOWED_HOSTS")
            .unwrap_or_else(|_| "localhost,127.0.0.1".into())
            .split(',')
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .collect();
        Ok(Settings {
            store_url,
            allowed_hosts,
            stream_window: ms("MCP_STREAM_WINDOW_MS", 2000)?,
            task_budget: ms("MCP_TASK_BUDGET_MS", 10_000)?,
            liveness_grace: ms("MCP_LIVENESS_GRACE_MS", 3000)?,
        })
    }
}

/// Per-process counters, shared by every handler of the process.
#[derive(Debug, Default)]
pub struct Counters {
    /// `initialize` requests answered.
    pub initialize: AtomicU64,
    /// Sessions restored from the store (`initialize` replayed).
    pub restored: AtomicU64,
}

/// The example's tools.
#[derive(Clone)]
pub struct Handler {
    counters: Arc<Counters>,
    tasks: Option<DurableTasks>,
    bus: Option<FleetBus>,
}

fn schema(value: serde_json::Value) -> Arc<serde_json::Map<String, serde_json::Value>> {
    match value {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

fn tools() -> Vec<Tool> {
    let object = || schema(serde_json::json!({"type": "object"}));
    vec![
        Tool::new(
            "slow_progress",
            "Answers after `count` steps `delay_ms` apart, with a progress notification per step.",
            schema(serde_json::json!({
                "type": "object",
                "properties": { "count": {"type": "integer"}, "delay_ms": {"type": "integer"} }
            })),
        ),
        Tool::new(
            "whoami",
            "The client of this request (restored from the session, or from `_meta`).",
            object(),
        ),
        Tool::new(
            "stats",
            "This process: its id, the initialize requests it answered and the sessions it restored.",
            object(),
        ),
        Tool::new(
            "long_job",
            "A task of `steps` steps of `step_ms` (resumable: any instance runs it again).",
            schema(serde_json::json!({
                "type": "object",
                "properties": { "steps": {"type": "integer"}, "step_ms": {"type": "integer"} }
            })),
        ),
        Tool::new(
            "touch_tools",
            "Announces a tool list change to every instance on the fleet bus.",
            object(),
        ),
    ]
}

/// `long_job`: `steps` steps of `step_ms`, then a text naming the run.
fn long_job(cx: TaskContext, args: serde_json::Value) -> TaskFuture {
    Box::pin(async move {
        let steps = args["steps"].as_u64().unwrap_or(5).min(10_000);
        let step = Duration::from_millis(args["step_ms"].as_u64().unwrap_or(20).min(60_000));
        for i in 1..=steps {
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = cx.cancelled() => return Err(TaskExit::Cancelled),
            }
            if i == steps {
                cx.set_status_message(format!("step {i} of {steps}"))
                    .await?;
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "job done after {steps} steps (run {}, process {})",
            cx.generation(),
            std::process::id()
        ))]))
    })
}

/// Registers the resumable operations every instance knows.
pub fn register_tasks(builder: DurableTasksBuilder) -> DurableTasksBuilder {
    builder.resumable("long_job", long_job)
}

impl Handler {
    /// A handler counting into `counters`, with tasks and a bus if given.
    pub fn new(
        counters: Arc<Counters>,
        tasks: Option<DurableTasks>,
        bus: Option<FleetBus>,
    ) -> Self {
        Handler {
            counters,
            tasks,
            bus,
        }
    }

    fn task_runtime(&self) -> Result<&DurableTasks, ErrorData> {
        self.tasks
            .as_ref()
            .ok_or_else(|| ErrorData::internal_error("no task runtime", None))
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed();
        let config = if self.tasks.is_some() {
            ServerConfig::new(capabilities.enable_tasks().build())
        } else {
            ServerConfig::new(capabilities.build())
        };
        config.with_server_info(Implementation::new(
            "mcp-persist-lambda-example",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if context.extensions.get::<SessionRestoreMarker>().is_some() {
            self.counters.restored.fetch_add(1, Ordering::SeqCst);
        } else {
            self.counters.initialize.fetch_add(1, Ordering::SeqCst);
        }
        context.peer.set_peer_info(request.clone());
        if let Some(bus) = &self.bus {
            bus.forward_to_peer(context.peer.clone(), |_| false);
        }
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &mcp_persist::rmcp::model::SubscriptionFilter,
    ) -> Option<mcp_persist::rmcp::model::SubscriptionFilter> {
        self.bus.as_ref().and_then(|_| FleetBus::accept(requested))
    }

    async fn listen(
        &self,
        context: mcp_persist::rmcp::service::SubscriptionContext,
    ) -> Result<(), ErrorData> {
        match &self.bus {
            Some(bus) => bus.listen(context).await,
            None => {
                context.cancelled().await;
                Ok(())
            }
        }
    }

    async fn get_task(
        &self,
        request: mcp_persist::rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<mcp_persist::rmcp::model::GetTaskResult, ErrorData> {
        self.task_runtime()?.get_task(request, &context).await
    }

    async fn update_task(
        &self,
        request: mcp_persist::rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_runtime()?.update_task(request, &context).await
    }

    async fn cancel_task(
        &self,
        request: mcp_persist::rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_runtime()?.cancel_task(request, &context).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let text = match request.name.as_ref() {
            "long_job" => {
                if !client_accepts_tasks(&context) {
                    return Err(ErrorData::invalid_params(
                        "long_job runs as a task: declare the tasks extension",
                        None,
                    ));
                }
                let created = self
                    .task_runtime()?
                    .spawn_resumable(
                        &context,
                        TaskOptions::default().with_poll_interval_ms(100),
                        "long_job",
                        serde_json::Value::Object(args),
                    )
                    .await?;
                return Ok(CallToolResponse::Task(created));
            }
            "slow_progress" => {
                let count = args.get("count").and_then(|v| v.as_u64()).unwrap_or(3);
                let delay = Duration::from_millis(
                    args.get("delay_ms").and_then(|v| v.as_u64()).unwrap_or(10),
                );
                let token = context.meta.get_progress_token();
                for i in 1..=count {
                    tokio::time::sleep(delay).await;
                    if let Some(token) = &token {
                        context
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), i as f64)
                                    .with_total(count as f64),
                            )
                            .await
                            .map_err(|e| {
                                ErrorData::internal_error(format!("progress: {e}"), None)
                            })?;
                    }
                }
                format!("done after {count} steps")
            }
            "whoami" => serde_json::json!({
                "client": context.client_info().map(|info| info.name),
                "clientVersion": context.client_info().map(|info| info.version),
            })
            .to_string(),
            "stats" => serde_json::json!({
                "process": std::process::id(),
                "initialize": self.counters.initialize.load(Ordering::SeqCst),
                "restored": self.counters.restored.load(Ordering::SeqCst),
            })
            .to_string(),
            "touch_tools" => {
                let bus = self
                    .bus
                    .as_ref()
                    .ok_or_else(|| ErrorData::internal_error("no fleet bus here", None))?;
                bus.publish(mcp_persist::FleetNotice::ToolsListChanged)
                    .await
                    .map_err(|e| ErrorData::internal_error(format!("publishing: {e}"), None))?;
                "published".to_owned()
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

/// The durable server over `stores`, as every instance builds it.
pub fn durable_server(stores: Stores, settings: &Settings) -> anyhow::Result<DurableServer> {
    let mut http =
        StreamableHttpServerConfig::default().with_sse_retry(Some(Duration::from_millis(200)));
    http.allowed_hosts = settings.allowed_hosts.clone();
    Ok(DurableServer::builder(stores)
        .idle_ttl(Duration::from_secs(30 * 60))
        .event_retention(EventLogConfig::new(Duration::from_secs(3600), 1000))
        .liveness_grace(settings.liveness_grace)
        .tail_idle(settings.stream_window)
        .http_config(http)
        .principal_from(|parts| {
            parts
                .headers
                .get("x-demo-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()?)
}

/// The JSON-RPC method of a request body, if it is one request.
fn method_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("method")?.as_str().map(str::to_owned)
}

/// The function: the store opened once per process (on its first
/// invocation), a fresh server instance per invocation.
pub struct Function {
    settings: Settings,
    stores: tokio::sync::OnceCell<Stores>,
    counters: Arc<Counters>,
}

impl Function {
    /// A function with these settings; nothing is opened yet.
    pub fn new(settings: Settings) -> Self {
        Function {
            settings,
            stores: tokio::sync::OnceCell::new(),
            counters: Arc::default(),
        }
    }

    /// A function over `stores` already open (tests and benchmarks that
    /// count the store's requests).
    pub fn with_stores(settings: Settings, stores: Stores) -> Self {
        Function {
            settings,
            stores: tokio::sync::OnceCell::new_with(Some(stores)),
            counters: Arc::default(),
        }
    }

    async fn stores(&self) -> anyhow::Result<Stores> {
        let stores = self
            .stores
            .get_or_try_init(|| async {
                mcp_persist::open(&self.settings.store_url)
                    .await
                    .with_context(|| {
                        format!(
                            "opening the store {}",
                            mcp_persist::registry::redact(&self.settings.store_url)
                        )
                    })
            })
            .await?;
        Ok(stores.clone())
    }

    /// Serves one invocation: the request through a fresh durable server
    /// instance, its response collected (see the crate docs), the tasks it
    /// took over run within the budget, and its lease released, all before
    /// the answer leaves: the process may be frozen or gone right after.
    pub async fn invoke(
        &self,
        request: http::Request<Bytes>,
    ) -> anyhow::Result<http::Response<Bytes>> {
        let stores = self.stores().await?;
        let method = method_of(request.body());
        let server = durable_server(stores.clone(), &self.settings)?;
        let tasks = register_tasks(server.tasks()).start().await?;
        let handler = Handler::new(self.counters.clone(), Some(tasks.clone()), None);
        let mut service = server.service(move || Ok(handler.clone()));
        let request: http::Request<Full<Bytes>> = request.map(Full::new);
        std::future::poll_fn(|cx| {
            tower_service::Service::<http::Request<Full<Bytes>>>::poll_ready(&mut service, cx)
        })
        .await
        .map_err(|e| anyhow::anyhow!("the server is not ready: {e:?}"))?;
        let response = tower_service::Service::call(&mut service, request)
            .await
            .map_err(|e| anyhow::anyhow!("serving the request failed: {e:?}"))?;
        let (parts, mut body) = response.into_parts();
        let mut collected = Vec::new();
        let deadline = tokio::time::Instant::now() + self.settings.stream_window;
        loop {
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        collected.extend_from_slice(&data);
                    }
                }
                Ok(Some(Err(_))) | Ok(None) => break,
                Err(_) => {
                    tracing::debug!(
                        "response stream cut at the stream window; the client resumes with Last-Event-ID"
                    );
                    break;
                }
            }
        }
        drop(body);
        if matches!(
            method.as_deref(),
            Some("tasks/get" | "tasks/update" | "tasks/cancel" | "tasks/result")
        ) {
            let deadline = tokio::time::Instant::now() + self.settings.task_budget;
            while tasks.running_here() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let instance = tasks.instance_id().to_owned();
        tasks.shutdown().await;
        // The release is written by a background task: wait for it, so the
        // next invocation sees this instance gone.
        let leases = stores.instance_leases(self.settings.liveness_grace);
        for _ in 0..200 {
            if leases.observe(&instance).await? == Liveness::Dead {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(http::Response::from_parts(parts, Bytes::from(collected)))
    }
}

/// The same server as one long-lived HTTP process: one instance with its
/// task runtime and fleet bus. Prints `LISTENING <address>` once it accepts
/// connections.
pub async fn serve_http(settings: Settings, listen: &str) -> anyhow::Result<()> {
    let stores = mcp_persist::open(&settings.store_url).await?;
    let server = durable_server(stores, &settings)?;
    let tasks = register_tasks(server.tasks()).start().await?;
    let bus = server
        .fleet_bus(mcp_persist::BusRetention::default())
        .await?;
    let counters = Arc::new(Counters::default());
    let service = server.service(move || {
        Ok(Handler::new(
            counters.clone(),
            Some(tasks.clone()),
            Some(bus.clone()),
        ))
    });
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("LISTENING {}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).await?;
    Ok(())
}
