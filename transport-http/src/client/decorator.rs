//! The `StreamableHttpClient` decorator: a router. Every call rmcp makes
//! is handed to the module that owns its concern, under the client's
//! `tracing` span:
//!
//! | concern | module |
//! |---|---|
//! | era verdict, `server/discover`, re-probe | [`era`](super::era) |
//! | `initialize`, new, expired and ended sessions | [`session`](super::session) |
//! | renumbering and journaling requests in a session | [`requests`](super::requests) |
//! | progress tokens | [`progress`](super::progress) |
//! | task calls and their end | [`tasks`](super::tasks) |
//! | GET streams, their resume, following SSE | [`streams`](super::streams) |
//! | passing a call on to the wrapped client | [`delegate`](super::delegate) |
//! | each request's span and duration | [`spans`](super::spans) |
//!
//! Every POST is routed by [`Route`]: read that enum to find where a
//! message goes.

use std::{collections::HashMap, sync::Arc};

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use mcp_persist_core::{ServerKey, SessionId, telemetry::Telemetry};
use rmcp::{
    model::{ClientJsonRpcMessage, ClientNotification, ClientRequest},
    transport::streamable_http_client::{
        StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use tracing::{Instrument, Span, debug};

use super::{
    delegate::{Get, Limits, Post, PostResult, SseStream},
    era::Era,
    requests::Requests,
    session::Lifecycle,
    spans::RequestSpan,
    streams::{StreamOwner, Streams},
    tasks::TaskWatch,
};

/// An rmcp [`StreamableHttpClient`] that keeps its session in a store.
///
/// It wraps another client (rmcp's reqwest client, or rmcp's `AuthClient`
/// over it) and is made by [`DurableClientBuilder`](super::builder::DurableClientBuilder);
/// see the [module docs](super) for what it does.
#[derive(Clone)]
pub struct DurableHttpClient<C> {
    pub(crate) inner: C,
    pub(crate) routes: Arc<Routes>,
}

/// The concerns a call can be routed to, each with the parts of the
/// client's state it uses, and the client's span.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The server and profile, for `Debug`.
    pub(crate) key: ServerKey,
    /// Entered around every call; carries the server and profile.
    pub(crate) span: Span,
    pub(crate) era: Era,
    pub(crate) session: Lifecycle,
    pub(crate) requests: Requests,
    pub(crate) tasks: TaskWatch,
    pub(crate) streams: Streams,
    /// Where request durations go, and how session ids appear in spans.
    pub(crate) telemetry: Telemetry,
}

impl<C> std::fmt::Debug for DurableHttpClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableHttpClient")
            .field("server", &self.routes.key)
            .finish_non_exhaustive()
    }
}

/// Where a message rmcp posts goes, checked in this order.
enum Route {
    /// `server/discover`: answered from the stored verdict when it allows,
    /// else sent without a session and learned from ([`Era::discover`]).
    Discover,
    /// Any other request to a server judged modern: sent without a session;
    /// a refusal of its protocol version re-probes the server once
    /// ([`Era::modern_request`]); a `tools/call` gets an idempotency key
    /// and is journaled until answered, with its task id if it is answered
    /// with a task ([`TaskWatch::eligible`], [`TaskWatch::watch`]).
    ModernRequest,
    /// Anything else carrying a session id to a server judged modern: sent
    /// without the session id.
    ModernWithoutSession,
    /// `initialize`: answered from the stored session after a restart, else
    /// sent, and the new session stored ([`Lifecycle::initialize`]).
    Initialize,
    /// The `notifications/initialized` after an `initialize` answered from
    /// the store: dropped, the server has it from the first process.
    InitializedAgain,
    /// Another notification: a cancellation is renumbered to the wire id of
    /// the request it cancels.
    Notification,
    /// A request in a session: renumbered and journaled
    /// ([`Requests::prepare`]), and its answer (JSON or SSE) followed back
    /// to rmcp's id.
    SessionRequest(SessionId),
    /// The client's answer to a request of the server: sent as it is (the
    /// server numbered that request, not us).
    Response,
    /// A request outside any session (a legacy server that keeps none):
    /// sent as it is, except that a `tools/call` gets an idempotency key
    /// and is journaled until answered, as for a modern server, so that a
    /// restarted process learns of it (as lost with its outcome unknown,
    /// the server not promising to run it once).
    Sessionless,
}

impl<C: StreamableHttpClient + Sync> DurableHttpClient<C> {
    /// Routes one POST inside its request's span ([`RequestSpan`]); a
    /// response stream stays under the client's span.
    async fn post(&self, mut message: ClientJsonRpcMessage, post: Post) -> PostResult<C::Error> {
        let routes = &*self.routes;
        let modern = routes.era.is_modern();
        let version = || {
            (!modern)
                .then(|| routes.session.state().protocol_version())
                .flatten()
        };
        let session = post.session_id.clone().filter(|_| !modern);
        let traced =
            RequestSpan::begin(&mut message, &routes.telemetry, session.as_deref(), version);
        let response = match &traced {
            Some(traced) => {
                let span = traced.span().clone();
                self.dispatch(message, post).instrument(span).await
            }
            None => self.dispatch(message, post).await,
        };
        let response = match traced {
            Some(traced) => traced.finish(response),
            None => response,
        };
        match response {
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => Ok(
                StreamableHttpPostResponse::Sse(in_span(stream, &routes.span), sid),
            ),
            other => other,
        }
    }

