//! Client benchmark: this crate's durable client against stock rmcp, in the
//! same run, on loopback, against an rmcp server in this process.
//!
//! * restart: time from building a client to its first tool result, stock
//!   rmcp (new `initialize`) against the durable client resuming a stored
//!   session (no `initialize`), with HTTP requests counted per start;
//! * steady state: sequential tool calls per second.
//!
//! `cargo run --release -p mcp-persist-transport-http --example bench_client`
//! (bounded: about 10 seconds). Not covered yet: a delay-adding proxy.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use mcp_persist_core::MemoryStore;
use mcp_persist_transport_http::client::DurableClientBuilder;
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
        ServerConfig,
    },
    service::RequestContext,
    transport::{
        StreamableHttpClientTransport,
        streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        },
    },
};

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

const RESTARTS: usize = 30;
const STEADY: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> Result<()> {
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let service = StreamableHttpService::new(
        || Ok(Echo),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    next.run(request)
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let call = || CallToolRequestParams::new("echo");

    // Restart: stock rmcp.
    let mut stock = Vec::new();
    let before = requests.load(Ordering::Relaxed);
    for _ in 0..RESTARTS {
        let start = Instant::now();
        let client = ().serve(StreamableHttpClientTransport::from_uri(url.as_str())).await?;
        client.call_tool(call()).await?;
        stock.push(start.elapsed());
        drop(client);
    }
    let stock_requests = (requests.load(Ordering::Relaxed) - before) as f64 / RESTARTS as f64;

    // Restart: durable client on a stored session.
    let store = Arc::new(MemoryStore::new());
    {
        let (transport, handle) = DurableClientBuilder::new(&url, store.clone())
            .build()
            .await?;
        let client = ().serve(transport).await?;
        client.call_tool(call()).await?;
        handle.flush().await;
        client.cancel().await?;
    }
    let mut durable = Vec::new();
    let before = requests.load(Ordering::Relaxed);
    for _ in 0..RESTARTS {
        let start = Instant::now();
        let (transport, handle) = DurableClientBuilder::new(&url, store.clone())
            .build()
            .await?;
        let client = ().serve(transport).await?;
        client.call_tool(call()).await?;
        durable.push(start.elapsed());
        handle.flush().await;
        drop(client);
    }
    let durable_requests = (requests.load(Ordering::Relaxed) - before) as f64 / RESTARTS as f64;

    // Steady state.
    let stock_rate = {
        let client = ().serve(StreamableHttpClientTransport::from_uri(url.as_str())).await?;
        rate(|| client.call_tool(call())).await?
    };
    let durable_rate = {
        let (transport, _handle) = DurableClientBuilder::new(&url, store.clone())
            .build()
            .await?;
        let client = ().serve(transport).await?;
        rate(|| client.call_tool(call())).await?
    };

    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    println!("| measure (loopback, memory store) | stock rmcp | durable client | ratio |");
    println!("|---|---|---|---|");
    let (s, d) = (median(&mut stock), median(&mut durable));
    println!(
        "| start to first tool result, median of {RESTARTS} | {s:?} | {d:?} | {:.2} |",
        d.as_secs_f64() / s.as_secs_f64()
    );
    println!(
        "| HTTP requests per start (incl. GET stream) | {stock_requests:.1} | {durable_requests:.1} | |"
    );
    println!(
        "| steady-state tool calls/s ({STEADY:?}) | {stock_rate:.0} | {durable_rate:.0} | {:.2} |",
        durable_rate / stock_rate
    );
    Ok(())
}

async fn rate<F, Fut, T, E>(mut f: F) -> Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < STEADY && n < 100_000 {
        f().await?;
        n += 1;
    }
    Ok(f64::from(n) / start.elapsed().as_secs_f64())
}
