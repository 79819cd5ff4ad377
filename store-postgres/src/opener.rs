//! `postgres://` and `postgresql://` URLs, for the
//! [registry](mcp_persist_core::registry).

use async_trait::async_trait;
use mcp_persist_core::{
    Result,
    registry::{OpenOptions, OpenedStore, Opener, StoreUrl},
};

use crate::PostgresStore;

/// Opens `postgres://USER:PASSWORD@HOST:PORT/DATABASE[?schema=NAME]`
/// (`postgresql://` too; `sslmode=require` for TLS).
///
/// Under [`OpenMode::Existing`] and [`OpenMode::ReadOnly`] the schema must
/// already hold a store: a missing schema, or one without the store's
/// tables, is [`Error::NotFound`](mcp_persist_core::Error::NotFound) and
/// nothing is created. [`OpenMode::ReadOnly`] also refuses a store of an
/// older schema version, which opening would migrate, with
/// [`Error::Unsupported`](mcp_persist_core::Error::Unsupported), and runs no
/// sweeper.
///
/// [`OpenMode::Existing`]: mcp_persist_core::registry::OpenMode::Existing
/// [`OpenMode::ReadOnly`]: mcp_persist_core::registry::OpenMode::ReadOnly
#[derive(Debug, Clone, Copy, Default)]
pub struct PostgresOpener;

#[async_trait]
impl Opener for PostgresOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["postgres", "postgresql"]
    }

    fn forms(&self) -> &'static str {
        "postgres://USER:PASS@HOST:PORT/DB[?schema=S]
                                    a Postgres database (sslmode=require for TLS)"
    }

    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let store = PostgresStore::builder(url.as_str())
            .open_mode(options.mode)
            .connect()
            .await?;
        Ok(OpenedStore::both(store, url))
    }
}
