//! The backend contract: two small traits, [`KvStore`] and [`LogStore`].
//!
//! Everything that means something to MCP (key layout, record schemas,
//! validation, compare-and-swap loops) lives once, in the typed stores of this
//! crate. A backend only stores bytes, and proves it with the
//! [`conformance`] suite (feature `conformance`).
//!
//! # Keys
//!
//! Keys and log names arrive as [`Key`]s, already valid (a non-empty UTF-8
//! string of at most [`MAX_KEY_BYTES`] bytes with no NUL character): a
//! backend never checks them again. Any character, `/`, `..`, spaces and
//! non-ASCII text included, must round-trip exactly through
//! [`KvStore::list`].
//!
//! # The kit
//!
//! Expiry instants, TTL conversions, the sweep margin and value limits come
//! from [`kit`](crate::kit), so every backend rounds the same way (up:
//! nothing expires early) and keeps the same margin.
//!
//! # Versions
//!
//! Every successful write of a key returns a [`Version`]. Versions of one key
//! strictly increase over its lifetime in the backend, across restarts and
//! deletes, so a version once seen is never handed out again for that key
//! (the ABA problem cannot arise). Versions of different keys are unrelated.
//!
//! # Time to live
//!
//! A write may carry a TTL. Once it has passed, the record is **never returned**
//! by `get` or `list`, whatever the backend does about reclaiming its space, and
//! the key behaves as absent: `Create` succeeds, `Update` gives `Conflict`.
//!
//! TTLs are measured by a clock, and clocks step (NTP corrections, a VM
//! resumed, an operator's mistake). What a step does, per backend:
//!
//! | backend | clock that decides expiry | a step forward | a step back |
//! |---|---|---|---|
//! | memory | the process's monotonic clock | nothing | nothing |
//! | file, SQLite, Secrets Manager | the reading machine's wall clock against an absolute expiry ([`kit::now`](crate::kit::now)) | records expire early for reads; a sweep still keeps what expired less than its margin ([`kit::SWEEP_MARGIN`](crate::kit::SWEEP_MARGIN), 60 s) ago | expired records read as live again until the clock catches up |
//! | Redis | the Redis server's clock | as the server's clock does | as the server's clock does |
//! | Postgres | the database server's clock (`clock_timestamp()`), for writes and reads alike | as the server's clock does; a sweep still keeps what expired less than its margin ago | as the server's clock does |
//!
//! Nothing that decides who holds a lease reads a wall clock: refresh
//! leases and instance liveness are judged by each observer watching a
//! version stay unchanged on its own monotonic clock, and taken over by
//! compare-and-swap on that version, so no clock step gives two holders.
//! [`Backend::sweep_expired`] implementations keep records that expired
//! less than a margin ago, so a brief forward step never deletes live data
//! for good.
//!
//! # Durability
//!
//! A write that returned `Ok` is committed: a durable backend keeps it through
//! a `kill -9` of the writer. A crash at any instant leaves old value or new
//! value, never a mix.
//!
//! # Writing a backend
//!
//! ```
//! use std::{collections::HashMap, sync::Mutex};
//! use async_trait::async_trait;
//! use mcp_persist_core::{backend::DEFAULT_MAX_VALUE_BYTES, kit,
//!     Backend, Error, Key, KvEntry, KvStore, PutMode, PutOptions, Result, Version};
//!
//! /// A store without TTL support: it refuses writes that ask for one.
//! #[derive(Default)]
//! struct TinyStore { map: Mutex<HashMap<String, (Vec<u8>, u64)>>, clock: Mutex<u64> }
//!
//! #[async_trait]
//! impl Backend for TinyStore {
//!     fn backend_name(&self) -> &'static str { "tiny" }
//! }
//!
//! #[async_trait]
//! impl KvStore for TinyStore {
//!     async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
//!         let map = self.map.lock().expect("not poisoned");
//!         Ok(map.get(key.as_str()).map(|(v, n)| KvEntry::new(v.clone(), Version::new(*n))))
//!     }
//!     async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
//!         kit::check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
//!         if options.ttl.is_some() {
//!             return Err(Error::Unsupported { operation: "ttl", backend: "tiny" });
//!         }
//!         let mut map = self.map.lock().expect("not poisoned");
//!         let current = map.get(key.as_str()).map(|(_, n)| Version::new(*n));
//!         options.mode.check(key, current)?;
//!         let mut clock = self.clock.lock().expect("not poisoned");
//!         *clock += 1;
//!         map.insert(key.to_string(), (value, *clock));
//!         Ok(Version::new(*clock))
//!     }
//!     async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
//!         let mut map = self.map.lock().expect("not poisoned");
//!         let current = map.get(key.as_str()).map(|(_, n)| Version::new(*n));
//!         match (if_version, current) {
//!             (Some(want), have) if have != Some(want) => Err(Error::Conflict { key: key.to_string() }),
//!             _ => Ok(map.remove(key.as_str()).is_some()),
//!         }
//!     }
//!     async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
//!         let map = self.map.lock().expect("not poisoned");
//!         let mut keys: Vec<Key> = map.keys().filter(|k| k.starts_with(prefix))
//!             .map(|k| Key::new(k.as_str())).collect::<Result<_>>()?;
//!         keys.sort();
//!         Ok(keys)
//!     }
//! }
//! # tokio_test_block_on(async {
//! let store = TinyStore::default();
//! let a = Key::new("a").unwrap();
//! let v1 = store.put(&a, b"1".to_vec(), PutOptions::new(PutMode::Create)).await.unwrap();
//! let v2 = store.put(&a, b"2".to_vec(), PutOptions::new(PutMode::Update(v1))).await.unwrap();
//! assert!(v2 > v1);
//! assert!(matches!(store.put(&a, b"3".to_vec(), PutOptions::new(PutMode::Update(v1))).await,
//!                  Err(Error::Conflict { .. })));
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
#![cfg_attr(
    feature = "conformance",
    doc = "\n\n[`conformance`]: crate::conformance"
)]
#![cfg_attr(
    not(feature = "conformance"),
    doc = "\n\n[`conformance`]: crate#features"
)]

