//! The session manager: rmcp's local session workers, one event log shared
//! by every instance, and liveness decided by the shared session store.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use futures::Stream;
use mcp_persist_core::SessionId as StoredSessionId;
use rmcp::{
    RoleServer,
    model::{ClientCapabilities, ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage},
    transport::{
        Transport,
        streamable_http_server::session::{
            RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
            local::{LocalSessionManager, LocalSessionManagerError, SessionConfig},
        },
    },
};
use tokio::sync::RwLock;
use tracing::{debug, info, warn};

use super::{
    calls::Calls,
    capability::{ClientFeature, MissingClientCapability},
    event_store::DurableEventStore,
};

/// Why the [`DurableSessionManager`] could not serve a session operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionManagerError {
    /// The session is not held by this instance (rmcp restores it from the
    /// store first, so this means it ended meanwhile).
    #[error("session not found on this instance")]
    NotFound,
    /// rmcp's session worker failed.
    #[error(transparent)]
    Worker(#[from] LocalSessionManagerError),
    /// The shared store failed.
    #[error("session store: {0}")]
    Store(#[from] mcp_persist_core::Error),
}

/// An rmcp [`SessionManager`] whose sessions live on any instance.
///
/// Each session runs in rmcp's own in-memory worker (so message routing,
/// SSE priming and request association are rmcp's), with its events written
/// to the shared [`DurableEventStore`] under the session's name. On top:
///
/// * **Liveness comes from the shared store.** A session this instance holds
///   but the store no longer has (idle TTL passed, or a DELETE on another
///   instance) is closed here and answered 404. Every use touches the
///   session's TTL (coalesced to one write per tenth of the TTL); with
///   [`strict_sessions`](super::DurableServerBuilder::strict_sessions) every
///   use also reads it, so an end elsewhere is seen at once.
/// * **Restore.** rmcp asks for a fresh worker when a request names a session
///   found only in the store; this manager makes one under the same id.
/// * **Resume.** `Last-Event-ID` replays from the shared log and tails it,
///   so a stream another instance is still writing is delivered live.
pub struct DurableSessionManager {
    sessions: RwLock<HashMap<SessionId, Held>>,
    session_config: SessionConfig,
    store: mcp_persist_core::ServerSessionStore,
    events: Option<DurableEventStore>,
    calls: Option<Arc<Calls>>,
    /// Whether handlers that take early records serve this manager's
    /// requests ([`DurableServer::service`](super::DurableServer::service)
    /// wraps them so); a manager wired to other handlers writes none.
    early_records: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for DurableSessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableSessionManager")
            .field("session_config", &self.session_config)
            .field("store", &self.store)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

type LocalTransport = <LocalSessionManager as SessionManager>::Transport;

/// A session this instance holds: rmcp's worker, and the event store it
/// writes the session's streams to.
#[derive(Clone)]
struct Held {
    local: Arc<LocalSessionManager>,
    events: Option<DurableEventStore>,
}

/// The transport of one session's handler: rmcp's local session worker,
/// with the server's requests checked against the capabilities the client
/// declared at `initialize` (see [`MissingClientCapability`]).
///
/// A sampling, elicitation or roots request to a client that did not declare
/// the capability never reaches the client: it is answered at once, as if
/// by the client, with the error [`MissingClientCapability::to_error_data`]
/// builds. The capabilities are read from the session's `initialize`, which
/// a session restored on another instance replays from the stored
/// initialize params, so every instance decides alike.
pub struct SessionTransport {
    inner: LocalTransport,
    declared: Option<ClientCapabilities>,
    refused: VecDeque<ClientJsonRpcMessage>,
}

impl std::fmt::Debug for SessionTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTransport")
            .field("declared", &self.declared)
            .field("refused", &self.refused.len())
            .finish_non_exhaustive()
    }
}

impl SessionTransport {
    fn new(inner: LocalTransport) -> Self {
        SessionTransport {
            inner,
            declared: None,
            refused: VecDeque::new(),
        }
    }
}

