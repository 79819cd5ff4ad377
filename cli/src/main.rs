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
//! | `rekey STORE --keyring K` | re-seals every record under the active key, online |
//!
//! Stores are named by URL: `sqlite:PATH`, `file:DIR`,
//! `redis://HOST:PORT`, `redis+cluster://H1:P1,H2:P2`,
//! `postgres://USER:PASS@HOST/DB`, `dynamodb://TABLE?region=R`,
//! `secretsmanager://REGION?prefix=P`, or a split bundle
//! `credentials=URL;rest=URL`. Token text is never printed.
//!
//! Sealed (encrypted) records are shown as sealed, with the id of the key
//! they need; `--keyring SOURCE` (`env:VAR`, `file:PATH`,
//! `secretsmanager:SECRET_ID`) opens them, and `check` then reports the
//! records under keys the ring no longer holds.
//!
//! # Features
//!
//! This crate has no optional features: every backend is built in.

mod check;
mod copy;
mod fail;
mod interrupt;
mod inventory;
mod lock;
mod model;
mod output;
mod sealing;
mod sweep;
mod target;

use std::{ffi::OsString, io::Write, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

use crate::{
    copy::Destination,
    fail::{Code, Failure},
    inventory::Ctx,
    lock::DestLock,
    model::{Kind, TtlPolicy, parse_duration},
    target::{Access, Found, Spec, Store},
};

fn after_help() -> String {
    format!(
        "Store URLs:\n{}\n\n{}\n\n{}",
        target::forms(),
        sealing::KEYRING_FORMS,
        fail::EXIT_CODES
    )
}

/// Inspect, check, clean and migrate the state mcp-persist keeps for MCP
/// clients and servers.
#[derive(Debug, Parser)]
#[command(name = "mcp-persist", version, after_help = after_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Print JSON instead of tables (for scripts); errors, notes and
    /// warnings on standard error become JSON objects too, one a line.
    #[arg(long, global = true)]
    json: bool,

    /// The servers' session idle TTL, for "TTL left" and for the TTL a
    /// copied session gets (sessions record when they were last seen).
    #[arg(long, global = true, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    session_idle_ttl: Duration,

    /// The servers' event retention, the TTL copied event logs get.
    #[arg(long, global = true, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    event_retention: Duration,

    /// The servers' window for keyed (exactly-once) calls: a copied call
    /// record expires this long after its last change.
    #[arg(long, global = true, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    call_window: Duration,

    /// Where the sealing keys are (`env:VAR`, `file:PATH`,
    /// `secretsmanager:SECRET_ID`): sealed records are then opened, and
    /// `check` reports those under keys the ring does not hold. Without it,
    /// sealed records are shown as sealed.
    #[arg(long, global = true, value_name = "SOURCE")]
    keyring: Option<String>,
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
    #[command(after_help = target::forms())]
    Ls {
        /// The store URL.
        store: String,
        /// What to list.
        #[arg(value_enum, default_value = "sessions")]
        kind: LsKind,
    },
    /// Show one record decoded, secrets redacted; or a log's records (the
    /// name of an event stream's log, as `ls events` and `stats` show it).
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
        /// Where to: created if it is a missing database or file store,
        /// in a folder that exists (see --create-dirs).
        dest: String,
        /// Only these kinds (comma-separated).
        #[arg(long, value_enum, value_delimiter = ',')]
        kinds: Vec<Kind>,
        /// Say what would be copied; write nothing, create nothing.
        #[arg(long)]
        dry_run: bool,
        /// Create the destination's missing parent folders too.
        #[arg(long)]
        create_dirs: bool,
    },
    /// Re-seal every record under the active key of --keyring (the first
    /// key), while servers and clients keep running: compare-and-swap, a
    /// credential only under its refresh lease. Safe to interrupt and run
    /// again. Logs are append-only and not rewritten: it lists those still
    /// holding records under old keys, and until when.
    #[command(after_help = sealing::KEYRING_FORMS)]
    Rekey {
        /// The store URL.
        store: String,
        /// Seal every kind, as applications built with `seal_everything`
        /// do (by default plain records are sealed only for kinds with
        /// secrets).
        #[arg(long)]
        seal_everything: bool,
        /// The clients' refresh lease TTL: a credential whose lease stays
        /// taken this long is re-sealed anyway (the holder is gone).
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
        lease_ttl: Duration,
        /// Skip every key up to this one (where an interrupted run stopped).
        #[arg(long, value_name = "KEY")]
        start_after: Option<String>,
    },
}

