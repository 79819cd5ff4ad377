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
//!
//! On a runtime that runs on the dropping thread alone (`#[tokio::test]`,
//! a `current_thread` runtime) a drop cannot wait: a store driven by that
//! runtime could not take the writes while the thread blocks. The drop
//! starts the flush, and the next client built for the same server in
//! this process awaits it before it reads the store, so a client built
//! right after another was dropped starts from what that one ended with.

mod writer;

use std::{
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, RequestId, ServerKey, ServerProfile, SessionId,
    telemetry::Telemetry,
};
use rmcp::model::ClientRequest;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{Span, debug, warn};

use self::writer::Writer;
use super::{
    delegate::method_and_params,
    health::{Health, lock},
};

/// The key under which a session's standalone GET stream cursor is stored
/// (request streams are keyed by their request id).
pub(crate) const STANDALONE_STREAM: &str = "standalone";

/// How long dropping the last handle and transport of a client waits for
/// the writer to commit what is still pending. A store that cannot take
/// writes any more (a Redis connection driven by the application's runtime,
/// which stopped) is given up on after this.
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Whose journal an entry is in: a session's, or that of a server without
/// sessions (2026-07-28), whose task calls are journaled all the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum JournalScope {
    /// The requests sent in this session.
    Session(SessionId),
    /// The requests sent to a server without sessions.
    Sessionless,
}

/// The session component the journal of a server without sessions is
/// stored under, as every version has written it: entries an earlier
/// process left there are found after an upgrade. A server would have to
/// name a session exactly this for the two to meet.
const SESSIONLESS_KEY: &str = "sessionless";

impl JournalScope {
    /// The scope of an entry read back from the store under `session`.
    pub(crate) fn from_stored(session: SessionId) -> Self {
        if session.as_str() == SESSIONLESS_KEY {
            JournalScope::Sessionless
        } else {
            JournalScope::Session(session)
        }
    }

    /// The session component the scope's entries are stored under.
    fn stored(&self) -> &SessionId {
        static SESSIONLESS: OnceLock<SessionId> = OnceLock::new();
        match self {
            JournalScope::Session(session) => session,
            JournalScope::Sessionless => SESSIONLESS.get_or_init(|| {
                SessionId::new(SESSIONLESS_KEY).expect("a word of visible ASCII is a session id")
            }),
        }
    }
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
    Record(JournalScope, Box<Unwritten>),
    /// An SSE event id arrived on a request's stream.
    Cursor(JournalScope, RequestId, String),
    /// A task-augmented request was answered with its task id.
    Task(JournalScope, RequestId, String),
    /// A request was answered (or failed to send, or its answer was
    /// collected, or the application dismissed it).
    Complete(JournalScope, RequestId),
    /// `tasks/get` reported this task ended: the request answered with it
    /// is done.
    TaskDone(JournalScope, String),
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
    /// The client's span, for the warnings of whoever drops the last
    /// sender.
    span: Span,
    /// The server the journal is kept for: a flush a drop could not wait
    /// for is settled by the next client built for it.
    key: ServerKey,
}

/// Flushes started by a drop that could not wait for them (on a runtime
/// that runs on the dropping thread alone), each with the server whose
/// journal it commits. The next client built for that server in this
/// process awaits them before it reads the store: what the dropped client
/// dismissed, answered or saved is what the new one starts from.
static UNSETTLED: Mutex<Vec<(ServerKey, oneshot::Receiver<()>)>> = Mutex::new(Vec::new());

