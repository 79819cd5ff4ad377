#![allow(deprecated)] // Sampling is deprecated by SEP-2577 but still part of 2025-11-25, which this demo serves.
//! A durable rmcp Streamable HTTP server: run several of these on one store
//! and any of them serves any session.
//!
//! ```text
//! cargo run -p mcp-persist-transport-http --example server -- \
//!     --backend sqlite --store ./state.db --port 8080
//! ```
//!
//! `--help` lists the flags. The server names itself
//! `mcp-persist-example-server` with this crate's version in `serverInfo`.
//!
//! Tools: `slow_progress` (answers after `count` steps `delay_ms` apart,
//! sending a progress notification carrying `tag` at each step when the
//! client asked for progress with a progress token), `ask_sampling` (asks
//! the client to sample: a client that did not declare sampling gets a tool
//! error at once), `stats` (how many `initialize` requests this process
//! answered, and how many sessions it restored from the store) and `whoami`
//! (the name, version and capabilities of the client of this very request:
//! its `_meta` on 2026-07-28, the session's `initialize` before; and the
//! `Mcp-Session-Id` the handler was given, if any). The principal is read
//! from the `x-demo-user` header (a stand-in for real authentication).
//!
//! Task tools (2026-07-28 tasks extension, for clients that declare it):
//! `long_job` (`steps` steps of `step_ms`, resumable: if this instance dies,
//! another one runs it again), `fragile_job` (the same, not resumable: it
//! fails when its instance dies) and `ask_name` (asks the client for a name
//! through `tasks/update`, then greets; a client without the tasks extension
//! is asked directly, in a legacy session; a client that did not declare
//! elicitation gets an error at once), and `touch_tools` (announces a
//! tool list change on the fleet bus: every instance's `subscriptions/listen`
//! streams and legacy sessions hear it), and `touch_resource` (`uri`:
//! announces that resource changed; listen streams whose filter names it and
//! legacy sessions that `resources/subscribe`d to it hear it). With `--runs-file PATH` every start
//! and end of a task operation is appended to PATH as a line
//! `start|done <task id> <generation>`.
//!
//! It prints `LISTENING <address>` once it accepts connections.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use mcp_persist_core::{EventLogConfig, Stores};
use mcp_persist_transport_http::server::{
    DurableServer, DurableTasks, DurableTasksBuilder, FleetBus, MissingClientCapability,
    StreamableHttpServerConfig, TaskContext, client_accepts_tasks,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
        CreateMessageRequestParams, Implementation, InitializeRequestParams, InitializeResult,
        ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, SamplingMessage,
        ServerCapabilities, ServerConfig, ServerRequest, Tool,
    },
    service::RequestContext,
    task_manager::{TaskExit, TaskFuture, TaskOptions},
    transport::streamable_http_server::{
        StreamableHttpService,
        session::{SessionRestoreMarker, local::LocalSessionManager},
    },
};

/// Per-process counters, shared by every handler of the process.
#[derive(Debug, Default)]
pub struct Counters {
    /// `initialize` requests sent by clients.
    pub initialize: AtomicU64,
    /// `initialize` replays that restored a session from the store.
    pub restored: AtomicU64,
}

