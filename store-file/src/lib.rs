//! A crash-safe directory backend for mcp-persist: state lives in a folder
//! the user owns, and no server is needed.
//!
//! [`FileStore`] implements both backend traits of
//! [`mcp_persist_core`], [`KvStore`] and [`LogStore`], over one directory.
//! It is the zero-setup choice for a command-line agent or a desktop app.
//!
//! # Guarantees
//!
//! * **Acknowledged writes survive a crash.** A `put`, `delete` or
//!   `append` that returned `Ok` has been fsynced (file and directory) and
//!   survives a `kill -9` or a power cut. A put with
//!   [`PutOptions::unsynced`](mcp_persist_core::PutOptions::unsynced) skips
//!   the directory's fsync (its content is still fsynced before the
//!   rename): it survives a `kill -9`, and a power cut once the next synced
//!   put fsyncs the directory; a power cut before that leaves the record
//!   as it was. (An overwrite that moves a damaged record into quarantine
//!   is synced regardless: the damaged file has already left.)
//! * **Never corrupt after a crash.** A record is replaced by writing a
//!   temporary file in the same directory (mode 0600), fsyncing it, renaming
//!   it over the old one and fsyncing the directory: a crash at any instant
//!   leaves the old record or the new one. A log append interrupted by a
//!   crash leaves a torn tail (below), which is cut before anything is
//!   appended after it.
//! * **Processes share a store safely.** Compare-and-swap, deletes and
//!   appends take a lock on a side file (`File::lock`), striped by key, so two
//!   processes of one application never clobber each other (each handle
//!   keeps its stripes' files open, and its own threads take a stripe in
//!   turn before they lock its file): N writers doing
//!   M increments end at N x M. Versions strictly increase per key, across
//!   deletes, sweeps and restarts.
//! * **Damage is reported, not hidden.** A record file that is truncated or
//!   overwritten with garbage reads as [`Error::Corrupt`] naming its key;
//!   other keys still read. One written by a newer version of this crate is
//!   [`Error::NewerSchema`]. Overwriting or deleting a damaged record moves
//!   the damaged file into `quarantine/` rather than destroying it. A
//!   damaged log is never cut (below).
//! * **No panic on any stored bytes.** Every length, sequence number and
//!   offset read from disk is checked before arithmetic; impossible values
//!   are [`Error::Corrupt`].
//! * **Private.** The directory is created 0700 and every file 0600; an
//!   existing directory or file open to group or others gets a `tracing`
//!   warning.
//! * **Any key is safe.** Files are named by the SHA-256 of their key, so
//!   `../../etc/passwd`, very long keys or keys differing only in case all
//!   stay inside the directory, as distinct records.
//! * **The async runtime does not wait for the disk.** File operations
//!   run through [`tokio::task::spawn_blocking`]; a tokio runtime must be
//!   running. Two exceptions:
//!   - On a local filesystem (ext4, XFS, Btrfs, F2FS, bcachefs, ZFS,
//!     tmpfs), a `get` of a record of at most 64 KiB is first tried on the
//!     calling thread with Linux calls that fail instead of waiting for the
//!     disk (`openat2` with `RESOLVE_CACHED`, `statx` with
//!     `AT_STATX_DONT_SYNC`, `preadv2` with `RWF_NOWAIT`), and goes to the
//!     blocking pool when any of them would wait.
//!   - An append to a log whose last segment the handle keeps open, when
//!     unsynced or joining a group commit round, writes its frames there on
//!     the calling task (two `pwrite`s to the page cache, taking the log's
//!     lock only if it is free); anything else about it, and every sync,
//!     is done elsewhere. The kernel can still hold such a write when its
//!     dirty memory is over its limits;
//!     [`FileStoreOptions::appends_on_caller`] turns it off.
//! * **Group commit.** Synced appends to several logs waiting at the same
//!   time share one sync of the filesystem instead of one `fdatasync` each
//!   (see [`FileStoreOptions::group_commit()`]). The store's sync thread
//!   (`mcp-persist-file-sync`, one per opened store, gone with its last
//!   handle) makes the syncs; an append waits for its round without
//!   holding a blocking thread.
//!
//! # Torn tails and damage in logs
//!
//! A crash can leave exactly one thing in a log: an incomplete final frame at
//! the very end of its last segment file. That **torn tail** is one of:
//!
//! * a partial frame header;
//! * a frame whose declared length (no larger than the largest record) runs
//!   past the end of the file, or whose checksum fails with nothing after
//!   it, provided no intact frame starts anywhere after its first byte;
//! * zero bytes from the end of the last good frame to the end of the file
//!   (a power cut that grew the file but did not write its contents).
//!
//! Nothing in a torn tail was acknowledged (appends are synced before they
//! return). It is cut, with a `tracing` warning, the first time a handle that
//! can write the segment touches the log; a reader that cannot write the
//! file stops before it instead. [`FileStore::verify`] counts it in
//! [`VerifyReport::torn_tail_bytes`], not as a problem.
//!
//! Everything else is **damage**: a bad frame in any segment but the last, a
//! bad checksum followed by more bytes, a length larger than any record, a
//! frame with a good checksum but not numbered one above the frame before
//! it, a segment whose header does not match its name, a segment missing
//! before, between or after the others, acknowledged records missing from
//! the end (below). Damage is [`Error::Corrupt`] naming the log (and the
//! segment file and the byte), with a `tracing` warning, and appears in
//! [`FileStore::verify`]'s problems. Nothing is cut or deleted: while the
//! last segment is damaged, reads, appends and trims of that log fail with
//! `Corrupt`; damage in an earlier segment fails the reads that cross it,
//! while appends go on above the intact last segment.
//!
//! # No sequence number is handed out twice
//!
//! Whatever happens to a log's files (truncated, segments deleted, the
//! whole directory deleted, set aside), no number an append returned is
//! ever returned again for that log, until the log is deleted
//! ([`LogStore::delete_log`]) or swept after it expired. Two records make
//! sure of it, at no extra sync per append:
//!
//! * **A commit slot** at the start of each segment, rewritten by every
//!   append and synced with its frames: the highest number handed out, and
//!   the highest one known to be synced (as of the append before).
//! * **A numbering mark** per log, `mark/<sha256 of name>`, outside the
//!   log's directory: a number no record was numbered above. Appends
//!   reserve numbers in blocks of a segment's worth, so the mark is written
//!   (crash-safely) when a log starts and then once per block, not once per
//!   append. Starting a segment also seals the one before it (one more
//!   fdatasync per segment), so a missing last segment is noticed.
//!
//! What a loss of acknowledged records is reported as:
//!
//! * Records cut from the end of a log that had been synced before the last
//!   append (a truncation of acknowledged records, at a frame boundary or
//!   not), or a missing segment, or every segment or the directory of a log
//!   gone while its mark remains: damage, [`Error::Corrupt`] as above, until
//!   the operator acts.
//! * Records of the last append only, cut from the end (when that append
//!   wrote into an existing segment): these cannot be told from an append
//!   cut short by a power cut, so they are treated alike. The log goes on
//!   above them, their numbers are skipped (a gap readers see, never a
//!   number handed out again), and a warning names them.
//!
//! What the operator does about damage: keep a copy of the store directory,
//! then call [`FileStore::quarantine_log`]. It moves the log's segment files,
//! as they are, into `quarantine/log-<sha256 of name>.<micros>/` and lets the
//! log go on empty, numbered above its mark (so above every sequence number
//! it handed out). Records still wanted can be recovered from those files by
//! hand (the format is in `log/format.rs`); readers of the log find nothing before
//! the new numbers. [`LogStore::delete_log`] is the other way out; after it
//! (and after the sweep of an expired log) the mark is gone and numbering
//! starts again at 1, as the backend contract allows.
//!
//! Logs last written by version 0.1 have no mark and segments without a
//! slot; their first append by this version starts a segment of the new
//! format and writes the mark, and the guarantee holds from then on. A log
//! whose directory and mark are both deleted cannot be told from one that
//! never existed.
//!
//! A bit flipped inside the very last frame of a log, with nothing after it,
//! cannot be told from an append cut short and is cut as a torn tail: that
//! one record is lost (its number is not reused). A power cut that persisted
//! a later part of an unacknowledged batch but not an earlier part is
//! reported as damage.
//!
//! # Time to live
//!
//! TTLs are wall-clock (Unix time, so they hold across processes and
//! restarts) and honoured on every read. A wall-clock step therefore moves
//! them: a step forward makes records and logs read as expired early, a step
//! backward keeps them longer. Expired records and logs are reclaimed by
//! [`Backend::sweep_expired`] (correctness never depends on sweeping), which
//! deletes only what expired at least [`SWEEP_MARGIN`] (60 s, tunable with
//! [`FileStoreOptions::sweep_margin`]) ago: after a brief forward step that
//! is undone within the margin, records read as expired meanwhile come back.
//! An append to a log that reads as expired still starts it afresh (empty,
//! numbered on above its old records).
//!
//! Versions are the greater of the key's previous version plus one, the
//! store's version floor plus one, and the current time in microseconds: a
//! deleted key keeps its version in a deletion marker until a sweep raises
//! the floor above it, and even a key whose record was lost to damage gets a
//! version above any it had.
//!
//! # Layout
//!
//! ```text
//! <dir>/store.json              format version, version floor
//! <dir>/kv/<sha256 of key>      one record per key (header, key, value, checksums)
//! <dir>/log/<sha256 of name>/   one log: segment files <first seq>.seg, trim.json
//! <dir>/mark/<sha256 of name>    the numbering mark of each log
//! <dir>/lock/                   lock stripes
//! <dir>/trash/                  deleted logs on their way out
//! <dir>/quarantine/             damaged records, and logs set aside, kept as they were
//! ```
//!
//! The record and segment formats are described in the source
//! (`kv/format.rs`, `log/format.rs`, `log/mark.rs`). The store works on Unix; it relies on POSIX renames, directory
//! fsync and file modes.
//!
//! # Example
//!
//! ```
//! use mcp_persist_core::{Key, KvStore, LogStore, PutMode, PutOptions, Stores};
//! use mcp_persist_store_file::FileStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("state");
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let store = FileStore::open(&path).await?;
//!
//! // The backend primitives...
//! let v1 = store.put(&Key::new("greeting")?, b"hello".to_vec(), PutOptions::new(PutMode::Create)).await?;
//! store.put(&Key::new("greeting")?, b"hello again".to_vec(), PutOptions::new(PutMode::Update(v1))).await?;
//! let seqs = store.append(&Key::new("events")?, vec![b"one".to_vec(), b"two".to_vec()], None).await?;
//! assert_eq!(store.read_after(&Key::new("events")?, seqs[0], 10).await?[0].data, b"two");
//!
//! // ...or, as an application would, the typed stores on top of them.
//! let stores = Stores::new(store.clone());
//! let _client_state = stores.client_state();
//!
//! // A restarted process opens the same directory and finds everything.
//! drop(store);
//! let reopened = FileStore::open(&path).await?;
//! assert_eq!(reopened.get(&Key::new("greeting")?).await?.unwrap().value, b"hello again");
//! # Ok::<_, mcp_persist_core::Error>(()) })?;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! This crate has no cargo features.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(unix))]
compile_error!(
    "mcp-persist-store-file supports Unix only (POSIX renames, directory fsync, file modes)"
);

