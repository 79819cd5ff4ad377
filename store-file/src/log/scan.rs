//! Finding where a log ends, and recovering from a crash.
//!
//! A crash mid-append leaves a torn tail: the first frame after the last
//! good one of the **last** segment, when it is a partial header; or a
//! length no larger than the largest record that reaches or runs past the
//! end of the file, with a failed checksum (or no room for one) and no intact
//! frame starting anywhere after its first byte; or zero bytes from there
//! to the end (a power cut that extended the file but not its contents). It
//! is cut (under the log's lock) the first time a handle that can write the
//! segment touches the log, and by the next append; readers stop before it.
//!
//! Records missing from the end of the last segment although its commit
//! slot says they were handed out are skipped: the next append starts a
//! segment above them. If the slot says they had been synced, they were
//! acknowledged and lost, which is damage.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{FileExt, MetadataExt},
    path::Path,
};

use mcp_persist_core::Error;
use tracing::{debug, warn};

use super::{
    Cut, Empty, Logs, damage,
    format::{
        FRAME, SLOT_AT, SegmentHeader, list_segments, read_segment_header, read_slot, read_trim,
        segment_name,
    },
    frames::{Frames, Step},
    lost, mark,
    tail::Tail,
};
use crate::fsio::{io, io_error, u32_at, u64_at};

/// Reads a segment header and checks it against the segment's name.
pub(super) fn checked_header(file: &File, name: &str, first: u64) -> Result<SegmentHeader, Error> {
    let header = read_segment_header(file, Some(name))?;
    if header.first != first || first == 0 {
        return Err(damage(
            name,
            first,
            0,
            &format!("header says the segment starts at {}", header.first),
        ));
    }
    if header.follows >= first {
        return Err(damage(
            name,
            first,
            16,
            &format!("header says the segment follows {}", header.follows),
        ));
    }
    Ok(header)
}

