//! Logs: a directory per log of append-only segment files.
//!
//! A log lives in `log/<hex SHA-256 of its name>/`. Its records are in
//! segment files named by their first sequence number (`00000000000000000001.seg`),
//! each starting with a header and followed by frames:
//!
//! | segment header | size | | frame | size |
//! |---|---|---|---|---|
//! | magic `MPLG` | 4 | | data length | 4 |
//! | log format (1) | 1 | | CRC-32 of seq, expiry and data | 4 |
//! | reserved | 3 | | sequence number | 8 |
//! | first sequence number | 8 | | log expiry, Unix ms (0: none) | 8 |
//! | name length | 4 | | data | |
//! | CRC-32 of the above and the name | 4 | | | |
//! | log name | | | | |
//!
//! A segment is created whole (temporary file, fsync, rename, directory
//! fsync) with the first batch in it, so it always holds at least one
//! record. Later batches are written at its end and fdatasynced before the
//! append returns. Sequence numbers are contiguous: a segment starts at the
//! number after the last one of the segment before it, and each frame
//! carries the number after the previous frame's. u64::MAX is never used.
//! Every frame carries the log's expiry as of its append, so the last frame
//! says whether the whole log has expired. `trim.json` holds the sequence
//! number below which records are dropped, and, for a log set aside by
//! [`FileStore::quarantine_log`](crate::FileStore::quarantine_log), the
//! number its numbering goes on from.
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
//! Anything else is damage, never cut: a bad frame in any other segment, a
//! bad checksum followed by more bytes, a length larger than any record, a
//! frame with a good checksum but the wrong sequence number, a segment whose
//! header does not match its name, a missing segment. It is
//! [`Error::Corrupt`] naming the log, the segment and the byte, with a
//! `tracing` warning; appends and trims refuse while the last segment is
//! damaged, so no number is handed out twice.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufReader, Read, Seek},
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    time::Duration,
};

use mcp_persist_core::{Error, LogRecord, backend::MAX_KEY_BYTES};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::{
    STALE_TEMP_AGE,
    commit::{Syncer, syncfs},
    fsio::{
        ensure_private_dir, expiry_ms, hashed_name, io, io_error, is_hashed_name, is_live,
        remove_stale_temps, sync_dir, u32_at, u64_at, unix_micros, unix_ms, write_atomic,
    },
    store::Inner,
    tail::Tail,
};

const MAGIC: &[u8; 4] = b"MPLG";
/// The segment format this build writes and the newest it reads.
pub(crate) const LOG_FORMAT: u8 = 1;
const SEGMENT_FIXED: usize = 24;
const FRAME: usize = 24;
const TRIM_FILE: &str = "trim.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Trim {
    /// Records with a smaller sequence number are dropped.
    trim_before: u64,
    /// Numbering continues at least here, even with no segment left: set
    /// when a damaged log is set aside, so its numbers are never reused.
    #[serde(default, skip_serializing_if = "is_zero")]
    next_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The first sequence numbers of a log's segments, sorted; `None` when the
/// log directory does not exist.
fn list_segments(dir: &Path) -> Result<Option<Vec<u64>>, Error> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("list", dir, e)),
    };
    let mut firsts = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("list", dir))?;
        if let Some(first) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".seg"))
            .filter(|n| n.len() == 20)
            .and_then(|n| n.parse::<u64>().ok())
        {
            firsts.push(first);
        }
    }
    firsts.sort_unstable();
    Ok(Some(firsts))
}

