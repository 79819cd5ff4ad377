//! The writer: holds each change until it is due (its time plus the
//! journal's delay, or a flush) and commits it; a change leaves memory only
//! once the store has it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, PutMode, RequestId, ServerKey, ServerProfile, SessionId,
    telemetry::Telemetry,
};
use tokio::sync::{Notify, mpsc};
use tracing::{debug, warn};

use rmcp::model::ClientRequest;

use super::{Done, JournalScope, Op, STANDALONE_STREAM, fill_in};
use crate::client::health::Health;

/// Where a journal entry stands between the client and the store.
#[derive(Debug)]
struct Entry {
    /// Without method and params until first written (see [`Unwritten`](super::Unwritten)).
    record: InFlightRequest,
    /// The request the record's method and params are read from when it is
    /// first written; `None` once they are in it.
    request: Option<Box<ClientRequest>>,
    /// Whether the store holds some version of it.
    written: bool,
    /// Since when the in-memory record is newer than the stored one (for
    /// an entry never written: when the request was sent).
    dirty_since: Option<Instant>,
    /// When its answer reached the client.
    answered_at: Option<Instant>,
}

impl Entry {
    /// When the store is due to learn of this entry: its delete once
    /// answered, its (re)write while dirty.
    fn due(&self, delay: Duration) -> Option<Instant> {
        match (self.answered_at, self.dirty_since) {
            (Some(at), _) => Some(at + delay),
            (None, Some(since)) => Some(since + delay),
            (None, None) => None,
        }
    }
}

pub(super) struct Writer {
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
    rx: mpsc::UnboundedReceiver<(Instant, Op)>,
    wake: Arc<Notify>,
    entries: HashMap<(JournalScope, RequestId), Entry>,
    /// Sessions stored (`Ok`) or forgotten (`Err`), in order.
    saves: Vec<Result<mcp_persist_core::LegacySession, SessionId>>,
    /// The verdict to store (`Some(Some)`) or forget (`Some(None)`).
    profile: Option<Option<ServerProfile>>,
    /// Entries this process never held (journaled by an earlier one) that
    /// were collected or dismissed, with when.
    deletes: Vec<(JournalScope, RequestId, Instant)>,
    /// The newest standalone cursor per session, and since when it waits.
    standalone: BTreeMap<SessionId, (String, Instant)>,
    flushes: Vec<Done>,
    /// Counts the entries this process journaled and saw no answer to
    /// (`mcp_persist.journal.pending`).
    telemetry: Telemetry,
}