/// The demo handler.
#[derive(Clone)]
pub struct DemoHandler {
    counters: Arc<Counters>,
    tasks: Option<DurableTasks>,
    bus: Option<FleetBus>,
    /// The resources this session subscribed to (`resources/subscribe`);
    /// rmcp makes one handler per session, so this set is the session's.
    subscriptions: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl DemoHandler {
    /// A handler counting into `counters`.
    pub fn new(counters: Arc<Counters>) -> Self {
        DemoHandler {
            counters,
            tasks: None,
            bus: None,
            subscriptions: Arc::default(),
        }
    }

    /// The same handler, delivering fleet notices from `bus`.
    pub fn with_bus(mut self, bus: FleetBus) -> Self {
        self.bus = Some(bus);
        self
    }

    /// The same handler, running its task tools on `tasks`.
    pub fn with_tasks(mut self, tasks: DurableTasks) -> Self {
        self.tasks = Some(tasks);
        self
    }
}

/// Appends `line` to the runs file, if one was given.
fn note_run(runs_file: Option<&std::path::Path>, line: &str) {
    use std::io::Write as _;
    if let Some(path) = runs_file
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

/// `long_job` and `fragile_job`: `steps` steps of `step_ms`, each shown in
/// the status message; honours cancellation.
fn job(
    cx: TaskContext,
    args: serde_json::Value,
    runs_file: Option<std::path::PathBuf>,
) -> TaskFuture {
    Box::pin(async move {
        let steps = args["steps"].as_u64().unwrap_or(10).min(100_000);
        let step = Duration::from_millis(args["step_ms"].as_u64().unwrap_or(100).min(60_000));
        let tag = args["tag"].as_str().unwrap_or("").to_owned();
        note_run(
            runs_file.as_deref(),
            &format!("start {} {}", cx.task_id(), cx.generation()),
        );
        for i in 1..=steps {
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = cx.cancelled() => return Err(TaskExit::Cancelled),
            }
            if i % 5 == 0 || i == steps {
                cx.set_status_message(format!("step {i} of {steps}"))
                    .await?;
            }
        }
        note_run(
            runs_file.as_deref(),
            &format!("done {} {}", cx.task_id(), cx.generation()),
        );
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "job {tag} done after {steps} steps (run {})",
            cx.generation()
        ))]))
    })
}

/// The question `ask_name` puts to the client (an `elicitation/create`).
fn name_question() -> serde_json::Value {
    serde_json::json!({
        "method": "elicitation/create",
        "params": {
            "message": "What is your name?",
            "requestedSchema": {
                "type": "object",
                "properties": { "name": { "type": "string" } },
                "required": ["name"]
            }
        }
    })
}

/// The greeting for the client's answer to [`name_question`].
fn greeting(answer: &serde_json::Value) -> CallToolResult {
    let name = answer["content"]["name"].as_str().unwrap_or("stranger");
    CallToolResult::success(vec![ContentBlock::text(format!("Hello, {name}!"))])
}

/// `ask_name` as a task: asks the client for a name through the task's
/// input requests, then greets. A client that did not declare elicitation
/// is refused by the runtime at once, and the task fails with that message.
fn ask_name(cx: TaskContext) -> TaskFuture {
    Box::pin(async move {
        let request = serde_json::from_value(name_question())
            .map_err(|e| TaskExit::Error(ErrorData::internal_error(e.to_string(), None)))?;
        let answer = cx.request_input("name", request).await?;
        Ok(greeting(&answer))
    })
}

/// The demo's resumable operations, registered on every instance.
pub fn register_tasks(builder: DurableTasksBuilder, options: &Options) -> DurableTasksBuilder {
    let runs_file = options.runs_file.clone();
    builder.resumable("long_job", move |cx, args| job(cx, args, runs_file.clone()))
}

