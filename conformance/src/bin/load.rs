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

use std::process::ExitCode;

use anyhow::Result;

#[path = "../../../transport-http/examples/server/main.rs"]
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
mod demo;

/// `serve`: the example server on the store `--store-url` names.
async fn serve(args: Vec<String>) -> Result<()> {
    let args = args
        .into_iter()
        .map(|a| {
            if a == "--store-url" {
                "--store".to_owned()
            } else {
                a
            }
        })
        .collect::<Vec<_>>();
    anyhow::ensure!(
        args.iter().any(|a| a == "--store"),
        "serve needs --store-url URL"
    );
    demo::run(demo::Options::parse(args)?).await
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
