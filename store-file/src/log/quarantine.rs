//! Setting a damaged log aside, so that it goes on above every number it
//! handed out.

use std::{fs, path::PathBuf};

use mcp_persist_core::Error;
use tracing::warn;

use super::{
    Logs,
    format::{FRAME, TRIM_FILE, Trim, list_segments, read_trim, segment_name, write_trim},
    mark,
};
use crate::fsio::{ensure_private_dir, io, sync_dir, unix_micros};

impl Logs {
    /// Sets a log aside: moves its segment files into
    /// `quarantine/log-<hashed name>.<micros>/`, untouched, and lets the log
    /// go on empty, numbered above every sequence number it could have
    /// handed out (its mark, and what its files could hold). Returns where
    /// the files went, or `None` for a log with no segment and no mark
    /// saying it had any.
    ///
    /// Crash-safe and idempotent: the new numbering floor is written before
    /// any file moves, segments move lowest first (so a log interrupted
    /// halfway still ends with its own last segment), and the trim point is
    /// raised last.
    pub(crate) fn quarantine(&self, name: &str) -> Result<Option<PathBuf>, Error> {
        let (hashed, dir) = self.paths(name);
        let _guard = self.store.lock_stripe("log", &hashed)?;
        let segments = list_segments(&dir)?.unwrap_or_default();
        let (reserved, bad_mark) = match mark::read(&self.store.mark_dir, &hashed, name) {
            Ok(mark) => (mark.map(|m| m.reserved), false),
            Err(Error::Corrupt { .. }) => (None, true),
            Err(e) => return Err(e),
        };
        let trim = read_trim(&dir, name);
        let set_aside = matches!(&trim, Ok(t) if t.next_seq > 0);
        // A log whose segments are all gone, though its mark remains.
        let lost = segments.is_empty() && !set_aside && (reserved.is_some() || bad_mark);
        if segments.is_empty() && !lost {
            return Ok(None);
        }
        ensure_private_dir(&self.store.quarantine_dir)?;
        let target = self
            .store
            .quarantine_dir
            .join(format!("log-{hashed}.{}", unix_micros()));
        ensure_private_dir(&target)?;
        ensure_private_dir(&dir)?;
        let mut trim = match trim {
            Ok(trim) => trim,
            Err(Error::Corrupt { .. }) => {
                // Kept with the segments, never overwritten.
                let path = dir.join(TRIM_FILE);
                fs::rename(&path, target.join(TRIM_FILE))
                    .map_err(io("move into quarantine", &path))?;
                Trim::default()
            }
            Err(e) => return Err(e),
        };
        // The mark is above every number handed out. Without one (a log
        // last written by an older version, or a damaged mark), a segment
        // of `len` bytes holds at most `len / FRAME` frames, numbered from
        // its first: above every number still in its files.
        let mut next = trim.next_seq.max(trim.trim_before).max(1);
        if let Some(reserved) = reserved {
            next = next.max(reserved.saturating_add(1));
        }
        for &first in &segments {
            let path = dir.join(segment_name(first));
            let len = fs::metadata(&path).map_err(io("inspect", &path))?.len();
            next = next.max(first.saturating_add(len / FRAME as u64));
        }
        trim.next_seq = next;
        write_trim(&dir, &trim)?;
        for &first in &segments {
            let seg = segment_name(first);
            let path = dir.join(&seg);
            fs::rename(&path, target.join(&seg)).map_err(io("move into quarantine", &path))?;
        }
        if bad_mark {
            // Kept too; the next append writes a new one.
            let path = self.store.mark_dir.join(&hashed);
            fs::rename(&path, target.join("mark")).map_err(io("move into quarantine", &path))?;
            sync_dir(&self.store.mark_dir)?;
        }
        sync_dir(&target)?;
        sync_dir(&dir)?;
        trim.trim_before = next;
        write_trim(&dir, &trim)?;
        self.tails().remove(&hashed);
        self.open_segments().forget(&hashed);
        self.recovered().remove(&hashed);
        warn!(
            log = name,
            kept = %target.display(),
            next_seq = next,
            "set a log aside in quarantine; it goes on empty, numbered above its old records"
        );
        Ok(Some(target))
    }
}
