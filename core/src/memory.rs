//! [`MemoryStore`]: both backend traits in process memory.
//!
//! For tests, examples and single-process deployments that need no
//! durability. Everything is lost when the last clone is dropped.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use async_trait::async_trait;
use tokio::{sync::Notify, time::Instant};

use crate::{
    Result,
    backend::{
        Backend, DEFAULT_MAX_VALUE_BYTES, KvEntry, KvStore, LogRecord, LogStore, PutMode,
        PutOptions, Version,
    },
    key::Key,
    kit::check_value,
};

const NAME: &str = "memory";

/// An in-memory [`KvStore`] and [`LogStore`]. Clones share the same data.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use mcp_persist_core::{Key, KvStore, LogStore, MemoryStore, PutMode, PutOptions};
/// let store = MemoryStore::new();
/// let (k, log) = (Key::new("k")?, Key::new("log")?);
/// let v = store.put(&k, b"hello".to_vec(), PutOptions::new(PutMode::Create)).await?;
/// assert_eq!(store.get(&k).await?.unwrap().version, v);
/// let seqs = store.append(&log, vec![b"a".to_vec(), b"b".to_vec()], None).await?;
/// assert_eq!(store.read_after(&log, seqs[0], 10).await?[0].data, b"b");
/// # Ok::<_, mcp_persist_core::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    appended: Notify,
}

#[derive(Default)]
struct State {
    kv: HashMap<Key, KvSlot>,
    /// The last version handed out, by any key: versions never repeat, not
    /// even for a key deleted and written again, and nothing is kept for a
    /// key once it is gone (a per-key counter kept after deletes grew by one
    /// entry for every key ever written).
    last_version: u64,
    logs: HashMap<Key, Log>,
}

struct KvSlot {
    value: Vec<u8>,
    version: u64,
    expires: Option<Instant>,
}

#[derive(Default)]
struct Log {
    records: Records,
    last_seq: u64,
    expires: Option<Instant>,
}

/// A log's records, numbered on without gaps (appends number on from the
/// last; a trim drops a prefix), their bytes packed into chunks.
///
/// An event store keeps every event of a stream for a while. Kept one
/// allocation each, every event took fresh memory from the heap, and the
/// heap grew a page at a time under the thread sending events; packed, the
/// caller's buffer is freed for its next record and the log takes memory
/// in chunks that double up to [`CHUNK_MAX`].
#[derive(Default)]
struct Records {
    /// The number of the first record kept (of the next one, when none is).
    first: u64,
    /// Where each record's bytes are, the first record's first.
    spans: VecDeque<Span>,
    /// The chunks holding the kept records' bytes, the oldest first.
    chunks: VecDeque<Vec<u8>>,
    /// How many chunks were dropped before `chunks[0]`: a span's `chunk`
    /// counts from the log's first chunk.
    chunks_dropped: u64,
}

/// One record's bytes: `len` bytes at `start` in chunk number `chunk`.
#[derive(Clone, Copy)]
struct Span {
    chunk: u64,
    start: usize,
    len: usize,
}

/// The first chunk of a log holds this many bytes (or its first record).
const CHUNK_MIN: usize = 256;
/// Chunks double in size up to this (a larger record gets one of its own).
const CHUNK_MAX: usize = 64 * 1024;

impl Records {
    /// Keeps `data` as record number `seq`, the one after the last.
    fn push(&mut self, seq: u64, data: &[u8]) {
        if self.spans.is_empty() {
            self.first = seq;
        }
        debug_assert_eq!(seq, self.first + self.spans.len() as u64);
        let mut chunk = match self.chunks.pop_back() {
            Some(last) if last.capacity() - last.len() >= data.len() => last,
            last => {
                let next = last
                    .as_ref()
                    .map_or(CHUNK_MIN, |c| (c.capacity() * 2).min(CHUNK_MAX));
                self.chunks.extend(last);
                Vec::with_capacity(next.max(data.len()))
            }
        };
        let start = chunk.len();
        chunk.extend_from_slice(data);
        self.chunks.push_back(chunk);
        let chunk_no = self.chunks_dropped + self.chunks.len() as u64 - 1;
        self.spans.push_back(Span {
            chunk: chunk_no,
            start,
            len: data.len(),
        });
    }

