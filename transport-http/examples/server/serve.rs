//! Wiring: the store a command line names, the durable server over it, and
//! the routers the tests and benchmarks serve.

use std::sync::Arc;

use anyhow::Context as _;
use mcp_persist_core::{
    EventLogConfig, Stores,
    registry::{OpenOptions, Registry, redact},
};
use mcp_persist_transport_http::server::{DurableServer, ExactlyOnce, StreamableHttpServerConfig};
use rmcp::transport::streamable_http_server::{
    StreamableHttpService, session::local::LocalSessionManager,
};

use super::{
    handler::{Counters, DemoHandler},
    jobs::register_tasks,
    options::Options,
};

/// The backends the demo opens: those its crate's tests build.
fn registry() -> Registry {
    Registry::new()
        .with(mcp_persist_core::memory::MemoryOpener)
        .with(mcp_persist_store_sqlite::SqliteOpener)
        .with(mcp_persist_store_file::FileOpener)
        .with(mcp_persist_store_redis::RedisOpener)
        .with(mcp_persist_store_postgres::PostgresOpener)
}

/// Opens the store the options name, through the URL registry (as the
/// command line does): no backend is matched here by hand.
pub async fn open_stores(options: &Options) -> anyhow::Result<Stores> {
    let url = options.store_url()?;
    let opened = registry()
        .open(&url, OpenOptions::default())
        .await
        .with_context(|| format!("opening {}", redact(&url)))?;
    anyhow::ensure!(
        opened.log.is_some(),
        "{} keeps no logs, which sessions' events need: pick another store",
        redact(&url)
    );
    Ok(opened.stores())
}

/// The durable server over `stores` the options describe.
pub fn durable_server(stores: Stores, options: &Options) -> anyhow::Result<DurableServer> {
    let http = StreamableHttpServerConfig::default().with_sse_retry(Some(options.sse_retry));
    let mut builder = DurableServer::builder(stores);
    if let Some(grace) = options.liveness_grace {
        builder = builder.liveness_grace(grace);
    }
    if let Some(strict) = options.strict_sessions {
        builder = builder.strict_sessions(strict);
    }
    let server = builder
        .idle_ttl(options.idle_ttl)
        .tail_idle(options.tail_idle)
        .event_retention(EventLogConfig::new(
            options.event_retention,
            options.event_max,
        ))
        .event_durability(if let Some(window) = options.pipelined_events {
            mcp_persist_core::EventDurability::Pipelined { window }
        } else if options.written_events {
            mcp_persist_core::EventDurability::Written
        } else {
            mcp_persist_core::EventDurability::Synced
        })
        .http_config(http)
        // `refresh` may run again when its instance stops mid-call;
        // `charge` never runs twice for one idempotency key.
        .exactly_once(ExactlyOnce::new().rerunnable(["refresh"]))
        .principal_from(|parts| {
            parts
                .headers
                .get("x-demo-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()?;
    Ok(server)
}

/// The router of a durable server over `stores`, counting into `counters`
/// (no task runtime).
pub fn durable_router(
    stores: Stores,
    options: &Options,
    counters: Arc<Counters>,
) -> anyhow::Result<axum::Router> {
    let server = durable_server(stores, options)?;
    let runs_file = options.runs_file.clone();
    let service = server
        .service(move || Ok(DemoHandler::new(counters.clone()).with_runs_file(runs_file.clone())));
    Ok(axum::Router::new().nest_service("/mcp", service))
}

/// The router of a durable server with its task runtime started.
pub async fn durable_router_with_tasks(
    stores: Stores,
    options: &Options,
    counters: Arc<Counters>,
) -> anyhow::Result<axum::Router> {
    let server = durable_server(stores, options)?;
    let tasks = register_tasks(server.tasks(), options).start().await?;
    let bus = server
        .fleet_bus(mcp_persist_core::BusRetention::default())
        .await?;
    let runs_file = options.runs_file.clone();
    let service = server.service(move || {
        Ok(DemoHandler::new(counters.clone())
            .with_runs_file(runs_file.clone())
            .with_tasks(tasks.clone())
            .with_bus(bus.clone()))
    });
    Ok(axum::Router::new().nest_service("/mcp", service))
}

/// The router of the baseline: the same handler on rmcp's in-memory defaults.
pub fn rmcp_default_router(options: &Options, counters: Arc<Counters>) -> axum::Router {
    let config = StreamableHttpServerConfig::default().with_sse_retry(Some(options.sse_retry));
    let runs_file = options.runs_file.clone();
    let service = StreamableHttpService::new(
        move || Ok(DemoHandler::new(counters.clone()).with_runs_file(runs_file.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// Serves until the process ends, printing `LISTENING <address>` first.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let counters = Arc::new(Counters::default());
    let router = if options.rmcp_defaults {
        rmcp_default_router(&options, counters)
    } else {
        let stores = open_stores(&options).await?;
        durable_router_with_tasks(stores, &options, counters).await?
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port)).await?;
    println!("LISTENING {}", listener.local_addr()?);
    // TCP_NODELAY: without it, a response written in two parts (headers,
    // then the first SSE event) waits for the client's delayed ACK, about
    // 40 ms on Linux.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).await?;
    Ok(())
}
