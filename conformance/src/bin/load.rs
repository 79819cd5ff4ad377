//! `mcp-persist-load`: a fleet of durable servers on one store, under load.
//!
//! ```text
//! mcp-persist-load drive --store URL --measure SPEC [--sessions N] [--instances M] [--seconds S] ...
//! mcp-persist-load serve --store-url URL [example server flags]
//! ```
//!
//! `drive` starts the fleet (this same program, `serve`, once per instance),
//! runs the sessions, SIGKILLs one instance mid-run and starts it again, and
//! prints the capacity table ([`mcp_persist_conformance::load`]). `serve` is
//! the example server of `mcp-persist-transport-http` (its handler, tools,
//! task runtime and fleet bus) on a store opened from a store URL, so every
//! backend of the registry can carry the fleet, Redis Cluster and Postgres
//! included. `cargo xtask load` builds and runs it.

use std::{process::ExitCode, sync::Arc};

use anyhow::{Context as _, Result};
use mcp_persist_core::{
    Stores,
    registry::{OpenOptions, Registry},
};

#[path = "../../../transport-http/examples/server.rs"]
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
mod demo;

/// Opens a store URL with every backend the fleet can run on.
async fn open(url: &str) -> Result<(Stores, mcp_persist_core::registry::OpenedStore)> {
    let registry = Registry::new()
        .with(mcp_persist_store_sqlite::SqliteOpener)
        .with(mcp_persist_store_redis::RedisOpener)
        .with(mcp_persist_store_postgres::PostgresOpener);
    let opened = registry
        .open(url, OpenOptions::default())
        .await
        .context("opening the store")?;
    let stores = Stores::from_parts(opened.kv.clone(), opened.log.clone());
    Ok((stores, opened))
}

/// `serve`: the example server on the store `--store-url` names.
async fn serve(args: Vec<String>) -> Result<()> {
    let mut url = None;
    let mut rest = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--store-url" {
            url = Some(args.next().context("--store-url needs a value")?);
        } else {
            rest.push(arg);
        }
    }
    let url = url.context("serve needs --store-url URL")?;
    let options = demo::Options::parse(rest)?;
    let (stores, _opened) = open(&url).await?;
    let counters = Arc::new(demo::Counters::default());
    let router = demo::durable_router_with_tasks(stores, &options, counters).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port)).await?;
    println!("LISTENING {}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let outcome = match command.as_deref() {
        Some("serve") => {
            mcp_persist_conformance::init_tracing_quiet();
            serve(rest).await
        }
        Some("drive") => mcp_persist_conformance::load::run(rest).await,
        _ => {
            eprintln!("{}", mcp_persist_conformance::load::USAGE);
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-persist-load: {e:#}");
            ExitCode::FAILURE
        }
    }
}
