//! The README, as a new user meets it: its client and server, built from the
//! README's own code with exactly the dependencies its quick start lists,
//! run as processes. The client is killed with SIGKILL mid-call and started
//! again: it sends no `initialize`, collects the answer once, and the run
//! after that recovers nothing.

#[path = "../extract.rs"]
mod extract;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use mcp_persist::{ClientStateStore, ServerKey, sqlite::SqliteStore};

const FACADE_README: &str = include_str!("../../mcp-persist/README.md");
const ROOT_README: &str = include_str!("../../README.md");
const MANIFEST: &str = include_str!("../Cargo.toml");

/// How long a step may take before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

/// Kills the process when dropped, so a failing test leaves none behind.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    fn start(binary: &str, dir: &Path, env: (&str, &str)) -> Process {
        let child = Command::new(binary)
            .current_dir(dir)
            .env(env.0, env.1)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        Process(child)
    }

    /// Waits for the process to end by itself; its stdout, line by line.
    fn finish(mut self) -> Vec<String> {
        let mut stdout = self.0.stdout.take().expect("piped stdout");
        let reader = thread::spawn(move || {
            let mut text = String::new();
            stdout.read_to_string(&mut text).expect("read stdout");
            text
        });
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the client did not finish");
            thread::sleep(Duration::from_millis(20));
        };
        let text = reader.join().expect("reader");
        assert!(status.success(), "the client failed ({status}):\n{text}");
        text.lines().map(str::to_owned).collect()
    }

    /// Kills the process with SIGKILL; what it printed.
    fn kill(mut self) -> Vec<String> {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
        let mut text = String::new();
        if let Some(mut stdout) = self.0.stdout.take() {
            stdout.read_to_string(&mut text).expect("read stdout");
        }
        text.lines().map(str::to_owned).collect()
    }
}