use std::{fmt, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Error, Key, Result};

pub use crate::key::MAX_KEY_BYTES;

/// The value size every general-purpose backend accepts (16 MiB). A backend
/// with a smaller service limit says so through [`KvStore::max_value_bytes`].
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// The version of a key's record, as returned by every write.
///
/// Opaque except for order: for one key, a later write has a greater version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(u64);

impl Version {
    /// Wraps a backend's version counter.
    pub const fn new(n: u64) -> Self {
        Version(n)
    }

    /// The backend's version counter.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// How a [`KvStore::put`] treats an existing record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutMode {
    /// Write whatever is there.
    #[default]
    Overwrite,
    /// Write only if no live record exists; otherwise [`Error::AlreadyExists`].
    Create,
    /// Write only if the live record is at exactly this version (compare-and-swap);
    /// otherwise, including when the key is absent or expired, [`Error::Conflict`].
    Update(Version),
}

impl PutMode {
    /// Applies this mode's precondition to the live record's version (`None`
    /// when the key is absent or expired). Backends that read and write under
    /// one lock or transaction call this between the two.
    pub fn check(self, key: &str, current: Option<Version>) -> Result<()> {
        match (self, current) {
            (PutMode::Overwrite, _) | (PutMode::Create, None) => Ok(()),
            (PutMode::Create, Some(_)) => Err(Error::AlreadyExists { key: key.into() }),
            (PutMode::Update(want), Some(have)) if want == have => Ok(()),
            (PutMode::Update(_), _) => Err(Error::Conflict {
                key: key.to_string(),
            }),
        }
    }
}

/// How a [`KvStore::put`] writes: its precondition and its time to live.
///
/// Options travel in one struct so a new one breaks no backend and no call
/// site: start from [`PutOptions::default`] (overwrite, no TTL) or
/// [`PutOptions::new`] and set what differs.
///
/// ```
/// use std::time::Duration;
/// use mcp_persist_core::{PutMode, PutOptions};
///
/// let options = PutOptions::new(PutMode::Create).with_ttl(Duration::from_secs(60));
/// assert_eq!(options.mode, PutMode::Create);
/// assert_eq!(options.ttl, Some(Duration::from_secs(60)));
/// assert_eq!(PutOptions::default().mode, PutMode::Overwrite);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PutOptions {
    /// The precondition (default: [`PutMode::Overwrite`]).
    pub mode: PutMode,
    /// Expire the record this long after the write; `None` (the default)
    /// keeps it until deleted, and clears any TTL the key had.
    pub ttl: Option<Duration>,
    /// Whether the backend may acknowledge the write before it reaches the
    /// disk (default `false`: it is on disk when `put` returns). For a
    /// write whose loss in a power cut is covered otherwise: a backend that
    /// commits in order (SQLite's write-ahead log) makes it durable with
    /// its next synced commit, as [`LogStore::append_unsynced`] does for
    /// logs. A backend that honours it must still keep an acknowledged
    /// write through a crash of the process; one that cannot tell syncs it
    /// like any other write.
    pub unsynced: bool,
}

