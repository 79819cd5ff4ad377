//! Collecting the answers to requests a previous process left in flight.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use mcp_persist_core::{BoxError, InFlightRequest, RequestId, SessionId};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, DetailedTask, ErrorCode, ErrorData, GetTaskParams,
    GetTaskRequest, InputRequests, NumberOrString, ProgressNotificationParam, ProgressToken,
    ServerJsonRpcMessage, ServerNotification, ServerRequest, ServerResult, TaskPayload,
};
use rmcp::{RoleClient, ServiceError, service::Peer};
use serde_json::Value;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The interrupted requests and the session each was sent in.
pub(crate) type Listed = Arc<std::sync::Mutex<Vec<(SessionId, InFlightRequest)>>>;

use super::{
    headers::version_headers,
    health::lock,
    journal::sessionless,
    state::Shared,
    wire::{SseResume, Wire, WireError},
};

/// How long and how often a resumed request is polled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryConfig {
    pub(crate) timeout: Duration,
    pub(crate) poll_interval: Duration,
}

/// What collecting an interrupted request needs of the client: its state
/// (for the journal and the session's version), the wire to resume through,
/// and the timing.
#[derive(Clone)]
pub(crate) struct Recoverer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) wire: Arc<dyn Wire>,
    pub(crate) config: RecoveryConfig,
    /// The handle's list of interrupted requests: a collected one leaves it.
    pub(crate) listed: Listed,
}

impl Recoverer {
    /// The server answered 404 for `session`: if it is the one in use, it
    /// is forgotten as after a 404 on any request (the next request, or
    /// rmcp's `initialize` if the client is not serving yet, starts a new
    /// session).
    fn session_gone(&self, session: &SessionId) {
        self.shared.on_expired(session);
    }

    /// The answer to `request` was collected: it leaves the journal and the
    /// handle's list.
    fn collected(&self, session: &SessionId, request: &InFlightRequest) {
        self.shared.journal().complete(session, request.id.clone());
        lock(&self.listed).retain(|(s, r)| !(r.id == request.id && s == session));
    }
}

/// How the answer to one interrupted request can be had.
#[derive(Debug)]
#[non_exhaustive]
pub enum Recovery {
    /// The request's response stream had an event id: its missed
    /// notifications and its final answer are collected with `GET` and
    /// `Last-Event-ID` (see [`ResumedRequest::next`]).
    Resumable(ResumedRequest),
    /// The server answered the request with a task (`CreateTaskResult`),
    /// whose id was journaled: its result is collected by polling
    /// `tasks/get` (see [`RecoveredTask::collect`]).
    Task(RecoveredTask),
    /// Its answer cannot be collected; `reason` says why. The server may
    /// or may not have run it. Its method and params are here for the
    /// application to decide whether to send it again; it stays listed,
    /// across restarts, until the application calls
    /// [`ClientHandle::dismiss`](super::handle::ClientHandle::dismiss).
    #[non_exhaustive]
    Lost {
        /// The request as journaled.
        request: InFlightRequest,
        /// Why its answer cannot be had.
        reason: LostReason,
    },
}

/// Why the answer to an interrupted request cannot be collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// No stream cursor or task id was journaled for it: the process
    /// stopped before the server's first event on its stream reached the
    /// store, so there is nothing to resume from.
    NoCursor,
    /// The session it was sent in is gone: the server no longer knows it
    /// (it answered 404, here or in an earlier process), or the application
    /// ended it. Whatever the server kept for it is gone with it.
    SessionGone,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::NoCursor => "nothing to resume it from",
            LostReason::SessionGone => "the session it was sent in is gone",
        })
    }
}

impl Recovery {
    pub(crate) fn new(context: Recoverer, session: SessionId, request: InFlightRequest) -> Self {
        // Only the session in use can be resumed in; a server without
        // sessions keeps its tasks under a pseudo session.
        let in_use = context
            .shared
            .session()
            .current()
            .is_some_and(|(current, _)| current == session);
        if !in_use && session != sessionless() {
            return Recovery::Lost {
                request,
                reason: LostReason::SessionGone,
            };
        }
        if let Some(task_id) = request.task_id.clone() {
            return Recovery::Task(RecoveredTask {
                context,
                session,
                request,
                task_id,
            });
        }
        match request.last_event_id.clone() {
            Some(cursor) => Recovery::Resumable(ResumedRequest {
                context,
                session,
                request,
                cursor,
                stream: None,
                deadline: None,
                done: false,
                deliver: false,
            }),
            None => Recovery::Lost {
                request,
                reason: LostReason::NoCursor,
            },
        }
    }

