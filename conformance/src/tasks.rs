//! The tasks-extension fixtures (SEP-2663, `tasks-*` scenarios): tools that
//! run as tasks, on mcp-persist's durable task runtime (SQLite run) or on
//! rmcp's in-memory `TaskManager` (the baseline run).
//!
//! | tool | task support | what it does |
//! |---|---|---|
//! | `greet` | none | `Hello, {name}!` at once |
//! | `slow_compute` | optional | sleeps `seconds`, then answers; honours cancel |
//! | `failing_job` | required | a tool error after about a second |
//! | `protocol_error_job` | required | a protocol-level error |
//! | `confirm_delete` | required | asks one elicitation, then answers |
//! | `multi_input` | required | asks two elicitations at once |
//! | `test_tool_with_task` | required | asks `user_name` by multi round-trip, then a task greets |

use std::{future::Future, time::Duration};

use mcp_persist_transport_http::server::{self as durable, DurableTasks, DurableTasksBuilder};
use rmcp::{
    ErrorData, RoleServer,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        ClientCapabilities, CreateTaskResult, GetTaskParams, GetTaskResult, InputRequest,
        InputRequests, InputRequiredResult, UpdateTaskParams,
    },
    service::RequestContext,
    task_manager::{TaskExit, TaskFuture, TaskManager, TaskOptions},
};
use serde_json::{Value, json};

use crate::literal::{complete_result, decode};

/// The tools, for `tools/list`.
pub(crate) fn tools() -> Value {
    let tool = |name: &str, description: &str, properties: Value, support: &str| {
        json!({
            "name": name,
            "description": description,
            "inputSchema": { "type": "object", "properties": properties },
            "execution": { "taskSupport": support }
        })
    };
    json!([
        tool(
            "greet",
            "Greets at once",
            json!({ "name": { "type": "string" } }),
            "forbidden"
        ),
        tool(
            "slow_compute",
            "Sleeps for `seconds`, then answers",
            json!({ "seconds": { "type": "number" }, "label": { "type": "string" } }),
            "optional"
        ),
        tool(
            "failing_job",
            "Reports a tool error after a second",
            json!({}),
            "required"
        ),
        tool(
            "protocol_error_job",
            "Fails with a protocol error",
            json!({}),
            "required"
        ),
        tool(
            "confirm_delete",
            "Asks to confirm, then deletes",
            json!({ "filename": { "type": "string" } }),
            "required"
        ),
        tool(
            "multi_input",
            "Asks two questions at once",
            json!({}),
            "required"
        ),
        tool(
            "test_tool_with_task",
            "Asks a name, then greets from a task",
            json!({}),
            "required"
        ),
    ])
}

/// What a task operation needs from either runtime's context.
pub(crate) trait Asker: Clone + Send + Sync + 'static {
    fn ask(
        &self,
        key: &str,
        request: InputRequest,
    ) -> impl Future<Output = Result<Value, TaskExit>> + Send;
    fn cancelled(&self) -> impl Future<Output = ()> + Send;
}

impl Asker for rmcp::task_manager::TaskContext {
    fn ask(
        &self,
        key: &str,
        request: InputRequest,
    ) -> impl Future<Output = Result<Value, TaskExit>> + Send {
        self.request_input(key.to_owned(), request)
    }
    fn cancelled(&self) -> impl Future<Output = ()> + Send {
        rmcp::task_manager::TaskContext::cancelled(self)
    }
}

impl Asker for durable::TaskContext {
    fn ask(
        &self,
        key: &str,
        request: InputRequest,
    ) -> impl Future<Output = Result<Value, TaskExit>> + Send {
        self.request_input(key.to_owned(), request)
    }
    fn cancelled(&self) -> impl Future<Output = ()> + Send {
        durable::TaskContext::cancelled(self)
    }
}

fn text(text: String) -> Result<CallToolResult, TaskExit> {
    complete_result(json!({ "content": [{ "type": "text", "text": text }] }))
        .map_err(TaskExit::Error)
}

