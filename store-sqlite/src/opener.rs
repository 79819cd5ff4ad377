//! `sqlite:PATH` URLs, for the [registry](mcp_persist_core::registry).

use std::path::PathBuf;

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl},
};

use crate::SqliteStore;

/// Opens `sqlite:PATH` (also `sqlite://PATH`): a database file.
///
/// With [`OpenMode::Existing`] the file must already be a SQLite database
/// this crate wrote; a missing, empty or foreign file is
/// [`Error::NotFound`] and is left as it was.
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteOpener;

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
        if options.mode == OpenMode::Existing {
            crate::schema::probe_existing(&path)?;
        }
        Ok(OpenedStore::both(SqliteStore::open(&path).await?, url))
    }
}
