//! Group commit of log appends.
//!
//! Appends from concurrent tasks are queued to one background task, which
//! sends whatever has queued up as one Lua script call: every append in it
//! still adds its records and refreshes its log's expiry atomically (a script
//! runs as a whole), and each caller gets its own result. A lone append goes
//! out at once; under load, batches grow while earlier ones are in flight,
//! so the round trips and the script's overhead are shared by many appends.
//!
//! On a Cluster a script may only touch keys of one slot, so a batch is
//! split by log and each part is sent on its own.

use std::{collections::HashMap, sync::Arc};

use mcp_persist_core::{Error, Result};
use redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::{
    conn::Conn,
    error::{self, BACKEND},
    scripts::APPEND,
    store::{bytes_of, parse_id, unexpected},
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

/// Sends one batch as one script call (see [`APPEND`]) and answers every
/// caller.
async fn send(mut conn: Conn, batch: Vec<AppendJob>) {
    if batch.len() > 1 {
        debug!(appends = batch.len(), "sending a batch of appends");
    }
    let counts: Vec<String> = batch.iter().map(|j| j.records.len().to_string()).collect();
    let keys: Vec<&[u8]> = batch.iter().map(|j| j.stream.as_slice()).collect();
    let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * 3);
    for (job, count) in batch.iter().zip(&counts) {
        args.push(job.ttl.as_bytes());
        args.push(count.as_bytes());
        args.extend(job.records.iter().map(Vec::as_slice));
    }
    let reply = APPEND.run(&mut conn, &keys, &args).await;
    drop((keys, args));
    let results = match reply {
        Ok(Value::Array(results)) => results,
        Ok(_) => {
            for job in batch {
                let outcome = Err(unexpected(&job.log, "append did not return ids"));
                let _ = job.reply.send(outcome);
            }
            return;
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(error::map(e.clone(), &job.log)));
            }
            return;
        }
    };
    let mut results = results.into_iter();
    for job in batch {
        let outcome = parse_ids(&job, &mut results);
        let _ = job.reply.send(outcome);
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
            return Err(if message.starts_with("WRONGTYPE") {
                Error::Corrupt {
                    key: log.to_owned(),
                    reason: "the Redis key holds a value of another type".to_owned(),
                    source: Some(message.into()),
                }
            } else {
                Error::backend(BACKEND, message)
            });
        }
        seqs.push(parse_id(log, bytes)?);
    }
    Ok(seqs)
}
