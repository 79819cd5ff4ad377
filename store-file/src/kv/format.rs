//! The on-disk format of key-value records.
//!
//! A record file is named by the hex SHA-256 of its key and holds:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `MPKV` |
//! | 4 | 1 | record format (1) |
//! | 5 | 1 | kind: 0 value, 1 tombstone (deleted; keeps the version) |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | version |
//! | 16 | 8 | expiry, Unix milliseconds (0: none) |
//! | 24 | 4 | key length |
//! | 28 | 4 | value length |
//! | 32 | 4 | CRC-32 of the value |
//! | 36 | 4 | CRC-32 of bytes 0..36 and the key |
//! | 40 | | key, then value |
//!
//! All integers are little-endian. The header checksum lets `list` read
//! headers alone; the file length must be exactly header + key + value.

use std::{fs::File, io, io::Read, path::Path};

use mcp_persist_core::Error;

use crate::fsio::{u32_at, u64_at};

const MAGIC: &[u8; 4] = b"MPKV";
/// The record format this build writes and the newest it reads.
pub(crate) const RECORD_FORMAT: u8 = 1;
pub(super) const HEADER: usize = 40;
pub(super) const KIND_VALUE: u8 = 0;
pub(super) const KIND_TOMBSTONE: u8 = 1;

/// A record header, checked against its checksum.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    pub(super) kind: u8,
    pub(super) version: u64,
    pub(super) expires_ms: u64,
    key_len: usize,
    value_len: usize,
    value_crc: u32,
}

pub(super) fn encode(key: &str, kind: u8, version: u64, expires_ms: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + key.len() + value.len());
    out.extend_from_slice(MAGIC);
    out.push(RECORD_FORMAT);
    out.push(kind);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&expires_ms.to_le_bytes());
    let key_len = u32::try_from(key.len()).expect("keys are at most 1 KiB");
    let value_len = u32::try_from(value.len()).expect("values are at most the 16 MiB limit");
    out.extend_from_slice(&key_len.to_le_bytes());
    out.extend_from_slice(&value_len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(value).to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out);
    hasher.update(key.as_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    out
}

/// Why a header could not be used.
enum BadHeader {
    /// Written by a newer version of this crate.
    Newer(u8),
    /// Damaged.
    Corrupt(String),
}

/// Parses the fixed header and the key that follows it.
fn parse_header(bytes: &[u8]) -> Result<(Header, &[u8]), BadHeader> {
    if bytes.len() < HEADER {
        return Err(BadHeader::Corrupt(format!(
            "record file is {} bytes, shorter than its header",
            bytes.len()
        )));
    }
    if &bytes[..4] != MAGIC {
        return Err(BadHeader::Corrupt("not a record file (bad magic)".into()));
    }
    if bytes[4] > RECORD_FORMAT {
        return Err(BadHeader::Newer(bytes[4]));
    }
    let header = Header {
        kind: bytes[5],
        version: u64_at(bytes, 8),
        expires_ms: u64_at(bytes, 16),
        key_len: u32_at(bytes, 24) as usize,
        value_len: u32_at(bytes, 28) as usize,
        value_crc: u32_at(bytes, 32),
    };
    let Some(key) = bytes.get(HEADER..HEADER + header.key_len) else {
        return Err(BadHeader::Corrupt(
            "record file is truncated inside its key".into(),
        ));
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..36]);
    hasher.update(key);
    if hasher.finalize() != u32_at(bytes, 36) {
        return Err(BadHeader::Corrupt("record header checksum mismatch".into()));
    }
    if header.kind != KIND_VALUE && header.kind != KIND_TOMBSTONE {
        return Err(BadHeader::Corrupt(format!(
            "unknown record kind {}",
            header.kind
        )));
    }
    Ok((header, key))
}

/// A record read in full.
pub(super) enum Stored {
    Value {
        version: u64,
        expires_ms: u64,
        value: Vec<u8>,
    },
    Tombstone {
        version: u64,
    },
}

fn bad_header(key: &str, bad: BadHeader) -> Error {
    match bad {
        BadHeader::Newer(found) => Error::NewerSchema {
            key: key.to_owned(),
            found: u32::from(found),
            supported: u32::from(RECORD_FORMAT),
        },
        BadHeader::Corrupt(reason) => Error::corrupt(key, reason),
    }
}

/// Checks a whole record file read for `key`.
pub(super) fn decode(key: &str, mut bytes: Vec<u8>) -> Result<Stored, Error> {
    let (header, stored_key) = parse_header(&bytes).map_err(|bad| bad_header(key, bad))?;
    if stored_key != key.as_bytes() {
        return Err(Error::corrupt(key, "the record file holds another key"));
    }
    let expected = HEADER + header.key_len + header.value_len;
    if bytes.len() != expected {
        return Err(Error::corrupt(
            key,
            format!("record file is {} bytes, expected {expected}", bytes.len()),
        ));
    }
    if header.kind == KIND_TOMBSTONE {
        return Ok(Stored::Tombstone {
            version: header.version,
        });
    }
    let value = bytes.split_off(HEADER + header.key_len);
    if crc32fast::hash(&value) != header.value_crc {
        return Err(Error::corrupt(key, "value checksum mismatch"));
    }
    Ok(Stored::Value {
        version: header.version,
        expires_ms: header.expires_ms,
        value,
    })
}

/// The header of a record file, read on its own.
pub(super) enum HeaderRead {
    /// The file vanished meanwhile.
    Gone,
    /// A checked header and the key.
    Good(Header, String),
    /// Unreadable, with the reason.
    Bad(String),
}

/// Reads the header and key of one record file.
pub(super) fn read_header(path: &Path) -> io::Result<HeaderRead> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HeaderRead::Gone),
        Err(e) => return Err(e),
    };
    let mut head = vec![0u8; HEADER + mcp_persist_core::backend::MAX_KEY_BYTES];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    head.truncate(filled);
    Ok(match parse_header(&head) {
        Ok((header, key)) => match std::str::from_utf8(key) {
            Ok(key) => HeaderRead::Good(header, key.to_owned()),
            Err(_) => HeaderRead::Bad("key is not UTF-8".to_owned()),
        },
        Err(BadHeader::Newer(format)) => {
            HeaderRead::Bad(format!("record format {format} is newer than this build"))
        }
        Err(BadHeader::Corrupt(reason)) => HeaderRead::Bad(reason),
    })
}
