//! rmcp's `SessionStore` over core's [`ServerSessionStore`](mcp_persist_core::ServerSessionStore).

use mcp_persist_core::{
    Error, ServerSession, SessionId,
    telemetry::{Side, Telemetry},
};
use rmcp::{
    model::InitializeRequestParams,
    transport::streamable_http_server::session::{
        SessionState, SessionStore as RmcpSessionStore, SessionStoreError,
    },
};
use tracing::{Instrument, debug, error, warn};

tokio::task_local! {
    /// The principal of the request being served, set by
    /// [`SessionBinding`](super::SessionBinding) around the inner service so
    /// that the session created by an `initialize` is bound to it in the same
    /// write that stores it.
    pub(crate) static REQUEST_PRINCIPAL: Option<String>;

    /// Where the `DELETE` being served records what its store delete found,
    /// set by [`SessionBinding`](super::SessionBinding) so that it can answer
    /// an unknown session `404` (rmcp answers every `DELETE` alike).
    pub(crate) static DELETE_OUTCOME: std::sync::Arc<DeleteOutcome>;
}

/// What a session `DELETE` found in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// A live session was ended.
    Ended,
    /// There was no live session under the id (unknown, expired, already
    /// ended, or not a valid id).
    Absent,
    /// The store failed: whether the session ended is unknown.
    Failed,
}

/// The outcome slot of one `DELETE` (see [`DELETE_OUTCOME`]).
#[derive(Debug, Default)]
pub(crate) struct DeleteOutcome(std::sync::Mutex<Option<Deleted>>);

impl DeleteOutcome {
    pub(crate) fn get(&self) -> Option<Deleted> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(outcome: Deleted) {
        let _ = DELETE_OUTCOME.try_with(|slot| {
            *slot.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        });
    }
}

/// Sessions of an rmcp Streamable HTTP server, kept in a backend shared by
/// every instance.
///
/// rmcp stores a session's `initialize` params here after the handshake and,
/// when a request names a session the instance does not hold, loads them and
/// replays `initialize` into a fresh handler. This store adds what rmcp's
/// trait does not carry: the principal the session is bound to (taken from
/// [`SessionBinding`](super::SessionBinding)) and an idle TTL after which
/// the session is gone on every instance.
#[derive(Debug, Clone)]
pub struct DurableSessionStore {
    sessions: mcp_persist_core::ServerSessionStore,
    telemetry: Telemetry,
}

impl DurableSessionStore {
    /// A store over core's session store (which carries the idle TTL).
    pub fn new(sessions: mcp_persist_core::ServerSessionStore) -> Self {
        DurableSessionStore {
            sessions,
            telemetry: Telemetry::disabled(),
        }
    }

    /// The same store, counting restored sessions in `telemetry` (see
    /// [`telemetry`](crate::telemetry)).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// The underlying typed store.
    pub fn inner(&self) -> &mcp_persist_core::ServerSessionStore {
        &self.sessions
    }

    /// The stored `initialize` of session `id`, to replay on this instance.
    async fn restore(&self, id: &SessionId) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(session) = self.sessions.load(id).await? else {
            debug!("no live session to restore under this id");
            return Ok(None);
        };
        let params: InitializeRequestParams = serde_json::from_value(session.initialize_params)
            .map_err(|e| Error::Corrupt {
                key: mcp_persist_core::declare::SERVER_SESSION
                    .key(&[id.as_str()])
                    .to_string(),
                reason: "initialize params do not parse".into(),
                source: Some(Box::new(e)),
            })?;
        debug!(session = %id.hashed(), "loaded session for restore");
        Ok(Some(SessionState::new(params)))
    }
}

#[async_trait::async_trait]
impl RmcpSessionStore for DurableSessionStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Ok(id) = SessionId::new(session_id) else {
            return Ok(None);
        };
        let span = tracing::info_span!(
            "mcp_persist.session.restore",
            otel.name = "mcp_persist.session.restore",
            mcp_persist.side = "server",
            mcp.session.id = self.telemetry.session_attribute(id.as_str()),
            mcp_persist.outcome = tracing::field::Empty,
        );
        let restored = self.restore(&id).instrument(span.clone()).await;
        let outcome = match &restored {
            Ok(Some(_)) => {
                self.telemetry.session_restored(Side::Server);
                "restored"
            }
            Ok(None) => "unknown",
            Err(_) => "failed",
        };
        span.record("mcp_persist.outcome", outcome);
        restored
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let id = SessionId::new(session_id)?;
        let principal = REQUEST_PRINCIPAL.try_with(Clone::clone).ok().flatten();
        let session = ServerSession::new(
            id.clone(),
            serde_json::to_value(&state.initialize_params)?,
            principal,
        );
        match self.sessions.create(&session).await {
            Ok(()) => Ok(()),
            Err(Error::AlreadyExists { .. }) => {
                // Never rebind an existing session to another principal.
                let existing = self.sessions.load(&id).await?;
                match existing {
                    Some(old) if old.principal != session.principal => {
                        warn!(session = %id.hashed(), "refusing to rebind a stored session to another principal");
                        Err(Box::new(Error::invalid(
                            "session id",
                            "it is bound to another principal",
                        )))
                    }
                    _ => Ok(self.sessions.save(&session).await?),
                }
            }
            Err(e) => {
                error!(session = %id.hashed(), error = %e, "could not store the new session; it cannot be restored elsewhere");
                Err(Box::new(e))
            }
        }
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        let Ok(id) = SessionId::new(session_id) else {
            DeleteOutcome::record(Deleted::Absent);
            return Ok(());
        };
        match self.sessions.delete(&id).await {
            Ok(true) => {
                DeleteOutcome::record(Deleted::Ended);
                debug!(session = %id.hashed(), "deleted session");
                Ok(())
            }
            Ok(false) => {
                DeleteOutcome::record(Deleted::Absent);
                debug!("no live session to delete under this id");
                Ok(())
            }
            Err(e) => {
                DeleteOutcome::record(Deleted::Failed);
                Err(Box::new(e))
            }
        }
    }
}
