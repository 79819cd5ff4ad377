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
use crate::{
    commit::GroupCommit,
    fsio::{ensure_private_dir, expiry_ms, io, io_error, is_live, sync_dir, unix_ms, write_atomic},
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

impl Unsynced {
    /// The sync an append that left the log at `tail` needs, in `file`.
    fn after(file: Arc<File>, path: PathBuf, hashed: String, tail: &Tail) -> Self {
        Unsynced {
            file,
            path,
            hashed,
            seg_first: tail.seg_first,
            ino: tail.ino,
            last: tail.last_seq,
        }
    }
}

/// Writes an append's encoded `frames` at the end of the kept last segment
/// `t`, then its slot, and returns the log's tail after them.
fn write_in_place(
    file: &File,
    path: &Path,
    t: Tail,
    frames: &[u8],
    (last, last_rel, last_crc): (u64, u64, u32),
    expires_ms: u64,
) -> Result<Tail, Error> {
    file.write_all_at(frames, t.end)
        .map_err(io("write", path))?;
    // After the frames: a slot never names a frame not written.
    let synced = t.slot.map_or(0, |s| s.synced).max(t.synced);
    let slot = Slot {
        issued: last,
        synced,
        next: 0,
    };
    write_slot(file, path, slot)?;
    Ok(Tail {
        last_off: t.end + last_rel,
        last_seq: last,
        last_crc,
        end: t.end + frames.len() as u64,
        expires_ms,
        slot: Some(slot),
        ..t
    })
}

/// The number an append of `count` records gives the first of them when
/// the log may have handed out every number up to `handed`. u64::MAX is
/// never a sequence number, so every read can add one: a log with no room
/// left is [`Error::Corrupt`].
fn first_after(name: &str, handed: u64, count: u64) -> Result<u64, Error> {
    handed
        .checked_add(1)
        .filter(|next| next.checked_add(count).is_some())
        .ok_or_else(|| {
            Error::corrupt(
                name,
                format!("the log's sequence numbers are exhausted (last {handed})"),
            )
        })
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

    /// The highest number a log whose last segment ends at `t` may have
    /// handed out: what the segment says ([`Tail::handed_out`]), or, when
    /// its commit slot does not check out, its last frame or the log's
    /// numbering mark, whichever is higher.
    fn handed_out(&self, t: &Tail, hashed: &str, name: &str) -> Result<u64, Error> {
        match t.handed_out() {
            Some(handed) => Ok(handed),
            None => {
                let reserved =
                    mark::read(&self.store.mark_dir, hashed, name)?.map_or(0, |m| m.reserved);
                Ok(t.last_seq.max(reserved))
            }
        }
    }

    /// The number the next append to log `name` gives its first record,
    /// found by reading what that append reads, in the same order, and
    /// writing nothing: the last segment (its last frame and commit slot)
    /// or, with no segment, the trim file of a log set aside and the
    /// numbering mark; the mark too where the append would read it (a
    /// commit slot that does not check out, a number past the mark this
    /// handle last saw), and the trim file of an expired log, which the
    /// append rewrites. So it is the append's number, or the append's
    /// [`Error::Corrupt`] for damage. A torn tail is left where it is (the
    /// append cuts it, which changes no number).
    ///
    /// Read without the log's lock, like [`read`](Self::read); damage seen
    /// that way may be another writer's change in flight, so it is looked
    /// at again under the lock before it is reported.
    pub(crate) fn next_seq(&self, name: &str) -> Result<u64, Error> {
        let (hashed, dir) = self.paths(name);
        let next = match self.peek_next_seq(&hashed, &dir, name) {
            Err(Error::Corrupt { .. }) => self
                .store
                .lock_stripe("log", &hashed)
                .and_then(|_guard| self.peek_next_seq(&hashed, &dir, name)),
            other => other,
        };
        report(name, next)
    }

    fn peek_next_seq(&self, hashed: &str, dir: &Path, name: &str) -> Result<u64, Error> {
        // As in `append_records`: `handed` is the highest number the log may
        // have handed out, `reserved` the mark as this handle knows it.
        let (handed, reserved, expired) = match self.scan_tail(hashed, dir, name, Cut::No)? {
            None => match self.empty_log(hashed, dir, name)? {
                Empty::Fresh => (0, 0, false),
                Empty::SetAside { next } => (next - 1, 0, false),
            },
            Some((t, _)) => (
                self.handed_out(&t, hashed, name)?,
                t.reserved,
                !is_live(t.expires_ms, unix_ms()),
            ),
        };
        let next = first_after(name, handed, 1)?;
        if expired {
            // An append over an expired log raises its trim point first,
            // reading the trim file.
            read_trim(dir, name)?;
        }
        if next > reserved {
            // An append this far raises the mark, reading it first.
            mark::read(&self.store.mark_dir, hashed, name)?;
        }
        Ok(next)
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

    /// [`append`](Self::append) without waiting for anything, for the
    /// calling task to run itself: when the log's last segment is kept open
    /// and takes the records in place, the stripe is free, the numbering
    /// mark already covers the new numbers and a synced append can leave
    /// its sync to a group commit round. The frames and the slot are two
    /// writes to the page cache; no sync, no lock wait, no directory
    /// listing. `None` when any of that does not hold: append the usual
    /// way, on the blocking pool.
    pub(crate) fn try_append_in_place(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Option<Appended>, Error> {
        report(name, self.append_in_place_now(name, records, ttl, sync))
    }

    fn append_in_place_now(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Option<Appended>, Error> {
        if !self.store.options.appends_on_caller
            || (sync && !self.group.as_ref().is_some_and(GroupCommit::busy))
        {
            return Ok(None);
        }
        let (hashed, dir) = self.paths(name);
        let Some(guard) = self.store.try_lock_stripe("log", &hashed)? else {
            return Ok(None);
        };
        let now = unix_ms();
        let Some((t, file)) = self
            .kept_tail(&hashed, &dir)
            .filter(|(t, _)| is_live(t.expires_ms, now))
        else {
            return Ok(None);
        };
        let count = records.len() as u64;
        let last = match t.handed_out() {
            Some(handed)
                if handed == t.last_seq
                    && t.format >= LOG_FORMAT
                    && t.end < self.store.options.segment_bytes =>
            {
                // u64::MAX is never a sequence number (the mark stays below it).
                match handed.checked_add(count).filter(|last| *last < u64::MAX) {
                    Some(last) if last <= t.reserved => last,
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let expires_ms = ttl.map_or(t.expires_ms, |ttl| expiry_ms(now, ttl));
        let (frames, seqs, last_rel, last_crc) = encode_frames(t.last_seq + 1, expires_ms, records);
        debug_assert_eq!(seqs.last(), Some(&last));
        let path = dir.join(segment_name(t.seg_first));
        let tail = write_in_place(
            &file,
            &path,
            t,
            &frames,
            (last, last_rel, last_crc),
            expires_ms,
        )?;
        self.tails().insert(hashed.clone(), tail);
        drop(guard);
        let unsynced = sync.then(|| Unsynced::after(file, path, hashed, &tail));
        Ok(Some(Appended { seqs, unsynced }))
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
                let handed = self.handed_out(&t, &hashed, name)?;
                if t.handed_out().is_none() {
                    warn!(
                        log = name,
                        "the commit slot of a log's last segment does not check out; \
                         numbering goes on above the log's mark"
                    );
                }
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
        let next = first_after(name, handed, records.len() as u64)?;
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
                let tail = write_in_place(
                    &file,
                    &path,
                    t,
                    &frames,
                    (last, last_rel, last_crc),
                    expires_ms,
                )?;
                to_sync = Some((file, path));
                tail
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
        let unsynced = Unsynced::after(file, path, hashed, &tail);
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

#[cfg(test)]
mod tests {
    use mcp_persist_core::{Key, LogStore};

    use crate::{FileStore, FileStoreOptions, log::mark};

    const LOG: &str = "stream";

    fn notes(from: u64, count: u64) -> Vec<Vec<u8>> {
        (from..from + count)
            .map(|i| format!("note {i}").into_bytes())
            .collect()
    }

    async fn seqs_stored(store: &FileStore) -> Vec<u64> {
        let key = Key::new(LOG).expect("key");
        let records = store.read_after(&key, 0, 10_000).await.expect("read");
        records.iter().map(|r| r.seq).collect()
    }

    /// The numbers an append on the calling task hands out stay under the
    /// mark already on disk: one that would go past it is left to the
    /// blocking path, which raises the mark first. So a log set aside or
    /// cut short after such appends still never numbers a record twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_on_the_calling_task_never_goes_past_the_mark() {
        let dir = tempfile::tempdir().expect("temp dir");
        // 4,096-byte segments reserve numbers in blocks of 170.
        let options = FileStoreOptions::default().segment_bytes(4096);
        let store = FileStore::open_with(dir.path(), options)
            .await
            .expect("open");
        let logs = &store.inner.logs;
        let key = Key::new(LOG).expect("key");
        assert_eq!(
            store.append(&key, notes(1, 1), None).await.expect("append"),
            vec![1]
        );
        let (hashed, _) = logs.paths(LOG);
        let mark_dir = &logs.store.mark_dir;
        let reserved = || {
            mark::read(mark_dir, &hashed, LOG)
                .expect("mark")
                .expect("a mark")
                .reserved
        };
        let first_mark = reserved();
        assert_eq!(first_mark, 1 + logs.reserve_block());

        // Past the mark: not here, and nothing written.
        let past = first_mark;
        assert!(
            logs.try_append_in_place(LOG, &notes(2, past), None, false)
                .expect("try")
                .is_none()
        );
        assert_eq!(seqs_stored(&store).await, vec![1]);

        // Up to the mark: here, numbered on.
        let upto = first_mark - 1;
        let appended = logs
            .try_append_in_place(LOG, &notes(2, upto), None, false)
            .expect("try")
            .expect("in place");
        assert_eq!(appended.seqs, (2..=first_mark).collect::<Vec<_>>());
        assert!(
            appended.unsynced.is_none(),
            "an unsynced append needs no sync"
        );
        assert_eq!(reserved(), first_mark, "no mark write on this path");

        // The next append goes past it: the usual path raises the mark
        // before it answers.
        let seqs = store
            .append(&key, notes(first_mark + 1, 1), None)
            .await
            .expect("append");
        assert_eq!(seqs, vec![first_mark + 1]);
        assert!(reserved() > first_mark);
        assert_eq!(
            seqs_stored(&store).await,
            (1..=first_mark + 1).collect::<Vec<_>>()
        );
        assert!(store.verify().await.expect("verify").is_clean());
    }

    /// The calling task never waits for a lock: while another append holds
    /// the log's stripe the append is left to the blocking pool, and
    /// nothing is written meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_on_the_calling_task_never_waits_for_the_stripe() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = FileStore::open(dir.path()).await.expect("open");
        let logs = &store.inner.logs;
        let key = Key::new(LOG).expect("key");
        store.append(&key, notes(1, 1), None).await.expect("append");
        let (hashed, _) = logs.paths(LOG);

        let held = logs.store.lock_stripe("log", &hashed).expect("lock");
        assert!(
            logs.try_append_in_place(LOG, &notes(2, 1), None, false)
                .expect("try")
                .is_none()
        );
        // Another handle on the same folder holds it through its file lock.
        let other = FileStore::open(dir.path()).await.expect("open again");
        drop(held);
        let other_held = other
            .inner
            .logs
            .store
            .lock_stripe("log", &hashed)
            .expect("lock");
        assert!(
            logs.try_append_in_place(LOG, &notes(2, 1), None, false)
                .expect("try")
                .is_none()
        );
        assert_eq!(seqs_stored(&store).await, vec![1]);
        drop(other_held);

        let appended = logs
            .try_append_in_place(LOG, &notes(2, 1), None, false)
            .expect("try")
            .expect("in place once the stripe is free");
        assert_eq!(appended.seqs, vec![2]);
        assert_eq!(seqs_stored(&other).await, vec![1, 2]);
    }

    /// A synced append is done on the calling task only when it can join a
    /// group commit round that others are waiting for; a lone one syncs on
    /// the blocking thread that wrote it (no hand-over to the sync thread),
    /// and with group commit off every synced append syncs its own file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_synced_append_is_left_to_the_blocking_pool() {
        let dir = tempfile::tempdir().expect("temp dir");
        for group_commit in [true, false] {
            let options = FileStoreOptions::default().group_commit(group_commit);
            let store = FileStore::open_with(dir.path().join(group_commit.to_string()), options)
                .await
                .expect("open");
            let logs = &store.inner.logs;
            let key = Key::new(LOG).expect("key");
            store.append(&key, notes(1, 1), None).await.expect("append");
            assert!(
                logs.try_append_in_place(LOG, &notes(2, 1), None, true)
                    .expect("try")
                    .is_none()
            );
            let unsynced = logs
                .try_append_in_place(LOG, &notes(2, 1), None, false)
                .expect("try")
                .expect("an unsynced append is done here");
            assert_eq!(unsynced.seqs, vec![2]);
        }
    }

    /// With [`FileStoreOptions::appends_on_caller`] off every append goes
    /// to the blocking pool, and appends still number on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_on_caller_off_leaves_every_append_to_the_blocking_pool() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = FileStoreOptions::default().appends_on_caller(false);
        let store = FileStore::open_with(dir.path(), options)
            .await
            .expect("open");
        let key = Key::new(LOG).expect("key");
        store.append(&key, notes(1, 1), None).await.expect("append");
        assert!(
            store
                .inner
                .logs
                .try_append_in_place(LOG, &notes(2, 1), None, false)
                .expect("try")
                .is_none()
        );
        let seqs = store
            .append_unsynced(&key, notes(2, 2), None)
            .await
            .expect("append");
        assert_eq!(seqs, vec![2, 3]);
        assert_eq!(seqs_stored(&store).await, vec![1, 2, 3]);
    }
}
