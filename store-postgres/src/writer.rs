//! Group commit of appends: one task takes the appends that concurrent
//! callers queued and commits them together, in one statement (one
//! transaction, one round trip, one WAL flush), while the next ones queue.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use deadpool_postgres::Pool;
use mcp_persist_core::{Error, Result};
use tokio::sync::{mpsc, oneshot};

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

impl Writer {
    /// Starts the task; it ends when every sender is dropped.
    pub(crate) fn spawn(self) -> mpsc::UnboundedSender<Job> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(self.run(rx));
        tx
    }

    async fn run(self, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut carried: Option<Job> = None;
        loop {
            let first = match carried.take() {
                Some(job) => job,
                None => match rx.recv().await {
                    Some(job) => job,
                    None => return,
                },
            };
            let mut bytes = first.bytes();
            let mut batch = vec![first];
            while batch.len() < MAX_JOBS {
                match rx.try_recv() {
                    Ok(job) => {
                        if bytes + job.bytes() > MAX_BYTES {
                            carried = Some(job);
                            break;
                        }
                        bytes += job.bytes();
                        batch.push(job);
                    }
                    Err(_) => break,
                }
            }
            self.counters.queued.store(rx.len(), Ordering::Relaxed);
            self.commit(batch).await;
        }
    }

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
                .map_err(|e| error::map(e, &self.target, key))?;
            row.try_get::<_, Vec<i64>>(0)
                .map_err(|e| error::map(e, &self.target, key))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(error::no_reply("an append", self.timeout, &self.target)),
        }
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
