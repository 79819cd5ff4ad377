//! The journal writer: every store write of the client goes through it,
//! delayed and coalesced, so that persistence never stalls a request.
//!
//! # When what is committed
//!
//! Every change carries the time it was made, and is committed
//! `delay` after it (the builder's `journal_delay`), or at once when the
//! application flushes:
//!
//! * a request is written once it has been in flight for `delay`: a request
//!   answered sooner never costs a write (nor its answer a delete);
//! * an answer to a written request deletes its entry `delay` after the
//!   answer reached the client, never before: the mark that the
//!   application has the answer is committed after rmcp has handed it over;
//! * cursors, task ids, the session and the era verdict follow the same
//!   window.
//!
//! # Why a thread
//!
//! The writer runs on a thread of its own, with its own small runtime, not
//! as a task of the application's runtime: a runtime that shuts down (a
//! `main` that returns) drops its tasks wherever they stand, and with them
//! the writes still waiting in the window, such as the delete of an entry
//! whose answer the application already has. Dropping the last
//! [`ClientHandle`](super::ClientHandle) commits everything pending and
//! waits for it (at most [`EXIT_WAIT`]): in a `main` that returns, that is
//! while the runtime still runs, so a store driven by it (Redis) takes the
//! writes too. Dropping the last transport (rmcp's worker, when the runtime
//! shuts down) does the same for what came after. A process that ends
//! without dropping (SIGKILL, `std::process::exit`) loses what the window
//! held.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, PutMode, RequestId, ServerKey, ServerProfile, SessionId,
};
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, warn};

use super::health::{Health, lock};

/// The key under which a session's standalone GET stream cursor is stored
/// (request streams are keyed by their request id).
pub(crate) const STANDALONE_STREAM: &str = "standalone";

/// How long dropping the last handle and transport of a client waits for
/// the writer to commit what is still pending. A store that cannot take
/// writes any more (a Redis connection driven by the application's runtime,
/// which stopped) is given up on after this.
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(5);

/// The journal of requests to a server without sessions (2026-07-28):
/// kept under this pseudo session, which no server can name (server
/// session ids are never this word in practice, and a stored legacy
/// session's journal is keyed by its own id).
pub(crate) fn sessionless() -> SessionId {
    SessionId::new("sessionless".to_owned()).expect("a valid session id")
}

/// One change for the store, in the order the client made it.
#[derive(Debug)]
enum Op {
    /// A new session: stored with `Overwrite` (a stale or corrupt record is
    /// replaced).
    SaveSession(Box<mcp_persist_core::LegacySession>),
    /// The session is gone (404, or ended): the record goes, its journal
    /// entries stay until each is collected or dismissed.
    ForgetSession(SessionId),
    /// A request was sent.
    Record(SessionId, Box<InFlightRequest>),
    /// An SSE event id arrived on a request's stream.
    Cursor(SessionId, RequestId, String),
    /// A task-augmented request was answered with its task id.
    Task(SessionId, RequestId, String),
    /// A request was answered (or failed to send, or its answer was
    /// collected, or the application dismissed it).
    Complete(SessionId, RequestId),
    /// `tasks/get` reported this task ended: the request answered with it
    /// is done.
    TaskDone(SessionId, String),
    /// An SSE event id arrived on the standalone GET stream.
    Standalone(SessionId, String),
    /// The era verdict, version and discover cache for the server.
    SaveProfile(Box<ServerProfile>),
    /// The stored verdict proved wrong: the era is to be probed again.
    ForgetProfile,
    /// Answer once everything queued before is in the store.
    Flush(Done),
}

/// Who waits for a flush.
#[derive(Debug)]
enum Done {
    /// An async caller.
    Async(oneshot::Sender<()>),
    /// A thread that blocks (a drop).
    Blocking(std::sync::mpsc::Sender<()>),
}