fn elicitation(message: &str, field: &str, kind: &str) -> Result<InputRequest, TaskExit> {
    decode(json!({
        "method": "elicitation/create",
        "params": {
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": { field: { "type": kind } },
                "required": [field]
            }
        }
    }))
    .map_err(TaskExit::Error)
}

fn accepted(answer: &Value) -> bool {
    answer["action"].as_str() == Some("accept")
}

fn seconds(args: &Value, default: f64) -> Duration {
    let s = args["seconds"]
        .as_f64()
        .unwrap_or(default)
        .clamp(0.0, 600.0);
    Duration::from_secs_f64(s)
}

/// The operations behind the task tools, by name.
pub(crate) const OPERATIONS: [&str; 6] = [
    "slow_compute",
    "failing_job",
    "protocol_error_job",
    "confirm_delete",
    "multi_input",
    "test_tool_with_task",
];

/// Runs operation `name` with `args` under context `cx`.
pub(crate) fn operation<C: Asker>(name: &str, cx: C, args: Value) -> TaskFuture {
    let name = name.to_owned();
    Box::pin(async move {
        match name.as_str() {
            "slow_compute" => {
                let label = args["label"].as_str().unwrap_or("task").to_owned();
                let wait = seconds(&args, 1.0);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => text(format!("Computed {label} in {:.1} s", wait.as_secs_f64())),
                    _ = cx.cancelled() => Err(TaskExit::Cancelled),
                }
            }
            "failing_job" => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cx.cancelled() => return Err(TaskExit::Cancelled),
                }
                complete_result(json!({
                    "content": [{ "type": "text", "text": "the job failed: no such input" }],
                    "isError": true
                }))
                .map_err(TaskExit::Error)
            }
            "protocol_error_job" => Err(TaskExit::Error(ErrorData::internal_error(
                "protocol_error_job fails with a protocol error, as the scenario asks",
                None,
            ))),
            "confirm_delete" => {
                let file = args["filename"].as_str().unwrap_or("the file").to_owned();
                let answer = cx
                    .ask(
                        "confirm_delete",
                        elicitation(&format!("Delete {file}?"), "confirm", "boolean")?,
                    )
                    .await?;
                if accepted(&answer) {
                    text(format!("Deleted {file}"))
                } else {
                    text(format!("Kept {file}"))
                }
            }
            "multi_input" => {
                let (first, second) = tokio::join!(
                    cx.ask("first_name", elicitation("First name?", "name", "string")?),
                    cx.ask(
                        "second_name",
                        elicitation("Second name?", "name", "string")?
                    ),
                );
                let name = |v: &Value| v["content"]["name"].as_str().unwrap_or("?").to_owned();
                text(format!("Got {} and {}", name(&first?), name(&second?)))
            }
            "test_tool_with_task" => {
                let user = args["user_name"].as_str().unwrap_or("stranger").to_owned();
                tokio::time::sleep(Duration::from_millis(200)).await;
                text(format!("Hello, {user}! (from a task)"))
            }
            other => Err(TaskExit::Error(ErrorData::invalid_params(
                format!("no task operation {other:?}"),
                None,
            ))),
        }
    })
}

/// Where the fixture server's tasks live.
#[derive(Clone)]
pub enum TaskRuntime {
    /// rmcp's in-memory task manager: one process.
    Rmcp(TaskManager),
    /// mcp-persist's durable runtime on the shared store.
    Durable(DurableTasks),
}

impl std::fmt::Debug for TaskRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskRuntime::Rmcp(_) => f.write_str("TaskRuntime::Rmcp"),
            TaskRuntime::Durable(d) => write!(f, "TaskRuntime::Durable({d:?})"),
        }
    }
}

/// Registers every fixture operation as resumable on a durable runtime.
pub fn register(mut builder: DurableTasksBuilder) -> DurableTasksBuilder {
    for name in OPERATIONS {
        builder = builder.resumable(name, move |cx, args| operation(name, cx, args));
    }
    builder
}

fn missing_tasks_capability() -> ErrorData {
    ErrorData::missing_required_client_capability(
        ClientCapabilities::builder().enable_tasks().build(),
    )
}

