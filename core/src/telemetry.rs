//! What the crates tell an operator: `tracing` spans any subscriber can
//! export, and, with the feature `otel`, OpenTelemetry metrics.
//!
//! # Spans
//!
//! Spans are plain [`tracing`] spans, named and attributed after the
//! OpenTelemetry semantic conventions where they exist, so that
//! `tracing-opentelemetry` (or any subscriber) exports them as they are:
//!
//! | span | level | attributes |
//! |---|---|---|
//! | `store {operation}` (a child of whatever reached the store) | DEBUG | `db.system.name` (the backend), `db.operation.name`, `mcp_persist.record.kind`, `error.type` |
//! | client and server requests, session restore, recovery, replay, tasks, the bus | INFO | see `mcp-persist-transport-http`'s `telemetry` module |
//!
//! A store span names the record's *kind*, never its key: keys hold session
//! ids, principals and task ids.
//!
//! # Metrics
//!
//! A [`Telemetry`] made with `Telemetry::global()` or
//! `Telemetry::with_meter_provider(..)` (feature `otel`) records through the
//! OpenTelemetry metrics API; no exporter is chosen here, the application
//! installs its own. [`Stores::with_telemetry`](crate::Stores::with_telemetry)
//! hands it to every store of a bundle, and the transport's builders take it
//! from there. The instruments (names as exported):
//!
//! | instrument | kind | unit | attributes | what it says |
//! |---|---|---|---|---|
//! | `mcp_persist.store.operation.duration` | histogram | s | `db.system.name`, `db.operation.name`, `mcp_persist.record.kind`, `error.type` | each backend call |
//! | `mcp.client.operation.duration` | histogram | s | `mcp.method.name`, `gen_ai.tool.name`, `mcp.protocol.version`, `error.type` | a request of the durable client, sent to answered |
//! | `mcp.server.operation.duration` | histogram | s | the same | a request served by a durable server |
//! | `mcp_persist.events.appended` | counter | {event} | `mcp_persist.durability` | SSE events written to the event log |
//! | `mcp_persist.events.replayed` | counter | {event} | | events sent again after a `Last-Event-ID` |
//! | `mcp_persist.sessions.restored` | counter | {session} | `mcp_persist.side` (`client`, `server`) | sessions taken up from the store instead of a new handshake |
//! | `mcp_persist.tasks.transitions` | counter | {task} | `mcp_persist.task.status` | tasks entering each status |
//! | `mcp_persist.tasks.takeovers` | counter | {task} | | tasks run again on another instance after their owner stopped |
//! | `mcp_persist.leases.lost` | counter | {lease} | | task leases this instance found taken or expired while it ran |
//! | `mcp_persist.bus.lag` | histogram | s | | publish to delivery, per delivered notice |
//! | `mcp_persist.journal.pending` | up-down counter | {request} | | client requests journaled and not yet answered |
//! | `mcp_persist.credentials.refreshes` | counter | {refresh} | `mcp_persist.outcome` (`ok`, `failed`) | access-token refreshes |
//!
//! Without the feature (or with [`Telemetry::disabled`]) every recording
//! method does nothing.
//!
//! # Session ids
//!
//! Spans carry `mcp.session.id` only as [`SessionIds`] says: hashed by
//! default (the first 16 hex digits of its SHA-256, enough to follow one
//! session, useless to present to a server), omitted, or raw when the
//! operator opts in.

use std::{fmt, time::Duration};

use sha2::{Digest, Sha256};

#[cfg(feature = "otel")]
use std::sync::Arc;

/// How session ids appear in spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SessionIds {
    /// The first 16 hex digits of the id's SHA-256 (the default).
    #[default]
    Hashed,
    /// Not at all.
    Omitted,
    /// As they are. A session id lets whoever holds it (and the session's
    /// principal) act in the session: opt in only where spans are as
    /// private as the sessions.
    Raw,
}

/// Which side of the protocol recorded something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Side {
    /// A durable client.
    Client,
    /// A durable server.
    Server,
}

