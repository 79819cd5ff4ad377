//! `mcp-persist`: the operator's command line for mcp-persist stores.
//!
//! It reads and writes stores through the typed records of
//! `mcp-persist-core`, so it speaks MCP (sessions, event streams, client
//! state, credentials, tasks, shared keys), not bytes:
//!
//! | command | what it does |
//! |---|---|
//! | `ls [KIND]` | lists sessions, events, clients, credentials, tasks or keys |
//! | `show KEY` | one record decoded, secrets redacted (or a log's records) |
//! | `stats` | counts and bytes per kind, oldest and newest |
//! | `check` | decodes every record and log; lists damage; exit 1 when any |
//! | `rm KEY...`, `gc` | deletes records, sweeps expired state |
//! | `quarantine STORE LOG...` | sets damaged logs of a file store aside |
//! | `copy SOURCE DEST` | migrates between backends, resumably |
//!
//! Stores are named by URL: `sqlite:PATH`, `file:DIR`,
//! `redis://HOST:PORT`, `redis+cluster://H1:P1,H2:P2`,
//! `secretsmanager://REGION?prefix=P`, or a split bundle
//! `credentials=URL;rest=URL`. Token text is never printed.
//!
//! # Features
//!
//! This crate has no optional features: every backend is built in.

mod check;
mod copy;
mod fail;
mod inventory;
mod model;
mod output;
mod sweep;
mod target;

use std::{io::Write, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

use crate::{
    fail::{Code, Failure},
    inventory::Ctx,
    model::{Kind, TtlPolicy, parse_duration},
    target::{Access, Spec, Store},
};

fn after_help() -> String {
    format!("Store URLs:\n{}\n\n{}", target::FORMS, fail::EXIT_CODES)
}

/// Inspect, check, clean and migrate the state mcp-persist keeps for MCP
/// clients and servers.
#[derive(Debug, Parser)]
#[command(name = "mcp-persist", version, after_help = after_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Print JSON instead of tables (for scripts).
    #[arg(long, global = true)]
    json: bool,

    /// The servers' session idle TTL, for "TTL left" and for the TTL a
    /// copied session gets (sessions record when they were last seen).
    #[arg(long, global = true, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    session_idle_ttl: Duration,

    /// The servers' event retention, the TTL copied event logs get.
    #[arg(long, global = true, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    event_retention: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LsKind {
    Sessions,
    Events,
    Clients,
    Credentials,
    Tasks,
    Keys,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List one kind of state: sessions (the default), events, clients,
    /// credentials, tasks or keys.
    #[command(after_help = target::FORMS)]
    Ls {
        /// The store URL.
        store: String,
        /// What to list.
        #[arg(value_enum, default_value = "sessions")]
        kind: LsKind,
    },
    /// Show one record decoded, secrets redacted; or a log's records
    /// (`server/events/<stream>`).
    Show {
        /// The store URL.
        store: String,
        /// The key, as `ls` and `check` print it.
        key: String,
    },
    /// Counts and bytes per kind, oldest and newest.
    Stats {
        /// The store URL.
        store: String,
    },
    /// Decode every record under the current schema and read every log;
    /// list damaged ones by key and reason. Exit 1 when anything is damaged.
    Check {
        /// The store URL.
        store: String,
    },
    /// Delete records (with the log a stream or task record names).
    Rm {
        /// The store URL.
        store: String,
        /// Keys to delete.
        keys: Vec<String>,
        /// Delete every key starting with this prefix too.
        #[arg(long)]
        prefix: Option<String>,
        /// Say what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask on a terminal.
        #[arg(long, short)]
        yes: bool,
    },
    /// Set damaged logs of a file store aside (into its `quarantine/`
    /// directory) so their streams and tasks go on; nothing is deleted and
    /// no event number is reused. `check` names the damaged logs.
    Quarantine {
        /// The store URL (a file store).
        store: String,
        /// Logs to set aside, as `check` prints them.
        #[arg(required = true)]
        logs: Vec<String>,
    },
    /// Sweep expired state: the backends reclaim expired records and logs,
    /// and in-flight journal entries of client sessions that are gone are
    /// removed.
    Gc {
        /// The store URL.
        store: String,
        /// Say what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask on a terminal.
        #[arg(long, short)]
        yes: bool,
    },
    /// Copy everything (or some kinds) from one store to another, keeping
    /// TTLs and event order. Never overwrites a newer record; safe to run
    /// again after an interruption: it continues where it stopped.
    Copy {
        /// Where from.
        source: String,
        /// Where to (created if it is a missing file or database).
        dest: String,
        /// Only these kinds (comma-separated).
        #[arg(long, value_enum, value_delimiter = ',')]
        kinds: Vec<Kind>,
        /// Say what would be copied, write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(Code::Other as u8);
        }
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(code)) => ExitCode::from(code as u8),
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::from(failure.code as u8)
        }
    }
}