impl TaskRuntime {
    async fn spawn(
        &self,
        cx: &RequestContext<RoleServer>,
        name: &'static str,
        args: Value,
    ) -> Result<CreateTaskResult, ErrorData> {
        let options = TaskOptions::default().with_poll_interval_ms(200);
        match self {
            TaskRuntime::Rmcp(manager) => {
                let task = manager.spawn(options, move |tcx| operation(name, tcx, args));
                Ok(CreateTaskResult::new(task))
            }
            TaskRuntime::Durable(tasks) => tasks.spawn_resumable(cx, options, name, args).await,
        }
    }

    /// Answers a `tools/call` of a task tool, or `None` for other tools.
    pub(crate) async fn call_tool(
        &self,
        request: &CallToolRequestParams,
        cx: &RequestContext<RoleServer>,
    ) -> Option<Result<CallToolResponse, ErrorData>> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let accepts = durable::client_accepts_tasks(cx);
        let name: &'static str = match request.name.as_ref() {
            "greet" => {
                let who = args["name"].as_str().unwrap_or("World");
                return Some(
                    complete_result::<CallToolResult>(json!({
                        "content": [{ "type": "text", "text": format!("Hello, {who}!") }]
                    }))
                    .map(Into::into),
                );
            }
            "slow_compute" if !accepts => {
                // Optional task support: without the extension it runs in line.
                tokio::time::sleep(seconds(&args, 1.0)).await;
                let label = args["label"].as_str().unwrap_or("task");
                return Some(
                    complete_result::<CallToolResult>(json!({
                        "content": [{ "type": "text", "text": format!("Computed {label}") }]
                    }))
                    .map(Into::into),
                );
            }
            "slow_compute" => "slow_compute",
            "failing_job" => "failing_job",
            "protocol_error_job" => "protocol_error_job",
            "confirm_delete" => "confirm_delete",
            "multi_input" => "multi_input",
            "test_tool_with_task" => "test_tool_with_task",
            _ => return None,
        };
        if !accepts {
            return Some(Err(missing_tasks_capability()));
        }
        let args = if name == "test_tool_with_task" {
            let user = request
                .input_responses
                .as_ref()
                .and_then(|r| r.get("user_name"))
                .filter(|a| accepted(a))
                .and_then(|a| a["content"]["name"].as_str().map(str::to_owned));
            match user {
                Some(user) => json!({ "user_name": user }),
                None => {
                    // Round one: gather the name before any task exists.
                    let ask = || -> Result<CallToolResponse, ErrorData> {
                        let requests: InputRequests = decode(json!({
                            "user_name": {
                                "method": "elicitation/create",
                                "params": {
                                    "message": "What is your name?",
                                    "requestedSchema": {
                                        "type": "object",
                                        "properties": { "name": { "type": "string" } },
                                        "required": ["name"]
                                    }
                                }
                            }
                        }))?;
                        Ok(InputRequiredResult::new(Some(requests), None).into())
                    };
                    return Some(ask());
                }
            }
        } else {
            args
        };
        Some(self.spawn(cx, name, args).await.map(CallToolResponse::Task))
    }

    pub(crate) async fn get_task(
        &self,
        params: GetTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        match self {
            TaskRuntime::Rmcp(manager) => manager.get_task(&params.task_id).map(GetTaskResult::new),
            TaskRuntime::Durable(tasks) => tasks.get_task(params, cx).await,
        }
    }

    pub(crate) async fn update_task(
        &self,
        params: UpdateTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self {
            TaskRuntime::Rmcp(manager) => {
                manager.update_task(&params.task_id, params.input_responses)
            }
            TaskRuntime::Durable(tasks) => tasks.update_task(params, cx).await,
        }
    }

    pub(crate) async fn cancel_task(
        &self,
        params: CancelTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self {
            TaskRuntime::Rmcp(manager) => manager.cancel_task(&params.task_id),
            TaskRuntime::Durable(tasks) => tasks.cancel_task(params, cx).await,
        }
    }
}
