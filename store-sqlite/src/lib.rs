//! The SQLite backend of mcp-persist: [`SqliteStore`], one database file that
//! holds key-value records and logs for every process on one machine.
//!
//! It implements both backend traits of `mcp-persist-core`, [`KvStore`] and
//! [`LogStore`], so a [`Stores`](mcp_persist_core::Stores) bundle can keep a
//! client's sessions, credentials and a server's SSE event log in it.
//!
//! # Guarantees
//!
//! * **Durable before `Ok`.** Every write commits before its call returns.
//!   With the default [`Durability::Full`] the commit includes an fsync of the
//!   write-ahead log, so it survives a `kill -9` of the writer and a power cut.
//! * **Group commit.** Writes go to one thread that owns the write
//!   connection. Writes that arrive while a commit is in progress (64 SSE
//!   streams appending at once, say) share the next transaction and its one
//!   fsync; each caller still gets its answer only after that commit. A write
//!   whose precondition fails (a stale compare-and-swap) is rolled back alone.
//! * **Safe across processes.** The database runs in WAL mode (verified after
//!   setting it), writers take the lock with `BEGIN IMMEDIATE` and wait for it
//!   up to an explicit busy timeout, so several processes can share one file:
//!   compare-and-swap is linearizable across all of them. Any number of
//!   processes may open the same store, new or existing, at the same
//!   instant: opening never holds one lock while waiting for another (the
//!   schema is read in a read-only transaction, WAL is switched on outside
//!   any transaction, the schema is set up under `BEGIN IMMEDIATE`, and
//!   an up-to-date database takes no write lock at all). A lock still not
//!   granted after the busy timeout is an [`Error::Timeout`] saying which
//!   lock it was and what holds it.
//! * **Never blocks the async runtime.** Writes run on the writer thread,
//!   reads on a small pool of read-only connections through
//!   [`tokio::task::spawn_blocking`]; a tokio runtime must be running.
//! * **TTL** is a column: an expired record or log is never returned, and a
//!   periodic sweep (and [`Backend::sweep_expired`]) reclaims the space of
//!   what expired more than [`SWEEP_MARGIN`] ago. Expiry instants are
//!   wall-clock milliseconds, so every process sharing the file agrees on
//!   them; see [Clocks and TTL](#clocks-and-ttl).
//! * **Damage is reported, never returned.** Every value and log record is
//!   stored with a CRC-32 of its key or log name, its version or sequence
//!   number and its bytes, checked on every read: a row changed outside the
//!   store (a flipped bit on disk, a stray tool) is an [`Error::Corrupt`]
//!   naming the key or log, and a `tracing` warning (which never holds the
//!   bytes), while every other key keeps working. Stored numbers (sequence
//!   numbers, versions, the version clock) are checked before any arithmetic,
//!   and a value over the size limit planted in the file is refused before it
//!   is loaded. A failed or damaged operation fails alone: the writer thread
//!   goes on serving the others.
//! * **Versioned schema.** The schema version lives in the database's
//!   `user_version` ([`SCHEMA_VERSION`]) and older databases are migrated
//!   forward on open. A database written by a newer version of this crate is
//!   refused with [`Error::NewerSchema`]
//!   and left untouched; a SQLite file of another application is refused with
//!   [`Error::InvalidInput`], a file that
//!   is not a database with [`Error::Corrupt`].
//! * **Private file.** A database file this crate creates is mode 0600 (its
//!   folder 0700 if it creates that too); SQLite gives the `-wal` and `-shm`
//!   files beside it the same mode. An existing database, `-wal` or `-shm`
//!   file that other users may read is changed to 0600 on open, with a
//!   `tracing` warning (an error-level event if it belongs to another user
//!   and cannot be changed).
//!
//! # Clocks and TTL
//!
//! A TTL on this backend is a wall-clock instant: a write at wall-clock time
//! `t` with TTL `d` stores the expiry `t + d`, and every process compares it
//! with its own wall clock (`SystemTime`), because processes share no other
//! clock. So a step of the wall clock (a manual change, an NTP step, a VM
//! resumed from a snapshot) moves every TTL with it:
//!
//! * a clock stepped **forward** by `s` makes records and logs expire up to
//!   `s` early: reads stop returning them at once;
//! * a clock stepped **backward** by `s` keeps them up to `s` longer.
//!
//! A read only hides an expired row; deleting it is the sweep's job, and the
//! sweep leaves alone whatever expired less than [`SWEEP_MARGIN`] (60 s) ago.
//! A forward step shorter than that, corrected before the margin runs out,
//! so loses nothing: the rows are hidden during the step and back after it.
//! A longer step, or an append to a log that looks expired (which starts
//! the log afresh), can make the loss final. Leases and compare-and-swap do
//! not depend on clocks (versions fence them), so no clock step gives two
//! holders the same lease. Keep the clock slewed rather than stepped (the
//! default of `chrony` and `systemd-timesyncd` for small offsets) where TTLs
//! matter.
//!
//! # SQLite build
//!
//! The crate links SQLite through `rusqlite` 0.41 with its `bundled` feature:
//! `libsqlite3-sys` 0.39 compiles SQLite 3.54 from source into the binary,
//! whatever the system has. Only one `libsqlite3-sys` version can be linked
//! into a binary, so any other crate of your program that uses SQLite
//! (`rusqlite`, `sqlx`, `diesel`) must resolve to the same `libsqlite3-sys`
//! line.
//!
//! # Example
//!
//! ```
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! use mcp_persist_core::{Key, KvStore, LogStore, PutMode, PutOptions};
//! use mcp_persist_store_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("state.db")).await?;
//!
//! let greeting = Key::new("greeting")?;
//! let v1 = store.put(&greeting, b"hello".to_vec(), PutOptions::new(PutMode::Create)).await?;
//! // Compare-and-swap: only succeeds while the record is still at v1.
//! store.put(&greeting, b"hi".to_vec(), PutOptions::new(PutMode::Update(v1))).await?;
//!
//! let events = Key::new("events")?;
//! let seqs = store.append(&events, vec![b"one".to_vec(), b"two".to_vec()], None).await?;
//! let later = store.read_after(&events, seqs[0], 10).await?;
//! assert_eq!(later[0].data, b"two");
//!
//! // A restarted process sees everything that was acknowledged.
//! drop(store);
//! let store = SqliteStore::open(dir.path().join("state.db")).await?;
//! assert_eq!(store.get(&greeting).await?.unwrap().value, b"hi");
//! # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! # Features
//!
//! This crate has no optional features.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, LogRecord, LogStore, PutOptions, Result, Version,
    backend::DEFAULT_MAX_VALUE_BYTES, kit::check_value, retry::Backoff,
};
use rusqlite::Connection;
use tokio::sync::Notify;

