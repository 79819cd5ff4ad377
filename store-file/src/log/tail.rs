//! Where each log ends, as a handle last saw it (one per log, cached by
//! [`Logs`](super::Logs)), and the commit slot of a segment.

/// The commit slot of a segment (format 2): what its appends handed out and
/// what was known to be on disk, rewritten in place by every append to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Every number an append to this segment handed out is at most this.
    pub(crate) issued: u64,
    /// Every frame numbered up to this had been synced when the slot was
    /// written: missing ones were acknowledged and later lost.
    pub(crate) synced: u64,
    /// The first number of the segment started after this one (0: none).
    pub(crate) next: u64,
}

/// Where a log ends, as last seen by this handle. Checked against the file
/// before every use, so another process's appends are picked up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tail {
    /// First sequence number of the last segment (its name).
    pub(crate) seg_first: u64,
    /// Inode of the last segment, so a recreated log is never mistaken for it.
    pub(crate) ino: u64,
    /// Offset of the last good frame.
    pub(crate) last_off: u64,
    pub(crate) last_seq: u64,
    pub(crate) last_crc: u32,
    /// Offset just past the last good frame.
    pub(crate) end: u64,
    /// The log's expiry, from the last good frame (0: none).
    pub(crate) expires_ms: u64,
    /// Format of the last segment (1 has no commit slot).
    pub(crate) format: u8,
    /// Its commit slot as read before its frames (`None`: format 1, or a
    /// slot that does not check out).
    pub(crate) slot: Option<Slot>,
    /// Every frame up to this number is known to this handle to be synced.
    pub(crate) synced: u64,
    /// The log's numbering mark as this handle last read or wrote it (0:
    /// not known).
    pub(crate) reserved: u64,
}

impl Tail {
    /// The highest number the log may have handed out, as far as its last
    /// segment tells: its last frame, or more when the slot names numbers
    /// whose frames are missing. `None` when the slot is unreadable (the
    /// numbering mark must say).
    pub(crate) fn handed_out(&self) -> Option<u64> {
        if self.format < 2 {
            return Some(self.last_seq);
        }
        self.slot.map(|s| s.issued.max(self.last_seq))
    }
}