impl PutOptions {
    /// A write with precondition `mode` and no TTL.
    pub const fn new(mode: PutMode) -> Self {
        PutOptions {
            mode,
            ttl: None,
            unsynced: false,
        }
    }

    /// The same write, which the backend may acknowledge before it
    /// reaches the disk (see [`unsynced`](Self#structfield.unsynced)).
    pub fn unsynced(mut self) -> Self {
        self.unsynced = true;
        self
    }

    /// The same write, expiring `ttl` after it (`None`: never).
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.ttl = ttl.into();
        self
    }
}

impl From<PutMode> for PutOptions {
    fn from(mode: PutMode) -> Self {
        PutOptions::new(mode)
    }
}

/// A record read from a [`KvStore`].
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEntry {
    /// The bytes written.
    pub value: Vec<u8>,
    /// The version the write returned.
    pub version: Version,
}

impl KvEntry {
    /// A record holding `value` at `version`.
    pub fn new(value: Vec<u8>, version: Version) -> Self {
        KvEntry { value, version }
    }
}

impl fmt::Debug for KvEntry {
    // Values may hold secrets: show their size only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvEntry")
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .field("version", &self.version)
            .finish()
    }
}

/// A key-value backend with compare-and-swap and TTL.
///
/// Contract (every point is checked by [`conformance`]):
///
/// * **Atomicity.** Each call is atomic per key: `put` with
///   [`PutMode::Update`] and `delete` with a version are linearizable
///   compare-and-swaps, across tasks and across processes sharing the backend.
///   N writers doing M read-modify-write increments end at exactly N x M.
/// * **Versions** strictly increase per key (see the [module docs](self)).
/// * **`Conflict` and `AlreadyExists`** are the only outcomes of a failed
///   precondition; a precondition never fails silently into an overwrite.
/// * **TTL**: an expired record is never returned and counts as absent.
/// * **Durability**: an `Ok` write is committed before the call returns.
/// * **Limits**: values up to [`max_value_bytes`](KvStore::max_value_bytes),
///   else [`Error::TooLarge`] ([`kit::check_value`](crate::kit::check_value)).
#[cfg_attr(
    feature = "conformance",
    doc = "\n\n[`conformance`]: crate::conformance"
)]
#[cfg_attr(
    not(feature = "conformance"),
    doc = "\n\n[`conformance`]: crate#features"
)]
#[async_trait]
pub trait KvStore: Backend {
    /// The largest value this backend accepts, in bytes.
    fn max_value_bytes(&self) -> usize {
        DEFAULT_MAX_VALUE_BYTES
    }

    /// Reads the live record under `key`, or `None` when absent or expired.
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>>;

    /// Writes `value` under `key` according to `options` (its
    /// [`mode`](PutOptions::mode), and a [`ttl`](PutOptions::ttl) after which
    /// it expires), and returns the new version. A write without a TTL
    /// clears any TTL the key had.
    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version>;

    /// Deletes the record under `key`. With `if_version`, deletes only if the
    /// live record is at that version, else [`Error::Conflict`] (also when the
    /// key is absent). Returns whether a live record was deleted.
    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool>;

    /// Every live key starting with `prefix` (empty: all keys), sorted
    /// bytewise. Meant for tools and sweeps, not hot paths.
    async fn list(&self, prefix: &str) -> Result<Vec<Key>>;
}

impl fmt::Debug for dyn KvStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvStore")
            .field("backend", &self.backend_name())
            .finish_non_exhaustive()
    }
}

/// What every backend has, whichever of [`KvStore`] and [`LogStore`] it
/// implements: a name, and a way to reclaim the space of expired state.
///
/// A type implementing both traits implements this once, so
/// `store.backend_name()` and `store.sweep_expired()` need no qualification.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A short, stable name for errors and traces (`"sqlite"`, `"redis"`, ...).
    fn backend_name(&self) -> &'static str;

    /// Reclaims the space of expired records and logs, whichever this
    /// backend holds, returning how many were removed. Correctness never
    /// depends on it: expired state is invisible anyway.
    async fn sweep_expired(&self) -> Result<u64> {
        Ok(0)
    }

    /// Looks for damage beyond single records (a broken log segment, an
    /// index that disagrees with its table) and describes each problem in
    /// a sentence that names where it is. Reads only; the default finds
    /// nothing. Operator tools (`mcp-persist check`) report what it says.
    async fn verify(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// One record of a log, as read back.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogRecord {
    /// Its sequence number in the log.
    pub seq: u64,
    /// The bytes appended.
    pub data: Vec<u8>,
}

