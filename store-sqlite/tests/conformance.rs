//! The core conformance suite, on a database file that each `open_*` call
//! opens again from scratch (a new writer thread and new connections), the
//! way a restarted process would.

use std::{path::PathBuf, sync::Arc};

use async_trait::async_trait;
use mcp_persist_core::{
    KvStore, LogStore,
    conformance::{KvFixture, LogFixture},
};
use mcp_persist_store_sqlite::SqliteStore;
use tempfile::TempDir;

struct Fixture {
    dir: TempDir,
}

impl Fixture {
    fn path(&self) -> PathBuf {
        self.dir.path().join("store.db")
    }

    async fn open(&self) -> SqliteStore {
        SqliteStore::open(self.path())
            .await
            .expect("open the SQLite store")
    }
}

#[async_trait]
impl KvFixture for Fixture {
    async fn open_kv(&self) -> Arc<dyn KvStore> {
        Arc::new(self.open().await)
    }
}

#[async_trait]
impl LogFixture for Fixture {
    async fn open_log(&self) -> Arc<dyn LogStore> {
        Arc::new(self.open().await)
    }
}

async fn fixture() -> Fixture {
    Fixture {
        dir: tempfile::tempdir().expect("temp dir"),
    }
}

mcp_persist_core::kv_conformance!(fixture());
mcp_persist_core::log_conformance!(fixture());

/// The in-memory database passes the same suite, opened once: reopening an
/// in-memory database would start empty, so the fixture hands out clones.
mod in_memory {
    use super::*;

    struct Memory(SqliteStore);

    #[async_trait]
    impl KvFixture for Memory {
        async fn open_kv(&self) -> Arc<dyn KvStore> {
            Arc::new(self.0.clone())
        }
    }

    #[async_trait]
    impl LogFixture for Memory {
        async fn open_log(&self) -> Arc<dyn LogStore> {
            Arc::new(self.0.clone())
        }
    }

    async fn memory() -> Memory {
        Memory(
            SqliteStore::open_in_memory()
                .await
                .expect("in-memory store"),
        )
    }

    mcp_persist_core::kv_conformance!(memory());
    mcp_persist_core::log_conformance!(memory());
}
