//! `sqlite:PATH` URLs, for the [registry](mcp_persist_core::registry).

use std::{
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl, not_a_store},
};

use crate::{NAME, SCHEMA_VERSION, SqliteOptions, SqliteStore, schema::APPLICATION_ID};

/// Opens `sqlite:PATH` (also `sqlite://PATH`): a database file.
///
/// Before SQLite touches the file, the opener looks at it with plain reads
/// and refuses, changing nothing, what is not a store of this crate: a
/// missing path (unless creating), a folder, an empty file (unless
/// creating), a file that is not a SQLite database, a database of another
/// application, one written by a newer version. With
/// [`OpenMode::ReadOnly`] it also refuses a database that opening would
/// upgrade, and the store it opens sweeps nothing on its own. With
/// [`OpenMode::Create`] and `create_folders` off, a missing parent folder is
/// refused too. The store it returns checkpoints and closes the database on
/// [`OpenedStore::close`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteOpener;

/// The header of a SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// The metadata file of a file store, to point out a mistaken scheme.
const FILE_STORE_META: &str = "store.json";

/// The path a `sqlite:` URL names.
fn path_of(url: &StoreUrl) -> Result<PathBuf> {
    let rest = url.rest();
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(Error::invalid(
            "store URL",
            format!("`{url}` names no file; write sqlite:PATH, e.g. sqlite:./state.db"),
        ));
    }
    Ok(PathBuf::from(path))
}

fn unreadable(path: &Path, e: &io::Error) -> Error {
    Error::backend(NAME, format!("cannot look at {}: {e}", path.display()))
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

/// Whether the write-ahead log beside a database holds anything: the header
/// in the database file may then be older than what SQLite reads.
fn wal_in_use(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    fs::metadata(PathBuf::from(wal)).is_ok_and(|m| m.len() > 0)
}

/// The folder a new database goes into must exist, or be created on request.
fn parent_ready(path: &Path, create_folders: bool) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    match fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(not_a_store(format!(
            "not a store: {} is a file, so no database can be created in it (nothing was changed)",
            parent.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound && create_folders => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(not_a_store(format!(
            "the folder {} does not exist, so there is no place for the database {} (nothing was created)",
            parent.display(),
            path.display()
        ))),
        Err(e) => Err(unreadable(parent, &e)),
    }
}

/// Looks at `path` before SQLite opens it; see [`SqliteOpener`].
pub(crate) fn probe(path: &Path, options: OpenOptions) -> Result<()> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return if options.needs_existing() {
                Err(not_a_store(format!(
                    "no SQLite database at {}: check the path (nothing was created)",
                    path.display()
                )))
            } else {
                parent_ready(path, options.create_folders)
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
        return Err(not_a_store(format!(
            "not a store: {} is a folder, and sqlite: names a database file{also} (nothing was changed)",
            path.display()
        )));
    }
    let header = read_header(path).map_err(|e| unreadable(path, &e))?;
    if header.is_empty() {
        return if options.needs_existing() {
            Err(not_a_store(format!(
                "not a store: {} is an empty file, not an mcp-persist SQLite database (nothing was changed)",
                path.display()
            )))
        } else {
            Ok(())
        };
    }
    if header.len() < 100 || !header.starts_with(SQLITE_MAGIC) {
        let also = if path.file_name().is_some_and(|n| n == FILE_STORE_META) {
            "; a file store is named by its folder, file:DIR"
        } else {
            ""
        };
        return Err(not_a_store(format!(
            "not a store: {} is not a SQLite database{also} (nothing was changed)",
            path.display()
        )));
    }
    let application_id = be_u32(&header, 68);
    let schema = be_u32(&header, 60);
    let wal = wal_in_use(path);
    if application_id != APPLICATION_ID as u32 {
        if application_id != 0 {
            return Err(not_a_store(format!(
                "not a store: {} is a SQLite database of another application (its application_id is {application_id:#x}; nothing was changed)",
                path.display()
            )));
        }
        // A store being created may not have its id in the file yet, only
        // in its write-ahead log: SQLite itself tells then.
        if !wal && options.needs_existing() {
            return Err(not_a_store(format!(
                "not a store: {} is a SQLite database without mcp-persist's tables (nothing was changed)",
                path.display()
            )));
        }
        return Ok(());
    }
    if schema > SCHEMA_VERSION {
        return Err(Error::NewerSchema {
            key: path.display().to_string(),
            found: schema,
            supported: SCHEMA_VERSION,
        });
    }
    if schema < SCHEMA_VERSION && !wal && options.mode == OpenMode::ReadOnly {
        return Err(Error::Unsupported {
            operation: "a read-only open of a database written by an older version \
                        (opening would upgrade it in place; nothing was changed)",
            backend: NAME,
        });
    }
    Ok(())
}

#[async_trait]
impl Opener for SqliteOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["sqlite"]
    }

    fn forms(&self) -> &'static str {
        "sqlite:PATH                         a SQLite database file"
    }

    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let path = path_of(url)?;
        probe(&path, options)?;
        let mut sqlite = SqliteOptions::default();
        if options.mode == OpenMode::ReadOnly {
            // A reader deletes nothing, expired or not.
            sqlite = sqlite.sweep_interval(None);
        }
        let store = SqliteStore::open_with(&path, sqlite).await?;
        let closing = store.clone();
        Ok(OpenedStore::both(store, url).on_close(move || closing.close()))
    }

    async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        let path = path_of(url)?;
        probe(&path, options)?;
        Ok(fs::metadata(&path).is_ok_and(|m| m.len() > 0))
    }

    fn local_path(&self, url: &StoreUrl) -> Option<PathBuf> {
        path_of(url).ok()
    }
}