impl Transport<RoleServer> for SessionTransport {
    type Error = <LocalTransport as Transport<RoleServer>>::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let ServerJsonRpcMessage::Request(request) = &item {
            // Before `initialize` nothing is declared yet, and a server has
            // no business asking anything.
            let declared = self.declared.clone().unwrap_or_default();
            if let Err(missing) = MissingClientCapability::check(
                &declared,
                ClientFeature::of_request(&request.request),
            ) {
                warn!(
                    request = %request.id,
                    capability = missing.feature().capability(),
                    "refused a request the client declared no capability for"
                );
                self.refused.push_back(ClientJsonRpcMessage::error(
                    missing.to_error_data(),
                    Some(request.id.clone()),
                ));
                return futures::future::Either::Left(futures::future::ready(Ok(())));
            }
        }
        futures::future::Either::Right(self.inner.send(item))
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        if let Some(refusal) = self.refused.pop_front() {
            return Some(refusal);
        }
        let message = self.inner.receive().await?;
        if let ClientJsonRpcMessage::Request(request) = &message
            && let ClientRequest::InitializeRequest(initialize) = &request.request
        {
            self.declared = Some(initialize.params.capabilities.clone());
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
type SseStream = std::pin::Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync + 'static>>;

fn boxed(stream: impl Stream<Item = ServerSseMessage> + Send + Sync + 'static) -> SseStream {
    Box::pin(stream)
}

/// Passes `stream` on, recording (in the background) which request it
/// answers once its first event names the stream: an instance replaying it
/// after this one stopped can then answer that request with an error.
fn describing(
    stream: impl Stream<Item = ServerSseMessage> + Send + Sync + 'static,
    events: mcp_persist_core::EventLog,
    request: serde_json::Value,
) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static {
    use futures::StreamExt as _;
    let mut pending = Some((events, request));
    stream.map(move |message| {
        if let Some(event_id) = &message.event_id
            && let Ok(parsed) = event_id.parse::<mcp_persist_core::EventId>()
            && let Some((events, request)) = pending.take()
        {
            tokio::spawn(async move {
                if let Err(e) = events.describe_request(parsed.stream(), request).await {
                    debug!(error = %e, "could not record the request a stream answers");
                }
            });
        }
        message
    })
}

impl DurableSessionManager {
    /// A manager over the shared session store and, when given, event store.
    /// `session_config` configures rmcp's per-session workers (its
    /// `keep_alive` is how long an idle worker stays in memory here; the
    /// session itself lives as long as the store keeps it).
    pub fn new(
        store: mcp_persist_core::ServerSessionStore,
        events: Option<DurableEventStore>,
        session_config: SessionConfig,
    ) -> Self {
        DurableSessionManager {
            sessions: RwLock::default(),
            session_config,
            store,
            events,
            calls: None,
            early_records: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The same manager, recording keyed calls (when `calls` is given)
    /// alongside the first event of their streams.
    pub(crate) fn with_calls(mut self, calls: Option<Arc<Calls>>) -> Self {
        self.calls = calls;
        self
    }

    /// Keyed calls' handlers ([`KeyedCalls`](super::KeyedCalls)) serve this
    /// manager's requests from now on: their records may be written early.
    pub(crate) fn serve_keyed_calls(&self) {
        self.early_records
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many sessions this instance holds in memory now.
    pub async fn local_sessions(&self) -> usize {
        self.sessions.read().await.len()
    }

    fn new_local(&self) -> (Arc<LocalSessionManager>, Option<DurableEventStore>) {
        let mut local = LocalSessionManager::default();
        local.session_config = self.session_config.clone();
        let events = self.events.as_ref().map(DurableEventStore::for_session);
        if let Some(events) = &events {
            local = local.with_event_store(Arc::new(events.clone()));
        }
        (Arc::new(local), events)
    }

    async fn held(&self, id: &SessionId) -> Result<Held, SessionManagerError> {
        self.sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or(SessionManagerError::NotFound)
    }

    async fn local(&self, id: &SessionId) -> Result<Arc<LocalSessionManager>, SessionManagerError> {
        Ok(self.held(id).await?.local)
    }

    async fn drop_local(&self, id: &SessionId) -> Result<(), SessionManagerError> {
        let held = self.sessions.write().await.remove(id);
        if let Some(held) = held {
            held.local.close_session(id).await?;
        }
        Ok(())
    }
}

impl SessionManager for DurableSessionManager {
    type Error = SessionManagerError;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (local, events) = self.new_local();
        let (id, transport) = local.create_session().await?;
        if let Some(events) = &events {
            events.bind(StoredSessionId::new(id.as_ref())?);
        }
        self.sessions
            .write()
            .await
            .insert(id.clone(), Held { local, events });
        Ok((id, SessionTransport::new(transport)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self
            .local(id)
            .await?
            .initialize_session(id, message)
            .await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        if !self.sessions.read().await.contains_key(id) {
            return Ok(false);
        }
        let Ok(stored_id) = StoredSessionId::new(id.as_ref()) else {
            return Ok(false);
        };
        if self.store.touch(&stored_id).await? {
            return Ok(true);
        }
        info!(session = %stored_id.hashed(), "session expired or ended elsewhere; closing it here");
        self.drop_local(id).await?;
        Ok(false)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.drop_local(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let Held { local, events } = self.held(id).await?;
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => serde_json::to_value(&r.id).ok(),
            _ => None,
        };
        if let Some(life) = self.events.as_ref().and_then(DurableEventStore::life)
            && let Err(e) = life.ensure_started().await
        {
            warn!(error = %e, "could not register this instance's liveness lease; retrying at the next request");
        }
        // The stream's first event records the request it answers, so that
        // no instance ever resumes it without knowing what to answer should
        // this one stop; `describing` below covers a stream whose first
        // event comes later (a server configured without priming events).
        let (stream, recorded) = match (&request, &events) {
            (Some(request), Some(events)) => {
                // A keyed call's record shares the first event's commit.
                let beside = self
                    .calls
                    .as_ref()
                    .filter(|_| {
                        self.early_records
                            .load(std::sync::atomic::Ordering::Relaxed)
                    })
                    .and_then(|calls| calls.begin_early(&mut message));
                let (stream, recorded) = events
                    .opening(request.clone(), beside, local.create_stream(id, message))
                    .await;
                (stream?, recorded)
            }
            _ => (local.create_stream(id, message).await?, false),
        };
        match (request, &self.events) {
            (Some(request), Some(events)) if !recorded => {
                Ok(boxed(describing(stream, events.inner().clone(), request)))
            }
            _ => Ok(boxed(stream)),
        }
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.local(id).await?.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let local = self.local(id).await?;
        let stream = local.create_standalone_stream(id).await?;
        Ok(boxed(stream))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let local = self.local(id).await?;
        let stream = local.resume(id, last_event_id).await?;
        Ok(boxed(stream))
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let stored_id = StoredSessionId::new(id.as_ref())?;
        let mut sessions = self.sessions.write().await;
        if sessions.contains_key(&id) {
            return Ok(RestoreOutcome::AlreadyPresent);
        }
        let (local, events) = self.new_local();
        if let Some(events) = &events {
            events.bind(stored_id.clone());
        }
        match local.restore_session(id.clone()).await? {
            RestoreOutcome::Restored(transport) => {
                sessions.insert(id, Held { local, events });
                info!(session = %stored_id.hashed(), "restoring session from the shared store");
                Ok(RestoreOutcome::Restored(SessionTransport::new(transport)))
            }
            RestoreOutcome::AlreadyPresent => Ok(RestoreOutcome::AlreadyPresent),
            _ => {
                debug!(session = %stored_id.hashed(), "rmcp declined to restore the session");
                Ok(RestoreOutcome::NotSupported)
            }
        }
    }

    /// None, on purpose: rmcp uses a manager-level event store only for
    /// requests served without a session, to persist their streams and replay
    /// them to any `GET` that names an event id. Such a stream has no session
    /// and so no principal to check, and the sessionless revision has no
    /// resumption at all. Without it rmcp cancels a sessionless request whose
    /// client disconnected, as that revision requires, and spends no commit on
    /// a stream nobody may resume. Sessions' streams are still recorded: each
    /// session's worker has its own store.
    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        None
    }
}
