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
    /// Runs `call` in its span, timed for the metrics; `kind` names the
    /// kind of record it is about. With the span disabled and no metrics,
    /// it is `call` alone: nothing is looked up or timed that no one would
    /// see (two clock reads and a declaration lookup on every event a
    /// server stores).
    async fn observe<T>(
        &self,
        name: &'static str,
        operation: &'static str,
        kind: impl Fn() -> &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let backend = self.inner.backend_name();
        let span = tracing::debug_span!(
            "store",
            otel.name = name,
            otel.kind = "client",
            db.system.name = backend,
            db.operation.name = operation,
            mcp_persist.record.kind = kind(),
            error.type = Empty,
        );
        let metrics = self.telemetry.records_metrics();
        if span.is_disabled() && !metrics {
            return call.await;
        }
        let started = metrics.then(Instant::now);
        let result = call.instrument(span.clone()).await;
        let error = result.as_ref().err().map(error_type);
        if let Some(error) = error {
            span.record("error.type", error);
        }
        if let Some(started) = started {
            self.telemetry
                .store_operation(backend, operation, kind(), started.elapsed(), error);
        }
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
            || "all",
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
        self.observe(
            "store get",
            "get",
            || kind_of(Space::Kv, key),
            self.inner.get(key),
        )
        .await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        self.observe(
            "store put",
            "put",
            || kind_of(Space::Kv, key),
            self.inner.put(key, value, options),
        )
        .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        self.observe(
            "store delete",
            "delete",
            || kind_of(Space::Kv, key),
            self.inner.delete(key, if_version),
        )
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.observe(
            "store list",
            "list",
            || kind_of(Space::Kv, prefix),
            self.inner.list(prefix),
        )
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
        self.observe(
            "store append",
            "append",
            || kind_of(Space::Log, log),
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
        self.observe(
            "store append_unsynced",
            "append_unsynced",
            || kind_of(Space::Log, log),
            self.inner.append_unsynced(log, records, ttl),
        )
        .await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        self.observe(
            "store read_after",
            "read_after",
            || kind_of(Space::Log, log),
            self.inner.read_after(log, after, limit),
        )
        .await
    }

    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        self.observe(
            "store next_seq",
            "next_seq",
            || kind_of(Space::Log, log),
            self.inner.next_seq(log),
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
        self.observe(
            "store trim",
            "trim",
            || kind_of(Space::Log, log),
            self.inner.trim(log, before),
        )
        .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.observe(
            "store delete_log",
            "delete_log",
            || kind_of(Space::Log, log),
            self.inner.delete_log(log),
        )
        .await
    }

    async fn quarantine_log(&self, log: &Key) -> Result<Option<String>> {
        self.inner.quarantine_log(log).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tracing::{
        Id, Metadata, Subscriber,
        field::{Field, Visit},
        span::{Attributes, Record},
    };

    use super::*;
    use crate::{MemoryStore, PutMode, declare};

    /// What a `store` span said: its name, record kind and error type.
    #[derive(Debug, Default, Clone, PartialEq)]
    struct Seen {
        name: String,
        kind: String,
        error: Option<String>,
    }

    impl Visit for Seen {
        fn record_str(&mut self, field: &Field, value: &str) {
            match field.name() {
                "otel.name" => self.name = value.to_owned(),
                "mcp_persist.record.kind" => self.kind = value.to_owned(),
                "error.type" => self.error = Some(value.to_owned()),
                _ => {}
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn fmt::Debug) {}
    }

    /// Keeps every span's fields, at every level.
    #[derive(Default, Clone)]
    struct Capture(Arc<Mutex<Vec<Seen>>>);

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut seen = Seen::default();
            span.record(&mut seen);
            let mut spans = self.0.lock().unwrap();
            spans.push(seen);
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, span: &Id, values: &Record<'_>) {
            let mut spans = self.0.lock().unwrap();
            values.record(&mut spans[span.into_u64() as usize - 1]);
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    fn observed() -> Observed<MemoryStore> {
        Observed::new(Arc::new(MemoryStore::new()), Telemetry::disabled())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn store_spans_name_the_kind_of_record_and_the_error() {
        let capture = Capture::default();
        let _default = tracing::subscriber::set_default(capture.clone());
        let store = observed();
        let log = declare::EVENT.try_key(&["stream-1"]).expect("a log");
        store
            .append(&log, vec![b"x".to_vec()], None)
            .await
            .expect("appended");
        let session = declare::SERVER_SESSION.try_key(&["s-1"]).expect("a key");
        let refused = store
            .put(
                &session,
                b"{}".to_vec(),
                PutOptions::new(PutMode::Update(Version::new(7))),
            )
            .await
            .expect_err("no record at that version");
        assert_eq!(store.sweep_expired().await.expect("swept"), 0);
        let seen = capture.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                Seen {
                    name: "store append".into(),
                    kind: "event".into(),
                    error: None,
                },
                Seen {
                    name: "store put".into(),
                    kind: "server_session".into(),
                    error: Some(error_type(&refused).into()),
                },
                Seen {
                    name: "store sweep_expired".into(),
                    kind: "all".into(),
                    error: None,
                },
            ]
        );
    }

    /// With no one listening (no span, no metrics) a call is the backend's
    /// alone, with the same outcome.
    #[tokio::test(flavor = "current_thread")]
    async fn unobserved_calls_reach_the_backend_unchanged() {
        let store = observed();
        let log = declare::EVENT.try_key(&["stream-1"]).expect("a log");
        for expected in 1..=3 {
            let seqs = store
                .append(&log, vec![b"x".to_vec()], None)
                .await
                .expect("appended");
            assert_eq!(seqs, [expected]);
        }
        let records = store.read_after(&log, 1, 10).await.expect("read");
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3]);
        let held = store.inner().read_after(&log, 0, 10).await.expect("read");
        assert_eq!(held.len(), 3, "the backend behind holds what was appended");
    }
}
