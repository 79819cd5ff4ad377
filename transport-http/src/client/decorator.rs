//! The `StreamableHttpClient` decorator.

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use mcp_persist_core::{
    InFlightRequest, ProtocolEra, RequestId, ServerProfile, SessionId, Timestamp,
};
use rmcp::{
    model::{
        ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorCode, NumberOrString,
        ServerJsonRpcMessage, ServerResult,
    },
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use serde_json::Value;
use sse_stream::Sse;
use tracing::{debug, info, warn};

use super::{ClientNotice, modern, state::Shared};

type SseStream = BoxStream<'static, Result<Sse, SseError>>;
type PostResult<E> = Result<StreamableHttpPostResponse, StreamableHttpError<E>>;

/// An rmcp [`StreamableHttpClient`] that keeps its session in a store.
///
/// It wraps another client (rmcp's reqwest client, or rmcp's `AuthClient`
/// over it) and is made by [`DurableClientBuilder`](super::DurableClientBuilder);
/// see the [module docs](super) for what it does.
#[derive(Clone)]
pub struct DurableHttpClient<C> {
    pub(crate) inner: C,
    pub(crate) shared: Arc<Shared>,
}

impl<C> std::fmt::Debug for DurableHttpClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableHttpClient")
            .field("server", &self.shared.key)
            .finish_non_exhaustive()
    }
}

/// Which of the inner client's POST methods rmcp called, so that the same
/// one (with the same response limits) carries the message on.
#[derive(Clone, Copy)]
enum Limits {
    /// `post_message`: the inner client's defaults.
    Default,
    /// `post_message_with_max_sse_event_size`.
    SseEvent(usize),
    /// `post_message_with_response_limits`.
    Response(StreamableHttpResponseLimits),
}

/// Where the events of a stream belong.
#[derive(Clone)]
enum StreamOwner {
    /// The response stream of the request that went out as this wire id.
    Request(SessionId, i64),
    /// The standalone GET stream.
    Standalone(SessionId),
    /// A resumed stream, or one without a session.
    Other(Option<SessionId>),
}