impl Side {
    /// `client` or `server`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// One MCP operation, for the `mcp.{client,server}.operation.duration`
/// histograms.
#[derive(Debug, Clone, Copy)]
pub struct Operation<'a> {
    /// Which side.
    pub side: Side,
    /// `mcp.method.name`.
    pub method: &'a str,
    /// `gen_ai.tool.name`, for `tools/call`.
    pub tool: Option<&'a str>,
    /// `mcp.protocol.version`.
    pub protocol_version: Option<&'a str>,
    /// `error.type`: the JSON-RPC error code, or a short name of what failed.
    pub error: Option<&'a str>,
}

/// Where the crates' metrics go, and how session ids appear in spans. Cheap
/// to clone; see the [module docs](self).
#[derive(Clone, Default)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    metrics: Option<Arc<otel::Instruments>>,
    session_ids: SessionIds,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("metrics", &self.records_metrics())
            .field("session_ids", &self.session_ids)
            .finish()
    }
}

impl Telemetry {
    /// Spans only: no metrics are recorded.
    pub fn disabled() -> Self {
        Telemetry::default()
    }

    /// Metrics through OpenTelemetry's global meter provider, as it is when
    /// this is called: install the application's provider first.
    #[cfg(feature = "otel")]
    pub fn global() -> Self {
        Telemetry::with_meter(opentelemetry::global::meter_with_scope(otel::scope()))
    }

    /// Metrics through `provider` (an SDK `SdkMeterProvider`, say).
    #[cfg(feature = "otel")]
    pub fn with_meter_provider(provider: &impl opentelemetry::metrics::MeterProvider) -> Self {
        Telemetry::with_meter(provider.meter_with_scope(otel::scope()))
    }

    #[cfg(feature = "otel")]
    fn with_meter(meter: opentelemetry::metrics::Meter) -> Self {
        Telemetry {
            metrics: Some(Arc::new(otel::Instruments::new(&meter))),
            session_ids: SessionIds::default(),
        }
    }

    /// How session ids appear in spans (hashed by default).
    pub fn session_ids(mut self, policy: SessionIds) -> Self {
        self.session_ids = policy;
        self
    }

    /// Whether metrics are recorded.
    pub fn records_metrics(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.metrics.is_some()
        }
        #[cfg(not(feature = "otel"))]
        {
            false
        }
    }

    /// The value of `mcp.session.id` for the session `id`, as
    /// [`SessionIds`] says; `None` when omitted.
    pub fn session_attribute(&self, id: &str) -> Option<String> {
        match self.session_ids {
            SessionIds::Hashed => Some(hash_session_id(id)),
            SessionIds::Omitted => None,
            SessionIds::Raw => Some(id.to_owned()),
        }
    }

    /// A backend call took `elapsed`; `error` names what failed.
    pub fn store_operation(
        &self,
        backend: &'static str,
        operation: &'static str,
        kind: &'static str,
        elapsed: Duration,
        error: Option<&'static str>,
    ) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.store_operation(backend, operation, kind, elapsed, error);
        }
        #[cfg(not(feature = "otel"))]
        let _ = (backend, operation, kind, elapsed, error);
    }

    /// An MCP request took `elapsed`, sent to answered (client) or received
    /// to answered (server).
    pub fn operation(&self, operation: Operation<'_>, elapsed: Duration) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.operation(operation, elapsed);
        }
        #[cfg(not(feature = "otel"))]
        let _ = (operation, elapsed);
    }

    /// `n` events were written to the event log at `durability`.
    pub fn events_appended(&self, n: u64, durability: &'static str) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.events_appended
                .add(n, &[otel::kv("mcp_persist.durability", durability)]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = (n, durability);
    }

    /// `n` events were sent again after a `Last-Event-ID`.
    pub fn events_replayed(&self, n: u64) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.events_replayed.add(n, &[]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = n;
    }

    /// A session was taken up from the store on `side`.
    pub fn session_restored(&self, side: Side) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.sessions_restored
                .add(1, &[otel::kv("mcp_persist.side", side.as_str())]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = side;
    }

    /// A task entered `status` (`working`, `input_required`, `completed`,
    /// `failed`, `cancelled`).
    pub fn task_status(&self, status: &'static str) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.task_transitions
                .add(1, &[otel::kv("mcp_persist.task.status", status)]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = status;
    }

    /// A task was taken over from a stopped owner, to run again here.
    pub fn task_takeover(&self) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.task_takeovers.add(1, &[]);
        }
    }

    /// A lease this instance held was found taken or expired.
    pub fn lease_lost(&self) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.leases_lost.add(1, &[]);
        }
    }

    /// A bus notice reached this instance `lag` after it was published.
    pub fn bus_delivered(&self, lag: Duration) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.bus_lag.record(lag.as_secs_f64(), &[]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = lag;
    }

    /// The client's journal holds `delta` more (or fewer) requests.
    pub fn journal_pending(&self, delta: i64) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            m.journal_pending.add(delta, &[]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = delta;
    }

    /// An access token was refreshed (`ok`) or a refresh failed.
    pub fn credential_refresh(&self, ok: bool) {
        #[cfg(feature = "otel")]
        if let Some(m) = &self.metrics {
            let outcome = if ok { "ok" } else { "failed" };
            m.credential_refreshes
                .add(1, &[otel::kv("mcp_persist.outcome", outcome)]);
        }
        #[cfg(not(feature = "otel"))]
        let _ = ok;
    }
}

