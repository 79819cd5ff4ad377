//! [`Observed`]: a backend whose every call is a `store {operation}` span
//! and, with metrics on, a sample of `mcp_persist.store.operation.duration`
//! (see [`telemetry`](crate::telemetry)).

use std::{fmt, future::Future, sync::Arc, time::Duration, time::Instant};

use async_trait::async_trait;
use tracing::{Instrument, field::Empty};

use crate::{
    Backend, Key, KvEntry, KvStore, LogRecord, LogStore, PutOptions, Result, Version,
    declare::Space,
    telemetry::{Telemetry, error_type, kind_of_key, kind_of_log},
};

/// A backend observed: each call is a DEBUG span named `store {operation}`
/// with `db.system.name` (the backend), `db.operation.name`,
/// `mcp_persist.record.kind` (the kind of record the key belongs to, never
/// the key) and, when it fails, `error.type`; its duration goes to the
/// [`Telemetry`]'s histogram. Everything else is the backend's, unchanged.
/// [`Stores`](crate::Stores) puts one in front of each of its backends.
///
/// `wait_after` (a tail that waits by design) is passed through unobserved.
pub struct Observed<S: ?Sized> {
    inner: Arc<S>,
    telemetry: Telemetry,
}

impl<S: ?Sized> Clone for Observed<S> {
    fn clone(&self) -> Self {
        Observed {
            inner: self.inner.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<S: Backend + ?Sized> fmt::Debug for Observed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed")
            .field("backend", &self.inner.backend_name())
            .field("telemetry", &self.telemetry)
            .finish()
    }
}

impl<S: ?Sized> Observed<S> {
    /// Observes calls to `inner`, recording their durations to `telemetry`.
    pub fn new(inner: Arc<S>, telemetry: Telemetry) -> Observed<S> {
        Observed { inner, telemetry }
    }

    /// The backend observed.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }
}

/// The kind of record (or log) `key` names, for attributes.
fn kind_of(space: Space, key: &str) -> &'static str {
    match space {
        Space::Kv => kind_of_key(key),
        Space::Log => kind_of_log(key),
    }
}

impl<S: Backend + ?Sized> Observed<S> {
    async fn observe<T>(
        &self,
        name: &'static str,
        operation: &'static str,
        kind: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let backend = self.inner.backend_name();
        let span = tracing::debug_span!(
            "store",
            otel.name = name,
            otel.kind = "client",
            db.system.name = backend,
            db.operation.name = operation,
            mcp_persist.record.kind = kind,
            error.type = Empty,
        );
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let error = result.as_ref().err().map(error_type);
        if let Some(error) = error {
            span.record("error.type", error);
        }
        self.telemetry
            .store_operation(backend, operation, kind, started.elapsed(), error);
        result
    }
}

#[async_trait]
impl<S: Backend + ?Sized> Backend for Observed<S> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    async fn sweep_expired(&self) -> Result<u64> {
        self.observe(
            "store sweep_expired",
            "sweep_expired",
            "all",
            self.inner.sweep_expired(),
        )
        .await
    }

    async fn verify(&self) -> Result<Vec<String>> {
        self.inner.verify().await
    }
}

#[async_trait]
impl<S: KvStore + ?Sized> KvStore for Observed<S> {
    fn max_value_bytes(&self) -> usize {
        self.inner.max_value_bytes()
    }

    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let kind = kind_of(Space::Kv, key);
        self.observe("store get", "get", kind, self.inner.get(key))
            .await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let kind = kind_of(Space::Kv, key);
        self.observe(
            "store put",
            "put",
            kind,
            self.inner.put(key, value, options),
        )
        .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let kind = kind_of(Space::Kv, key);
        self.observe(
            "store delete",
            "delete",
            kind,
            self.inner.delete(key, if_version),
        )
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let kind = kind_of(Space::Kv, prefix);
        self.observe("store list", "list", kind, self.inner.list(prefix))
            .await
    }
}

#[async_trait]
impl<S: LogStore + ?Sized> LogStore for Observed<S> {
    fn max_record_bytes(&self) -> usize {
        self.inner.max_record_bytes()
    }

    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        let kind = kind_of(Space::Log, log);
        self.observe(
            "store append",
            "append",
            kind,
            self.inner.append(log, records, ttl),
        )
        .await
    }

    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        let kind = kind_of(Space::Log, log);
        self.observe(
            "store append_unsynced",
            "append_unsynced",
            kind,
            self.inner.append_unsynced(log, records, ttl),
        )
        .await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        let kind = kind_of(Space::Log, log);
        self.observe(
            "store read_after",
            "read_after",
            kind,
            self.inner.read_after(log, after, limit),
        )
        .await
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        self.inner.wait_after(log, after, limit, timeout).await
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        let kind = kind_of(Space::Log, log);
        self.observe("store trim", "trim", kind, self.inner.trim(log, before))
            .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        let kind = kind_of(Space::Log, log);
        self.observe(
            "store delete_log",
            "delete_log",
            kind,
            self.inner.delete_log(log),
        )
        .await
    }

    async fn quarantine_log(&self, log: &Key) -> Result<Option<String>> {
        self.inner.quarantine_log(log).await
    }
}
