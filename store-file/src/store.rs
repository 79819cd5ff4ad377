//! The store directory both halves of a store share: its layout, opening
//! it, the store-wide metadata file, locks, the trash and the quarantine.

use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use mcp_persist_core::Error;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::{
    FileStoreOptions,
    fsio::{
        DIR_MODE, LockGuard, StripeGuard, StripeLocks, ensure_private_dir, io, io_error, lock_file,
        warn_if_open_to_others, write_atomic,
    },
};

/// The on-disk layout version this build writes and the newest it reads.
pub(crate) const STORE_FORMAT: u32 = 1;

/// The store-wide metadata file, in the store directory.
pub(crate) const META_FILE: &str = "store.json";

/// Stripes of the lock files: keys (and logs) hash onto one of these, so
/// writers of different keys rarely wait for each other.
const STRIPES: u8 = 32;

/// The store-wide metadata.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    /// Layout version ([`STORE_FORMAT`]).
    format: u32,
    /// Every version ever handed out by a record that has since been
    /// reclaimed (expired or deleted, then swept) is at most this; new
    /// records start above it, so versions never repeat for a key.
    version_floor: u64,
}

/// The store directory, shared by the key-value half
/// ([`Kv`](crate::kv::Kv)) and the log half ([`Logs`](crate::log::Logs)).
#[derive(Debug)]
pub(crate) struct StoreDir {
    pub(crate) root: PathBuf,
    pub(crate) kv_dir: PathBuf,
    pub(crate) log_dir: PathBuf,
    /// The numbering mark of each log ([`crate::log::mark`]).
    pub(crate) mark_dir: PathBuf,
    lock_dir: PathBuf,
    pub(crate) trash_dir: PathBuf,
    pub(crate) quarantine_dir: PathBuf,
    pub(crate) options: FileStoreOptions,
    /// Whether a record file open to others has been warned about already.
    warned_mode: AtomicBool,
    /// The lock stripes' files, kept open.
    stripes: StripeLocks,
}

