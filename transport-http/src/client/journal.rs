//! The background writer: every store write of the client goes through it,
//! coalesced, so that persistence never stalls a request.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, LegacySession, PutMode, RequestId, ServerKey, ServerProfile,
    SessionId,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::health::Health;

/// The key under which a session's standalone GET stream cursor is stored
/// (request streams are keyed by their request id).
pub(crate) const STANDALONE_STREAM: &str = "standalone";

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
    /// replaced), its journal starting empty.
    SaveSession(Box<LegacySession>),
    /// The session is gone (404, or ended by the application).
    ForgetSession(SessionId),
    /// A request was sent.
    Record(SessionId, Box<InFlightRequest>),
    /// An SSE event id arrived on a request's stream.
    Cursor(SessionId, RequestId, String),
    /// A task-augmented request was answered with its task id.
    Task(SessionId, RequestId, String),
    /// A request was answered (or failed to send).
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
    Flush(oneshot::Sender<()>),
}

/// Where a journal entry stands between the client and the store.
#[derive(Debug)]
struct Entry {
    record: InFlightRequest,
    /// Whether the store holds some version of it.
    written: bool,
    /// Whether the in-memory record is newer than the stored one.
    dirty: bool,
    completed: bool,
}

/// The sending half: what the client tells the store, in order. Every
/// write is dropped once the store has failed ([`Health::degrade`]).
#[derive(Debug, Clone)]
pub(crate) struct JournalTx {
    tx: mpsc::UnboundedSender<Op>,
    health: Arc<Health>,
}

impl JournalTx {
    fn send(&self, op: Op) {
        if self.health.persisting() {
            // The writer only stops when every sender is gone.
            let _ = self.tx.send(op);
        }
    }

    /// Waits until everything sent before is in the store (or dropped,
    /// when the store has failed).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Op::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Stores a new session, replacing whatever was stored.
    pub(crate) fn save_session(&self, session: LegacySession) {
        self.send(Op::SaveSession(Box::new(session)));
    }

    /// Forgets the stored session and its journal.
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

/// Starts the writer task.
pub(crate) fn spawn(
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
) -> JournalTx {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        Writer {
            store,
            key,
            health: health.clone(),
            delay,
            entries: HashMap::new(),
            deletes: Vec::new(),
            standalone: BTreeMap::new(),
        }
        .run(rx),
    );
    JournalTx { tx, health }
}

struct Writer {
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
    entries: HashMap<(SessionId, RequestId), Entry>,
    deletes: Vec<(SessionId, RequestId)>,
    standalone: BTreeMap<SessionId, String>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        while let Some(first) = rx.recv().await {
            let flush_now = matches!(first, Op::Flush(_));
            let mut batch = vec![first];
            // Coalescing window: a request answered within it costs no write.
            if !flush_now && !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            while let Ok(op) = rx.try_recv() {
                batch.push(op);
            }
            let mut flushes = Vec::new();
            let mut profile = None;
            let mut saves = Vec::new();
            for op in batch {
                match op {
                    Op::Flush(done) => flushes.push(done),
                    Op::SaveProfile(p) => profile = Some(Some(*p)),
                    Op::ForgetProfile => profile = Some(None),
                    Op::SaveSession(s) => saves.push(Ok(*s)),
                    Op::ForgetSession(sid) => {
                        self.entries.retain(|(s, _), _| *s != sid);
                        self.standalone.remove(&sid);
                        saves.push(Err(sid));
                    }
                    Op::Record(sid, record) => {
                        self.entries.insert(
                            (sid, record.id.clone()),
                            Entry {
                                record: *record,
                                written: false,
                                dirty: true,
                                completed: false,
                            },
                        );
                    }
                    Op::Cursor(sid, id, event) => {
                        if let Some(e) = self.entries.get_mut(&(sid, id)) {
                            e.record.last_event_id = Some(event);
                            e.dirty = true;
                        }
                    }
                    Op::Task(sid, id, task) => {
                        if let Some(e) = self.entries.get_mut(&(sid, id)) {
                            e.record.task_id = Some(task);
                            e.dirty = true;
                        }
                    }
                    Op::Complete(sid, id) => match self.entries.get_mut(&(sid.clone(), id.clone()))
                    {
                        Some(e) => e.completed = true,
                        // Journaled by an earlier process: delete it from the store.
                        None => self.deletes.push((sid, id)),
                    },
                    Op::TaskDone(sid, task) => {
                        for ((s, _), e) in self.entries.iter_mut() {
                            if *s == sid && e.record.task_id.as_deref() == Some(task.as_str()) {
                                e.completed = true;
                            }
                        }
                    }
                    Op::Standalone(sid, event) => {
                        self.standalone.insert(sid, event);
                    }
                }
            }
            if self.health.persisting() {
                let result = match &profile {
                    Some(Some(p)) => self.store.save_profile(&self.key, p).await,
                    Some(None) => self.store.forget_profile(&self.key).await,
                    None => Ok(()),
                };
                if let Err(e) = result {
                    self.degrade(&e);
                }
                self.apply(saves).await;
            } else {
                self.entries.clear();
                self.deletes.clear();
                self.standalone.clear();
            }
            for done in flushes {
                let _ = done.send(());
            }
        }
    }

    async fn apply(&mut self, saves: Vec<Result<LegacySession, SessionId>>) {
        for save in saves {
            let result = match &save {
                Ok(session) => self
                    .store
                    .save_session(&self.key, session, PutMode::Overwrite)
                    .await
                    .map(|_| ()),
                Err(_) => self.store.forget_session(&self.key).await,
            };
            if let Err(e) = result {
                self.degrade(&e);
                return;
            }
        }
        // Journal entries: drop the ones answered before ever being written.
        let keys: Vec<_> = self.entries.keys().cloned().collect();
        for key in keys {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let result = if entry.completed {
                let written = entry.written;
                self.entries.remove(&key);
                if written {
                    self.store
                        .complete_inflight(&self.key, &key.0, &key.1)
                        .await
                } else {
                    Ok(())
                }
            } else if entry.dirty {
                entry.dirty = false;
                entry.written = true;
                self.store
                    .record_inflight(&self.key, &key.0, &entry.record)
                    .await
            } else {
                Ok(())
            };
            if let Err(e) = result {
                self.degrade(&e);
                return;
            }
        }
        for (sid, id) in std::mem::take(&mut self.deletes) {
            if let Err(e) = self.store.complete_inflight(&self.key, &sid, &id).await {
                self.degrade(&e);
                return;
            }
        }
        let cursors = std::mem::take(&mut self.standalone);
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
                self.degrade(&e);
                return;
            }
        }
    }

    fn degrade(&mut self, error: &mcp_persist_core::Error) {
        warn!(server = %self.key, error = %error, "client state store failed; continuing with in-memory state only");
        self.health.degrade(format!("the store failed: {error}"));
        self.entries.clear();
        self.standalone.clear();
        debug!("journal cleared after store failure");
    }
}
