//! What instrumentation costs: the same work with telemetry off (no
//! `tracing` subscriber, metrics disabled) and on (a `tracing-opentelemetry`
//! layer exporting every span into the SDK's in-memory exporter, and every
//! metric recorded into an SDK meter provider), in the same run, each mode
//! on a runtime of its own whose threads carry its subscriber:
//!
//! * steady-state tool calls/s of the durable client against a durable
//!   server (legacy sessions, every SSE event in the event log), on SQLite
//!   and in memory;
//! * SQLite event-log appends/s, one stream and 64 streams at once.
//!
//! Spans are taken at `info` (the MCP spans), and once more with every
//! store call's span (`debug`) too. Rounds alternate off and on, and each
//! figure is the best of its rounds.
//!
//! `cargo bench -p mcp-persist-transport-http --bench bench_otel --features otel`
//! (`cargo xtask bench otel`; bounded: about two minutes).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use mcp_persist_core::{EventLogConfig, MemoryStore, Stores, telemetry::Telemetry};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{client::DurableClientBuilder, server::DurableServer};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::{
    metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider},
    trace::{InMemorySpanExporter, SdkTracerProvider},
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
        ServerConfig,
    },
    service::RequestContext,
};
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _};

#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]).into())
    }
}

const STEADY: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 5;
const STREAMS: usize = 64;

/// A mode: its subscriber (none when off), and where metrics go.
#[derive(Clone)]
struct Mode {
    dispatch: Option<tracing::Dispatch>,
    telemetry: Telemetry,
    /// Kept alive while the mode runs.
    _providers: Option<Arc<(SdkTracerProvider, SdkMeterProvider)>>,
}

impl Mode {
    fn off() -> Mode {
        Mode {
            dispatch: None,
            telemetry: Telemetry::disabled(),
            _providers: None,
        }
    }

    /// Spans at `filter` into an in-memory exporter, through the batch
    /// processor an application exports with (as `examples/otel.rs` does;
    /// the simple processor exports each span on the thread that ends it,
    /// under a lock, and is meant for tests); metrics into an SDK meter
    /// provider.
    fn on(filter: &str) -> Mode {
        let exporter = InMemorySpanExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer_provider.tracer("bench"))
            .with_filter(tracing_subscriber::EnvFilter::new(filter));
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
            .build();
        Mode {
            dispatch: Some(dispatch),
            telemetry: Telemetry::with_meter_provider(&meter_provider),
            _providers: Some(Arc::new((tracer_provider, meter_provider))),
        }
    }

    /// A runtime whose every thread (workers and blocking pool) has this
    /// mode's subscriber as its default.
    fn runtime(&self) -> Result<tokio::runtime::Runtime> {
        let dispatch = self.dispatch.clone();
        Ok(tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || {
                if let Some(dispatch) = &dispatch {
                    std::mem::forget(tracing::dispatcher::set_default(dispatch));
                }
            })
            .build()?)
    }

    fn run<T>(&self, work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let runtime = self.runtime()?;
        let result = match &self.dispatch {
            Some(dispatch) => {
                tracing::dispatcher::with_default(dispatch, || runtime.block_on(work))
            }
            None => runtime.block_on(work),
        };
        runtime.shutdown_timeout(Duration::from_secs(5));
        result
    }
}

