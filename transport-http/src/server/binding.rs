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
use tracing::{debug, warn};

use super::session_store::REQUEST_PRINCIPAL;

const HEADER_SESSION_ID: &str = "mcp-session-id";
const HEADER_LAST_EVENT_ID: &str = "last-event-id";
const HEADER_PROTOCOL_VERSION: &str = "mcp-protocol-version";
/// The first protocol revision without sessions: its requests ignore
/// `Mcp-Session-Id`, so the binding does not apply to them.
const SESSIONLESS_VERSION: &str = "2026-07-28";
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
    sessions: mcp_persist_core::SessionStore,
    events: Option<mcp_persist_core::EventStore>,
    principal: Arc<PrincipalFn>,
    /// Session id to the principal it is bound to. Bindings never change,
    /// so a cached one stays right for the life of the session.
    bindings: Mutex<HashMap<SessionId, Option<String>>>,
}

/// A tower [`Layer`](tower_layer::Layer) that binds sessions to principals
/// and checks `Last-Event-ID`s before rmcp sees them. Works with any tower
/// stack (axum: `Router::layer`, or wrap the service directly).
///
/// Per request:
///
/// 1. The principal is read from the [`Principal`] request extension (or the
///    closure given to [`principal_from`](Self::principal_from)), and kept
///    for the duration of the request, so an `initialize` stores it with the
///    new session in the same write.
/// 2. A request naming a session bound to another principal gets exactly the
///    404 rmcp gives an unknown session, on every instance.
/// 3. A `GET` carrying `Last-Event-ID` is checked against the event log: a
///    malformed id or one naming a stream of another session is answered
///    `400`, one whose stream or events have expired `410 Gone`, each with a
///    plain-text body saying which. Never an empty `200` stream that sends
///    the client polling forever.
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

fn principal_from_extension(parts: &Parts) -> Option<String> {
    parts.extensions.get::<Principal>().map(|p| p.0.clone())
}

impl SessionBindingLayer {
    /// A layer checking sessions in `sessions` and, when given, event ids
    /// in `events`, reading the principal from the [`Principal`] extension.
    pub fn new(
        sessions: mcp_persist_core::SessionStore,
        events: Option<mcp_persist_core::EventStore>,
    ) -> Self {
        Self::with_principal_fn(sessions, events, Arc::new(principal_from_extension))
    }

    pub(super) fn with_principal_fn(
        sessions: mcp_persist_core::SessionStore,
        events: Option<mcp_persist_core::EventStore>,
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
    /// The 404 rmcp gives an unknown session, byte for byte.
    UnknownSession,
    BadRequest(String),
    Gone(String),
    Unavailable,
}

impl Refusal {
    fn into_response<E: 'static>(self) -> Response<BoxBody<Bytes, E>> {
        let (status, body) = match self {
            Refusal::UnknownSession => (
                StatusCode::NOT_FOUND,
                "Not Found: Session not found".to_owned(),
            ),
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

    async fn check(&self, parts: &Parts, principal: &Option<String>) -> Result<(), Refusal> {
        let sessionless = parts
            .headers
            .get(HEADER_PROTOCOL_VERSION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v >= SESSIONLESS_VERSION);
        let session = if sessionless {
            None
        } else {
            parts
                .headers
                .get(HEADER_SESSION_ID)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| SessionId::new(v).ok())
        };
        if let Some(id) = &session {
            match self.bound_principal(id).await {
                Ok(Some(bound)) if bound != *principal => {
                    warn!("refused a session presented under another principal");
                    return Err(Refusal::UnknownSession);
                }
                // Unknown or expired sessions are rmcp's to answer.
                Ok(_) => {}
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
            let last = last.to_str().map_err(|_| {
                Refusal::BadRequest(
                    "Bad Request: malformed Last-Event-ID: not visible ASCII".into(),
                )
            })?;
            check_last_event_id(events, last, session.as_ref()).await?;
        }
        Ok(())
    }
}

async fn check_last_event_id(
    events: &mcp_persist_core::EventStore,
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
            warn!("refused a Last-Event-ID naming a stream of another session");
            Err(Refusal::BadRequest(
                "Bad Request: Last-Event-ID names an event stream of another session".into(),
            ))
        }
        Err(Error::NotFound { what: "events", .. }) => {
            debug!("refused a Last-Event-ID whose later events were dropped by retention");
            Err(Refusal::Gone(
                "Gone: the events after this Last-Event-ID have expired; the stream cannot be resumed".into(),
            ))
        }
        Err(Error::NotFound { .. }) => {
            debug!("refused a Last-Event-ID of an unknown or expired stream");
            Err(Refusal::Gone(
                "Gone: the event stream of this Last-Event-ID has expired or never existed; it cannot be resumed".into(),
            ))
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
            let (parts, body) = request.into_parts();
            let principal = (shared.principal)(&parts);
            if let Err(refusal) = shared.check(&parts, &principal).await {
                return Ok(refusal.into_response());
            }
            let request = Request::from_parts(parts, body);
            let response = REQUEST_PRINCIPAL
                .scope(principal, inner.call(request))
                .await?;
            Ok(response.map(|body| body.boxed()))
        })
    }
}
