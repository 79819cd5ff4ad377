//! `file:DIR` URLs, for the [registry](mcp_persist_core::registry).

use std::path::PathBuf;

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl},
};

use crate::{FileStore, store::META_FILE};

/// Opens `file:DIR` (also `file://DIR`): a file-store directory.
///
/// With [`OpenMode::Existing`] the directory must already hold a store (its
/// `store.json`); anything else is [`Error::NotFound`] and is left as it
/// was.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileOpener;

#[async_trait]
impl Opener for FileOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["file"]
    }

    fn forms(&self) -> &'static str {
        "file:DIR                            a file-store directory"
    }

    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let rest = url.rest();
        let dir = PathBuf::from(rest.strip_prefix("//").unwrap_or(rest));
        if dir.as_os_str().is_empty() {
            return Err(Error::invalid(
                "store URL",
                format!("`{url}` names no directory; write file:DIR, e.g. file:./state"),
            ));
        }
        if options.mode == OpenMode::Existing && !dir.join(META_FILE).is_file() {
            return Err(Error::NotFound {
                what: "store",
                detail: Some(format!(
                    "not a store: {} holds no {META_FILE} (nothing was created)",
                    dir.display()
                )),
            });
        }
        Ok(OpenedStore::both(FileStore::open(dir).await?, url))
    }
}