impl<C: StreamableHttpClient + Sync> DurableHttpClient<C> {
    #[allow(clippy::too_many_arguments)]
    async fn post(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: Limits,
    ) -> PostResult<C::Error> {
        let session = session_id
            .as_deref()
            .and_then(|s| SessionId::new(s.to_owned()).ok());
        let modern = self
            .shared
            .profile()
            .is_some_and(|p| p.era == ProtocolEra::Modern);
        match &mut message {
            ClientJsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::DiscoverRequest(_)) =>
            {
                let id = request.id.clone();
                if let Some(answer) = modern::cached_discover(&self.shared, &id) {
                    return Ok(StreamableHttpPostResponse::Json(answer, None));
                }
                let requested = modern::requested_version(&message);
                // Never a session or cursor towards a server probed as modern.
                let response = self
                    .send(uri, message, None, auth_header, custom_headers, limits)
                    .await?;
                let (mut answer, sid) = first_answer::<C::Error>(response).await?;
                modern::after_discover(&self.shared, &mut answer, requested);
                return Ok(StreamableHttpPostResponse::Json(answer, sid));
            }
            ClientJsonRpcMessage::Request(request)
                if modern && !matches!(request.request, ClientRequest::InitializeRequest(_)) =>
            {
                if session_id.is_some() {
                    warn!(server = %self.shared.key, "not sending a session id to a server judged modern");
                }
                let original = message.clone();
                let response = self
                    .send(
                        uri.clone(),
                        message,
                        None,
                        auth_header.clone(),
                        custom_headers.clone(),
                        limits,
                    )
                    .await;
                return self
                    .check_modern_verdict(
                        response,
                        original,
                        uri,
                        auth_header,
                        custom_headers,
                        limits,
                    )
                    .await;
            }
            _ if modern && session_id.is_some() => {
                warn!(server = %self.shared.key, "not sending a session id to a server judged modern");
                return self
                    .send(uri, message, None, auth_header, custom_headers, limits)
                    .await;
            }
            ClientJsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::InitializeRequest(_)) =>
            {
                let init_id = request.id.clone();
                if session_id.is_none()
                    && let Some(seed) = self.shared.take_seed()
                {
                    info!(server = %self.shared.key, session = %seed.session_id,
                        "resuming stored session: answering initialize from the store");
                    let answer = ServerJsonRpcMessage::response(
                        ServerResult::InitializeResult(seed.result),
                        init_id,
                    );
                    return Ok(StreamableHttpPostResponse::Json(
                        answer,
                        Some(seed.session_id.to_string()),
                    ));
                }
                let response = self
                    .send(
                        uri,
                        message,
                        session_id,
                        auth_header,
                        custom_headers,
                        limits,
                    )
                    .await?;
                let (answer, new_session) = first_answer::<C::Error>(response).await?;
                self.after_initialize(&answer, new_session.as_deref(), &init_id)
                    .await;
                return Ok(StreamableHttpPostResponse::Json(answer, new_session));
            }
            ClientJsonRpcMessage::Notification(n)
                if matches!(
                    n.notification,
                    ClientNotification::InitializedNotification(_)
                ) && self.shared.take_swallow_initialized() =>
            {
                debug!(server = %self.shared.key, "initialized notification dropped: the server has it from the first process");
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            ClientJsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &mut n.notification
                    && let Some(local) = &c.params.request_id
                    && let Some(wire) = self.shared.wire_of(local)
                {
                    c.params.request_id = Some(NumberOrString::Number(wire));
                }
            }
            _ => {}
        }
        // An ordinary request in a session: renumber and journal it.
        let (Some(session), ClientJsonRpcMessage::Request(request)) = (&session, &mut message)
        else {
            return self
                .send(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await;
        };
        let local = request.id.clone();
        let wire = self.shared.next_wire_id(session).await;
        request.id = NumberOrString::Number(wire);
        self.shared.map_insert(local, wire);
        if self.shared.health.persisting() {
            let (method, params) = method_and_params(&message);
            self.shared.record(
                session,
                InFlightRequest {
                    id: RequestId::Number(wire),
                    method,
                    params,
                    last_event_id: None,
                    task_id: None,
                    sent_at: Timestamp::now(),
                },
            );
        }
        let response = self
            .send(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        match response {
            Err(error) => {
                self.shared.map_take(wire);
                self.shared.complete(session, wire);
                if matches!(error, StreamableHttpError::SessionExpired) {
                    self.shared.on_expired(session);
                }
                Err(error)
            }
            Ok(StreamableHttpPostResponse::Json(mut answer, sid)) => {
                self.answer_back(session, &mut answer);
                self.check_legacy_verdict(session, &mut answer);
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                Ok(StreamableHttpPostResponse::Sse(
                    self.observe(stream, StreamOwner::Request(session.clone(), wire)),
                    sid,
                ))
            }
            Ok(other) => Ok(other),
        }
    }

    /// A request sent under a modern verdict came back: if the server
    /// refused its protocol version, the verdict is stale. It is forgotten,
    /// the server is probed again once (per process), the outcome stored,
    /// and the request sent once more if the probe says its version is
    /// supported after all; otherwise the refusal is the answer.
    #[allow(clippy::too_many_arguments)]
    async fn check_modern_verdict(
        &self,
        mut response: PostResult<C::Error>,
        original: ClientJsonRpcMessage,
        uri: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: Limits,
    ) -> PostResult<C::Error> {
        let reason = match &mut response {
            Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _))
                if modern::is_unsupported(e.error.code) =>
            {
                let reason = format!("{} ({})", e.error.code.0, e.error.message);
                e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
                reason
            }
            _ => return response,
        };
        if !self.shared.claim_reprobe() {
            warn!(server = %self.shared.key, %reason,
                "protocol version refused again; already re-probed once in this process, giving up");
            return response;
        }
        let Some(stale) = self.shared.forget_profile() else {
            return response;
        };
        let stale = verdict_text(&stale);
        warn!(server = %self.shared.key, %stale, %reason,
            "the stored era verdict stopped working; forgetting it and probing the server again, once");
        let outcome = match modern::reprobe_request(&original) {
            Some(probe) => {
                let requested = modern::requested_version(&probe);
                // The request's own routing headers (`Mcp-Method`, `Mcp-Name`,
                // `Mcp-Param-*`) would contradict the probe's body.
                let mut headers = custom_headers.clone();
                headers.retain(|name, _| {
                    let name = name.as_str();
                    name != "mcp-method" && name != "mcp-name" && !name.starts_with("mcp-param-")
                });
                headers.insert(
                    HeaderName::from_static("mcp-method"),
                    HeaderValue::from_static("server/discover"),
                );
                let answer = match self
                    .send(
                        uri.clone(),
                        probe,
                        None,
                        auth_header.clone(),
                        headers,
                        limits,
                    )
                    .await
                {
                    Ok(r) => first_answer::<C::Error>(r).await,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok((answer, _)) => modern::after_reprobe(&self.shared, &answer, requested),
                    Err(e) => {
                        warn!(server = %self.shared.key, error = %e, "re-probe failed");
                        modern::Reprobe::Failed
                    }
                }
            }
            None => modern::Reprobe::Failed,
        };
        let new_verdict = self.shared.profile().as_ref().map(verdict_text);
        self.shared.health.notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: new_verdict.clone(),
        });
        match outcome {
            modern::Reprobe::Retry => {
                info!(server = %self.shared.key, "re-probe: the version is supported; sending the request once more");
                let mut retried = self
                    .send(uri, original, None, auth_header, custom_headers, limits)
                    .await;
                if let Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _)) =
                    &mut retried
                    && modern::is_unsupported(e.error.code)
                {
                    warn!(server = %self.shared.key, "refused again after the re-probe; giving up");
                    e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
                }
                retried
            }
            modern::Reprobe::NewVerdict => {
                warn!(server = %self.shared.key, new_verdict = ?new_verdict,
                    "re-probe stored a new verdict; this connection fails, the next start uses it");
                response
            }
            modern::Reprobe::Failed => {
                warn!(server = %self.shared.key,
                    "re-probe found no usable verdict; the next start probes again");
                response
            }
        }
    }

    /// A request in a legacy session was refused as an unsupported protocol
    /// version: the stored verdict and the session are forgotten, so the
    /// next start probes the server (once, through rmcp's `server/discover`)
    /// instead of resuming a session the server no longer speaks.
    fn check_legacy_verdict(&self, session: &SessionId, answer: &mut ServerJsonRpcMessage) {
        let ServerJsonRpcMessage::Error(e) = answer else {
            return;
        };
        if !modern::is_unsupported(e.error.code) {
            return;
        }
        let reason = format!("{} ({})", e.error.code.0, e.error.message);
        e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
        if !self.shared.claim_reprobe() {
            return;
        }
        let Some(stale) = self.shared.forget_profile() else {
            return;
        };
        let stale = verdict_text(&stale);
        warn!(server = %self.shared.key, %stale, %reason,
            "the stored legacy verdict stopped working; forgetting it and the session, the next start probes again");
        self.shared.on_ended(session);
        self.shared.health.notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: None,
        });
    }

    async fn send(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: Limits,
    ) -> PostResult<C::Error> {
        match limits {
            Limits::Response(limits) => {
                self.inner
                    .post_message_with_response_limits(
                        uri,
                        message,
                        session_id,
                        auth_header,
                        custom_headers,
                        limits,
                    )
                    .await
            }
            Limits::SseEvent(max) => {
                self.inner
                    .post_message_with_max_sse_event_size(
                        uri,
                        message,
                        session_id,
                        auth_header,
                        custom_headers,
                        max,
                    )
                    .await
            }
            Limits::Default => {
                self.inner
                    .post_message(uri, message, session_id, auth_header, custom_headers)
                    .await
            }
        }
    }

    async fn after_initialize(
        &self,
        answer: &ServerJsonRpcMessage,
        new_session: Option<&str>,
        init_id: &NumberOrString,
    ) {
        let ServerJsonRpcMessage::Response(response) = answer else {
            return;
        };
        let ServerResult::InitializeResult(result) = &response.result else {
            return;
        };
        let Some(sid) = new_session else {
            debug!(server = %self.shared.key, "server runs without sessions; nothing to keep");
            return;
        };
        match SessionId::new(sid.to_owned()) {
            Ok(sid) => {
                self.shared
                    .on_initialized(sid, result.clone(), init_id)
                    .await
            }
            Err(e) => {
                warn!(server = %self.shared.key, error = %e, "server sent a session id that cannot be stored")
            }
        }
    }

    /// Gives a JSON answer its rmcp id back and closes its journal entry.
    fn answer_back(&self, session: &SessionId, answer: &mut ServerJsonRpcMessage) {
        let id = match answer {
            ServerJsonRpcMessage::Response(r) => Some(&mut r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_mut(),
            _ => None,
        };
        let Some(id) = id else { return };
        let NumberOrString::Number(wire) = *id else {
            return;
        };
        if let Some(local) = self.shared.map_take(wire) {
            *id = local;
            let task = match answer {
                ServerJsonRpcMessage::Response(r) => serde_json::to_value(&r.result)
                    .ok()
                    .as_ref()
                    .and_then(task_id_of),
                _ => None,
            };
            match task {
                Some(task) => self.shared.task(session, wire, task),
                None => self.shared.complete(session, wire),
            }
        }
    }

    /// Follows an SSE stream: records cursors, gives answers their rmcp ids
    /// back and closes their journal entries.
    fn observe(&self, stream: SseStream, owner: StreamOwner) -> SseStream {
        let shared = self.shared.clone();
        stream
            .map(move |item| {
                let Ok(mut event) = item else { return item };
                if let Some(id) = event.id.as_deref() {
                    match &owner {
                        StreamOwner::Request(s, wire) => shared.cursor(s, *wire, id),
                        StreamOwner::Standalone(s) => shared.standalone_cursor(s, id),
                        StreamOwner::Other(_) => {}
                    }
                }
                let session = match &owner {
                    StreamOwner::Request(s, _) | StreamOwner::Standalone(s) => Some(s),
                    StreamOwner::Other(s) => s.as_ref(),
                };
                if let Some(data) = event.data.as_deref()
                    && (data.contains("\"result\"") || data.contains("\"error\""))
                    && let Ok(mut value) = serde_json::from_str::<Value>(data)
                    && value.get("method").is_none()
                    && let Some(wire) = value.get("id").and_then(Value::as_i64)
                    && let Some(local) = shared.map_take(wire)
                {
                    value["id"] = local.into_json_value();
                    if let Some(session) = session {
                        match value.get("result").and_then(task_id_of) {
                            Some(task) => shared.task(session, wire, task),
                            None => shared.complete(session, wire),
                        }
                    }
                    if let Ok(text) = serde_json::to_string(&value) {
                        event.data = Some(text);
                    }
                }
                Ok(event)
            })
            .boxed()
    }
}