mod checksum;
mod error;
mod opener;
mod ops;
mod schema;
mod writer;

use error::{Ctx, NAME};
pub use opener::SqliteOpener;
pub use schema::SCHEMA_VERSION;
use writer::{Commit, Writer};

/// How long after its expiry a record or log may be deleted by a sweep
/// ([`Backend::sweep_expired`] or the periodic one): the kit's margin.
///
/// An expired row is never returned, whatever its age; the margin only
/// delays reclaiming its space, so that a wall clock stepped forward for
/// less than this cannot make a sweep delete live data for good (see
/// [Clocks and TTL](crate#clocks-and-ttl)).
pub use mcp_persist_core::kit::SWEEP_MARGIN;

/// How hard a commit works to survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// `PRAGMA synchronous = FULL`: every commit fsyncs the write-ahead log.
    /// An acknowledged write survives a crash of the process, of the operating
    /// system and a power cut. The default; group commit keeps it cheap.
    /// A write that waives its sync ([`PutOptions::unsynced()`],
    /// [`LogStore::append_unsynced`]) commits as under `Normal` when its
    /// whole group does, and is on disk with the next synced commit (the
    /// log is written in order). An unsynced put that would commit alone
    /// first waits up to a millisecond for another write to share its
    /// commit with (its caller normally sends one right behind it).
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: commits reach the operating system but
    /// are fsynced only at checkpoints. An acknowledged write survives a
    /// `kill -9` of the process; the last ones may be lost in a power cut.
    Normal,
}

/// Settings of a [`SqliteStore`]; [`SqliteOptions::default`] suits most uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// How long a write waits for another process's write lock before it
    /// fails with [`Error::Timeout`].
    /// Default: 5 seconds.
    pub busy_timeout: Duration,
    /// What a commit guarantees. Default: [`Durability::Full`].
    pub durability: Durability,
    /// How often the writer thread, when idle, deletes records and logs
    /// that expired more than [`SWEEP_MARGIN`] ago; `None` leaves that to
    /// explicit `sweep_expired` calls. Expired
    /// data is never returned either way. Default: every 10 minutes.
    pub sweep_interval: Option<Duration>,
    /// How many read connections stay open between reads. Default: 4.
    pub max_idle_readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(5),
            durability: Durability::Full,
            sweep_interval: Some(Duration::from_secs(600)),
            max_idle_readers: 4,
        }
    }
}

