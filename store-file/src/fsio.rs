//! The crash-safe file primitives everything else is built on.

use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mcp_persist_core::Error;
use tracing::warn;

/// The backend name in errors and traces.
pub(crate) const NAME: &str = "file";

/// Mode of every file the store creates.
pub(crate) const FILE_MODE: u32 = 0o600;
/// Mode of every directory the store creates.
pub(crate) const DIR_MODE: u32 = 0o700;

/// Prefix of temporary files; every listing skips names starting with a dot.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// A failed file-system call, with what was being done and to which path.
#[derive(Debug, thiserror::Error)]
#[error("could not {op} {}: {source}", path.display())]
pub(crate) struct IoError {
    op: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// Wraps an I/O error as the store's [`Error::Backend`].
pub(crate) fn io_error(op: &'static str, path: &Path, source: io::Error) -> Error {
    Error::backend(
        NAME,
        IoError {
            op,
            path: path.to_path_buf(),
            source,
        },
    )
}

/// A closure for `map_err` that wraps an I/O error.
pub(crate) fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| io_error(op, path, source)
}

/// Milliseconds since the Unix epoch (TTLs are wall-clock, so they hold
/// across processes and restarts).
pub(crate) fn unix_ms() -> u64 {
    mcp_persist_core::kit::now().as_unix_millis()
}

/// Microseconds since the Unix epoch.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The absolute expiry (Unix milliseconds) of a write made at `now_ms` with
/// `ttl`, rounded up so that a TTL never ends early. Never 0, which means
/// "no expiry" on disk.
pub(crate) fn expiry_ms(now_ms: u64, ttl: Duration) -> u64 {
    mcp_persist_core::kit::expires_at_from(
        mcp_persist_core::Timestamp::from_unix_millis(now_ms),
        ttl,
    )
    .as_unix_millis()
    .max(1)
}

/// Whether a record with this on-disk expiry (0: none) is still live.
pub(crate) fn is_live(expires_ms: u64, now_ms: u64) -> bool {
    expires_ms == 0 || expires_ms > now_ms
}

/// A name for a temporary file that no other writer uses: process id plus a
/// per-process counter.
fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{TEMP_PREFIX}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `parts` as the whole new content of `dir/name`, crash-safely: a
/// temporary file in the same directory (mode 0600) is written and fsynced,
/// renamed over the target, and the directory is fsynced. Whatever instant a
/// crash happens at, `dir/name` holds either its old content or all of the new.
pub(crate) fn write_atomic(dir: &Path, name: &str, parts: &[&[u8]]) -> Result<(), Error> {
    write_atomic_unsynced(dir, name, parts)?;
    sync_dir(dir)
}

/// [`write_atomic`] without the directory's fsync: the new content is on
/// disk before it is renamed into place, so whatever instant a crash or a
/// power cut happens at, `dir/name` holds its old content or all of the
/// new. The rename itself survives a crash of the process at once, and a
/// power cut once the directory is next fsynced (by any synced write into
/// it); until then a power cut may leave the old content.
pub(crate) fn write_atomic_unsynced(dir: &Path, name: &str, parts: &[&[u8]]) -> Result<(), Error> {
    let (tmp, mut file) = loop {
        let tmp = dir.join(temp_name());
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)
        {
            Ok(file) => break (tmp, file),
            // A file left by a crashed process that had our pid: take the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("create a temporary file", &tmp, e)),
        }
    };
    let written = (|| {
        for part in parts {
            file.write_all(part).map_err(io("write", &tmp))?;
        }
        file.sync_all().map_err(io("fsync", &tmp))?;
        drop(file);
        let target = dir.join(name);
        fs::rename(&tmp, &target).map_err(io("rename into place", &target))
    })();
    if let Err(e) = written {
        // Best effort: a leftover temporary file is harmless and swept later.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Fsyncs a directory, making renames, creations and removals in it durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    #[cfg(test)]
    tests::count_dir_sync(dir);
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}

/// Fsyncs the directory holding `path`, making its creation, rename or
/// removal durable. A one-part relative path (`"state"`) lives in the
/// current directory, whose name is `"."`, not the empty parent `Path`
/// gives.
pub(crate) fn sync_parent(path: &Path) -> Result<(), Error> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        Some(_) => sync_dir(Path::new(".")),
        // The root directory has no parent to record it.
        None => Ok(()),
    }
}