/// A verdict as the application reads it: `modern 2026-07-28`.
fn verdict_text(profile: &ServerProfile) -> String {
    let era = match profile.era {
        ProtocolEra::Modern => "modern",
        ProtocolEra::Legacy => "legacy",
    };
    format!("{era} {}", profile.protocol_version)
}

/// The task id of a `CreateTaskResult`, if the result is one.
fn task_id_of(result: &Value) -> Option<String> {
    result
        .get("task")?
        .get("taskId")?
        .as_str()
        .map(str::to_owned)
}

fn method_and_params(message: &ClientJsonRpcMessage) -> (String, Option<Value>) {
    match serde_json::to_value(message) {
        Ok(mut v) => {
            let method = v
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let params = v.get_mut("params").map(Value::take);
            (method, params)
        }
        Err(_) => (String::new(), None),
    }
}

/// The answer to `initialize`, from a JSON body or the first answer on an
/// SSE stream (what rmcp's worker reads from either).
async fn first_answer<E>(
    response: StreamableHttpPostResponse,
) -> Result<(ServerJsonRpcMessage, Option<String>), StreamableHttpError<E>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    response.expect_initialized::<E>().await
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for DurableHttpClient<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult<Self::Error> {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            Limits::Default,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult<Self::Error> {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            Limits::SseEvent(max_sse_event_size),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult<Self::Error> {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            Limits::Response(limits),
        )
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        if self.shared.ending() {
            return self
                .inner
                .delete_session(uri, session_id, auth_header, custom_headers)
                .await;
        }
        debug!(server = %self.shared.key, "keeping the session for the next process (no DELETE)");
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        let open = |last_event_id| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id,
                auth_header.clone(),
                custom_headers.clone(),
            )
        };
        self.open_get(session_id.as_deref(), last_event_id, open)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        let open = |last_event_id| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id,
                auth_header.clone(),
                custom_headers.clone(),
                max_sse_event_size,
            )
        };
        self.open_get(session_id.as_deref(), last_event_id, open)
            .await
    }
}

