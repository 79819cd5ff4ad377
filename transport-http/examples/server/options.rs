//! The command line: flags, `--help`, and what they parse into.

use std::time::Duration;

use anyhow::Context as _;

/// Command-line options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1 (0: any free one).
    pub port: u16,
    /// `memory`, `file`, `sqlite` or `redis`; `None`: `--store` is a store
    /// URL, or there is no store (memory).
    pub backend: Option<String>,
    /// A store URL (`sqlite:state.db`, `postgres://…`, …), or with
    /// `--backend`: the database path for `sqlite`, the directory for
    /// `file`, the server URL for `redis`.
    pub store: Option<String>,
    /// Key prefix in Redis (instances of one deployment share it).
    pub redis_prefix: Option<String>,
    /// Session idle TTL.
    pub idle_ttl: Duration,
    /// SSE retry hint sent to clients.
    pub sse_retry: Duration,
    /// How long a resumed stream waits for new events.
    pub tail_idle: Duration,
    /// Serve with rmcp's in-memory defaults instead (the baseline).
    pub rmcp_defaults: bool,
    /// Event retention age.
    pub event_retention: Duration,
    /// Events kept per stream.
    pub event_max: u64,
    /// Check the session in the store on every request (`None`: the
    /// library's default, which does).
    pub strict_sessions: Option<bool>,
    /// How long an instance may go without a heartbeat before its streams
    /// and tasks are ended or taken over (`None`: the library's default).
    pub liveness_grace: Option<Duration>,
    /// Where task operations note their starts and ends.
    pub runs_file: Option<std::path::PathBuf>,
    /// Send events at once and commit them within this window
    /// (`EventDurability::Pipelined`; 10 ms for `--pipelined-events`)
    /// instead of committing each first.
    pub pipelined_events: Option<Duration>,
    /// Commit each event before sending it, without syncing it to disk
    /// (`EventDurability::Written`).
    pub written_events: bool,
}

/// The flags, as `--help` prints them.
pub const USAGE: &str = "\
A durable MCP server (Streamable HTTP, protocol revisions 2025-11-25 and 2026-07-28)
on mcp-persist: run several on one store and any of them serves any session.

Usage: server [FLAGS]

Store:
  --store URL                   where state lives: sqlite:PATH, file:DIR, redis://HOST:PORT/,
                                redis+cluster://H:P,H:P, postgres://USER@HOST/DB or memory:
                                (default memory: this process only)
  --backend memory|file|sqlite|redis  the older form: --backend sqlite --store PATH
  --redis-prefix P              key prefix in Redis (instances of one deployment share it)

Serving:
  --port N                      port on 127.0.0.1 (default 0: any free one)
  --idle-ttl-ms N               how long an unused session lives (default 1800000)
  --strict-sessions             read the session from the store on every request (the default)
  --coalesced-sessions          check the session in the store only every tenth of its idle TTL
  --sse-retry-ms N              SSE reconnection hint sent to clients (default 200)
  --tail-idle-ms N              how long a resumed stream waits for a new event (default 60000)
  --event-retention-ms N        how long events are kept for resumption (default 3600000)
  --event-max N                 events kept per stream (default 10000)
  --pipelined-events            send events at once, commit them within 10 ms
  --pipelined-window-ms N       the same, committed within N ms
  --written-events              commit each event before sending it, without a disk sync
  --liveness-grace-ms N         how long an instance may miss its lease before its tasks
                                and streams are ended or taken over (default 1500)
  --runs-file PATH              append `start|done <task> <generation>` lines for task runs
  --rmcp-defaults               rmcp's in-memory session manager, no store (the baseline)

  -h, --help                    print this and exit

It prints `LISTENING <address>` once it accepts connections. RUST_LOG sets the log level
(logs go to stderr).
";

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    /// Serve with these options.
    Serve(Box<Options>),
    /// Print [`USAGE`] and exit.
    Help,
}

impl Command {
    /// Parses `args` (without the program name); `--help` or `-h` anywhere
    /// asks for the usage.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Command> {
        let args: Vec<String> = args.into_iter().collect();
        if args.iter().any(|a| a == "--help" || a == "-h") {
            return Ok(Command::Help);
        }
        Options::parse_flags(args).map(|o| Command::Serve(Box::new(o)))
    }
}