mod commit;
mod fsio;
mod kv;
mod log;
mod opener;
mod store;

use std::{path::PathBuf, sync::Arc, time::Duration};

use async_trait::async_trait;
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, LogRecord, LogStore, PutOptions, Result, Version,
    backend::DEFAULT_MAX_VALUE_BYTES, kit::check_value,
};

use crate::{
    fsio::{NAME, expiry_ms, unix_ms},
    kv::Kv,
    log::Logs,
    store::StoreDir,
};

/// Temporary files older than this are left by crashed writers and swept.
pub(crate) const STALE_TEMP_AGE: Duration = Duration::from_secs(600);

pub use commit::GroupCommitStats;
/// How long after its expiry a record or log must be before
/// [`Backend::sweep_expired`] deletes it, by default: 60 seconds.
///
/// TTLs are wall-clock. Reads treat a record as gone the moment the clock
/// passes its expiry, but a clock stepped forward by mistake (and stepped
/// back soon after) would make an immediate sweep destroy live records for
/// good; within the margin they stay on disk and come back with the clock.
/// See [`FileStoreOptions::sweep_margin`].
pub use mcp_persist_core::kit::SWEEP_MARGIN;
pub use opener::FileOpener;

/// Tuning of a [`FileStore`]. The defaults suit most applications.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FileStoreOptions {
    /// A log starts a new segment file once its current one has reached this
    /// size (default 4 MiB). Smaller segments are trimmed away sooner.
    pub segment_bytes: u64,
    /// The largest value and log record accepted (default 16 MiB, the
    /// contract's [`DEFAULT_MAX_VALUE_BYTES`]).
    pub max_value_bytes: usize,
    /// How long after expiring a record or log is left alone by
    /// [`Backend::sweep_expired`] (default [`SWEEP_MARGIN`]).
    pub sweep_margin: Duration,
    /// Group commit (default on): synced appends to several logs that wait
    /// at the same time share one sync of the filesystem (`syncfs`) instead
    /// of one `fdatasync`, and so one disk cache flush, each. That sync also
    /// writes back anything else dirty on the same filesystem: turn it off
    /// when the store shares a filesystem with heavy unrelated writes. Used
    /// only on Linux 5.8 and later (where `syncfs` reports write-back
    /// errors) and when the store's logs are on one filesystem.
    pub group_commit: bool,
    /// Appends written by the calling task (default on): an append to a
    /// log whose last segment this handle keeps open, and which takes the
    /// records in place, writes its frames and commit slot there with two
    /// `pwrite`s instead of on tokio's blocking pool, when it is unsynced or
    /// joins a group commit round others are waiting for, the log's lock is
    /// free and the log's numbering mark covers the new numbers. The hand-over
    /// to a blocking thread and back is most of what such an append costs:
    /// 64 logs appended at once went from 0.59–0.66 to 0.70–0.91 of 64 raw
    /// threads in six runs each (`cargo xtask bench file`). Those writes go to the page
    /// cache and the task waits for nothing else, but the kernel can hold a
    /// writer when its dirty memory is over its limits or the segment's
    /// last page has left the cache; turn this off to keep every file
    /// operation on the blocking pool.
    pub appends_on_caller: bool,
}