impl<C: StreamableHttpClient + Sync> DurableHttpClient<C> {
    /// Opens a GET stream through `open` (given the `Last-Event-ID` to
    /// send): none for a modern server; for the first standalone GET of a
    /// session resumed after a restart, from the stored cursor (a fresh
    /// stream when the server refuses it); and observed for cursors and
    /// answers.
    async fn open_get<F, Fut>(
        &self,
        session_id: Option<&str>,
        last_event_id: Option<String>,
        open: F,
    ) -> Result<SseStream, StreamableHttpError<C::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<SseStream, StreamableHttpError<C::Error>>>,
    {
        if self.judged_modern() {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        let owner = self.stream_owner(session_id, last_event_id.is_none());
        if let Some(cursor) = self.standalone_cursor(&owner)
            && let Some(stream) = self.resumed_or_fresh(open(Some(cursor)).await)?
        {
            return Ok(self.observe(stream, owner));
        }
        let stream = open(last_event_id).await?;
        Ok(self.observe(stream, owner))
    }
}

impl<C> DurableHttpClient<C> {
    /// Modern servers get no GET stream and no `Last-Event-ID`.
    fn judged_modern(&self) -> bool {
        self.shared
            .profile()
            .is_some_and(|p| p.era == ProtocolEra::Modern)
    }

