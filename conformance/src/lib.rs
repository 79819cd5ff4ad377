//! The peers that `cargo xtask conformance` runs the official MCP
//! conformance suite (`@modelcontextprotocol/conformance`) against.
//!
//! * `conformance-server`: an rmcp Streamable HTTP server exposing the
//!   suite's fixture tools, resources and prompts ([`fixtures`]). With
//!   `--store sqlite:<path>` its sessions and SSE events live in
//!   mcp-persist stores on SQLite; with `--store memory-rmcp` it runs on
//!   rmcp's in-memory defaults, the baseline the durable server is compared
//!   with.
//! * `conformance-client`: an rmcp client that plays each client scenario
//!   the suite names in `MCP_CONFORMANCE_SCENARIO` ([`client`]), through
//!   mcp-persist's durable transport with its state on SQLite (persistence
//!   on), or rmcp's own transport with `--transport stock`. Authorization
//!   scenarios go through mcp-persist's OAuth credential storage ([`auth`]).
//!
//! * `mcp-persist-load`: a fleet of durable servers on one store under a
//!   realistic mix of sessions, with one instance killed with SIGKILL
//!   mid-run; it prints what the store holds per session, stream and event
//!   and the latency of restore, replay, `tasks/get` and bus delivery
//!   ([`load`]). `cargo xtask load` runs it.
//!
//! They print what they do through `tracing` (`RUST_LOG` picks the level).
//! The package is not published.

pub mod auth;
pub mod client;
pub mod fixtures;
mod literal;
pub mod load;
mod mrtr;
mod scratch;
mod stateless;
pub mod tasks;

/// Sets up `tracing` output on stderr, filtered by `RUST_LOG` (default
/// `info`). Stdout stays free for what the programs print on purpose.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Like [`init_tracing`], with `warn` as the default level: a fleet of
/// servers under load would otherwise write a line per request.
pub fn init_tracing_quiet() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