/// Waits (at most [`EXIT_WAIT`] each) for the flushes that dropped clients
/// of `key` started and could not wait for. Awaited, not blocked on: a
/// store driven by this runtime makes progress meanwhile.
pub(crate) async fn settle(key: &ServerKey) {
    let pending: Vec<_> = {
        let mut unsettled = lock(&UNSETTLED);
        let mut mine = Vec::new();
        let mut others = Vec::new();
        for (k, mut rx) in unsettled.drain(..) {
            if matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                if k == *key {
                    mine.push(rx);
                } else {
                    others.push((k, rx));
                }
            }
        }
        *unsettled = others;
        mine
    };
    if !pending.is_empty() {
        debug!(
            flushes = pending.len(),
            "awaiting the last writes of a client of this server dropped earlier in this process"
        );
    }
    for rx in pending {
        if tokio::time::timeout(EXIT_WAIT, rx).await.is_err() {
            warn!(after = ?EXIT_WAIT, "a dropped client's store did not take its last writes in time; reading the store as it is");
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        let _span = self.span.enter();
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

    /// Asks the writer to commit everything sent before and then tell
    /// `done`; false when the writer is gone.
    fn request_flush(&self, done: Done) -> bool {
        let sent = self.tx.send((Instant::now(), Op::Flush(done))).is_ok();
        if sent {
            self.wake.notify_one();
        }
        sent
    }

    /// Waits until everything sent before is in the store (or dropped,
    /// when the store has failed), cutting the window short.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.request_flush(Done::Async(tx)) {
            let _ = rx.await;
        }
    }

    /// [`flush`](Self::flush) for a drop: blocks the thread until the store
    /// has everything sent before, at most [`EXIT_WAIT`]. On a runtime
    /// that runs on this thread alone it only starts the flush, for the
    /// next client of the server to await: a store driven by that runtime
    /// (Redis) could not make progress while the thread waits.
    pub(crate) fn flush_blocking(&self) {
        let alone = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if alone {
            // Not waited for here; the next client built for the server
            // in this process awaits it (see [`settle`]).
            let (tx, rx) = oneshot::channel();
            if self.request_flush(Done::Async(tx)) {
                lock(&UNSETTLED).push((self._closer.key.clone(), rx));
            }
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if !self.request_flush(Done::Blocking(tx)) {
            return;
        }
        let _span = self._closer.span.enter();
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(EXIT_WAIT) {
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

    /// Journals a request sent in `scope`.
    pub(crate) fn record(&self, scope: JournalScope, entry: Unwritten) {
        self.send(Op::Record(scope, Box::new(entry)));
    }

    /// Closes the journal entry of a request (answered, failed to send, or
    /// dealt with by the application).
    pub(crate) fn complete(&self, scope: JournalScope, id: RequestId) {
        self.send(Op::Complete(scope, id));
    }

    /// The last SSE event id seen on a request's response stream.
    pub(crate) fn cursor(&self, scope: JournalScope, id: RequestId, event: &str) {
        self.send(Op::Cursor(scope, id, event.to_owned()));
    }

    /// The task id a task-augmented request was answered with.
    pub(crate) fn task(&self, scope: JournalScope, id: RequestId, task: String) {
        self.send(Op::Task(scope, id, task));
    }

    /// The application saw the task end (through its own `tasks/get`):
    /// the request answered with it leaves the journal.
    pub(crate) fn task_done(&self, scope: JournalScope, task: String) {
        self.send(Op::TaskDone(scope, task));
    }

    /// The last SSE event id seen on the session's standalone GET stream.
    pub(crate) fn standalone_cursor(&self, session: &SessionId, event: &str) {
        self.send(Op::Standalone(session.clone(), event.to_owned()));
    }
}

/// A request to journal, as sent. Its method and params stay in the typed
/// request rmcp built until the entry is written: a call answered within
/// the window never is, and never pays for turning them into JSON, which
/// was the largest part of what the client did to each call before
/// sending it.
#[derive(Debug)]
pub(crate) struct Unwritten {
    /// The record, without method and params yet.
    record: InFlightRequest,
    request: ClientRequest,
}

impl Unwritten {
    /// The record of `request`, sent now as `id`.
    pub(crate) fn new(id: RequestId, request: ClientRequest) -> Self {
        Unwritten {
            record: InFlightRequest::new(id, String::new(), None),
            request,
        }
    }

    /// The record, still without method and params, and the request they
    /// are to be read from ([`fill_in`]).
    fn into_parts(self) -> (InFlightRequest, ClientRequest) {
        (self.record, self.request)
    }
}

/// Completes `record` for writing: the method and params of `request` as
/// JSON, and the `traceparent` its params carry (the request's span), so
/// that whoever collects it later continues its trace.
fn fill_in(record: &mut InFlightRequest, request: &ClientRequest) {
    let (method, params) = method_and_params(request);
    record.traceparent = crate::telemetry::traceparent_in(params.as_ref()).map(str::to_owned);
    record.method = method;
    record.params = params;
}

/// Starts the writer on its own thread; its logs go to `span` (the
/// client's).
pub(crate) fn spawn(
    store: ClientStateStore,
    key: ServerKey,
    health: Arc<Health>,
    delay: Duration,
    span: Span,
    telemetry: Telemetry,
) -> JournalTx {
    let (tx, rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = Writer::new(
        store,
        key.clone(),
        health.clone(),
        delay,
        rx,
        wake.clone(),
        telemetry,
    );
    let writer_health = health.clone();
    // The application's log subscriber, for the writer's warnings too.
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let writer_span = span.clone();
    let spawned = std::thread::Builder::new()
        .name("mcp-persist-journal".to_owned())
        .spawn(move || {
            let _logs = tracing::dispatcher::set_default(&dispatch);
            // Every line the writer logs carries the client's span.
            let _span = writer_span.enter();
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(writer.run()),
                Err(e) => {
                    warn!(error = %e, "cannot start the client's journal writer; continuing with in-memory state only");
                    writer_health.degrade(format!("the journal writer could not start: {e}"));
                }
            }
            let _ = done_tx.send(());
        });
    let done = match spawned {
        Ok(_) => Some(done_rx),
        Err(e) => {
            let _span = span.enter();
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
            span,
            key,
        }),
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientJsonRpcMessage, GetMeta, NumberOrString, ProgressToken};
    use serde_json::json;

    use super::*;

    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn an_entry_written_later_holds_the_request_as_it_was_journaled() {
        let mut message: ClientJsonRpcMessage = serde_json::from_value(json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {
                "name": "echo",
                "arguments": {"text": "hi", "n": [1, 2]},
                "_meta": {"io.mcp-persist/idempotencyKey": "k1", "traceparent": TRACEPARENT}
            }
        }))
        .expect("a tools/call");
        let ClientJsonRpcMessage::Request(request) = &mut message else {
            panic!("a request")
        };
        // What rmcp keeps beside the params (the envelope's `_meta`) is
        // sent inside them, and journaled with them.
        request
            .request
            .get_meta_mut()
            .0
            .0
            .insert("io.example/extra".to_owned(), json!(true));
        // The params as the journal kept them before it held the typed
        // request: the whole message as JSON.
        let as_sent = serde_json::to_value(&message).expect("JSON")["params"].clone();
        let ClientJsonRpcMessage::Request(request) = &mut message else {
            panic!("a request")
        };
        let unwritten = Unwritten::new(RequestId::Number(9), request.request.clone());
        // The request goes on changing after it is journaled (the wire
        // progress token goes in): the entry does not.
        request
            .request
            .get_meta_mut()
            .set_progress_token(ProgressToken(NumberOrString::Number(9)));

        let (mut record, request) = unwritten.into_parts();
        assert_eq!(record.method, "", "nothing is encoded until written");
        assert_eq!(record.params, None);
        fill_in(&mut record, &request);
        assert_eq!(record.id, RequestId::Number(9));
        assert_eq!(record.method, "tools/call");
        assert_eq!(record.params.as_ref(), Some(&as_sent));
        let meta = &as_sent["_meta"];
        assert_eq!(meta["io.example/extra"], json!(true));
        assert_eq!(meta["io.mcp-persist/idempotencyKey"], json!("k1"));
        assert!(meta.get("progressToken").is_none());
        assert_eq!(record.traceparent.as_deref(), Some(TRACEPARENT));
    }
}
