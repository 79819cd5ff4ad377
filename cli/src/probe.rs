//! Looking at a path before a backend opens it.
//!
//! The file and SQLite backends create what is missing when they open a
//! store: a folder and its layout, a database and its tables. That is what
//! an application wants, and never what a command that only reads wants, nor
//! a `copy` into a path that holds something else. So the command line looks
//! first, with plain reads of the file system, and refuses (changing
//! nothing) a path that is not a store, or one that opening would change.

use std::{
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use crate::fail::{Code, Failure};

/// What a command may do to the store it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Only read (`ls`, `show`, `stats`, `check`, a `copy` source): the
    /// store must exist, and opening it must not change it.
    ReadOnly,
    /// Change an existing store (`rm`, `gc`, `quarantine`).
    Write,
    /// Write into it, creating it if missing (a `copy` destination). Its
    /// folder must exist unless `create_dirs`.
    Create {
        /// Create missing parent folders too (`--create-dirs`).
        create_dirs: bool,
    },
}

/// The file-store layout this tool knows: `store.json` format 1.
const FILE_STORE_FORMAT: u64 = 1;
/// The metadata file of a file store.
const FILE_STORE_META: &str = "store.json";
/// The folders a file store's layout holds; opening one creates those that
/// are missing.
const FILE_STORE_DIRS: [&str; 4] = ["kv", "log", "lock", "trash"];
/// How the temporary files of a file store's atomic writes begin.
const FILE_STORE_TEMP: &str = ".tmp-";
/// The lock file every opening of a file store takes.
const FILE_STORE_META_LOCK: &str = "lock/meta";

/// The header of a SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// `PRAGMA application_id` of an mcp-persist database: "MCPp".
const SQLITE_APPLICATION_ID: u32 = 0x4d43_5070;

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A store: open it.
    Store,
    /// Nothing yet: opening creates the store (only with `Access::Create`).
    New,
}

fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

fn unreadable(path: &Path, e: &io::Error) -> Failure {
    Failure::new(
        Code::Other,
        format!("cannot look at {}: {e}", path.display()),
    )
    .with_hint("check the path's permissions")
}

/// The folder a new store at `path` goes into must exist, or be created on
/// request.
fn parent_ready(path: &Path, create_dirs: bool, what: &str) -> Result<Found, Failure> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(Found::New),
    };
    match fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => Ok(Found::New),
        Ok(_) => Err(Failure::not_a_store(format!(
            "{} is a file, so no {what} can be created in it",
            parent.display()
        ))),
        Err(e) if is_missing(&e) && create_dirs => Ok(Found::New),
        Err(e) if is_missing(&e) => Err(Failure::unreachable(format!(
            "the folder {} does not exist, so there is no place for the {what} {} (nothing was created)",
            parent.display(),
            path.display()
        ))
        .with_hint("check the path, or pass --create-dirs to have `copy` create the missing folders")),
        Err(e) => Err(unreadable(parent, &e)),
    }
}

/// Looks at `file:DIR` before [`FileStore`](mcp_persist_store_file::FileStore)
/// opens it.
pub(crate) fn file_store(dir: &Path, access: Access) -> Result<Found, Failure> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if is_missing(&e) => {
            return match access {
                Access::Create { create_dirs } => parent_ready(dir, create_dirs, "file store"),
                _ => Err(Failure::unreachable(format!(
                    "no file store at {}: nothing is there (nothing was created)",
                    dir.display()
                ))
                .with_hint("check the path")),
            };
        }
        Err(e) => return Err(unreadable(dir, &e)),
    };
    if !meta.is_dir() {
        let also = if is_sqlite(dir) {
            format!(
                "; it is a SQLite database: name it sqlite:{}",
                dir.display()
            )
        } else {
            String::new()
        };
        return Err(Failure::not_a_store(format!(
            "{} is a file, and file: names a file-store folder{also}",
            dir.display()
        )));
    }
    let store_json = dir.join(FILE_STORE_META);
    let bytes = match fs::read(&store_json) {
        Ok(bytes) => bytes,
        Err(e) if is_missing(&e) => {
            let names: Vec<String> = fs::read_dir(dir)
                .map_err(|e| unreadable(dir, &e))?
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            let empty = names.is_empty();
            // Another process creating the store right now has made part
            // of its layout, and not yet its metadata.
            let being_created = names
                .iter()
                .all(|n| FILE_STORE_DIRS.contains(&n.as_str()) || n.starts_with(FILE_STORE_TEMP));
            return match (empty, access) {
                (true, Access::Create { .. }) => Ok(Found::New),
                (false, Access::Create { .. }) if being_created => Ok(Found::Store),
                (true, _) => Err(Failure::not_a_store(format!(
                    "{} is an empty folder, not a file store",
                    dir.display()
                ))),
                (false, Access::Create { .. }) => Err(Failure::not_a_store(format!(
                    "{} holds other files and no {FILE_STORE_META}, so it is not a file store; copy into a new or empty folder",
                    dir.display()
                ))),
                (false, _) => Err(Failure::not_a_store(format!(
                    "{} holds no {FILE_STORE_META}, so it is not an mcp-persist file store",
                    dir.display()
                ))),
            };
        }
        Err(e) => return Err(unreadable(&store_json, &e)),
    };
    let format = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("format").and_then(serde_json::Value::as_u64));
    let Some(format) = format else {
        return Err(Failure::not_a_store(format!(
            "{} is not the metadata of a file store",
            store_json.display()
        )));
    };
    if format > FILE_STORE_FORMAT {
        return Err(Failure::new(
            Code::NewerSchema,
            format!(
                "{} was laid out by a newer version of mcp-persist (format {format}; this tool reads {FILE_STORE_FORMAT})",
                dir.display()
            ),
        )
        .with_hint("install a matching `mcp-persist-cli`"));
    }
    if access == Access::ReadOnly {
        // Opening creates any part of the layout that is missing.
        let missing: Vec<&str> = FILE_STORE_DIRS
            .iter()
            .copied()
            .filter(|d| !dir.join(d).is_dir())
            .chain(Some(FILE_STORE_META_LOCK).filter(|f| !dir.join(f).is_file()))
            .collect();
        if !missing.is_empty() {
            return Err(Failure::new(
                Code::Other,
                format!(
                    "{} is a file store without {}: opening it would create that, and this command only reads (nothing was changed)",
                    dir.display(),
                    missing.join(", ")
                ),
            )
            .with_hint(format!(
                "let a command that writes complete it (`mcp-persist gc file:{}`), or start the application on it",
                dir.display()
            )));
        }
    }
    Ok(Found::Store)
}