impl Default for FileStoreOptions {
    fn default() -> Self {
        FileStoreOptions {
            segment_bytes: 4 * 1024 * 1024,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            sweep_margin: SWEEP_MARGIN,
            group_commit: true,
            appends_on_caller: true,
        }
    }
}

impl FileStoreOptions {
    /// Sets [`segment_bytes`](Self::segment_bytes).
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes.max(1);
        self
    }

    /// Sets [`max_value_bytes`](Self::max_value_bytes), at most
    /// [`DEFAULT_MAX_VALUE_BYTES`] (the on-disk length fields allow more,
    /// the contract does not need it).
    pub fn max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes.min(DEFAULT_MAX_VALUE_BYTES);
        self
    }

    /// Sets [`group_commit`](Self::group_commit).
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// Sets [`appends_on_caller`](Self::appends_on_caller).
    pub fn appends_on_caller(mut self, on: bool) -> Self {
        self.appends_on_caller = on;
        self
    }

    /// Sets [`sweep_margin`](Self::sweep_margin). A smaller margin reclaims
    /// space sooner and protects less against a clock stepped forward.
    pub fn sweep_margin(mut self, margin: Duration) -> Self {
        self.sweep_margin = margin;
        self
    }
}

/// Everything a [`FileStore`] shares between its clones: the store
/// directory, and the key-value and log halves that work in it.
#[derive(Debug)]
struct Inner {
    store: Arc<StoreDir>,
    kv: Kv,
    logs: Logs,
}

