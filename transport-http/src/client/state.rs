//! State shared by the decorator, the writer and the handle.

use std::{
    collections::HashMap,
    ops::Range,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, LegacySession, ProtocolVersion, RequestId, ServerKey,
    ServerProfile, SessionId,
};
use rmcp::model::{InitializeResult, NumberOrString};
use tokio::sync::broadcast;
use tracing::{info, warn};

use super::{
    ClientNotice,
    journal::{JournalTx, Op},
};

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section here is a few plain assignments).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether the store is still written, and the notices for the application.
#[derive(Debug)]
pub(crate) struct Health {
    persisting: AtomicBool,
    notices: Mutex<Vec<ClientNotice>>,
    events: broadcast::Sender<ClientNotice>,
}

impl Health {
    pub(crate) fn new() -> Self {
        Health {
            persisting: AtomicBool::new(true),
            notices: Mutex::new(Vec::new()),
            events: broadcast::channel(64).0,
        }
    }

    pub(crate) fn persisting(&self) -> bool {
        self.persisting.load(Ordering::Acquire)
    }

    /// Stops all store writes for the rest of this process.
    pub(crate) fn degrade(&self, reason: String) {
        if self.persisting.swap(false, Ordering::AcqRel) {
            self.notify(ClientNotice::StoreDegraded { reason });
        }
    }

    pub(crate) fn notify(&self, notice: ClientNotice) {
        lock(&self.notices).push(notice.clone());
        let _ = self.events.send(notice);
    }

