//! Collecting the result of an interrupted request the server answered
//! with a task, by polling `tasks/get`.

use std::{sync::Arc, time::Duration};

use mcp_persist_core::InFlightRequest;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, DetailedTask, ErrorCode, ErrorData, GetTaskParams,
    GetTaskRequest, InputRequests, NumberOrString, ServerJsonRpcMessage, ServerResult, TaskPayload,
};
use rmcp::{RoleClient, ServiceError, service::Peer};
use serde_json::Value;
use tokio::time::Instant;
use tracing::{Instrument, debug, info};

use super::{RecoveredAnswer, Recoverer, RecoveryError, recovery_span};
use crate::client::{headers::version_headers, journal::JournalScope, wire::WireError};

/// Where a recovered task stands once [`RecoveredTask::collect`] returns.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[expect(
    clippy::large_enum_variant,
    reason = "one per collected task; a box would only get in the way of matching"
)]
pub enum TaskOutcome {
    /// The task ended: `completed` gives the original request's result
    /// (for `tools/call`, `ServerResult::CallToolResult`), `failed` its
    /// JSON-RPC error. The request has left the journal.
    Answer(RecoveredAnswer),
    /// The task was cancelled. The request has left the journal.
    Cancelled,
    /// The task waits for input from the client: answer these requests
    /// with `tasks/update` (rmcp's `Peer::update_task`), then collect
    /// again. The request stays journaled.
    InputRequired(InputRequests),
}

/// A request the server answered with a task before the previous process
/// stopped; its result is collected by polling `tasks/get`.
pub struct RecoveredTask {
    context: Recoverer,
    scope: JournalScope,
    request: InFlightRequest,
    task_id: String,
}

impl std::fmt::Debug for RecoveredTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveredTask")
            .field("request", &self.request)
            .field("task_id", &self.task_id)
            .finish_non_exhaustive()
    }
}

impl RecoveredTask {
    /// `request`, journaled in `scope`, answered with the task `task_id`.
    pub(super) fn new(
        context: Recoverer,
        scope: JournalScope,
        request: InFlightRequest,
        task_id: String,
    ) -> Self {
        RecoveredTask {
            context,
            scope,
            request,
            task_id,
        }
    }

    /// The request as journaled.
    pub fn request(&self) -> &InFlightRequest {
        &self.request
    }

    /// The task the server answered the request with.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// One `tasks/get` in the request's session: the task as the server
    /// reports it now. A task of a server without sessions is polled
    /// through the running rmcp client instead: see
    /// [`poll_with`](Self::poll_with).
    pub async fn poll(&self) -> Result<DetailedTask, RecoveryError> {
        self.poll_in_session()
            .instrument(self.context.span.clone())
            .await
    }

