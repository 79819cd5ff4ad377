//! Group commit of the appends that need the [`APPEND`] script.
//!
//! A single-record append goes straight out as one `XADD` (see
//! [`RedisStore`](crate::RedisStore)'s guarantees). The rest (several
//! records, a TTL to refresh, a TTL only) must add their records and set
//! their log's expiry atomically, which takes the script. Those are queued to
//! one background task, which sends whatever has queued up as one script
//! call: each append in it is still atomic and gets its own result. A lone
//! append goes out at once; under load, batches grow while earlier ones are
//! in flight, so the round trips and the script's overhead are shared by
//! many appends.
//!
//! The task also remembers when it last set each log's expiry and to which
//! TTL, so that [`Appender::expiry_covers`] can tell the store a refresh is
//! not needed yet.
//!
//! On a Cluster a script may only touch keys of one slot, so a batch is
//! split by log and each part is sent on its own.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use mcp_persist_core::{Error, Result};
use redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::{
    conn::Conn,
    error::{self, BACKEND},
    scripts::APPEND,
    wire::{bytes_of, millis, parse_id, unexpected},
};

/// Batches in flight at once; more appends queue up meanwhile.
const IN_FLIGHT: usize = 4;
/// At most this many appends per batch...
const MAX_JOBS: usize = 512;
/// ...and about this many bytes of records (a single larger append still
/// goes out, alone).
const MAX_BYTES: usize = 4 * 1024 * 1024;
/// Refreshed expiries remembered before stale ones are dropped.
const REMEMBERED: usize = 4096;

/// One caller's append.
pub(crate) struct AppendJob {
    pub(crate) log: String,
    pub(crate) stream: Vec<u8>,
    /// The TTL the caller asked for, or `None` to keep the log's expiry.
    pub(crate) ttl: Option<Duration>,
    pub(crate) records: Vec<Vec<u8>>,
    pub(crate) reply: oneshot::Sender<Result<Vec<u64>>>,
}

impl AppendJob {
    fn bytes(&self) -> usize {
        self.records.iter().map(Vec::len).sum::<usize>() + self.stream.len()
    }
}

/// The expiry an append with `ttl` gives its log: the TTL plus a sixteenth,
/// so that appends within the next sixteenth may skip the refresh and the
/// log still lives at least `ttl` after each of them.
pub(crate) fn expiry(ttl: Duration) -> Duration {
    ttl.saturating_add(ttl / 16)
}

/// When this store last set a log's expiry, and to which TTL.
#[derive(Clone, Copy)]
struct Refresh {
    /// Taken before the script was sent, so the expiry runs from later.
    sent: Instant,
    ttl: Duration,
}

impl Refresh {
    fn covers(&self, ttl: Duration, now: Instant) -> bool {
        self.ttl == ttl && now.saturating_duration_since(self.sent) < ttl / 16
    }
}

type Refreshes = Arc<Mutex<HashMap<Vec<u8>, Refresh>>>;

/// The handle through which a store queues appends.
pub(crate) struct Appender {
    queue: mpsc::UnboundedSender<AppendJob>,
    refreshes: Refreshes,
}

impl Appender {
    /// Starts the background task on the current tokio runtime. It ends
    /// when the last handle of the store is dropped.
    ///
    /// Each script call that gets no reply within `timeout` fails its
    /// appends, so a server that hangs cannot hold batches forever.
    pub(crate) fn start(conn: Conn, cluster: bool, timeout: Duration) -> Appender {
        let (queue, jobs) = mpsc::unbounded_channel();
        let refreshes = Refreshes::default();
        let sender = Sender {
            conn,
            refreshes: Arc::clone(&refreshes),
            timeout,
        };
        tokio::spawn(run(sender, cluster, jobs));
        Appender { queue, refreshes }
    }

    /// Whether this store set the expiry of `stream` for `ttl` recently
    /// enough that an append now may leave it: the log then still lives at
    /// least `ttl` past the append.
    pub(crate) fn expiry_covers(&self, stream: &[u8], ttl: Duration) -> bool {
        let now = Instant::now();
        self.refreshes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .is_some_and(|r| r.covers(ttl, now))
    }