    /// The request this is about.
    pub fn request(&self) -> &InFlightRequest {
        match self {
            Recovery::Resumable(r) => &r.request,
            Recovery::Task(t) => &t.request,
            Recovery::Lost { request, .. } => request,
        }
    }
}

/// The final answer to a resumed request, as rmcp's own client would have
/// read it: the result (match on its variant, e.g.
/// `ServerResult::CallToolResult`), or the JSON-RPC error.
pub type RecoveredAnswer = Result<ServerResult, ErrorData>;

/// One message collected for a resumed request, in rmcp's types.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RecoveredMessage {
    /// Progress of the request, with the progress token the application
    /// gave the request (rmcp's token of the previous process when the
    /// application gave none: that number means nothing to this process).
    Progress(ProgressNotificationParam),
    /// Another notification sent on the request's stream (log, ...).
    Notification(ServerNotification),
    /// A request the server sent on the request's stream (sampling,
    /// elicitation, ...). It can no longer be answered on the old stream's
    /// terms; it is here so nothing goes unseen.
    ServerRequest(ServerRequest),
    /// The final answer.
    Answer(RecoveredAnswer),
}

/// Why collecting a resumed request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// The server no longer knows the session: the answer is gone.
    #[error("the server no longer knows the session; the answer cannot be collected")]
    SessionGone,
    /// No final answer within the recovery timeout.
    #[error("no final answer within {after:?}")]
    Timeout {
        /// How long it waited.
        after: Duration,
    },
    /// The server no longer knows the task the request was answered with
    /// (it expired, or the server lost it): its result cannot be had. The
    /// request is not sent again; it stays listed for the application to
    /// decide (send it anew, or dismiss it).
    #[error("the server no longer knows task {task_id}")]
    TaskLost {
        /// The task.
        task_id: String,
        /// What the server answered to `tasks/get`.
        error: ErrorData,
    },
    /// A task of a server without sessions is polled through the running
    /// rmcp client: use [`RecoveredTask::collect_with`].
    #[error("this task is collected through the running client (collect_with)")]
    NeedsClient,
    /// The server instance running the request stopped before it answered
    /// (a durable mcp-persist server ends such a stream with an error
    /// saying so). The request is lost: it is not sent again and stays
    /// listed, for the application to re-issue or dismiss.
    #[error("the server instance running the request stopped before it answered; re-issue it")]
    Orphaned {
        /// The instance that stopped, when the server said.
        instance: Option<String>,
        /// What the server answered.
        error: ErrorData,
    },
    /// The server no longer has the events after the stored cursor (410):
    /// the instance that sent them stopped before committing them (a
    /// `Pipelined` server's lost window), or retention dropped them. The
    /// request's answer cannot be had: it is not sent again and stays
    /// listed, for the application to re-issue or dismiss.
    #[error("the server lost the response stream after the stored cursor; re-issue the request")]
    EventsGone,
    /// The server refused `tasks/get` for another reason than an unknown
    /// task.
    #[error("the server refused tasks/get: {error}")]
    Refused {
        /// What the server answered.
        error: ErrorData,
    },
    /// The server's answer was not what the request asks for.
    #[error("unexpected answer from the server: {reason}")]
    UnexpectedAnswer {
        /// What was wrong with it.
        reason: String,
    },
    /// The resume request failed.
    #[error("resuming the response stream failed")]
    Transport {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
}

/// A request whose response stream is resumed with `GET` and
/// `Last-Event-ID`.
pub struct ResumedRequest {
    context: Recoverer,
    session: SessionId,
    request: InFlightRequest,
    cursor: String,
    stream: Option<SseResume>,
    deadline: Option<Instant>,
    done: bool,
    deliver: bool,
}

