//! The session lifecycle: a stored session answers rmcp's `initialize`
//! after a restart; a real `initialize` gives a new session, kept and
//! stored; a 404, or the application ending the session, forgets it.

mod state;

use std::{ops::Range, sync::Arc};

use mcp_persist_core::{LegacySession, ProtocolVersion, ServerProfile, SessionId};
use rmcp::{
    model::{
        ClientJsonRpcMessage, InitializeResult, NumberOrString, ServerJsonRpcMessage, ServerResult,
    },
    transport::streamable_http_client::{StreamableHttpClient, StreamableHttpPostResponse},
};
use tracing::{debug, info, warn};

pub(crate) use self::state::{Seed, SessionState};
use super::{
    delegate::{Post, PostResult, first_answer},
    era::Verdict,
    health::Health,
    ids::WireIds,
    journal::JournalTx,
    report::ClientNotice,
};

/// What the session lifecycle needs: the session state, the wire ids (a
/// new session numbers afresh), the era verdict (a session's version
/// settles it), the journal and the notices.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    state: Arc<SessionState>,
    ids: Arc<WireIds>,
    verdict: Arc<Verdict>,
    journal: JournalTx,
    health: Arc<Health>,
}

impl Lifecycle {
    pub(crate) fn new(
        state: Arc<SessionState>,
        ids: Arc<WireIds>,
        verdict: Arc<Verdict>,
        journal: JournalTx,
        health: Arc<Health>,
    ) -> Self {
        Lifecycle {
            state,
            ids,
            verdict,
            journal,
            health,
        }
    }

    /// The session in use, and what is known of it.
    pub(crate) fn state(&self) -> &SessionState {
        &self.state
    }

    /// Installs a stored session: the next `initialize` is answered from it
    /// and request ids continue in `ids`.
    pub(crate) fn install_seed(&self, seed: Seed, ids: Range<i64>) {
        self.ids.install(seed.session_id.clone(), ids);
        self.state.install_seed(seed);
    }

    /// rmcp's `initialize`: answered from the stored session after a
    /// restart (same JSON-RPC id, stored session id), else sent, and the
    /// new session kept and stored.
    pub(crate) async fn initialize<C: StreamableHttpClient>(
        &self,
        inner: &C,
        message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        let init_id = match &message {
            ClientJsonRpcMessage::Request(request) => request.id.clone(),
            _ => return post.send(inner, message).await,
        };
        if post.session_id.is_none()
            && let Some(seed) = self.state.take_seed()
        {
            info!(session = %seed.session_id.hashed(), "resuming stored session: answering initialize from the store");
            let answer = ServerJsonRpcMessage::response(
                ServerResult::InitializeResult(seed.result),
                init_id,
            );
            return Ok(StreamableHttpPostResponse::Json(
                answer,
                Some(seed.session_id.to_string()),
            ));
        }
        let response = post.send(inner, message).await?;
        let (answer, new_session) = first_answer::<C::Error>(response).await?;
        self.after_initialize(&answer, new_session.as_deref(), &init_id)
            .await;
        Ok(StreamableHttpPostResponse::Json(answer, new_session))
    }

    /// Whether the `notifications/initialized` rmcp sends now is to be
    /// dropped (once): the `initialize` before it was answered from the
    /// store, and the server has it from the first process.
    pub(crate) fn initialized_again(&self) -> bool {
        self.state.take_swallow_initialized()
    }

    /// Whether rmcp's `DELETE` goes out: only when the application ends the
    /// session; dropping or closing the rmcp client keeps it for the next
    /// process.
    pub(crate) fn lets_delete_through(&self) -> bool {
        self.state.ending()
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
            debug!("server runs without sessions; nothing to keep");
            return;
        };
        match SessionId::new(sid.to_owned()) {
            Ok(sid) => self.initialized(sid, result.clone(), init_id).await,
            Err(e) => warn!(error = %e, "server sent a session id that cannot be stored"),
        }
    }

    /// After a real `initialize`: keeps the new session and stores it.
    async fn initialized(
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
        let replaced = self.state.replace(session_id.clone(), result.clone());
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
                warn!(
                    json_ok = json.is_ok(),
                    version_ok = version.is_ok(),
                    "initialize result cannot be stored; the session will not survive a restart"
                );
            }
        }
        if let Ok(version) = ProtocolVersion::new(result.protocol_version.as_str().to_owned()) {
            self.verdict.set(ServerProfile::new(version.era(), version));
        }
        info!(session = %session_id.hashed(), "new session initialized");
        self.health.notify(ClientNotice::NewSession {
            session_id,
            replaced,
        });
    }

    /// After a 404 on `session_id`: forgets it everywhere, if it is the
    /// session in use (its journal entries stay listed).
    pub(crate) fn expired(&self, session_id: &SessionId) {
        if !self.state.expire(session_id) {
            return;
        }
        warn!(session = %session_id.hashed(),
            "server answered 404: the session and its server-side state are gone; re-initializing");
        self.journal.forget_session(session_id);
        self.health.notify(ClientNotice::SessionExpired {
            session_id: session_id.clone(),
        });
    }

    /// After the application ended the session (or the server stopped
    /// speaking its version): forgets it everywhere (its journal entries
    /// stay listed).
    pub(crate) fn ended(&self, session_id: &SessionId) {
        self.state.end();
        self.journal.forget_session(session_id);
    }
}