    /// Queues an append and waits for its sequence numbers.
    pub(crate) async fn append(
        &self,
        job_for: impl FnOnce(oneshot::Sender<Result<Vec<u64>>>) -> AppendJob,
    ) -> Result<Vec<u64>> {
        let (reply, result) = oneshot::channel();
        self.queue.send(job_for(reply)).map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::backend(
        BACKEND,
        "the store's append task has stopped (its tokio runtime was shut down)",
    )
}

/// What a batch needs to go out.
#[derive(Clone)]
struct Sender {
    conn: Conn,
    refreshes: Refreshes,
    timeout: Duration,
}

async fn run(sender: Sender, cluster: bool, mut jobs: mpsc::UnboundedReceiver<AppendJob>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = jobs.recv().await {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        // Everything that queued while we waited goes out together.
        let mut bytes = first.bytes();
        let mut batch = vec![first];
        while batch.len() < MAX_JOBS && bytes < MAX_BYTES {
            match jobs.try_recv() {
                Ok(job) => {
                    bytes += job.bytes();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        let sender = sender.clone();
        tokio::spawn(async move {
            if cluster && batch.len() > 1 {
                let mut by_log: HashMap<Vec<u8>, Vec<AppendJob>> = HashMap::new();
                for job in batch {
                    by_log.entry(job.stream.clone()).or_default().push(job);
                }
                let parts: Vec<_> = by_log
                    .into_values()
                    .map(|part| tokio::spawn(sender.clone().send(part)))
                    .collect();
                for part in parts {
                    let _ = part.await;
                }
            } else {
                sender.send(batch).await;
            }
            drop(permit);
        });
    }
}

impl Sender {
    /// Sends one batch as one script call and answers every caller.
    async fn send(mut self, batch: Vec<AppendJob>) {
        if batch.len() > 1 {
            debug!(appends = batch.len(), "sending a batch of appends");
        }
        let sent = Instant::now();
        let meta = script_meta(&batch);
        let reply = {
            let keys = script_keys(&batch);
            let args = script_args(&batch, &meta);
            let call = APPEND.run(&mut self.conn, &keys, &args);
            tokio::time::timeout(self.timeout, call).await
        };
        match reply {
            Ok(reply) => answer(batch, reply, sent, &self.refreshes),
            Err(_) => {
                for job in batch {
                    let _ = job.reply.send(Err(error::no_reply("append", self.timeout)));
                }
            }
        }
    }
}

fn script_keys(jobs: &[AppendJob]) -> Vec<&[u8]> {
    jobs.iter().map(|j| j.stream.as_slice()).collect()
}

/// Per append: its expiry in ms (empty: keep the log's) and record count.
fn script_meta(jobs: &[AppendJob]) -> Vec<(String, String)> {
    jobs.iter()
        .map(|job| {
            let expiry = job
                .ttl
                .map(|ttl| millis(expiry(ttl)).to_string())
                .unwrap_or_default();
            (expiry, job.records.len().to_string())
        })
        .collect()
}

/// The script's arguments: per append, its [`script_meta`] and records.
fn script_args<'a>(jobs: &'a [AppendJob], meta: &'a [(String, String)]) -> Vec<&'a [u8]> {
    let mut args = Vec::with_capacity(jobs.len() * 3);
    for (job, (expiry, count)) in jobs.iter().zip(meta) {
        args.push(expiry.as_bytes());
        args.push(count.as_bytes());
        args.extend(job.records.iter().map(Vec::as_slice));
    }
    args
}

/// Answers the appends of one script call, and remembers the expiries it
/// set.
fn answer(
    jobs: Vec<AppendJob>,
    reply: redis::RedisResult<Value>,
    sent: Instant,
    refreshes: &Refreshes,
) {
    let results = match reply {
        Ok(Value::Array(results)) => results,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(error::map(e.clone(), &job.log)));
            }
            return;
        }
        Ok(_) => {
            for job in jobs {
                let outcome = Err(unexpected(&job.log, "append did not return ids"));
                let _ = job.reply.send(outcome);
            }
            return;
        }
    };
    let mut results = results.into_iter();
    let mut refreshed = Vec::new();
    for job in jobs {
        let outcome = parse_ids(&job, &mut results);
        if let (Ok(_), Some(ttl)) = (&outcome, job.ttl) {
            refreshed.push((job.stream, Refresh { sent, ttl }));
        }
        let _ = job.reply.send(outcome);
    }
    if !refreshed.is_empty() {
        let mut known = refreshes.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= REMEMBERED {
            known.retain(|_, r| r.covers(r.ttl, sent));
        }
        known.extend(refreshed);
    }
}

/// The sequence numbers of one append, taken from the flat reply: as many
/// ids as it has records, or fewer and then an error.
fn parse_ids(job: &AppendJob, results: &mut impl Iterator<Item = Value>) -> Result<Vec<u64>> {
    let log = job.log.as_str();
    let mut seqs = Vec::with_capacity(job.records.len());
    while seqs.len() < job.records.len() {
        let Some(item) = results.next() else {
            return Err(unexpected(log, "append returned too few ids"));
        };
        let bytes = bytes_of(&item).unwrap_or_default();
        if let Some(message) = bytes.strip_prefix(b"!") {
            let message = String::from_utf8_lossy(message).into_owned();
            let corrupt = |reason: &str| Error::Corrupt {
                key: log.to_owned(),
                reason: reason.to_owned(),
                source: Some(message.clone().into()),
            };
            return Err(if message.starts_with("WRONGTYPE") {
                corrupt(crate::error::WRONG_TYPE)
            } else if crate::error::is_below_foreign_top(&message) {
                corrupt(crate::error::FOREIGN_TOP)
            } else {
                Error::backend(BACKEND, message)
            });
        }
        seqs.push(parse_id(log, bytes)?);
    }
    Ok(seqs)
}