async fn open(store: &str, access: Access) -> Result<Store, Failure> {
    Store::open(&Spec::parse(store)?, access).await
}

async fn run(cli: Cli) -> Result<Option<Code>, Failure> {
    let ttl = TtlPolicy {
        session_idle: cli.session_idle_ttl,
        event_retention: cli.event_retention,
        pending_authorization: Duration::from_secs(10 * 60),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let json = cli.json;
    let code = match cli.command {
        Command::Ls { store, kind } => {
            let store = open(&store, Access::Existing).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
            };
            match kind {
                LsKind::Sessions => inventory::ls_sessions(&ctx, &mut out).await?,
                LsKind::Events => inventory::ls_events(&ctx, &mut out).await?,
                LsKind::Clients => inventory::ls_clients(&ctx, &mut out).await?,
                LsKind::Credentials => inventory::ls_credentials(&ctx, &mut out).await?,
                LsKind::Tasks => inventory::ls_tasks(&ctx, &mut out).await?,
                LsKind::Keys => inventory::ls_keys(&ctx, &mut out).await?,
            }
            None
        }
        Command::Show { store, key } => {
            let store = open(&store, Access::Existing).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
            };
            inventory::show(&ctx, &key, &mut out).await?;
            None
        }
        Command::Stats { store } => {
            let store = open(&store, Access::Existing).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
            };
            inventory::stats(&ctx, &mut out).await?;
            None
        }
        Command::Check { store } => {
            let store = open(&store, Access::Existing).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
            };
            check::check(&ctx, &mut out).await?
        }
        Command::Rm {
            store,
            keys,
            prefix,
            dry_run,
            yes,
        } => {
            if keys.is_empty() && prefix.is_none() {
                return Err(fail::usage(
                    "name the keys to delete, or --prefix P (see `mcp-persist ls` and `stats`)",
                ));
            }
            let store = open(&store, Access::Existing).await?;
            sweep::rm(&store, keys, prefix, dry_run, yes, json, &mut out).await?;
            None
        }
        Command::Quarantine { store, logs } => {
            let store = open(&store, Access::Existing).await?;
            sweep::quarantine(&store, &logs, json, &mut out).await?;
            None
        }
        Command::Gc {
            store,
            dry_run,
            yes,
        } => {
            let store = open(&store, Access::Existing).await?;
            sweep::gc(&store, dry_run, yes, json, &mut out).await?;
            None
        }
        Command::Copy {
            source,
            dest,
            kinds,
            dry_run,
        } => {
            let source = open(&source, Access::Existing).await?;
            let dest = open(&dest, Access::Create).await?;
            let kinds = if kinds.is_empty() {
                Kind::ALL.to_vec()
            } else {
                kinds
            };
            copy::copy(&source, &dest, &kinds, ttl, dry_run, json, &mut out).await?
        }
    };
    out.flush()?;
    Ok(code)
}
