//! The lock a `copy` holds on its destination, so that copies into one
//! store take turns: two copies appending the same log at once would number
//! one's records after the other's, duplicating them.
//!
//! | destination | lock | held after a crash |
//! |---|---|---|
//! | a store in a folder or file on this machine (`file:`, `sqlite:`) | `flock` on it | no: the system drops it |
//! | a store on a server (`redis://`, and any other with logs) | a [`ToolLock`] record in the store, renewed while held | until its TTL ([`LEASE_TTL`]) runs out |
//!
//! A copy that finds the lock taken says so and waits; Ctrl-C stops the
//! wait. Key-value records need no lock (they are written create-only or by
//! compare-and-swap), so a destination without logs (Secrets Manager) takes
//! none.

use std::{
    fs::File,
    mem::ManuallyDrop,
    path::Path,
    time::Duration,
};

use crate::{
    fail::{Code, Failure},
    interrupt,
    output::{Level, diag},
    target::Backend,
};
use mcp_persist::stores::ToolLock;

/// How long the lock record outlives a copy that stopped renewing it (a
/// copy killed with SIGKILL, a machine gone); it is renewed every fifth.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(10);
/// The name of the lock a copy takes.
const COPY_LOCK: &str = "copy";
/// How often a waiting copy tries again.
const RETRY: Duration = Duration::from_millis(100);

/// A held destination lock; [`DestLock::release`] gives it back.
pub(crate) struct DestLock {
    held: Held,
}

enum Held {
    /// A file-store folder.
    Folder(File),
    /// A SQLite database file. Closing any descriptor of the database
    /// drops every POSIX lock this process holds on it, SQLite's own
    /// included; this one therefore stays open until the process ends,
    /// when SQLite's go too.
    #[expect(dead_code, reason = "never read: holding the descriptor is the lock")]
    Database(ManuallyDrop<File>),
    /// A lock record in the store, renewed by a task until released.
    Lease(ToolLock),
}

fn interrupted_while_waiting(label: &str) -> Failure {
    Failure::new(
        Code::Interrupted,
        format!(
            "interrupted while waiting for another copy into {label} to finish; this run copied nothing"
        ),
    )
    .with_hint("run the same command again once the other copy is done")
}

fn waiting(label: &str, holder: Option<&str>) {
    let by = holder.map(|h| format!(" ({h})")).unwrap_or_default();
    diag(
        Level::Note,
        &format!(
            "another copy into {label} is running{by}; waiting for it to finish (Ctrl-C stops waiting)"
        ),
    );
}

/// Takes an exclusive `flock` on `path`, waiting while another process
/// holds it. With `keep_open` (a SQLite database this process has open),
/// the descriptor is never closed, even on failure: closing it would drop
/// SQLite's own POSIX locks on the file.
async fn flock(path: &Path, label: &str, keep_open: bool) -> Result<File, Failure> {
    let file = File::open(path).map_err(|e| {
        Failure::new(
            Code::Other,
            format!("cannot open {} to lock it: {e}", path.display()),
        )
    })?;
    let failed = |file: File, failure: Failure| {
        if keep_open {
            std::mem::forget(file);
        }
        Err(failure)
    };
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                let failure =
                    Failure::new(Code::Other, format!("cannot lock {}: {e}", path.display()));
                return failed(file, failure);
            }
        }
        if !told {
            waiting(label, None);
            told = true;
        }
        if interrupt::requested() {
            return failed(file, interrupted_while_waiting(label));
        }
        tokio::time::sleep(RETRY).await;
    }
}

impl DestLock {
    /// Locks the destination `backend` (opened already, so its file or
    /// folder exists); `None` for a backend without logs.
    pub(crate) async fn acquire(backend: &Backend) -> Result<Option<DestLock>, Failure> {
        let label = &backend.label;
        if backend.log.is_none() {
            return Ok(None);
        }
        let held = match backend.location.local_path() {
            Some(path) if path.is_dir() => Held::Folder(flock(&path, label, false).await?),
            Some(path) => Held::Database(ManuallyDrop::new(flock(&path, label, true).await?)),
            None => Held::Lease(lease(backend).await?),
        };
        Ok(Some(DestLock { held }))
    }

    /// Whether the lock was lost (a lease not renewed in time): the copy
    /// must stop before it appends anything more.
    pub(crate) fn lost(&self) -> bool {
        match &self.held {
            Held::Lease(lock) => lock.lost(),
            _ => false,
        }
    }

    /// Gives the lock back. Call it after the destination store is closed.
    pub(crate) async fn release(self) {
        match self.held {
            Held::Folder(file) => drop(file),
            // Given back when the process ends (see `Held::Database`).
            Held::Database(_) => {}
            Held::Lease(lock) => {
                if let Err(e) = lock.release().await {
                    diag(
                        Level::Warning,
                        &format!(
                            "could not give back the copy lock: {e}; it expires within {} s",
                            LEASE_TTL.as_secs()
                        ),
                    );
                }
            }
        }
    }
}

/// Who holds the lock, for the operator who waits: this host and process.
fn holder_token() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".into());
    format!("mcp-persist copy, process {} on {host}", std::process::id())
}

/// Takes the lock record of `backend`, waiting while another copy holds it.
async fn lease(backend: &Backend) -> Result<ToolLock, Failure> {
    let label = &backend.label;
    let holder = holder_token();
    let mut told = false;
    loop {
        match ToolLock::try_acquire(backend.kv.clone(), COPY_LOCK, &holder, LEASE_TTL).await {
            Ok(Some(lock)) => return Ok(lock),
            Ok(None) => {}
            Err(e) => return Err(backend.fail(e)),
        }
        if !told {
            let by = ToolLock::holder(&*backend.kv, COPY_LOCK).await.ok().flatten();
            waiting(label, by.as_deref());
            told = true;
        }
        if interrupt::requested() {
            return Err(interrupted_while_waiting(label));
        }
        tokio::time::sleep(RETRY).await;
    }
}
