//! The on-disk format of logs.
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
//! | 60 | 4 | roll notice: non-zero while a segment may be started after this one |
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
//! An append that starts a segment first sets the roll notice of the last
//! one (without a sync: it speaks to running processes only), then creates
//! the new segment, then seals the old one by rewriting its slot, which
//! clears the notice. A handle that keeps the last segment of a log open
//! between appends (see [`super::open`]) trusts it only while its slot
//! names no next segment and its notice is clear, so a segment started by
//! another process that crashed before sealing is never appended over. An
//! in-place append rewrites the slot too, clearing a notice left by such a
//! crash. Readers ignore the notice.
//!
//! `trim.json` holds the sequence number below which records are dropped,
//! and, for a log set aside by
//! [`FileStore::quarantine_log`](crate::FileStore::quarantine_log), the
//! number its numbering goes on from. The log's numbering mark is outside
//! its directory ([`super::mark`]).

use std::{
    fs::{self, File},
    io,
    os::unix::fs::FileExt,
    path::Path,
};

use mcp_persist_core::{Error, backend::MAX_KEY_BYTES};
use serde::{Deserialize, Serialize};

use super::tail::Slot;
use crate::fsio::{io, io_error, u32_at, u64_at, write_atomic};

const MAGIC: &[u8; 4] = b"MPLG";
/// The segment format this build writes and the newest it reads.
pub(super) const LOG_FORMAT: u8 = 2;
/// Bytes before the name in a format 1 header.
const V1_FIXED: usize = 24;
/// Bytes before the name in a format 2 header: the header, then the slot.
const V2_FIXED: usize = 64;
/// Where the commit slot of a format 2 segment is, and its size.
pub(super) const SLOT_AT: u64 = 32;
const SLOT: usize = 32;
/// Where the roll notice of a format 2 segment is: the last four bytes of
/// the slot's block, outside its checksum, zero whenever the slot is written.
const ROLL_NOTICE_AT: u64 = 60;
pub(super) const FRAME: usize = 24;
pub(super) const TRIM_FILE: &str = "trim.json";

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Trim {
    /// Records with a smaller sequence number are dropped.
    pub(super) trim_before: u64,
    /// Numbering continues at least here, even with no segment left: set
    /// when a damaged log is set aside, so its numbers are never reused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) next_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub(super) fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The first sequence numbers of a log's segments, sorted; `None` when the
/// log directory does not exist.
pub(super) fn list_segments(dir: &Path) -> Result<Option<Vec<u64>>, Error> {
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
pub(super) fn read_slot(file: &File) -> Option<Slot> {
    let mut bytes = [0u8; SLOT];
    file.read_exact_at(&mut bytes, SLOT_AT).ok()?;
    decode_slot(&bytes)
}

/// Reads the commit slot of a segment of format 2 (if it checks out) and
/// whether its roll notice is set; `None` when the block cannot be read.
pub(super) fn read_slot_and_notice(file: &File) -> Option<(Option<Slot>, bool)> {
    let mut bytes = [0u8; SLOT];
    file.read_exact_at(&mut bytes, SLOT_AT).ok()?;
    let notice = u32_at(&bytes, (ROLL_NOTICE_AT - SLOT_AT) as usize) != 0;
    Some((decode_slot(&bytes), notice))
}

/// Sets the roll notice of a format 2 segment: a segment may be started
/// after it. Not synced: only running processes read it.
pub(super) fn write_roll_notice(file: &File, path: &Path) -> Result<(), Error> {
    file.write_all_at(&1u32.to_le_bytes(), ROLL_NOTICE_AT)
        .map_err(io("write", path))
}

pub(super) fn write_slot(file: &File, path: &Path, slot: Slot) -> Result<(), Error> {
    file.write_all_at(&encode_slot(slot), SLOT_AT)
        .map_err(io("write", path))
}

pub(super) fn encode_segment_header(first: u64, follows: u64, name: &str, slot: Slot) -> Vec<u8> {
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
pub(super) struct SegmentHeader {
    pub(super) first: u64,
    /// The last number of the segment before it (`first - 1` in format 1).
    pub(super) follows: u64,
    pub(super) name: String,
    /// Where its frames start.
    pub(super) len: u64,
    pub(super) format: u8,
}

/// Reads and checks a segment header. `Err` holds the typed error to return
/// (`key` names the log when the caller knows it).
pub(super) fn read_segment_header(file: &File, key: Option<&str>) -> Result<SegmentHeader, Error> {
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

/// Reads the trim file of the log in `dir` (named `name` in errors).
pub(super) fn read_trim(dir: &Path, name: &str) -> Result<Trim, Error> {
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

/// Writes the trim file of the log in `dir`, crash-safely.
pub(super) fn write_trim(dir: &Path, trim: &Trim) -> Result<(), Error> {
    let bytes = serde_json::to_vec(trim).map_err(|e| Error::backend(crate::fsio::NAME, e))?;
    write_atomic(dir, TRIM_FILE, &[&bytes])
}

/// Encodes `records` as frames numbered from `first_seq`. Returns the bytes,
/// the sequence numbers, and the offset and checksum of the last frame.
pub(super) fn encode_frames(
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
