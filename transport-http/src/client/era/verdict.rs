//! The stored era verdict of the server (legacy or modern, its version and
//! `server/discover` cache), and the one re-probe a process may make.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

use mcp_persist_core::{ProtocolEra, ServerProfile};

use crate::client::{health::lock, journal::JournalTx};

/// The era verdict, in memory and (through the journal) in the store.
#[derive(Debug)]
pub(crate) struct Verdict {
    profile: Mutex<Option<ServerProfile>>,
    journal: JournalTx,
    /// Set once this process has re-probed a stale verdict: never twice.
    reprobed: AtomicBool,
}

impl Verdict {
    pub(crate) fn new(journal: JournalTx) -> Self {
        Verdict {
            profile: Mutex::new(None),
            journal,
            reprobed: AtomicBool::new(false),
        }
    }

    /// The verdict in force, if any.
    pub(crate) fn profile(&self) -> Option<ServerProfile> {
        lock(&self.profile).clone()
    }

    /// Whether the server is judged modern (no sessions, no GET streams).
    pub(crate) fn is_modern(&self) -> bool {
        lock(&self.profile)
            .as_ref()
            .is_some_and(|p| p.era == ProtocolEra::Modern)
    }

    /// Installs a stored verdict read at start (nothing is written).
    pub(crate) fn install(&self, profile: ServerProfile) {
        *lock(&self.profile) = Some(profile);
    }

    /// Keeps a new verdict in memory and in the store.
    pub(crate) fn set(&self, profile: ServerProfile) {
        *lock(&self.profile) = Some(profile.clone());
        self.journal.save_profile(profile);
    }

    /// Forgets a verdict that proved wrong, in memory and in the store.
    pub(crate) fn forget(&self) -> Option<ServerProfile> {
        let old = lock(&self.profile).take();
        self.journal.forget_profile();
        old
    }

    /// Claims the one re-probe of this process: true the first time only.
    pub(crate) fn claim_reprobe(&self) -> bool {
        !self.reprobed.swap(true, Ordering::AcqRel)
    }
}
