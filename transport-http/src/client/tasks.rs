//! Task watching: a request answered with a task (`CreateTaskResult`) is
//! journaled with its task id, so that a restarted process collects the
//! task instead of calling again; a `tasks/get` reporting the task ended
//! takes it out of the journal. In a session the request's journal entry
//! is keyed by its wire id; a server without sessions gets its task calls
//! journaled here, under the [sessionless](JournalScope::Sessionless)
//! journal.

use std::sync::Arc;

use futures::StreamExt;
use mcp_persist_core::RequestId;
use rmcp::{
    model::{
        ClientJsonRpcMessage, ClientRequest, NumberOrString, ServerJsonRpcMessage, ServerResult,
    },
    transport::streamable_http_client::StreamableHttpPostResponse,
};
use tracing::{debug, info};

use super::{
    answer::{StreamAnswer, TaskFields},
    delegate::PostResult,
    health::Health,
    journal::{JournalScope, JournalTx, Unwritten},
    keys,
};

/// What watching tasks needs: the journal, and whether it is still
/// written.
#[derive(Debug, Clone)]
pub(crate) struct TaskWatch {
    journal: JournalTx,
    health: Arc<Health>,
}

/// A `tools/call` sent to a server without sessions, journaled (under the
/// id its key gives) until it is answered.
pub(crate) struct ModernCall {
    /// rmcp's id (not renumbered: there is no session to be unique in).
    local: NumberOrString,
    /// Its journal entry's id.
    id: RequestId,
}

impl TaskWatch {
    pub(crate) fn new(journal: JournalTx, health: Arc<Health>) -> Self {
        TaskWatch { journal, health }
    }

    /// The request sent as `wire` in `scope` was answered with `task`:
    /// its journal entry keeps the task id, for a restarted process to
    /// collect the task.
    pub(crate) fn created(&self, scope: JournalScope, wire: i64, task: String) {
        debug!(request = wire, %task, "answered with a task; journaling its id");
        self.journal.task(scope, RequestId::Number(wire), task);
    }

    /// A `tasks/get` said `task` ended: the request answered with it
    /// leaves the journal of `scope`.
    pub(crate) fn ended(&self, scope: JournalScope, task: String) {
        debug!(%task, "tasks/get says the task ended; its request leaves the journal");
        self.journal.task_done(scope, task);
    }

    /// A `tools/call` to a server without sessions: given an idempotency
    /// key (unless it has one) and journaled before it is sent, so that a
    /// restarted process knows of it (`None` for anything else, or once
    /// the store has failed).
    pub(crate) fn eligible(&self, message: &mut ClientJsonRpcMessage) -> Option<ModernCall> {
        let ClientJsonRpcMessage::Request(request) = &*message else {
            return None;
        };
        if !matches!(request.request, ClientRequest::CallToolRequest(_))
            || !self.health.persisting()
        {
            return None;
        }
        let local = request.id.clone();
        let key = keys::ensure_key(message)?;
        let ClientJsonRpcMessage::Request(request) = &*message else {
            return None;
        };
        let id = keys::journal_id(&key);
        self.journal.record(
            JournalScope::Sessionless,
            Unwritten::new(id.clone(), request.request.clone()),
        );
        Some(ModernCall { local, id })
    }

    /// Follows the answers of a server without sessions: `call` answered
    /// with a task is journaled with its task id, and a `tasks/get`
    /// reporting a task ended takes it out again.
    pub(crate) fn watch<E>(
        &self,
        response: PostResult<E>,
        call: Option<ModernCall>,
    ) -> PostResult<E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match response {
            Ok(StreamableHttpPostResponse::Json(answer, sid)) => {
                let id = match &answer {
                    ServerJsonRpcMessage::Response(r) => Some(r.id.clone()),
                    ServerJsonRpcMessage::Error(e) => e.id.clone(),
                    _ => None,
                };
                // The 2026-07-28 shapes of task results are read as JSON
                // (rmcp types the 2025-11-25 ones).
                let task = match &answer {
                    ServerJsonRpcMessage::Response(r) => serde_json::to_value(&r.result)
                        .map(|result| TaskFields::of(&result))
                        .unwrap_or_default(),
                    _ => TaskFields::default(),
                };
                self.watch_answer(id, &task, call.as_ref());
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                let watch = self.clone();
                let stream = stream
                    .inspect(move |item| {
                        if let Ok(event) = item
                            && let Some(data) = event.data.as_deref()
                            && (data.contains("\"result\"") || data.contains("\"error\""))
                            && let Some(answer) = StreamAnswer::read(data)
                        {
                            watch.watch_answer(answer.id(), &answer.task(), call.as_ref());
                        }
                    })
                    .boxed();
                Ok(StreamableHttpPostResponse::Sse(stream, sid))
            }
            other => other,
        }
    }

    /// Closes the journal entry of `call` once `answer` answers it, or
    /// keeps the task id in it if the answer is a task; closes the entry of
    /// a task `answer` (to a `tasks/get`) reports ended.
    fn watch_answer(
        &self,
        id: Option<NumberOrString>,
        task: &TaskFields,
        call: Option<&ModernCall>,
    ) {
        if let Some(task) = task.ended() {
            self.ended(JournalScope::Sessionless, task);
            return;
        }
        let Some(call) = call else { return };
        if id.as_ref() != Some(&call.local) {
            return;
        }
        match task.created() {
            Some(task) => {
                info!(%task, "answered with a task; journaling it so a restarted process can collect it");
                self.journal
                    .task(JournalScope::Sessionless, call.id.clone(), task);
            }
            None => self
                .journal
                .complete(JournalScope::Sessionless, call.id.clone()),
        }
    }
}

/// The task id of an answer that is a `CreateTaskResult`.
pub(crate) fn created_task(answer: &ServerJsonRpcMessage) -> Option<String> {
    match answer {
        ServerJsonRpcMessage::Response(r) => match &r.result {
            ServerResult::CreateTaskResult(created) => Some(created.task.task_id.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The task id of an answer to `tasks/get` whose task ended (completed,
/// failed or cancelled).
pub(crate) fn ended_task(answer: &ServerJsonRpcMessage) -> Option<String> {
    match answer {
        ServerJsonRpcMessage::Response(r) => match &r.result {
            ServerResult::GetTaskResult(got) if got.task.status().is_terminal() => {
                Some(got.task.task.task_id.clone())
            }
            _ => None,
        },
        _ => None,
    }
}
