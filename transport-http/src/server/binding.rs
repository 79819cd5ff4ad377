//! The tower layer in front of rmcp: session-to-principal binding and clear
//! answers to bad `Last-Event-ID`s.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode, request::Parts};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use mcp_persist_core::{Error, EventId, SessionId};
use rmcp::{
    model::ProtocolVersion,
    transport::common::http_header::{
        HEADER_LAST_EVENT_ID, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
    },
};
use tracing::{debug, warn};

use super::session_store::{DELETE_OUTCOME, DeleteOutcome, Deleted, REQUEST_PRINCIPAL};

/// Sessions whose binding is cached per instance before the cache is reset.
const BINDING_CACHE_LIMIT: usize = 16_384;

/// The authenticated principal of a request, as the application's auth
/// middleware puts it into the request extensions.
///
/// A session is bound to the principal of the request that created it; the
/// same session id presented under another principal (or none) is answered
/// 404, as if the session did not exist.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal(String);

impl Principal {
    /// A principal named `name` (a user id, a client id, a token subject).
    pub fn new(name: impl Into<String>) -> Self {
        Principal(name.into())
    }

    /// The principal's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub(super) type PrincipalFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

struct Shared {
    sessions: mcp_persist_core::ServerSessionStore,
    events: Option<mcp_persist_core::EventLog>,
    principal: Arc<PrincipalFn>,
    /// Session id to the principal it is bound to. Bindings never change,
    /// so a cached one stays right for the life of the session.
    bindings: Mutex<HashMap<SessionId, Option<String>>>,
}

/// A tower [`Layer`](tower_layer::Layer) that binds sessions to principals
/// and checks `Last-Event-ID`s before rmcp sees them. Works with any tower
/// stack (axum: `Router::layer`, or wrap the service directly).
///
/// **The rule:** a legacy session, and every stream recorded in it, is
/// reachable only by a request that presents that session *and* the
/// principal it is bound to, whatever protocol version the request claims.
/// Per request:
///
/// 1. The principal is read from the [`Principal`] request extension (or the
///    closure given to [`principal_from`](Self::principal_from)), and kept
///    for the duration of the request, so an `initialize` stores it with the
///    new session in the same write. A request without one is the anonymous
///    principal: it reaches only sessions created anonymously.
/// 2. A request of the sessionless revision (`MCP-Protocol-Version`
///    `2026-07-28` or later) has no session and no resumable stream: its
///    `Mcp-Session-Id` and `Last-Event-ID` headers are removed before rmcp
///    or the handler sees them. It is served statelessly; it cannot
///    initialize into, resume, touch or delete a session, and a handler never
///    sees a session id the binding did not vouch for. A `GET` or `DELETE`
///    of that revision gets rmcp's `405`.
/// 3. Any other request naming a session bound to another principal is
///    passed on as if it named an id no session has, so its answer (rmcp's
///    `404`, or whatever rmcp answers an unknown id on that path) is the
///    answer an unknown id gets, byte for byte, on every instance: a session
///    id cannot be probed for existence.
/// 4. A `GET` carrying `Last-Event-ID` in a session it may use (or in none)
///    is checked against the event log: a malformed id is answered `400`; an
///    id whose stream this request may not resume (expired, never existed,
///    forged, or recorded in another session or in none) `410 Gone`, the
///    same bytes whichever it is, so a stream id cannot be probed for
///    existence either; one whose events have expired or were lost `410
///    Gone` saying so. Each has a plain-text body. Never an empty `200`
///    stream that sends the client polling forever. The id `0` that rmcp
///    primes a standalone stream with names no event: it starts the
///    standalone stream afresh.
/// 5. A `DELETE` of a session answers `204 No Content` when it ended a live
///    session, and rmcp's `404 Not Found` (the answer every other method
///    gets for an unknown id) when there was none to end, another
///    principal's included.
///
/// Place it directly around rmcp's service (no layer that spawns the request
/// onto another task in between), so the principal reaches the store.
#[derive(Clone)]
pub struct SessionBindingLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SessionBindingLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBindingLayer")
            .field("sessions", &self.shared.sessions)
            .field("events", &self.shared.events)
            .finish_non_exhaustive()
    }
}

pub(super) fn principal_from_extension(parts: &Parts) -> Option<String> {
    parts.extensions.get::<Principal>().map(|p| p.0.clone())
}

impl SessionBindingLayer {
    /// A layer checking sessions in `sessions` and, when given, event ids
    /// in `events`, reading the principal from the [`Principal`] extension.
    pub fn new(
        sessions: mcp_persist_core::ServerSessionStore,
        events: Option<mcp_persist_core::EventLog>,
    ) -> Self {
        Self::with_principal_fn(sessions, events, Arc::new(principal_from_extension))
    }

