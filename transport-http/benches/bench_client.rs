//! Client benchmark: this crate's durable client against stock rmcp, in the
//! same run, on loopback, against an rmcp server in this process.
//!
//! * restart: time from opening the store and building a client to its first
//!   tool result, stock rmcp (new `initialize`) against the durable client
//!   resuming the session stored in a SQLite file (no `initialize`), with
//!   HTTP requests counted per start;
//! * start and close: the same, up to the client closed and dropped (the
//!   durable client's last writes committed), the work a process does
//!   before it exits;
//! * where the durable start's time goes: opening the store, building the
//!   client (reading what is stored, reserving request ids), serving it
//!   and the first call, each a median;
//! * steady state: sequential tool calls per second (the median of
//!   [`STEADY_ROUNDS`] rounds), and the ratio as the median of each round's
//!   durable/stock ratio, printed with their range; in a round both clients
//!   are connected and take turns in slices, so that a slow moment of the
//!   machine lands on both;
//! * exactly-once: steady-state tool calls/s of the durable client against
//!   a durable server (in memory, on a SQLite file fsynced at every
//!   commit or only at checkpoints, on the file store, and on Redis and
//!   Postgres when `MCP_PERSIST_REDIS_URL` and `MCP_PERSIST_POSTGRES_URL`
//!   name servers, as `cargo xtask bench client` arranges) with keyed calls
//!   deduplicated (a call record written twice per call: begun before the
//!   tool runs, its answer kept after) against the same server with
//!   deduplication off, in the same run, by clients speaking 2026-07-28
//!   (no session: with deduplication off the server writes nothing per
//!   call) and 2025-11-25 (a session whose streams are stored: the record
//!   shares the commit of its stream's first event); for 2026-07-28 each
//!   round also times the record's write alone, and the one-client row
//!   prints the ratio it would read if that write were all a keyed call
//!   added, the most it can read while the write is on the call's path;
//! * answered-mark window: for a call in flight longer than the journal's
//!   window (so journaled), how long after the answer reached the
//!   application its entry leaves the store. A SIGKILL within that window
//!   lists the call again after the restart (answers are delivered at least
//!   once); a normal exit commits the mark at once.
//!
//! Stock rmcp and the durable client are measured in turn, alternating
//! which goes first (one restart of each, one steady-state slice of each),
//! so that both meet the process as it is at that point.
//!
//! Each is measured on plain loopback and through a local TCP proxy that
//! delays every chunk by 25 ms each way (50 ms per round trip), where saved
//! round trips show. The process itself is not restarted: loading the binary
//! costs both clients the same.
//!
//! `cargo bench -p mcp-persist-transport-http --bench bench_client`
//! (bounded: a few minutes; 5 here, the build included). `-- start`
//! measures the start, steady-state and answered-mark rows alone;
//! `-- exactly-once` the exactly-once rows alone (`store=NAME` one
//! store's, `era=2026-07-28` or `era=2025-11-25` one era's).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use mcp_persist_core::{CallKey, CallStore, ClientStateStore, MemoryStore, Stores};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    client::DurableClientBuilder,
    server::{DurableServer, ExactlyOnce},
};
use rmcp::{
    ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt,
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
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "slow" {
            tokio::time::sleep(SLOW_CALL).await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]).into())
    }
}

const RESTARTS: usize = 30;
const RESTARTS_DELAYED: usize = 8;
const STEADY: Duration = Duration::from_secs(2);
/// Rounds of steady-state calls, stock and durable in turn.
const STEADY_ROUNDS: usize = 6;
const ONE_WAY_DELAY: Duration = Duration::from_millis(25);
/// Longer than the journal's window (10 ms): the call is journaled.
const SLOW_CALL: Duration = Duration::from_millis(30);
const WINDOW_SAMPLES: usize = 20;

struct Figures {
    stock_start: Duration,
    durable_start: Duration,
    stock_start_close: Duration,
    durable_start_close: Duration,
    stock_requests: f64,
    durable_requests: f64,
    /// Where the durable start's time goes (medians): opening the store,
    /// building the client (reading what is stored, reserving request
    /// ids), serving it (rmcp's handshake, none when resuming), the first
    /// call.
    durable_phases: [Duration; 4],
    stock_rate: f64,
    durable_rate: f64,
    /// The median of each round's durable/stock ratio.
    steady_ratio: f64,
    /// The lowest and highest of the rounds' ratios.
    steady_range: (f64, f64),
}

