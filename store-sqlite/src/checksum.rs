//! The checksum stored beside every value and log record.
//!
//! SQLite checks its own pages (`PRAGMA integrity_check`) but not what is in
//! a row: a flipped byte inside a value is a different, valid blob to it. So
//! every row this crate writes carries a CRC-32 of what it means: the key or
//! log name, the version or sequence number and the bytes. A row whose bytes,
//! number or owner changed behind the store's back no longer matches, and is
//! reported as [`Error::Corrupt`](mcp_persist_core::Error::Corrupt) instead
//! of being returned.
//!
//! CRC-32 (through `crc32fast`, hardware-accelerated where the CPU allows) is
//! made to catch accidental damage, which is what this is for; it is no
//! defence against someone who can write the file on purpose.

/// The checksum of a key-value row.
pub(crate) fn of_value(key: &str, version: i64, value: &[u8]) -> i64 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(b"kv\0");
    crc.update(&(key.len() as u64).to_le_bytes());
    crc.update(key.as_bytes());
    crc.update(&version.to_le_bytes());
    crc.update(value);
    i64::from(crc.finalize())
}

/// The checksum of a log record.
pub(crate) fn of_record(log: &str, seq: i64, data: &[u8]) -> i64 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(b"log\0");
    crc.update(&(log.len() as u64).to_le_bytes());
    crc.update(log.as_bytes());
    crc.update(&seq.to_le_bytes());
    crc.update(data);
    i64::from(crc.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_a_row_counts() {
        let base = of_value("key", 1, b"value");
        assert_ne!(base, of_value("kez", 1, b"value"));
        assert_ne!(base, of_value("key", 2, b"value"));
        assert_ne!(base, of_value("key", 1, b"valuf"));
        assert_ne!(base, of_record("key", 1, b"value"), "kinds differ");
        // The key's length is part of it: moving a byte from key to value
        // changes the checksum.
        assert_ne!(of_value("ab", 1, b"c"), of_value("a", 1, b"bc"));
    }
}
