//! Logs: a directory per log of append-only segment files.
//!
//! A log lives in `log/<hex SHA-256 of its name>/`. Its records are in
//! segment files named by their first sequence number (`00000000000000000001.seg`),
//! each starting with a header and followed by frames. Segments of format 2
//! (written since the numbering mark) have this header:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `MPLG` |
//! | 4 | 1 | log format (2) |
//! | 5 | 3 | reserved |
//! | 8 | 8 | first sequence number |
//! | 16 | 8 | the number it follows: the last one of the segment before it (first - 1, unless numbers were skipped) |
//! | 24 | 4 | name length |
//! | 28 | 4 | CRC-32 of bytes 0..28 and the name |
//! | 32 | 8 | commit slot: the highest number handed out by an append to it |
//! | 40 | 8 | commit slot: every frame up to this number had been synced |
//! | 48 | 8 | commit slot: first number of the segment started after it (0: none) |
//! | 56 | 4 | commit slot: CRC-32 of bytes 32..56 |
//! | 60 | 4 | reserved |
//! | 64 | | log name |
//!
//! Format 1 headers (still read, never written) are bytes 0..16 as above,
//! then the name length, the CRC-32 of bytes 0..20 and the name, then the
//! name at byte 24; they have no commit slot and follow `first - 1`. Frames:
//!
//! | frame | size |
//! |---|---|
//! | data length | 4 |
//! | CRC-32 of seq, expiry and data | 4 |
//! | sequence number | 8 |
//! | log expiry, Unix ms (0: none) | 8 |
//! | data | |
//!
//! A segment is created whole (temporary file, fsync, rename, directory
//! fsync) with the first batch in it, so it always holds at least one
//! record. Later batches are written at its end, then the commit slot is
//! rewritten in place (it is in the first sector, so it is written whole),
//! and both are fdatasynced before the append returns. Sequence numbers are
//! contiguous within a segment, and a segment starts above the number it
//! follows; u64::MAX is never used. Every frame carries the log's expiry as
//! of its append, so the last frame says whether the whole log has expired.
//! `trim.json` holds the sequence number below which records are dropped,
//! and, for a log set aside by
//! [`FileStore::quarantine_log`](crate::FileStore::quarantine_log), the
//! number its numbering goes on from. The log's numbering mark is outside
//! its directory ([`crate::mark`]).
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
//!
//! Anything else is damage, never cut: a bad frame in any other segment, a
//! bad checksum followed by more bytes, a length larger than any record, a
//! frame with a good checksum but the wrong sequence number, a segment whose
//! header does not match its name or does not follow the one before it, a
//! missing segment (first, middle or last), a log whose segments or
//! directory are gone while its numbering mark remains. It is
//! [`Error::Corrupt`] naming the log (and the segment and the byte where
//! there is one), with a `tracing` warning; appends and trims refuse while
//! the last segment is damaged, so no number is handed out twice.

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
    mark,
    store::Inner,
    tail::{Slot, Tail},
};

const MAGIC: &[u8; 4] = b"MPLG";
/// The segment format this build writes and the newest it reads.
pub(crate) const LOG_FORMAT: u8 = 2;
/// Bytes before the name in a format 1 header.
const V1_FIXED: usize = 24;
/// Bytes before the name in a format 2 header: the header, then the slot.
const V2_FIXED: usize = 64;
/// Where the commit slot of a format 2 segment is, and its size.
const SLOT_AT: u64 = 32;
const SLOT: usize = 32;
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

