//! The key-value half of a store: one record file per key, replaced
//! atomically on every write (the format is in [`format`](mod@format)).

mod format;
mod sweep;
mod verify;

use std::{
    fs::{self, File},
    io::{self, Read},
    path::{Path, PathBuf},
    sync::Arc,
};

use mcp_persist_core::{Error, KvEntry, PutMode, Version};
use tracing::warn;

use self::format::{
    HEADER, HeaderRead, KIND_TOMBSTONE, KIND_VALUE, Stored, decode, encode, read_header,
};
use crate::{
    fsio::{
        ReadNow, hashed_name, io, io_error, is_hashed_name, is_live, is_local_filesystem, read_now,
        unix_micros, unix_ms, write_atomic, write_atomic_unsynced,
    },
    store::StoreDir,
};

/// The key-value records of a store, in `kv/`.
#[derive(Debug)]
pub(crate) struct Kv {
    store: Arc<StoreDir>,
    /// Whether gets may be tried at once ([`Kv::get_now`]): the records
    /// are on a local filesystem, whose opens never wait for a server.
    read_now: bool,
}

/// The largest record file [`Kv::get_now`] reads on the calling thread;
/// larger ones (and their size check) go to the blocking pool.
const READ_NOW_MAX: u64 = 64 * 1024;

/// The entry a stored record gives a reader: a live value, or nothing.
fn live_entry(stored: Stored) -> Option<KvEntry> {
    match stored {
        Stored::Value {
            version,
            expires_ms,
            value,
        } if is_live(expires_ms, unix_ms()) => Some(KvEntry::new(value, Version::new(version))),
        _ => None,
    }
}

/// What the file of a key holds, as far as a write is concerned.
enum Slot {
    /// No file.
    Absent,
    /// A live value at this version.
    Live(u64),
    /// An expired value or a tombstone: absent, but its version still counts.
    Dead(u64),
    /// A file that cannot be read: corrupt, or from a newer format.
    Damaged(Error),
}

impl Kv {
    pub(crate) fn new(store: Arc<StoreDir>) -> Self {
        let read_now = is_local_filesystem(&store.kv_dir);
        Kv { store, read_now }
    }

    fn path(&self, key: &str) -> (String, PathBuf) {
        let name = hashed_name("kv", key);
        let path = self.store.kv_dir.join(&name);
        (name, path)
    }

    /// The length of the largest record file this store writes.
    fn record_limit(&self) -> u64 {
        (HEADER + mcp_persist_core::backend::MAX_KEY_BYTES + self.store.options.max_value_bytes)
            as u64
    }

