//! `file:DIR` URLs, for the [registry](mcp_persist_core::registry).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl, not_a_store},
};

use crate::{FileStore, store::META_FILE};

/// Opens `file:DIR` (also `file://DIR`): a file-store directory.
///
/// Before the store is opened, the opener looks at the folder with plain
/// reads and refuses, changing nothing, what is not a file store: a missing
/// folder (unless creating), a file, an empty folder or one holding other
/// files (unless creating into an empty one), metadata of a newer layout.
/// With [`OpenMode::ReadOnly`] it also refuses a store whose layout opening
/// would complete. With [`OpenMode::Create`] and `create_folders` off, a
/// missing parent folder is refused too.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileOpener;

/// The layout this build writes and reads: `store.json` format 1.
const FORMAT: u64 = 1;
/// The folders of the layout; opening creates those that are missing.
const DIRS: [&str; 5] = ["kv", "log", "mark", "lock", "trash"];
/// How the temporary files of atomic writes begin.
const TEMP: &str = ".tmp-";
/// The lock file every opening takes.
const META_LOCK: &str = "lock/meta";
/// The header of a SQLite database file, to point out a mistaken scheme.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

fn unreadable(path: &Path, e: &io::Error) -> Error {
    Error::backend("file", format!("cannot look at {}: {e}", path.display()))
}

fn parent_ready(dir: &Path, create_folders: bool) -> Result<()> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    match fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(not_a_store(format!(
            "not a store: {} is a file, so no file store can be created in it (nothing was changed)",
            parent.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound && create_folders => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(not_a_store(format!(
            "the folder {} does not exist, so there is no place for the file store {} (nothing was created)",
            parent.display(),
            dir.display()
        ))),
        Err(e) => Err(unreadable(parent, &e)),
    }
}

fn is_sqlite(path: &Path) -> bool {
    use std::io::Read;
    let mut header = [0u8; 16];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .is_ok_and(|()| &header == SQLITE_MAGIC)
}

/// Looks at `dir` before the store is opened; see [`FileOpener`].
pub(crate) fn probe(dir: &Path, options: OpenOptions) -> Result<()> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return if options.needs_existing() {
                Err(not_a_store(format!(
                    "no file store at {}: nothing is there (nothing was created)",
                    dir.display()
                )))
            } else {
                parent_ready(dir, options.create_folders)
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
        return Err(not_a_store(format!(
            "not a store: {} is a file, and file: names a file-store folder{also} (nothing was changed)",
            dir.display()
        )));
    }
    let store_json = dir.join(META_FILE);
    let mut attempts = 0;
    let bytes = loop {
        let names = match fs::read(&store_json) {
            Ok(bytes) => break bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::read_dir(dir)
                .map_err(|e| unreadable(dir, &e))?
                .filter_map(std::result::Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<String>>(),
            Err(e) => return Err(unreadable(&store_json, &e)),
        };
        // Another process finished creating the store between the read
        // and the listing: read its metadata again.
        attempts += 1;
        if names.iter().any(|n| n == META_FILE) && attempts < 3 {
            continue;
        }
        {
            // Another process creating the store right now has made part
            // of its layout, and not yet its metadata.
            let being_created = names
                .iter()
                .all(|n| DIRS.contains(&n.as_str()) || n.starts_with(TEMP));
            let creating = options.mode == OpenMode::Create;
            return match (names.is_empty(), creating) {
                (true, true) => Ok(()),
                (false, true) if being_created => Ok(()),
                (true, false) => Err(not_a_store(format!(
                    "not a store: {} is an empty folder, not a file store (nothing was changed)",
                    dir.display()
                ))),
                (false, true) => Err(not_a_store(format!(
                    "not a store: {} holds other files and no {META_FILE}, so it is not a file store; use a new or empty folder (nothing was changed)",
                    dir.display()
                ))),
                (false, false) => Err(not_a_store(format!(
                    "not a store: {} holds no {META_FILE}, so it is not an mcp-persist file store (nothing was changed)",
                    dir.display()
                ))),
            };
        }
    };
    let format = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("format").and_then(serde_json::Value::as_u64));
    let Some(format) = format else {
        return Err(not_a_store(format!(
            "not a store: {} is not the metadata of a file store (nothing was changed)",
            store_json.display()
        )));
    };
    if format > FORMAT {
        return Err(Error::NewerSchema {
            key: dir.display().to_string(),
            found: u32::try_from(format).unwrap_or(u32::MAX),
            supported: FORMAT as u32,
        });
    }
    if options.mode == OpenMode::ReadOnly {
        // Opening creates any part of the layout that is missing.
        let complete = DIRS.iter().all(|d| dir.join(d).is_dir()) && dir.join(META_LOCK).is_file();
        if !complete {
            return Err(Error::Unsupported {
                operation: "a read-only open of a file store whose layout is incomplete \
                            (opening would complete it; nothing was changed)",
                backend: "file",
            });
        }
    }
    Ok(())
}

/// The folder a `file:` URL names.
fn dir_of(url: &StoreUrl) -> Result<PathBuf> {
    let rest = url.rest();
    let dir = PathBuf::from(rest.strip_prefix("//").unwrap_or(rest));
    if dir.as_os_str().is_empty() {
        return Err(Error::invalid(
            "store URL",
            format!("`{url}` names no directory; write file:DIR, e.g. file:./state"),
        ));
    }
    Ok(dir)
}

#[async_trait]
impl Opener for FileOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["file"]
    }

    fn forms(&self) -> &'static str {
        "file:DIR                            a file-store directory"
    }

    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let dir = dir_of(url)?;
        probe(&dir, options)?;
        Ok(OpenedStore::both(FileStore::open(dir).await?, url))
    }

    async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        let dir = dir_of(url)?;
        probe(&dir, options)?;
        Ok(dir.join(META_FILE).is_file())
    }

    fn local_path(&self, url: &StoreUrl) -> Option<PathBuf> {
        dir_of(url).ok()
    }
}
