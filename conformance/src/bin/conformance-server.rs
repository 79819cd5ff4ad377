//! `conformance-server`: the fixture server the conformance suite's server
//! scenarios run against.
//!
//! ```text
//! conformance-server [--store memory-rmcp | --store sqlite:<path>] [--port <port>]
//! ```
//!
//! Binds 127.0.0.1 (port 0, the default, picks a free one), prints
//! `listening on http://127.0.0.1:<port>/mcp` on stdout once it accepts
//! connections, and serves until killed.

use std::{io::Write, path::PathBuf};

use anyhow::{Context, Result, bail};
use mcp_persist_conformance::{
    fixtures::FixtureServer,
    init_tracing,
    tasks::{TaskRuntime, register},
};
use mcp_persist_core::{BusRetention, MemoryStore, NotificationBus, Stores};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::server::{DurableServer, FleetBus, request_state_codec};
use rmcp::transport::{
    StreamableHttpServerConfig, StreamableHttpService,
    streamable_http_server::session::local::LocalSessionManager,
};

/// Where the server keeps sessions and SSE events.
enum Store {
    /// rmcp's defaults: `LocalSessionManager`, no session or event store.
    MemoryRmcp,
    /// mcp-persist's durable server on a SQLite database at this path.
    Sqlite(PathBuf),
}

struct Args {
    store: Store,
    port: u16,
}

fn parse_args() -> Result<Args> {
    let mut store = Store::MemoryRmcp;
    let mut port = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--store" => {
                let value = args.next().context("--store needs a value")?;
                store = match value.as_str() {
                    "memory-rmcp" => Store::MemoryRmcp,
                    v if v.starts_with("sqlite:") && v.len() > "sqlite:".len() => {
                        Store::Sqlite(PathBuf::from(&v["sqlite:".len()..]))
                    }
                    other => bail!("unknown store {other:?}: use memory-rmcp or sqlite:<path>"),
                };
            }
            "--port" => {
                let value = args.next().context("--port needs a value")?;
                port = value
                    .parse()
                    .with_context(|| format!("--port {value:?} is not a port number"))?;
            }
            other => bail!(
                "unknown argument {other:?}\n\
                 usage: conformance-server [--store memory-rmcp | --store sqlite:<path>] [--port <port>]"
            ),
        }
    }
    Ok(Args { store, port })
}

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let args = parse_args()?;
    let router = match args.store {
        Store::MemoryRmcp => {
            // The requestState key lives in memory: one process, one key.
            let codec = request_state_codec(&Stores::new(MemoryStore::new()))
                .await
                .context("creating the requestState key")?;
            let tasks = TaskRuntime::Rmcp(rmcp::task_manager::TaskManager::new());
            // One process: the bus runs on a memory store.
            let bus = FleetBus::start(NotificationBus::new(
                std::sync::Arc::new(MemoryStore::new()),
                BusRetention::default(),
            ))
            .await
            .context("starting the notification bus")?;
            let service = StreamableHttpService::new(
                move || {
                    Ok(FixtureServer::new(
                        codec.clone(),
                        tasks.clone(),
                        bus.clone(),
                    ))
                },
                LocalSessionManager::default().into(),
                StreamableHttpServerConfig::default(),
            );
            axum::Router::new().nest_service("/mcp", service)
        }
        Store::Sqlite(path) => {
            let backend = SqliteStore::open(&path)
                .await
                .with_context(|| format!("opening the SQLite store at {}", path.display()))?;
            let stores = Stores::new(backend);
            // Shared by every instance on this store.
            let codec = request_state_codec(&stores)
                .await
                .context("reading the shared requestState key")?;
            let server = DurableServer::builder(stores)
                .build()
                .context("building the durable server")?;
            let tasks = TaskRuntime::Durable(
                register(server.tasks())
                    .start()
                    .await
                    .context("starting the durable task runtime")?,
            );
            let bus = server
                .fleet_bus(BusRetention::default())
                .await
                .context("starting the fleet bus")?;
            tracing::info!(path = %path.display(), "sessions, events, tasks, bus and keys on SQLite");
            axum::Router::new().nest_service(
                "/mcp",
                server.service(move || {
                    Ok(FixtureServer::new(
                        codec.clone(),
                        tasks.clone(),
                        bus.clone(),
                    ))
                }),
            )
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{}", args.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}/mcp").context("writing to stdout")?;
        out.flush().context("flushing stdout")?;
    }
    tracing::info!(%addr, "conformance server ready");
    // TCP_NODELAY: responses are written in parts (headers, then events).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .await
        .context("serving HTTP")?;
    Ok(())
}
