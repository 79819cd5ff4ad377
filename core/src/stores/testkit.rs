//! Test doubles shared by the typed stores' unit tests.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Backend, Key, KvStore, LogRecord, LogStore, MemoryStore, PutOptions, Result};

/// A memory store that counts its key-value reads; given a barrier, a
/// read and `next_seq` each wait there for the other, so that both
/// finish only when made at the same time.
#[derive(Default)]
pub(crate) struct CountingKv {
    pub(crate) store: MemoryStore,
    pub(crate) gets: std::sync::atomic::AtomicUsize,
    pub(crate) barrier: Option<tokio::sync::Barrier>,
}

impl CountingKv {
    async fn meet(&self) {
        if let Some(barrier) = &self.barrier {
            barrier.wait().await;
        }
    }
}

impl Backend for CountingKv {
    fn backend_name(&self) -> &'static str {
        "counting"
    }
}

#[async_trait]
impl KvStore for CountingKv {
    async fn get(&self, key: &Key) -> Result<Option<crate::KvEntry>> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.meet().await;
        self.store.get(key).await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<crate::Version> {
        self.store.put(key, value, options).await
    }

    async fn delete(&self, key: &Key, if_version: Option<crate::Version>) -> Result<bool> {
        self.store.delete(key, if_version).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.store.list(prefix).await
    }
}

#[async_trait]
impl LogStore for CountingKv {
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.store.append(log, records, ttl).await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        self.store.read_after(log, after, limit).await
    }

    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        self.meet().await;
        self.store.next_seq(log).await
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        self.store.trim(log, before).await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.store.delete_log(log).await
    }
}