/// Prints a failure on standard error: text, or one JSON object under
/// `--json`. A closed output pipe ends the command quietly.
fn report_failure(failure: &Failure, json: bool) {
    if failure.code == Code::PipeClosed {
        return;
    }
    let mut err = std::io::stderr().lock();
    // Nothing more can be done when standard error is gone too.
    let _ = if json {
        writeln!(err, "{}", failure.to_json())
    } else {
        writeln!(err, "error: {failure}")
    };
}

/// Parses the command line; a usage error under `--json` is printed as
/// JSON (help and version stay text).
fn parse() -> Result<Cli, ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    match Cli::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        Err(e) => {
            use clap::error::ErrorKind;
            let json = args.iter().skip(1).any(|a| a == "--json");
            if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                e.exit();
            }
            let text = e.render().to_string();
            let text = text.trim().trim_start_matches("error: ");
            report_failure(&fail::usage(text), true);
            Err(ExitCode::from(Code::Usage as u8))
        }
    }
}

/// With `MCP_PERSIST_LOG` set (a `tracing` filter such as `debug` or
/// `mcp_persist_store_sqlite=trace`), what the stores do is written to
/// standard error, for an operator who wants to see it. Secrets never
/// appear there: no store logs one.
fn trace_to_stderr() {
    let Ok(filter) = std::env::var("MCP_PERSIST_LOG") else {
        return;
    };
    let Ok(filter) = tracing_subscriber::EnvFilter::try_new(&filter) else {
        eprintln!("note: MCP_PERSIST_LOG={filter:?} is not a log filter; nothing is logged");
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let json = cli.json;
    output::set_json(json);
    trace_to_stderr();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report_failure(
                &Failure::new(Code::Other, format!("cannot start the async runtime: {e}")),
                json,
            );
            return ExitCode::from(Code::Other as u8);
        }
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(code)) => ExitCode::from(code as u8),
        Err(failure) => {
            report_failure(&failure, json);
            ExitCode::from(failure.code as u8)
        }
    }
}

async fn open(store: &str, access: Access) -> Result<Store, Failure> {
    Store::open(&Spec::parse(store)?, access).await
}

/// Closes `store` whatever `result` is, then returns `result`: a SQLite
/// store that was only read is left without `-wal` and `-shm` files.
async fn closing<T>(store: Store, result: Result<T, Failure>) -> Result<T, Failure> {
    store.close().await;
    result
}

