//! The core conformance suite, on a fresh store directory per test. Every
//! `open_kv` / `open_log` opens the directory again, as a restarted process
//! would, so reopen tests prove durability.

use std::sync::Arc;

use async_trait::async_trait;
use mcp_persist_core::{
    KvStore, LogStore,
    conformance::{KvFixture, LogFixture},
};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn open(&self) -> FileStore {
        // Small segments, so that log tests cross segment boundaries.
        let options = FileStoreOptions::default().segment_bytes(2048);
        FileStore::open_with(self.dir.path().join("store"), options)
            .await
            .expect("open file store")
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