impl Inner {
    /// Opens (creating if needed) the store in `root`. Blocking.
    fn open(root: PathBuf, options: FileStoreOptions) -> Result<Self> {
        let store = Arc::new(StoreDir::open(root, options)?);
        Ok(Inner {
            kv: Kv::new(Arc::clone(&store)),
            logs: Logs::open(Arc::clone(&store))?,
            store,
        })
    }
}

/// A [`KvStore`] and [`LogStore`] in one directory; see the
/// [crate docs](crate) for its guarantees.
///
/// Clones share one handle. Several handles, in one process or several, may
/// use the same directory at once.
#[derive(Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("dir", &self.inner.store.root)
            .finish_non_exhaustive()
    }
}

/// What [`FileStore::verify`] found: counts, and every damaged file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Key-value records that read back whole and are live.
    pub live_records: u64,
    /// Expired records and deletion markers waiting for a sweep.
    pub dead_records: u64,
    /// Logs with at least one segment.
    pub logs: u64,
    /// Log records that read back whole.
    pub log_records: u64,
    /// Bytes of torn tails not cut yet (an interrupted append whose log no
    /// handle has touched since). Not damage: the next touch cuts them.
    pub torn_tail_bytes: u64,
    /// Every file that does not check out, with the reason.
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// Whether every record and segment checked out.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl FileStore {
    /// Opens the store in `dir`, creating the directory (mode 0700, with any
    /// missing parents) and its layout if needed.
    ///
    /// Async because it touches the disk: the work runs on tokio's blocking
    /// pool. Fails with [`Error::NewerSchema`] if the directory was laid out
    /// by a newer version of this crate.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with(dir, FileStoreOptions::default()).await
    }

    /// Opens the store in `dir` with non-default options.
    pub async fn open_with(dir: impl Into<PathBuf>, options: FileStoreOptions) -> Result<Self> {
        let dir = dir.into();
        let inner = tokio::task::spawn_blocking(move || Inner::open(dir, options))
            .await
            .map_err(|e| Error::backend(NAME, e))??;
        tracing::debug!(dir = %inner.store.root.display(), "opened file store");
        Ok(FileStore {
            inner: Arc::new(inner),
        })
    }

    /// What group commit has done since this store was opened: syncs made
    /// (rounds) and synced appends they covered; appends per round is how
    /// many syncs it saved. `None` when group commit is off
    /// ([`FileStoreOptions::group_commit`]) or not trusted here.
    ///
    /// ```
    /// use mcp_persist_core::{Key, LogStore};
    /// use mcp_persist_store_file::FileStore;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let store = FileStore::open(dir.path()).await?;
    /// let log = Key::new("events")?;
    /// // The first append creates the log's segment, synced whole; the
    /// // next one is written in place and synced in a round.
    /// store.append(&log, vec![b"one".to_vec()], None).await?;
    /// store.append(&log, vec![b"two".to_vec()], None).await?;
    /// if let Some(stats) = store.group_commit_stats() {
    ///     assert_eq!((stats.rounds, stats.appends), (1, 1));
    /// }
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// # })
    /// # }
    /// ```
    pub fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        self.inner.logs.group_commit_stats()
    }

    /// The store's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.inner.store.root
    }

    /// Reads every record and log segment in full and reports what does not
    /// check out, changing nothing. For tools and health checks: it reads
    /// the whole store.
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.blocking(|inner| {
            let kv = inner.kv.verify()?;
            let logs = inner.logs.verify()?;
            let mut problems = kv.problems;
            problems.extend(logs.problems);
            Ok(VerifyReport {
                live_records: kv.live,
                dead_records: kv.dead,
                logs: logs.logs,
                log_records: logs.records,
                torn_tail_bytes: logs.torn_bytes,
                problems,
            })
        })
        .await
    }

    /// Sets a damaged log aside, the operator's way out of
    /// [`Error::Corrupt`] on a log: moves its segment files, untouched, into
    /// `quarantine/log-<hashed name>.<micros>/` and returns that directory
    /// (`None` if there is no such log: no segment, and no numbering mark
    /// saying it had some). The log then reads as empty and its next append
    /// is numbered above its mark, so above every sequence number it handed
    /// out, and no number is ever reused; a reader holding an old number
    /// simply finds nothing after it.
    ///
    /// Records in the moved files are no longer served: recover what is
    /// needed from them first, or accept their loss. Safe to run again if
    /// interrupted. Any log can be set aside, damaged or not.
    pub async fn quarantine_log(&self, log: &str) -> Result<Option<PathBuf>> {
        let log = Key::new(log)?;
        let log = log.as_str();
        let log = log.to_owned();
        self.blocking(move |inner| inner.logs.quarantine(&log))
            .await
    }

    /// Runs `f` on the blocking pool.
    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::backend(NAME, e))?
    }
}

