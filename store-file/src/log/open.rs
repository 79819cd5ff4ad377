//! The last segment of each log this handle appends to, kept open between
//! appends, so that an append in place costs no directory listing and no
//! `open`.
//!
//! A kept descriptor is only a shortcut to a file the log's lock guards; it
//! is checked, under that lock, before every use, and any doubt sends the
//! append the long way ([`Logs::scan_tail`](super::Logs), which lists the
//! directory). It is used only while:
//!
//! * the file is still linked (another process did not delete it), and its
//!   path in the log's directory still names this very file (the log was
//!   not deleted, swept, set aside or recreated; a kept descriptor also keeps
//!   its inode number from being reused);
//! * its length is where this handle's last look ended (no other process
//!   appended, cut or truncated it), and the last frame this handle saw is
//!   still there;
//! * its commit slot checks out, names no next segment (none was started
//!   and sealed it), and its roll notice is clear (none is being started,
//!   or was by a process that crashed before sealing it: see
//!   [`format`](super::format)).

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    os::unix::fs::{FileExt, MetadataExt},
    path::Path,
    sync::{Arc, MutexGuard},
};

use mcp_persist_core::Error;

use super::{
    Logs,
    format::{FRAME, LOG_FORMAT, read_slot_and_notice, segment_name},
    tail::Tail,
};
use crate::fsio::{io, u32_at, u64_at};

/// How many segments a handle keeps open at most. Past that, the one used
/// longest ago is closed (its log takes the long way on its next append).
pub(super) const MAX_OPEN: usize = 128;

/// A last segment kept open for appending.
#[derive(Debug)]
pub(super) struct OpenSegment {
    seg_first: u64,
    ino: u64,
    dev: u64,
    file: Arc<File>,
    /// When it was last used, in this handle's count of uses.
    used: u64,
}

/// The kept segments of a handle, by hashed log name.
#[derive(Debug, Default)]
pub(super) struct OpenSegments {
    by_log: HashMap<String, OpenSegment>,
    uses: u64,
}

impl OpenSegments {
    /// Forgets (and closes) the segment kept for a log.
    pub(super) fn forget(&mut self, hashed: &str) {
        self.by_log.remove(hashed);
    }

    /// Closes every kept segment whose file was deleted (by another
    /// process), so it does not keep its disk space.
    pub(super) fn forget_deleted(&mut self) {
        self.by_log
            .retain(|_, open| open.file.metadata().is_ok_and(|meta| meta.nlink() > 0));
    }

    fn get(&mut self, hashed: &str) -> Option<(u64, u64, u64, Arc<File>)> {
        self.uses += 1;
        let uses = self.uses;
        self.by_log.get_mut(hashed).map(|open| {
            open.used = uses;
            (open.seg_first, open.ino, open.dev, Arc::clone(&open.file))
        })
    }

    fn keep(&mut self, hashed: &str, open: OpenSegment) {
        if self.by_log.len() >= MAX_OPEN && !self.by_log.contains_key(hashed) {
            let oldest = self
                .by_log
                .iter()
                .min_by_key(|(_, open)| open.used)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.by_log.remove(&oldest);
            }
        }
        self.uses += 1;
        self.by_log.insert(
            hashed.to_owned(),
            OpenSegment {
                used: self.uses,
                ..open
            },
        );
    }
}

impl Logs {
    pub(super) fn open_segments(&self) -> MutexGuard<'_, OpenSegments> {
        // A cache checked on every use: a poisoned one is still sound.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where log `hashed` (in `dir`) ends and its last segment open for
    /// writing, from what this handle kept of its last append, when every
    /// check of the module docs passes; `None` sends the caller the long
    /// way. Only under the log's lock. Never an error: whatever fails here
    /// is looked at again, and reported, the long way.
    pub(super) fn kept_tail(&self, hashed: &str, dir: &Path) -> Option<(Tail, Arc<File>)> {
        let tail = self.tails().get(hashed).copied()?;
        let (seg_first, ino, dev, file) = self.open_segments().get(hashed)?;
        if tail.seg_first != seg_first || tail.ino != ino || tail.format < LOG_FORMAT {
            return None;
        }
        let meta = file.metadata().ok()?;
        if meta.nlink() == 0 || meta.len() != tail.end {
            return None;
        }
        let here = fs::symlink_metadata(dir.join(segment_name(seg_first))).ok()?;
        if here.ino() != ino || here.dev() != dev {
            return None;
        }
        let (slot, notice) = read_slot_and_notice(&file)?;
        let slot = slot?;
        if notice || slot.next != 0 || tail.last_seq < slot.synced {
            return None;
        }
        let mut head = [0u8; FRAME];
        file.read_exact_at(&mut head, tail.last_off).ok()?;
        if u32_at(&head, 4) != tail.last_crc || u64_at(&head, 8) != tail.last_seq {
            return None;
        }
        Some((
            Tail {
                slot: Some(slot),
                ..tail
            },
            file,
        ))
    }

    /// Opens the last segment `tail` of log `hashed` (in `dir`) for writing
    /// and keeps it for the next append.
    pub(super) fn open_for_append(
        &self,
        hashed: &str,
        dir: &Path,
        tail: &Tail,
    ) -> Result<Arc<File>, Error> {
        let path = dir.join(segment_name(tail.seg_first));
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .open(&path)
            .map_err(io("open for appending", &path))?;
        let meta = file.metadata().map_err(io("inspect", &path))?;
        let file = Arc::new(file);
        // Only the file the tail describes is kept: one replaced meanwhile
        // is written this once and looked at again next time.
        if meta.ino() == tail.ino {
            self.open_segments().keep(
                hashed,
                OpenSegment {
                    seg_first: tail.seg_first,
                    ino: meta.ino(),
                    dev: meta.dev(),
                    file: Arc::clone(&file),
                    used: 0,
                },
            );
        }
        Ok(file)
    }
}