fn schema(value: serde_json::Value) -> Arc<serde_json::Map<String, serde_json::Value>> {
    match value {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

/// The arguments of `long_job` and `fragile_job`.
fn job_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "steps": {"type": "integer"},
            "step_ms": {"type": "integer"},
            "tag": {"type": "string"}
        }
    }))
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "slow_progress",
            "Answers after `count` steps `delay_ms` apart, with a progress notification at each step if the client sent a progress token.",
            schema(serde_json::json!({
                "type": "object",
                "properties": {
                    "count": {"type": "integer"},
                    "delay_ms": {"type": "integer"},
                    "tag": {"type": "string"}
                }
            })),
        ),
        Tool::new(
            "ask_sampling",
            "Asks the client to sample a reply to `prompt`.",
            schema(
                serde_json::json!({"type": "object", "properties": {"prompt": {"type": "string"}}}),
            ),
        ),
        Tool::new(
            "whoami",
            "The name, version and capabilities of this request's client, and the session id the handler sees.",
            schema(serde_json::json!({"type": "object"})),
        ),
        Tool::new(
            "long_job",
            "A task of `steps` steps of `step_ms`; another instance runs it again if this one dies.",
            job_schema(),
        ),
        Tool::new(
            "fragile_job",
            "Like long_job, but it fails when its instance dies.",
            job_schema(),
        ),
        Tool::new(
            "ask_name",
            "Asks the client for a name (as a task when the client declares tasks), then greets.",
            schema(serde_json::json!({"type": "object"})),
        ),
        Tool::new(
            "touch_tools",
            "Announces a tool list change to every listener of the fleet.",
            schema(serde_json::json!({"type": "object"})),
        ),
        Tool::new(
            "touch_resource",
            "Announces that the resource `uri` changed, to every subscriber of the fleet.",
            schema(serde_json::json!({
                "type": "object",
                "properties": { "uri": { "type": "string" } },
                "required": ["uri"]
            })),
        ),
        Tool::new(
            "stats",
            "Initialize requests answered and sessions restored by this process.",
            schema(serde_json::json!({"type": "object"})),
        ),
    ]
}

impl DemoHandler {
    fn task_runtime(&self) -> Result<&DurableTasks, ErrorData> {
        self.tasks.as_ref().ok_or_else(|| {
            ErrorData::internal_error("this server runs without a task runtime", None)
        })
    }

    async fn call_task_tool(
        &self,
        name: &str,
        args: serde_json::Map<String, serde_json::Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !client_accepts_tasks(context) {
            if name == "ask_name" {
                return ask_name_directly(context).await;
            }
            return Err(ErrorData::missing_required_client_capability(
                rmcp::model::ClientCapabilities::builder()
                    .enable_tasks()
                    .build(),
            ));
        }
        let tasks = self.task_runtime()?;
        let options = TaskOptions::default().with_poll_interval_ms(100);
        let args = serde_json::Value::Object(args);
        let created = match name {
            "long_job" => {
                tasks
                    .spawn_resumable(context, options, "long_job", args)
                    .await?
            }
            "fragile_job" => {
                tasks
                    .spawn(context, options, move |cx| job(cx, args, None))
                    .await?
            }
            _ => tasks.spawn(context, options, ask_name).await?,
        };
        Ok(CallToolResponse::Task(created))
    }
}

/// `ask_name` for a client without the tasks extension: the handler asks
/// the client itself (legacy sessions), then greets. A client that did not
/// declare elicitation gets a tool error at once; so does a 2026-07-28
/// client, which takes no server-to-client requests.
async fn ask_name_directly(
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let request: ServerRequest = serde_json::from_value(name_question())
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    match context.peer.send_request(request).await {
        Ok(rmcp::model::ClientResult::ElicitResult(answer)) => {
            let answer = serde_json::to_value(&answer)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            Ok(greeting(&answer).into())
        }
        Ok(_) => Err(ErrorData::internal_error(
            "the client answered the question with something else",
            None,
        )),
        Err(e) => Ok(peer_refusal("elicitation", &e)?.into()),
    }
}

/// The tool error for a request the client was not sent or did not answer:
/// a capability it never declared, or any refusal it answered with.
fn peer_refusal(what: &str, error: &rmcp::ServiceError) -> Result<CallToolResult, ErrorData> {
    if let Some(missing) = MissingClientCapability::from_service_error(error) {
        return Ok(missing.tool_error());
    }
    match error {
        rmcp::ServiceError::McpError(e) => Ok(CallToolResult::error(vec![ContentBlock::text(
            format!("{what} refused: {}", e.message),
        )])),
        other => Err(ErrorData::internal_error(format!("{what}: {other}"), None)),
    }
}

