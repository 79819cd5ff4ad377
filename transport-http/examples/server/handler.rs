//! The demo's MCP handler: its tools, and how each call is answered.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use mcp_persist_transport_http::server::{
    DurableTasks, FleetBus, MissingClientCapability, client_accepts_tasks,
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
    task_manager::TaskOptions,
    transport::streamable_http_server::session::SessionRestoreMarker,
};

use super::jobs::{ask_name, greeting, job, name_question, note_run};

/// Per-process counters, shared by every handler of the process.
#[derive(Debug, Default)]
pub struct Counters {
    /// `initialize` requests sent by clients.
    pub initialize: AtomicU64,
    /// `initialize` replays that restored a session from the store.
    pub restored: AtomicU64,
}

/// Runs of `charge` and `refresh` in this process: each answer names its
/// run, so a kept answer is told from a new run.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The demo handler.
#[derive(Clone)]
pub struct DemoHandler {
    counters: Arc<Counters>,
    /// Where `charge` and `refresh` note each run.
    runs_file: Option<std::path::PathBuf>,
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
            runs_file: None,
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

    /// The same handler, noting runs of `charge` and `refresh` in `path`.
    pub fn with_runs_file(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.runs_file = path;
        self
    }

    /// The same handler, running its task tools on `tasks`.
    pub fn with_tasks(mut self, tasks: DurableTasks) -> Self {
        self.tasks = Some(tasks);
        self
    }
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
            "charge",
            "Runs once per idempotency key (not safe to re-run): notes `charge TAG` in the runs file, waits `delay_ms`, answers which run it was.",
            schema(serde_json::json!({
                "type": "object",
                "properties": { "tag": {"type": "string"}, "delay_ms": {"type": "integer"} }
            })),
        ),
        Tool::new(
            "refresh",
            "Like charge, but declared safe to re-run when its instance stops mid-call.",
            schema(serde_json::json!({
                "type": "object",
                "properties": { "tag": {"type": "string"}, "delay_ms": {"type": "integer"} }
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
            "charge" | "refresh" => {
                let tag = args.get("tag").and_then(|v| v.as_str()).unwrap_or("");
                let delay = args.get("delay_ms").and_then(|v| v.as_u64()).unwrap_or(0);
                let run = RUNS.fetch_add(1, Ordering::Relaxed) + 1;
                note_run(
                    self.runs_file.as_deref(),
                    &format!("{} {tag}", request.name),
                );
                tokio::time::sleep(Duration::from_millis(delay.min(60_000))).await;
                format!(
                    "{} {tag}: run {run} of process {}",
                    request.name,
                    std::process::id()
                )
            }
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