    /// Up to `limit` records numbered above `after`, in order.
    fn after(&self, after: u64, limit: usize) -> Vec<LogRecord> {
        let skip = after.saturating_add(1).saturating_sub(self.first);
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        self.spans
            .iter()
            .enumerate()
            .skip(skip)
            .take(limit)
            .map(|(i, span)| LogRecord::new(self.first + i as u64, self.bytes(span).to_vec()))
            .collect()
    }

    fn bytes(&self, span: &Span) -> &[u8] {
        let chunk = &self.chunks[(span.chunk - self.chunks_dropped) as usize];
        &chunk[span.start..span.start + span.len]
    }

    /// Drops the records numbered below `before` (and the chunks only they
    /// used); returns how many.
    fn trim(&mut self, before: u64) -> u64 {
        let drop = before
            .saturating_sub(self.first)
            .min(self.spans.len() as u64);
        self.spans.drain(..drop as usize);
        self.first += drop;
        // The chunks before the first kept record's go (all of them, when
        // none is kept).
        let keep_from = self
            .spans
            .front()
            .map_or(self.chunks_dropped + self.chunks.len() as u64, |s| s.chunk);
        while self.chunks_dropped < keep_from {
            self.chunks.pop_front();
            self.chunks_dropped += 1;
        }
        drop
    }
}

fn live(expires: Option<Instant>, now: Instant) -> bool {
    expires.is_none_or(|at| at > now)
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write:
        // every mutation below is a single insert or remove, or (a log's
        // records) made of steps that cannot fail.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn live_kv(&mut self, key: &str, now: Instant) -> Option<&KvSlot> {
        if self
            .kv
            .get(key)
            .is_some_and(|slot| !live(slot.expires, now))
        {
            self.kv.remove(key);
        }
        self.kv.get(key)
    }

    fn live_log(&mut self, log: &str, now: Instant) -> Option<&mut Log> {
        if self.logs.get(log).is_some_and(|l| !live(l.expires, now)) {
            self.logs.remove(log);
        }
        self.logs.get_mut(log)
    }
}

#[async_trait]
impl Backend for MemoryStore {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    async fn sweep_expired(&self) -> Result<u64> {
        let now = Instant::now();
        let mut state = self.state();
        let before = state.kv.len() + state.logs.len();
        state.kv.retain(|_, slot| live(slot.expires, now));
        state.logs.retain(|_, log| live(log.expires, now));
        Ok((before - state.kv.len() - state.logs.len()) as u64)
    }
}

#[async_trait]
impl KvStore for MemoryStore {
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let mut state = self.state();
        Ok(state
            .live_kv(key, Instant::now())
            .map(|slot| KvEntry::new(slot.value.clone(), Version::new(slot.version))))
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions { mode, ttl, .. } = options;
        check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
        let now = Instant::now();
        let mut state = self.state();
        let current = state.live_kv(key, now).map(|s| Version::new(s.version));
        mode.check(key, current)?;
        state.last_version += 1;
        let version = state.last_version;
        state.kv.insert(
            key.clone(),
            KvSlot {
                value,
                version,
                expires: ttl.map(|ttl| now + ttl),
            },
        );
        Ok(Version::new(version))
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let mut state = self.state();
        let current = state
            .live_kv(key, Instant::now())
            .map(|s| Version::new(s.version));
        if let Some(want) = if_version {
            PutMode::Update(want).check(key, current)?;
        }
        Ok(state.kv.remove(key).is_some() && current.is_some())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let now = Instant::now();
        let state = self.state();
        let mut keys: Vec<Key> = state
            .kv
            .iter()
            .filter(|(k, slot)| k.starts_with(prefix) && live(slot.expires, now))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        Ok(keys)
    }
}

