//! Reclaiming expired logs, and what crashed writers left behind.

use std::fs::{self, File};

use mcp_persist_core::Error;
use tracing::{debug, warn};

use super::{
    Cut, Logs,
    format::{TRIM_FILE, Trim, list_segments, read_segment_header, segment_name},
    mark,
};
use crate::{
    STALE_TEMP_AGE,
    fsio::{hashed_name, io, is_hashed_name, is_live, remove_stale_temps, unix_ms},
};

impl Logs {
    /// Deletes every log expired for longer than the sweep margin (all its
    /// segments at once, and its mark), and what crashed writers left
    /// behind.
    pub(crate) fn sweep(&self) -> Result<u64, Error> {
        let cutoff = self.store.sweep_cutoff_ms(unix_ms());
        let mut removed = 0;
        let entries = fs::read_dir(&self.store.log_dir).map_err(io("list", &self.store.log_dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.store.log_dir))?;
            let Some(hashed) = entry
                .file_name()
                .to_str()
                .filter(|n| is_hashed_name(n))
                .map(str::to_owned)
            else {
                continue;
            };
            let dir = entry.path();
            let _guard = self.store.lock_stripe("log", &hashed)?;
            let Some(segments) = list_segments(&dir)? else {
                continue;
            };
            let Some(&last) = segments.last() else {
                // A log whose only segment was never written (or whose
                // expired records were discarded): nothing to keep, unless
                // it was set aside for damage and must go on numbering above
                // its old records, or its mark says it had segments (damage,
                // kept for the operator).
                let keeps_numbering = fs::read(dir.join(TRIM_FILE)).is_ok_and(|bytes| {
                    !serde_json::from_slice::<Trim>(&bytes).is_ok_and(|trim| trim.next_seq == 0)
                });
                if keeps_numbering {
                    continue;
                }
                if mark::exists(&self.store.mark_dir, &hashed)? {
                    warn!(path = %dir.display(), "skipping a log whose segments are missing in the sweep");
                    continue;
                }
                self.remove_log_dir(&hashed, &dir)?;
                continue;
            };
            let path = dir.join(segment_name(last));
            let file = File::open(&path).map_err(io("open", &path))?;
            let name = match read_segment_header(&file, None) {
                Ok(header) => header.name,
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "skipping an unreadable log in the sweep");
                    continue;
                }
            };
            if hashed_name("log", &name) != hashed {
                warn!(path = %path.display(), "skipping a log segment that belongs elsewhere");
                continue;
            }
            let tail = match self.scan_tail(&hashed, &dir, &name, Cut::Must) {
                Ok(tail) => tail,
                Err(e) => {
                    warn!(log = name, error = %e, "skipping an unreadable log in the sweep");
                    continue;
                }
            };
            if let Some((tail, _)) = tail
                && !is_live(tail.expires_ms, cutoff)
                && self.remove_log_dir(&hashed, &dir)?
            {
                debug!(log = name, "removed an expired log");
                removed += 1;
            } else {
                remove_stale_temps(&dir, STALE_TEMP_AGE)?;
            }
        }
        // Segments kept open whose files another process deleted.
        self.open_segments().forget_deleted();
        remove_stale_temps(&self.store.mark_dir, STALE_TEMP_AGE)?;
        self.store.empty_trash();
        Ok(removed)
    }
}