async fn run(cli: Cli) -> Result<Option<Code>, Failure> {
    let ttl = TtlPolicy {
        session_idle: cli.session_idle_ttl,
        event_retention: cli.event_retention,
        call_window: cli.call_window,
        pending_authorization: Duration::from_secs(10 * 60),
    };
    let keys = sealing::load(cli.keyring.as_deref()).await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let json = cli.json;
    let code = match cli.command {
        Command::Ls { store, kind } => {
            let store = open(&store, Access::ReadOnly).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
                keys: keys.as_ref(),
            };
            let listed = match kind {
                LsKind::Sessions => inventory::ls_sessions(&ctx, &mut out).await,
                LsKind::Events => inventory::ls_events(&ctx, &mut out).await,
                LsKind::Clients => inventory::ls_clients(&ctx, &mut out).await,
                LsKind::Credentials => inventory::ls_credentials(&ctx, &mut out).await,
                LsKind::Tasks => inventory::ls_tasks(&ctx, &mut out).await,
                LsKind::Keys => inventory::ls_keys(&ctx, &mut out).await,
            };
            if listed.is_ok() {
                inventory::explain_empty(&store).await;
            }
            closing(store, listed).await?;
            None
        }
        Command::Show { store, key } => {
            let store = open(&store, Access::ReadOnly).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
                keys: keys.as_ref(),
            };
            let shown = inventory::show(&ctx, &key, &mut out).await;
            closing(store, shown).await?;
            None
        }
        Command::Stats { store } => {
            let store = open(&store, Access::ReadOnly).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
                keys: keys.as_ref(),
            };
            let counted = inventory::stats(&ctx, &mut out).await;
            if counted.is_ok() {
                inventory::explain_empty(&store).await;
            }
            closing(store, counted).await?;
            None
        }
        Command::Check { store } => {
            let store = open(&store, Access::ReadOnly).await?;
            let ctx = Ctx {
                store: &store,
                ttl,
                json,
                keys: keys.as_ref(),
            };
            let checked = check::check(&ctx, &mut out).await;
            if checked.is_ok() {
                inventory::explain_empty(&store).await;
            }
            closing(store, checked).await?
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
            let access = if dry_run {
                Access::ReadOnly
            } else {
                Access::Write
            };
            let store = open(&store, access).await?;
            let removed = sweep::rm(&store, keys, prefix, dry_run, yes, json, &mut out).await;
            closing(store, removed).await?;
            None
        }
        Command::Quarantine { store, logs } => {
            let store = open(&store, Access::Write).await?;
            let moved = sweep::quarantine(&store, &logs, json, &mut out).await;
            closing(store, moved).await?;
            None
        }
        Command::Gc {
            store,
            dry_run,
            yes,
        } => {
            let access = if dry_run {
                Access::ReadOnly
            } else {
                Access::Write
            };
            let store = open(&store, access).await?;
            let swept = sweep::gc(&store, dry_run, yes, json, &mut out).await;
            closing(store, swept).await?;
            None
        }
        Command::Copy {
            source,
            dest,
            kinds,
            dry_run,
            create_dirs,
        } => {
            let kinds = if kinds.is_empty() {
                Kind::ALL.to_vec()
            } else {
                kinds
            };
            let source = Spec::parse(&source)?;
            let dest = Spec::parse(&dest)?;
            let access = Access::Create { create_dirs };
            // Both are looked at before anything is opened or created.
            let source_found = source.exists(Access::ReadOnly).await?;
            let found = dest.exists(access).await?;
            let source = Store::open_found(&source, Access::ReadOnly, Some(source_found)).await?;
            let copied = copy_into(
                &source, &dest, access, found, &kinds, ttl, dry_run, json, &mut out,
            )
            .await;
            closing(source, copied).await?
        }
        Command::Rekey {
            store,
            seal_everything,
            lease_ttl,
            start_after,
        } => {
            let Some(ring) = keys else {
                return Err(fail::usage(
                    "rekey needs --keyring SOURCE: the keyring the applications use, the active key first",
                ));
            };
            let store = open(&store, Access::Write).await?;
            let args = sealing::RekeyArgs {
                everything: seal_everything,
                lease_ttl,
                start_after,
            };
            let rekeyed = sealing::rekey(&store, ring, args, json, &mut out).await;
            closing(store, rekeyed).await?
        }
    };
    out.flush()?;
    Ok(code)
}

/// What `copy` writes into: `store` is `None` in a dry run into a store on
/// this machine, which is only looked at (and such a store keeps logs).
fn destination<'a>(
    dest: &Spec,
    store: Option<&'a Store>,
    new: bool,
    lock: Option<&'a DestLock>,
) -> Destination<'a> {
    Destination {
        label: dest.display(),
        holds_logs: store.is_none_or(|s| s.log().is_some()),
        store,
        new,
        lock,
    }
}

/// `copy` from the opened `source` into `dest`: a dry run never opens a
/// local destination (opening creates it) nor one that opening would make
/// (a new Postgres schema, a `create=1` DynamoDB table), and opens any
/// other read-only; a real one locks it while it copies.
#[allow(clippy::too_many_arguments)]
async fn copy_into(
    source: &Store,
    dest: &Spec,
    access: Access,
    found: Found,
    kinds: &[Kind],
    ttl: TtlPolicy,
    dry_run: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<Option<Code>, Failure> {
    let local = dest.is_local();
    let new = !found.all();
    let plan = |store, lock| destination(dest, store, new, lock);
    if dry_run && (local || new) {
        return copy::copy(source, &plan(None, None), kinds, ttl, true, json, out).await;
    }
    if !dry_run {
        interrupt::install();
    }
    // A writable open may create or migrate: a dry run reads what is there.
    let store = if dry_run {
        Store::open(dest, Access::ReadOnly).await?
    } else {
        Store::open_found(dest, access, Some(found)).await?
    };
    let lock = if dry_run {
        None
    } else {
        match DestLock::acquire(&store.rest).await {
            Ok(lock) => lock,
            Err(failure) => return closing(store, Err(failure)).await,
        }
    };
    let copied = copy::copy(
        source,
        &plan(Some(&store), lock.as_ref()),
        kinds,
        ttl,
        dry_run,
        json,
        out,
    )
    .await;
    let copied = closing(store, copied).await;
    if let Some(lock) = lock {
        lock.release().await;
    }
    copied
}