fn encode_segment_header(first: u64, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(SEGMENT_FIXED + name.len());
    out.extend_from_slice(MAGIC);
    out.push(LOG_FORMAT);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&first.to_le_bytes());
    let name_len = u32::try_from(name.len()).expect("log names are at most 1 KiB");
    out.extend_from_slice(&name_len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out);
    hasher.update(name.as_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// A checked segment header.
struct SegmentHeader {
    first: u64,
    name: String,
    len: u64,
}

/// Reads and checks a segment header. `Err` holds the typed error to return
/// (`key` names the log when the caller knows it).
fn read_segment_header(file: &File, key: Option<&str>) -> Result<SegmentHeader, Error> {
    let corrupt =
        |reason: &str| Error::corrupt(key.unwrap_or("<log>"), format!("log segment: {reason}"));
    let mut fixed = [0u8; SEGMENT_FIXED];
    file.read_exact_at(&mut fixed, 0)
        .map_err(|_| corrupt("shorter than its header"))?;
    if &fixed[..4] != MAGIC {
        return Err(corrupt("not a log segment (bad magic)"));
    }
    if fixed[4] > LOG_FORMAT {
        return Err(Error::NewerSchema {
            key: key.unwrap_or("<log>").to_owned(),
            found: u32::from(fixed[4]),
            supported: u32::from(LOG_FORMAT),
        });
    }
    let name_len = u32_at(&fixed, 16) as usize;
    if name_len > MAX_KEY_BYTES {
        return Err(corrupt("header names an over-long log"));
    }
    let mut name = vec![0u8; name_len];
    file.read_exact_at(&mut name, SEGMENT_FIXED as u64)
        .map_err(|_| corrupt("truncated inside its header"))?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&fixed[..20]);
    hasher.update(&name);
    if hasher.finalize() != u32_at(&fixed, 20) {
        return Err(corrupt("header checksum mismatch"));
    }
    let name = String::from_utf8(name).map_err(|_| corrupt("log name is not UTF-8"))?;
    if key.is_some_and(|k| k != name) {
        return Err(corrupt("segment belongs to another log"));
    }
    Ok(SegmentHeader {
        first: u64_at(&fixed, 8),
        name,
        len: (SEGMENT_FIXED + name_len) as u64,
    })
}

/// Reads a segment header and checks it against the segment's name.
fn checked_header(file: &File, name: &str, first: u64) -> Result<SegmentHeader, Error> {
    let header = read_segment_header(file, Some(name))?;
    if header.first != first || first == 0 {
        return Err(damage(
            name,
            first,
            0,
            &format!("header says the segment starts at {}", header.first),
        ));
    }
    Ok(header)
}

/// The error for damage found in a log (anything but a torn tail), with a
/// warning. Nothing is cut or removed: the bytes stay where they are.
fn damage(name: &str, segment: u64, at: u64, reason: &str) -> Error {
    warn!(
        log = name,
        segment,
        offset = at,
        reason,
        "found damage in a log (not a torn tail); its files are kept as they are"
    );
    Error::corrupt(
        name,
        format!(
            "log segment {} at byte {at}: {reason}; nothing was cut \
             (FileStore::quarantine_log sets the log aside)",
            segment_name(segment)
        ),
    )
}

/// What [`Inner::scan_tail`] does with a torn tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Leaves it (readers stop before it).
    No,
    /// Cuts it if the segment can be written (a read).
    IfWritable,
    /// Cuts it, or fails (an append or a trim).
    Must,
}

/// Encodes `records` as frames numbered from `first_seq`. Returns the bytes,
/// the sequence numbers, and the offset and checksum of the last frame.
fn encode_frames(
    first_seq: u64,
    expires_ms: u64,
    records: &[Vec<u8>],
) -> (Vec<u8>, Vec<u64>, u64, u32) {
    let size = records.iter().map(|r| FRAME + r.len()).sum();
    let mut out = Vec::with_capacity(size);
    let mut seqs = Vec::with_capacity(records.len());
    let (mut last_off, mut last_crc) = (0, 0);
    for (i, data) in records.iter().enumerate() {
        let seq = first_seq + i as u64;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&seq.to_le_bytes());
        hasher.update(&expires_ms.to_le_bytes());
        hasher.update(data);
        let crc = hasher.finalize();
        last_off = out.len() as u64;
        last_crc = crc;
        let len = u32::try_from(data.len()).expect("records are at most the 16 MiB limit");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&expires_ms.to_le_bytes());
        out.extend_from_slice(data);
        seqs.push(seq);
    }
    (out, seqs, last_off, last_crc)
}

/// One step of reading frames.
enum Step {
    Frame {
        off: u64,
        seq: u64,
        expires_ms: u64,
        crc: u32,
        /// Read and checked only for frames at or after the wanted sequence.
        data: Option<Vec<u8>>,
    },
    End,
    /// What starts at byte `at` is not a good frame.
    Bad {
        at: u64,
        reason: String,
        /// Whether it has the shape an interrupted append leaves (see
        /// [`Frames::torn_shape`]). It is a torn tail only in the last
        /// segment; anywhere else it is damage.
        torn: bool,
    },
}

