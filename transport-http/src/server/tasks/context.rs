//! What a running task operation holds: input requests, status messages and
//! cancellation, all through the shared task record.

use std::sync::Arc;

use mcp_persist_core::{TaskId, TaskUpdate};
use rmcp::{
    ErrorData,
    model::{ClientCapabilities, InputRequest},
    task_manager::TaskExit,
};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::Runtime;
use crate::server::capability::{ClientFeature, MissingClientCapability};
use tracing::warn;

/// Handle passed to a running task operation, as rmcp's `TaskContext` is:
/// ask the client for input mid-task, set the status message, and notice
/// cancellation, wherever the `tasks/update` or `tasks/cancel` arrived.
#[derive(Clone)]
pub struct TaskContext {
    pub(super) id: TaskId,
    pub(super) generation: u64,
    pub(super) runtime: Arc<Runtime>,
    pub(super) cancel: watch::Receiver<bool>,
}

impl std::fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskContext")
            .field("task_id", &self.id)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// A task operation stopped because its record moved on without it.
fn fenced() -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(
        "the task was taken over by another instance",
        None,
    ))
}

impl TaskContext {
    /// The id of the task.
    pub fn task_id(&self) -> &str {
        self.id.as_str()
    }

    /// Which run of the task this is: 1, or more after other instances took
    /// over a resumable task whose instance stopped.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Asks the client for input under `key` (unique over the task's life)
    /// and waits for the answer that `tasks/update` brings, on any instance.
    ///
    /// While requests are outstanding `tasks/get` reports `input_required`
    /// with them. When a resumed run asks again under a key the client has
    /// already answered, the stored answer is returned at once. A cancelled
    /// task gets [`TaskExit::Cancelled`].
    ///
    /// A request the client cannot answer, because it did not declare the
    /// capability (sampling, elicitation, roots) on the request that created
    /// the task, is refused at once, on whichever instance runs the task:
    /// the error is [`MissingClientCapability`]'s, as [`TaskExit::Error`]
    /// (an operation that passes it on with `?` ends the task `failed` with
    /// that message), and nothing is recorded.
    pub async fn request_input(
        &self,
        key: impl Into<String>,
        request: InputRequest,
    ) -> Result<Value, TaskExit> {
        let key = key.into();
        let feature = ClientFeature::of_input_request(&request);
        let request = serde_json::to_value(&request).map_err(|e| {
            TaskExit::Error(ErrorData::internal_error(
                format!("the input request does not serialize: {e}"),
                None,
            ))
        })?;
        let (tx, rx) = oneshot::channel();
        self.runtime.add_waiter(&self.id, &key, tx);
        let mut answered = None;
        let mut fenced_out = false;
        let mut reused = false;
        let mut missing = None;
        let generation = self.generation;
        let outcome = self
            .runtime
            .store
            .update(&self.id, |task| {
                fenced_out = task.owner.generation != generation;
                reused = false;
                answered = None;
                missing = None;
                if fenced_out {
                    return Ok(false);
                }
                // Records written before capabilities were kept: unknown,
                // so asked as before.
                if let Some(declared) = &task.client_capabilities {
                    let declared: ClientCapabilities = serde_json::from_value(declared.clone())
                        .map_err(|e| {
                            mcp_persist_core::Error::corrupt(
                                format!("task/{}", task.task_id),
                                format!("the stored client capabilities do not parse: {e}"),
                            )
                        })?;
                    if let Err(refusal) = MissingClientCapability::check(&declared, feature) {
                        missing = Some(refusal);
                        return Ok(false);
                    }
                }
                if let Some(answer) = task.input_responses.get(&key) {
                    answered = Some(answer.clone());
                    return Ok(false);
                }
                if task.input_requests.contains_key(&key) {
                    // Asked by an earlier run and still outstanding.
                    return Ok(false);
                }
                if !task.used_input_keys.insert(key.clone()) {
                    reused = true;
                    return Ok(false);
                }
                task.input_requests.insert(key.clone(), request.clone());
                Ok(true)
            })
            .await;
        let refusal = match outcome {
            Ok(_) if fenced_out => Some(fenced()),
            Ok(_) if missing.is_some() => missing.map(|m| {
                warn!(task = %self.id, key, capability = m.feature().capability(), "refused an input request the client declared no capability for");
                TaskExit::from(m)
            }),
            Ok(_) if reused => Some(TaskExit::Error(ErrorData::internal_error(
                format!("input key {key:?} was already used for this task"),
                None,
            ))),
            Ok(TaskUpdate::Updated(_) | TaskUpdate::Unchanged(_)) => None,
            Ok(_) => Some(TaskExit::Cancelled),
            Err(e) => Some(TaskExit::Error(ErrorData::internal_error(
                format!("recording the input request failed: {e}"),
                None,
            ))),
        };
        if let Some(refusal) = refusal {
            self.runtime.remove_waiter(&self.id, &key);
            return Err(refusal);
        }
        if let Some(answer) = answered {
            self.runtime.remove_waiter(&self.id, &key);
            return Ok(answer);
        }
        // Wake the watcher so it looks for answers that came before the
        // waiter was registered.
        self.runtime.poke(&self.id);
        let mut cancel = self.cancel.clone();
        tokio::select! {
            answer = rx => answer.map_err(|_| TaskExit::Cancelled),
            _ = async { let _ = cancel.wait_for(|c| *c).await; } => Err(TaskExit::Cancelled),
        }
    }

    /// Sets the status message `tasks/get` shows.
    pub async fn set_status_message(&self, message: impl Into<String>) -> Result<(), TaskExit> {
        let message = message.into();
        let generation = self.generation;
        match self
            .runtime
            .store
            .update(&self.id, |task| {
                if task.owner.generation != generation {
                    return Ok(false);
                }
                task.status_message = Some(message.clone());
                Ok(true)
            })
            .await
        {
            Ok(TaskUpdate::Updated(_)) => Ok(()),
            Ok(TaskUpdate::Unchanged(_)) => Err(fenced()),
            Ok(_) => Err(TaskExit::Cancelled),
            Err(e) => Err(TaskExit::Error(ErrorData::internal_error(
                format!("recording the status message failed: {e}"),
                None,
            ))),
        }
    }

    /// Whether `tasks/cancel` has reached this operation.
    pub fn is_cancel_requested(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Resolves once `tasks/cancel` has reached this operation. Pair it with
    /// `tokio::select!` and return [`TaskExit::Cancelled`] to settle the task
    /// `cancelled`.
    pub async fn cancelled(&self) {
        let mut cancel = self.cancel.clone();
        let _ = async { cancel.wait_for(|c| *c).await.is_ok() }.await;
    }
}