impl std::fmt::Debug for ResumedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumedRequest")
            .field("request", &self.request)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl ResumedRequest {
    /// The request as journaled (wire id, method, params, cursor).
    pub fn request(&self) -> &InFlightRequest {
        &self.request
    }

    /// Also hands each recovered notification (progress with the
    /// application's token, logs, ...) to the running rmcp client's
    /// handler, as if it had arrived live, on the session's standalone
    /// stream. They are still returned by [`next`](Self::next) and
    /// [`collect`](Self::collect). Nothing reaches the handler while no
    /// rmcp client runs on the transport, or when the server offers no
    /// standalone stream (rmcp then opens none); they wait until it opens.
    pub fn deliver_to_client(mut self) -> Self {
        self.deliver = true;
        self
    }

    /// The next message of the request's stream after the stored cursor:
    /// missed notifications in order, then the final answer, then `None`.
    ///
    /// When the server's replay ends before the answer (the work is still
    /// running), the stream is polled again from the newest cursor until the
    /// answer arrives or the recovery timeout passes. Once the answer is
    /// read, the request leaves the journal.
    pub async fn next(&mut self) -> Option<Result<RecoveredMessage, RecoveryError>> {
        let config = self.context.config;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + config.timeout);
        let mut retry = config.poll_interval;
        loop {
            if self.done {
                return None;
            }
            if Instant::now() >= deadline {
                self.done = true;
                return Some(Err(RecoveryError::Timeout {
                    after: config.timeout,
                }));
            }
            let Some(stream) = self.stream.as_mut() else {
                let opened = tokio::time::timeout_at(
                    deadline,
                    self.context.wire.resume(
                        Arc::from(self.session.as_str()),
                        self.cursor.clone(),
                        self.headers(),
                    ),
                )
                .await;
                match opened {
                    Err(_) => continue,
                    Ok(Ok(stream)) => {
                        debug!(request = %self.request.id, cursor = %self.cursor, "resumed response stream");
                        self.stream = Some(stream);
                    }
                    Ok(Err(WireError::SessionGone)) => {
                        self.done = true;
                        self.context.session_gone(&self.session);
                        return Some(Err(RecoveryError::SessionGone));
                    }
                    Ok(Err(WireError::EventsGone)) => {
                        self.done = true;
                        warn!(request = %self.request.id, "the server lost this request's response stream (410); it stays listed");
                        return Some(Err(RecoveryError::EventsGone));
                    }
                    Ok(Err(WireError::Other(source))) => {
                        self.done = true;
                        return Some(Err(RecoveryError::Transport { source }));
                    }
                }
                continue;
            };
            let event = match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(_))) | Ok(None) => {
                    // The replay ended before the answer: poll again later.
                    self.stream = None;
                    tokio::time::sleep_until((Instant::now() + retry).min(deadline)).await;
                    continue;
                }
            };
            if let Some(ms) = event.retry {
                retry = Duration::from_millis(ms).max(Duration::from_millis(10));
            }
            if let Some(id) = event.id {
                self.context
                    .shared
                    .journal()
                    .cursor(&self.session, self.request.id.clone(), &id);
                self.cursor = id;
            }
            let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
                continue;
            };
            // What rmcp's own client would read from the event; anything
            // else is no message of this stream.
            let Ok(message) = serde_json::from_str::<ServerJsonRpcMessage>(&data) else {
                continue;
            };
            let answer = match message {
                ServerJsonRpcMessage::Notification(n) => {
                    let message = match n.notification {
                        ServerNotification::ProgressNotification(p) => {
                            let progress = self.progress_back(p.params);
                            if self.deliver {
                                self.deliver(&serde_json::json!({
                                    "jsonrpc": "2.0",
                                    "method": "notifications/progress",
                                    "params": progress,
                                }));
                            }
                            RecoveredMessage::Progress(progress)
                        }
                        other => {
                            if self.deliver
                                && let Ok(raw) = serde_json::from_str::<Value>(&data)
                            {
                                self.deliver(&raw);
                            }
                            RecoveredMessage::Notification(other)
                        }
                    };
                    return Some(Ok(message));
                }
                ServerJsonRpcMessage::Request(r) => {
                    return Some(Ok(RecoveredMessage::ServerRequest(r.request)));
                }
                ServerJsonRpcMessage::Response(r) if same_id(&r.id, &self.request.id) => {
                    Ok(r.result)
                }
                ServerJsonRpcMessage::Error(e)
                    if e.id
                        .as_ref()
                        .is_some_and(|id| same_id(id, &self.request.id)) =>
                {
                    if let Some(data) = e.error.data.as_ref()
                        && data.get("reason").and_then(Value::as_str) == Some("orphaned")
                    {
                        // Lost with the instance that ran it: keep it listed.
                        self.done = true;
                        self.stream = None;
                        let instance = data
                            .get("instance")
                            .and_then(Value::as_str)
                            .map(str::to_owned);
                        info!(request = %self.request.id, ?instance, "the instance running an interrupted request stopped; it is lost");
                        return Some(Err(RecoveryError::Orphaned {
                            instance,
                            error: e.error,
                        }));
                    }
                    Err(e.error)
                }
                _ => continue,
            };
            self.done = true;
            self.stream = None;
            self.context.collected(&self.session, &self.request);
            info!(request = %self.request.id, method = %self.request.method, "collected the answer of an interrupted request");
            return Some(Ok(RecoveredMessage::Answer(answer)));
        }
    }

    /// Reads to the end: the notifications in order, and the final answer.
    pub async fn collect(
        mut self,
    ) -> Result<(Vec<RecoveredMessage>, RecoveredAnswer), RecoveryError> {
        let mut seen = Vec::new();
        while let Some(message) = self.next().await {
            match message? {
                RecoveredMessage::Answer(answer) => return Ok((seen, answer)),
                other => seen.push(other),
            }
        }
        Err(RecoveryError::Timeout {
            after: self.context.config.timeout,
        })
    }

    /// Hands a notification to the running rmcp client's handler.
    fn deliver(&self, message: &Value) {
        if let Ok(text) = serde_json::to_string(message) {
            debug!(request = %self.request.id, "delivering a recovered notification to the client's handler");
            self.context.shared.inbox().deliver(text);
        }
    }

    /// Progress sent with the request's wire token (its wire id), given
    /// the token the application put in the request's params back.
    fn progress_back(&self, mut progress: ProgressNotificationParam) -> ProgressNotificationParam {
        let wire = ProgressToken(match &self.request.id {
            RequestId::Number(n) => NumberOrString::Number(*n),
            RequestId::String(s) => NumberOrString::String(s.as_str().into()),
        });
        if progress.progress_token != wire {
            return progress;
        }
        if let Some(own) = self
            .request
            .params
            .as_ref()
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("progressToken"))
            .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok())
        {
            progress.progress_token = own;
        }
        progress
    }

    fn headers(&self) -> HashMap<HeaderName, HeaderValue> {
        match self.context.shared.session().current() {
            Some((_, result)) => version_headers(&result),
            None => HashMap::new(),
        }
    }
}