/// Reads the frames of one segment between two offsets, checking that they
/// are numbered one after another from `expect`.
struct Frames {
    reader: BufReader<File>,
    pos: u64,
    limit: u64,
    max_len: u64,
    /// The sequence number the next frame must carry (`None`: none can
    /// follow, the numbering is exhausted).
    expect: Option<u64>,
    /// Whether to tell a torn tail from damage when a frame is bad (only
    /// worth the extra reading in a last segment).
    classify: bool,
}

impl Frames {
    fn new(
        file: File,
        start: u64,
        limit: u64,
        max_len: usize,
        expect: Option<u64>,
        classify: bool,
    ) -> io::Result<Self> {
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        reader.seek(io::SeekFrom::Start(start))?;
        Ok(Frames {
            reader,
            pos: start,
            limit,
            max_len: max_len as u64,
            expect,
            classify,
        })
    }

    fn bad(&self, reason: impl Into<String>, torn: bool) -> Step {
        Step::Bad {
            at: self.pos,
            reason: reason.into(),
            torn,
        }
    }

    /// The next frame; its data is read (and its checksum checked) only when
    /// its sequence number is at least `want_from`, or is not the expected one.
    fn next(&mut self, want_from: u64) -> io::Result<Step> {
        if self.pos >= self.limit {
            return Ok(Step::End);
        }
        let remaining = self.limit - self.pos;
        if remaining < FRAME as u64 {
            // Nothing complete can follow a partial header.
            return Ok(self.bad("partial frame header at the end", true));
        }
        let mut head = [0u8; FRAME];
        self.reader.read_exact(&mut head)?;
        let len = u64::from(u32_at(&head, 0));
        let crc = u32_at(&head, 4);
        let seq = u64_at(&head, 8);
        let expires_ms = u64_at(&head, 16);
        if len > self.max_len {
            // An interrupted append never writes a length it could not have
            // written whole: this is damage, wherever it is.
            return Ok(self.bad(
                format!("frame length {len} is larger than any record"),
                false,
            ));
        }
        let size = FRAME as u64 + len;
        if size > remaining {
            let torn = self.classify && self.torn_shape(true)?;
            return Ok(self.bad("frame runs past the end of the segment", torn));
        }
        let expected = self.expect == Some(seq) && seq != u64::MAX;
        let data = if seq >= want_from || !expected {
            let mut data = vec![0u8; len as usize];
            self.reader.read_exact(&mut data)?;
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&head[8..]);
            hasher.update(&data);
            if hasher.finalize() != crc {
                let torn = self.classify && self.torn_shape(size == remaining)?;
                return Ok(self.bad("frame checksum mismatch", torn));
            }
            Some(data)
        } else {
            self.reader.seek_relative(len as i64)?;
            None
        };
        if !expected {
            // A whole frame with a good checksum in the wrong place: no crash
            // writes that.
            let reason = match self.expect {
                _ if seq == u64::MAX => format!("impossible sequence number {seq}"),
                Some(want) => format!("frame numbered {seq} where {want} belongs"),
                None => format!("frame numbered {seq} after the last possible number"),
            };
            return Ok(self.bad(reason, false));
        }
        let off = self.pos;
        self.pos += size;
        self.expect = seq.checked_add(1);
        Ok(Step::Frame {
            off,
            seq,
            expires_ms,
            crc,
            data,
        })
    }

    /// Whether the bad frame at `self.pos` has the shape an interrupted
    /// append leaves: everything from it to the end is zero bytes (a power
    /// cut that extended the file but not its contents), or the frame
    /// reaches the end of the file (`to_end`) and no intact frame starts
    /// anywhere after its first byte (so a damaged length field, which
    /// makes a middle frame look like it runs past the end, is not taken
    /// for a torn tail).
    fn torn_shape(&self, to_end: bool) -> io::Result<bool> {
        let Ok(size) = usize::try_from(self.limit - self.pos) else {
            return Ok(false);
        };
        let mut rest = vec![0u8; size];
        self.reader.get_ref().read_exact_at(&mut rest, self.pos)?;
        if rest.iter().all(|b| *b == 0) {
            return Ok(true);
        }
        Ok(to_end && !self.intact_frame_in(&rest))
    }

    /// Whether an intact frame (a length that fits, a sequence number the
    /// log could have reached, a good checksum) starts in `rest` after its
    /// first byte.
    fn intact_frame_in(&self, rest: &[u8]) -> bool {
        let Some(lowest) = self.expect else {
            return false;
        };
        // Every frame takes at least FRAME bytes, which bounds the numbers.
        let highest = lowest.saturating_add((rest.len() / FRAME) as u64);
        (1..rest.len().saturating_sub(FRAME - 1)).any(|k| {
            let head = &rest[k..k + FRAME];
            let seq = u64_at(head, 8);
            if seq < lowest || seq > highest || seq == u64::MAX {
                return false;
            }
            let len = u64::from(u32_at(head, 0));
            let end = (k + FRAME) as u64 + len;
            if len > self.max_len || end > rest.len() as u64 {
                return false;
            }
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&head[8..]);
            hasher.update(&rest[k + FRAME..end as usize]);
            hasher.finalize() == u32_at(head, 4)
        })
    }
}