    async fn poll_in_session(&self) -> Result<DetailedTask, RecoveryError> {
        let JournalScope::Session(own) = &self.scope else {
            return Err(RecoveryError::NeedsClient);
        };
        let current = self.context.session.state().current();
        let Some((session, result)) = current.filter(|(s, _)| s == own) else {
            // The session was replaced or ended: the task lived in it.
            return Err(RecoveryError::SessionGone);
        };
        let wire = self.context.ids.next(&session).await;
        let message = ClientJsonRpcMessage::request(
            ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(
                self.task_id.clone(),
            ))),
            NumberOrString::Number(wire),
        );
        let answer = self
            .context
            .wire
            .request(
                Arc::from(session.as_str()),
                message,
                version_headers(&result),
            )
            .await;
        match answer {
            Ok(ServerJsonRpcMessage::Response(r)) => match r.result {
                ServerResult::GetTaskResult(got) => Ok(got.task),
                other => Err(RecoveryError::UnexpectedAnswer {
                    reason: format!("tasks/get answered with {other:?}"),
                }),
            },
            Ok(ServerJsonRpcMessage::Error(e)) if e.error.code == ErrorCode::INVALID_PARAMS => {
                Err(RecoveryError::TaskLost {
                    task_id: self.task_id.clone(),
                    error: e.error,
                })
            }
            Ok(ServerJsonRpcMessage::Error(e)) => Err(RecoveryError::Refused { error: e.error }),
            Ok(other) => Err(RecoveryError::UnexpectedAnswer {
                reason: format!("tasks/get answered with {other:?}"),
            }),
            Err(WireError::SessionGone) => {
                self.context.session_gone(own);
                Err(RecoveryError::SessionGone)
            }
            Err(WireError::EventsGone) => Err(RecoveryError::UnexpectedAnswer {
                reason: "tasks/get answered 410 Gone".into(),
            }),
            Err(WireError::Other(source)) => Err(RecoveryError::Transport { source }),
        }
    }

    /// One `tasks/get` through the running rmcp client (which sends it with
    /// everything the server's protocol version asks of a request): for a
    /// task of a server without sessions, or any other.
    pub async fn poll_with(
        &self,
        client: &Peer<RoleClient>,
    ) -> Result<DetailedTask, RecoveryError> {
        match client
            .get_task(GetTaskParams::new(self.task_id.clone()))
            .await
        {
            Ok(got) => Ok(got.task),
            Err(ServiceError::McpError(error)) if error.code == ErrorCode::INVALID_PARAMS => {
                Err(RecoveryError::TaskLost {
                    task_id: self.task_id.clone(),
                    error,
                })
            }
            Err(ServiceError::McpError(error)) => Err(RecoveryError::Refused { error }),
            Err(other) => Err(RecoveryError::Transport {
                source: Box::new(other),
            }),
        }
    }

    /// [`collect`](Self::collect) through the running rmcp client (see
    /// [`poll_with`](Self::poll_with)); the way to collect a task of a
    /// server without sessions.
    pub async fn collect_with(
        &self,
        client: &Peer<RoleClient>,
    ) -> Result<TaskOutcome, RecoveryError> {
        self.collect_by(Some(client)).await
    }

    /// Polls `tasks/get` until the task ends or waits for input, honouring
    /// the server's `pollIntervalMs` (the builder's poll interval when the
    /// server gives none), for at most the recovery timeout.
    ///
    /// A task the server no longer knows is [`RecoveryError::TaskLost`]:
    /// nothing is sent again. On an error the request stays listed, so
    /// collecting can be tried again through another
    /// [`recover`](crate::client::ClientHandle::recover).
    pub async fn collect(&self) -> Result<TaskOutcome, RecoveryError> {
        self.collect_by(None).await
    }

    async fn collect_by(
        &self,
        client: Option<&Peer<RoleClient>>,
    ) -> Result<TaskOutcome, RecoveryError> {
        self.poll_until_done(client)
            .instrument(recovery_span(&self.context.span, &self.request, "task"))
            .await
    }

    async fn poll_until_done(
        &self,
        client: Option<&Peer<RoleClient>>,
    ) -> Result<TaskOutcome, RecoveryError> {
        let config = self.context.config;
        let deadline = Instant::now() + config.timeout;
        loop {
            let poll = async {
                match client {
                    Some(client) => self.poll_with(client).await,
                    None => self.poll_in_session().await,
                }
            };
            let task = match tokio::time::timeout_at(deadline, poll).await {
                Ok(result) => result,
                Err(_) => Err(RecoveryError::Timeout {
                    after: config.timeout,
                }),
            };
            let task = match task {
                Ok(task) => task,
                Err(e) => {
                    info!(request = %self.request.id, task = %self.task_id, error = %e,
                        "collecting an interrupted task failed; it stays listed");
                    return Err(e);
                }
            };
            debug!(request = %self.request.id, task = %self.task_id, status = ?task.status(), "polled an interrupted task");
            let outcome = match task.payload {
                TaskPayload::Completed { result } => {
                    match serde_json::from_value::<ServerResult>(Value::Object(result)) {
                        Ok(result) => TaskOutcome::Answer(Ok(result)),
                        Err(e) => {
                            return Err(RecoveryError::UnexpectedAnswer {
                                reason: format!("the task's result does not parse: {e}"),
                            });
                        }
                    }
                }
                TaskPayload::Failed { error } => {
                    match serde_json::from_value::<ErrorData>(Value::Object(error)) {
                        Ok(error) => TaskOutcome::Answer(Err(error)),
                        Err(e) => {
                            return Err(RecoveryError::UnexpectedAnswer {
                                reason: format!("the task's error does not parse: {e}"),
                            });
                        }
                    }
                }
                TaskPayload::Cancelled => TaskOutcome::Cancelled,
                TaskPayload::InputRequired { input_requests } => {
                    info!(request = %self.request.id, task = %self.task_id,
                        "an interrupted task waits for input; handing it to the application");
                    return Ok(TaskOutcome::InputRequired(input_requests));
                }
                _ => {
                    let interval = task
                        .task
                        .poll_interval_ms
                        .map(Duration::from_millis)
                        .unwrap_or(config.poll_interval)
                        .max(Duration::from_millis(10));
                    if Instant::now() + interval >= deadline {
                        return Err(RecoveryError::Timeout {
                            after: config.timeout,
                        });
                    }
                    tokio::time::sleep(interval).await;
                    continue;
                }
            };
            self.context.collected(&self.scope, &self.request);
            info!(request = %self.request.id, method = %self.request.method, task = %self.task_id,
                "collected the result of an interrupted task");
            return Ok(outcome);
        }
    }
}