/// Steady calls/s of a durable client to a durable server on `backend`.
async fn calls(mode: Mode, backend: &str, folder: &std::path::Path, round: usize) -> Result<f64> {
    let stores = |name: &str| {
        let path = folder.join(format!("{name}-{backend}-{round}.db"));
        let backend = backend.to_owned();
        let telemetry = mode.telemetry.clone();
        async move {
            let stores = if backend == "memory" {
                Stores::new(MemoryStore::new())
            } else {
                Stores::new(SqliteStore::open(path).await?)
            };
            Ok::<_, anyhow::Error>(stores.with_telemetry(telemetry))
        }
    };
    let server = DurableServer::builder(stores("server").await?).build()?;
    let router = axum::Router::new().nest_service("/mcp", server.service(|| Ok(Echo)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let serving = tokio::spawn(async move { axum::serve(listener, router).await });
    let client_stores = stores("client").await?;
    let (transport, _handle) = DurableClientBuilder::new(&url, &client_stores)
        .build()
        .await?;
    let client = ().serve(transport).await?;
    client.call_tool(CallToolRequestParams::new("echo")).await?;
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < STEADY {
        client.call_tool(CallToolRequestParams::new("echo")).await?;
        n += 1;
    }
    let rate = f64::from(n) / start.elapsed().as_secs_f64();
    client.cancel().await?;
    serving.abort();
    Ok(rate)
}

/// SQLite event-log appends/s over `streams` streams at once.
async fn appends(
    mode: Mode,
    streams: usize,
    folder: &std::path::Path,
    round: usize,
) -> Result<f64> {
    let path = folder.join(format!(
        "appends-{streams}-{round}-{}.db",
        mode.dispatch.is_some()
    ));
    let stores = Stores::new(SqliteStore::open(path).await?).with_telemetry(mode.telemetry.clone());
    let events = stores.events(EventLogConfig::default())?;
    let payload = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": 1}});
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let events = events.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let stream = format!("stream-{s}");
            let mut n = 0u64;
            while start.elapsed() < STEADY {
                events.append(&stream, None, &payload).await?;
                n += 1;
            }
            Ok::<_, anyhow::Error>(n)
        }));
    }
    let mut total = 0u64;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The best of alternating rounds, off then on: `(off, on)`.
fn compare(on: &Mode, measure: impl Fn(Mode, usize) -> Result<f64>) -> Result<(f64, f64)> {
    let (mut off_best, mut on_best) = (0f64, 0f64);
    for round in 0..ROUNDS {
        off_best = off_best.max(measure(Mode::off(), round)?);
        on_best = on_best.max(measure(on.clone(), round)?);
    }
    Ok((off_best, on_best))
}

fn main() -> Result<()> {
    let folder = tempfile::tempdir()?;
    let dir = folder.path();
    let mut rows = Vec::new();
    for (spans, filter) in [
        ("info", "info"),
        ("info + store calls at debug", "info,mcp_persist_core=debug"),
    ] {
        let on = Mode::on(filter);
        for backend in ["SQLite", "memory"] {
            let (off, on_rate) = compare(&on, |mode, round| {
                mode.clone().run(calls(mode, backend, dir, round))
            })?;
            rows.push((format!("tool calls/s, {backend}"), spans, off, on_rate));
        }
        for streams in [1, STREAMS] {
            let (off, on_rate) = compare(&on, |mode, round| {
                mode.clone().run(appends(mode, streams, dir, round))
            })?;
            rows.push((
                format!("SQLite appends/s, {streams} stream(s)"),
                spans,
                off,
                on_rate,
            ));
        }
    }
    println!("| measure | spans exported | telemetry off | on | ratio |");
    println!("|---|---|---|---|---|");
    for (measure, spans, off, on) in &rows {
        println!(
            "| {measure} | {spans} | {off:.0} | {on:.0} | {:.2} |",
            on / off
        );
    }
    let least = rows
        .iter()
        .filter(|(_, spans, _, _)| *spans == "info")
        .map(|(_, _, off, on)| on / off)
        .fold(f64::INFINITY, f64::min);
    println!(
        "aim: with telemetry on (spans at info, the MCP spans; every metric), tool calls/s and SQLite appends/s at >= 0.95 of off: the least is {least:.2} ({})",
        if least >= 0.95 { "met" } else { "not met" }
    );
    println!(
        "(store calls' debug spans, the second block, cost one exported span per backend call: a choice for debugging, not the aim)"
    );
    Ok(())
}