fn encode_slot(slot: Slot) -> [u8; SLOT] {
    let mut out = [0u8; SLOT];
    out[0..8].copy_from_slice(&slot.issued.to_le_bytes());
    out[8..16].copy_from_slice(&slot.synced.to_le_bytes());
    out[16..24].copy_from_slice(&slot.next.to_le_bytes());
    let crc = crc32fast::hash(&out[..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The commit slot in `bytes` (at least [`SLOT`] long), if it checks out.
fn decode_slot(bytes: &[u8]) -> Option<Slot> {
    let bytes = bytes.get(..SLOT)?;
    (crc32fast::hash(&bytes[..24]) == u32_at(bytes, 24)).then(|| Slot {
        issued: u64_at(bytes, 0),
        synced: u64_at(bytes, 8),
        next: u64_at(bytes, 16),
    })
}

/// Reads the commit slot of a segment, if it has one that checks out (a
/// format 1 segment has none; what is there does not check out).
fn read_slot(file: &File) -> Option<Slot> {
    let mut bytes = [0u8; SLOT];
    file.read_exact_at(&mut bytes, SLOT_AT).ok()?;
    decode_slot(&bytes)
}

fn write_slot(file: &File, path: &Path, slot: Slot) -> Result<(), Error> {
    file.write_all_at(&encode_slot(slot), SLOT_AT)
        .map_err(io("write", path))
}

fn encode_segment_header(first: u64, follows: u64, name: &str, slot: Slot) -> Vec<u8> {
    let mut out = Vec::with_capacity(V2_FIXED + name.len());
    out.extend_from_slice(MAGIC);
    out.push(LOG_FORMAT);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&follows.to_le_bytes());
    let name_len = u32::try_from(name.len()).expect("log names are at most 1 KiB");
    out.extend_from_slice(&name_len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out);
    hasher.update(name.as_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&encode_slot(slot));
    out.extend_from_slice(name.as_bytes());
    out
}

/// A checked segment header.
struct SegmentHeader {
    first: u64,
    /// The last number of the segment before it (`first - 1` in format 1).
    follows: u64,
    name: String,
    /// Where its frames start.
    len: u64,
    format: u8,
}

/// Reads and checks a segment header. `Err` holds the typed error to return
/// (`key` names the log when the caller knows it).
fn read_segment_header(file: &File, key: Option<&str>) -> Result<SegmentHeader, Error> {
    let corrupt =
        |reason: &str| Error::corrupt(key.unwrap_or("<log>"), format!("log segment: {reason}"));
    let mut fixed = [0u8; 32];
    file.read_exact_at(&mut fixed[..V1_FIXED], 0)
        .map_err(|_| corrupt("shorter than its header"))?;
    if &fixed[..4] != MAGIC {
        return Err(corrupt("not a log segment (bad magic)"));
    }
    let format = fixed[4];
    if format > LOG_FORMAT {
        return Err(Error::NewerSchema {
            key: key.unwrap_or("<log>").to_owned(),
            found: u32::from(format),
            supported: u32::from(LOG_FORMAT),
        });
    }
    let first = u64_at(&fixed, 8);
    // (the number it follows, name length, header checksum, bytes it
    // covers, where the name is)
    let (follows, name_len, crc, covered, name_at) = if format >= 2 {
        file.read_exact_at(&mut fixed[V1_FIXED..], V1_FIXED as u64)
            .map_err(|_| corrupt("shorter than its header"))?;
        (
            u64_at(&fixed, 16),
            u32_at(&fixed, 24),
            u32_at(&fixed, 28),
            28,
            V2_FIXED,
        )
    } else {
        let follows = first.saturating_sub(1);
        (
            follows,
            u32_at(&fixed, 16),
            u32_at(&fixed, 20),
            20,
            V1_FIXED,
        )
    };
    let name_len = name_len as usize;
    if name_len > MAX_KEY_BYTES {
        return Err(corrupt("header names an over-long log"));
    }
    let mut name = vec![0u8; name_len];
    file.read_exact_at(&mut name, name_at as u64)
        .map_err(|_| corrupt("truncated inside its header"))?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&fixed[..covered]);
    hasher.update(&name);
    if hasher.finalize() != crc {
        return Err(corrupt("header checksum mismatch"));
    }
    let name = String::from_utf8(name).map_err(|_| corrupt("log name is not UTF-8"))?;
    if key.is_some_and(|k| k != name) {
        return Err(corrupt("segment belongs to another log"));
    }
    Ok(SegmentHeader {
        first,
        follows,
        name,
        len: (name_at + name_len) as u64,
        format,
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

/// What [`Inner::scan_tail`] does with a torn tail.
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

    /// How many numbers an append reserves at once when it raises a log's
    /// mark: as many as a segment's worth of the smallest frames.
    fn reserve_block(&self) -> u64 {
        (self.options.segment_bytes / FRAME as u64).clamp(mark::MIN_BLOCK, mark::MAX_BLOCK)
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
        // The commit slot before the length and the frames: appends write
        // their frames before the slot, so every frame it names as synced
        // is in what is read next, unless it was lost.
        let slot = read_slot(&file);
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
                if header.format < 2 && mark::exists(&self.mark_dir, hashed)? {
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
    fn empty_log(&self, hashed: &str, dir: &Path, name: &str) -> Result<Empty, Error> {
        let trim = Self::read_trim(dir, name)?;
        let mark = mark::read(&self.mark_dir, hashed, name)?;
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
        report(name, self.append_records(name, records, ttl, sync))
    }

    fn append_records(
        &self,
        name: &str,
        records: &[Vec<u8>],
        ttl: Option<Duration>,
        sync: bool,
    ) -> Result<Vec<u64>, Error> {
        let (hashed, dir) = self.log_paths(name);
        let guard = self.lock_stripe("log", &hashed)?;
        let now = unix_ms();
        let scanned = self.scan_tail(&hashed, &dir, name, Cut::Must)?;
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
                        let reserved =
                            mark::read(&self.mark_dir, &hashed, name)?.map_or(0, |m| m.reserved);
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
            t.format >= LOG_FORMAT && handed == t.last_seq && t.end < self.options.segment_bytes
        });
        let mut tail = match in_place {
            Some(t) => {
                let path = dir.join(segment_name(t.seg_first));
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io("open for appending", &path))?;
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
            None => self.start_segment(
                name,
                &dir,
                live.as_ref(),
                expired.as_ref().map(|(_, segments)| segments.as_slice()),
                (next, follows),
                (&frames, last, last_rel, last_crc, expires_ms),
                known_reserved,
            )?,
        };
        // The mark covers every number before any is acknowledged.
        if last > tail.reserved {
            let on_disk = mark::read(&self.mark_dir, &hashed, name)?.map_or(0, |m| m.reserved);
            tail.reserved = if last > on_disk {
                let reserved = last.saturating_add(self.reserve_block()).min(u64::MAX - 1);
                mark::write(&self.mark_dir, &hashed, name, reserved)?;
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
        if let (true, Some((file, path))) = (sync, to_sync) {
            match &self.group {
                Some(group) => group.rounds.sync(&SegmentSync {
                    file: &file,
                    root: &group.root,
                }),
                None => file.sync_data(),
            }
            .map_err(io("fsync", &path))?;
            // The next append's slot says so.
            if let Some(t) = self.tails().get_mut(&hashed)
                && t.seg_first == tail.seg_first
                && t.ino == tail.ino
            {
                t.synced = t.synced.max(last);
            }
        }
        Ok(seqs)
    }

    /// Starts a segment at `first` (following `follows`) with the encoded
    /// frames of an append: after the last segment `live` when it is full,
    /// of the old format or followed by skipped numbers (sealing it), or in
    /// place of the `expired` segments of a log, or as a log's first.
    #[allow(clippy::too_many_arguments)]
    fn start_segment(
        &self,
        name: &str,
        dir: &Path,
        live: Option<&Tail>,
        expired: Option<&[u64]>,
        (first, follows): (u64, u64),
        (frames, last, last_rel, last_crc, expires_ms): (&[u8], u64, u64, u32, u64),
        reserved: u64,
    ) -> Result<Tail, Error> {
        if expired.is_some() {
            // Drop the expired records first: until their segments are
            // gone, a crash must not bring them back.
            let mut trim = Self::read_trim(dir, name)?;
            trim.trim_before = trim.trim_before.max(first);
            Self::write_trim(dir, &trim)?;
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
        if let Some(segments) = expired {
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
            // Frames are numbered on from `first`: the last is one below
            // the next expected.
            before = frames.expect.map(|next| next - 1);
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
        let read = self
            .ensure_recovered(&hashed, &dir, name)
            .and_then(|()| self.read_records(&hashed, &dir, name, (after, limit), Cut::No));
        let read = match read {
            // Read without the log's lock, damage may be another writer's
            // change in flight (a segment being started, a log being
            // created): look again under the lock before reporting it.
            Err(Error::Corrupt { .. }) => self.lock_stripe("log", &hashed).and_then(|_guard| {
                self.read_records(&hashed, &dir, name, (after, limit), Cut::IfWritable)
            }),
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
            .max(Self::read_trim(dir, name)?.trim_before);
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

    pub(crate) fn log_trim(&self, name: &str, before: u64) -> Result<u64, Error> {
        report(name, self.trim_records(name, before))
    }

    fn trim_records(&self, name: &str, before: u64) -> Result<u64, Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        let Some((tail, segments)) = self.scan_tail(&hashed, &dir, name, Cut::Must)? else {
            self.empty_log(&hashed, &dir, name)?;
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

    /// Removes a log: its mark first (so that a crash never leaves a mark
    /// without its log, which reads as damage), then its directory, moved
    /// into the trash in one atomic rename. Returns whether there was a
    /// directory.
    fn remove_log_dir(&self, hashed: &str, dir: &Path) -> Result<bool, Error> {
        mark::remove(&self.mark_dir, hashed)?;
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

    /// Deletes a log and its mark: its numbering starts again.
    pub(crate) fn log_delete(&self, name: &str) -> Result<(), Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        self.remove_log_dir(&hashed, &dir)?;
        Ok(())
    }

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
    pub(crate) fn log_quarantine(&self, name: &str) -> Result<Option<PathBuf>, Error> {
        let (hashed, dir) = self.log_paths(name);
        let _guard = self.lock_stripe("log", &hashed)?;
        let segments = list_segments(&dir)?.unwrap_or_default();
        let (reserved, bad_mark) = match mark::read(&self.mark_dir, &hashed, name) {
            Ok(mark) => (mark.map(|m| m.reserved), false),
            Err(Error::Corrupt { .. }) => (None, true),
            Err(e) => return Err(e),
        };
        let trim = Self::read_trim(&dir, name);
        let set_aside = matches!(&trim, Ok(t) if t.next_seq > 0);
        // A log whose segments are all gone, though its mark remains.
        let lost = segments.is_empty() && !set_aside && (reserved.is_some() || bad_mark);
        if segments.is_empty() && !lost {
            return Ok(None);
        }
        ensure_private_dir(&self.quarantine_dir)?;
        let target = self
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
        Self::write_trim(&dir, &trim)?;
        for &first in &segments {
            let seg = segment_name(first);
            let path = dir.join(&seg);
            fs::rename(&path, target.join(&seg)).map_err(io("move into quarantine", &path))?;
        }
        if bad_mark {
            // Kept too; the next append writes a new one.
            let path = self.mark_dir.join(&hashed);
            fs::rename(&path, target.join("mark")).map_err(io("move into quarantine", &path))?;
            sync_dir(&self.mark_dir)?;
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
    /// segments at once, and its mark), and what crashed writers left
    /// behind.
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
                // its old records, or its mark says it had segments (damage,
                // kept for the operator).
                let keeps_numbering = fs::read(dir.join(TRIM_FILE)).is_ok_and(|bytes| {
                    !serde_json::from_slice::<Trim>(&bytes).is_ok_and(|trim| trim.next_seq == 0)
                });
                if keeps_numbering {
                    continue;
                }
                if mark::exists(&self.mark_dir, &hashed)? {
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
        remove_stale_temps(&self.mark_dir, STALE_TEMP_AGE)?;
        self.empty_trash();
        Ok(removed)
    }

    /// Reads every segment of every log in full, and every numbering mark,
    /// and reports what does not check out (each log under its lock, so a
    /// writer's change in flight is not mistaken for damage). A torn tail
    /// not cut yet is counted, not a problem.
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
            let _guard = self.lock_stripe("log", &hashed)?;
            self.verify_log(&hashed, &entry.path(), &mut check)?;
        }
        // Marks whose log directory is gone.
        let entries = fs::read_dir(&self.mark_dir).map_err(io("list", &self.mark_dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.mark_dir))?;
            let Some(hashed) = entry
                .file_name()
                .to_str()
                .filter(|n| is_hashed_name(n))
                .map(str::to_owned)
            else {
                continue;
            };
            let _guard = self.lock_stripe("log", &hashed)?;
            if self.log_dir.join(&hashed).exists() {
                continue;
            }
            let label = format!("mark/{hashed}");
            match mark::read(&self.mark_dir, &hashed, &label) {
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
        let mark = match mark::read(&self.mark_dir, hashed, &label) {
            Ok(mark) => mark,
            Err(e) => {
                check.problems.push(format!("{label}: {e}"));
                None
            }
        };
        let trim = match Self::read_trim(dir, &label) {
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
