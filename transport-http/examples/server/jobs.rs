//! The demo's task operations: `long_job`, `fragile_job` and `ask_name`.

use std::time::Duration;

use mcp_persist_transport_http::server::{DurableTasksBuilder, TaskContext};
use rmcp::{
    ErrorData,
    model::{CallToolResult, ContentBlock},
    task_manager::{TaskExit, TaskFuture},
};

use super::options::Options;

/// Appends `line` to the runs file, if one was given.
pub(super) fn note_run(runs_file: Option<&std::path::Path>, line: &str) {
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
pub(super) fn job(
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
pub(super) fn name_question() -> serde_json::Value {
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
pub(super) fn greeting(answer: &serde_json::Value) -> CallToolResult {
    let name = answer["content"]["name"].as_str().unwrap_or("stranger");
    CallToolResult::success(vec![ContentBlock::text(format!("Hello, {name}!"))])
}

/// `ask_name` as a task: asks the client for a name through the task's
/// input requests, then greets. A client that did not declare elicitation
/// is refused by the runtime at once, and the task fails with that message.
pub(super) fn ask_name(cx: TaskContext) -> TaskFuture {
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