impl Writer {
    pub(super) fn new(
        store: ClientStateStore,
        key: ServerKey,
        health: Arc<Health>,
        delay: Duration,
        rx: mpsc::UnboundedReceiver<(Instant, Op)>,
        wake: Arc<Notify>,
        telemetry: Telemetry,
    ) -> Self {
        Writer {
            telemetry,
            store,
            key,
            health,
            delay,
            rx,
            wake,
            entries: HashMap::new(),
            saves: Vec::new(),
            profile: None,
            deletes: Vec::new(),
            standalone: BTreeMap::new(),
            flushes: Vec::new(),
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            let closed = self.drain();
            let force = closed || !self.flushes.is_empty();
            if self.health.persisting() {
                self.apply(force, Instant::now()).await;
            } else {
                self.clear();
            }
            for done in self.flushes.drain(..) {
                done.send();
            }
            if closed {
                // What is left unanswered is the next process's to list.
                self.telemetry.journal_pending(-self.unanswered());
                debug!("client journal closed; everything committed");
                return;
            }
            match self.next_due() {
                // Nothing pending: wait for the next change.
                None => match self.rx.recv().await {
                    Some((at, op)) => self.absorb(at, op),
                    None => continue,
                },
                // Changes made meanwhile are due later than this one: the
                // writer sleeps through them, unless a flush or the close
                // cuts the window short.
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {}
                        _ = self.wake.notified() => {}
                    }
                }
            }
        }
    }

    /// Takes every queued change into memory; true once every sender is
    /// gone.
    fn drain(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok((at, op)) => self.absorb(at, op),
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
    }

    fn absorb(&mut self, at: Instant, op: Op) {
        match op {
            Op::Flush(done) => self.flushes.push(done),
            Op::SaveProfile(p) => self.profile = Some(Some(*p)),
            Op::ForgetProfile => self.profile = Some(None),
            Op::SaveSession(s) => self.saves.push(Ok(*s)),
            Op::ForgetSession(sid) => {
                // The entries stay: listed until collected or dismissed.
                self.standalone.remove(&sid);
                self.saves.push(Err(sid));
            }
            Op::Record(scope, unwritten) => {
                let (record, request) = unwritten.into_parts();
                let replaced = self.entries.insert(
                    (scope, record.id.clone()),
                    Entry {
                        record,
                        request: Some(Box::new(request)),
                        written: false,
                        dirty_since: Some(at),
                        answered_at: None,
                    },
                );
                if replaced.is_none_or(|e| e.answered_at.is_some()) {
                    self.telemetry.journal_pending(1);
                }
            }
            Op::Cursor(scope, id, event) => {
                if let Some(e) = self.entries.get_mut(&(scope, id)) {
                    e.record.last_event_id = Some(event);
                    e.dirty_since.get_or_insert(at);
                }
            }
            Op::Task(scope, id, task) => {
                if let Some(e) = self.entries.get_mut(&(scope, id)) {
                    e.record.task_id = Some(task);
                    e.dirty_since.get_or_insert(at);
                }
            }
            Op::Complete(scope, id) => {
                let key = (scope, id);
                match self.entries.get_mut(&key) {
                    // Answered before it was ever written: nothing to undo.
                    Some(e) if !e.written => {
                        if e.answered_at.is_none() {
                            self.telemetry.journal_pending(-1);
                        }
                        self.entries.remove(&key);
                    }
                    Some(e) => {
                        if e.answered_at.is_none() {
                            self.telemetry.journal_pending(-1);
                        }
                        e.answered_at.get_or_insert(at);
                    }
                    // Journaled by an earlier process: delete it from the store.
                    None => self.deletes.push((key.0, key.1, at)),
                }
            }
            Op::TaskDone(scope, task) => {
                let mut ended = 0;
                self.entries.retain(|(s, _), e| {
                    if *s != scope || e.record.task_id.as_deref() != Some(task.as_str()) {
                        return true;
                    }
                    if e.answered_at.is_none() {
                        ended += 1;
                    }
                    e.answered_at.get_or_insert(at);
                    e.written
                });
                self.telemetry.journal_pending(-ended);
            }
            Op::Standalone(sid, event) => {
                let since = self.standalone.get(&sid).map_or(at, |(_, since)| *since);
                self.standalone.insert(sid, (event, since));
            }
        }
    }

    /// The earliest time some pending change is due.
    fn next_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut due = (!self.saves.is_empty() || self.profile.is_some()).then_some(now);
        let mut earliest = |at: Instant| {
            due = Some(due.map_or(at, |d: Instant| d.min(at)));
        };
        for entry in self.entries.values() {
            if let Some(at) = entry.due(self.delay) {
                earliest(at);
            }
        }
        for (_, _, at) in &self.deletes {
            earliest(*at + self.delay);
        }
        for (_, since) in self.standalone.values() {
            earliest(*since + self.delay);
        }
        due
    }

    /// Commits what is due at `now` (everything when `force`). A change
    /// leaves memory only once the store has it.
    async fn apply(&mut self, force: bool, now: Instant) {
        let due = |at: Instant| force || at <= now;
        if let Some(profile) = self.profile.take() {
            let result = match &profile {
                Some(p) => self.store.save_profile(&self.key, p).await,
                None => self.store.forget_profile(&self.key).await,
            };
            if let Err(e) = result {
                return self.degrade(&e);
            }
        }
        for save in std::mem::take(&mut self.saves) {
            let result = match &save {
                Ok(session) => self
                    .store
                    .save_session(&self.key, session, PutMode::Overwrite)
                    .await
                    .map(|_| ()),
                Err(_) => self.store.forget_session(&self.key).await,
            };
            if let Err(e) = result {
                return self.degrade(&e);
            }
        }
        let keys: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| e.due(self.delay).is_some_and(due))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            if entry.answered_at.is_some() {
                if let Err(e) = self
                    .store
                    .complete_inflight(&self.key, key.0.stored(), &key.1)
                    .await
                {
                    return self.degrade(&e);
                }
                self.entries.remove(&key);
            } else {
                if let Some(request) = entry.request.take() {
                    fill_in(&mut entry.record, &request);
                }
                let record = entry.record.clone();
                if let Err(e) = self
                    .store
                    .record_inflight(&self.key, key.0.stored(), &record)
                    .await
                {
                    return self.degrade(&e);
                }
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.written = true;
                    entry.dirty_since = None;
                }
            }
        }
        let mut waiting = Vec::new();
        for (scope, id, at) in std::mem::take(&mut self.deletes) {
            if !due(at + self.delay) {
                waiting.push((scope, id, at));
                continue;
            }
            if let Err(e) = self
                .store
                .complete_inflight(&self.key, scope.stored(), &id)
                .await
            {
                return self.degrade(&e);
            }
        }
        self.deletes = waiting;
        let cursors: Vec<_> = self
            .standalone
            .iter()
            .filter(|(_, (_, since))| due(*since + self.delay))
            .map(|(sid, (event, _))| (sid.clone(), event.clone()))
            .collect();
        for (sid, event) in cursors {
            let result = self
                .store
                .update_session(&self.key, |s| {
                    if s.session_id == sid {
                        s.last_event_ids
                            .insert(STANDALONE_STREAM.to_owned(), event.clone());
                    }
                })
                .await;
            if let Err(e) = result {
                return self.degrade(&e);
            }
            if self
                .standalone
                .get(&sid)
                .is_some_and(|(newest, _)| *newest == event)
            {
                self.standalone.remove(&sid);
            }
        }
    }

    /// How many entries this process journaled are still unanswered.
    fn unanswered(&self) -> i64 {
        let n = self
            .entries
            .values()
            .filter(|e| e.answered_at.is_none())
            .count();
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    fn clear(&mut self) {
        self.telemetry.journal_pending(-self.unanswered());
        self.entries.clear();
        self.saves.clear();
        self.profile = None;
        self.deletes.clear();
        self.standalone.clear();
    }

    fn degrade(&mut self, error: &mcp_persist_core::Error) {
        warn!(error = %error, "client state store failed; continuing with in-memory state only");
        self.health.degrade(format!("the store failed: {error}"));
        self.clear();
        debug!("journal cleared after store failure");
    }
}