#[async_trait]
impl Backend for FileStore {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    /// Removes records that expired at least
    /// [`sweep_margin`](FileStoreOptions::sweep_margin) ago and deletion
    /// markers, first raising the store's version floor above them so no
    /// version is ever reused. Also removes temporary files crashed writers
    /// left more than ten minutes ago. Deletes every log that expired at
    /// least the margin ago too, all its segments at once.
    async fn sweep_expired(&self) -> Result<u64> {
        let records = self.blocking(|inner| inner.kv.sweep()).await?;
        let logs = self.blocking(|inner| inner.logs.sweep()).await?;
        Ok(records + logs)
    }

    /// Every file that does not check out ([`FileStore::verify`]'s problems).
    async fn verify(&self) -> Result<Vec<String>> {
        Ok(FileStore::verify(self).await?.problems)
    }
}

#[async_trait]
impl KvStore for FileStore {
    fn max_value_bytes(&self) -> usize {
        self.inner.store.options.max_value_bytes
    }

    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        // A small record the kernel holds in memory is read at once; the
        // calls fail rather than wait, so the runtime thread never blocks.
        if let Some(found) = self.inner.kv.get_now(key) {
            return found;
        }
        let key = key.clone();
        self.blocking(move |inner| inner.kv.get(&key)).await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions {
            mode,
            ttl,
            unsynced,
            ..
        } = options;
        check_value(&value, self.inner.store.options.max_value_bytes)?;
        let key = key.clone();
        self.blocking(move |inner| {
            // The TTL runs from the moment the write is made.
            let expires = ttl.map_or(0, |ttl| expiry_ms(unix_ms(), ttl));
            inner.kv.put(&key, &value, mode, expires, !unsynced)
        })
        .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let key = key.clone();
        self.blocking(move |inner| inner.kv.delete(&key, if_version))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let prefix = prefix.to_owned();
        let names = self.blocking(move |inner| inner.kv.list(&prefix)).await?;
        // A record file whose name decodes to no valid key is not a record.
        Ok(names.into_iter().filter_map(|k| Key::new(k).ok()).collect())
    }
}

