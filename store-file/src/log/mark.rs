//! The numbering mark of each log: `mark/<hex SHA-256 of its name>`, outside
//! the log's own directory, holding a number no record of the log was ever
//! numbered above.
//!
//! Appends reserve numbers in blocks: before an append that goes past the
//! mark is acknowledged, the mark is raised (crash-safely: temporary file,
//! fsync, rename, directory fsync) well above it, so the mark costs one
//! write per block, not one per append. It is what lets a log whose
//! segments were truncated, deleted or set aside go on above every number
//! it handed out, and what tells a log whose directory vanished from one
//! that never existed. [`delete_log`](mcp_persist_core::LogStore::delete_log)
//! and the sweep of an expired log remove it (first, so that a log
//! directory never outlives its mark), after which numbering starts again.

use std::{fs, io, path::Path};

use mcp_persist_core::Error;
use serde::{Deserialize, Serialize};

use crate::fsio::{io, io_error, sync_dir, write_atomic};

/// The smallest block of numbers reserved at once.
pub(crate) const MIN_BLOCK: u64 = 16;
/// The largest block of numbers reserved at once.
pub(crate) const MAX_BLOCK: u64 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Mark {
    /// The log's name, for tools (the file is named by its hash).
    log: String,
    /// No record of the log was ever numbered above this.
    reserved: u64,
}

/// A log's mark: its name and reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) log: String,
    pub(crate) reserved: u64,
}

/// Reads the mark in `mark_dir` of the log hashed to `hashed`; `None` when
/// there is none. One that does not parse is [`Error::Corrupt`] naming
/// `name`.
pub(crate) fn read(mark_dir: &Path, hashed: &str, name: &str) -> Result<Option<Read>, Error> {
    let path = mark_dir.join(hashed);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read", &path, e)),
    };
    let mark: Mark = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
        key: name.to_owned(),
        reason: format!("the log's numbering mark (mark/{hashed}) does not parse"),
        source: Some(Box::new(e)),
    })?;
    Ok(Some(Read {
        log: mark.log,
        reserved: mark.reserved,
    }))
}

/// Writes the mark of log `name`, crash-safely.
pub(crate) fn write(mark_dir: &Path, hashed: &str, name: &str, reserved: u64) -> Result<(), Error> {
    let bytes = serde_json::to_vec(&Mark {
        log: name.to_owned(),
        reserved,
    })
    .map_err(|e| Error::backend(crate::fsio::NAME, e))?;
    write_atomic(mark_dir, hashed, &[&bytes])
}

/// Removes the mark of the log hashed to `hashed`, durably. Returns whether
/// there was one.
pub(crate) fn remove(mark_dir: &Path, hashed: &str) -> Result<bool, Error> {
    let path = mark_dir.join(hashed);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error("remove", &path, e)),
    }
    sync_dir(mark_dir)?;
    Ok(true)
}

/// Whether the log hashed to `hashed` has a mark (whatever its content).
pub(crate) fn exists(mark_dir: &Path, hashed: &str) -> Result<bool, Error> {
    let path = mark_dir.join(hashed);
    match fs::symlink_metadata(&path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("inspect", &path)(e)),
    }
}