impl Options {
    /// Parses `args` (without the program name) into options to serve with.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Options> {
        match Command::parse(args)? {
            Command::Serve(options) => Ok(*options),
            Command::Help => anyhow::bail!("--help asks for the usage, not for a server"),
        }
    }

    fn parse_flags(args: Vec<String>) -> anyhow::Result<Options> {
        let mut o = Options {
            port: 0,
            backend: None,
            store: None,
            redis_prefix: None,
            idle_ttl: Duration::from_secs(30 * 60),
            sse_retry: Duration::from_millis(200),
            tail_idle: Duration::from_secs(60),
            rmcp_defaults: false,
            event_retention: Duration::from_secs(60 * 60),
            event_max: 10_000,
            strict_sessions: None,
            liveness_grace: None,
            runs_file: None,
            pipelined_events: None,
            written_events: false,
        };
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            match flag.as_str() {
                "--rmcp-defaults" => o.rmcp_defaults = true,
                "--strict-sessions" => o.strict_sessions = Some(true),
                "--coalesced-sessions" => o.strict_sessions = Some(false),
                "--pipelined-events" => o.pipelined_events = Some(Duration::from_millis(10)),
                "--written-events" => o.written_events = true,
                "--port"
                | "--backend"
                | "--store"
                | "--redis-prefix"
                | "--idle-ttl-ms"
                | "--sse-retry-ms"
                | "--tail-idle-ms"
                | "--event-retention-ms"
                | "--event-max"
                | "--liveness-grace-ms"
                | "--pipelined-window-ms"
                | "--runs-file" => {
                    let value = args
                        .next()
                        .with_context(|| format!("{flag} needs a value"))?;
                    let number = |v: &str| -> anyhow::Result<u64> {
                        v.parse()
                            .with_context(|| format!("{flag} takes a whole number, not {v:?}"))
                    };
                    let ms = |v: &str| number(v).map(Duration::from_millis);
                    match flag.as_str() {
                        "--port" => {
                            o.port = u16::try_from(number(&value)?)
                                .with_context(|| format!("{flag} {value} is not a port"))?;
                        }
                        "--backend" => o.backend = Some(value),
                        "--store" => o.store = Some(value),
                        "--redis-prefix" => o.redis_prefix = Some(value),
                        "--idle-ttl-ms" => o.idle_ttl = ms(&value)?,
                        "--sse-retry-ms" => o.sse_retry = ms(&value)?,
                        "--tail-idle-ms" => o.tail_idle = ms(&value)?,
                        "--event-retention-ms" => o.event_retention = ms(&value)?,
                        "--event-max" => o.event_max = number(&value)?,
                        "--liveness-grace-ms" => o.liveness_grace = Some(ms(&value)?),
                        "--pipelined-window-ms" => o.pipelined_events = Some(ms(&value)?),
                        _ => o.runs_file = Some(value.into()),
                    }
                }
                other => anyhow::bail!("unknown flag {other}"),
            }
        }
        Ok(o)
    }

    /// The store URL the flags name: `--store URL` as it is, the older
    /// `--backend NAME --store PATH` turned into one, `memory:` for none;
    /// `--redis-prefix` becomes the URL's `prefix`.
    pub fn store_url(&self) -> anyhow::Result<String> {
        let url = match (self.backend.as_deref(), self.store.as_deref()) {
            (None | Some("memory"), None) => "memory:".to_owned(),
            (None, Some(url)) => url.to_owned(),
            (Some("sqlite"), Some(path)) => format!("sqlite:{path}"),
            (Some("file"), Some(path)) => format!("file:{path}"),
            (Some("redis"), Some(url)) => url.to_owned(),
            (Some("memory"), Some(_)) => {
                anyhow::bail!("--backend memory keeps no store: drop --store")
            }
            (Some(b @ ("sqlite" | "file" | "redis")), None) => {
                anyhow::bail!("--backend {b} needs --store (or give --store a URL alone)")
            }
            (Some(other), _) => anyhow::bail!(
                "unknown backend {other} (memory, file, sqlite, redis); or give --store a URL"
            ),
        };
        let Some(prefix) = &self.redis_prefix else {
            return Ok(url);
        };
        anyhow::ensure!(
            prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)),
            "--redis-prefix takes letters, digits and - _ . : only, not {prefix:?}"
        );
        let joint = if url.contains('?') { '&' } else { '?' };
        Ok(format!("{url}{joint}prefix={prefix}"))
    }
}
