//! Key-value records: one file per key, replaced atomically on every write.
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

use std::{
    fs::{self, File},
    io::{self, Read},
    path::PathBuf,
};

use mcp_persist_core::{Error, KvEntry, PutMode, Version};
use tracing::{debug, warn};

use crate::{
    fsio::{
        hashed_name, io, io_error, is_hashed_name, is_live, u32_at, u64_at, unix_micros, unix_ms,
        write_atomic,
    },
    store::Inner,
};

const MAGIC: &[u8; 4] = b"MPKV";
/// The record format this build writes and the newest it reads.
pub(crate) const RECORD_FORMAT: u8 = 1;
const HEADER: usize = 40;
const KIND_VALUE: u8 = 0;
const KIND_TOMBSTONE: u8 = 1;

/// A record header, checked against its checksum.
#[derive(Debug, Clone, Copy)]
struct Header {
    kind: u8,
    version: u64,
    expires_ms: u64,
    key_len: usize,
    value_len: usize,
    value_crc: u32,
}

fn encode(key: &str, kind: u8, version: u64, expires_ms: u64, value: &[u8]) -> Vec<u8> {
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

/// What the file of a key holds, as far as a write is concerned.
enum Slot {
    /// No file.
    Absent,
    /// A live value at this version.
    Live(u64),
    /// An expired value or a tombstone: absent, but its version still counts.
    Dead(u64),
    /// A file that cannot be read: corrupt, or from a newer format.
    Damaged(Error),
}

/// A record read in full.
enum Stored {
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
fn decode(key: &str, mut bytes: Vec<u8>) -> Result<Stored, Error> {
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
enum HeaderRead {
    /// The file vanished meanwhile.
    Gone,
    /// A checked header and the key.
    Good(Header, String),
    /// Unreadable, with the reason.
    Bad(String),
}

/// What [`Inner::verify_kv`] found.
#[derive(Debug, Default)]
pub(crate) struct KvCheck {
    pub(crate) live: u64,
    pub(crate) dead: u64,
    pub(crate) problems: Vec<String>,
}

impl Inner {
    fn kv_path(&self, key: &str) -> (String, PathBuf) {
        let name = hashed_name("kv", key);
        let path = self.kv_dir.join(&name);
        (name, path)
    }

    /// Reads the file of `key`: `None` when there is none.
    fn read_record(&self, key: &str, path: &std::path::Path) -> Result<Option<Stored>, Error> {
        let mut file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("open", path, e)),
        };
        let meta = file.metadata().map_err(io("inspect", path))?;
        self.check_file_mode(path, &meta);
        let limit = (HEADER
            + mcp_persist_core::backend::MAX_KEY_BYTES
            + self.options.max_value_bytes) as u64;
        if meta.len() > limit {
            return Err(Error::corrupt(
                key,
                format!(
                    "record file is {} bytes, larger than any record",
                    meta.len()
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(io("read", path))?;
        decode(key, bytes).map(Some)
    }

    fn slot(&self, key: &str, path: &std::path::Path, now_ms: u64) -> Result<Slot, Error> {
        Ok(match self.read_record(key, path) {
            Ok(None) => Slot::Absent,
            Ok(Some(Stored::Tombstone { version })) => Slot::Dead(version),
            Ok(Some(Stored::Value {
                version,
                expires_ms,
                ..
            })) => {
                if is_live(expires_ms, now_ms) {
                    Slot::Live(version)
                } else {
                    Slot::Dead(version)
                }
            }
            Err(e @ (Error::Corrupt { .. } | Error::NewerSchema { .. })) => Slot::Damaged(e),
            Err(e) => return Err(e),
        })
    }

    /// The version of the next write of a key whose last known version is
    /// `prev`: above it, above every reclaimed version, and at least the
    /// current time in microseconds (so that even a key whose record was
    /// lost to damage gets a version above any it had before).
    fn next_version(&self, key: &str, prev: Option<u64>) -> Result<u64, Error> {
        // A known version already exceeds every reclaimed version of its key.
        let base = match prev {
            Some(v) => v,
            None => self.version_floor()?,
        };
        // Only a damaged or crafted file holds u64::MAX: going on from it
        // would hand the same version out twice.
        let next = base.checked_add(1).ok_or_else(|| {
            Error::corrupt(key, format!("stored version {base} leaves no next version"))
        })?;
        Ok(next.max(unix_micros()))
    }

    pub(crate) fn kv_get(&self, key: &str) -> Result<Option<KvEntry>, Error> {
        let (_, path) = self.kv_path(key);
        Ok(match self.read_record(key, &path)? {
            Some(Stored::Value {
                version,
                expires_ms,
                value,
            }) if is_live(expires_ms, unix_ms()) => {
                Some(KvEntry::new(value, Version::new(version)))
            }
            _ => None,
        })
    }

    pub(crate) fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        mode: PutMode,
        expires_ms: u64,
    ) -> Result<Version, Error> {
        let (name, path) = self.kv_path(key);
        let _guard = self.lock_stripe("kv", &name)?;
        let prev = match self.slot(key, &path, unix_ms())? {
            Slot::Absent => {
                mode.check(key, None)?;
                None
            }
            Slot::Live(v) => {
                mode.check(key, Some(Version::new(v)))?;
                Some(v)
            }
            Slot::Dead(v) => {
                mode.check(key, None)?;
                Some(v)
            }
            Slot::Damaged(e @ Error::NewerSchema { .. }) => return Err(e),
            // A precondition cannot be judged against an unreadable record.
            Slot::Damaged(e) if mode != PutMode::Overwrite => return Err(e),
            Slot::Damaged(e) => {
                let kept = self.quarantine(&path, &name)?;
                warn!(key, error = %e, kept = %kept.display(),
                    "overwriting a corrupt record; the damaged file was kept aside");
                None
            }
        };
        let version = self.next_version(key, prev)?;
        let bytes = encode(key, KIND_VALUE, version, expires_ms, value);
        write_atomic(&self.kv_dir, &name, &[&bytes])?;
        Ok(Version::new(version))
    }

    pub(crate) fn kv_delete(&self, key: &str, if_version: Option<Version>) -> Result<bool, Error> {
        let (name, path) = self.kv_path(key);
        let _guard = self.lock_stripe("kv", &name)?;
        match self.slot(key, &path, unix_ms())? {
            Slot::Absent | Slot::Dead(_) => match if_version {
                Some(_) => Err(Error::Conflict { key: key.into() }),
                None => Ok(false),
            },
            Slot::Live(v) => {
                if let Some(want) = if_version {
                    PutMode::Update(want).check(key, Some(Version::new(v)))?;
                }
                // A tombstone keeps the version, so the key's next write gets a
                // greater one; the sweep reclaims it after raising the floor.
                let version = self.next_version(key, Some(v))?;
                let bytes = encode(key, KIND_TOMBSTONE, version, 0, &[]);
                write_atomic(&self.kv_dir, &name, &[&bytes])?;
                Ok(true)
            }
            Slot::Damaged(e) => {
                if if_version.is_some() {
                    return Err(e);
                }
                // Deleting an unreadable record is the way out of it: the
                // damaged file is kept aside, never destroyed.
                let kept = self.quarantine(&path, &name)?;
                warn!(key, error = %e, kept = %kept.display(),
                    "deleted an unreadable record; the damaged file was kept aside");
                Ok(true)
            }
        }
    }

    /// Reads the header and key of one record file.
    fn read_header(path: &std::path::Path) -> io::Result<HeaderRead> {
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

    /// Every record file name in the key-value directory.
    fn record_names(&self) -> Result<Vec<String>, Error> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.kv_dir).map_err(io("list", &self.kv_dir))? {
            let entry = entry.map_err(io("list", &self.kv_dir))?;
            if let Some(name) = entry.file_name().to_str()
                && is_hashed_name(name)
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    pub(crate) fn kv_list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let now = unix_ms();
        let mut keys = Vec::new();
        for name in self.record_names()? {
            let path = self.kv_dir.join(&name);
            match Self::read_header(&path).map_err(io("read", &path))? {
                HeaderRead::Gone => {}
                HeaderRead::Good(header, key) => {
                    if header.kind == KIND_VALUE
                        && is_live(header.expires_ms, now)
                        && key.starts_with(prefix)
                        && hashed_name("kv", &key) == name
                    {
                        keys.push(key);
                    }
                }
                HeaderRead::Bad(reason) => {
                    warn!(file = %path.display(), reason, "skipping an unreadable record file in list");
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    /// Removes tombstones and records expired for longer than the sweep
    /// margin, after raising the version floor above them so their versions
    /// are never handed out again.
    pub(crate) fn kv_sweep(&self) -> Result<u64, Error> {
        // A record expired within the margin stays: the clock may have been
        // stepped forward, and deleting would make that step permanent.
        let cutoff = self.sweep_cutoff_ms(unix_ms());
        let mut candidates = Vec::new();
        for name in self.record_names()? {
            let path = self.kv_dir.join(&name);
            if let HeaderRead::Good(header, _) =
                Self::read_header(&path).map_err(io("read", &path))?
                && (header.kind == KIND_TOMBSTONE || !is_live(header.expires_ms, cutoff))
            {
                candidates.push((name, header.version));
            }
        }
        let mut removed = 0;
        if let Some(max) = candidates.iter().map(|(_, v)| *v).max() {
            self.raise_version_floor(max)?;
            for (name, _) in &candidates {
                let _guard = self.lock_stripe("kv", name)?;
                let path = self.kv_dir.join(name);
                // Look again under the lock: the key may have been written since.
                let still_dead = matches!(
                    Self::read_header(&path).map_err(io("read", &path))?,
                    HeaderRead::Good(h, _) if (h.kind == KIND_TOMBSTONE || !is_live(h.expires_ms, self.sweep_cutoff_ms(unix_ms())))
                        && h.version <= max
                );
                if still_dead {
                    match fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_error("remove", &path, e)),
                    }
                }
            }
            crate::fsio::sync_dir(&self.kv_dir)?;
        }
        let temps = crate::fsio::remove_stale_temps(&self.kv_dir, crate::STALE_TEMP_AGE)?;
        debug!(removed, temps, "swept expired records");
        Ok(removed)
    }

    /// Reads every record file in full and reports what does not check out.
    pub(crate) fn verify_kv(&self) -> Result<KvCheck, Error> {
        let mut check = KvCheck::default();
        let now = unix_ms();
        for name in self.record_names()? {
            let path = self.kv_dir.join(&name);
            let key = match Self::read_header(&path).map_err(io("read", &path))? {
                HeaderRead::Gone => continue,
                HeaderRead::Good(_, key) => key,
                HeaderRead::Bad(reason) => {
                    check.problems.push(format!("kv/{name}: {reason}"));
                    continue;
                }
            };
            if hashed_name("kv", &key) != name {
                check.problems.push(format!(
                    "kv/{name}: holds key {key:?}, which belongs elsewhere"
                ));
                continue;
            }
            match self.read_record(&key, &path) {
                Ok(Some(Stored::Value { expires_ms, .. })) if is_live(expires_ms, now) => {
                    check.live += 1;
                }
                Ok(Some(_)) => check.dead += 1,
                Ok(None) => {}
                Err(e) => check.problems.push(format!("kv/{name}: {e}")),
            }
        }
        Ok(check)
    }
}
