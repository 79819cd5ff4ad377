//! Where each log ends, as a handle last saw it: the leaf shared by the
//! store (which keeps one per log) and the log code (which reads and moves
//! it).

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
}