/// A synced append's share of a group commit round: its segment alone, or
/// the whole filesystem for a round of several.
struct SegmentSync<'a> {
    file: &'a File,
    root: &'a File,
}

impl Syncer for SegmentSync<'_> {
    fn sync_one(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        syncfs(self.root)
    }
}

/// What [`Inner::verify_logs`] found.
#[derive(Debug, Default)]
pub(crate) struct LogCheck {
    pub(crate) logs: u64,
    pub(crate) records: u64,
    pub(crate) torn_bytes: u64,
    pub(crate) problems: Vec<String>,
}

impl Inner {
    fn log_paths(&self, name: &str) -> (String, PathBuf) {
        let hashed = hashed_name("log", name);
        let dir = self.log_dir.join(&hashed);
        (hashed, dir)
    }

    /// Finds where a log ends, starting from this handle's last look when
    /// that still matches the file. A torn tail is cut as `cut` says (only
    /// under the log's lock); damage is an error and nothing is cut. `None`
    /// when the log has no segment.
    fn scan_tail(
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
        let meta = file.metadata().map_err(io("inspect", &path))?;
        self.check_file_mode(&path, &meta);
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
                let tail = Tail {
                    seg_first: first,
                    ino: meta.ino(),
                    last_off: header.len,
                    // The header check proved first >= 1.
                    last_seq: first - 1,
                    last_crc: 0,
                    end: header.len,
                    expires_ms: 0,
                };
                (tail, false, Some(first))
            }
        };
        let reader = file.try_clone().map_err(io("open", &path))?;
        let mut frames = Frames::new(
            reader,
            tail.end,
            len,
            self.options.max_value_bytes,
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

    /// The first time this handle touches a log, takes its lock and cuts a
    /// torn tail, so nothing is ever appended after garbage.
    fn ensure_recovered(&self, hashed: &str, dir: &Path, name: &str) -> Result<(), Error> {
        if self.recovered().contains(hashed) {
            return Ok(());
        }
        let _guard = self.lock_stripe("log", hashed)?;
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

    fn read_trim(dir: &Path, name: &str) -> Result<Trim, Error> {
        let path = dir.join(TRIM_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Trim>(&bytes).map_err(|e| Error::Corrupt {
                key: name.to_owned(),
                reason: "the log's trim point does not parse".into(),
                source: Some(Box::new(e)),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Trim::default()),
            Err(e) => Err(io_error("read", &path, e)),
        }
    }

    fn write_trim(dir: &Path, trim: &Trim) -> Result<(), Error> {
        let bytes = serde_json::to_vec(trim).map_err(|e| Error::backend(crate::fsio::NAME, e))?;
        write_atomic(dir, TRIM_FILE, &[&bytes])
    }

    /// Appends `records` to log `name`. With `sync`, the frames are
    /// fdatasynced before this returns (they survive a power cut);
    /// without, they are written to the file (they survive a crash of this
    /// process, and other processes read them at once). A new segment is
    /// always created whole and synced.
    pub(crate) fn log_append(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Vec<u64>, Error> {
        let (hashed, dir) = self.log_paths(name);
        let guard = self.lock_stripe("log", &hashed)?;
        ensure_private_dir(&dir)?;
        let now = unix_ms();
        let tail = self.scan_tail(&hashed, &dir, name, Cut::Must)?;
        self.recovered().insert(hashed.clone());
        let (last_seq, carried_expiry, current) = match tail {
            // A log set aside for damage goes on above its old numbers.
            None => (
                Self::read_trim(&dir, name)?.next_seq.saturating_sub(1),
                0,
                None,
            ),
            Some((t, segments)) if !is_live(t.expires_ms, now) => {
                // The whole log expired: its records go, numbering goes on.
                for first in &segments {
                    let path = dir.join(segment_name(*first));
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_error("remove", &path, e)),
                    }
                }
                sync_dir(&dir)?;
                self.tails().remove(&hashed);
                debug!(log = name, "discarded an expired log before appending");
                (t.last_seq, 0, None)
            }
            Some((t, _)) => (t.last_seq, t.expires_ms, Some(t)),
        };
        let expires_ms = ttl.map_or(carried_expiry, |ttl| expiry_ms(now, ttl));
        // u64::MAX is never a sequence number, so every read can add one.
        let count = records.len() as u64;
        let Some(next) = last_seq
            .checked_add(1)
            .filter(|next| next.checked_add(count).is_some())
        else {
            return Err(Error::corrupt(
                name,
                format!("the log's sequence numbers are exhausted (last {last_seq})"),
            ));
        };
        let (frames, seqs, last_rel, last_crc) = encode_frames(next, expires_ms, records);
        let last = *seqs.last().expect("append is never called without records");
        // The segment written in place, to sync once the lock is released.
        let mut to_sync = None;
        let tail = match current {
            Some(t) if t.end < self.options.segment_bytes => {
                let path = dir.join(segment_name(t.seg_first));
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io("open for appending", &path))?;
                file.write_all_at(&frames, t.end)
                    .map_err(io("write", &path))?;
                to_sync = Some((file, path));
                Tail {
                    last_off: t.end + last_rel,
                    last_seq: last,
                    last_crc,
                    end: t.end + frames.len() as u64,
                    expires_ms,
                    ..t
                }
            }
            full => {
                if let Some(t) = full {
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
                let first = next;
                let header = encode_segment_header(first, name);
                let seg = segment_name(first);
                write_atomic(&dir, &seg, &[&header, &frames])?;
                let path = dir.join(&seg);
                let ino = fs::metadata(&path).map_err(io("inspect", &path))?.ino();
                debug!(log = name, first, "started a log segment");
                Tail {
                    seg_first: first,
                    ino,
                    last_off: header.len() as u64 + last_rel,
                    last_seq: last,
                    last_crc,
                    end: (header.len() + frames.len()) as u64,
                    expires_ms,
                }
            }
        };
        self.tails().insert(hashed, tail);
        drop(guard);
        // Synced outside the log's lock, so appends to other logs of the same
        // lock stripe (and the next append to this one) go on meanwhile, and
        // appends to many logs share syncs (group commit). Nothing is lost by
        // the wait: the frames are in the file, readers may see them (as of
        // any write), and the caller hears of them only after this.
        if let (true, Some((file, path))) = (sync, to_sync) {
            match &self.group {
                Some(group) => group.rounds.sync(&SegmentSync {
                    file: &file,
                    root: &group.root,
                }),
                None => file.sync_data(),
            }
            .map_err(io("fsync", &path))?;
        }
        Ok(seqs)
    }

    /// Walks the frames of a log from the segment holding `start` to the
    /// end `tail` saw, checking that each segment follows the one before.
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
        // The number the next segment must start at, once known.
        let mut expect: Option<u64> = None;
        for &first in &segments[from..] {
            if first > tail.seg_first {
                break;
            }
            let path = dir.join(segment_name(first));
            let file = match File::open(&path) {
                Ok(file) => file,
                // Trimmed away by another process meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    expect = None;
                    continue;
                }
                Err(e) => return Err(io_error("open", &path, e)),
            };
            let header = checked_header(&file, name, first)?;
            if let Some(want) = expect
                && want != first
            {
                return Err(damage(
                    name,
                    first,
                    0,
                    &format!(
                        "the segment starts at {first} but the one before it ends below \
                         {want}: a segment is missing or out of place"
                    ),
                ));
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
                self.options.max_value_bytes,
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
            expect = frames.expect;
        }
        Ok(())
    }

    pub(crate) fn log_read(
        &self,
        name: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogRecord>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (hashed, dir) = self.log_paths(name);
        self.ensure_recovered(&hashed, &dir, name)?;
        let Some((tail, segments)) = self.scan_tail(&hashed, &dir, name, Cut::No)? else {
            return Ok(Vec::new());
        };
        if !is_live(tail.expires_ms, unix_ms()) {
            return Ok(Vec::new());
        }
        let start = after
            .saturating_add(1)
            .max(Self::read_trim(&dir, name)?.trim_before);
        if start > tail.last_seq {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        self.walk_frames(name, &dir, &segments, &tail, (start, start), |seq, data| {
            if let Some(data) = data {
                out.push(LogRecord::new(seq, data));
            }
            out.len() < limit
        })?;
        Ok(out)
    }

    pub(crate) fn log_trim(&self, name: &str, before: u64) -> Result<u64, Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        let Some((tail, segments)) = self.scan_tail(&hashed, &dir, name, Cut::Must)? else {
            return Ok(0);
        };
        self.recovered().insert(hashed.clone());
        if !is_live(tail.expires_ms, unix_ms()) {
            return Ok(0);
        }
        let mut trim = Self::read_trim(&dir, name)?;
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
        Self::write_trim(&dir, &trim)?;
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

    /// Moves a log directory into the trash (one atomic rename) and removes it.
    fn remove_log_dir(&self, hashed: &str, dir: &Path) -> Result<bool, Error> {
        let trash = self.trash_dir.join(format!("{hashed}.{}", unix_micros()));
        match fs::rename(dir, &trash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error("move into the trash", dir, e)),
        }
        sync_dir(&self.log_dir)?;
        self.tails().remove(hashed);
        if let Err(e) = fs::remove_dir_all(&trash) {
            warn!(path = %trash.display(), error = %e, "could not empty the trash");
        }
        Ok(true)
    }

    pub(crate) fn log_delete(&self, name: &str) -> Result<(), Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        self.remove_log_dir(&hashed, &dir)?;
        Ok(())
    }

    /// Sets a log aside: moves its segment files into
    /// `quarantine/log-<hashed name>.<micros>/`, untouched, and lets the log
    /// go on empty, numbered above every sequence number it could have
    /// handed out. Returns where the files went, or `None` for a log with
    /// no segment.
    ///
    /// Crash-safe and idempotent: the new numbering floor is written before
    /// any file moves, segments move lowest first (so a log interrupted
    /// halfway still ends with its own last segment), and the trim point is
    /// raised last.
    pub(crate) fn log_quarantine(&self, name: &str) -> Result<Option<PathBuf>, Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        let Some(segments) = list_segments(&dir)? else {
            return Ok(None);
        };
        if segments.is_empty() {
            return Ok(None);
        }
        ensure_private_dir(&self.quarantine_dir)?;
        let target = self
            .quarantine_dir
            .join(format!("log-{hashed}.{}", unix_micros()));
        ensure_private_dir(&target)?;
        let mut trim = match Self::read_trim(&dir, name) {
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
        // A segment of `len` bytes holds at most `len / FRAME` frames,
        // numbered from its first: this is above every number handed out,
        // whatever the damage hides.
        let mut next = trim.next_seq.max(trim.trim_before).max(1);
        for &first in &segments {
            let path = dir.join(segment_name(first));
            let len = fs::metadata(&path).map_err(io("inspect", &path))?.len();
            next = next.max(first.saturating_add(len / FRAME as u64));
        }
        trim.next_seq = next;
        Self::write_trim(&dir, &trim)?;
        for &first in &segments {
            let seg = segment_name(first);
            let path = dir.join(&seg);
            fs::rename(&path, target.join(&seg)).map_err(io("move into quarantine", &path))?;
        }
        sync_dir(&target)?;
        sync_dir(&dir)?;
        trim.trim_before = next;
        Self::write_trim(&dir, &trim)?;
        self.tails().remove(&hashed);
        self.recovered().remove(&hashed);
        warn!(
            log = name,
            kept = %target.display(),
            next_seq = next,
            "set a log aside in quarantine; it goes on empty, numbered above its old records"
        );
        Ok(Some(target))
    }

    /// Deletes every log expired for longer than the sweep margin (all its
    /// segments at once), and what crashed writers left behind.
    pub(crate) fn log_sweep(&self) -> Result<u64, Error> {
        let cutoff = self.sweep_cutoff_ms(unix_ms());
        let mut removed = 0;
        let entries = fs::read_dir(&self.log_dir).map_err(io("list", &self.log_dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.log_dir))?;
            let Some(hashed) = entry
                .file_name()
                .to_str()
                .filter(|n| is_hashed_name(n))
                .map(str::to_owned)
            else {
                continue;
            };
            let dir = entry.path();
            let _guard = self.lock_stripe("log", &hashed)?;
            let Some(segments) = list_segments(&dir)? else {
                continue;
            };
            let Some(&last) = segments.last() else {
                // A log whose only segment was never written (or whose
                // expired records were discarded): nothing to keep, unless
                // it was set aside for damage and must go on numbering above
                // its old records.
                let keeps_numbering = fs::read(dir.join(TRIM_FILE)).is_ok_and(|bytes| {
                    !serde_json::from_slice::<Trim>(&bytes).is_ok_and(|trim| trim.next_seq == 0)
                });
                if !keeps_numbering {
                    self.remove_log_dir(&hashed, &dir)?;
                }
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
        self.empty_trash();
        Ok(removed)
    }

    /// Reads every segment of every log in full and reports what does not
    /// check out. A torn tail not cut yet is counted, not a problem.
    pub(crate) fn verify_logs(&self) -> Result<LogCheck, Error> {
        let mut check = LogCheck::default();
        let entries = fs::read_dir(&self.log_dir).map_err(io("list", &self.log_dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.log_dir))?;
            let Some(hashed) = entry
                .file_name()
                .to_str()
                .filter(|n| is_hashed_name(n))
                .map(str::to_owned)
            else {
                continue;
            };
            let dir = entry.path();
            let Some(segments) = list_segments(&dir)? else {
                continue;
            };
            check.logs += 1;
            // The number the next segment must start at, once known.
            let mut expect: Option<u64> = None;
            for (i, &first) in segments.iter().enumerate() {
                let is_last = i + 1 == segments.len();
                let path = dir.join(segment_name(first));
                let mut label = format!("log/{hashed}/{}", segment_name(first));
                let Ok(file) = File::open(&path) else {
                    expect = None;
                    continue;
                };
                let header = match read_segment_header(&file, None) {
                    Ok(header) => header,
                    Err(e) => {
                        check.problems.push(format!("{label}: {e}"));
                        expect = None;
                        continue;
                    }
                };
                if hashed_name("log", &header.name) != hashed || header.first != first || first == 0
                {
                    check
                        .problems
                        .push(format!("{label}: header does not match its place"));
                    expect = None;
                    continue;
                }
                // The header is sound: name the log, for `quarantine_log`.
                label = format!("log {} ({label})", header.name);
                if let Some(want) = expect
                    && want != first
                {
                    check.problems.push(format!(
                        "{label}: starts at {first} but the segment before it ends below {want}: \
                         a segment is missing or out of place"
                    ));
                }
                let len = file.metadata().map_err(io("inspect", &path))?.len();
                let mut frames = Frames::new(
                    file,
                    header.len,
                    len,
                    self.options.max_value_bytes,
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
                            } else {
                                check
                                    .problems
                                    .push(format!("{label}: {reason} at byte {at}"));
                            }
                            break false;
                        }
                    }
                };
                if count == 0 {
                    check
                        .problems
                        .push(format!("{label}: holds no readable record"));
                }
                // Where a damaged segment really ends is unknown: the next
                // one is not judged by it.
                expect = if whole { frames.expect } else { None };
            }
        }
        Ok(check)
    }
}