    /// Sends one POST by its [`Route`].
    async fn dispatch(&self, message: ClientJsonRpcMessage, post: Post) -> PostResult<C::Error> {
        let routes = &*self.routes;
        match self.route(&message, &post) {
            Route::Discover => routes.era.discover(&self.inner, message, post).await,
            Route::ModernRequest => {
                let mut message = message;
                let call = routes.tasks.eligible(&mut message);
                let response = routes.era.modern_request(&self.inner, message, post).await;
                routes.tasks.watch(response, call)
            }
            Route::ModernWithoutSession => {
                Era::without_session(post).send(&self.inner, message).await
            }
            Route::Initialize => routes.session.initialize(&self.inner, message, post).await,
            Route::InitializedAgain => {
                debug!(
                    "initialized notification dropped: the server has it from the first process"
                );
                Ok(StreamableHttpPostResponse::Accepted)
            }
            Route::Notification => {
                let mut message = message;
                routes.requests.renumber_cancellation(&mut message);
                post.send(&self.inner, message).await
            }
            Route::SessionRequest(session) => self.session_request(session, message, post).await,
            Route::Sessionless => {
                let mut message = message;
                let call = routes.tasks.eligible(&mut message);
                let response = post.send(&self.inner, message).await;
                routes.tasks.watch(response, call)
            }
            Route::Response => post.send(&self.inner, message).await,
        }
    }

    /// Decides the [`Route`] of `message`.
    fn route(&self, message: &ClientJsonRpcMessage, post: &Post) -> Route {
        let modern = self.routes.era.is_modern();
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
                ) && self.routes.session.initialized_again() =>
            {
                Route::InitializedAgain
            }
            ClientJsonRpcMessage::Notification(_) => Route::Notification,
            ClientJsonRpcMessage::Request(_) => match post.session() {
                Some(session) => Route::SessionRequest(session),
                None => Route::Sessionless,
            },
            ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_) => Route::Response,
        }
    }

    /// [`Route::SessionRequest`]: the request goes out renumbered and
    /// journaled; a 404 expires the session; a JSON answer closes the
    /// request's entry and may prove the legacy verdict stale; an SSE
    /// answer is followed.
    async fn session_request(
        &self,
        session: SessionId,
        mut message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        let routes = &*self.routes;
        let Some(wire) = routes.requests.prepare(&session, &mut message).await else {
            return post.send(&self.inner, message).await;
        };
        match post.send(&self.inner, message).await {
            Err(error) => {
                routes.requests.not_sent(&session, wire);
                if matches!(error, StreamableHttpError::SessionExpired) {
                    routes.session.expired(&session);
                }
                Err(error)
            }
            Ok(StreamableHttpPostResponse::Json(mut answer, sid)) => {
                routes.requests.answered(&session, &mut answer);
                routes
                    .era
                    .legacy_answer(&mut answer, || routes.session.ended(&session));
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                Ok(StreamableHttpPostResponse::Sse(
                    routes
                        .streams
                        .follow(stream, StreamOwner::Request(session, wire)),
                    sid,
                ))
            }
            Ok(other) => Ok(other),
        }
    }

    /// Routes one GET: none for a server judged modern; else opened,
    /// resumed and followed by [`Streams::open`], under the client's span.
    async fn get(
        &self,
        get: Get,
        last_event_id: Option<String>,
    ) -> Result<SseStream, StreamableHttpError<C::Error>> {
        if self.routes.era.is_modern() {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        let stream = self
            .routes
            .streams
            .open(&self.inner, get, last_event_id)
            .await?;
        Ok(in_span(stream, &self.routes.span))
    }
}

/// `stream`, polled inside `span`: what following it logs carries the
/// client's server and profile.
fn in_span(mut stream: SseStream, span: &Span) -> SseStream {
    if span.is_disabled() {
        return stream;
    }
    let span = span.clone();
    futures::stream::poll_fn(move |cx| {
        let _entered = span.enter();
        stream.poll_next_unpin(cx)
    })
    .boxed()
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
        let span = self.routes.span.clone();
        self.post(message, post).instrument(span).await
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
        let span = self.routes.span.clone();
        self.post(message, post).instrument(span).await
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
        let span = self.routes.span.clone();
        self.post(message, post).instrument(span).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let span = self.routes.span.clone();
        async {
            if self.routes.session.lets_delete_through() {
                return self
                    .inner
                    .delete_session(uri, session_id, auth_header, custom_headers)
                    .await;
            }
            debug!("keeping the session for the next process (no DELETE)");
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        let get = Get {
            uri,
            session_id,
            auth_header,
            custom_headers,
            max_sse_event_size: None,
        };
        let span = self.routes.span.clone();
        self.get(get, last_event_id).instrument(span).await
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
        let get = Get {
            uri,
            session_id,
            auth_header,
            custom_headers,
            max_sse_event_size: Some(max_sse_event_size),
        };
        let span = self.routes.span.clone();
        self.get(get, last_event_id).instrument(span).await
    }
}