/// Creates `dir` with mode 0700 if it does not exist (fsyncing its parent so
/// the creation is durable), or warns if an existing one is open to others.
/// Returns whether it was created.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<bool, Error> {
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {
            sync_parent(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(dir).map_err(io("inspect", dir))?;
            if !meta.is_dir() {
                return Err(io_error(
                    "use as a directory",
                    dir,
                    io::Error::other("a file of that name is in the way"),
                ));
            }
            warn_if_open_to_others(dir, meta.permissions().mode());
            Ok(false)
        }
        Err(e) => Err(io_error("create directory", dir, e)),
    }
}

/// Warns when a mode grants any access to group or others: the store may
/// hold tokens, which must stay readable by their owner alone.
pub(crate) fn warn_if_open_to_others(path: &Path, mode: u32) -> bool {
    if mode & 0o077 != 0 {
        warn!(
            path = %path.display(),
            mode = format_args!("{:o}", mode & 0o7777),
            "store path is accessible by group or others; it may hold secrets, \
             consider chmod go-rwx"
        );
        return true;
    }
    false
}

/// An exclusive lock on a side file, held until dropped. Locks are taken
/// through a fresh file handle each time, so they exclude other threads of
/// this process as well as other processes; the kernel releases them when a
/// holder dies.
#[derive(Debug)]
pub(crate) struct LockGuard {
    _file: File,
}

/// Blocks until the exclusive lock on `path` is held.
pub(crate) fn lock_file(path: &Path) -> Result<LockGuard, Error> {
    let file = open_lock_file(path)?;
    file.lock().map_err(io("lock", path))?;
    Ok(LockGuard { _file: file })
}

fn open_lock_file(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
        .map_err(io("open lock file", path))
}

/// The lock files of one handle's stripes, each opened once and kept: an
/// append then costs two `flock`s and an `fstat` instead of `open`, `flock`
/// and `close`.
/// A stripe is held in this process (a flag and a condvar) before its file
/// is locked, since a `flock` taken twice through one open file is not
/// exclusive; the file lock excludes other handles and processes, and the
/// kernel releases it when a holder dies.
#[derive(Debug, Default)]
pub(crate) struct StripeLocks {
    open: std::sync::Mutex<std::collections::HashMap<PathBuf, Arc<Stripe>>>,
}

#[derive(Debug)]
pub(crate) struct Stripe {
    file: File,
    path: PathBuf,
    held: std::sync::Mutex<bool>,
    freed: std::sync::Condvar,
}

/// A stripe held, in this process and on its file, until dropped.
#[derive(Debug)]
pub(crate) struct StripeGuard(Arc<Stripe>);

impl StripeLocks {
    /// Blocks until the stripe whose lock file is `path` is held.
    ///
    /// A lock file removed while it was kept open (by hand: nothing here
    /// removes one) is opened again, created afresh, so that handles
    /// opened since, which lock the new file, still exclude this one.
    pub(crate) fn lock(&self, path: PathBuf) -> Result<StripeGuard, Error> {
        loop {
            let stripe = self.stripe(&path)?;
            {
                let mut held = stripe.held.lock().unwrap_or_else(|p| p.into_inner());
                while *held {
                    held = stripe.freed.wait(held).unwrap_or_else(|p| p.into_inner());
                }
                *held = true;
            }
            // From here on the guard releases the flag, whatever happens.
            let guard = StripeGuard(stripe);
            guard.0.file.lock().map_err(io("lock", &guard.0.path))?;
            let meta = guard.0.file.metadata().map_err(io("inspect", &path))?;
            if meta.nlink() > 0 {
                return Ok(guard);
            }
            warn!(path = %path.display(), "a lock file was removed while the store was open; creating it again");
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if open
                .get(&path)
                .is_some_and(|kept| Arc::ptr_eq(kept, &guard.0))
            {
                open.remove(&path);
            }
        }
    }