impl SqliteOptions {
    /// Sets [`busy_timeout`](Self::busy_timeout).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets [`durability`](Self::durability).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets [`sweep_interval`](Self::sweep_interval).
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// Sets [`max_idle_readers`](Self::max_idle_readers).
    pub fn max_idle_readers(mut self, n: usize) -> Self {
        self.max_idle_readers = n;
        self
    }
}

/// Counters of the writer thread, from [`SqliteStore::write_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WriteStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Operations committed in them; `operations / transactions` is the
    /// average group size.
    pub operations: u64,
    /// Operations waiting for the writer right now.
    pub queued: usize,
    /// Operations in the transaction the writer is running right now.
    pub running: usize,
}

/// A [`KvStore`] and [`LogStore`] in one SQLite database. Clones share the
/// same connections; the database closes when the last clone is dropped
/// (writes already queued still commit).
///
/// See the [crate docs](crate) for what it guarantees.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database as shown in errors and traces: its path, or `:memory:`.
    label: Arc<str>,
    options: SqliteOptions,
    writer: Writer,
    /// Read-only connections of a file database; an in-memory database has
    /// one connection, so its reads go through the writer too.
    readers: Option<Readers>,
    appended: Arc<Notify>,
}

struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("db", &self.inner.label)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the database at `path` with default [`SqliteOptions`], creating
    /// it (mode 0600) and its folder (mode 0700) if missing, and migrating an
    /// older schema forward.
    ///
    /// Fails with [`Error::NewerSchema`]
    /// for a database of a newer version of this crate,
    /// [`Error::InvalidInput`] for one of
    /// another application and [`Error::Corrupt`]
    /// for a file that is not a database; none of them is modified.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens the database at `path` with the given options (see [`open`](Self::open)).
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let label: Arc<str> = path.display().to_string().into();
        Self::start(Some(path), label, options).await
    }

    /// A private database in memory, for tests and throwaway state: gone when
    /// the last clone is dropped, never shared with another store or process.
    pub async fn open_in_memory() -> Result<Self> {
        Self::start(None, ":memory:".into(), SqliteOptions::default()).await
    }

    async fn start(path: Option<PathBuf>, label: Arc<str>, options: SqliteOptions) -> Result<Self> {
        let appended = Arc::new(Notify::new());
        let (writer, ready) = Writer::spawn(
            path.clone(),
            options.clone(),
            Arc::clone(&label),
            Arc::clone(&appended),
        )?;
        ready.await.map_err(|_| error::writer_gone())??;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                label,
                options,
                writer,
                readers: path.map(|path| Readers {
                    path,
                    idle: Mutex::new(Vec::new()),
                }),
                appended,
            }),
        })
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.inner.readers.as_ref().map(|r| r.path.as_path())
    }

    /// Closes this handle. When it is the last one (no clone left), waits
    /// until every queued write has committed and the database is closed,
    /// its write-ahead log checkpointed; otherwise the others keep it open.
    ///
    /// Dropping the last handle closes the database too, in the background.
    pub async fn close(self) -> Result<()> {
        let Ok(inner) = Arc::try_unwrap(self.inner) else {
            return Ok(());
        };
        let Inner {
            writer, readers, ..
        } = inner;
        tokio::task::spawn_blocking(move || {
            drop(readers);
            writer.shutdown_blocking()
        })
        .await
        .map_err(|e| Error::backend(NAME, e))?
    }

    /// What the writer thread has done so far: how many transactions, how
    /// many operations in them, how many waiting.
    pub fn write_stats(&self) -> WriteStats {
        self.inner.writer.stats()
    }

    /// Runs a read on a pooled read connection, off the async runtime.
    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Ctx<'_>) -> Result<T> + Send + 'static,
    {
        if self.inner.readers.is_none() {
            return self.inner.writer.run(0, false, work).await;
        }
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.read_blocking(work))
            .await
            .map_err(|e| Error::backend(NAME, e))?
    }

    /// Validates and appends `records` to `log` through the writer thread;
    /// `synced: false` lets its group commit skip the fsync.
    async fn append_with(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
        synced: bool,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, DEFAULT_MAX_VALUE_BYTES)?;
        }
        let log = log.clone();
        self.inner
            .writer
            .run_with(
                log.len() + payload(&records),
                true,
                if synced {
                    Commit::Synced
                } else {
                    Commit::Unsynced
                },
                move |conn, ctx| ops::log_append(conn, ctx, &log, &records, ttl),
            )
            .await
    }

    /// Runs a write on the writer thread and waits for its commit.
    async fn write<T, F>(&self, weight: usize, appends: bool, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Ctx<'_>) -> Result<T> + Send + 'static,
    {
        self.inner.writer.run(weight, appends, work).await
    }
}

