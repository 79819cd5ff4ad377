//! `postgres://` and `postgresql://` URLs, for the
//! [registry](mcp_persist_core::registry).

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{self, OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl},
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

    /// Checks the URL as `open` does. Under [`OpenMode::Create`], which
    /// makes the schema's store when it is missing, it also asks the
    /// server, read-only, whether the store is there (`false`: opening
    /// would make it), so that a dry run says so and a tool opens what it
    /// would make last. The other modes make nothing; `open` refuses a
    /// missing store there.
    async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        crate::store::check_url(url.as_str())?;
        if options.mode != OpenMode::Create {
            return Ok(true);
        }
        match registry::there_read_only(self, url).await {
            // An older store: there, and a writable open migrates it.
            Err(Error::Unsupported { .. }) => Ok(true),
            found => found,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dry run and a split store ask `exists` before anything is opened:
    /// it refuses each URL `open` refuses, with the same words, and neither
    /// connects (the host does not resolve).
    #[tokio::test]
    async fn exists_refuses_what_open_refuses() {
        mcp_persist_core::conformance::opener::refused_alike(
            PostgresOpener,
            &[
                ("postgres://app:pw@nowhere.invalid/data?bogus=1", "bogus"),
                (
                    "postgres://app:pw@nowhere.invalid/data?schema=Bad-Name",
                    "schema name",
                ),
                ("postgres://nowhere.invalid/data", "names no user"),
                ("postgres:///data", "names no host"),
            ],
        )
        .await;
        let good =
            StoreUrl::parse("postgres://app:pw@nowhere.invalid/data?schema=app1").expect("parses");
        assert!(
            PostgresOpener
                .exists(&good, OpenOptions::read_only())
                .await
                .expect("a well-formed URL is checked without connecting")
        );
    }
}