impl Logs {
    /// Finds where a log ends, starting from this handle's last look when
    /// that still matches the file. A torn tail is cut as `cut` says (only
    /// under the log's lock); damage is an error and nothing is cut. `None`
    /// when the log has no segment.
    pub(super) fn scan_tail(
        &self,
        hashed: &str,
        dir: &Path,
        name: &str,
        cut: Cut,
    ) -> Result<Option<(Tail, Vec<u64>)>, Error> {
        let Some(segments) = list_segments(dir)? else {
            return Ok(None);
        };
        let Some(&first) = segments.last() else {
            return Ok(None);
        };
        let path = dir.join(segment_name(first));
        // Read-only: a log whose files cannot be written can still be read.
        let file = match File::open(&path) {
            Ok(file) => file,
            // Deleted or expired away by another process meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound && cut != Cut::Must => {
                return Ok(None);
            }
            Err(e) => return Err(io_error("open", &path, e)),
        };
        // The commit slot before the length and the frames: appends write
        // their frames before the slot, so every frame it names as synced
        // is in what is read next, unless it was lost.
        let slot = read_slot(&file);
        let meta = file.metadata().map_err(io("inspect", &path))?;
        self.store.check_file_mode(&path, &meta);
        let len = meta.len();
        let cached = self.tails().get(hashed).copied().filter(|t| {
            t.seg_first == first && t.ino == meta.ino() && t.end <= len && {
                let mut head = [0u8; FRAME];
                file.read_exact_at(&mut head, t.last_off).is_ok()
                    && u32_at(&head, 4) == t.last_crc
                    && u64_at(&head, 8) == t.last_seq
            }
        });
        let (mut tail, mut seen, expect) = match cached {
            Some(tail) => (tail, true, tail.last_seq.checked_add(1)),
            None => {
                let header = checked_header(&file, name, first)?;
                if header.format < 2 && mark::exists(&self.store.mark_dir, hashed)? {
                    // Only this version writes marks, and its first append
                    // to a log starts a segment of its own format.
                    return Err(damage(
                        name,
                        first,
                        0,
                        "the log has a numbering mark but ends in a segment of the old \
                         format: the segments after it are missing",
                    ));
                }
                let tail = Tail {
                    seg_first: first,
                    ino: meta.ino(),
                    last_off: header.len,
                    // The header check proved first >= 1.
                    last_seq: first - 1,
                    last_crc: 0,
                    end: header.len,
                    expires_ms: 0,
                    format: header.format,
                    slot: None,
                    synced: 0,
                    reserved: 0,
                };
                (tail, false, Some(first))
            }
        };
        tail.slot = if tail.format >= 2 { slot } else { None };
        let reader = file.try_clone().map_err(io("open", &path))?;
        let mut frames = Frames::new(
            reader,
            tail.end,
            len,
            self.store.options.max_value_bytes,
            expect,
            true,
        )
        .map_err(io("read", &path))?;
        let torn = loop {
            match frames.next(0).map_err(io("read", &path))? {
                Step::End => break None,
                Step::Bad {
                    reason, torn: true, ..
                } => break Some(reason),
                Step::Bad { at, reason, .. } => return Err(damage(name, first, at, &reason)),
                Step::Frame {
                    off,
                    seq,
                    expires_ms,
                    crc,
                    ..
                } => {
                    seen = true;
                    tail = Tail {
                        last_off: off,
                        last_seq: seq,
                        last_crc: crc,
                        end: frames.pos,
                        expires_ms,
                        ..tail
                    };
                }
            }
        };
        if !seen {
            // Segments are created whole with their first batch: one
            // without a readable record was not left by a crash.
            return Err(damage(name, first, tail.end, "holds no readable record"));
        }
        if let Some(slot) = tail.slot {
            if slot.next != 0 {
                return Err(damage(
                    name,
                    first,
                    SLOT_AT,
                    &format!(
                        "the log went on in segment {}, which is missing",
                        segment_name(slot.next)
                    ),
                ));
            }
            if tail.last_seq < slot.synced {
                return Err(damage(
                    name,
                    first,
                    tail.end,
                    &format!(
                        "records {} to {} are missing from the end, though they had been \
                         synced (acknowledged): the segment was cut short",
                        tail.last_seq + 1,
                        slot.synced
                    ),
                ));
            }
        }
        if let Some(reason) = torn {
            match cut {
                Cut::No => {}
                Cut::IfWritable | Cut::Must => {
                    let writable = OpenOptions::new().write(true).open(&path);
                    match writable {
                        Ok(file) => {
                            file.set_len(tail.end).map_err(io("truncate", &path))?;
                            file.sync_all().map_err(io("fsync", &path))?;
                            warn!(
                                log = name,
                                cut_bytes = len - tail.end,
                                reason,
                                "cut the torn tail of a log left by an interrupted append"
                            );
                        }
                        // Readers stop before the torn tail anyway.
                        Err(e) if cut == Cut::IfWritable => {
                            debug!(log = name, error = %e, "left a torn tail uncut: the segment is not writable");
                            self.tails().insert(hashed.to_owned(), tail);
                            return Ok(Some((tail, segments)));
                        }
                        Err(e) => return Err(io_error("open for appending", &path, e)),
                    }
                }
            }
        }
        self.tails().insert(hashed.to_owned(), tail);
        Ok(Some((tail, segments)))
    }

    /// What a log without a segment is: never written (or deleted), set
    /// aside, or damaged (its mark says it handed out numbers): then
    /// [`Error::Corrupt`].
    pub(super) fn empty_log(&self, hashed: &str, dir: &Path, name: &str) -> Result<Empty, Error> {
        let trim = read_trim(dir, name)?;
        let mark = mark::read(&self.store.mark_dir, hashed, name)?;
        if trim.next_seq > 0 {
            let above_mark = mark.map_or(0, |m| m.reserved.saturating_add(1));
            return Ok(Empty::SetAside {
                next: trim.next_seq.max(above_mark),
            });
        }
        match mark {
            None => Ok(Empty::Fresh),
            Some(mark) => Err(lost(name, dir, mark.reserved)),
        }
    }

    /// The first time this handle touches a log, takes its lock and cuts a
    /// torn tail, so nothing is ever appended after garbage.
    pub(super) fn ensure_recovered(
        &self,
        hashed: &str,
        dir: &Path,
        name: &str,
    ) -> Result<(), Error> {
        if self.recovered().contains(hashed) {
            return Ok(());
        }
        // A log without a folder has no tail to cut; taking its lock would
        // create a lock file, a write that a reader must not make.
        if !dir.is_dir() {
            return Ok(());
        }
        let _guard = self.store.lock_stripe("log", hashed)?;
        if let Some((tail, _)) = self.scan_tail(hashed, dir, name, Cut::IfWritable)? {
            let path = dir.join(segment_name(tail.seg_first));
            let cut = fs::metadata(&path).is_ok_and(|m| m.len() == tail.end);
            if !cut {
                // A torn tail left in a read-only segment: look again next time.
                return Ok(());
            }
        }
        self.recovered().insert(hashed.to_owned());
        Ok(())
    }
}