    /// Reads the file of `key`: `None` when there is none.
    fn read_record(&self, key: &str, path: &Path) -> Result<Option<Stored>, Error> {
        let mut file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("open", path, e)),
        };
        let meta = file.metadata().map_err(io("inspect", path))?;
        self.store.check_file_mode(path, &meta);
        if meta.len() > self.record_limit() {
            return Err(Error::corrupt(
                key,
                format!(
                    "record file is {} bytes, larger than any record",
                    meta.len()
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(io("read", path))?;
        decode(key, bytes).map(Some)
    }

    fn slot(&self, key: &str, path: &Path, now_ms: u64) -> Result<Slot, Error> {
        Ok(match self.read_record(key, path) {
            Ok(None) => Slot::Absent,
            Ok(Some(Stored::Tombstone { version })) => Slot::Dead(version),
            Ok(Some(Stored::Value {
                version,
                expires_ms,
                ..
            })) => {
                if is_live(expires_ms, now_ms) {
                    Slot::Live(version)
                } else {
                    Slot::Dead(version)
                }
            }
            Err(e @ (Error::Corrupt { .. } | Error::NewerSchema { .. })) => Slot::Damaged(e),
            Err(e) => return Err(e),
        })
    }

    /// The version of the next write of a key whose last known version is
    /// `prev`: above it, above every reclaimed version, and at least the
    /// current time in microseconds (so that even a key whose record was
    /// lost to damage gets a version above any it had before).
    fn next_version(&self, key: &str, prev: Option<u64>) -> Result<u64, Error> {
        // A known version already exceeds every reclaimed version of its key.
        let base = match prev {
            Some(v) => v,
            None => self.store.version_floor()?,
        };
        // Only a damaged or crafted file holds u64::MAX: going on from it
        // would hand the same version out twice.
        let next = base.checked_add(1).ok_or_else(|| {
            Error::corrupt(key, format!("stored version {base} leaves no next version"))
        })?;
        Ok(next.max(unix_micros()))
    }

    pub(crate) fn get(&self, key: &str) -> Result<Option<KvEntry>, Error> {
        let (_, path) = self.path(key);
        Ok(self.read_record(key, &path)?.and_then(live_entry))
    }

    /// [`get`](Kv::get) on the calling thread, when the record is small and
    /// the kernel can serve it from memory without waiting
    /// ([`read_now`]); `None` when it cannot, and the caller reads it on the
    /// blocking pool. The file is looked up by its path each time, as by
    /// `get`: a record another process renamed into place before this call
    /// is the one read.
    pub(crate) fn get_now(&self, key: &str) -> Option<Result<Option<KvEntry>, Error>> {
        if !self.read_now {
            return None;
        }
        let (_, path) = self.path(key);
        // A file over the limit is reported by the blocking read.
        match read_now(&path, READ_NOW_MAX.min(self.record_limit())) {
            ReadNow::Missing => Some(Ok(None)),
            ReadNow::WouldWait => None,
            ReadNow::Read(bytes, mode) => {
                self.store.check_mode(&path, mode);
                Some(decode(key, bytes).map(live_entry))
            }
        }
    }

    pub(crate) fn put(
        &self,
        key: &str,
        value: &[u8],
        mode: PutMode,
        expires_ms: u64,
        synced: bool,
    ) -> Result<Version, Error> {
        let (name, path) = self.path(key);
        let _guard = self.store.lock_stripe("kv", &name)?;
        let mut synced = synced;
        let prev = match self.slot(key, &path, unix_ms())? {
            Slot::Absent => {
                mode.check(key, None)?;
                None
            }
            Slot::Live(v) => {
                mode.check(key, Some(Version::new(v)))?;
                Some(v)
            }
            Slot::Dead(v) => {
                mode.check(key, None)?;
                Some(v)
            }
            Slot::Damaged(e @ Error::NewerSchema { .. }) => return Err(e),
            // A precondition cannot be judged against an unreadable record.
            Slot::Damaged(e) if mode != PutMode::Overwrite => return Err(e),
            Slot::Damaged(e) => {
                let kept = self.store.quarantine(&path, &name)?;
                warn!(key, error = %e, kept = %kept.display(),
                    "overwriting a corrupt record; the damaged file was kept aside");
                // The damaged file has left the folder for good: an unsynced
                // replacement lost to a power cut would leave no record at
                // all, not the old one.
                synced = true;
                None
            }
        };
        let version = self.next_version(key, prev)?;
        let bytes = encode(key, KIND_VALUE, version, expires_ms, value);
        if synced {
            write_atomic(&self.store.kv_dir, &name, &[&bytes])?;
        } else {
            // `PutOptions::unsynced`: the record's content is on disk before
            // its rename, so a power cut leaves the old record or the new
            // one; the rename is durable with the next synced write here.
            write_atomic_unsynced(&self.store.kv_dir, &name, &[&bytes])?;
        }
        Ok(Version::new(version))
    }

    pub(crate) fn delete(&self, key: &str, if_version: Option<Version>) -> Result<bool, Error> {
        let (name, path) = self.path(key);
        let _guard = self.store.lock_stripe("kv", &name)?;
        match self.slot(key, &path, unix_ms())? {
            Slot::Absent | Slot::Dead(_) => match if_version {
                Some(_) => Err(Error::Conflict { key: key.into() }),
                None => Ok(false),
            },
            Slot::Live(v) => {
                if let Some(want) = if_version {
                    PutMode::Update(want).check(key, Some(Version::new(v)))?;
                }
                // A tombstone keeps the version, so the key's next write gets a
                // greater one; the sweep reclaims it after raising the floor.
                let version = self.next_version(key, Some(v))?;
                let bytes = encode(key, KIND_TOMBSTONE, version, 0, &[]);
                write_atomic(&self.store.kv_dir, &name, &[&bytes])?;
                Ok(true)
            }
            Slot::Damaged(e) => {
                if if_version.is_some() {
                    return Err(e);
                }
                // Deleting an unreadable record is the way out of it: the
                // damaged file is kept aside, never destroyed.
                let kept = self.store.quarantine(&path, &name)?;
                warn!(key, error = %e, kept = %kept.display(),
                    "deleted an unreadable record; the damaged file was kept aside");
                Ok(true)
            }
        }
    }

    /// Every record file name in the key-value directory.
    fn record_names(&self) -> Result<Vec<String>, Error> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.store.kv_dir).map_err(io("list", &self.store.kv_dir))? {
            let entry = entry.map_err(io("list", &self.store.kv_dir))?;
            if let Some(name) = entry.file_name().to_str()
                && is_hashed_name(name)
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let now = unix_ms();
        let mut keys = Vec::new();
        for name in self.record_names()? {
            let path = self.store.kv_dir.join(&name);
            match read_header(&path).map_err(io("read", &path))? {
                HeaderRead::Gone => {}
                HeaderRead::Good(header, key) => {
                    if header.kind == KIND_VALUE
                        && is_live(header.expires_ms, now)
                        && key.starts_with(prefix)
                        && hashed_name("kv", &key) == name
                    {
                        keys.push(key);
                    }
                }
                HeaderRead::Bad(reason) => {
                    warn!(file = %path.display(), reason, "skipping an unreadable record file in list");
                }
            }
        }
        keys.sort();
        Ok(keys)
    }
}
