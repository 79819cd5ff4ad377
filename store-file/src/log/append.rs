//! Appending: in place at the end of the last segment, or in a new one.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use mcp_persist_core::Error;
use tracing::{debug, warn};

use super::{
    Cut, Empty, Logs,
    format::{
        LOG_FORMAT, encode_frames, encode_segment_header, read_trim, segment_name,
        write_roll_notice, write_slot, write_trim,
    },
    mark, report,
    tail::{Slot, Tail},
};
use crate::fsio::{
    ensure_private_dir, expiry_ms, io, io_error, is_live, sync_dir, unix_ms, write_atomic,
};

/// The numbers of an append's records, and, for a synced append written in
/// place under group commit, the sync it still needs: the caller awaits
/// [`Logs::sync_appended`] (on the store's sync thread, holding no blocking
/// thread) before it acknowledges the records.
pub(crate) struct Appended {
    pub(crate) seqs: Vec<u64>,
    pub(crate) unsynced: Option<Unsynced>,
}

/// The segment a synced append wrote in place, not synced yet.
pub(crate) struct Unsynced {
    file: Arc<File>,
    path: PathBuf,
    hashed: String,
    seg_first: u64,
    ino: u64,
    last: u64,
}

impl Logs {
    /// Appends `records` to log `name`. With `sync`, the frames are
    /// fdatasynced before this returns (they survive a power cut), or, under
    /// group commit, the returned [`Appended::unsynced`] says what
    /// [`sync_appended`](Self::sync_appended) must sync before the records
    /// are acknowledged; without, they are written to the file (they
    /// survive a crash of this process, and other processes read them at
    /// once). A new segment is always created whole and synced.
    pub(crate) fn append(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Appended, Error> {
        report(name, self.append_records(name, records, ttl, sync))
    }

    /// Syncs the segment a synced append wrote in place, as one member of
    /// a group commit round, and notes it synced for the next append's
    /// slot.
    pub(crate) async fn sync_appended(&self, unsynced: Unsynced) -> Result<(), Error> {
        // Only appends under group commit leave their sync to the caller.
        let Some(group) = &self.group else {
            return Err(io_error(
                "fsync",
                &unsynced.path,
                io::Error::other("group commit is off for this store"),
            ));
        };
        group
            .sync(Arc::clone(&unsynced.file))
            .await
            .map_err(io("fsync", &unsynced.path))?;
        self.note_synced(&unsynced);
        Ok(())
    }

    /// The next append's slot says the records up to `unsynced.last` are
    /// synced (if the segment is still the log's last).
    fn note_synced(&self, unsynced: &Unsynced) {
        if let Some(t) = self.tails().get_mut(&unsynced.hashed)
            && t.seg_first == unsynced.seg_first
            && t.ino == unsynced.ino
        {
            t.synced = t.synced.max(unsynced.last);
        }
    }

    fn append_records(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Appended, Error> {
        let (hashed, dir) = self.paths(name);
        let guard = self.store.lock_stripe("log", &hashed)?;
        let now = unix_ms();
        // The segment this handle kept open after its last append, when it
        // is still the log's last and nothing changed it since (`open`);
        // else the long way, listing the log's directory.
        let kept = self
            .kept_tail(&hashed, &dir)
            .filter(|(t, _)| is_live(t.expires_ms, now));
        let scanned = match &kept {
            Some((t, _)) => Some((*t, Vec::new())),
            None => self.scan_tail(&hashed, &dir, name, Cut::Must)?,
        };
        self.recovered().insert(hashed.clone());
        // `handed`: the highest number the log may have handed out; the new
        // records go above it. `live`: the last segment, when the log goes on
        // after it; `expired`: the segments of an expired log, to discard.
        let (handed, live, expired) = match scanned {
            None => {
                let handed = match self.empty_log(&hashed, &dir, name)? {
                    Empty::Fresh => {
                        ensure_private_dir(&dir)?;
                        0
                    }
                    Empty::SetAside { next } => next - 1,
                };
                (handed, None, None)
            }
            Some((t, segments)) => {
                let handed = match t.handed_out() {
                    Some(handed) => handed,
                    None => {
                        let reserved = mark::read(&self.store.mark_dir, &hashed, name)?
                            .map_or(0, |m| m.reserved);
                        warn!(
                            log = name,
                            "the commit slot of a log's last segment does not check out; \
                             numbering goes on above the log's mark"
                        );
                        t.last_seq.max(reserved)
                    }
                };
                if handed > t.last_seq && t.slot.is_some() {
                    warn!(
                        log = name,
                        first_missing = t.last_seq + 1,
                        last_missing = handed,
                        "records handed out at the end of a log are missing (an append cut \
                         short by a power cut, or records cut away); their numbers are \
                         skipped, never handed out again"
                    );
                }
                if is_live(t.expires_ms, now) {
                    (handed, Some(t), None)
                } else {
                    (handed, None, Some((t, segments)))
                }
            }
        };
        // What the records follow, and what the log's expiry was.
        let (follows, carried_expiry, known_reserved) = match (&live, &expired) {
            (Some(t), _) => (t.last_seq, t.expires_ms, t.reserved),
            (None, Some((t, _))) => (t.last_seq, 0, t.reserved),
            (None, None) => (handed, 0, 0),
        };
        let expires_ms = ttl.map_or(carried_expiry, |ttl| expiry_ms(now, ttl));
        // u64::MAX is never a sequence number, so every read can add one.
        let count = records.len() as u64;
        let Some(next) = handed
            .checked_add(1)
            .filter(|next| next.checked_add(count).is_some())
        else {
            return Err(Error::corrupt(
                name,
                format!("the log's sequence numbers are exhausted (last {handed})"),
            ));
        };
        let (frames, seqs, last_rel, last_crc) = encode_frames(next, expires_ms, records);
        let last = *seqs.last().expect("append is never called without records");
        // The segment written in place, to sync once the lock is released.
        let mut to_sync = None;
        let in_place = live.filter(|t| {
            t.format >= LOG_FORMAT
                && handed == t.last_seq
                && t.end < self.store.options.segment_bytes
        });
        let mut tail = match in_place {
            Some(t) => {
                let path = dir.join(segment_name(t.seg_first));
                let file = match kept {
                    Some((_, file)) => file,
                    None => self.open_for_append(&hashed, &dir, &t)?,
                };
                file.write_all_at(&frames, t.end)
                    .map_err(io("write", &path))?;
                // After the frames: a slot never names a frame not written.
                let synced = t.slot.map_or(0, |s| s.synced).max(t.synced);
                let slot = Slot {
                    issued: last,
                    synced,
                    next: 0,
                };
                write_slot(&file, &path, slot)?;
                to_sync = Some((file, path));
                Tail {
                    last_off: t.end + last_rel,
                    last_seq: last,
                    last_crc,
                    end: t.end + frames.len() as u64,
                    expires_ms,
                    slot: Some(slot),
                    ..t
                }
            }
            None => self
                .start_segment(
                    name,
                    &dir,
                    live.as_ref(),
                    expired
                        .as_ref()
                        .map(|(t, segments)| (t, segments.as_slice())),
                    (next, follows),
                    (&frames, last, last_rel, last_crc, expires_ms),
                    known_reserved,
                )
                .inspect(|tail| {
                    // Kept open for the appends that follow. The records are
                    // in, whatever happens here: a segment that cannot be
                    // opened now is opened by the next append.
                    if let Err(e) = self.open_for_append(&hashed, &dir, tail) {
                        debug!(log = name, error = %e, "could not keep a new segment open");
                    }
                })?,
        };
        // The mark covers every number before any is acknowledged.
        if last > tail.reserved {
            let on_disk =
                mark::read(&self.store.mark_dir, &hashed, name)?.map_or(0, |m| m.reserved);
            tail.reserved = if last > on_disk {
                let reserved = last.saturating_add(self.reserve_block()).min(u64::MAX - 1);
                mark::write(&self.store.mark_dir, &hashed, name, reserved)?;
                debug!(log = name, reserved, "raised a log's numbering mark");
                reserved
            } else {
                on_disk
            };
        }
        self.tails().insert(hashed.clone(), tail);
        drop(guard);
        // Synced outside the log's lock, so appends to other logs of the same
        // lock stripe (and the next append to this one) go on meanwhile, and
        // appends to many logs share syncs (group commit). Nothing is lost by
        // the wait: the frames are in the file, readers may see them (as of
        // any write), and the caller hears of them only after this.
        let Some((file, path)) = to_sync.filter(|_| sync) else {
            return Ok(Appended {
                seqs,
                unsynced: None,
            });
        };
        let unsynced = Unsynced {
            file,
            path,
            hashed,
            seg_first: tail.seg_first,
            ino: tail.ino,
            last,
        };
        if let Some(group) = &self.group {
            match group.sync_alone(&unsynced.file) {
                Some(synced) => synced.map_err(io("fsync", &unsynced.path))?,
                None => {
                    return Ok(Appended {
                        seqs,
                        unsynced: Some(unsynced),
                    });
                }
            }
            self.note_synced(&unsynced);
            return Ok(Appended {
                seqs,
                unsynced: None,
            });
        }
        unsynced
            .file
            .sync_data()
            .map_err(io("fsync", &unsynced.path))?;
        self.note_synced(&unsynced);
        Ok(Appended {
            seqs,
            unsynced: None,
        })
    }

    /// Starts a segment at `first` (following `follows`) with the encoded
    /// frames of an append: after the last segment `live` when it is full,
    /// of the old format or followed by skipped numbers (sealing it), or in
    /// place of the `expired` segments of a log (whose last is described by
    /// the tail given with them), or as a log's first.
    #[allow(clippy::too_many_arguments)]
    fn start_segment(
        &self,
        name: &str,
        dir: &Path,
        live: Option<&Tail>,
        expired: Option<(&Tail, &[u64])>,
        (first, follows): (u64, u64),
        (frames, last, last_rel, last_crc, expires_ms): (&[u8], u64, u64, u32, u64),
        reserved: u64,
    ) -> Result<Tail, Error> {
        if expired.is_some() {
            // Drop the expired records first: until their segments are
            // gone, a crash must not bring them back.
            let mut trim = read_trim(dir, name)?;
            trim.trim_before = trim.trim_before.max(first);
            write_trim(dir, &trim)?;
        }
        if let Some(t) = live.filter(|t| t.format >= 2) {
            // Until the new segment is sealed behind this one, a process
            // that kept this one open must not take it for the last.
            let path = dir.join(segment_name(t.seg_first));
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io("open for appending", &path))?;
            write_roll_notice(&file, &path)?;
        }
        if let Some((t, _)) = expired.filter(|(t, _)| t.format >= 2) {
            // The same until the expired segments are removed; a kept
            // descriptor is not used for an expired log anyway (only a
            // clock stepped back could make it look live), so a segment
            // that cannot be written is no reason to refuse the append.
            let path = dir.join(segment_name(t.seg_first));
            if let Err(e) = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io("open for appending", &path))
                .and_then(|file| write_roll_notice(&file, &path))
            {
                debug!(log = name, error = %e, "could not set the roll notice of an expired log");
            }
        }
        if let Some(t) = live {
            // The full segment may end in frames another append wrote
            // and has not synced yet (or never will, unsynced): they
            // reach the disk before the segment after them exists, so
            // a power cut can never leave a torn frame anywhere but
            // in the last segment.
            let path = dir.join(segment_name(t.seg_first));
            File::open(&path)
                .and_then(|file| file.sync_data())
                .map_err(io("fsync", &path))?;
        }
        let slot = Slot {
            issued: last,
            synced: last,
            next: 0,
        };
        let header = encode_segment_header(first, follows, name, slot);
        let seg = segment_name(first);
        write_atomic(dir, &seg, &[&header, frames])?;
        let path = dir.join(&seg);
        let ino = fs::metadata(&path).map_err(io("inspect", &path))?.ino();
        debug!(log = name, first, "started a log segment");
        if let Some(t) = live.filter(|t| t.format >= 2) {
            // Sealed once the next one exists: should that one go missing,
            // this one says so.
            let path = dir.join(segment_name(t.seg_first));
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io("open for appending", &path))?;
            let old = t.slot.unwrap_or_default();
            let sealed = Slot {
                issued: old.issued.max(t.last_seq),
                synced: old.synced.min(t.last_seq),
                next: first,
            };
            write_slot(&file, &path, sealed)?;
            file.sync_data().map_err(io("fsync", &path))?;
        }
        if let Some((_, segments)) = expired {
            for old in segments {
                let path = dir.join(segment_name(*old));
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error("remove", &path, e)),
                }
            }
            sync_dir(dir)?;
            debug!(log = name, "discarded an expired log before appending");
        }
        Ok(Tail {
            seg_first: first,
            ino,
            last_off: header.len() as u64 + last_rel,
            last_seq: last,
            last_crc,
            end: (header.len() + frames.len()) as u64,
            expires_ms,
            format: LOG_FORMAT,
            slot: Some(slot),
            synced: last,
            reserved,
        })
    }
}
