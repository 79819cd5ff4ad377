//! The whole conformance suite (key-value, log, typed, crash) on a database
//! file that each open opens again from scratch (a new writer thread and new
//! connections), the way a restarted process would.

use mcp_persist_store_sqlite::SqliteStore;

mcp_persist_core::backend_conformance!(open: |place| async move {
    SqliteStore::open(place.dir.join("store.db")).await
});

/// The in-memory database passes the same suite, opened once: reopening an
/// in-memory database would start empty, so the fixture hands out clones.
mod in_memory {
    use std::sync::Arc;

    use async_trait::async_trait;
    use mcp_persist_core::{
        KvStore, LogStore,
        conformance::{KvFixture, LogFixture},
    };
    use mcp_persist_store_sqlite::SqliteStore;

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

/// Opened by URL: a missing database file is not a store to `ReadOnly`
/// and `Existing`, twice over, and only `Create` makes one.
#[tokio::test]
async fn open_modes() {
    use mcp_persist_core::conformance::opener::{Absent, open_modes};
    let dir = tempfile::tempdir().expect("a temporary folder");
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    open_modes(
        mcp_persist_store_sqlite::SqliteOpener,
        &url,
        &url,
        Absent::NotAStore,
    )
    .await;
}
