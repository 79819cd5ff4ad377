//! The session in use: the stored one answering `initialize`, the current
//! one and its `InitializeResult`, and what ends it.

use std::sync::Mutex;

use mcp_persist_core::SessionId;
use rmcp::model::InitializeResult;

use crate::client::health::lock;

/// A stored session ready to answer rmcp's `initialize`.
#[derive(Debug, Clone)]
pub(crate) struct Seed {
    pub(crate) session_id: SessionId,
    pub(crate) result: InitializeResult,
}

#[derive(Debug, Default)]
struct Slot {
    /// Answers the next `initialize` without the network (taken once).
    seed: Option<Seed>,
    /// Drop the next `notifications/initialized`: the server already has it.
    swallow_initialized: bool,
    /// The session in use, and its `InitializeResult`.
    current: Option<(SessionId, InitializeResult)>,
    /// The session a 404 ended, until a new one replaces it.
    expired: Option<SessionId>,
    /// Every session a 404 ended in this process.
    gone: Vec<SessionId>,
    /// Set when the application ends the session: lets the DELETE through.
    ending: bool,
    /// The last event id the previous process saw on the session's
    /// standalone GET stream: the first GET of this process resumes from it.
    standalone_cursor: Option<(SessionId, String)>,
}

/// The session state of one client, in memory. Store writes are the
/// caller's ([`Lifecycle`](super::Lifecycle) pairs them).
#[derive(Debug, Default)]
pub(crate) struct SessionState {
    slot: Mutex<Slot>,
}

impl SessionState {
    /// Makes a stored session the current one; the next `initialize` is
    /// answered from it.
    pub(crate) fn install_seed(&self, seed: Seed) {
        let mut slot = lock(&self.slot);
        slot.current = Some((seed.session_id.clone(), seed.result.clone()));
        slot.seed = Some(seed);
    }

    /// Remembers where a stored session's standalone stream stopped.
    pub(crate) fn install_standalone_cursor(&self, session: SessionId, event: String) {
        lock(&self.slot).standalone_cursor = Some((session, event));
    }

    /// The stored standalone cursor of `session`, once: only the first GET
    /// after a restart resumes from it.
    pub(crate) fn take_standalone_cursor(&self, session: &SessionId) -> Option<String> {
        let mut slot = lock(&self.slot);
        match slot.standalone_cursor.take() {
            Some((s, event)) if s == *session => Some(event),
            _ => None,
        }
    }

    /// Takes the stored session to answer an `initialize` with; the
    /// `notifications/initialized` that follows is then dropped.
    pub(crate) fn take_seed(&self) -> Option<Seed> {
        let mut slot = lock(&self.slot);
        let seed = slot.seed.take()?;
        slot.swallow_initialized = true;
        Some(seed)
    }

    /// Whether this `notifications/initialized` is to be dropped (once).
    pub(crate) fn take_swallow_initialized(&self) -> bool {
        std::mem::take(&mut lock(&self.slot).swallow_initialized)
    }

    /// The session in use and its `InitializeResult`.
    pub(crate) fn current(&self) -> Option<(SessionId, InitializeResult)> {
        lock(&self.slot).current.clone()
    }

    /// The protocol version the session in use speaks.
    pub(crate) fn protocol_version(&self) -> Option<String> {
        lock(&self.slot)
            .current
            .as_ref()
            .map(|(_, result)| result.protocol_version.to_string())
    }

    /// Lets (or stops letting) the next DELETE through.
    pub(crate) fn set_ending(&self, ending: bool) {
        lock(&self.slot).ending = ending;
    }

    /// Whether the application is ending the session.
    pub(crate) fn ending(&self) -> bool {
        lock(&self.slot).ending
    }

    /// A real `initialize` made `session_id` current; returns the session
    /// it replaces (the current one, or the one a 404 ended).
    pub(crate) fn replace(
        &self,
        session_id: SessionId,
        result: InitializeResult,
    ) -> Option<SessionId> {
        let mut slot = lock(&self.slot);
        slot.seed = None;
        let expired = slot.expired.take();
        slot.current
            .replace((session_id, result))
            .map(|(old, _)| old)
            .or(expired)
    }

    /// The server answered 404 for `session_id`: forgets it if it is the
    /// current one (true) and remembers it as expired.
    pub(crate) fn expire(&self, session_id: &SessionId) -> bool {
        let mut slot = lock(&self.slot);
        let was = slot.current.as_ref().is_some_and(|(s, _)| s == session_id);
        if was {
            slot.current = None;
            slot.expired = Some(session_id.clone());
            slot.gone.push(session_id.clone());
        }
        slot.seed = None;
        was
    }

    /// Whether the server answered 404 for `session_id` in this process.
    pub(crate) fn expired_here(&self, session_id: &SessionId) -> bool {
        lock(&self.slot).gone.contains(session_id)
    }

    /// The session was ended: nothing is current any more.
    pub(crate) fn end(&self) {
        let mut slot = lock(&self.slot);
        slot.current = None;
        slot.seed = None;
    }
}