    /// The stripe whose lock file is `path` when it can be held at once:
    /// `None` while another task of this process or another process holds
    /// it. Never waits.
    pub(crate) fn try_lock(&self, path: PathBuf) -> Result<Option<StripeGuard>, Error> {
        let stripe = self.stripe(&path)?;
        {
            let mut held = stripe.held.lock().unwrap_or_else(|p| p.into_inner());
            if *held {
                return Ok(None);
            }
            *held = true;
        }
        // From here on the guard releases the flag, whatever happens.
        let guard = StripeGuard(stripe);
        match guard.0.file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Ok(None),
            Err(fs::TryLockError::Error(e)) => return Err(io_error("lock", &guard.0.path, e)),
        }
        let meta = guard.0.file.metadata().map_err(io("inspect", &path))?;
        // A lock file removed meanwhile: `lock` opens it again.
        Ok((meta.nlink() > 0).then_some(guard))
    }

    /// The stripe of the lock file `path`, opened if this handle has not
    /// yet.
    fn stripe(&self, path: &Path) -> Result<Arc<Stripe>, Error> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stripe) = open.get(path) {
            return Ok(Arc::clone(stripe));
        }
        let stripe = Arc::new(Stripe {
            file: open_lock_file(path)?,
            path: path.to_path_buf(),
            held: std::sync::Mutex::new(false),
            freed: std::sync::Condvar::new(),
        });
        open.insert(path.to_path_buf(), Arc::clone(&stripe));
        Ok(stripe)
    }
}

impl Drop for StripeGuard {
    fn drop(&mut self) {
        // Unlocking a file this process locked does not fail in practice;
        // if it did, other processes would wait on it, so say so.
        if let Err(e) = self.0.file.unlock() {
            warn!(path = %self.0.path.display(), error = %e, "could not unlock a lock stripe");
        }
        *self.0.held.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.0.freed.notify_one();
    }
}

/// Removes temporary files in `dir` older than `min_age` (left by writers
/// that crashed between creating and renaming them). Returns how many.
pub(crate) fn remove_stale_temps(dir: &Path, min_age: Duration) -> Result<u64, Error> {
    let mut removed = 0;
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_error("list", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("list", dir))?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let old_enough = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if old_enough && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// The lowercase hex SHA-256 of `data`: the file name of a key or log, so
/// that no key can name a path outside the store, whatever it contains.
pub(crate) fn hashed_name(domain: &str, data: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(domain.as_bytes());
    hasher.update([0u8]);
    hasher.update(data.as_bytes());
    let digest = hasher.finalize();
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from_digit(u32::from(byte >> 4), 16).expect("a nibble is a hex digit"));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).expect("a nibble is a hex digit"));
    }
    out
}

/// Whether `name` is one [`hashed_name`] could have produced.
pub(crate) fn is_hashed_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Reads a little-endian u32 at `at` (the caller checked the length).
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(
        bytes[at..at + 4]
            .try_into()
            .expect("a 4-byte slice converts"),
    )
}

/// Reads a little-endian u64 at `at` (the caller checked the length).
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(
        bytes[at..at + 8]
            .try_into()
            .expect("an 8-byte slice converts"),
    )
}

/// What [`read_now`] found.
pub(crate) enum ReadNow {
    /// The whole file, and its mode.
    Read(Vec<u8>, u32),
    /// No file at that path.
    Missing,
    /// Not without waiting (a lookup, an attribute or a page not in memory,
    /// a file larger than asked for, or calls this kernel lacks): read it on
    /// the blocking pool instead.
    WouldWait,
}

/// Reads the whole file at `path`, at most `max` bytes, on the calling
/// thread, when the kernel can serve every step from memory: each call used
/// fails rather than waits (`openat2` with `RESOLVE_CACHED`, `statx` with
/// `AT_STATX_DONT_SYNC`, `preadv2` with `RWF_NOWAIT`), so an async task can
/// make it without blocking its thread. Anything else is
/// [`ReadNow::WouldWait`], and errors are left to the blocking read to
/// report.
#[cfg(target_os = "linux")]
pub(crate) fn read_now(path: &Path, max: u64) -> ReadNow {
    use rustix::{
        fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags},
        io::{Errno, ReadWriteFlags},
    };
    /// Set once this kernel has refused one of the calls as unknown.
    static UNSUPPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let unsupported = |e: Errno| {
        if matches!(e, Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP) {
            UNSUPPORTED.store(true, Ordering::Relaxed);
        }
        ReadNow::WouldWait
    };
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return ReadNow::WouldWait;
    }
    let fd = match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::CACHED,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return ReadNow::Missing,
        Err(e) => return unsupported(e),
    };
    let wanted = StatxFlags::SIZE | StatxFlags::MODE;
    let stat = match rustix::fs::statx(
        &fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        wanted,
    ) {
        Ok(stat) if stat.stx_mask & wanted.bits() == wanted.bits() => stat,
        Ok(_) => return ReadNow::WouldWait,
        Err(e) => return unsupported(e),
    };
    if stat.stx_size > max {
        return ReadNow::WouldWait;
    }
    // One byte more than the length, to see that the file ends there.
    let len = stat.stx_size as usize;
    let mut bytes = vec![0u8; len + 1];
    match rustix::io::preadv2(
        &fd,
        &mut [std::io::IoSliceMut::new(&mut bytes)],
        0,
        ReadWriteFlags::NOWAIT,
    ) {
        Ok(n) if n == len => {
            bytes.truncate(len);
            ReadNow::Read(bytes, u32::from(stat.stx_mode))
        }
        // Part of it only (the rest is not in memory), or a file that
        // changed length meanwhile: the blocking read looks again.
        Ok(_) => ReadNow::WouldWait,
        Err(e) => unsupported(e),
    }
}