/// How the demo names itself in `serverInfo`.
pub fn server_info() -> Implementation {
    Implementation::new("mcp-persist-example-server", env!("CARGO_PKG_VERSION"))
        .with_title("mcp-persist example server")
}

impl ServerHandler for DemoHandler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_subscribe();
        let config = if self.tasks.is_some() {
            ServerConfig::new(capabilities.enable_tasks().build())
        } else {
            ServerConfig::new(capabilities.build())
        };
        config.with_server_info(server_info())
    }

    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .expect("the subscription set is never poisoned")
            .insert(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .expect("the subscription set is never poisoned")
            .remove(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        self.bus.as_ref().and_then(|_| FleetBus::accept(requested))
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
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
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.task_runtime()?.get_task(request, &context).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_runtime()?.update_task(request, &context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_runtime()?.cancel_task(request, &context).await
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
            // A legacy session hears list changes on its standalone stream,
            // and updates of the resources it subscribed to.
            let subscriptions = self.subscriptions.clone();
            bus.forward_to_peer(context.peer.clone(), move |uri| {
                subscriptions
                    .lock()
                    .expect("the subscription set is never poisoned")
                    .contains(uri)
            });
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

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        if matches!(
            request.name.as_ref(),
            "long_job" | "fragile_job" | "ask_name"
        ) {
            return self
                .call_task_tool(request.name.as_ref(), args, &context)
                .await;
        }
        let text = match request.name.as_ref() {
            "slow_progress" => {
                let count = args.get("count").and_then(|v| v.as_u64()).unwrap_or(10);
                let delay = Duration::from_millis(
                    args.get("delay_ms").and_then(|v| v.as_u64()).unwrap_or(10),
                );
                let tag = args
                    .get("tag")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_owned();
                // Progress goes only to a client that asked for it.
                let token = context.meta.get_progress_token();
                for i in 1..=count {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let Some(token) = &token else {
                        continue;
                    };
                    context
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), i as f64)
                                .with_total(count as f64)
                                .with_message(tag.clone()),
                        )
                        .await
                        .map_err(|e| ErrorData::internal_error(format!("progress: {e}"), None))?;
                }
                format!("done {tag}")
            }
            "ask_sampling" => {
                let prompt = args
                    .get("prompt")
                    .and_then(|v| v.as_str())
                    .unwrap_or("hello")
                    .to_owned();
                // No capability check here: the server refuses a request
                // the client did not declare at once, as a typed error.
                let reply = match context
                    .peer
                    .create_message(CreateMessageRequestParams::new(
                        vec![SamplingMessage::user_text(prompt)],
                        64,
                    ))
                    .await
                {
                    Ok(reply) => reply,
                    Err(e) => return Ok(peer_refusal("sampling", &e)?.into()),
                };
                let reply = serde_json::to_value(&reply.message)
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                format!("sampled {reply}")
            }
            // The request's own client: `_meta` on 2026-07-28 (where rmcp's
            // `peer.peer_info()` is a placeholder naming no real client),
            // the session's `initialize` before.
            "whoami" => serde_json::json!({
                "client": context.client_info().map(|info| info.name),
                "clientVersion": context.client_info().map(|info| info.version),
                "capabilities": context.client_capabilities(),
                "session": context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.headers.get("mcp-session-id"))
                    .and_then(|v| v.to_str().ok()),
            })
            .to_string(),
            "touch_tools" => {
                let bus = self.bus.as_ref().ok_or_else(|| {
                    ErrorData::internal_error("this server runs without a fleet bus", None)
                })?;
                bus.publish(mcp_persist_core::FleetNotice::ToolsListChanged)
                    .await
                    .map_err(|e| ErrorData::internal_error(format!("publishing: {e}"), None))?;
                "published".to_owned()
            }
            "touch_resource" => {
                let bus = self.bus.as_ref().ok_or_else(|| {
                    ErrorData::internal_error("this server runs without a fleet bus", None)
                })?;
                let uri = args
                    .get("uri")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| ErrorData::invalid_params("touch_resource needs a uri", None))?;
                bus.publish(mcp_persist_core::FleetNotice::ResourceUpdated {
                    uri: uri.to_owned(),
                })
                .await
                .map_err(|e| ErrorData::invalid_params(format!("publishing: {e}"), None))?;
                "published".to_owned()
            }
            "stats" => serde_json::json!({
                "initialize": self.counters.initialize.load(Ordering::SeqCst),
                "restored": self.counters.restored.load(Ordering::SeqCst),
            })
            .to_string(),
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

