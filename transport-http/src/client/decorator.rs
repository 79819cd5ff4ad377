//! The `StreamableHttpClient` decorator.
//!
//! Every POST rmcp makes is routed by [`Route`]: read that enum to find
//! where a message goes, and the method of the same name for what happens
//! to it there.

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use mcp_persist_core::{InFlightRequest, ProtocolEra, RequestId, ServerProfile, SessionId};
use rmcp::{
    model::{
        ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorCode, GetMeta,
        NumberOrString, ProgressToken, ServerJsonRpcMessage, ServerResult,
    },
    transport::{
        common::http_header::HEADER_MCP_METHOD,
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
            StreamableHttpResponseLimits,
        },
    },
};
use serde_json::Value;
use sse_stream::Sse;
use tracing::{debug, info, warn};

use super::{
    headers::{header_name, is_routing_header},
    journal::sessionless,
    modern,
    report::ClientNotice,
    state::Shared,
    wire::http_status,
};

type SseStream = BoxStream<'static, Result<Sse, SseError>>;
type PostResult<E> = Result<StreamableHttpPostResponse, StreamableHttpError<E>>;

/// An rmcp [`StreamableHttpClient`] that keeps its session in a store.
///
/// It wraps another client (rmcp's reqwest client, or rmcp's `AuthClient`
/// over it) and is made by [`DurableClientBuilder`](super::builder::DurableClientBuilder);
/// see the [module docs](super) for what it does.
#[derive(Clone)]
pub struct DurableHttpClient<C> {
    pub(crate) inner: C,
    pub(crate) shared: Arc<Shared>,
}

impl<C> std::fmt::Debug for DurableHttpClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableHttpClient")
            .field("server", self.shared.key())
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

/// One POST as rmcp asked for it, apart from the message: where it goes,
/// with which session, credentials, headers and limits.
#[derive(Clone)]
struct Post {
    uri: Arc<str>,
    session_id: Option<Arc<str>>,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
    limits: Limits,
}

impl Post {
    /// The same POST without a session id.
    fn without_session(self) -> Self {
        Post {
            session_id: None,
            ..self
        }
    }

    /// The session named by the POST, if it is one a store can hold.
    fn session(&self) -> Option<SessionId> {
        self.session_id
            .as_deref()
            .and_then(|s| SessionId::new(s.to_owned()).ok())
    }

    /// Sends `message` through `client` with the POST method rmcp chose.
    async fn send<C: StreamableHttpClient>(
        self,
        client: &C,
        message: ClientJsonRpcMessage,
    ) -> PostResult<C::Error> {
        let Post {
            uri,
            session_id,
            auth_header,
            custom_headers,
            limits,
        } = self;
        match limits {
            Limits::Response(limits) => {
                client
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
                client
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
                client
                    .post_message(uri, message, session_id, auth_header, custom_headers)
                    .await
            }
        }
    }
}

/// Where a message rmcp posts goes, checked in this order.
enum Route {
    /// `server/discover`: answered from the stored verdict when it allows,
    /// else sent without a session and learned from.
    Discover,
    /// Any other request to a server judged modern: sent without a session;
    /// a refusal of its protocol version re-probes the server once.
    ModernRequest,
    /// Anything else carrying a session id to a server judged modern: sent
    /// without the session id.
    ModernWithoutSession,
    /// `initialize`: answered from the stored session after a restart, else
    /// sent, and the new session stored.
    Initialize,
    /// The `notifications/initialized` after an `initialize` answered from
    /// the store: dropped, the server has it from the first process.
    InitializedAgain,
    /// Another notification: a cancellation is renumbered to the wire id of
    /// the request it cancels.
    Notification,
    /// A request in a session: renumbered, journaled, and its answer (JSON
    /// or SSE) followed back to rmcp's id.
    SessionRequest(SessionId),
    /// The client's answer to a request of the server: sent as it is (the
    /// server numbered that request, not us).
    Response,
    /// A request outside any session: sent as it is.
    AsIs,
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
    async fn post(&self, message: ClientJsonRpcMessage, post: Post) -> PostResult<C::Error> {
        match self.route(&message, &post) {
            Route::Discover => self.discover(message, post).await,
            Route::ModernRequest => self.modern_request(message, post).await,
            Route::ModernWithoutSession => {
                warn!(server = %self.shared.key(), "not sending a session id to a server judged modern");
                post.without_session().send(&self.inner, message).await
            }
            Route::Initialize => self.initialize(message, post).await,
            Route::InitializedAgain => {
                debug!(server = %self.shared.key(), "initialized notification dropped: the server has it from the first process");
                Ok(StreamableHttpPostResponse::Accepted)
            }
            Route::Notification => self.notification(message, post).await,
            Route::SessionRequest(session) => self.session_request(session, message, post).await,
            Route::Response | Route::AsIs => post.send(&self.inner, message).await,
        }
    }