#[async_trait]
impl LogStore for MemoryStore {
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, DEFAULT_MAX_VALUE_BYTES)?;
        }
        let now = Instant::now();
        let seqs = {
            let mut state = self.state();
            // One lookup on the way every event takes: the log is there.
            let entry = match state.logs.get_mut(log) {
                Some(entry) => entry,
                None => state.logs.entry(log.clone()).or_default(),
            };
            if !live(entry.expires, now) {
                // Expired: it starts again, as after a sweep.
                *entry = Log::default();
            }
            let mut seqs = Vec::with_capacity(records.len());
            for record in records {
                entry.last_seq += 1;
                entry.records.push(entry.last_seq, &record);
                seqs.push(entry.last_seq);
            }
            if let Some(ttl) = ttl {
                entry.expires = Some(now + ttl);
            }
            seqs
        };
        self.inner.appended.notify_waiters();
        Ok(seqs)
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        let mut state = self.state();
        Ok(state
            .live_log(log, Instant::now())
            .map(|l| l.records.after(after, limit))
            .unwrap_or_default())
    }

    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let state = self.state();
        // An expired log starts again at 1, as `append` makes it.
        let last = state
            .logs
            .get(log)
            .filter(|l| live(l.expires, Instant::now()))
            .map_or(0, |l| l.last_seq);
        Ok(Some(last.saturating_add(1)))
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            // Register before reading, so an append between the read and the
            // wait still wakes us.
            let notified = self.inner.appended.notified();
            let records = self.read_after(log, after, limit).await?;
            if !records.is_empty() {
                return Ok(records);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        let mut state = self.state();
        let Some(l) = state.live_log(log, Instant::now()) else {
            return Ok(0);
        };
        Ok(l.records.trim(before))
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.state().logs.remove(log);
        Ok(())
    }
}

/// Opens `memory:` URLs: a new, empty [`MemoryStore`] at each open (for
/// tests and examples). There is never an existing one to open.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryOpener;

