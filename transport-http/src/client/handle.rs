//! The handle the application keeps next to the rmcp transport.

use std::sync::Arc;

use mcp_persist_core::{InFlightRequest, ServerKey, SessionId};

use rmcp::model::InitializeResult;
use tokio::sync::broadcast;
use tracing::{Instrument, info};

use super::{
    headers::version_headers,
    health::{Health, lock},
    journal::JournalTx,
    recovery::{Recoverer, Recovery},
    report::{ClientError, ClientNotice, StartKind},
    wire::WireError,
};

/// The application's view of a durable client: what was stored, what
/// happened to the session, and the requests a previous process left
/// unanswered.
///
/// Cheap to clone; every clone sees the same client.
#[derive(Clone)]
pub struct ClientHandle {
    pub(crate) key: ServerKey,
    pub(crate) health: Arc<Health>,
    pub(crate) start: StartKind,
    /// What collecting interrupted requests needs (the session, the
    /// journal, the wire, the client's span), and the list of them, each
    /// with the journal it is in.
    pub(crate) recoverer: Recoverer,
    /// Commits what the journal holds when the last clone is dropped.
    pub(crate) _last: Arc<LastHandle>,
}

/// Dropped with the last clone of a [`ClientHandle`]: commits everything
/// pending and waits for it. A `main` that returns drops its handle while
/// the runtime still runs, so even a store driven by that runtime takes
/// the writes; what the transport does afterwards is committed when it is
/// dropped in turn.
#[derive(Debug)]
pub(crate) struct LastHandle(pub(crate) JournalTx);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.flush_blocking();
    }
}

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientHandle")
            .field("server", &self.key)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl ClientHandle {
    /// The server and profile all state is kept under.
    pub fn server_key(&self) -> &ServerKey {
        &self.key
    }

    /// How this process started: on a stored session, or fresh (and why).
    ///
    /// A stored session the server turned out not to know any more (404,
    /// then a real `initialize`) is reported as
    /// [`StartKind::Replaced`], never as resumed: its server-side state is
    /// gone.
    pub fn start(&self) -> StartKind {
        match &self.start {
            StartKind::Resumed { session_id }
                if self.recoverer.session.state().expired_here(session_id) =>
            {
                StartKind::Replaced {
                    expired: session_id.clone(),
                    session_id: self.session_id(),
                }
            }
            other => other.clone(),
        }
    }

    /// Whether this process continues a stored session (no `initialize`),
    /// and the server still knows it.
    pub fn resumed(&self) -> bool {
        matches!(self.start(), StartKind::Resumed { .. })
    }

    /// The server's `InitializeResult` for the session in use: capabilities,
    /// server info and instructions. After a restart it is the stored one,
    /// available before any network call.
    pub fn initialize_result(&self) -> Option<InitializeResult> {
        self.recoverer
            .session
            .state()
            .current()
            .map(|(_, result)| result)
    }

    /// The `Mcp-Session-Id` in use, if any.
    pub fn session_id(&self) -> Option<SessionId> {
        self.recoverer.session.state().current().map(|(s, _)| s)
    }

    /// Whether the client still writes its store (false once the store
    /// failed and the client went on with in-memory state).
    pub fn persisting(&self) -> bool {
        self.health.persisting()
    }

    /// Everything noticed so far, oldest first.
    pub fn notices(&self) -> Vec<ClientNotice> {
        self.health.notices()
    }

    /// Notices from now on, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<ClientNotice> {
        self.health.subscribe()
    }

    /// The requests earlier processes sent and never saw answered, oldest
    /// first: in the resumed session, in sessions that are gone since (the
    /// server forgot them, or they were ended), and tasks of a server
    /// without sessions. Collect them with [`recover`](Self::recover). A
    /// request stays listed (and journaled), across restarts, until its
    /// answer is collected or the application [dismisses](Self::dismiss) it.
    pub fn interrupted(&self) -> Vec<InFlightRequest> {
        lock(&self.recoverer.listed)
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Waits until every change made so far (new session, journal entries,
    /// answered marks, stream cursors) is in the store, cutting the
    /// journal's window short. The client commits everything by itself,
    /// within [`journal_delay`](super::DurableClientBuilder::journal_delay)
    /// and when the last handle (then the transport) is dropped; this is for
    /// a process that wants a known point, such as before it reports work
    /// as started, or before a `std::process::exit`.
    pub async fn flush(&self) {
        self.recoverer.journal.flush().await;
    }

    /// The interrupted requests, each as a [`Recovery`] saying how its
    /// answer can be had. Nothing is sent again silently: a request that
    /// cannot be resumed is reported as lost, with its method and params,
    /// for the application to decide.
    ///
    /// The list is not emptied: a request leaves it when its answer is
    /// collected or when it is [dismissed](Self::dismiss), so a collection
    /// that failed (the network was down, the timeout passed) can be tried
    /// again with another call of `recover`.
    ///
    /// Collecting needs no running rmcp service: it can run before `serve`,
    /// beside new calls, or both. Spawn it so that new calls do not wait for
    /// old work to finish.
    pub fn recover(&self) -> Vec<Recovery> {
        let requests = lock(&self.recoverer.listed).clone();
        requests
            .into_iter()
            .map(|(scope, request)| Recovery::new(self.recoverer.clone(), scope, request))
            .collect()
    }

    /// Removes an interrupted request from the journal once the application
    /// has dealt with it (a [`Recovery::Lost`] it re-sent or gave up on, a
    /// [`Recovery::Task`] whose result is in). A resumed request leaves the
    /// journal by itself when its answer is read.
    pub fn dismiss(&self, request: &InFlightRequest) {
        let mut listed = lock(&self.recoverer.listed);
        listed.retain(|(scope, r)| {
            if r.id == request.id {
                self.recoverer.journal.complete(scope.clone(), r.id.clone());
                false
            } else {
                true
            }
        });
    }

    /// Ends the session: sends `DELETE` to the server and forgets the stored
    /// session. Requests journaled in it stay listed, as
    /// [`Recovery::Lost`] with [`LostReason::SessionGone`](super::LostReason::SessionGone),
    /// until dismissed. A session the server no longer knows (a 404 to the
    /// `DELETE`, or earlier) counts as ended: that is no error. Call it
    /// after closing the rmcp client; while the rmcp client runs, dropping
    /// or closing it keeps the session for the next process.
    pub async fn end_session(&self) -> Result<(), ClientError> {
        let span = self.recoverer.span.clone();
        async {
            let session = &self.recoverer.session;
            let Some((id, result)) = session.state().current() else {
                // Already gone (the server answered 404): only make sure the
                // store has forgotten it too.
                self.flush().await;
                return Ok(());
            };
            session.state().set_ending(true);
            let sent = self
                .recoverer
                .wire
                .delete(Arc::from(id.as_str()), version_headers(&result))
                .await;
            session.ended(&id);
            self.flush().await;
            info!(session = %id.hashed(), "session ended by the application");
            match sent {
                Ok(()) | Err(WireError::SessionGone) | Err(WireError::EventsGone) => Ok(()),
                Err(WireError::Other(source)) => Err(ClientError::EndSession { source }),
            }
        }
        .instrument(span)
        .await
    }
}