#[tokio::main]
async fn main() -> Result<()> {
    // `-- exactly-once` measures the exactly-once rows alone (`store=NAME`
    // names the stores, all by default).
    if std::env::args().any(|a| a == "exactly-once") {
        let folder = tempfile::tempdir()?;
        print_exactly_once(&exactly_once_rates(folder.path()).await?);
        return Ok(());
    }
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
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let server = listener.local_addr()?;
    // TCP_NODELAY, as a production server sets it (see examples/server/main.rs).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    let proxy = delay_proxy(server, ONE_WAY_DELAY).await?;
    let folder = tempfile::tempdir()?;

    let direct = measure(
        &format!("http://{server}/mcp"),
        &folder.path().join("direct.db"),
        RESTARTS,
        &requests,
    )
    .await?;
    let delayed = measure(
        &format!("http://{proxy}/mcp"),
        &folder.path().join("delayed.db"),
        RESTARTS_DELAYED,
        &requests,
    )
    .await?;

    let window = answered_window(
        &format!("http://{server}/mcp"),
        &folder.path().join("window.db"),
    )
    .await?;

    print_start_figures(&direct, &delayed, window);
    // `-- start` measures the rows above alone (about a minute).
    if !std::env::args().any(|a| a == "start") {
        print_exactly_once(&exactly_once_rates(folder.path()).await?);
    }
    Ok(())
}

/// The start, steady-state and answered-mark rows, with their aims.
fn print_start_figures(direct: &Figures, delayed: &Figures, window: Duration) {
    println!("| measure | path | stock rmcp | durable client | ratio |");
    println!("|---|---|---|---|---|");
    for (path, f) in [("loopback", &direct), ("+50 ms RTT", &delayed)] {
        println!(
            "| start to first tool result (median) | {path} | {:.1} ms | {:.1} ms | {:.2} |",
            ms(f.stock_start),
            ms(f.durable_start),
            f.durable_start.as_secs_f64() / f.stock_start.as_secs_f64()
        );
        println!(
            "| start to first tool result, then close (median; the exit path) | {path} | {:.1} ms | {:.1} ms | {:.2} |",
            ms(f.stock_start_close),
            ms(f.durable_start_close),
            f.durable_start_close.as_secs_f64() / f.stock_start_close.as_secs_f64()
        );
        println!(
            "| HTTP requests per start (incl. GET stream, DELETE) | {path} | {:.1} | {:.1} | |",
            f.stock_requests, f.durable_requests
        );
        println!(
            "| steady-state tool calls/s (rounds' ratios {:.2}-{:.2}) | {path} | {:.0} | {:.0} | {:.2} |",
            f.steady_range.0, f.steady_range.1, f.stock_rate, f.durable_rate, f.steady_ratio
        );
    }
    println!(
        "| answered mark in the store after the answer (median; the SIGKILL window, calls over 10 ms) | loopback | | {:.1} ms | |",
        ms(window)
    );
    let verdict = |met: bool| if met { "met" } else { "not met" };
    let whole = direct.durable_start_close.as_secs_f64() / direct.stock_start_close.as_secs_f64();
    println!(
        "aim: start to first tool result, loopback, whole process (close included), no slower than stock rmcp: {whole:.2} of stock's time ({})",
        verdict(whole <= 1.0)
    );
    let faster = delayed.stock_start.as_secs_f64() / delayed.durable_start.as_secs_f64();
    println!(
        "aim: start to first tool result at +50 ms RTT, at least 2.9 times faster than stock rmcp: {faster:.2} times ({})",
        verdict(faster >= 2.9)
    );
    let steady = direct.steady_ratio;
    println!(
        "aim: steady-state tool calls/s, loopback, at least 0.95 of stock rmcp: {steady:.2} ({})",
        verdict(steady >= 0.95)
    );
    for (path, f) in [("loopback", &direct), ("+50 ms RTT", &delayed)] {
        let [open, build, serve, call] = f.durable_phases.map(ms);
        println!(
            "(durable start, {path}, medians: open the store {open:.2} ms, build the client {build:.2} ms (reads the stored session, reserves request ids in one synced commit, lists the journal), serve {serve:.2} ms, first call {call:.2} ms)"
        );
    }
}

