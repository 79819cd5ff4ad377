//! What the decorator and the handle share, by concern: the session, the
//! era verdict, the wire ids, the journal, and the client's health. Each
//! piece has its own narrow interface; [`Shared`] pairs in-memory changes
//! with their store writes where a change touches more than one piece.

use std::sync::Arc;

use mcp_persist_core::{
    ClientStateStore, LegacySession, ProtocolVersion, ServerKey, ServerProfile, SessionId,
};
use rmcp::model::{InitializeResult, NumberOrString};
use tracing::{info, warn};

use super::{
    health::Health,
    ids::WireIds,
    inbox::Inbox,
    journal::JournalTx,
    report::ClientNotice,
    session::{Seed, SessionState},
    verdict::Verdict,
};

/// Everything the decorator and the handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    key: ServerKey,
    health: Arc<Health>,
    journal: JournalTx,
    session: SessionState,
    verdict: Verdict,
    ids: Arc<WireIds>,
    inbox: Inbox,
}

impl Shared {
    pub(crate) fn new(
        key: ServerKey,
        store: ClientStateStore,
        health: Arc<Health>,
        journal: JournalTx,
        id_block: u32,
    ) -> Self {
        Shared {
            ids: Arc::new(WireIds::new(key.clone(), store, health.clone(), id_block)),
            verdict: Verdict::new(journal.clone()),
            session: SessionState::default(),
            inbox: Inbox::new(),
            key,
            health,
            journal,
        }
    }

    /// The server and profile all state is kept under.
    pub(crate) fn key(&self) -> &ServerKey {
        &self.key
    }

    /// Whether the store is still written, and the notices.
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// The store writes, in order.
    pub(crate) fn journal(&self) -> &JournalTx {
        &self.journal
    }

    /// The session in use.
    pub(crate) fn session(&self) -> &SessionState {
        &self.session
    }

    /// The era verdict.
    pub(crate) fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Messages for the running rmcp client's handler.
    pub(crate) fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// The request ids on the wire.
    pub(crate) fn ids(&self) -> &Arc<WireIds> {
        &self.ids
    }

    /// Installs a stored session: the next `initialize` is answered from it
    /// and request ids continue in `ids`.
    pub(crate) fn install_seed(&self, seed: Seed, ids: std::ops::Range<i64>) {
        self.ids.install(seed.session_id.clone(), ids);
        self.session.install_seed(seed);
    }

    /// After a real `initialize`: keeps the new session and stores it.
    pub(crate) async fn on_initialized(
        &self,
        session_id: SessionId,
        result: InitializeResult,
        init_id: &NumberOrString,
    ) {
        let first = match init_id {
            NumberOrString::Number(n) => n.saturating_add(1),
            NumberOrString::String(_) => 0,
        };
        let ids = first..first.saturating_add(i64::from(self.ids.block()));
        let replaced = self.session.replace(session_id.clone(), result.clone());
        self.ids.restart(session_id.clone(), ids.clone()).await;
        let version = ProtocolVersion::new(result.protocol_version.as_str().to_owned());
        match (serde_json::to_value(&result), version) {
            (Ok(json), Ok(protocol_version)) => {
                self.journal.save_session(
                    LegacySession::new(session_id.clone(), protocol_version, json)
                        .with_request_id_high_water(ids.end),
                );
            }
            (json, version) => {
                warn!(server = %self.key, json_ok = json.is_ok(), version_ok = version.is_ok(),
                    "initialize result cannot be stored; the session will not survive a restart");
            }
        }
        if let Ok(version) = ProtocolVersion::new(result.protocol_version.as_str().to_owned()) {
            self.verdict.set(ServerProfile::new(version.era(), version));
        }
        info!(server = %self.key, session = %session_id, "new session initialized");
        self.health.notify(ClientNotice::NewSession {
            session_id,
            replaced,
        });
    }

    /// After a 404 on a stored session: forgets it everywhere.
    pub(crate) fn on_expired(&self, session_id: &SessionId) {
        if !self.session.expire(session_id) {
            return;
        }
        warn!(server = %self.key, session = %session_id,
            "server answered 404: the session and its server-side state are gone; re-initializing");
        self.journal.forget_session(session_id);
        self.health.notify(ClientNotice::SessionExpired {
            session_id: session_id.clone(),
        });
    }

    /// After the application ended the session (or the server stopped
    /// speaking its version): forgets it everywhere.
    pub(crate) fn on_ended(&self, session_id: &SessionId) {
        self.session.end();
        self.journal.forget_session(session_id);
    }
}
