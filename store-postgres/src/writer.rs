//! Group commit of appends: the appends that concurrent callers queue
//! while a commit runs are committed together by the next one, in one
//! statement (one transaction, one round trip, one WAL flush).
//!
//! An append that finds no commit running commits itself, on its own task,
//! with no hop through another task: alone, it costs what the statement
//! costs. Appends that arrive meanwhile queue; when that commit ends, a
//! drain task commits the queue in batches until it is empty.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use deadpool_postgres::Pool;
use mcp_persist_core::{Error, Result};
use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;

use crate::error::{self, Target};

/// The most appends committed in one transaction.
const MAX_JOBS: usize = 256;
/// The most record bytes committed in one transaction (a single larger
/// append still goes alone).
const MAX_BYTES: usize = 8 * 1024 * 1024;

/// One caller's append.
pub(crate) struct Job {
    pub(crate) log: String,
    pub(crate) records: Vec<Vec<u8>>,
    pub(crate) ttl_ms: Option<i64>,
    pub(crate) synced: bool,
    pub(crate) reply: oneshot::Sender<Result<Vec<u64>>>,
}

impl Job {
    fn bytes(&self) -> usize {
        self.records.iter().map(Vec::len).sum::<usize>() + self.log.len()
    }
}

/// Counters of the group commit.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    pub(crate) operations: AtomicU64,
    pub(crate) queued: AtomicUsize,
}

/// What the writer task needs.
pub(crate) struct Writer {
    pub(crate) pool: Pool,
    pub(crate) target: Target,
    pub(crate) sql: String,
    pub(crate) timeout: Duration,
    pub(crate) counters: Arc<Counters>,
}

/// The queue of appends and who commits it.
pub(crate) struct Committer {
    state: Mutex<State>,
    writer: Writer,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// A commit is running (a leading caller's, or the drain task's).
    busy: bool,
}

/// Hands the queue on when a leading caller's commit ends, also when the
/// caller's future is dropped in the middle of it.
struct Lead<'a>(&'a Arc<Committer>);

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.0.hand_on();
    }
}