    pub(super) fn with_principal_fn(
        sessions: mcp_persist_core::ServerSessionStore,
        events: Option<mcp_persist_core::EventLog>,
        principal: Arc<PrincipalFn>,
    ) -> Self {
        SessionBindingLayer {
            shared: Arc::new(Shared {
                sessions,
                events,
                principal,
                bindings: Mutex::default(),
            }),
        }
    }

    /// Reads the principal with `f` instead of from the [`Principal`]
    /// extension (from a claims type your auth middleware inserts, say).
    pub fn principal_from<F>(self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Self::with_principal_fn(
            self.shared.sessions.clone(),
            self.shared.events.clone(),
            Arc::new(f),
        )
    }
}

impl<S> tower_layer::Layer<S> for SessionBindingLayer {
    type Service = SessionBinding<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SessionBinding {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service made by [`SessionBindingLayer`].
#[derive(Clone)]
pub struct SessionBinding<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> std::fmt::Debug for SessionBinding<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBinding").finish_non_exhaustive()
    }
}

/// What the layer answers instead of passing a request on.
enum Refusal {
    BadRequest(String),
    Gone(String),
    Unavailable,
}

impl Refusal {
    fn into_response<E: 'static>(self) -> Response<BoxBody<Bytes, E>> {
        let (status, body) = match self {
            Refusal::BadRequest(body) => (StatusCode::BAD_REQUEST, body),
            Refusal::Gone(body) => (StatusCode::GONE, body),
            Refusal::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: the session store cannot be reached".to_owned(),
            ),
        };
        let mut response = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never: Infallible| match never {})
                .boxed(),
        );
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// rmcp's answer to a request naming a session it does not hold, byte for
/// byte (status, no content type, body).
fn session_not_found<E: 'static>() -> Response<BoxBody<Bytes, E>> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(b"Not Found: Session not found"))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Whether the request claims a revision without sessions, classified as
/// rmcp classifies it: a version header at or after the first revision with
/// no `initialize` (an unknown one there is rmcp's to refuse).
fn claims_sessionless(parts: &Parts) -> bool {
    parts
        .headers
        .get(HEADER_MCP_PROTOCOL_VERSION)
        .is_some_and(|v| v.as_bytes() >= ProtocolVersion::NO_INITIALIZE.as_str().as_bytes())
}

/// A session id that names no session: 128 random bits, fresh per request,
/// in the shape of the ids rmcp hands out. A request naming another
/// principal's session is passed on with this in its place, so every path
/// answers it exactly as it answers an id nobody holds.
fn unknown_session_id() -> Result<String, Refusal> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        warn!(error = %e, "no randomness for a stand-in session id");
        Refusal::Unavailable
    })?;
    let hex = mcp_persist_core::kit::hex(&bytes);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

impl Shared {
    async fn bound_principal(&self, id: &SessionId) -> Result<Option<Option<String>>, Error> {
        if let Some(bound) = self
            .bindings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
        {
            return Ok(Some(bound.clone()));
        }
        let Some(session) = self.sessions.load(id).await? else {
            return Ok(None);
        };
        let mut bindings = self.bindings.lock().unwrap_or_else(|p| p.into_inner());
        if bindings.len() >= BINDING_CACHE_LIMIT {
            bindings.clear();
        }
        bindings.insert(id.clone(), session.principal.clone());
        Ok(Some(session.principal))
    }

    /// Applies the rule of [`SessionBindingLayer`] to a request's head,
    /// rewriting its session headers where the rule says so.
    async fn check(&self, parts: &mut Parts, principal: &Option<String>) -> Result<(), Refusal> {
        if claims_sessionless(parts) {
            if parts.headers.remove(HEADER_SESSION_ID).is_some() {
                debug!("ignored Mcp-Session-Id on a request of the sessionless revision");
            }
            if parts.headers.remove(HEADER_LAST_EVENT_ID).is_some() {
                debug!("ignored Last-Event-ID on a request of the sessionless revision");
            }
            return Ok(());
        }
        let named = parts
            .headers
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| SessionId::new(v).ok());
        // The session this request may use: named, stored, and bound to
        // this principal.
        let mut vouched = None;
        if let Some(id) = named.clone() {
            match self.bound_principal(&id).await {
                Ok(Some(bound)) if bound != *principal => {
                    warn!(
                        "a session presented under another principal; answering as for an unknown id"
                    );
                    let stand_in = unknown_session_id()?;
                    parts.headers.insert(
                        HEADER_SESSION_ID,
                        http::HeaderValue::from_str(&stand_in).map_err(|_| Refusal::Unavailable)?,
                    );
                }
                Ok(Some(_)) => vouched = Some(id),
                // Unknown or expired sessions are rmcp's to answer.
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "session store failed while checking a binding");
                    return Err(Refusal::Unavailable);
                }
            }
        }
        if parts.method == http::Method::GET
            && let (Some(events), Some(last)) =
                (&self.events, parts.headers.get(HEADER_LAST_EVENT_ID))
        {
            if last.as_bytes() == b"0" {
                // rmcp's priming id for a standalone stream that had no event
                // yet: nothing to resume from, so a fresh standalone stream.
                parts.headers.remove(HEADER_LAST_EVENT_ID);
                return Ok(());
            }
            // A session that is unknown here (or another principal's, now a
            // stand-in) is answered by rmcp exactly as any unknown session:
            // checking the event id against it would tell the two apart.
            if named.is_some() && vouched.is_none() {
                return Ok(());
            }
            let last = last.to_str().map_err(|_| {
                Refusal::BadRequest(
                    "Bad Request: malformed Last-Event-ID: not visible ASCII".into(),
                )
            })?;
            check_last_event_id(events, last, vouched.as_ref()).await?;
        }
        Ok(())
    }
}