fn same_id(id: &NumberOrString, ours: &RequestId) -> bool {
    match (id, ours) {
        (NumberOrString::Number(a), RequestId::Number(b)) => a == b,
        (NumberOrString::String(a), RequestId::String(b)) => a.as_ref() == b.as_str(),
        _ => false,
    }
}

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
    session: SessionId,
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
        if self.session == sessionless() {
            return Err(RecoveryError::NeedsClient);
        }
        let current = self.context.shared.session().current();
        let Some((session, result)) = current.filter(|(s, _)| *s == self.session) else {
            // The session was replaced or ended: the task lived in it.
            return Err(RecoveryError::SessionGone);
        };
        let wire = self.context.shared.ids().next(&session).await;
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
                self.context.session_gone(&self.session);
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
    /// [`recover`](super::handle::ClientHandle::recover).
    pub async fn collect(&self) -> Result<TaskOutcome, RecoveryError> {
        self.collect_by(None).await
    }

    async fn collect_by(
        &self,
        client: Option<&Peer<RoleClient>>,
    ) -> Result<TaskOutcome, RecoveryError> {
        let config = self.context.config;
        let deadline = Instant::now() + config.timeout;
        loop {
            let poll = async {
                match client {
                    Some(client) => self.poll_with(client).await,
                    None => self.poll().await,
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
            self.context.collected(&self.session, &self.request);
            info!(request = %self.request.id, method = %self.request.method, task = %self.task_id,
                "collected the result of an interrupted task");
            return Ok(outcome);
        }
    }
}