impl Done {
    fn send(self) {
        match self {
            Done::Async(tx) => {
                let _ = tx.send(());
            }
            Done::Blocking(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

/// The sending half: what the client tells the store, in order, each
/// change with the time it was made. Every write is dropped once the store
/// has failed ([`Health::degrade`]).
#[derive(Debug, Clone)]
pub(crate) struct JournalTx {
    // Dropped before `_closer` (fields drop in order): when the last clone
    // goes, the channel is closed by the time the closer waits.
    tx: mpsc::UnboundedSender<(Instant, Op)>,
    wake: Arc<Notify>,
    health: Arc<Health>,
    _closer: Arc<Closer>,
}

/// Waits, when the last sender is dropped, for the writer to commit what it
/// still holds.
#[derive(Debug)]
struct Closer {
    wake: Arc<Notify>,
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Drop for Closer {
    fn drop(&mut self) {
        // The channel is closed: the writer commits everything and stops.
        self.wake.notify_one();
        if let Some(done) = lock(&self.done).take()
            && let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(EXIT_WAIT)
        {
            warn!(after = ?EXIT_WAIT, "the client's store did not take its last writes in time; giving up on them");
        }
    }
}

impl JournalTx {
    fn send(&self, op: Op) {
        if self.health.persisting() {
            // The writer only stops when every sender is gone.
            let _ = self.tx.send((Instant::now(), op));
        }
    }

    /// Waits until everything sent before is in the store (or dropped,
    /// when the store has failed), cutting the window short.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self
            .tx
            .send((Instant::now(), Op::Flush(Done::Async(tx))))
            .is_ok()
        {
            self.wake.notify_one();
            let _ = rx.await;
        }
    }

    /// [`flush`](Self::flush) for a drop: blocks the thread until the store
    /// has everything sent before, at most [`EXIT_WAIT`]. On a runtime
    /// that runs on this thread alone it only starts the flush: a store
    /// driven by that runtime (Redis) could not make progress while the
    /// thread waits.
    pub(crate) fn flush_blocking(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self
            .tx
            .send((Instant::now(), Op::Flush(Done::Blocking(tx))))
            .is_err()
        {
            return;
        }
        self.wake.notify_one();
        let alone = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if !alone
            && let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(EXIT_WAIT)
        {
            warn!(after = ?EXIT_WAIT, "the client's store did not take its writes in time");
        }
    }

    /// Stores a new session, replacing whatever was stored.
    pub(crate) fn save_session(&self, session: mcp_persist_core::LegacySession) {
        self.send(Op::SaveSession(Box::new(session)));
    }

    /// Forgets the stored session; its journal entries stay listed.
    pub(crate) fn forget_session(&self, session: &SessionId) {
        self.send(Op::ForgetSession(session.clone()));
    }

    /// Stores the era verdict.
    pub(crate) fn save_profile(&self, profile: ServerProfile) {
        self.send(Op::SaveProfile(Box::new(profile)));
    }

    /// Forgets the era verdict.
    pub(crate) fn forget_profile(&self) {
        self.send(Op::ForgetProfile);
    }

    /// Journals a request sent in `session`.
    pub(crate) fn record(&self, session: &SessionId, record: InFlightRequest) {
        self.send(Op::Record(session.clone(), Box::new(record)));
    }

    /// Closes the journal entry of a request (answered, failed to send, or
    /// dealt with by the application).
    pub(crate) fn complete(&self, session: &SessionId, id: RequestId) {
        self.send(Op::Complete(session.clone(), id));
    }

    /// The last SSE event id seen on a request's response stream.
    pub(crate) fn cursor(&self, session: &SessionId, id: RequestId, event: &str) {
        self.send(Op::Cursor(session.clone(), id, event.to_owned()));
    }

    /// The task id a task-augmented request was answered with.
    pub(crate) fn task(&self, session: &SessionId, id: RequestId, task: String) {
        self.send(Op::Task(session.clone(), id, task));
    }

    /// The application saw the task end (through its own `tasks/get`):
    /// the request answered with it leaves the journal.
    pub(crate) fn task_done(&self, session: &SessionId, task: String) {
        self.send(Op::TaskDone(session.clone(), task));
    }

    /// The last SSE event id seen on the session's standalone GET stream.
    pub(crate) fn standalone_cursor(&self, session: &SessionId, event: &str) {
        self.send(Op::Standalone(session.clone(), event.to_owned()));
    }
}

/// Starts the writer on its own thread.
pub(crate) fn spawn(
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
) -> JournalTx {
    let (tx, rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = Writer {
        store,
        key,
        health: health.clone(),
        delay,
        rx,
        wake: wake.clone(),
        entries: HashMap::new(),
        saves: Vec::new(),
        profile: None,
        deletes: Vec::new(),
        standalone: BTreeMap::new(),
        flushes: Vec::new(),
    };
    // The application's log subscriber, for the writer's warnings too.
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let spawned = std::thread::Builder::new()
        .name("mcp-persist-journal".to_owned())
        .spawn(move || {
            let _logs = tracing::dispatcher::set_default(&dispatch);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(writer.run()),
                Err(e) => {
                    warn!(error = %e, "cannot start the client's journal writer; continuing with in-memory state only");
                    writer
                        .health
                        .degrade(format!("the journal writer could not start: {e}"));
                }
            }
            let _ = done_tx.send(());
        });
    let done = match spawned {
        Ok(_) => Some(done_rx),
        Err(e) => {
            warn!(error = %e, "cannot start the client's journal thread; continuing with in-memory state only");
            health.degrade(format!("the journal thread could not start: {e}"));
            None
        }
    };
    JournalTx {
        tx,
        wake: wake.clone(),
        health,
        _closer: Arc::new(Closer {
            wake,
            done: Mutex::new(done),
        }),
    }
}

/// Where a journal entry stands between the client and the store.
#[derive(Debug)]
struct Entry {
    record: InFlightRequest,
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

struct Writer {
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
    rx: mpsc::UnboundedReceiver<(Instant, Op)>,
    wake: Arc<Notify>,
    entries: HashMap<(SessionId, RequestId), Entry>,
    /// Sessions stored (`Ok`) or forgotten (`Err`), in order.
    saves: Vec<Result<mcp_persist_core::LegacySession, SessionId>>,
    /// The verdict to store (`Some(Some)`) or forget (`Some(None)`).
    profile: Option<Option<ServerProfile>>,
    /// Entries this process never held (journaled by an earlier one) that
    /// were collected or dismissed, with when.
    deletes: Vec<(SessionId, RequestId, Instant)>,
    /// The newest standalone cursor per session, and since when it waits.
    standalone: BTreeMap<SessionId, (String, Instant)>,
    flushes: Vec<Done>,
}

impl Writer {
    async fn run(mut self) {
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
                debug!(server = %self.key, "client journal closed; everything committed");
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
            Op::Record(sid, record) => {
                self.entries.insert(
                    (sid, record.id.clone()),
                    Entry {
                        record: *record,
                        written: false,
                        dirty_since: Some(at),
                        answered_at: None,
                    },
                );
            }
            Op::Cursor(sid, id, event) => {
                if let Some(e) = self.entries.get_mut(&(sid, id)) {
                    e.record.last_event_id = Some(event);
                    e.dirty_since.get_or_insert(at);
                }
            }
            Op::Task(sid, id, task) => {
                if let Some(e) = self.entries.get_mut(&(sid, id)) {
                    e.record.task_id = Some(task);
                    e.dirty_since.get_or_insert(at);
                }
            }
            Op::Complete(sid, id) => {
                let key = (sid, id);
                match self.entries.get_mut(&key) {
                    // Answered before it was ever written: nothing to undo.
                    Some(e) if !e.written => {
                        self.entries.remove(&key);
                    }
                    Some(e) => {
                        e.answered_at.get_or_insert(at);
                    }
                    // Journaled by an earlier process: delete it from the store.
                    None => self.deletes.push((key.0, key.1, at)),
                }
            }
            Op::TaskDone(sid, task) => {
                self.entries.retain(|(s, _), e| {
                    if *s != sid || e.record.task_id.as_deref() != Some(task.as_str()) {
                        return true;
                    }
                    e.answered_at.get_or_insert(at);
                    e.written
                });
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
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            if entry.answered_at.is_some() {
                if let Err(e) = self
                    .store
                    .complete_inflight(&self.key, &key.0, &key.1)
                    .await
                {
                    return self.degrade(&e);
                }
                self.entries.remove(&key);
            } else {
                let record = entry.record.clone();
                if let Err(e) = self.store.record_inflight(&self.key, &key.0, &record).await {
                    return self.degrade(&e);
                }
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.written = true;
                    entry.dirty_since = None;
                }
            }
        }
        let mut waiting = Vec::new();
        for (sid, id, at) in std::mem::take(&mut self.deletes) {
            if !due(at + self.delay) {
                waiting.push((sid, id, at));
                continue;
            }
            if let Err(e) = self.store.complete_inflight(&self.key, &sid, &id).await {
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

    fn clear(&mut self) {
        self.entries.clear();
        self.saves.clear();
        self.profile = None;
        self.deletes.clear();
        self.standalone.clear();
    }

    fn degrade(&mut self, error: &mcp_persist_core::Error) {
        warn!(server = %self.key, error = %error, "client state store failed; continuing with in-memory state only");
        self.health.degrade(format!("the store failed: {error}"));
        self.clear();
        debug!("journal cleared after store failure");
    }
}
