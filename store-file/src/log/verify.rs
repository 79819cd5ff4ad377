//! Checking every segment and mark in full, changing nothing.

use std::{
    fs::{self, File},
    path::Path,
};

use mcp_persist_core::Error;

use super::{
    Logs,
    format::{Trim, list_segments, read_segment_header, read_slot, read_trim, segment_name},
    frames::{Frames, Step},
    mark,
};
use crate::fsio::{hashed_name, io, is_hashed_name};

/// What [`Logs::verify`] found.
#[derive(Debug, Default)]
pub(crate) struct LogCheck {
    pub(crate) logs: u64,
    pub(crate) records: u64,
    pub(crate) torn_bytes: u64,
    pub(crate) problems: Vec<String>,
}

impl Logs {
    /// Reads every segment of every log in full, and every numbering mark,
    /// and reports what does not check out (each log under its lock, so a
    /// writer's change in flight is not mistaken for damage). A torn tail
    /// not cut yet is counted, not a problem.
    pub(crate) fn verify(&self) -> Result<LogCheck, Error> {
        let mut check = LogCheck::default();
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
            let _guard = self.store.lock_stripe("log", &hashed)?;
            self.verify_log(&hashed, &entry.path(), &mut check)?;
        }
        // Marks whose log directory is gone.
        let entries =
            fs::read_dir(&self.store.mark_dir).map_err(io("list", &self.store.mark_dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.store.mark_dir))?;
            let Some(hashed) = entry
                .file_name()
                .to_str()
                .filter(|n| is_hashed_name(n))
                .map(str::to_owned)
            else {
                continue;
            };
            let _guard = self.store.lock_stripe("log", &hashed)?;
            if self.store.log_dir.join(&hashed).exists() {
                continue;
            }
            let label = format!("mark/{hashed}");
            match mark::read(&self.store.mark_dir, &hashed, &label) {
                Ok(Some(mark)) => check.problems.push(format!(
                    "log {} ({label}): the log's directory is missing, though its numbering \
                     mark says it handed out numbers (at most {})",
                    mark.log, mark.reserved
                )),
                Ok(None) => {}
                Err(e) => check.problems.push(format!("{label}: {e}")),
            }
        }
        Ok(check)
    }

    /// Checks one log directory (under its lock) into `check`.
    fn verify_log(&self, hashed: &str, dir: &Path, check: &mut LogCheck) -> Result<(), Error> {
        let Some(segments) = list_segments(dir)? else {
            return Ok(());
        };
        let label = format!("log/{hashed}");
        let mark = match mark::read(&self.store.mark_dir, hashed, &label) {
            Ok(mark) => mark,
            Err(e) => {
                check.problems.push(format!("{label}: {e}"));
                None
            }
        };
        let trim = match read_trim(dir, &label) {
            Ok(trim) => trim,
            Err(e) => {
                check.problems.push(format!("{label}: {e}"));
                Trim::default()
            }
        };
        if segments.is_empty() {
            if let Some(mark) = mark.filter(|_| trim.next_seq == 0) {
                check.problems.push(format!(
                    "log {} ({label}): every segment is missing, though its numbering mark \
                     says it handed out numbers (at most {})",
                    mark.log, mark.reserved
                ));
            }
            return Ok(());
        }
        check.logs += 1;
        // The last number of the segment before, once known.
        let mut before: Option<u64> = None;
        for (i, &first) in segments.iter().enumerate() {
            let is_last = i + 1 == segments.len();
            let path = dir.join(segment_name(first));
            let mut label = format!("log/{hashed}/{}", segment_name(first));
            let Ok(file) = File::open(&path) else {
                before = None;
                continue;
            };
            let header = match read_segment_header(&file, None) {
                Ok(header) => header,
                Err(e) => {
                    check.problems.push(format!("{label}: {e}"));
                    before = None;
                    continue;
                }
            };
            if hashed_name("log", &header.name) != hashed
                || header.first != first
                || first == 0
                || header.follows >= first
            {
                check
                    .problems
                    .push(format!("{label}: header does not match its place"));
                before = None;
                continue;
            }
            // The header is sound: name the log, for `quarantine_log`.
            label = format!("log {} ({label})", header.name);
            match before {
                Some(want) if want != header.follows => check.problems.push(format!(
                    "{label}: follows {} but the segment before it ends at {want}: \
                     a segment is missing or out of place",
                    header.follows
                )),
                None if i == 0
                    && header.format >= 2
                    && header.follows >= trim.trim_before.max(1) =>
                {
                    check.problems.push(format!(
                        "{label}: records {} to {} are missing: the segment holding them is \
                         missing",
                        trim.trim_before.max(1),
                        header.follows
                    ));
                }
                _ => {}
            }
            let slot = (header.format >= 2).then(|| read_slot(&file));
            let len = file.metadata().map_err(io("inspect", &path))?.len();
            let mut frames = Frames::new(
                file,
                header.len,
                len,
                self.store.options.max_value_bytes,
                Some(first),
                is_last,
            )
            .map_err(io("read", &path))?;
            let mut count = 0;
            let whole = loop {
                match frames.next(0).map_err(io("read", &path))? {
                    Step::End => break true,
                    Step::Frame { .. } => {
                        count += 1;
                        check.records += 1;
                    }
                    Step::Bad { at, reason, torn } => {
                        if is_last && torn && count > 0 {
                            check.torn_bytes += len - at;
                            break true;
                        }
                        check
                            .problems
                            .push(format!("{label}: {reason} at byte {at}"));
                        break false;
                    }
                }
            };
            if count == 0 {
                check
                    .problems
                    .push(format!("{label}: holds no readable record"));
            }
            let last = frames.expect.map(|next| next - 1);
            if is_last && whole && count > 0 {
                match slot {
                    Some(None) => check
                        .problems
                        .push(format!("{label}: its commit slot does not check out")),
                    Some(Some(slot)) if slot.next != 0 => check.problems.push(format!(
                        "{label}: the log went on in segment {}, which is missing",
                        segment_name(slot.next)
                    )),
                    Some(Some(slot)) if last.is_some_and(|last| last < slot.synced) => {
                        check.problems.push(format!(
                            "{label}: records after {} up to {} are missing from the end, \
                             though they had been synced (acknowledged)",
                            last.unwrap_or_default(),
                            slot.synced
                        ));
                    }
                    None if mark.is_some() => check.problems.push(format!(
                        "{label}: the log has a numbering mark but ends in a segment of the \
                         old format: the segments after it are missing"
                    )),
                    _ => {}
                }
            }
            // Where a damaged segment really ends is unknown: the next
            // one is not judged by it.
            before = if whole { last } else { None };
        }
        Ok(())
    }
}