/// The answer to a `Last-Event-ID` whose stream this request may not resume:
/// expired, never existed, forged, or another session's (the last one is not
/// told apart from the others, so an id cannot be probed for existence).
const UNKNOWN_STREAM: &str = "Gone: the event stream of this Last-Event-ID has expired or never existed; it cannot be resumed";

async fn check_last_event_id(
    events: &mcp_persist_core::EventLog,
    last: &str,
    session: Option<&SessionId>,
) -> Result<(), Refusal> {
    if let Err(e) = last.parse::<EventId>() {
        debug!(error = %e, "refused a malformed Last-Event-ID");
        return Err(Refusal::BadRequest(format!(
            "Bad Request: malformed Last-Event-ID ({e}); resume with an event id this server sent, or start a new request"
        )));
    }
    match events.check(last, session).await {
        Ok(_) => Ok(()),
        Err(Error::InvalidInput { .. }) => {
            // Answered exactly as a stream nobody has: telling the two apart
            // would confirm that the id names a live stream of someone else.
            warn!(
                "refused a Last-Event-ID naming a stream of another session (answered as unknown)"
            );
            Err(Refusal::Gone(UNKNOWN_STREAM.into()))
        }
        Err(Error::NotFound {
            what: "events",
            detail,
        }) => {
            debug!(?detail, "refused a Last-Event-ID whose events are gone");
            Err(Refusal::Gone(match detail {
                Some(detail) if detail.contains("lost") => format!(
                    "Gone: {detail}"
                ),
                _ => "Gone: the events after this Last-Event-ID have expired; the stream cannot be resumed".into(),
            }))
        }
        Err(Error::NotFound { .. }) => {
            debug!("refused a Last-Event-ID of an unknown or expired stream");
            Err(Refusal::Gone(UNKNOWN_STREAM.into()))
        }
        Err(e) => {
            warn!(error = %e, "event store failed while checking a Last-Event-ID");
            Err(Refusal::Unavailable)
        }
    }
}

impl<S, B, RB> tower_service::Service<Request<B>> for SessionBinding<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    RB::Error: 'static,
{
    type Response = Response<BoxBody<Bytes, RB::Error>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Take the service that was driven ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let delete = parts.method == http::Method::DELETE;
            let principal = (shared.principal)(&parts);
            if let Err(refusal) = shared.check(&mut parts, &principal).await {
                return Ok(refusal.into_response());
            }
            let request = Request::from_parts(parts, body);
            let call = REQUEST_PRINCIPAL.scope(principal, inner.call(request));
            if !delete {
                return Ok(call.await?.map(|body| body.boxed()));
            }
            let outcome = Arc::new(DeleteOutcome::default());
            let mut response = DELETE_OUTCOME.scope(outcome.clone(), call).await?;
            if response.status() != http::StatusCode::ACCEPTED {
                return Ok(response.map(|body| body.boxed()));
            }
            // rmcp answers every session DELETE with 202 Accepted, whether or
            // not there was a session to end.
            match outcome.get() {
                // Some official SDKs (Python) accept only 200 or 204 and log
                // every other status as a failed termination. The session is
                // gone when the answer is written: 204 says it plainly.
                Some(Deleted::Ended) => *response.status_mut() = http::StatusCode::NO_CONTENT,
                // The spec's answer for an id with no session. A foreign id
                // reaches here as a stand-in nobody holds: the same bytes.
                Some(Deleted::Absent) => {
                    debug!("DELETE of no live session: 404");
                    return Ok(session_not_found());
                }
                Some(Deleted::Failed) => return Ok(Refusal::Unavailable.into_response()),
                // rmcp's session store is not ours: what it deleted is
                // unknown, and the session is gone either way.
                None => *response.status_mut() = http::StatusCode::NO_CONTENT,
            }
            Ok(response.map(|body| body.boxed()))
        })
    }
}