/// Command-line options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1 (0: any free one).
    pub port: u16,
    /// `memory`, `file`, `sqlite` or `redis`.
    pub backend: String,
    /// Database path for `sqlite`, directory for `file`, server URL for `redis`.
    pub store: Option<std::path::PathBuf>,
    /// Key prefix in Redis (instances of one deployment share it).
    pub redis_prefix: Option<String>,
    /// Session idle TTL.
    pub idle_ttl: Duration,
    /// SSE retry hint sent to clients.
    pub sse_retry: Duration,
    /// How long a resumed stream waits for new events.
    pub tail_idle: Duration,
    /// Serve with rmcp's in-memory defaults instead (the baseline).
    pub rmcp_defaults: bool,
    /// Event retention age.
    pub event_retention: Duration,
    /// Events kept per stream.
    pub event_max: u64,
    /// Check the session in the store on every request (`None`: the
    /// library's default, which does).
    pub strict_sessions: Option<bool>,
    /// How long an instance may go without a heartbeat before its streams
    /// and tasks are ended or taken over (`None`: the library's default).
    pub liveness_grace: Option<Duration>,
    /// Where task operations note their starts and ends.
    pub runs_file: Option<std::path::PathBuf>,
    /// Send events at once and commit them within 10 ms
    /// (`EventDurability::PIPELINED`) instead of committing each first.
    pub pipelined_events: bool,
    /// Commit each event before sending it, without syncing it to disk
    /// (`EventDurability::Written`).
    pub written_events: bool,
}

/// The flags, as `--help` prints them.
pub const USAGE: &str = "\
A durable MCP server (Streamable HTTP, protocol revisions 2025-11-25 and 2026-07-28)
on mcp-persist: run several on one store and any of them serves any session.

Usage: server [FLAGS]

Store:
  --backend memory|file|sqlite|redis  where state lives (default memory: this process only)
  --store PATH|URL              SQLite file, file-store directory, or redis://HOST:PORT/
  --redis-prefix P              key prefix in Redis (instances of one deployment share it)

Serving:
  --port N                      port on 127.0.0.1 (default 0: any free one)
  --idle-ttl-ms N               how long an unused session lives (default 1800000)
  --strict-sessions             read the session from the store on every request (the default)
  --coalesced-sessions          check the session in the store only every tenth of its idle TTL
  --sse-retry-ms N              SSE reconnection hint sent to clients (default 200)
  --tail-idle-ms N              how long a resumed stream waits for a new event (default 60000)
  --event-retention-ms N        how long events are kept for resumption (default 3600000)
  --event-max N                 events kept per stream (default 10000)
  --pipelined-events            send events at once, commit them within 10 ms
  --written-events              commit each event before sending it, without a disk sync
  --liveness-grace-ms N         how long an instance may miss its lease before its tasks
                                and streams are ended or taken over (default 1500)
  --runs-file PATH              append `start|done <task> <generation>` lines for task runs
  --rmcp-defaults               rmcp's in-memory session manager, no store (the baseline)

  -h, --help                    print this and exit

It prints `LISTENING <address>` once it accepts connections. RUST_LOG sets the log level
(logs go to stderr).
";

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    /// Serve with these options.
    Serve(Options),
    /// Print [`USAGE`] and exit.
    Help,
}

