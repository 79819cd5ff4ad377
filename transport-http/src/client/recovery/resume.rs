//! Resuming the response stream of an interrupted request with `GET` and
//! `Last-Event-ID`: its missed notifications, then its final answer.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use mcp_persist_core::{InFlightRequest, RequestId, SessionId};
use rmcp::model::{
    NumberOrString, ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage,
    ServerNotification, ServerRequest,
};
use serde_json::Value;
use tokio::time::Instant;
use tracing::{Instrument, Span, debug, info, warn};

use super::{RecoveredAnswer, Recoverer, RecoveryError, recovery_span};
use crate::client::{
    headers::version_headers,
    journal::JournalScope,
    progress,
    wire::{SseResume, WireError},
};

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
    /// The recovery's span, from the first [`next`](Self::next) on.
    trace: Option<Span>,
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
    /// `request`, sent in `session`, to resume from the event id `cursor`.
    pub(super) fn new(
        context: Recoverer,
        session: SessionId,
        request: InFlightRequest,
        cursor: String,
    ) -> Self {
        ResumedRequest {
            context,
            session,
            request,
            cursor,
            stream: None,
            deadline: None,
            done: false,
            deliver: false,
            trace: None,
        }
    }

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
        let span = self
            .trace
            .get_or_insert_with(|| recovery_span(&self.context.span, &self.request, "resume"))
            .clone();
        self.next_message().instrument(span).await
    }

    async fn next_message(&mut self) -> Option<Result<RecoveredMessage, RecoveryError>> {
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
                self.context.journal.cursor(
                    JournalScope::Session(self.session.clone()),
                    self.request.id.clone(),
                    &id,
                );
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
            self.context
                .collected(&JournalScope::Session(self.session.clone()), &self.request);
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
            self.context.inbox.deliver(text);
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
        if let Some(own) = progress::own_token(self.request.params.as_ref()) {
            progress.progress_token = own;
        }
        progress
    }

    fn headers(&self) -> HashMap<HeaderName, HeaderValue> {
        match self.context.session.state().current() {
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