    /// Decides the [`Route`] of `message`.
    fn route(&self, message: &ClientJsonRpcMessage, post: &Post) -> Route {
        let modern = self.shared.verdict().is_modern();
        match message {
            ClientJsonRpcMessage::Request(r)
                if matches!(r.request, ClientRequest::DiscoverRequest(_)) =>
            {
                Route::Discover
            }
            ClientJsonRpcMessage::Request(r)
                if modern && !matches!(r.request, ClientRequest::InitializeRequest(_)) =>
            {
                Route::ModernRequest
            }
            _ if modern && post.session_id.is_some() => Route::ModernWithoutSession,
            ClientJsonRpcMessage::Request(r)
                if matches!(r.request, ClientRequest::InitializeRequest(_)) =>
            {
                Route::Initialize
            }
            ClientJsonRpcMessage::Notification(n)
                if matches!(
                    n.notification,
                    ClientNotification::InitializedNotification(_)
                ) && self.shared.session().take_swallow_initialized() =>
            {
                Route::InitializedAgain
            }
            ClientJsonRpcMessage::Notification(_) => Route::Notification,
            ClientJsonRpcMessage::Request(_) => match post.session() {
                Some(session) => Route::SessionRequest(session),
                None => Route::AsIs,
            },
            ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_) => Route::Response,
        }
    }

    /// [`Route::Discover`].
    async fn discover(&self, message: ClientJsonRpcMessage, post: Post) -> PostResult<C::Error> {
        let id = match &message {
            ClientJsonRpcMessage::Request(request) => request.id.clone(),
            _ => return post.send(&self.inner, message).await,
        };
        if let Some(answer) = modern::cached_discover(&self.shared, &id) {
            return Ok(StreamableHttpPostResponse::Json(answer, None));
        }
        let requested = modern::requested_version(&message);
        // Never a session or cursor towards a server probed as modern.
        let response = post.without_session().send(&self.inner, message).await?;
        let (mut answer, sid) = first_answer::<C::Error>(response).await?;
        modern::after_discover(&self.shared, &mut answer, requested);
        Ok(StreamableHttpPostResponse::Json(answer, sid))
    }

    /// [`Route::ModernRequest`].
    async fn modern_request(
        &self,
        message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        if post.session_id.is_some() {
            warn!(server = %self.shared.key(), "not sending a session id to a server judged modern");
        }
        let post = post.without_session();
        let call = self.task_eligible(&message);
        let original = message.clone();
        let response = post.clone().send(&self.inner, message).await;
        let response = self.check_modern_verdict(response, original, post).await;
        self.watch_tasks(response, call)
    }

    /// A `tools/call` to a server without sessions, as the journal would
    /// keep it if the server answers it with a task.
    fn task_eligible(&self, message: &ClientJsonRpcMessage) -> Option<ModernCall> {
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        if !matches!(request.request, ClientRequest::CallToolRequest(_))
            || !self.shared.health().persisting()
        {
            return None;
        }
        let (method, params) = method_and_params(message);
        Some(ModernCall {
            local: request.id.clone(),
            method,
            params,
        })
    }

    /// Follows the answers of a server without sessions: a `tools/call`
    /// answered with a task is journaled with its task id (a restarted
    /// process collects it), and a `tasks/get` reporting a task ended
    /// takes it out again.
    fn watch_tasks(
        &self,
        response: PostResult<C::Error>,
        call: Option<ModernCall>,
    ) -> PostResult<C::Error> {
        match response {
            Ok(StreamableHttpPostResponse::Json(answer, sid)) => {
                if let Ok(value) = serde_json::to_value(&answer) {
                    watch_answer(&self.shared, &value, call.as_ref());
                }
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                let shared = self.shared.clone();
                let stream = stream
                    .inspect(move |item| {
                        if let Ok(event) = item
                            && let Some(data) = event.data.as_deref()
                            && data.contains("\"result\"")
                            && let Ok(value) = serde_json::from_str::<Value>(data)
                        {
                            watch_answer(&shared, &value, call.as_ref());
                        }
                    })
                    .boxed();
                Ok(StreamableHttpPostResponse::Sse(stream, sid))
            }
            other => other,
        }
    }

    /// [`Route::Initialize`].
    async fn initialize(&self, message: ClientJsonRpcMessage, post: Post) -> PostResult<C::Error> {
        let init_id = match &message {
            ClientJsonRpcMessage::Request(request) => request.id.clone(),
            _ => return post.send(&self.inner, message).await,
        };
        if post.session_id.is_none()
            && let Some(seed) = self.shared.session().take_seed()
        {
            info!(server = %self.shared.key(), session = %seed.session_id,
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
        let response = post.send(&self.inner, message).await?;
        let (answer, new_session) = first_answer::<C::Error>(response).await?;
        self.after_initialize(&answer, new_session.as_deref(), &init_id)
            .await;
        Ok(StreamableHttpPostResponse::Json(answer, new_session))
    }

    /// [`Route::Notification`].
    async fn notification(
        &self,
        mut message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        if let ClientJsonRpcMessage::Notification(n) = &mut message
            && let ClientNotification::CancelledNotification(c) = &mut n.notification
            && let Some(local) = &c.params.request_id
            && let Some(wire) = self.shared.ids().wire_of(local)
        {
            c.params.request_id = Some(NumberOrString::Number(wire));
        }
        post.send(&self.inner, message).await
    }

    /// [`Route::SessionRequest`].
    async fn session_request(
        &self,
        session: SessionId,
        mut message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        let ClientJsonRpcMessage::Request(request) = &mut message else {
            return post.send(&self.inner, message).await;
        };
        let local = request.id.clone();
        let wire = self.shared.ids().next(&session).await;
        request.id = NumberOrString::Number(wire);
        self.shared.ids().map(local, wire);
        // rmcp's own progress token (a per-process counter that starts at 0
        // in every process) is set on the request envelope and wins over
        // one the application put in the params. Taken off, the params show
        // the application's view, which is what is journaled.
        let rmcp_token = take_envelope_progress_token(request);
        let (method, params) = method_and_params(&message);
        if let ClientJsonRpcMessage::Request(request) = &mut message
            && let Some(rmcp_token) = rmcp_token
        {
            // On the wire the token is the wire id: unique within the
            // session across restarts, as wire ids are. Progress comes back
            // with the token the application knows: its own, else rmcp's.
            let local = params
                .as_ref()
                .and_then(|p| p.get("_meta"))
                .and_then(|m| m.get("progressToken"))
                .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok())
                .unwrap_or(rmcp_token);
            self.shared.ids().map_progress(wire, local);
            request
                .request
                .get_meta_mut()
                .set_progress_token(ProgressToken(NumberOrString::Number(wire)));
        }
        if self.shared.health().persisting() {
            self.shared.journal().record(
                &session,
                InFlightRequest::new(RequestId::Number(wire), method, params),
            );
        }
        match post.send(&self.inner, message).await {
            Err(error) => {
                self.shared.ids().take_local(wire);
                self.shared
                    .journal()
                    .complete(&session, RequestId::Number(wire));
                if matches!(error, StreamableHttpError::SessionExpired) {
                    self.shared.on_expired(&session);
                }
                Err(error)
            }
            Ok(StreamableHttpPostResponse::Json(mut answer, sid)) => {
                if let ServerJsonRpcMessage::Response(r) = &answer
                    && let ServerResult::GetTaskResult(got) = &r.result
                    && got.task.status().is_terminal()
                {
                    self.task_ended(&session, got.task.task.task_id.clone());
                }
                self.answer_back(&session, &mut answer);
                self.check_legacy_verdict(&session, &mut answer);
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                Ok(StreamableHttpPostResponse::Sse(
                    self.observe(stream, StreamOwner::Request(session, wire)),
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
    async fn check_modern_verdict(
        &self,
        mut response: PostResult<C::Error>,
        original: ClientJsonRpcMessage,
        post: Post,
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
        let verdict = self.shared.verdict();
        if !verdict.claim_reprobe() {
            warn!(server = %self.shared.key(), %reason,
                "protocol version refused again; already re-probed once in this process, giving up");
            return response;
        }
        let Some(stale) = verdict.forget() else {
            return response;
        };
        let stale = verdict_text(&stale);
        warn!(server = %self.shared.key(), %stale, %reason,
            "the stored era verdict stopped working; forgetting it and probing the server again, once");
        let outcome = match modern::reprobe_request(&original) {
            Some(probe) => self.reprobe(probe, &post).await,
            None => modern::Reprobe::Failed,
        };
        let new_verdict = verdict.profile().as_ref().map(verdict_text);
        self.shared.health().notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: new_verdict.clone(),
        });
        match outcome {
            modern::Reprobe::Retry => {
                info!(server = %self.shared.key(), "re-probe: the version is supported; sending the request once more");
                let mut retried = post.send(&self.inner, original).await;
                if let Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _)) =
                    &mut retried
                    && modern::is_unsupported(e.error.code)
                {
                    warn!(server = %self.shared.key(), "refused again after the re-probe; giving up");
                    e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
                }
                retried
            }
            modern::Reprobe::NewVerdict => {
                warn!(server = %self.shared.key(), new_verdict = ?new_verdict,
                    "re-probe stored a new verdict; this connection fails, the next start uses it");
                response
            }
            modern::Reprobe::Failed => {
                warn!(server = %self.shared.key(),
                    "re-probe found no usable verdict; the next start probes again");
                response
            }
        }
    }

    /// Sends the re-probing `server/discover` on the refused request's
    /// terms and stores what it finds.
    async fn reprobe(&self, probe: ClientJsonRpcMessage, post: &Post) -> modern::Reprobe {
        let requested = modern::requested_version(&probe);
        // The request's own routing headers (`Mcp-Method`, `Mcp-Name`,
        // `Mcp-Param-*`) would contradict the probe's body.
        let mut post = post.clone();
        post.custom_headers
            .retain(|name, _| !is_routing_header(name));
        post.custom_headers.insert(
            header_name(HEADER_MCP_METHOD),
            HeaderValue::from_static("server/discover"),
        );
        let answer = match post.send(&self.inner, probe).await {
            Ok(r) => first_answer::<C::Error>(r).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((answer, _)) => modern::after_reprobe(&self.shared, &answer, requested),
            Err(e) => {
                warn!(server = %self.shared.key(), error = %e, "re-probe failed");
                modern::Reprobe::Failed
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
        let verdict = self.shared.verdict();
        if !verdict.claim_reprobe() {
            return;
        }
        let Some(stale) = verdict.forget() else {
            return;
        };
        let stale = verdict_text(&stale);
        warn!(server = %self.shared.key(), %stale, %reason,
            "the stored legacy verdict stopped working; forgetting it and the session, the next start probes again");
        self.shared.on_ended(session);
        self.shared.health().notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: None,
        });
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
            debug!(server = %self.shared.key(), "server runs without sessions; nothing to keep");
            return;
        };
        match SessionId::new(sid.to_owned()) {
            Ok(sid) => {
                self.shared
                    .on_initialized(sid, result.clone(), init_id)
                    .await
            }
            Err(e) => {
                warn!(server = %self.shared.key(), error = %e, "server sent a session id that cannot be stored")
            }
        }
    }

    /// The application's own `tasks/get` saw the task end.
    fn task_ended(&self, session: &SessionId, task: String) {
        debug!(server = %self.shared.key(), %task, "tasks/get says the task ended; its request leaves the journal");
        self.shared.journal().task_done(session, task);
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
        if let Some(local) = self.shared.ids().take_local(wire) {
            *id = local;
            let task = match answer {
                ServerJsonRpcMessage::Response(r) => match &r.result {
                    ServerResult::CreateTaskResult(created) => Some(created.task.task_id.clone()),
                    _ => None,
                },
                _ => None,
            };
            let journal = self.shared.journal();
            match task {
                Some(task) => {
                    debug!(server = %self.shared.key(), request = wire, %task, "answered with a task; journaling its id");
                    journal.task(session, RequestId::Number(wire), task)
                }
                None => journal.complete(session, RequestId::Number(wire)),
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
                let journal = shared.journal();
                if let Some(id) = event.id.as_deref() {
                    match &owner {
                        StreamOwner::Request(s, wire) => {
                            journal.cursor(s, RequestId::Number(*wire), id)
                        }
                        StreamOwner::Standalone(s) => journal.standalone_cursor(s, id),
                        StreamOwner::Other(_) => {}
                    }
                }
                let session = match &owner {
                    StreamOwner::Request(s, _) | StreamOwner::Standalone(s) => Some(s),
                    StreamOwner::Other(s) => s.as_ref(),
                };
                if let Some(data) = event.data.as_deref()
                    && data.contains("notifications/progress")
                    && let Some(text) = progress_back(&shared, data)
                {
                    event.data = Some(text);
                    return Ok(event);
                }
                if let Some(data) = event.data.as_deref()
                    && (data.contains("\"result\"") || data.contains("\"error\""))
                    && let Ok(mut value) = serde_json::from_str::<Value>(data)
                    && value.get("method").is_none()
                    && let Some(wire) = value.get("id").and_then(Value::as_i64)
                    && let Some(local) = shared.ids().take_local(wire)
                {
                    value["id"] = local.into_json_value();
                    if let Some(session) = session
                        && let Some(task) = value.get("result").and_then(ended_task_id)
                    {
                        debug!(%task, "tasks/get says the task ended; its request leaves the journal");
                        journal.task_done(session, task);
                    }
                    if let Some(session) = session {
                        match value.get("result").and_then(task_id_of) {
                            Some(task) => journal.task(session, RequestId::Number(wire), task),
                            None => journal.complete(session, RequestId::Number(wire)),
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

/// A `tools/call` sent to a server without sessions.
struct ModernCall {
    /// rmcp's id (not renumbered: there is no session to be unique in).
    local: NumberOrString,
    method: String,
    params: Option<Value>,
}

/// Journals `call` if `answer` gives it a task; closes the journal entry
/// of a task `answer` (to a `tasks/get`) reports ended.
fn watch_answer(shared: &Shared, answer: &Value, call: Option<&ModernCall>) {
    let Some(result) = answer.get("result") else {
        return;
    };
    let journal = shared.journal();
    if let Some(task) = ended_task_id(result) {
        debug!(server = %shared.key(), %task, "tasks/get says the task ended; its request leaves the journal");
        journal.task_done(&sessionless(), task);
        return;
    }
    let Some(call) = call else { return };
    let Some(task) = task_id_of(result) else {
        return;
    };
    if answer.get("id") != serde_json::to_value(&call.local).ok().as_ref() {
        return;
    }
    let mut record = InFlightRequest::new(
        RequestId::String(format!("{}-{}", process_tag(), call.local)),
        call.method.clone(),
        call.params.clone(),
    );
    record.task_id = Some(task.clone());
    info!(server = %shared.key(), %task, "answered with a task; journaling it so a restarted process can collect it");
    journal.record(&sessionless(), record);
}

/// Distinguishes this process's journal entries for a server without
/// sessions from those of earlier processes (rmcp numbers from 0 in each).
fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!("p{:x}{:x}", std::process::id(), nanos)
    })
}

/// A verdict as the application reads it: `modern 2026-07-28`.
fn verdict_text(profile: &ServerProfile) -> String {
    let era = match profile.era {
        ProtocolEra::Modern => "modern",
        ProtocolEra::Legacy => "legacy",
        _ => "unknown",
    };
    format!("{era} {}", profile.protocol_version)
}

/// The task id of a `tasks/get` answer whose task ended (completed,
/// failed or cancelled).
fn ended_task_id(result: &Value) -> Option<String> {
    if result.get("resultType").and_then(Value::as_str) == Some("task") {
        return None;
    }
    let status = result.get("status")?.as_str()?;
    if !matches!(status, "completed" | "failed" | "cancelled") {
        return None;
    }
    result.get("taskId")?.as_str().map(str::to_owned)
}

/// The task id of a `CreateTaskResult` (`resultType: "task"`, the task's
/// fields inlined), if the result is one.
fn task_id_of(result: &Value) -> Option<String> {
    if result.get("resultType").and_then(Value::as_str) != Some("task") {
        return None;
    }
    result.get("taskId")?.as_str().map(str::to_owned)
}

/// Takes the progress token rmcp set on a request's envelope (its `_meta`
/// extension), if any.
fn take_envelope_progress_token(
    request: &mut rmcp::model::JsonRpcRequest<ClientRequest>,
) -> Option<ProgressToken> {
    let meta = request.request.get_meta_mut();
    let token = meta.get_progress_token()?;
    meta.0.0.remove(PROGRESS_TOKEN);
    Some(token)
}

/// A progress notification with the wire token of a request in flight,
/// rewritten with the token the application knows.
fn progress_back(shared: &Shared, data: &str) -> Option<String> {
    let mut value = serde_json::from_str::<Value>(data).ok()?;
    if value.get("method").and_then(Value::as_str) != Some("notifications/progress") {
        return None;
    }
    let token = value.get("params")?.get(PROGRESS_TOKEN)?.clone();
    let wire = serde_json::from_value::<ProgressToken>(token).ok()?;
    let local = shared.ids().local_progress(&wire)?;
    value["params"][PROGRESS_TOKEN] = serde_json::to_value(&local).ok()?;
    serde_json::to_string(&value).ok()
}

const PROGRESS_TOKEN: &str = "progressToken";

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
        let post = Post {
            uri,
            session_id,
            auth_header,
            custom_headers,
            limits: Limits::Default,
        };
        self.post(message, post).await
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
        let post = Post {
            uri,
            session_id,
            auth_header,
            custom_headers,
            limits: Limits::SseEvent(max_sse_event_size),
        };
        self.post(message, post).await
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
        let post = Post {
            uri,
            session_id,
            auth_header,
            custom_headers,
            limits: Limits::Response(limits),
        };
        self.post(message, post).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        if self.shared.session().ending() {
            return self
                .inner
                .delete_session(uri, session_id, auth_header, custom_headers)
                .await;
        }
        debug!(server = %self.shared.key(), "keeping the session for the next process (no DELETE)");
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
        if let Some(cursor) = self.standalone_cursor(&owner) {
            match self.resumed_or_fresh(open(Some(cursor)).await) {
                Ok(Some(stream)) => return Ok(self.follow(stream, owner)),
                Ok(None) => {}
                Err(e) => return Err(self.session_gone_quietly(e, &owner)),
            }
        }
        match open(last_event_id).await {
            Ok(stream) => Ok(self.follow(stream, owner)),
            Err(e) => Err(self.session_gone_quietly(e, &owner)),
        }
    }

    /// A GET stream, observed; the standalone one also carries the
    /// messages the handle delivers (recovered notifications).
    fn follow(&self, stream: SseStream, owner: StreamOwner) -> SseStream {
        let standalone = matches!(owner, StreamOwner::Standalone(_));
        let stream = self.observe(stream, owner);
        if standalone {
            self.shared.inbox().merge(stream)
        } else {
            stream
        }
    }

    /// A GET refused with 404: the server no longer knows the session (it
    /// restarted, or the session expired). rmcp would log that as an error
    /// on every start after an expiry, and retry a stream that cannot come
    /// back; told the server has no stream instead, it goes on quietly, and
    /// its next POST meets the same 404 and re-initializes, which opens the
    /// new session's stream.
    fn session_gone_quietly(
        &self,
        error: StreamableHttpError<C::Error>,
        owner: &StreamOwner,
    ) -> StreamableHttpError<C::Error> {
        if http_status(&error) != Some(404) {
            return error;
        }
        let session = match owner {
            StreamOwner::Standalone(s) => Some(s),
            StreamOwner::Other(s) => s.as_ref(),
            StreamOwner::Request(s, _) => Some(s),
        };
        info!(server = %self.shared.key(), session = ?session.map(SessionId::as_str),
            "GET answered 404: the server no longer knows the session; the next request re-initializes");
        StreamableHttpError::ServerDoesNotSupportSse
    }
}

impl<C> DurableHttpClient<C> {
    /// Modern servers get no GET stream and no `Last-Event-ID`.
    fn judged_modern(&self) -> bool {
        self.shared.verdict().is_modern()
    }

    /// For the first standalone GET of a session resumed after a restart:
    /// where the previous process stopped reading, so that the server replays
    /// what was sent while no process listened.
    fn standalone_cursor(&self, owner: &StreamOwner) -> Option<String> {
        let StreamOwner::Standalone(session) = owner else {
            return None;
        };
        let cursor = self.shared.session().take_standalone_cursor(session)?;
        info!(server = %self.shared.key(), session = %session, "resuming the standalone stream where the previous process stopped");
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
            // The session is gone, not just its events.
            Err(e) if http_status(&e) == Some(404) => Err(e),
            Err(e) => {
                warn!(server = %self.shared.key(), error = %e, "the server would not resume the standalone stream; opening a fresh one (messages sent meanwhile are lost)");
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
