//! A durable server and a durable client exporting their traces and
//! metrics over OTLP/HTTP, to a collector at `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (by default `http://localhost:4318`, where an OpenTelemetry Collector or
//! Jaeger listens).
//!
//! ```text
//! cargo run -p mcp-persist-transport-http --features otel --example otel
//! ```
//!
//! It starts a server on loopback, calls its tool once from a client inside
//! a span of its own (whose `traceparent` the call carries, so the client's
//! and the server's spans join it), and exits after flushing both
//! providers. Without a collector the exports fail and say so on stderr;
//! the program still runs.

use mcp_persist_core::{Stores, telemetry::Telemetry};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    client::DurableClientBuilder, server::DurableServer, telemetry::current_traceparent,
};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider, trace::SdkTracerProvider};
use rmcp::{
    ServerHandler, ServiceExt, model::CallToolRequestParams, tool, tool_handler, tool_router,
};
use tracing::Instrument;
use tracing_subscriber::{
    EnvFilter, Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt,
};

#[derive(Clone)]
struct Greeter;

#[tool_router]
impl Greeter {
    /// Says hello.
    #[tool]
    fn hello(&self) -> String {
        "hello".to_owned()
    }
}

#[tool_handler]
impl ServerHandler for Greeter {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let resource = Resource::builder()
        .with_service_name("mcp-persist-example")
        .build();
    // Traces: batched to the collector. The layer takes what `tracing`
    // records at `info` (the MCP spans) and `debug` for this crate family
    // (each store call), keeping rmcp's auth module at `info` so no token
    // can reach an exported span.
    let tracer_provider = SdkTracerProvider::builder()
        .with_batch_exporter(SpanExporter::builder().with_http().build()?)
        .with_resource(resource.clone())
        .build();
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer_provider.tracer("mcp-persist-example"))
        .with_filter(EnvFilter::new(
            "info,mcp_persist_core=debug,rmcp::transport::auth=info",
        ));
    tracing_subscriber::registry()
        .with(traces)
        .with(tracing_subscriber::fmt::layer().with_filter(EnvFilter::new("warn")))
        .init();
    // Metrics: exported every minute and at shutdown. The crates record
    // through the provider installed before the stores are built.
    let meter_provider = SdkMeterProvider::builder()
        .with_periodic_exporter(MetricExporter::builder().with_http().build()?)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_meter_provider(meter_provider.clone());

    let dir = tempfile::tempdir()?;
    let stores = Stores::new(SqliteStore::open(dir.path().join("state.db")).await?)
        .with_telemetry(Telemetry::global());

    let server = DurableServer::builder(stores.clone()).build()?;
    let service = server.service(|| Ok(Greeter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let router = axum::Router::new().nest_service("/mcp", service);
    tokio::spawn(async move { axum::serve(listener, router).await });

    let (transport, handle) = DurableClientBuilder::new(&url, &stores).build().await?;
    let client = ().serve(transport).await?;
    let job = tracing::info_span!("greet");
    let answer = async {
        let mut call = CallToolRequestParams::new("hello");
        // rmcp hands the call to a worker task: the span current here
        // reaches the transport only through the request's `_meta`.
        if let Some(traceparent) = current_traceparent() {
            call.meta
                .get_or_insert_with(Default::default)
                .set_traceparent(traceparent);
        }
        client.call_tool(call).await
    }
    .instrument(job)
    .await?;
    println!("{}", serde_json::to_string(&answer)?);
    client.cancel().await?;
    handle.flush().await;

    // Shutting down exports what is left; without a collector that fails,
    // which is worth a line, not a failed run.
    for (what, outcome) in [
        ("traces", tracer_provider.shutdown()),
        ("metrics", meter_provider.shutdown()),
    ] {
        if let Err(e) = outcome {
            eprintln!(
                "exporting {what} failed ({e}): is a collector listening at OTEL_EXPORTER_OTLP_ENDPOINT?"
            );
        }
    }
    Ok(())
}
