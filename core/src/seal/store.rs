//! [`Sealed`]: a backend behind a seal.

use std::{
    collections::HashMap,
    fmt,
    hash::{BuildHasher, Hasher},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;

use super::{
    Sealing,
    envelope::{self, KV_OVERHEAD, LOG_OVERHEAD, Position},
};
use crate::{
    Backend, Key, KvEntry, KvStore, LogRecord, LogStore, PutOptions, Result, Version,
    declare::Space, kit,
};

/// How many locks serialize this writer's appends (per log, by hash).
const STRIPES: usize = 64;

/// The log side of a sealed store: a writer id and, per stripe of log
/// names, the counter of the last record sealed (the lock keeps appends to
/// one log in counter order).
struct Writer {
    id: [u8; 8],
    hasher: std::collections::hash_map::RandomState,
    stripes: Box<[tokio::sync::Mutex<u64>]>,
}

impl Writer {
    fn new() -> Writer {
        let hasher = std::collections::hash_map::RandomState::new();
        let mut id = [0u8; 8];
        if aws_lc_rs::rand::fill(&mut id).is_err() {
            // Unique, not secret, is what a writer id must be: the
            // process's randomly keyed hasher over its id and the time.
            let mut h = hasher.build_hasher();
            h.write_u32(std::process::id());
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            id = h.finish().to_be_bytes();
        }
        Writer {
            id,
            hasher,
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(0)).collect(),
        }
    }

    fn stripe(&self, log: &str) -> &tokio::sync::Mutex<u64> {
        let mut h = self.hasher.build_hasher();
        h.write(log.as_bytes());
        // The remainder is below STRIPES, so it fits any usize.
        let i = usize::try_from(h.finish() % STRIPES as u64).unwrap_or(0);
        &self.stripes[i]
    }
}

/// A backend whose record values are sealed before they reach it (see the
/// [module docs](super)).
///
/// `S` is any backend: a concrete store (`Sealed<SqliteStore>` implements
/// both traits), or `dyn KvStore` / `dyn LogStore`. Keys, versions,
/// compare-and-swap, TTL, listing, trimming and sweeps are the backend's,
/// unchanged. Values are opened on the way out; a value that does not
/// open is [`Error::Sealing`](crate::Error::Sealing) naming the record.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use mcp_persist_core::{seal::*, *};
/// let (key, _) = SealKey::generate()?;
/// let store = Sealed::wrap(MemoryStore::new(), Sealing::new(Keyring::new(key)).seal_everything());
/// let log = declare::EVENT.key(&["s1"]);
/// let seqs = store.append(&log, vec![b"one".to_vec(), b"two".to_vec()], None).await?;
/// let read = store.read_after(&log, 0, 10).await?;
/// assert_eq!(read.iter().map(|r| r.data.clone()).collect::<Vec<_>>(), vec![b"one".to_vec(), b"two".to_vec()]);
/// assert_eq!(read[1].seq, seqs[1]);
/// assert_eq!(store.max_record_bytes(), MemoryStore::new().max_record_bytes() - LOG_OVERHEAD);
/// # Ok::<_, Error>(()) }).unwrap();
/// ```
pub struct Sealed<S: ?Sized> {
    inner: Arc<S>,
    sealing: Sealing,
    /// Made at the first append: key-value-only wrappers need none.
    writer: Arc<std::sync::OnceLock<Writer>>,
}

impl<S: ?Sized> Clone for Sealed<S> {
    fn clone(&self) -> Self {
        Sealed {
            inner: self.inner.clone(),
            sealing: self.sealing.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl<S: ?Sized> fmt::Debug for Sealed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("sealing", &self.sealing)
            .finish_non_exhaustive()
    }
}

impl<S: ?Sized> Sealed<S> {
    /// Seals what goes to `inner` with `sealing`.
    pub fn new(inner: Arc<S>, sealing: impl Into<Sealing>) -> Sealed<S> {
        Sealed {
            inner,
            sealing: sealing.into(),
            writer: Arc::default(),
        }
    }

    /// The backend behind the seal, for tools that must see stored bytes.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// What it is sealed with.
    pub fn sealing(&self) -> &Sealing {
        &self.sealing
    }
}

impl<S> Sealed<S> {
    /// [`Sealed::new`] for a backend not yet in an `Arc`.
    pub fn wrap(inner: S, sealing: impl Into<Sealing>) -> Sealed<S> {
        Sealed::new(Arc::new(inner), sealing)
    }
}

#[async_trait]
impl<S: Backend + ?Sized> Backend for Sealed<S> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    async fn sweep_expired(&self) -> Result<u64> {
        self.inner.sweep_expired().await
    }
}

