//! A memory store whose writes take their time: the gaps in which a
//! process could stop, or another could read, made wide enough to see.

use std::time::Duration;

use mcp_persist_core::{
    Backend, Key, KvEntry, KvStore, MemoryStore, PutOptions, Result, Version, declare::Declaration,
};

/// A [`MemoryStore`] (sharing its data with the one it was made from)
/// whose puts of one declared kind, and whose deletes, wait first.
pub(crate) struct SlowStore {
    inner: MemoryStore,
    slow_puts: Option<(&'static Declaration, Duration)>,
    late_puts: Option<(&'static Declaration, Duration)>,
    slow_deletes: Option<Duration>,
}

impl SlowStore {
    /// No slower than `inner` until told.
    pub(crate) fn new(inner: MemoryStore) -> Self {
        SlowStore {
            inner,
            slow_puts: None,
            late_puts: None,
            slow_deletes: None,
        }
    }

    /// Puts of records of `kind` wait `delay` first.
    #[allow(dead_code)] // each test target slows what its gap needs
    pub(crate) fn puts_of(mut self, kind: &'static Declaration, delay: Duration) -> Self {
        self.slow_puts = Some((kind, delay));
        self
    }

    /// Puts of records of `kind` are written at once but return only
    /// `delay` later: the writer learns late what others can already read.
    #[allow(dead_code)] // each test target slows what its gap needs
    pub(crate) fn late_puts_of(mut self, kind: &'static Declaration, delay: Duration) -> Self {
        self.late_puts = Some((kind, delay));
        self
    }

    /// Every delete waits `delay` first.
    #[allow(dead_code)] // each test target slows what its gap needs
    pub(crate) fn deletes(mut self, delay: Duration) -> Self {
        self.slow_deletes = Some(delay);
        self
    }
}

#[async_trait::async_trait]
impl KvStore for SlowStore {
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        self.inner.get(key).await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        if let Some((kind, delay)) = self.slow_puts
            && kind.matches(key.as_str())
        {
            tokio::time::sleep(delay).await;
        }
        let written = self.inner.put(key, value, options).await;
        if let Some((kind, delay)) = self.late_puts
            && kind.matches(key.as_str())
        {
            tokio::time::sleep(delay).await;
        }
        written
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        if let Some(delay) = self.slow_deletes {
            tokio::time::sleep(delay).await;
        }
        self.inner.delete(key, if_version).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.inner.list(prefix).await
    }
}

impl Backend for SlowStore {
    fn backend_name(&self) -> &'static str {
        "slow-memory"
    }
}