/// Whether a format-1 file store at `root` holds a folder for `log`: a log
/// without one holds no record. Reading such a log through the store would
/// create its lock file, a write a read-only command must not make.
pub(crate) fn file_log_exists(root: &Path, log: &str) -> bool {
    use sha2::{Digest, Sha256};
    // The layout's name of a log: the SHA-256 of "log", a NUL and the name.
    let mut hasher = Sha256::new();
    hasher.update(b"log\0");
    hasher.update(log.as_bytes());
    let hashed: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    root.join("log").join(hashed).is_dir()
}

fn is_sqlite(path: &Path) -> bool {
    read_header(path).is_ok_and(|h| h.starts_with(SQLITE_MAGIC))
}

/// The first 100 bytes of a file (fewer if it is shorter).
fn read_header(path: &Path) -> io::Result<Vec<u8>> {
    let mut header = Vec::with_capacity(100);
    fs::File::open(path)?.take(100).read_to_end(&mut header)?;
    Ok(header)
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

/// The write-ahead log beside a database, when it holds anything: the
/// header in the database file may then be older than what SQLite reads.
fn wal_in_use(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    fs::metadata(PathBuf::from(wal)).is_ok_and(|m| m.len() > 0)
}

/// Looks at `sqlite:PATH` before
/// [`SqliteStore`](mcp_persist_store_sqlite::SqliteStore) opens it.
pub(crate) fn sqlite(path: &Path, access: Access) -> Result<Found, Failure> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if is_missing(&e) => {
            return match access {
                Access::Create { create_dirs } => parent_ready(path, create_dirs, "database"),
                _ => Err(Failure::unreachable(format!(
                    "no SQLite database at {}: check the path (nothing was created)",
                    path.display()
                ))),
            };
        }
        Err(e) => return Err(unreadable(path, &e)),
    };
    if meta.is_dir() {
        let also = if path.join(FILE_STORE_META).is_file() {
            format!("; it is a file store: name it file:{}", path.display())
        } else {
            String::new()
        };
        return Err(Failure::not_a_store(format!(
            "{} is a folder, and sqlite: names a database file{also}",
            path.display()
        )));
    }
    let header = read_header(path).map_err(|e| unreadable(path, &e))?;
    if header.is_empty() {
        return match access {
            Access::Create { .. } => Ok(Found::New),
            _ => Err(Failure::not_a_store(format!(
                "{} is an empty file, not an mcp-persist SQLite database",
                path.display()
            ))),
        };
    }
    if header.len() < 100 || !header.starts_with(SQLITE_MAGIC) {
        let also = if path.file_name().is_some_and(|n| n == FILE_STORE_META) {
            "; a file store is named by its folder, file:DIR"
        } else {
            ""
        };
        return Err(Failure::not_a_store(format!(
            "{} is not a SQLite database{also}",
            path.display()
        )));
    }
    let application_id = be_u32(&header, 68);
    let schema = be_u32(&header, 60);
    let wal = wal_in_use(path);
    if application_id != SQLITE_APPLICATION_ID {
        if application_id != 0 {
            return Err(Failure::not_a_store(format!(
                "{} is a SQLite database of another application (its application_id is {application_id:#x})",
                path.display()
            )));
        }
        // A store being created may not have its id in the file yet, only
        // in its write-ahead log: SQLite itself tells then.
        if !wal && !matches!(access, Access::Create { .. }) {
            return Err(Failure::not_a_store(format!(
                "{} is a SQLite database without mcp-persist's tables",
                path.display()
            )));
        }
        return Ok(Found::Store);
    }
    let supported = mcp_persist_store_sqlite::SCHEMA_VERSION;
    if schema > supported {
        return Err(Failure::new(
            Code::NewerSchema,
            format!(
                "{} was written by a newer version of mcp-persist (schema {schema}; this tool reads {supported}), and is left as it is",
                path.display()
            ),
        )
        .with_hint("install a matching `mcp-persist-cli`"));
    }
    if schema < supported && !wal && access == Access::ReadOnly {
        return Err(Failure::new(
            Code::Other,
            format!(
                "{} was written by an older version of mcp-persist (schema {schema}; this tool reads {supported}): opening it would upgrade it in place, and this command only reads (nothing was changed)",
                path.display()
            ),
        )
        .with_hint(format!(
            "let a command that writes upgrade it (`mcp-persist gc sqlite:{}`), or start the application on it",
            path.display()
        )));
    }
    Ok(Found::Store)
}