impl Committer {
    pub(crate) fn new(writer: Writer) -> Arc<Committer> {
        Arc::new(Committer {
            state: Mutex::new(State::default()),
            writer,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`; when no commit is running, commits the queue (this
    /// job first) on the caller's task. The answer comes on the job's
    /// reply channel either way.
    pub(crate) async fn submit(self: &Arc<Self>, job: Job) {
        let lead = {
            let mut state = self.lock();
            state.queue.push_back(job);
            !std::mem::replace(&mut state.busy, true)
        };
        if lead {
            let _lead = Lead(self);
            let batch = self.take_batch();
            self.writer.commit(batch).await;
        }
    }

    /// After a commit: the next batch goes to a drain task, or nobody is
    /// busy any more.
    fn hand_on(self: &Arc<Self>) {
        let mut state = self.lock();
        if state.queue.is_empty() {
            state.busy = false;
            return;
        }
        drop(state);
        let committer = Arc::clone(self);
        tokio::spawn(async move { committer.drain().await });
    }

    async fn drain(self: Arc<Self>) {
        loop {
            let batch = {
                let mut state = self.lock();
                if state.queue.is_empty() {
                    state.busy = false;
                    return;
                }
                drop(state);
                self.take_batch()
            };
            self.writer.commit(batch).await;
        }
    }

    /// The next batch: the oldest job, and those after it within the
    /// limits.
    fn take_batch(&self) -> Vec<Job> {
        let mut state = self.lock();
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(job) = state.queue.front() {
            let size = job.bytes();
            if !batch.is_empty() && (batch.len() >= MAX_JOBS || bytes + size > MAX_BYTES) {
                break;
            }
            bytes += size;
            batch.extend(state.queue.pop_front());
        }
        self.writer
            .counters
            .queued
            .store(state.queue.len(), Ordering::Relaxed);
        batch
    }
}

impl Writer {
    /// Commits `batch`. A failure that is not the server's unavailability
    /// (a batch member the database refuses) is retried one append at a
    /// time, so that it fails alone.
    async fn commit(&self, batch: Vec<Job>) {
        // Callers that gave up (their future dropped) need no commit.
        let batch: Vec<Job> = batch.into_iter().filter(|j| !j.reply.is_closed()).collect();
        if batch.is_empty() {
            return;
        }
        match self.execute(&batch).await {
            Ok(seqs) => self.answer(batch, seqs),
            Err(e) if batch.len() > 1 && !e.is_transient() => {
                tracing::debug!(error = %e, jobs = batch.len(), "group commit failed; appending one by one");
                for job in batch {
                    let result = self.execute(std::slice::from_ref(&job)).await;
                    match result {
                        Ok(seqs) => self.answer(vec![job], seqs),
                        Err(e) => {
                            let _ = job.reply.send(Err(e));
                        }
                    }
                }
            }
            Err(e) => {
                // One error, reported to every caller of the batch.
                let shared = Arc::new(e);
                for job in batch {
                    let _ = job.reply.send(Err(copy(&shared)));
                }
            }
        }
    }

    fn answer(&self, batch: Vec<Job>, seqs: Vec<i64>) {
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .operations
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let mut at = 0;
        for job in batch {
            let n = job.records.len();
            let mine = seqs.get(at..at + n).map(|s| {
                s.iter()
                    .map(|&seq| u64::try_from(seq).unwrap_or(0))
                    .collect::<Vec<u64>>()
            });
            at += n;
            let result = match mine {
                Some(seqs) if seqs.iter().all(|&s| s > 0) => Ok(seqs),
                _ => Err(error::bad_row(
                    &job.log,
                    "an append that returned fewer or invalid sequence numbers (the store's \
                     functions were changed outside mcp-persist)",
                )),
            };
            let _ = job.reply.send(result);
        }
    }

    async fn execute(&self, batch: &[Job]) -> Result<Vec<i64>> {
        let names: Vec<&str> = batch.iter().map(|j| j.log.as_str()).collect();
        let counts: Vec<i32> = batch
            .iter()
            .map(|j| i32::try_from(j.records.len()).unwrap_or(i32::MAX))
            .collect();
        let datas: Vec<&[u8]> = batch
            .iter()
            .flat_map(|j| j.records.iter().map(Vec::as_slice))
            .collect();
        let ttls: Vec<Option<i64>> = batch.iter().map(|j| j.ttl_ms).collect();
        let synced = batch.iter().any(|j| j.synced);
        let key = batch.first().map_or("", |j| j.log.as_str());
        let work = async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| error::map_pool(e, &self.target, self.timeout))?;
            let stmt = client
                .prepare_cached(&self.sql)
                .await
                .map_err(|e| error::map(e, &self.target, key))?;
            let row = client
                .query_one(&stmt, &[&names, &counts, &datas, &ttls, &synced])
                .await
                .map_err(|e| self.append_error(e, key))?;
            row.try_get::<_, Vec<i64>>(0)
                .map_err(|e| error::map(e, &self.target, key))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(error::no_reply("an append", self.timeout, &self.target)),
        }
    }

    /// Maps a failure of the append statement on a batch whose first log
    /// is `key`. The only number in it that can leave `bigint` is a log's
    /// head moved up by the records appended: a head that close to the
    /// largest value, which only a change outside this store makes, is
    /// that log's damage (a batch of several logs is then retried one
    /// append at a time, so that the error names the damaged log).
    /// A head below zero (the same kind of damage) is refused by the append
    /// function before it writes anything, as `data_corrupted` with the
    /// head in its detail.
    fn append_error(&self, e: tokio_postgres::Error, key: &str) -> Error {
        if e.code() == Some(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE) {
            return error::no_next_seq(key);
        }
        if e.code() == Some(&SqlState::DATA_CORRUPTED) {
            let head = e
                .as_db_error()
                .and_then(|d| d.detail())
                .unwrap_or("below zero");
            return error::bad_row(
                key,
                format!("the invalid last sequence number {head} in the log's header"),
            );
        }
        error::map(e, &self.target, key)
    }
}

/// Another [`Error`] saying what `e` says, for the next caller of a batch.
fn copy(e: &Arc<Error>) -> Error {
    match &**e {
        Error::Unavailable { backend, .. } => Error::Unavailable {
            backend,
            source: Box::new(Shared(Arc::clone(e))),
        },
        Error::Timeout { operation, after } => Error::Timeout {
            operation,
            after: *after,
        },
        Error::Corrupt { key, reason, .. } => Error::Corrupt {
            key: key.clone(),
            reason: reason.clone(),
            source: None,
        },
        Error::InvalidInput { what, reason } => Error::InvalidInput {
            what,
            reason: reason.clone(),
        },
        Error::NotFound { what, detail } => Error::NotFound {
            what,
            detail: detail.clone(),
        },
        _ => Error::backend(error::NAME, Shared(Arc::clone(e))),
    }
}

/// An error shared by the callers of one failed group commit.
#[derive(Debug)]
struct Shared(Arc<Error>);

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // An Unavailable's own text is generic; its cause says where.
        match &*self.0 {
            Error::Unavailable { source, .. } | Error::Backend { source, .. } => {
                write!(f, "{source}")
            }
            other => write!(f, "{other}"),
        }
    }
}

impl std::error::Error for Shared {}
