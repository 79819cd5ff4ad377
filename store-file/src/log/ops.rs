//! Reading, trimming and deleting logs.

use std::{
    fs::{self, File},
    io,
    path::Path,
};

use mcp_persist_core::{Error, LogRecord};
use tracing::warn;

use super::{
    Cut, Logs, damage,
    format::{read_trim, segment_name, write_trim},
    frames::{Frames, Step},
    mark, report,
    scan::checked_header,
    tail::Tail,
};
use crate::fsio::{io, io_error, is_live, sync_dir, unix_micros, unix_ms};

impl Logs {
    /// Walks the frames of a log from the segment holding `start` to the
    /// end `tail` saw, checking that each segment follows the one before
    /// (and, from the first segment, that none before it is missing).
    /// Calls `each` with every frame (its data when its number is at least
    /// `want_from`) until it returns `false`.
    fn walk_frames(
        &self,
        name: &str,
        dir: &Path,
        segments: &[u64],
        tail: &Tail,
        (start, want_from): (u64, u64),
        mut each: impl FnMut(u64, Option<Vec<u8>>) -> bool,
    ) -> Result<(), Error> {
        let from = segments.partition_point(|&f| f <= start).saturating_sub(1);
        // The last number of the segment before, once known.
        let mut before: Option<u64> = None;
        for (i, &first) in segments.iter().enumerate().skip(from) {
            if first > tail.seg_first {
                break;
            }
            let path = dir.join(segment_name(first));
            let file = match File::open(&path) {
                Ok(file) => file,
                // Trimmed away by another process meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    before = None;
                    continue;
                }
                Err(e) => return Err(io_error("open", &path, e)),
            };
            let header = checked_header(&file, name, first)?;
            match before {
                Some(want) if want != header.follows => {
                    return Err(damage(
                        name,
                        first,
                        0,
                        &format!(
                            "the segment follows {} but the one before it ends at {want}: \
                             a segment is missing or out of place",
                            header.follows
                        ),
                    ));
                }
                // Numbers from `start` (never below the trim point) up to
                // what the first segment follows were in one before it.
                None if i == 0 && header.format >= 2 && header.follows >= start.max(1) => {
                    return Err(damage(
                        name,
                        first,
                        0,
                        &format!(
                            "records {} to {} are missing: the segment holding them is \
                             missing",
                            start.max(1),
                            header.follows
                        ),
                    ));
                }
                _ => {}
            }
            let limit_pos = if first == tail.seg_first {
                tail.end
            } else {
                file.metadata().map_err(io("inspect", &path))?.len()
            };
            let mut frames = Frames::new(
                file,
                header.len,
                limit_pos,
                self.store.options.max_value_bytes,
                Some(first),
                false,
            )
            .map_err(io("read", &path))?;
            loop {
                match frames.next(want_from).map_err(io("read", &path))? {
                    Step::End => break,
                    Step::Bad { at, reason, .. } => return Err(damage(name, first, at, &reason)),
                    Step::Frame { seq, data, .. } => {
                        if !each(seq, data) {
                            return Ok(());
                        }
                    }
                }
            }
            // Frames are numbered on from `first`: the last is one below
            // the next expected.
            before = frames.expect.map(|next| next - 1);
        }
        Ok(())
    }

    pub(crate) fn read(
        &self,
        name: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogRecord>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (hashed, dir) = self.paths(name);
        let read = self
            .ensure_recovered(&hashed, &dir, name)
            .and_then(|()| self.read_records(&hashed, &dir, name, (after, limit), Cut::No));
        let read = match read {
            // Read without the log's lock, damage may be another writer's
            // change in flight (a segment being started, a log being
            // created): look again under the lock before reporting it.
            Err(Error::Corrupt { .. }) => {
                self.store.lock_stripe("log", &hashed).and_then(|_guard| {
                    self.read_records(&hashed, &dir, name, (after, limit), Cut::IfWritable)
                })
            }
            other => other,
        };
        report(name, read)
    }

    fn read_records(
        &self,
        hashed: &str,
        dir: &Path,
        name: &str,
        (after, limit): (u64, usize),
        cut: Cut,
    ) -> Result<Vec<LogRecord>, Error> {
        let Some((tail, segments)) = self.scan_tail(hashed, dir, name, cut)? else {
            self.empty_log(hashed, dir, name)?;
            return Ok(Vec::new());
        };
        if !is_live(tail.expires_ms, unix_ms()) {
            return Ok(Vec::new());
        }
        let start = after
            .saturating_add(1)
            .max(read_trim(dir, name)?.trim_before);
        if start > tail.last_seq {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        self.walk_frames(name, dir, &segments, &tail, (start, start), |seq, data| {
            if let Some(data) = data {
                out.push(LogRecord::new(seq, data));
            }
            out.len() < limit
        })?;
        Ok(out)
    }

    pub(crate) fn trim(&self, name: &str, before: u64) -> Result<u64, Error> {
        report(name, self.trim_records(name, before))
    }

    fn trim_records(&self, name: &str, before: u64) -> Result<u64, Error> {
        let (hashed, dir) = self.paths(name);
        let _guard = self.store.lock_stripe("log", &hashed)?;
        let Some((tail, segments)) = self.scan_tail(&hashed, &dir, name, Cut::Must)? else {
            self.empty_log(&hashed, &dir, name)?;
            return Ok(0);
        };
        self.recovered().insert(hashed.clone());
        if !is_live(tail.expires_ms, unix_ms()) {
            return Ok(0);
        }
        let mut trim = read_trim(&dir, name)?;
        let old = trim.trim_before;
        // Records appended later are never dropped by an earlier trim.
        let new = before.min(tail.last_seq.saturating_add(1));
        if new <= old {
            return Ok(0);
        }
        // Count what is dropped now: frames numbered in old..new. Damage in
        // that range stops the trim, so no damaged segment is removed.
        let mut dropped = 0;
        self.walk_frames(name, &dir, &segments, &tail, (old, u64::MAX), |seq, _| {
            if seq >= old && seq < new {
                dropped += 1;
            }
            seq < new
        })?;
        trim.trim_before = new;
        write_trim(&dir, &trim)?;
        // Whole segments below the trim point go; the last one always stays,
        // since it says where numbering continues.
        let mut removed_any = false;
        for pair in segments.windows(2) {
            if pair[1] <= new {
                let path = dir.join(segment_name(pair[0]));
                match fs::remove_file(&path) {
                    Ok(()) => removed_any = true,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error("remove", &path, e)),
                }
            }
        }
        if removed_any {
            sync_dir(&dir)?;
        }
        Ok(dropped)
    }

    /// Removes a log: its mark first (so that a crash never leaves a mark
    /// without its log, which reads as damage), then its directory, moved
    /// into the trash in one atomic rename. Returns whether there was a
    /// directory.
    pub(super) fn remove_log_dir(&self, hashed: &str, dir: &Path) -> Result<bool, Error> {
        mark::remove(&self.store.mark_dir, hashed)?;
        let trash = self
            .store
            .trash_dir
            .join(format!("{hashed}.{}", unix_micros()));
        match fs::rename(dir, &trash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error("move into the trash", dir, e)),
        }
        sync_dir(&self.store.log_dir)?;
        self.tails().remove(hashed);
        self.open_segments().forget(hashed);
        if let Err(e) = fs::remove_dir_all(&trash) {
            warn!(path = %trash.display(), error = %e, "could not empty the trash");
        }
        Ok(true)
    }

    /// Deletes a log and its mark: its numbering starts again.
    pub(crate) fn delete(&self, name: &str) -> Result<(), Error> {
        let (hashed, dir) = self.paths(name);
        let _guard = self.store.lock_stripe("log", &hashed)?;
        self.remove_log_dir(&hashed, &dir)?;
        Ok(())
    }
}