    pub(crate) fn notices(&self) -> Vec<ClientNotice> {
        lock(&self.notices).clone()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ClientNotice> {
        self.events.subscribe()
    }
}

/// A stored session ready to answer rmcp's `initialize`.
#[derive(Debug, Clone)]
pub(crate) struct Seed {
    pub(crate) session_id: SessionId,
    pub(crate) result: InitializeResult,
}

#[derive(Debug, Default)]
struct SessionSlot {
    /// Answers the next `initialize` without the network (taken once).
    seed: Option<Seed>,
    /// Drop the next `notifications/initialized`: the server already has it.
    swallow_initialized: bool,
    /// The session in use, and its `InitializeResult`.
    current: Option<(SessionId, InitializeResult)>,
    /// The session a 404 ended, until a new one replaces it.
    expired: Option<SessionId>,
    /// Set when the application ends the session: lets the DELETE through.
    ending: bool,
    /// The last event id the previous process saw on the session's
    /// standalone GET stream: the first GET of this process resumes from it.
    standalone_cursor: Option<(SessionId, String)>,
}

#[derive(Debug, Default)]
struct IdBlocks {
    session: Option<SessionId>,
    next: i64,
    end: i64,
    prefetched: Option<Range<i64>>,
    fetching: bool,
}

#[derive(Debug, Default)]
struct IdMap {
    wire_to_local: HashMap<i64, NumberOrString>,
    local_to_wire: HashMap<NumberOrString, i64>,
}

/// Everything the decorator and the handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) key: ServerKey,
    pub(crate) store: ClientStateStore,
    pub(crate) health: Arc<Health>,
    pub(crate) journal: JournalTx,
    pub(crate) id_block: u32,
    session: Mutex<SessionSlot>,
    /// The stored era verdict and discover cache.
    profile: Mutex<Option<ServerProfile>>,
    ids: tokio::sync::Mutex<IdBlocks>,
    map: Mutex<IdMap>,
    /// Set once this process has re-probed a stale verdict: never twice.
    reprobed: AtomicBool,
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
            key,
            store,
            health,
            journal,
            id_block: id_block.max(2),
            session: Mutex::new(SessionSlot::default()),
            profile: Mutex::new(None),
            ids: tokio::sync::Mutex::new(IdBlocks::default()),
            map: Mutex::new(IdMap::default()),
            reprobed: AtomicBool::new(false),
        }
    }

    pub(crate) fn profile(&self) -> Option<ServerProfile> {
        lock(&self.profile).clone()
    }

    /// Keeps a new verdict in memory and in the store.
    pub(crate) fn set_profile(&self, profile: ServerProfile) {
        *lock(&self.profile) = Some(profile.clone());
        if self.health.persisting() {
            self.journal.send(Op::SaveProfile(Box::new(profile)));
        }
    }

    /// Forgets a verdict that proved wrong, in memory and in the store.
    pub(crate) fn forget_profile(&self) -> Option<ServerProfile> {
        let old = lock(&self.profile).take();
        if self.health.persisting() {
            self.journal.send(Op::ForgetProfile);
        }
        old
    }

    /// Claims the one re-probe of this process: true the first time only.
    pub(crate) fn claim_reprobe(&self) -> bool {
        !self.reprobed.swap(true, Ordering::AcqRel)
    }

    /// Installs a stored profile read at start.
    pub(crate) fn install_profile(&self, profile: ServerProfile) {
        *lock(&self.profile) = Some(profile);
    }

    /// Installs a stored session: the next `initialize` is answered from it
    /// and request ids continue in `ids`.
    pub(crate) fn install_seed(&self, seed: Seed, ids: Range<i64>) {
        let mut slot = lock(&self.session);
        slot.current = Some((seed.session_id.clone(), seed.result.clone()));
        slot.seed = Some(seed.clone());
        if let Ok(mut blocks) = self.ids.try_lock() {
            *blocks = IdBlocks {
                session: Some(seed.session_id),
                next: ids.start,
                end: ids.end,
                prefetched: None,
                fetching: false,
            };
        }
    }

    /// Remembers where a stored session's standalone stream stopped.
    pub(crate) fn install_standalone_cursor(&self, session: SessionId, event: String) {
        lock(&self.session).standalone_cursor = Some((session, event));
    }

    /// The stored standalone cursor of `session`, once: only the first GET
    /// after a restart resumes from it.
    pub(crate) fn take_standalone_cursor(&self, session: &SessionId) -> Option<String> {
        let mut slot = lock(&self.session);
        match slot.standalone_cursor.take() {
            Some((s, event)) if s == *session => Some(event),
            _ => None,
        }
    }

    /// Takes the stored session to answer an `initialize` with.
    pub(crate) fn take_seed(&self) -> Option<Seed> {
        let mut slot = lock(&self.session);
        let seed = slot.seed.take()?;
        slot.swallow_initialized = true;
        Some(seed)
    }

    pub(crate) fn take_swallow_initialized(&self) -> bool {
        std::mem::take(&mut lock(&self.session).swallow_initialized)
    }

    pub(crate) fn current(&self) -> Option<(SessionId, InitializeResult)> {
        lock(&self.session).current.clone()
    }

    pub(crate) fn set_ending(&self, ending: bool) {
        lock(&self.session).ending = ending;
    }

    pub(crate) fn ending(&self) -> bool {
        lock(&self.session).ending
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
        let ids = first..first.saturating_add(i64::from(self.id_block));
        let replaced = {
            let mut slot = lock(&self.session);
            slot.seed = None;
            let expired = slot.expired.take();
            slot.current
                .replace((session_id.clone(), result.clone()))
                .map(|(old, _)| old)
                .or(expired)
        };
        {
            let mut blocks = self.ids.lock().await;
            *blocks = IdBlocks {
                session: Some(session_id.clone()),
                next: ids.start,
                end: ids.end,
                prefetched: None,
                fetching: false,
            };
        }
        let version = ProtocolVersion::new(result.protocol_version.as_str().to_owned());
        match (serde_json::to_value(&result), version) {
            (Ok(json), Ok(protocol_version)) => {
                self.journal.send(Op::SaveSession(Box::new(
                    LegacySession::new(session_id.clone(), protocol_version, json)
                        .with_request_id_high_water(ids.end),
                )));
            }
            (json, version) => {
                warn!(server = %self.key, json_ok = json.is_ok(), version_ok = version.is_ok(),
                    "initialize result cannot be stored; the session will not survive a restart");
            }
        }
        if let Ok(version) = ProtocolVersion::new(result.protocol_version.as_str().to_owned()) {
            self.set_profile(ServerProfile::new(version.era(), version));
        }
        info!(server = %self.key, session = %session_id, "new session initialized");
        self.health.notify(ClientNotice::NewSession {
            session_id: session_id.to_string(),
            replaced: replaced.map(|s| s.to_string()),
        });
    }

    /// After a 404 on a stored session: forgets it everywhere.
    pub(crate) fn on_expired(&self, session_id: &SessionId) {
        let was_current = {
            let mut slot = lock(&self.session);
            let was = slot.current.as_ref().is_some_and(|(s, _)| s == session_id);
            if was {
                slot.current = None;
                slot.expired = Some(session_id.clone());
            }
            slot.seed = None;
            was
        };
        if !was_current {
            return;
        }
        warn!(server = %self.key, session = %session_id,
            "server answered 404: the session and its server-side state are gone; re-initializing");
        self.journal.send(Op::ForgetSession(session_id.clone()));
        self.health.notify(ClientNotice::SessionExpired {
            session_id: session_id.to_string(),
        });
    }

    /// After the application ended the session.
    pub(crate) fn on_ended(&self, session_id: &SessionId) {
        {
            let mut slot = lock(&self.session);
            slot.current = None;
            slot.seed = None;
        }
        self.journal.send(Op::ForgetSession(session_id.clone()));
    }

    /// The next request id on the wire in `session`: unique within the
    /// session across restarts, from blocks reserved in the store.
    pub(crate) async fn next_wire_id(self: &Arc<Self>, session: &SessionId) -> i64 {
        let mut blocks = self.ids.lock().await;
        if blocks.session.as_ref() != Some(session) {
            // A session this process did not initialize or resume: start
            // above anything stored for it.
            let start = match self.store.session(&self.key).await {
                Ok(Some(s)) if s.record.session_id == *session => s.record.request_id_high_water,
                _ => 0,
            };
            *blocks = IdBlocks {
                session: Some(session.clone()),
                next: start,
                end: start,
                prefetched: None,
                fetching: false,
            };
        }
        if blocks.next >= blocks.end {
            let range = match blocks.prefetched.take() {
                Some(r) => r,
                None => self.reserve(blocks.end).await,
            };
            blocks.next = range.start.max(blocks.next);
            blocks.end = range.end.max(blocks.next);
            if blocks.next >= blocks.end {
                blocks.end = blocks.next.saturating_add(i64::from(self.id_block));
            }
        }
        let id = blocks.next;
        blocks.next += 1;
        let remaining = blocks.end - blocks.next;
        if remaining < i64::from(self.id_block / 2)
            && blocks.prefetched.is_none()
            && !blocks.fetching
            && self.health.persisting()
        {
            blocks.fetching = true;
            let me = self.clone();
            let session = session.clone();
            let above = blocks.end;
            tokio::spawn(async move {
                let range = me.reserve(above).await;
                let mut blocks = me.ids.lock().await;
                blocks.fetching = false;
                if blocks.session.as_ref() == Some(&session) {
                    blocks.prefetched = Some(range);
                }
            });
        }
        id
    }

    /// Reserves a block in the store; in memory (above `above`) once the
    /// store has failed.
    async fn reserve(&self, above: i64) -> Range<i64> {
        let memory = above..above.saturating_add(i64::from(self.id_block));
        if !self.health.persisting() {
            return memory;
        }
        match self
            .store
            .reserve_request_ids(&self.key, self.id_block)
            .await
        {
            Ok(r) if r.start >= above => r,
            Ok(r) => r.end.max(above)..r.end.max(above),
            Err(e) => {
                warn!(server = %self.key, error = %e, "reserving request ids failed; continuing in memory");
                self.health
                    .degrade(format!("reserving request ids failed: {e}"));
                memory
            }
        }
    }

    pub(crate) fn map_insert(&self, local: NumberOrString, wire: i64) {
        let mut map = lock(&self.map);
        if let Some(old) = map.local_to_wire.insert(local.clone(), wire) {
            map.wire_to_local.remove(&old);
        }
        map.wire_to_local.insert(wire, local);
    }

    /// The rmcp id of an answer that went out as `wire`, forgetting the pair.
    pub(crate) fn map_take(&self, wire: i64) -> Option<NumberOrString> {
        let mut map = lock(&self.map);
        let local = map.wire_to_local.remove(&wire)?;
        map.local_to_wire.remove(&local);
        Some(local)
    }

    pub(crate) fn wire_of(&self, local: &NumberOrString) -> Option<i64> {
        lock(&self.map).local_to_wire.get(local).copied()
    }

    pub(crate) fn record(&self, session: &SessionId, record: InFlightRequest) {
        if self.health.persisting() {
            self.journal
                .send(Op::Record(session.clone(), Box::new(record)));
        }
    }

    pub(crate) fn complete(&self, session: &SessionId, wire: i64) {
        if self.health.persisting() {
            self.journal
                .send(Op::Complete(session.clone(), RequestId::Number(wire)));
        }
    }

    pub(crate) fn cursor(&self, session: &SessionId, wire: i64, event: &str) {
        if self.health.persisting() {
            self.journal.send(Op::Cursor(
                session.clone(),
                RequestId::Number(wire),
                event.to_owned(),
            ));
        }
    }

    pub(crate) fn task(&self, session: &SessionId, wire: i64, task: String) {
        if self.health.persisting() {
            self.journal
                .send(Op::Task(session.clone(), RequestId::Number(wire), task));
        }
    }

    pub(crate) fn standalone_cursor(&self, session: &SessionId, event: &str) {
        if self.health.persisting() {
            self.journal
                .send(Op::Standalone(session.clone(), event.to_owned()));
        }
    }
}