impl Inner {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            db: &self.label,
            busy_timeout: self.options.busy_timeout,
        }
    }

    fn read_blocking<T>(&self, work: impl FnOnce(&Connection, Ctx<'_>) -> Result<T>) -> Result<T> {
        let readers = self
            .readers
            .as_ref()
            .expect("only file databases read through the pool");
        let ctx = self.ctx();
        let pooled = readers
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => schema::open_reader(&readers.path, &self.options, ctx)?,
        };
        let result = work(&conn, ctx);
        let mut idle = readers.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.options.max_idle_readers {
            idle.push(conn);
        }
        result
    }
}

fn payload(records: &[Vec<u8>]) -> usize {
    records.iter().map(Vec::len).sum()
}

#[async_trait]
impl Backend for SqliteStore {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    /// Deletes the records and logs that expired more than [`SWEEP_MARGIN`]
    /// ago, and returns how many.
    async fn sweep_expired(&self) -> Result<u64> {
        let records = self.write(0, false, ops::kv_sweep).await?;
        let logs = self.write(0, false, ops::log_sweep).await?;
        Ok(records + logs)
    }
}

#[async_trait]
impl KvStore for SqliteStore {
    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, key))]
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let key = key.clone();
        self.read(move |conn, ctx| ops::kv_get(conn, ctx, &key))
            .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, key, mode = ?options.mode))]
    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions {
            mode,
            ttl,
            unsynced,
            ..
        } = options;
        check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
        let key = key.clone();
        // An unsynced put commits without its fsync when its whole batch
        // waives it; the next synced commit makes it durable (the log is
        // written in order). Under `Durability::Normal` nothing is synced.
        // It waits a moment for a write to share its commit with: its
        // caller normally sends the synced write that covers it next.
        let commit = if unsynced {
            Commit::Shared
        } else {
            Commit::Synced
        };
        self.inner
            .writer
            .run_with(key.len() + value.len(), false, commit, move |conn, ctx| {
                ops::kv_put(conn, ctx, &key, &value, mode, ttl)
            })
            .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, key))]
    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let key = key.clone();
        self.write(key.len(), false, move |conn, ctx| {
            ops::kv_delete(conn, ctx, &key, if_version)
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, prefix))]
    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let prefix = prefix.to_owned();
        self.read(move |conn, ctx| ops::kv_list(conn, ctx, &prefix))
            .await
    }
}

#[async_trait]
impl LogStore for SqliteStore {
    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, log, records = records.len()))]
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, true).await
    }

    /// Commits without an fsync of the write-ahead log (as
    /// [`Durability::Normal`] does for every commit), unless another write
    /// of the same group commit needs one: the records survive a crash of
    /// the process, not necessarily a power cut.
    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, false).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, log, after, limit))]
    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        let log = log.clone();
        self.read(move |conn, ctx| ops::log_read_after(conn, ctx, &log, after, limit))
            .await
    }

    /// Read on a pooled read connection: no write, no commit.
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let log = log.clone();
        self.read(move |conn, ctx| ops::log_next_seq(conn, ctx, &log).map(Some))
            .await
    }

    /// Returns as soon as a record after `after` is committed: at once for an
    /// append through this store (or a clone of it), within about 100 ms for
    /// an append by another process or another `SqliteStore` on the same file.
    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
        let mut pause = backoff.next_pause();
        loop {
            // Register before reading, so an append between the read and the
            // wait still wakes us.
            let mut notified = std::pin::pin!(self.inner.appended.notified());
            notified.as_mut().enable();
            let records = self.read_after(log, after, limit).await?;
            let now = tokio::time::Instant::now();
            if !records.is_empty() || now >= deadline {
                return Ok(records);
            }
            // Another process's appends cannot notify us: poll as well.
            if tokio::time::timeout(pause.min(deadline - now), notified)
                .await
                .is_err()
            {
                pause = backoff.next_pause();
            }
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, log, before))]
    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        let log = log.clone();
        self.write(log.len(), false, move |conn, ctx| {
            ops::log_trim(conn, ctx, &log, before)
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(backend = NAME, log))]
    async fn delete_log(&self, log: &Key) -> Result<()> {
        let log = log.clone();
        self.write(log.len(), false, move |conn, ctx| {
            ops::log_delete(conn, ctx, &log)
        })
        .await
    }
}

/// The README's example compiles (it is `no_run`: it writes to the disk).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