    /// For the first standalone GET of a session resumed after a restart:
    /// where the previous process stopped reading, so that the server replays
    /// what was sent while no process listened.
    fn standalone_cursor(&self, owner: &StreamOwner) -> Option<String> {
        let StreamOwner::Standalone(session) = owner else {
            return None;
        };
        let cursor = self.shared.take_standalone_cursor(session)?;
        info!(server = %self.shared.key, session = %session, "resuming the standalone stream where the previous process stopped");
        Some(cursor)
    }

    /// The outcome of a GET that carried a stored cursor: the stream, or
    /// `None` to open a fresh one when the server would not resume (the
    /// events expired, or it keeps none). Authorization failures stay errors.
    fn resumed_or_fresh<E: std::error::Error + Send + Sync + 'static>(
        &self,
        resumed: Result<SseStream, StreamableHttpError<E>>,
    ) -> Result<Option<SseStream>, StreamableHttpError<E>> {
        match resumed {
            Ok(stream) => Ok(Some(stream)),
            Err(
                e @ (StreamableHttpError::AuthRequired(_)
                | StreamableHttpError::InsufficientScope(_)),
            ) => Err(e),
            Err(e) => {
                warn!(server = %self.shared.key, error = %e, "the server would not resume the standalone stream; opening a fresh one (messages sent meanwhile are lost)");
                Ok(None)
            }
        }
    }

    fn stream_owner(&self, session_id: Option<&str>, fresh: bool) -> StreamOwner {
        let session = session_id.and_then(|s| SessionId::new(s.to_owned()).ok());
        match session {
            Some(s) if fresh => StreamOwner::Standalone(s),
            other => StreamOwner::Other(other),
        }
    }
}