/// Whether `dir` is on a local disk filesystem (ext2/3/4, XFS, Btrfs, F2FS,
/// bcachefs, ZFS, tmpfs), where opening a file that the kernel has looked
/// up already never waits for a server: [`read_now`] is tried only there.
/// Network and FUSE filesystems do work in `open` itself, which no flag
/// forbids.
#[cfg(target_os = "linux")]
pub(crate) fn is_local_filesystem(dir: &Path) -> bool {
    const LOCAL: [i128; 7] = [
        0xEF53,      // ext2, ext3, ext4
        0x5846_5342, // XFS
        0x9123_683E, // Btrfs
        0xF2F5_2010, // F2FS
        0xCA45_1A4E, // bcachefs
        0x2FC1_2FC1, // ZFS
        0x0102_1994, // tmpfs
    ];
    rustix::fs::statfs(dir).is_ok_and(|fs| LOCAL.contains(&i128::from(fs.f_type)))
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn is_local_filesystem(_dir: &Path) -> bool {
    false
}

/// Elsewhere every read waits on the blocking pool.
#[cfg(not(target_os = "linux"))]
pub(crate) fn read_now(_path: &Path, _max: u64) -> ReadNow {
    ReadNow::WouldWait
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::HashMap, sync::Mutex};

    use super::*;

    /// Directory fsyncs made so far, per directory (tests run at once,
    /// each in a directory of its own).
    static DIR_SYNCS: Mutex<Option<HashMap<PathBuf, u64>>> = Mutex::new(None);

    pub(crate) fn count_dir_sync(dir: &Path) {
        let mut syncs = DIR_SYNCS.lock().unwrap_or_else(|p| p.into_inner());
        *syncs
            .get_or_insert_with(HashMap::new)
            .entry(dir.to_path_buf())
            .or_default() += 1;
    }

    /// How many times `dir` was fsynced so far.
    pub(crate) fn dir_syncs(dir: &Path) -> u64 {
        let syncs = DIR_SYNCS.lock().unwrap_or_else(|p| p.into_inner());
        syncs
            .as_ref()
            .and_then(|s| s.get(dir).copied())
            .unwrap_or(0)
    }

    /// Whatever the kernel can do without waiting, `read_now` either reads
    /// the whole file or declines; it never returns part of a file.
    #[test]
    fn read_now_reads_whole_files_or_declines() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("record");
        assert!(matches!(
            read_now(&path, 1024),
            ReadNow::Missing | ReadNow::WouldWait
        ));
        // Where the tests run, at least: on a local disk or in memory.
        #[cfg(target_os = "linux")]
        assert!(is_local_filesystem(dir.path()));
        let bytes: Vec<u8> = (0..=255).cycle().take(3000).collect();
        fs::write(&path, &bytes).expect("write");
        // Once read the ordinary way, it is in memory.
        assert_eq!(fs::read(&path).expect("read"), bytes);
        match read_now(&path, 4096) {
            ReadNow::Read(read, mode) => {
                assert_eq!(read, bytes);
                assert_eq!(
                    mode & 0o777,
                    fs::metadata(&path).expect("meta").permissions().mode() & 0o777
                );
            }
            ReadNow::WouldWait => {}
            ReadNow::Missing => panic!("the file is there"),
        }
        // Larger than asked for: declined, never cut.
        assert!(matches!(read_now(&path, 2999), ReadNow::WouldWait));
        fs::write(&path, b"").expect("write");
        assert!(
            matches!(
                read_now(&path, 10),
                ReadNow::Read(ref read, _) if read.is_empty()
            ) || matches!(read_now(&path, 10), ReadNow::WouldWait)
        );
    }
}