/// The exactly-once rows and their aim.
fn print_exactly_once(dedup: &[Dedup]) {
    println!();
    println!(
        "| durable client to a durable server | store | exactly-once off | on | ratio | rounds' ratios, lowest to highest | server commits (writes) per call, off / on | ratio if the record's write were all it added |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for Dedup {
        row,
        off,
        on,
        ratio,
        range: (low, high),
        commits,
        ceiling,
    } in dedup
    {
        let commits = commits.map_or(String::new(), |[off, on]| {
            format!("{:.1} ({:.1}) / {:.1} ({:.1})", off.0, off.1, on.0, on.1)
        });
        let ceiling = ceiling.map_or(String::new(), |c| format!("{c:.2}"));
        println!(
            "| steady-state tool calls/s (keyed calls, deduplicated or not) | {row} | {off:.0} | {on:.0} | {ratio:.2} | {low:.2}-{high:.2} | {commits} | {ceiling} |"
        );
    }
    if let Some(lowest) = dedup.iter().min_by(|a, b| a.ratio.total_cmp(&b.ratio)) {
        println!(
            "aim: exactly-once on at >= 0.90 of off, on every store: lowest {:.2} ({}) ({})",
            lowest.ratio,
            lowest.row,
            if lowest.ratio >= 0.90 {
                "met"
            } else {
                "not met"
            }
        );
    }
    let ceilings: Vec<String> = dedup
        .iter()
        .filter_map(|d| Some(format!("{:.2} ({})", d.ceiling?, d.row)))
        .collect();
    if !ceilings.is_empty() {
        println!(
            "bound: a 2026-07-28 keyed call waits for its record's write (committed with the store's full durability) before its tool runs; with nothing else added, one client would read at most {}",
            ceilings.join(", ")
        );
    }
    println!(
        "(one client: each call waits for its call record's commit, one more on its path; {CONCURRENT_CLIENTS} clients: the server's throughput, commits shared; calls/s are medians of {ROUNDS} rounds, the ratio the median of each round's on/off, each round measuring off and on in turn, in {SLICES} slices each)"
    );
}

/// One exactly-once row: calls/s off and on, and for one client on
/// SQLite the server's commits and writes per call, off and on.
struct Dedup {
    row: String,
    off: f64,
    on: f64,
    /// The median of the rounds' on/off ratios.
    ratio: f64,
    /// The lowest and highest of the rounds' on/off ratios: how far one
    /// round can stray, so that a change smaller than this spread is not
    /// read as a gain or a loss from one run.
    range: (f64, f64),
    commits: Option<[(f64, f64); 2]>,
    /// For one 2026-07-28 client: the ratio if a keyed call cost nothing
    /// but the write of its record before its tool runs, timed alone (the
    /// median of the rounds'), the most the row can read while that write
    /// stays on the call's path.
    ceiling: Option<f64>,
}

/// The lowest and the highest of `values`.
fn spread(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), r| {
            (l.min(*r), h.max(*r))
        })
}

/// The median of `values` (none empty here).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Rounds of the exactly-once rows; even, so that each server is measured
/// first in half of them.
const ROUNDS: usize = 6;

/// Clients calling at once in the concurrent exactly-once rows.
const CONCURRENT_CLIENTS: usize = 8;

/// Slices each exactly-once round is cut into, per server: the two
/// servers take turns slice by slice (in the order off, on, on, off, ...),
/// so that a slow second of the machine lands on both, not on one.
const SLICES: u32 = 8;

/// The revision a client of the exactly-once rows speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Era {
    /// 2026-07-28: no session; a request's stream is not resumed, and a
    /// keyed call is what makes its re-issue safe.
    Modern,
    /// 2025-11-25: `initialize`, a session, resumable streams.
    Legacy,
}

