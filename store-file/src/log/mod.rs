//! The log half of a store: a directory per log of append-only segment
//! files (the format is in [`format`](mod@format)), and a numbering mark
//! per log ([`mark`]).
//!
//! The work is split by concern: [`scan`] finds where a log ends and cuts
//! a torn tail, [`open`] keeps the last segment of a log open between
//! appends, [`append`] and [`ops`] are the operations, [`quarantine`]
//! sets a damaged log aside, [`sweep`] reclaims expired logs, [`verify`]
//! checks every file.
//!
//! Only a torn tail, what an interrupted append leaves, is ever cut
//! ([`scan`]); records of the last append missing from the end are skipped
//! ([`append`]). Anything else is damage, never cut: a bad frame in any
//! segment but the last, a bad checksum followed by more bytes, a length
//! larger than any record, a frame with a good checksum but the wrong
//! sequence number, a segment whose header does not match its name or does
//! not follow the one before it, a missing segment (first, middle or last),
//! a log whose segments or directory are gone while its numbering mark
//! remains. It is [`Error::Corrupt`] naming the log (and the segment and the
//! byte where there is one), with a `tracing` warning; appends and trims
//! refuse while the last segment is damaged, so no number is handed out
//! twice.

mod append;
mod format;
mod frames;
pub(crate) mod mark;
mod open;
mod ops;
mod quarantine;
mod scan;
mod sweep;
mod tail;
mod verify;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use mcp_persist_core::Error;
use tracing::warn;

use self::{format::FRAME, format::segment_name, tail::Tail};
use crate::{commit::GroupCommit, fsio::hashed_name, store::StoreDir};

/// The logs of a store, in `log/` and `mark/`, with what this handle
/// remembers of them.
#[derive(Debug)]
pub(crate) struct Logs {
    store: Arc<StoreDir>,
    /// Last known end of each log this handle has touched, by hashed name.
    tails: Mutex<HashMap<String, Tail>>,
    /// Logs whose torn tail this handle has already checked for and cut.
    recovered: Mutex<HashSet<String>>,
    /// The last segment of the logs this handle appends to, kept open.
    open: Mutex<open::OpenSegments>,
    /// Group commit of synced appends, when on and trustworthy here.
    group: Option<GroupCommit>,
}

impl Logs {
    /// The logs of the store in `store` (whose layout exists).
    pub(crate) fn open(store: Arc<StoreDir>) -> Result<Self, Error> {
        let group = GroupCommit::new(store.options.group_commit, &store.root, &store.log_dir)?;
        Ok(Logs {
            store,
            tails: Mutex::new(HashMap::new()),
            recovered: Mutex::new(HashSet::new()),
            open: Mutex::new(open::OpenSegments::default()),
            group,
        })
    }

    /// What group commit has done, when it is on.
    pub(crate) fn group_commit_stats(&self) -> Option<crate::GroupCommitStats> {
        self.group.as_ref().map(GroupCommit::stats)
    }

    fn tails(&self) -> MutexGuard<'_, HashMap<String, Tail>> {
        // The map is a cache validated on every use: a poisoned one is still sound.
        self.tails.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recovered(&self) -> MutexGuard<'_, HashSet<String>> {
        self.recovered.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn paths(&self, name: &str) -> (String, PathBuf) {
        let hashed = hashed_name("log", name);
        let dir = self.store.log_dir.join(&hashed);
        (hashed, dir)
    }

    /// How many numbers an append reserves at once when it raises a log's
    /// mark: as many as a segment's worth of the smallest frames.
    fn reserve_block(&self) -> u64 {
        (self.store.options.segment_bytes / FRAME as u64).clamp(mark::MIN_BLOCK, mark::MAX_BLOCK)
    }
}

/// The error for damage found in a log (anything but a torn tail). Nothing
/// is cut or removed: the bytes stay where they are. The warning is given
/// where the error leaves the store ([`report`]).
fn damage(name: &str, segment: u64, at: u64, reason: &str) -> Error {
    Error::corrupt(
        name,
        format!(
            "log segment {} at byte {at}: {reason}; nothing was cut \
             (FileStore::quarantine_log sets the log aside)",
            segment_name(segment)
        ),
    )
}

/// The error for a log whose segments (or whole directory) are gone while
/// its numbering mark says it handed out numbers.
fn lost(name: &str, dir: &Path, reserved: u64) -> Error {
    let what = if dir.exists() {
        "every segment of the log is missing"
    } else {
        "the log's directory is missing"
    };
    Error::corrupt(
        name,
        format!(
            "{what}, though its numbering mark says it handed out numbers (at most \
             {reserved}); nothing was changed (FileStore::quarantine_log lets it go on \
             above them)"
        ),
    )
}

/// Warns about damage an operation on log `name` ends with.
fn report<T>(name: &str, result: Result<T, Error>) -> Result<T, Error> {
    if let Err(e @ Error::Corrupt { .. }) = &result {
        warn!(
            log = name,
            error = %e,
            "found damage in a log (not a torn tail); its files are kept as they are"
        );
    }
    result
}

/// What [`Logs::scan_tail`] does with a torn tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Leaves it (readers stop before it). The log's lock is not held.
    No,
    /// Cuts it if the segment can be written (a read).
    IfWritable,
    /// Cuts it, or fails (an append or a trim).
    Must,
}

/// A log with no segment: never written (or deleted), or set aside and
/// numbered on from `next`.
enum Empty {
    Fresh,
    SetAside { next: u64 },
}