impl StoreDir {
    /// Opens (creating if needed) the store directory `root` and its layout,
    /// and empties the trash. Blocking.
    pub(crate) fn open(root: PathBuf, options: FileStoreOptions) -> Result<Self, Error> {
        // The directory and any missing parents are created 0700.
        match fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => {
                warn_if_open_to_others(&root, meta.permissions().mode());
            }
            Ok(_) => {
                return Err(io_error(
                    "open store directory",
                    &root,
                    io::Error::other("not a directory"),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(&root)
                    .map_err(io("create store directory", &root))?;
                crate::fsio::sync_parent(&root)?;
                debug!(path = %root.display(), "created store directory");
            }
            Err(e) => return Err(io_error("open store directory", &root, e)),
        }
        let store = StoreDir {
            kv_dir: root.join("kv"),
            log_dir: root.join("log"),
            mark_dir: root.join("mark"),
            lock_dir: root.join("lock"),
            trash_dir: root.join("trash"),
            quarantine_dir: root.join("quarantine"),
            root,
            options,
            warned_mode: AtomicBool::new(false),
            stripes: StripeLocks::default(),
        };
        for dir in [
            &store.kv_dir,
            &store.log_dir,
            &store.mark_dir,
            &store.lock_dir,
            &store.trash_dir,
        ] {
            ensure_private_dir(dir)?;
        }
        store.init_meta()?;
        store.empty_trash();
        Ok(store)
    }

    /// Creates the metadata file if it is missing, and checks its format.
    fn init_meta(&self) -> Result<(), Error> {
        let _guard = self.lock_meta()?;
        match self.read_meta()? {
            Some(meta) if meta.format > STORE_FORMAT => Err(Error::NewerSchema {
                key: META_FILE.to_owned(),
                found: meta.format,
                supported: STORE_FORMAT,
            }),
            Some(_) => Ok(()),
            None => self.write_meta(&Meta {
                format: STORE_FORMAT,
                version_floor: 0,
            }),
        }
    }

    fn read_meta(&self) -> Result<Option<Meta>, Error> {
        let path = self.root.join(META_FILE);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", &path, e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Corrupt {
                key: META_FILE.to_owned(),
                reason: "the store metadata does not parse".into(),
                source: Some(Box::new(e)),
            })
    }

    fn write_meta(&self, meta: &Meta) -> Result<(), Error> {
        let bytes = serde_json::to_vec(meta).map_err(|e| Error::backend(crate::fsio::NAME, e))?;
        write_atomic(&self.root, META_FILE, &[&bytes])
    }

    /// The version floor: every reclaimed record's version is at most this.
    pub(crate) fn version_floor(&self) -> Result<u64, Error> {
        Ok(self.read_meta()?.map_or(0, |m| m.version_floor))
    }

    /// Raises the version floor to at least `at_least`, durably.
    pub(crate) fn raise_version_floor(&self, at_least: u64) -> Result<(), Error> {
        let _guard = self.lock_meta()?;
        let mut meta = self.read_meta()?.unwrap_or(Meta {
            format: STORE_FORMAT,
            version_floor: 0,
        });
        if meta.version_floor < at_least {
            meta.version_floor = at_least;
            self.write_meta(&meta)?;
        }
        Ok(())
    }

    fn lock_meta(&self) -> Result<LockGuard, Error> {
        lock_file(&self.lock_dir.join("meta"))
    }

    /// Takes the lock stripe of a hashed key or log name.
    pub(crate) fn lock_stripe(&self, space: &str, hashed: &str) -> Result<StripeGuard, Error> {
        self.stripes.lock(self.stripe_path(space, hashed))
    }

    /// [`lock_stripe`](Self::lock_stripe) when the stripe is free now;
    /// `None` when it is held.
    pub(crate) fn try_lock_stripe(
        &self,
        space: &str,
        hashed: &str,
    ) -> Result<Option<StripeGuard>, Error> {
        self.stripes.try_lock(self.stripe_path(space, hashed))
    }

    fn stripe_path(&self, space: &str, hashed: &str) -> PathBuf {
        let stripe = u8::from_str_radix(hashed.get(..2).unwrap_or("00"), 16).unwrap_or(0) % STRIPES;
        self.lock_dir.join(format!("{space}-{stripe:02}"))
    }

    /// Warns, once per handle, about a record file open to group or others.
    pub(crate) fn check_file_mode(&self, path: &Path, meta: &fs::Metadata) {
        self.check_mode(path, meta.permissions().mode());
    }

    /// [`check_file_mode`](Self::check_file_mode) from the mode alone.
    pub(crate) fn check_mode(&self, path: &Path, mode: u32) {
        if mode & 0o077 != 0 && !self.warned_mode.swap(true, Ordering::Relaxed) {
            warn_if_open_to_others(path, mode);
        }
    }

    /// Removes what deletes left in the trash directory (a crash between the
    /// rename into the trash and the removal). Best effort.
    pub(crate) fn empty_trash(&self) {
        let Ok(entries) = fs::read_dir(&self.trash_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if let Err(e) = removed {
                warn!(path = %path.display(), error = %e, "could not empty the trash");
            }
        }
    }

    /// Moves a damaged record file into the quarantine directory, where it is
    /// kept for inspection instead of being overwritten.
    pub(crate) fn quarantine(&self, path: &Path, name: &str) -> Result<PathBuf, Error> {
        ensure_private_dir(&self.quarantine_dir)?;
        let target = self
            .quarantine_dir
            .join(format!("{name}.{}", crate::fsio::unix_micros()));
        fs::rename(path, &target).map_err(io("move into quarantine", path))?;
        crate::fsio::sync_dir(&self.quarantine_dir)?;
        crate::fsio::sync_parent(path)?;
        Ok(target)
    }

    /// Records and logs that expired at or before this instant (Unix ms)
    /// are old enough for a sweep to delete.
    pub(crate) fn sweep_cutoff_ms(&self, now_ms: u64) -> u64 {
        let margin = u64::try_from(self.options.sweep_margin.as_millis()).unwrap_or(u64::MAX);
        now_ms.saturating_sub(margin)
    }
}
