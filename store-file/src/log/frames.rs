//! Reading the frames of a segment, and telling a torn tail (what an
//! interrupted append leaves) from damage.

use std::{
    fs::File,
    io::{self, BufReader, Read, Seek},
    os::unix::fs::FileExt,
};

use super::format::FRAME;
use crate::fsio::{u32_at, u64_at};

/// One step of reading frames.
pub(super) enum Step {
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
pub(super) struct Frames {
    reader: BufReader<File>,
    pub(super) pos: u64,
    limit: u64,
    max_len: u64,
    /// The sequence number the next frame must carry (`None`: none can
    /// follow, the numbering is exhausted).
    pub(super) expect: Option<u64>,
    /// Whether to tell a torn tail from damage when a frame is bad (only
    /// worth the extra reading in a last segment).
    classify: bool,
}

impl Frames {
    pub(super) fn new(
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
    pub(super) fn next(&mut self, want_from: u64) -> io::Result<Step> {
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
