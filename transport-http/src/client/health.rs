//! Whether the store is still written, and the notices for the application.

use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, Ordering},
};

use tokio::sync::broadcast;

use super::report::ClientNotice;

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section of the client is a few plain assignments).
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