/// The kind of record `key` belongs to (`server_session`, `in_flight_request`,
/// ...), or `other`: what spans name instead of a key, which may hold a
/// session id, a principal or a task id.
pub fn kind_of_key(key: &str) -> &'static str {
    crate::declare::of_key_in(crate::declare::Space::Kv, key).map_or("other", |d| d.kind)
}

/// The kind of log `log` is (`event_log`, `fleet_notice`, ...), or `other`.
pub fn kind_of_log(log: &str) -> &'static str {
    crate::declare::of_key_in(crate::declare::Space::Log, log).map_or("other", |d| d.kind)
}

/// The first 16 hex digits of the SHA-256 of a session id.
pub fn hash_session_id(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    crate::kit::hex(&digest[..8])
}

/// A short, stable name of what an error is, for `error.type`.
pub fn error_type(error: &crate::Error) -> &'static str {
    use crate::Error as E;
    match error {
        E::AlreadyExists { .. } => "already_exists",
        E::Conflict { .. } => "conflict",
        E::Corrupt { .. } => "corrupt",
        E::NewerSchema { .. } => "newer_schema",
        E::TooLarge { .. } => "too_large",
        E::Unsupported { .. } => "unsupported",
        E::InvalidInput { .. } => "invalid_input",
        E::NotFound { .. } => "not_found",
        E::Unavailable { .. } => "unavailable",
        E::Backend { .. } => "backend",
        E::Sealing { .. } => "sealing",
        E::Refresh { .. } => "refresh",
        E::Timeout { .. } => "timeout",
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::time::Duration;

    use opentelemetry::{
        InstrumentationScope, KeyValue,
        metrics::{Counter, Histogram, Meter, UpDownCounter},
    };

    use super::Operation;

    pub(super) fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("mcp-persist")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build()
    }

    pub(super) fn kv(key: &'static str, value: &'static str) -> KeyValue {
        KeyValue::new(key, value)
    }

    /// Bucket bounds in seconds: 100 µs to 10 s, for store calls and
    /// requests alike.
    const BOUNDS: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ];

    pub(super) struct Instruments {
        store_duration: Histogram<f64>,
        client_duration: Histogram<f64>,
        server_duration: Histogram<f64>,
        pub(super) events_appended: Counter<u64>,
        pub(super) events_replayed: Counter<u64>,
        pub(super) sessions_restored: Counter<u64>,
        pub(super) task_transitions: Counter<u64>,
        pub(super) task_takeovers: Counter<u64>,
        pub(super) leases_lost: Counter<u64>,
        pub(super) bus_lag: Histogram<f64>,
        pub(super) journal_pending: UpDownCounter<i64>,
        pub(super) credential_refreshes: Counter<u64>,
    }

    impl Instruments {
        pub(super) fn new(meter: &Meter) -> Self {
            let seconds = |name: &'static str, description: &'static str| {
                meter
                    .f64_histogram(name)
                    .with_unit("s")
                    .with_description(description)
                    .with_boundaries(BOUNDS.to_vec())
                    .build()
            };
            let count = |name: &'static str, unit: &'static str, description: &'static str| {
                meter
                    .u64_counter(name)
                    .with_unit(unit)
                    .with_description(description)
                    .build()
            };
            Instruments {
                store_duration: seconds(
                    "mcp_persist.store.operation.duration",
                    "Duration of one call to a storage backend.",
                ),
                client_duration: seconds(
                    "mcp.client.operation.duration",
                    "Duration of an MCP request of the durable client, sent to answered.",
                ),
                server_duration: seconds(
                    "mcp.server.operation.duration",
                    "Duration of an MCP request served by a durable server, received to answered.",
                ),
                events_appended: count(
                    "mcp_persist.events.appended",
                    "{event}",
                    "SSE events written to the event log.",
                ),
                events_replayed: count(
                    "mcp_persist.events.replayed",
                    "{event}",
                    "SSE events sent again after a Last-Event-ID.",
                ),
                sessions_restored: count(
                    "mcp_persist.sessions.restored",
                    "{session}",
                    "Sessions taken up from the store instead of a new handshake.",
                ),
                task_transitions: count(
                    "mcp_persist.tasks.transitions",
                    "{task}",
                    "Tasks entering a status.",
                ),
                task_takeovers: count(
                    "mcp_persist.tasks.takeovers",
                    "{task}",
                    "Tasks run again on this instance after their owner stopped.",
                ),
                leases_lost: count(
                    "mcp_persist.leases.lost",
                    "{lease}",
                    "Task leases found taken or expired while this instance ran the task.",
                ),
                bus_lag: seconds(
                    "mcp_persist.bus.lag",
                    "Time from a bus notice's publication to its delivery on this instance.",
                ),
                journal_pending: meter
                    .i64_up_down_counter("mcp_persist.journal.pending")
                    .with_unit("{request}")
                    .with_description("Client requests journaled and not yet answered.")
                    .build(),
                credential_refreshes: count(
                    "mcp_persist.credentials.refreshes",
                    "{refresh}",
                    "Access-token refreshes, by outcome.",
                ),
            }
        }

        pub(super) fn store_operation(
            &self,
            backend: &'static str,
            operation: &'static str,
            kind: &'static str,
            elapsed: Duration,
            error: Option<&'static str>,
        ) {
            let mut attributes = vec![
                kv("db.system.name", backend),
                kv("db.operation.name", operation),
                kv("mcp_persist.record.kind", kind),
            ];
            if let Some(error) = error {
                attributes.push(kv("error.type", error));
            }
            self.store_duration
                .record(elapsed.as_secs_f64(), &attributes);
        }

        pub(super) fn operation(&self, op: Operation<'_>, elapsed: Duration) {
            let mut attributes = vec![KeyValue::new("mcp.method.name", op.method.to_owned())];
            if let Some(tool) = op.tool {
                attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
            }
            if let Some(version) = op.protocol_version {
                attributes.push(KeyValue::new("mcp.protocol.version", version.to_owned()));
            }
            if let Some(error) = op.error {
                attributes.push(KeyValue::new("error.type", error.to_owned()));
            }
            let histogram = match op.side {
                super::Side::Client => &self.client_duration,
                super::Side::Server => &self.server_duration,
            };
            histogram.record(elapsed.as_secs_f64(), &attributes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_hashed_by_default_and_never_raw_unless_asked() {
        let id = "d3b07384-d9a0-4c9b-8d2f-5a8f0e0c9f11";
        let hashed = Telemetry::disabled().session_attribute(id).expect("hashed");
        assert_eq!(hashed.len(), 16);
        assert!(!hashed.contains(id) && !id.contains(&hashed));
        assert_eq!(hashed, hash_session_id(id), "stable");
        assert_ne!(hashed, hash_session_id("another"));
        assert_eq!(
            Telemetry::disabled()
                .session_ids(SessionIds::Omitted)
                .session_attribute(id),
            None
        );
        assert_eq!(
            Telemetry::disabled()
                .session_ids(SessionIds::Raw)
                .session_attribute(id)
                .as_deref(),
            Some(id)
        );
    }
}