impl Command {
    /// Parses `args` (without the program name); `--help` or `-h` anywhere
    /// asks for the usage.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Command> {
        let args: Vec<String> = args.into_iter().collect();
        if args.iter().any(|a| a == "--help" || a == "-h") {
            return Ok(Command::Help);
        }
        Options::parse_flags(args).map(Command::Serve)
    }
}

impl Options {
    /// Parses `args` (without the program name) into options to serve with.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Options> {
        match Command::parse(args)? {
            Command::Serve(options) => Ok(options),
            Command::Help => anyhow::bail!("--help asks for the usage, not for a server"),
        }
    }

    fn parse_flags(args: Vec<String>) -> anyhow::Result<Options> {
        let mut o = Options {
            port: 0,
            backend: "memory".into(),
            store: None,
            redis_prefix: None,
            idle_ttl: Duration::from_secs(30 * 60),
            sse_retry: Duration::from_millis(200),
            tail_idle: Duration::from_secs(60),
            rmcp_defaults: false,
            event_retention: Duration::from_secs(60 * 60),
            event_max: 10_000,
            strict_sessions: None,
            liveness_grace: None,
            runs_file: None,
            pipelined_events: false,
            written_events: false,
        };
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            match flag.as_str() {
                "--rmcp-defaults" => o.rmcp_defaults = true,
                "--strict-sessions" => o.strict_sessions = Some(true),
                "--coalesced-sessions" => o.strict_sessions = Some(false),
                "--pipelined-events" => o.pipelined_events = true,
                "--written-events" => o.written_events = true,
                "--port"
                | "--backend"
                | "--store"
                | "--redis-prefix"
                | "--idle-ttl-ms"
                | "--sse-retry-ms"
                | "--tail-idle-ms"
                | "--event-retention-ms"
                | "--event-max"
                | "--liveness-grace-ms"
                | "--runs-file" => {
                    let value = args
                        .next()
                        .with_context(|| format!("{flag} needs a value"))?;
                    let number = |v: &str| -> anyhow::Result<u64> {
                        v.parse()
                            .with_context(|| format!("{flag} takes a whole number, not {v:?}"))
                    };
                    let ms = |v: &str| number(v).map(Duration::from_millis);
                    match flag.as_str() {
                        "--port" => {
                            o.port = u16::try_from(number(&value)?)
                                .with_context(|| format!("{flag} {value} is not a port"))?;
                        }
                        "--backend" => o.backend = value,
                        "--store" => o.store = Some(value.into()),
                        "--redis-prefix" => o.redis_prefix = Some(value),
                        "--idle-ttl-ms" => o.idle_ttl = ms(&value)?,
                        "--sse-retry-ms" => o.sse_retry = ms(&value)?,
                        "--tail-idle-ms" => o.tail_idle = ms(&value)?,
                        "--event-retention-ms" => o.event_retention = ms(&value)?,
                        "--event-max" => o.event_max = number(&value)?,
                        "--liveness-grace-ms" => o.liveness_grace = Some(ms(&value)?),
                        _ => o.runs_file = Some(value.into()),
                    }
                }
                other => anyhow::bail!("unknown flag {other}"),
            }
        }
        Ok(o)
    }
}

/// Opens the backend the options name.
pub async fn open_stores(options: &Options) -> anyhow::Result<Stores> {
    Ok(match options.backend.as_str() {
        "memory" => Stores::new(mcp_persist_core::MemoryStore::new()),
        "sqlite" => {
            let path = options
                .store
                .as_ref()
                .context("--backend sqlite needs --store PATH")?;
            Stores::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?)
        }
        "file" => {
            let path = options
                .store
                .as_ref()
                .context("--backend file needs --store DIR")?;
            Stores::new(mcp_persist_store_file::FileStore::open(path.clone()).await?)
        }
        "redis" => {
            let url = options
                .store
                .as_ref()
                .and_then(|p| p.to_str())
                .context("--backend redis needs --store redis://HOST:PORT/")?;
            let mut builder = mcp_persist_store_redis::RedisStore::standalone(url);
            if let Some(prefix) = &options.redis_prefix {
                builder = builder.key_prefix(prefix.clone());
            }
            Stores::new(builder.connect().await?)
        }
        other => anyhow::bail!("unknown backend {other} (memory, file, sqlite, redis)"),
    })
}