/// A TCP proxy to `upstream` that counts the `initialize` requests it
/// carries.
fn counting_proxy(upstream: SocketAddr, initializes: Arc<AtomicUsize>) -> SocketAddr {
    const PATTERN: &[u8] = br#""method":"initialize""#;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let addr = listener.local_addr().expect("proxy address");
    thread::spawn(move || {
        for inbound in listener.incoming() {
            let Ok(inbound) = inbound else { continue };
            let Ok(outbound) = TcpStream::connect(upstream) else {
                continue;
            };
            let initializes = initializes.clone();
            let (mut up_in, mut up_out) = (
                inbound.try_clone().expect("clone"),
                outbound.try_clone().expect("clone"),
            );
            thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                let mut tail = Vec::new();
                while let Ok(n) = up_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    tail.extend_from_slice(&buf[..n]);
                    let found = tail
                        .windows(PATTERN.len())
                        .filter(|w| *w == PATTERN)
                        .count();
                    initializes.fetch_add(found, Ordering::SeqCst);
                    let keep = tail.len().min(PATTERN.len() - 1);
                    tail.drain(..tail.len() - keep);
                    if up_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = up_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut down_in, mut down_out) = (outbound, inbound);
            thread::spawn(move || {
                let _ = std::io::copy(&mut down_in, &mut down_out);
                let _ = down_out.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the client's store journals a `tools/call` with a stream
/// cursor: the call is in flight, and a restarted process can resume it.
fn wait_until_journaled(runtime: &tokio::runtime::Runtime, db: &Path, url: &str) {
    wait_until("the client's store exists", || db.exists());
    let key = ServerKey::new(url, "default").expect("server key");
    runtime.block_on(async {
        let store = SqliteStore::open(db)
            .await
            .expect("open the client's store");
        let state = ClientStateStore::new(Arc::new(store));
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let journal = state.journal(&key).await.expect("read the journal");
            if journal
                .iter()
                .any(|(_, r)| r.method == "tools/call" && r.last_event_id.is_some())
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the call was never journaled: {journal:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

#[test]
fn the_readme_client_survives_a_sigkill_and_collects_the_answer_once() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let folder = tempfile::tempdir().expect("tempdir");
    let (server_dir, client_dir) = (folder.path().join("server"), folder.path().join("client"));
    std::fs::create_dir_all(&server_dir).expect("server folder");
    std::fs::create_dir_all(&client_dir).expect("client folder");

    let server_addr = free_port();
    let _server = Process::start(
        env!("CARGO_BIN_EXE_readme-server"),
        &server_dir,
        ("MCP_ADDR", &server_addr.to_string()),
    );
    wait_until("the README server listens", || {
        TcpStream::connect(server_addr).is_ok()
    });
    let initializes = Arc::new(AtomicUsize::new(0));
    let proxy = counting_proxy(server_addr, initializes.clone());
    let url = format!("http://{proxy}/mcp");
    let client = env!("CARGO_BIN_EXE_readme-client");
    let db = client_dir.join("client-state.db");

    // First run: killed mid-call, once the call is journaled.
    let first = Process::start(client, &client_dir, ("MCP_URL", &url));
    wait_until_journaled(&runtime, &db, &url);
    let printed = first.kill();
    assert_eq!(
        count(&printed, "answer:"),
        0,
        "killed too late: {printed:?}"
    );
    assert_eq!(initializes.load(Ordering::SeqCst), 1);

    // Second run: the answer the killed process never saw, then a new call.
    let second = Process::start(client, &client_dir, ("MCP_URL", &url)).finish();
    assert_eq!(count(&second, "recovered: Ok("), 1, "{second:?}");
    assert!(
        second
            .iter()
            .any(|l| l.starts_with("recovered: Ok(") && l.contains("done")),
        "{second:?}"
    );
    assert_eq!(count(&second, "answer:"), 1, "{second:?}");
    assert_eq!(second.len(), 2, "nothing else: {second:?}");

    // Third run: nothing to recover; the answered calls stay answered.
    let third = Process::start(client, &client_dir, ("MCP_URL", &url)).finish();
    assert_eq!(count(&third, "answer:"), 1, "{third:?}");
    assert_eq!(third.len(), 1, "nothing recovered: {third:?}");

    assert_eq!(
        initializes.load(Ordering::SeqCst),
        1,
        "a restarted client sent initialize"
    );
}

/// The root README shows the same client and server as the facade's, which
/// are the ones built and run above.
#[test]
fn the_root_readme_shows_the_tested_programs() {
    for heading in ["## A durable client", "## A durable server"] {
        let tested = extract::code_under(FACADE_README, heading).expect("facade README block");
        let shown = extract::code_under(ROOT_README, heading).expect("root README block");
        assert_eq!(
            shown, tested,
            "README.md and mcp-persist/README.md differ under {heading:?}"
        );
    }
}

/// Every crate the README's programs use, with every feature, is in its
/// quick start: the programs build from exactly that (this crate's
/// dependencies), and `cargo xtask features` builds this crate alone.
#[test]
fn the_quick_start_lists_every_dependency() {
    let quick_start = FACADE_README
        .split("## Quick start")
        .nth(1)
        .and_then(|s| s.split("```sh").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a sh block in the quick start");
    let mut listed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in quick_start.lines().map(str::trim) {
        let Some(args) = line.strip_prefix("cargo add ") else {
            continue;
        };
        let args = args.split('#').next().unwrap_or_default();
        let mut words = args.split_whitespace();
        let name = words.next().expect("a crate name").to_owned();
        let features = listed.entry(name).or_default();
        while let Some(word) = words.next() {
            if word == "--features" {
                let list = words.next().expect("features after --features");
                features.extend(list.split(',').map(str::to_owned));
            }
        }
    }
    let mut manifest: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let dependencies = MANIFEST
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .expect("a [dependencies] table");
    for line in dependencies.lines().filter(|l| l.contains(" = ")) {
        let (name, spec) = line.split_once(" = ").expect("name = spec");
        let features = spec
            .split("features = [")
            .nth(1)
            .and_then(|s| s.split(']').next())
            .map(|list| {
                list.split(',')
                    .map(|f| f.trim().trim_matches('"').to_owned())
                    .filter(|f| !f.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        manifest.insert(name.trim().to_owned(), features);
    }
    assert_eq!(listed, manifest);
}