impl Era {
    fn name(self) -> &'static str {
        match self {
            Era::Modern => "2026-07-28",
            Era::Legacy => "2025-11-25",
        }
    }

    /// A client over `transport` speaking this era.
    async fn serve<T, E, A>(
        self,
        transport: T,
    ) -> Result<rmcp::service::RunningService<RoleClient, ()>>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let lifecycle = match self {
            Era::Modern => rmcp::service::ClientLifecycleMode::Auto {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
                legacy_version: None,
            },
            Era::Legacy => rmcp::service::ClientLifecycleMode::Initialize,
        };
        Ok(rmcp::service::ClientServiceExt::serve_with_lifecycle((), transport, lifecycle).await?)
    }
}

/// Durable clients (journals in memory) calling one server's `echo`, each in
/// a task of its own, in bursts: each burst runs until the deadline it is
/// given and reports its calls.
struct Callers {
    go: Vec<tokio::sync::mpsc::Sender<Instant>>,
    done: tokio::sync::mpsc::Receiver<Result<u64>>,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
}

impl Callers {
    async fn connect(url: &str, clients: usize, era: Era) -> Result<Callers> {
        let (done_tx, done) = tokio::sync::mpsc::channel(clients);
        let mut go = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let store = Arc::new(MemoryStore::new());
            let (transport, handle) = DurableClientBuilder::new(url, store).build().await?;
            let client = era.serve(transport).await?;
            let (go_tx, mut go_rx) = tokio::sync::mpsc::channel::<Instant>(1);
            let done = done_tx.clone();
            go.push(go_tx);
            tasks.push(tokio::spawn(async move {
                while let Some(until) = go_rx.recv().await {
                    let mut n = 0u64;
                    let mut failed = None;
                    while Instant::now() < until {
                        if let Err(e) = client.call_tool(CallToolRequestParams::new("echo")).await {
                            failed = Some(e);
                            break;
                        }
                        n += 1;
                    }
                    let _ = done.send(failed.map_or(Ok(n), |e| Err(e.into()))).await;
                }
                client.cancel().await?;
                handle.end_session().await?;
                Ok(())
            }));
        }
        Ok(Callers { go, done, tasks })
    }

    /// One burst of every client at once for `length`: calls made and the
    /// time taken.
    async fn burst(&mut self, length: Duration) -> Result<(u64, Duration)> {
        let start = Instant::now();
        for go in &self.go {
            go.send(start + length).await?;
        }
        let mut calls = 0;
        for _ in 0..self.go.len() {
            calls += self.done.recv().await.context("a caller stopped")??;
        }
        Ok((calls, start.elapsed()))
    }

    async fn close(self) -> Result<()> {
        drop(self.go);
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// Where `cargo xtask bench client` names the Redis server it started.
const REDIS_URL: &str = "MCP_PERSIST_REDIS_URL";
/// Where `cargo xtask bench client` names the Postgres server it started.
const POSTGRES_URL: &str = "MCP_PERSIST_POSTGRES_URL";

/// A durable server serving [`Echo`] on `store` (`"memory"`, `"SQLite"`,
/// `"SQLite, Durability::Normal"` or `"file"`, in a new file or folder at
/// `db`; `"Redis"` or `"Postgres"`, under keys of its own), with
/// `exactly_once`: its URL, its SQLite store (to count commits), its stores
/// (to time a call record's write alone) and its task.
async fn echo_server(
    store: &str,
    db: std::path::PathBuf,
    exactly_once: ExactlyOnce,
) -> Result<(
    String,
    Option<SqliteStore>,
    Stores,
    tokio::task::JoinHandle<()>,
)> {
    // Each server its own keys: a Redis prefix or Postgres schema named
    // after its file.
    let space = db
        .file_stem()
        .map(|s| s.to_string_lossy().replace('-', "_"))
        .unwrap_or_default();
    let space = format!("bench_client_{}_{space}", std::process::id());
    let (stores, sqlite) = match store {
        "memory" => (Stores::new(MemoryStore::new()), None),
        "file" => (
            Stores::new(mcp_persist_store_file::FileStore::open(&db).await?),
            None,
        ),
        "Redis" => {
            let url =
                std::env::var(REDIS_URL).with_context(|| format!("{REDIS_URL} is not set"))?;
            let s = mcp_persist_store_redis::RedisStore::standalone(url)
                .key_prefix(format!("{space}:"))
                .connect()
                .await?;
            (Stores::new(s), None)
        }
        "Postgres" => {
            let url = std::env::var(POSTGRES_URL)
                .with_context(|| format!("{POSTGRES_URL} is not set"))?;
            let s = mcp_persist_store_postgres::PostgresStore::builder(&url)
                .schema(space)
                .connect()
                .await?;
            (Stores::new(s), None)
        }
        _ => {
            let mut options = mcp_persist_store_sqlite::SqliteOptions::default();
            if store.ends_with("Normal") {
                options.durability = mcp_persist_store_sqlite::Durability::Normal;
            }
            let s = SqliteStore::open_with(db, options).await?;
            (Stores::new(s.clone()), Some(s))
        }
    };
    let server = DurableServer::builder(stores.clone())
        .exactly_once(exactly_once)
        .build()?;
    let router = axum::Router::new().nest_service("/mcp", server.service(|| Ok(Echo)));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((format!("http://{addr}/mcp"), sqlite, stores, task))
}

/// How long the write a keyed call waits for before its tool runs takes
/// on `stores`, alone: the mean of the call records begun one after the
/// other for `slice`, through the server's own call store, as
/// [`CallStore::begin`] writes them (committed with the store's full
/// durability), under keys of their own.
async fn record_write(stores: &Stores, slice: Duration, round: usize) -> Result<Duration> {
    // ExactlyOnce's default window, which the server keeps its records for.
    let calls = stores.calls(Duration::from_secs(60 * 60));
    let digest = CallStore::digest("echo", &serde_json::json!({}));
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < slice {
        let key = CallKey::new(None, &format!("record-write-{round}-{n}"))?;
        calls.begin(&key, "echo", &digest, "bench").await?;
        n += 1;
    }
    Ok(start.elapsed() / n.max(1))
}

/// One server of an exactly-once round, with its one client and its
/// concurrent callers.
struct Served {
    client: rmcp::service::RunningService<RoleClient, ()>,
    handle: mcp_persist_transport_http::client::ClientHandle,
    callers: Callers,
    /// Its SQLite store, to count commits.
    sqlite: Option<SqliteStore>,
    /// Its stores, to time a call record's write alone.
    stores: Stores,
    task: tokio::task::JoinHandle<()>,
}

/// Steady-state calls/s of the durable client against a durable server
/// serving [`Echo`] with exactly-once calls off and on, on each store, from
/// one client (each call waits for the one before: the call record's commit
/// is on every call's path) and from [`CONCURRENT_CLIENTS`] at once (commits
/// shared, what a server's throughput sees).
///
/// A process serving these calls slows as it goes: a durable server keeps
/// every request's stream for its retention (an hour by default), so the
/// heap grows by about 2 KB per call, and the same server measured 24 s on
/// end falls from about 1,550 to 1,350 calls/s. Measured one after the
/// other, the second of two identical servers came out up to 8% slower,
/// most of what exactly-once was measured to cost when off always went
/// first. So each round starts both servers, fresh, and measures them in
/// turn, slice by slice ([`SLICES`] each, in the order off, on, on, off,
/// ...): one round measured each server for a whole [`STEADY`] back to
/// back, and its on/off ratios strayed from 0.76 to 1.01 on SQLite and
/// from 0.78 to 1.30 on the memory store, where exactly-once costs next to
/// nothing. Each client ends its session after; the row's ratio is the
/// median of the rounds' on/off ratios, printed with their range.
async fn exactly_once_rates(folder: &std::path::Path) -> Result<Vec<Dedup>> {
    let mut figures = Vec::new();
    let mut stores = vec!["memory", "SQLite", "SQLite, Durability::Normal", "file"];
    for (var, name) in [(REDIS_URL, "Redis"), (POSTGRES_URL, "Postgres")] {
        if std::env::var_os(var).is_some() {
            stores.push(name);
        } else {
            println!(
                "{var} is not set: no exactly-once row on {name} (run `cargo xtask bench client`)"
            );
        }
    }
    // `-- store=NAME` (repeatable) measures those stores alone.
    let only: Vec<String> = std::env::args()
        .filter_map(|a| a.strip_prefix("store=").map(str::to_owned))
        .collect();
    stores.retain(|s| only.is_empty() || only.iter().any(|o| o == s));
    // `-- era=2026-07-28` or `-- era=2025-11-25` measures one era alone.
    let only_eras: Vec<String> = std::env::args()
        .filter_map(|a| a.strip_prefix("era=").map(str::to_owned))
        .collect();
    let eras: Vec<Era> = [Era::Modern, Era::Legacy]
        .into_iter()
        .filter(|era| only_eras.is_empty() || only_eras.iter().any(|o| o == era.name()))
        .collect();
    for (name, era) in stores
        .iter()
        .flat_map(|name| eras.iter().map(move |era| (*name, *era)))
    {
        // Per server (off, on): each round's one-client and concurrent
        // rates, and the one-client rounds' commits and writes per call.
        let mut single = [Vec::new(), Vec::new()];
        let mut concurrent = [Vec::new(), Vec::new()];
        let mut commits = [Vec::new(), Vec::new()];
        // Per round, for 2026-07-28: the one-client ratio if a keyed call
        // cost nothing but its record's write.
        let mut ceilings = Vec::new();
        for round in 0..ROUNDS {
            // Both servers up at once, each with its one client and its
            // CONCURRENT_CLIENTS callers; then the slices, in turn.
            let mut servers = Vec::new();
            for i in 0..2 {
                let exactly_once = if i == 0 {
                    ExactlyOnce::disabled()
                } else {
                    ExactlyOnce::new()
                };
                let db = folder.join(format!("server-{}-{round}-{i}.db", figures.len()));
                let (url, sqlite, stores, task) = echo_server(name, db, exactly_once).await?;
                let db = folder.join(format!("client-{}-{round}-{i}.db", figures.len()));
                let store = Arc::new(SqliteStore::open(db).await?);
                let (transport, handle) = DurableClientBuilder::new(&url, store).build().await?;
                let client = era.serve(transport).await?;
                let callers = Callers::connect(&url, CONCURRENT_CLIENTS, era).await?;
                servers.push(Served {
                    client,
                    handle,
                    callers,
                    sqlite,
                    stores,
                    task,
                });
            }
            let slice = STEADY / SLICES;
            // Per server: one-client calls, time, commits, writes; then the
            // concurrent calls and time.
            let mut one = [(0u64, Duration::ZERO, 0u64, 0u64); 2];
            let mut many = [(0u64, Duration::ZERO); 2];
            for turn in 0..2 * SLICES as usize {
                // off, on, on, off, off, on, ...: each goes first as often.
                let i = (turn + turn / 2) % 2;
                let Served { client, sqlite, .. } = &servers[i];
                let before = sqlite.as_ref().map(SqliteStore::write_stats);
                let start = Instant::now();
                let mut n = 0u64;
                while start.elapsed() < slice {
                    client.call_tool(CallToolRequestParams::new("echo")).await?;
                    n += 1;
                }
                let took = start.elapsed();
                if let (Some(b), Some(h)) = (before, sqlite.as_ref()) {
                    let a = h.write_stats();
                    one[i].2 += a.transactions - b.transactions;
                    one[i].3 += a.operations - b.operations;
                }
                one[i].0 += n;
                one[i].1 += took;
            }
            if era == Era::Modern {
                // Off, a call takes `per_call`; a keyed call also waits for
                // its record's write before its tool runs (on a server with
                // nothing else to do here, so no slower than among calls).
                let write = record_write(&servers[1].stores, slice, round).await?;
                let per_call = one[0].1.as_secs_f64() / one[0].0.max(1) as f64;
                ceilings.push(per_call / (per_call + write.as_secs_f64()));
            }
            for turn in 0..2 * SLICES as usize {
                let i = (turn + turn / 2) % 2;
                let (calls, took) = servers[i].callers.burst(slice).await?;
                many[i].0 += calls;
                many[i].1 += took;
            }
            for (i, served) in servers.into_iter().enumerate() {
                let Served {
                    client,
                    handle,
                    callers,
                    sqlite,
                    task,
                    ..
                } = served;
                client.cancel().await?;
                handle.end_session().await?;
                callers.close().await?;
                task.abort();
                let (calls, took, transactions, operations) = one[i];
                single[i].push(calls as f64 / took.as_secs_f64());
                concurrent[i].push(many[i].0 as f64 / many[i].1.as_secs_f64());
                if sqlite.is_some() {
                    commits[i].push((
                        transactions as f64 / calls as f64,
                        operations as f64 / calls as f64,
                    ));
                }
            }
        }
        let ratios = |rates: &[Vec<f64>; 2]| -> Vec<f64> {
            rates[0]
                .iter()
                .zip(&rates[1])
                .map(|(off, on)| on / off)
                .collect()
        };
        let per_call = |c: &Vec<(f64, f64)>| {
            (
                median(c.iter().map(|c| c.0).collect()),
                median(c.iter().map(|c| c.1).collect()),
            )
        };
        figures.push(Dedup {
            row: format!("{name}, {}, 1 client", era.name()),
            off: median(single[0].clone()),
            on: median(single[1].clone()),
            ratio: median(ratios(&single)),
            range: spread(&ratios(&single)),
            commits: (!commits[0].is_empty() && !commits[1].is_empty())
                .then(|| [per_call(&commits[0]), per_call(&commits[1])]),
            ceiling: (!ceilings.is_empty()).then(|| median(ceilings.clone())),
        });
        figures.push(Dedup {
            row: format!(
                "{name}, {}, {CONCURRENT_CLIENTS} clients at once",
                era.name()
            ),
            off: median(concurrent[0].clone()),
            on: median(concurrent[1].clone()),
            ratio: median(ratios(&concurrent)),
            range: spread(&ratios(&concurrent)),
            commits: None,
            ceiling: None,
        });
    }
    Ok(figures)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn measure(
    url: &str,
    db: &std::path::Path,
    restarts: usize,
    requests: &AtomicUsize,
) -> Result<Figures> {
    let call = || CallToolRequestParams::new("echo");
    let median_time = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };

    // The durable client's first start stores the session it resumes.
    {
        let store = Arc::new(SqliteStore::open(db).await?);
        let (transport, handle) = DurableClientBuilder::new(url, store).build().await?;
        let client = ().serve(transport).await?;
        client.call_tool(call()).await?;
        handle.flush().await;
        drop(client);
    }
    // Restarts, one of each in turn, alternating which goes first, so both
    // meet the process as it is at that point: stock rmcp starts from
    // nothing every time; the durable client reopens its SQLite store and
    // resumes.
    let mut stock = Vec::new();
    let mut stock_close = Vec::new();
    let mut durable = Vec::new();
    let mut durable_close = Vec::new();
    // The durable start's phases: open the store, build, serve, first call.
    let mut phases: [Vec<Duration>; 4] = Default::default();
    let (mut stock_requests, mut durable_requests) = (0, 0);
    for i in 0..restarts {
        for durable_turn in [i % 2 == 1, i % 2 == 0] {
            let before = requests.load(Ordering::Relaxed);
            let start = Instant::now();
            if durable_turn {
                let store = Arc::new(SqliteStore::open(db).await?);
                let opened = start.elapsed();
                let (transport, handle) = DurableClientBuilder::new(url, store).build().await?;
                let built = start.elapsed();
                let client = ().serve(transport).await?;
                let served = start.elapsed();
                client.call_tool(call()).await?;
                durable.push(start.elapsed());
                for (phase, took) in phases.iter_mut().zip([
                    opened,
                    built - opened,
                    served - built,
                    start.elapsed() - served,
                ]) {
                    phase.push(took);
                }
                // What a process returning from `main` does: no flush; the
                // last drop commits what is pending and waits for it.
                client.cancel().await?;
                drop(handle);
                durable_close.push(start.elapsed());
                durable_requests += requests.load(Ordering::Relaxed) - before;
            } else {
                let client = ().serve(StreamableHttpClientTransport::from_uri(url)).await?;
                client.call_tool(call()).await?;
                stock.push(start.elapsed());
                client.cancel().await?;
                stock_close.push(start.elapsed());
                stock_requests += requests.load(Ordering::Relaxed) - before;
            }
        }
    }
    let stock_requests = stock_requests as f64 / restarts as f64;
    let durable_requests = durable_requests as f64 / restarts as f64;

    // Steady state: in each round both clients are connected at once and
    // take turns in slices ([`SLICES`] each, stock, durable, durable,
    // stock, ...), so that a slow moment of the machine lands on both. A
    // round measured each client for a whole [`STEADY`] back to back, and
    // single runs of the row read anywhere from 0.83 to 0.97.
    let mut stock_rates = Vec::new();
    let mut durable_rates = Vec::new();
    for _ in 0..STEADY_ROUNDS {
        let store = Arc::new(SqliteStore::open(db).await?);
        let (transport, _handle) = DurableClientBuilder::new(url, store).build().await?;
        let durable = ().serve(transport).await?;
        let stock = ().serve(StreamableHttpClientTransport::from_uri(url)).await?;
        let slice = STEADY / SLICES;
        let mut counted = [(0u64, Duration::ZERO); 2];
        for turn in 0..2 * SLICES as usize {
            let i = (turn + turn / 2) % 2;
            let client = if i == 0 { &stock } else { &durable };
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < slice {
                client.call_tool(call()).await?;
                n += 1;
            }
            counted[i].0 += n;
            counted[i].1 += start.elapsed();
        }
        let [stock_rate, durable_rate] = counted.map(|(n, took)| n as f64 / took.as_secs_f64());
        stock_rates.push(stock_rate);
        durable_rates.push(durable_rate);
        durable.cancel().await?;
        stock.cancel().await?;
    }
    let ratios: Vec<f64> = durable_rates
        .iter()
        .zip(&stock_rates)
        .map(|(durable, stock)| durable / stock)
        .collect();
    let steady_range = spread(&ratios);
    let steady_ratio = median(ratios);
    let stock_rate = median(stock_rates);
    let durable_rate = median(durable_rates);
    Ok(Figures {
        stock_start: median_time(stock),
        durable_start: median_time(durable),
        stock_start_close: median_time(stock_close),
        durable_start_close: median_time(durable_close),
        stock_requests,
        durable_requests,
        durable_phases: phases.map(median_time),
        stock_rate,
        durable_rate,
        steady_ratio,
        steady_range,
    })
}

/// For a call in flight longer than the journal's window: the median time
/// from its answer reaching the application to its journal entry leaving
/// the store (polled every 0.2 ms; the timer's resolution is a millisecond).
async fn answered_window(url: &str, db: &std::path::Path) -> Result<Duration> {
    let store = Arc::new(SqliteStore::open(db).await?);
    let state = ClientStateStore::new(store.clone());
    let (transport, handle) = DurableClientBuilder::new(url, store).build().await?;
    let client = ().serve(transport).await?;
    client.call_tool(CallToolRequestParams::new("echo")).await?;
    let key = handle.server_key().clone();
    let session = handle.session_id().context("a session")?;
    let mut samples = Vec::new();
    for _ in 0..WINDOW_SAMPLES {
        let peer = client.peer().clone();
        let call =
            tokio::spawn(async move { peer.call_tool(CallToolRequestParams::new("slow")).await });
        // Journaled while in flight...
        while state.inflight(&key, &session).await?.is_empty() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        call.await??;
        // ...and gone from the store this long after the answer.
        let answered = Instant::now();
        while !state.inflight(&key, &session).await?.is_empty() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        samples.push(answered.elapsed());
    }
    client.cancel().await?;
    samples.sort();
    Ok(samples[samples.len() / 2])
}

/// A TCP proxy to `upstream` that holds every chunk `delay` before passing
/// it on, in both directions, keeping order and not limiting throughput.
async fn delay_proxy(
    upstream: std::net::SocketAddr,
    delay: Duration,
) -> Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::join!(
                    pump(in_read, out_write, delay),
                    pump(out_read, in_write, delay)
                );
            });
        }
    });
    Ok(addr)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    tokio::join!(reader, writer);
}