fn expiry(ttl: Option<Duration>) -> Option<crate::Timestamp> {
    ttl.map(kit::expires_at)
}

#[async_trait]
impl<S: KvStore + ?Sized> KvStore for Sealed<S> {
    fn max_value_bytes(&self) -> usize {
        self.inner.max_value_bytes().saturating_sub(KV_OVERHEAD)
    }

    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let Some(entry) = self.inner.get(key).await? else {
            return Ok(None);
        };
        let ring = self.sealing.current();
        let version = entry.version;
        let (value, _) =
            self.sealing
                .open_value(&ring, Space::Kv, key, || key.to_string(), entry.value)?;
        Ok(Some(KvEntry::new(value, version)))
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        kit::check_value(&value, self.max_value_bytes())?;
        let value = if self.sealing.seals(Space::Kv, key) {
            let ring = self.sealing.current();
            envelope::seal(&ring, key, &value, expiry(options.ttl), None)?
        } else {
            value
        };
        self.inner.put(key, value, options).await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        self.inner.delete(key, if_version).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.inner.list(prefix).await
    }
}

impl<S: LogStore + ?Sized> Sealed<S> {
    /// Seals `records` for `log` and appends them with `append`, holding
    /// the log's stripe lock so this writer's counters reach the log in
    /// order.
    async fn append_sealed<'a, F, Fut>(
        &'a self,
        log: &'a Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
        append: F,
    ) -> Result<Vec<u64>>
    where
        F: FnOnce(Vec<Vec<u8>>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<u64>>>,
    {
        let limit = self.max_record_bytes();
        for record in &records {
            kit::check_value(record, limit)?;
        }
        if !self.sealing.seals(Space::Log, log) {
            return append(records).await;
        }
        let ring = self.sealing.current();
        let expires_at = expiry(ttl);
        let writer = self.writer.get_or_init(Writer::new);
        let mut counter = writer.stripe(log).lock().await;
        let mut next = *counter;
        let mut sealed = Vec::with_capacity(records.len());
        for record in &records {
            next += 1;
            let position = Position {
                writer: writer.id,
                counter: next,
            };
            sealed.push(envelope::seal(
                &ring,
                log,
                record,
                expires_at,
                Some(position),
            )?);
        }
        // Counters are spent even if the append fails: a later append still
        // gets greater ones, which is all the order check needs.
        *counter = next;
        append(sealed).await
    }

    /// Opens records read from `log`, checking each writer's order among them.
    fn open_records(&self, log: &Key, records: Vec<LogRecord>) -> Result<Vec<LogRecord>> {
        let ring = self.sealing.current();
        let mut last: HashMap<[u8; 8], u64> = HashMap::new();
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            let seq = record.seq;
            let label = || format!("{log}#{seq}");
            let (data, info) =
                self.sealing
                    .open_value(&ring, Space::Log, log, label, record.data)?;
            if let Some(info) = info {
                // A log record always has a position: `open_value` refused
                // a key-value envelope in a log.
                if let Some(p) = info.position {
                    let previous = last.insert(p.writer, p.counter);
                    if previous.is_some_and(|c| c >= p.counter) {
                        tracing::warn!(record = %label(), "a sealed log record is out of its writer's order");
                        return Err(super::SealProblem::OutOfOrder {
                            key_id: info.key_id,
                        }
                        .at(label()));
                    }
                }
            }
            out.push(LogRecord::new(seq, data));
        }
        Ok(out)
    }
}

#[async_trait]
impl<S: LogStore + ?Sized> LogStore for Sealed<S> {
    fn max_record_bytes(&self) -> usize {
        self.inner.max_record_bytes().saturating_sub(LOG_OVERHEAD)
    }

    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_sealed(log, records, ttl, |r| self.inner.append(log, r, ttl))
            .await
    }

    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_sealed(log, records, ttl, |r| {
            self.inner.append_unsynced(log, r, ttl)
        })
        .await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        let records = self.inner.read_after(log, after, limit).await?;
        self.open_records(log, records)
    }

    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        // Sealing keeps the wrapped store's numbering.
        self.inner.next_seq(log).await
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let records = self.inner.wait_after(log, after, limit, timeout).await?;
        self.open_records(log, records)
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        self.inner.trim(log, before).await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.inner.delete_log(log).await
    }
}
