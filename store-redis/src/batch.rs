//! Group commit of log appends.
//!
//! Appends from concurrent tasks are queued to one background task, which
//! sends whatever has queued up as one Lua script call: every append in it
//! still adds its records and refreshes its log's expiry atomically (a script
//! runs as a whole), and each caller gets its own result. A lone append goes
//! out at once; under load, batches grow while earlier ones are in flight,
//! so the server runs one script per batch instead of one per append.
//!
//! On a Cluster a script may only touch keys of one slot, so a batch is split
//! by log and each part is sent on its own.

use std::{collections::HashMap, sync::Arc};

use mcp_persist_core::{Error, Result};
use redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::{
    conn::Conn,
    error::{self, BACKEND},
    scripts::APPEND_BATCH,
};

/// Batches in flight at once; more appends queue up meanwhile.
const IN_FLIGHT: usize = 4;
/// At most this many appends per batch...
const MAX_JOBS: usize = 512;
/// ...and about this many bytes of records (a single larger append still
/// goes out, alone).
const MAX_BYTES: usize = 4 * 1024 * 1024;

/// One caller's append.
pub(crate) struct AppendJob {
    pub(crate) log: String,
    pub(crate) stream: Vec<u8>,
    /// TTL in ms, or empty to keep the log's expiry.
    pub(crate) ttl: String,
    pub(crate) records: Vec<Vec<u8>>,
    pub(crate) reply: oneshot::Sender<Result<Vec<u64>>>,
}

impl AppendJob {
    fn bytes(&self) -> usize {
        self.records.iter().map(Vec::len).sum::<usize>() + self.stream.len()
    }
}

/// The handle through which a store queues appends.
#[derive(Debug)]
pub(crate) struct Appender {
    queue: mpsc::UnboundedSender<AppendJob>,
}

impl Appender {
    /// Starts the background task on the current tokio runtime. It ends
    /// when the last handle of the store is dropped.
    pub(crate) fn start(conn: Conn, cluster: bool) -> Appender {
        let (queue, jobs) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, cluster, jobs));
        Appender { queue }
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

async fn run(conn: Conn, cluster: bool, mut jobs: mpsc::UnboundedReceiver<AppendJob>) {
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
        let conn = conn.clone();
        tokio::spawn(async move {
            if cluster && batch.len() > 1 {
                let mut by_log: HashMap<Vec<u8>, Vec<AppendJob>> = HashMap::new();
                for job in batch {
                    by_log.entry(job.stream.clone()).or_default().push(job);
                }
                let parts: Vec<_> = by_log
                    .into_values()
                    .map(|part| tokio::spawn(send(conn.clone(), part)))
                    .collect();
                for part in parts {
                    let _ = part.await;
                }
            } else {
                send(conn, batch).await;
            }
            drop(permit);
        });
    }
}

/// Sends one batch as one script call and answers every caller.
async fn send(mut conn: Conn, batch: Vec<AppendJob>) {
    if batch.len() > 1 {
        debug!(appends = batch.len(), "sending a batch of appends");
    }
    // KEYS: the distinct streams; ARGV per append: key index, TTL, record
    // count, records.
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut index: HashMap<&[u8], String> = HashMap::new();
    let mut counts = Vec::with_capacity(batch.len());
    for job in &batch {
        if !index.contains_key(job.stream.as_slice()) {
            keys.push(&job.stream);
            index.insert(&job.stream, keys.len().to_string());
        }
        counts.push(job.records.len().to_string());
    }
    let mut args: Vec<&[u8]> = Vec::new();
    for (job, count) in batch.iter().zip(&counts) {
        args.push(index[job.stream.as_slice()].as_bytes());
        args.push(job.ttl.as_bytes());
        args.push(count.as_bytes());
        args.extend(job.records.iter().map(Vec::as_slice));
    }
    let reply = APPEND_BATCH.run(&mut conn, &keys, &args).await;
    drop(index);
    match reply {
        Ok(Value::Array(results)) if results.len() == batch.len() => {
            for (job, result) in batch.into_iter().zip(results) {
                let outcome = parse_result(&job, result);
                let _ = job.reply.send(outcome);
            }
        }
        Ok(_) => {
            for job in batch {
                let _ = job.reply.send(Err(crate::store::unexpected(
                    &job.log,
                    "append did not return ids",
                )));
            }
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(error::map(e.clone(), &job.log)));
            }
        }
    }
}

/// One append's part of the reply: `{0, id...}`, or `{1, error}` when its
/// first `XADD` was refused (then nothing of it was written).
fn parse_result(job: &AppendJob, result: Value) -> Result<Vec<u64>> {
    let log = job.log.as_str();
    let Value::Array(items) = result else {
        return Err(crate::store::unexpected(
            log,
            "append result is not an array",
        ));
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(0)) => {
            let seqs: Vec<u64> = items
                .map(|id| {
                    crate::store::parse_id(log, crate::store::bytes_of(&id).unwrap_or_default())
                })
                .collect::<Result<_>>()?;
            if seqs.len() != job.records.len() {
                return Err(crate::store::unexpected(
                    log,
                    "append returned the wrong number of ids",
                ));
            }
            Ok(seqs)
        }
        Some(Value::Int(1)) => {
            let message = items
                .next()
                .and_then(|m| {
                    crate::store::bytes_of(&m).map(|b| String::from_utf8_lossy(b).into_owned())
                })
                .unwrap_or_default();
            if message.starts_with("WRONGTYPE") {
                Err(Error::Corrupt {
                    key: log.to_owned(),
                    reason: "the Redis key holds a value of another type".to_owned(),
                    source: Some(message.into()),
                })
            } else {
                Err(Error::backend(BACKEND, message))
            }
        }
        _ => Err(crate::store::unexpected(log, "append result has no status")),
    }
}