#[async_trait]
impl crate::registry::Opener for MemoryOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["memory"]
    }

    fn forms(&self) -> &'static str {
        "memory:                             an empty in-process store (tests, examples)"
    }

    async fn open(
        &self,
        url: &crate::registry::StoreUrl,
        options: crate::registry::OpenOptions,
    ) -> Result<crate::registry::OpenedStore> {
        if options.mode == crate::registry::OpenMode::Existing {
            return Err(crate::Error::NotFound {
                what: "store",
                detail: Some(format!(
                    "{url}: a memory store exists only in the process that made it"
                )),
            });
        }
        Ok(crate::registry::OpenedStore::both(MemoryStore::new(), url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An append to a log that expired (and was not swept yet) starts it
    /// again: the expired records are gone, numbering starts over, and the
    /// new log lives without the old one's TTL unless given its own.
    #[tokio::test(start_paused = true)]
    async fn an_append_to_an_expired_log_starts_it_again() {
        let store = MemoryStore::new();
        let log = Key::new("l").unwrap();
        let ttl = Some(Duration::from_secs(10));
        assert_eq!(
            store.append(&log, vec![b"a".to_vec()], ttl).await.unwrap(),
            [1]
        );
        assert_eq!(
            store.append(&log, vec![b"b".to_vec()], ttl).await.unwrap(),
            [2]
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(
            store.append(&log, vec![b"c".to_vec()], None).await.unwrap(),
            [1]
        );
        let read = store.read_after(&log, 0, 10).await.unwrap();
        assert_eq!(
            read.iter()
                .map(|r| (r.seq, r.data.as_slice()))
                .collect::<Vec<_>>(),
            [(1, &b"c"[..])]
        );
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(store.read_after(&log, 0, 10).await.unwrap().len(), 1);
        // A live log goes on where it was.
        assert_eq!(
            store.append(&log, vec![b"d".to_vec()], None).await.unwrap(),
            [2]
        );
    }

    /// A log's records read back as written, whatever chunks their bytes
    /// landed in, through appends of every size (one larger than a whole
    /// chunk among them), trims anywhere (before the first record, inside
    /// a chunk, past the last) and reads from any point with any limit:
    /// checked against an ordered map of the same records.
    #[test]
    fn records_read_back_as_written_across_chunks_and_trims() {
        let mut records = Records::default();
        let mut model = std::collections::BTreeMap::<u64, Vec<u8>>::new();
        let mut last = 0u64;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |bound: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % bound
        };
        for round in 0..3000u64 {
            match next(10) {
                0 => {
                    let before = last.saturating_sub(next(40)) + next(3);
                    let expected = model.range(..before).count() as u64;
                    model.retain(|seq, _| *seq >= before);
                    assert_eq!(records.trim(before), expected, "round {round}");
                }
                _ => {
                    let len = match next(50) {
                        0 => CHUNK_MAX + 1 + next(100) as usize,
                        1 => 0,
                        _ => next(700) as usize,
                    };
                    last += 1;
                    let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ last) as u8).collect();
                    records.push(last, &data);
                    model.insert(last, data);
                }
            }
            let after = last.saturating_sub(next(60));
            let limit = next(20) as usize;
            let got: Vec<_> = records
                .after(after, limit)
                .into_iter()
                .map(|r| (r.seq, r.data))
                .collect();
            let want: Vec<_> = model
                .range(after + 1..)
                .take(limit)
                .map(|(seq, data)| (*seq, data.clone()))
                .collect();
            assert_eq!(got, want, "round {round}");
        }
        assert_eq!(records.after(0, usize::MAX).len(), model.len());
    }

    /// A stream's log keeps memory for what it keeps: once trimmed to its
    /// last few records it holds a chunk or two, not the bytes of all it
    /// ever held, and an emptied log reads nothing and numbers on.
    #[tokio::test]
    async fn a_trimmed_log_lets_go_of_what_it_no_longer_keeps() {
        let store = MemoryStore::new();
        let log = Key::new("stream").unwrap();
        for _ in 0..100 {
            let batch = (0..100).map(|_| vec![7u8; 300]).collect();
            store.append(&log, batch, None).await.unwrap();
        }
        assert_eq!(store.trim(&log, 9_991).await.unwrap(), 9_990);
        {
            let state = store.state();
            let records = &state.logs[&log].records;
            let held: usize = records.chunks.iter().map(Vec::capacity).sum();
            assert!(held <= 2 * CHUNK_MAX, "{held} bytes held for 10 records");
        }
        let kept = store.read_after(&log, 0, 100).await.unwrap();
        assert_eq!(kept.first().map(|r| r.seq), Some(9_991));
        assert_eq!(kept.len(), 10);
        assert_eq!(store.trim(&log, u64::MAX).await.unwrap(), 10);
        assert!(store.read_after(&log, 0, 100).await.unwrap().is_empty());
        assert_eq!(
            store
                .append(&log, vec![b"on".to_vec()], None)
                .await
                .unwrap(),
            [10_001]
        );
        assert_eq!(
            store.read_after(&log, 10_000, 1).await.unwrap()[0].data,
            b"on"
        );
    }

    /// Both traits are object safe: stores are passed around as trait objects.
    #[tokio::test]
    async fn traits_are_object_safe() {
        let store = MemoryStore::new();
        let kv: Arc<dyn KvStore> = Arc::new(store.clone());
        let log: Arc<dyn LogStore> = Arc::new(store);
        let (k, l) = (Key::new("k").unwrap(), Key::new("l").unwrap());
        kv.put(&k, b"v".to_vec(), PutOptions::new(PutMode::Create))
            .await
            .unwrap();
        log.append(&l, vec![b"r".to_vec()], None).await.unwrap();
        assert_eq!(kv.get(&k).await.unwrap().unwrap().value, b"v");
        assert_eq!(log.read_after(&l, 0, 1).await.unwrap()[0].data, b"r");
    }

    /// A long-lived process writing keys it never writes again (a stream,
    /// a keyed call each) keeps nothing of them once they are deleted or
    /// expired and swept, and a key written again after its delete gets a
    /// version its old one cannot stand in for.
    #[tokio::test]
    async fn nothing_is_kept_of_a_key_once_it_is_gone() {
        let store = MemoryStore::new();
        let mut first = None;
        for i in 0..1000 {
            let k = Key::new(format!("once-{i}")).unwrap();
            let ttl = (i % 2 == 0).then_some(Duration::from_millis(1));
            let v = store
                .put(
                    &k,
                    b"v".to_vec(),
                    PutOptions::new(PutMode::Create).with_ttl(ttl),
                )
                .await
                .unwrap();
            first.get_or_insert((k.clone(), v));
            if ttl.is_none() {
                assert!(store.delete(&k, Some(v)).await.unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(store.sweep_expired().await.unwrap(), 500);
        {
            let state = store.state();
            assert_eq!((state.kv.len(), state.logs.len()), (0, 0));
        }
        let (k, old) = first.unwrap();
        let new = store
            .put(&k, b"w".to_vec(), PutOptions::new(PutMode::Create))
            .await
            .unwrap();
        assert_ne!(new, old);
        let stale = store
            .put(&k, b"x".to_vec(), PutOptions::new(PutMode::Update(old)))
            .await;
        assert!(
            matches!(stale, Err(crate::Error::Conflict { .. })),
            "{stale:?}"
        );
        assert!(
            !store
                .delete(&k, Some(old))
                .await
                .is_ok_and(|deleted| deleted)
        );
    }
}