/// The durable server over `stores` the options describe.
pub fn durable_server(stores: Stores, options: &Options) -> anyhow::Result<DurableServer> {
    let http = StreamableHttpServerConfig::default().with_sse_retry(Some(options.sse_retry));
    let mut builder = DurableServer::builder(stores);
    if let Some(grace) = options.liveness_grace {
        builder = builder.liveness_grace(grace);
    }
    if let Some(strict) = options.strict_sessions {
        builder = builder.strict_sessions(strict);
    }
    let server = builder
        .idle_ttl(options.idle_ttl)
        .tail_idle(options.tail_idle)
        .event_retention(EventLogConfig::new(
            options.event_retention,
            options.event_max,
        ))
        .event_durability(if options.pipelined_events {
            mcp_persist_core::EventDurability::PIPELINED
        } else if options.written_events {
            mcp_persist_core::EventDurability::Written
        } else {
            mcp_persist_core::EventDurability::Synced
        })
        .http_config(http)
        .principal_from(|parts| {
            parts
                .headers
                .get("x-demo-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()?;
    Ok(server)
}

/// The router of a durable server over `stores`, counting into `counters`
/// (no task runtime).
pub fn durable_router(
    stores: Stores,
    options: &Options,
    counters: Arc<Counters>,
) -> anyhow::Result<axum::Router> {
    let server = durable_server(stores, options)?;
    let service = server.service(move || Ok(DemoHandler::new(counters.clone())));
    Ok(axum::Router::new().nest_service("/mcp", service))
}

/// The router of a durable server with its task runtime started.
pub async fn durable_router_with_tasks(
    stores: Stores,
    options: &Options,
    counters: Arc<Counters>,
) -> anyhow::Result<axum::Router> {
    let server = durable_server(stores, options)?;
    let tasks = register_tasks(server.tasks(), options).start().await?;
    let bus = server
        .fleet_bus(mcp_persist_core::BusRetention::default())
        .await?;
    let service = server.service(move || {
        Ok(DemoHandler::new(counters.clone())
            .with_tasks(tasks.clone())
            .with_bus(bus.clone()))
    });
    Ok(axum::Router::new().nest_service("/mcp", service))
}

/// The router of the baseline: the same handler on rmcp's in-memory defaults.
pub fn rmcp_default_router(options: &Options, counters: Arc<Counters>) -> axum::Router {
    let config = StreamableHttpServerConfig::default().with_sse_retry(Some(options.sse_retry));
    let service = StreamableHttpService::new(
        move || Ok(DemoHandler::new(counters.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// Serves until the process ends, printing `LISTENING <address>` first.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let counters = Arc::new(Counters::default());
    let router = if options.rmcp_defaults {
        rmcp_default_router(&options, counters)
    } else {
        let stores = open_stores(&options).await?;
        durable_router_with_tasks(stores, &options, counters).await?
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port)).await?;
    println!("LISTENING {}", listener.local_addr()?);
    // TCP_NODELAY: without it, a response written in two parts (headers,
    // then the first SSE event) waits for the client's delayed ACK, about
    // 40 ms on Linux.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).await?;
    Ok(())
}

/// `--help` prints the flags; a bad command line or a failure to serve is
/// one line on stderr (exit status 2 and 1), never a backtrace.
#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = match Command::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Ok(Command::Serve(options)) => options,
        Err(e) => {
            eprintln!("server: {e:#}\nRun `server --help` for the flags.");
            return std::process::ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(options).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