impl LogRecord {
    /// The record `data` at sequence number `seq`.
    pub fn new(seq: u64, data: Vec<u8>) -> Self {
        LogRecord { seq, data }
    }
}

impl fmt::Debug for LogRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogRecord")
            .field("seq", &self.seq)
            .field("data", &format_args!("<{} bytes>", self.data.len()))
            .finish()
    }
}

/// An append-only log backend: many named logs of records.
///
/// Contract (checked by [`conformance`]):
///
/// * **Sequence numbers** are assigned by the backend, start above 0, and
///   strictly increase within a log in append order, also under concurrent
///   appends from many tasks or processes. They need not be contiguous.
/// * **Append** commits all of its records, in the order given, before it
///   returns; it returns their sequence numbers in the same order. The records
///   of one call are contiguous in the log.
/// * **`read_after(log, after, limit)`** returns the records with a sequence
///   number strictly greater than `after` (exclusive; `0` reads from the
///   start), in order, at most `limit` of them.
/// * **TTL** belongs to the log as a whole: an append with a TTL makes the
///   whole log expire once that TTL has passed since this append (a backend
///   may keep it up to a sixteenth of the TTL longer, never shorter). An
///   expired log reads as empty. After an expiry or a [`delete_log`](LogStore::delete_log),
///   sequence numbers may start again.
/// * Records are at most [`max_record_bytes`](LogStore::max_record_bytes).
#[cfg_attr(
    feature = "conformance",
    doc = "\n\n[`conformance`]: crate::conformance"
)]
#[cfg_attr(
    not(feature = "conformance"),
    doc = "\n\n[`conformance`]: crate#features"
)]
#[async_trait]
pub trait LogStore: Backend {
    /// The largest record this backend accepts, in bytes.
    fn max_record_bytes(&self) -> usize {
        DEFAULT_MAX_VALUE_BYTES
    }

    /// Appends `records` to `log` and returns their sequence numbers.
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>>;

    /// Appends like [`append`](LogStore::append), except that the backend
    /// may return before the records are synced to stable storage: they are
    /// committed (numbered, readable by every process, and kept through a
    /// crash of this process) but a power cut or an OS crash may take the
    /// last of them. Disk backends skip their `fsync` here; the default,
    /// for backends without that distinction, is a plain `append`.
    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append(log, records, ttl).await
    }

    /// Reads up to `limit` records with sequence numbers strictly after `after`.
    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>>;

    /// The number the next append to `log` would give its first record,
    /// found without writing; `None` (the default) when the backend cannot
    /// tell without an append.
    ///
    /// A caller that numbers a log's records itself before they are
    /// committed (a `Pipelined` event stream starting) asks this instead of
    /// appending at once. The answer may be out of date by the time it
    /// appends (another writer appended, the log expired and started
    /// again), so the caller compares it with the numbers the append
    /// returns. A backend answering it must give exactly what an append made
    /// at that moment would, including after a trim, an expiry or a
    /// quarantine.
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let _ = log;
        Ok(None)
    }

    /// Like [`read_after`](LogStore::read_after), but when nothing is there yet,
    /// waits up to `timeout` for another task or process to append, and returns
    /// an empty vector if nothing came. The default polls; backends that can be
    /// told about appends (Redis `XREAD BLOCK`, an in-process notifier) override it.
    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff =
            crate::retry::Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
        loop {
            let records = self.read_after(log, after, limit).await?;
            if !records.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(records);
            }
            backoff.sleep_before(deadline).await;
        }
    }

    /// Drops the records of `log` with sequence numbers below `before`; they
    /// are never returned again. Later appends still get greater numbers.
    /// Returns how many were dropped (a backend that reclaims whole segments
    /// may report them later, when the space is freed).
    async fn trim(&self, log: &Key, before: u64) -> Result<u64>;

    /// Deletes the whole log. Deleting an absent log is not an error.
    async fn delete_log(&self, log: &Key) -> Result<()>;

    /// Sets a damaged log aside (its bytes kept where an operator can look
    /// at them), so that the log can go on; numbering continues above every
    /// number it issued. Returns where it went, or `None` when there is no
    /// such log. Backends whose logs cannot be damaged apart from the rest
    /// of the store answer [`Error::Unsupported`] (the default).
    async fn quarantine_log(&self, log: &Key) -> Result<Option<String>> {
        let _ = log;
        Err(Error::Unsupported {
            operation: "setting a damaged log aside",
            backend: self.backend_name(),
        })
    }
}

impl fmt::Debug for dyn LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("backend", &self.backend_name())
            .finish_non_exhaustive()
    }
}