impl FileStore {
    /// Validates and appends `records` to `log`, fdatasyncing them when
    /// `sync` says so (see `Logs::append`).
    async fn append_with(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, self.inner.store.options.max_value_bytes)?;
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let appended = match self
            .inner
            .logs
            .try_append_in_place(log, &records, ttl, sync)?
        {
            Some(appended) => appended,
            None => {
                let log = log.clone();
                self.blocking(move |inner| inner.logs.append(&log, &records, ttl, sync))
                    .await?
            }
        };
        if let Some(unsynced) = appended.unsynced {
            self.inner.logs.sync_appended(unsynced).await?;
        }
        Ok(appended.seqs)
    }
}

#[async_trait]
impl LogStore for FileStore {
    fn max_record_bytes(&self) -> usize {
        self.inner.store.options.max_value_bytes
    }

    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, true).await
    }

    /// Writes the frames without `fdatasync`: they survive a crash of this
    /// process (the kernel holds them) and other processes read them at
    /// once, but a power cut may take the last ones. A torn tail left that
    /// way is cut on open like any other.
    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, false).await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        let log = log.clone();
        self.blocking(move |inner| inner.logs.read(&log, after, limit))
            .await
    }

    /// Reads, on the blocking pool, what the next append reads to number
    /// its first record: the log's last segment (its last frame and commit
    /// slot), and its trim file and numbering mark where that append reads
    /// them. Writes nothing: a torn tail is left for the append to cut.
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let log = log.clone();
        self.blocking(move |inner| inner.logs.next_seq(&log).map(Some))
            .await
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        let log = log.clone();
        self.blocking(move |inner| inner.logs.trim(&log, before))
            .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        let log = log.clone();
        self.blocking(move |inner| inner.logs.delete(&log)).await
    }

    /// [`FileStore::quarantine_log`]: the log's files move to `quarantine/`.
    async fn quarantine_log(&self, log: &Key) -> Result<Option<String>> {
        Ok(FileStore::quarantine_log(self, log)
            .await?
            .map(|path| path.display().to_string()))
    }
}

/// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use mcp_persist_core::{Key, KvStore, PutMode, PutOptions};

    use crate::{FileStore, fsio::tests::dir_syncs};

    /// An unsynced put (a durable server's kept answers) skips the fsync of
    /// the records' directory, the second of a put's two; the record is
    /// still replaced whole, read back at once and after the store is
    /// opened again, and the next synced put fsyncs the directory, making
    /// the rename durable.
    #[tokio::test]
    async fn an_unsynced_put_skips_the_directory_fsync_and_still_replaces_the_record() {
        let dir = tempfile::tempdir().expect("temp dir");
        let kv_dir = dir.path().join("kv");
        let store = FileStore::open(dir.path()).await.expect("open");
        let key = Key::new("calls/answer").expect("key");
        let v1 = store
            .put(&key, b"running".to_vec(), PutMode::Create.into())
            .await
            .expect("synced put");
        let synced = dir_syncs(&kv_dir);
        assert!(synced >= 1, "a synced put fsyncs the directory");
        let v2 = store
            .put(
                &key,
                b"answered".to_vec(),
                PutOptions::new(PutMode::Update(v1)).unsynced(),
            )
            .await
            .expect("unsynced put");
        assert!(v2 > v1);
        assert_eq!(dir_syncs(&kv_dir), synced, "no directory fsync");
        let read = store.get(&key).await.expect("get").expect("present");
        assert_eq!(
            (read.value.as_slice(), read.version),
            (&b"answered"[..], v2)
        );
        // The second run: a store opened again reads the same record.
        drop(store);
        let store = FileStore::open(dir.path()).await.expect("reopen");
        let read = store.get(&key).await.expect("get").expect("present");
        assert_eq!(
            (read.value.as_slice(), read.version),
            (&b"answered"[..], v2)
        );
        store
            .put(
                &Key::new("calls/other").expect("key"),
                b"x".to_vec(),
                PutMode::Overwrite.into(),
            )
            .await
            .expect("synced put");
        assert_eq!(dir_syncs(&kv_dir), synced + 1);
    }

    /// An unsynced overwrite of a damaged record is synced: the damaged
    /// file is already kept aside, and a power cut must not leave the key
    /// with no record at all.
    #[tokio::test]
    async fn an_unsynced_overwrite_of_a_damaged_record_is_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let kv_dir = dir.path().join("kv");
        let store = FileStore::open(dir.path()).await.expect("open");
        let key = Key::new("calls/damaged").expect("key");
        store
            .put(&key, b"first".to_vec(), PutMode::Create.into())
            .await
            .expect("put");
        let files: Vec<_> = std::fs::read_dir(&kv_dir)
            .expect("kv folder")
            .map(|e| e.expect("entry").path())
            .collect();
        let [record] = files.as_slice() else {
            panic!("one record file, found {files:?}");
        };
        std::fs::write(record, b"garbage").expect("damage the record");
        assert!(store.get(&key).await.is_err(), "the damage is reported");
        let before = dir_syncs(&kv_dir);
        store
            .put(
                &key,
                b"second".to_vec(),
                PutOptions::new(PutMode::Overwrite).unsynced(),
            )
            .await
            .expect("overwrite");
        // One fsync of the folder for the damaged file's move into
        // quarantine, one for the new record's rename.
        assert_eq!(dir_syncs(&kv_dir), before + 2, "the overwrite was synced");
        let read = store.get(&key).await.expect("get").expect("present");
        assert_eq!(read.value, b"second");
    }
}
