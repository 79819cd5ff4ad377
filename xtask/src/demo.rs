//! `cargo xtask demo`: a client and a server killed and restarted, carrying on.
//!
//! Builds the `server` and `client` examples of transport-http (and the
//! `mcp-persist` CLI) and runs them
//! on loopback with SQLite in a fresh folder:
//!
//! 1. the client connects and calls tools (one `initialize` in all);
//! 2. a long call starts and the client is killed with SIGKILL;
//! 3. restarted, it reads its stored session without a network call,
//!    resumes without `initialize` and collects the answer and the progress
//!    it missed;
//! 4. while the client is away again, server instance A finishes a long call
//!    into the shared store and is killed with SIGKILL;
//! 5. instance B on the same store and port serves the session without a new
//!    `initialize` and replays the events the client had not received;
//! 6. the 2026-07-28 chapter: a client starts a task on instance A and is
//!    killed; A is killed; restarted, the client collects the task's result
//!    from instance B, which took the task over when A's lease lapsed and
//!    ran it again;
//! 7. the operator's view: `mcp-persist ls sessions` on the server's store
//!    (the CLI is built with the examples).
//!
//! Every step checks what it shows; the command exits non-zero if one fails.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

/// Progress notifications of each long call, and their spacing.
const SLOW_COUNT: u64 = 20;
const SLOW_DELAY_MS: u64 = 100;

struct Demo {
    bin: PathBuf,
    folder: PathBuf,
    port: u16,
    started: Instant,
    rows: Vec<(String, String)>,
}

/// A child process killed (SIGKILL) when dropped, so a failed step leaves
/// nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn run(_args: &[String]) -> Result<()> {
    println!("mcp-persist demo: a durable MCP client and server, killed and restarted\n");
    let bin = build_examples()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let folder =
        std::env::temp_dir().join(format!("mcp-persist-demo-{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let port = free_port()?;
    let mut demo = Demo {
        bin,
        folder,
        port,
        started: Instant::now(),
        rows: Vec::new(),
    };
    println!("state folder: {}", demo.folder.display());
    println!("server URL:   {}\n", demo.url());
    let outcome = demo.story();
    demo.summary();
    outcome?;
    demo.operator_view()
}

fn build_examples() -> Result<PathBuf> {
    print!("building the server and client examples and the mcp-persist CLI ... ");
    std::io::stdout().flush().ok();
    let status = crate::build_as_tested(&[
        "--example",
        "server",
        "--example",
        "client",
        "--bin",
        "mcp-persist",
    ])
    .status()
    .context("running cargo build")?;
    ensure!(
        status.success(),
        "building the examples and the mcp-persist CLI failed"
    );
    println!("done");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target"));
    Ok(target.join("debug").join("examples"))
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

impl Demo {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn at(&self) -> String {
        format!("[{:>5.1}s]", self.started.elapsed().as_secs_f64())
    }

    fn say(&self, what: &str) {
        println!("{} {what}", self.at());
    }

    fn row(&mut self, what: &str, value: impl Into<String>) {
        self.rows.push((what.to_owned(), value.into()));
    }

    fn story(&mut self) -> Result<()> {
        let server_a = self.start_server("A")?;

        self.say("client: connects and lists tools (a real initialize)");
        let tools = self.client(&["tools"])?;
        ensure!(
            tools.contains("slow_progress"),
            "the server lists no slow_progress tool:\n{tools}"
        );
        let stats = self.stats()?;
        ensure!(
            stats.0 == 1,
            "expected one initialize on A, saw {}",
            stats.0
        );
        self.say("client: stored the session id and the whole InitializeResult");

        self.say(&format!(
            "client: starts a long call ({SLOW_COUNT} progress notifications, {SLOW_DELAY_MS} ms apart)"
        ));
        self.kill_client_mid_call(
            "first",
            Duration::from_millis(SLOW_COUNT * SLOW_DELAY_MS / 3),
        )?;

        self.say("client restarted: what it knows before any network call");
        let status = self.client(&["status"])?;
        for line in status.lines() {
            println!("           | {line}");
        }
        ensure!(
            status.contains("interrupted: id"),
            "the restarted client does not know the interrupted call:\n{status}"
        );
        ensure!(
            status.contains("server: "),
            "no stored server info:\n{status}"
        );

        self.say("client: collects the interrupted call (GET with Last-Event-ID)");
        let recovered = self.client(&["recover"])?;
        let (missed, answered) = recovery_counts(&recovered);
        ensure!(
            answered == 1,
            "the interrupted call's answer was not collected:\n{recovered}"
        );
        self.say(&format!(
            "client: collected the final answer and {missed} progress notifications it missed"
        ));
        let stats = self.stats()?;
        ensure!(
            stats.0 == 1,
            "the restarted client sent initialize: A counted {} in all",
            stats.0
        );
        self.say("server A: still one initialize in all; the restart sent none");
        self.row("client restart: initialize sent", "0 (A counted 1 in all)");
        self.row(
            "client restart: round trips saved",
            "2 (initialize, notifications/initialized)",
        );
        self.row(
            "client restart: answer collected",
            format!("yes, with {missed} missed progress notifications"),
        );

        self.say("client: starts another long call and is killed again");
        self.kill_client_mid_call(
            "second",
            Duration::from_millis(SLOW_COUNT * SLOW_DELAY_MS / 4),
        )?;
        self.wait(
            "server A finishes the call into the shared store",
            Duration::from_millis(SLOW_COUNT * SLOW_DELAY_MS + 800),
        );
        drop(server_a);
        self.say("server A: killed with SIGKILL");

        let server_b = self.start_server("B")?;
        self.say("client restarted against B: resumes the call from the shared event log");
        let recovered = self.client(&["recover"])?;
        let (replayed, answered) = recovery_counts(&recovered);
        ensure!(
            answered == 1,
            "B did not deliver the call's answer:\n{recovered}"
        );
        ensure!(replayed > 0, "B replayed no events:\n{recovered}");
        self.say(&format!(
            "server B: replayed {replayed} events and the final answer across instances"
        ));
        let stats = self.stats()?;
        ensure!(
            stats.0 == 0,
            "B answered {} initialize requests; expected none",
            stats.0
        );
        ensure!(stats.1 >= 1, "B did not restore the session from the store");
        self.say(&format!(
            "server B: 0 initialize, {} session restored from the store",
            stats.1
        ));
        self.row("server failover: initialize on B", "0");
        self.row(
            "server failover: sessions restored on B",
            stats.1.to_string(),
        );
        self.row("server failover: events replayed", replayed.to_string());
        drop(server_b);
        self.task_chapter()?;
        self.row(
            "total time",
            format!("{:.1}s", self.started.elapsed().as_secs_f64()),
        );
        Ok(())
    }

    /// A task on instance A; the client and A killed; the result collected
    /// from instance B.
    fn task_chapter(&mut self) -> Result<()> {
        println!();
        self.say("2026-07-28: durable tasks");
        let server_a = self.start_server_with("A", &["--liveness-grace-ms", "1000"])?;
        self.say("client: starts long_job as a task (30 steps of 100 ms) and polls it");
        let mut child = Running(
            self.client_command(&[
                "--profile",
                "tasks",
                "task",
                "long_job",
                r#"{"steps":30,"step_ms":100,"tag":"demo"}"#,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the client's task call")?,
        );
        let stdout = child.0.stdout.take().context("client stdout")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let created = rx
            .recv_timeout(Duration::from_secs(30))
            .context("the client did not report a created task")?;
        ensure!(
            created.contains("created"),
            "unexpected client output: {created}"
        );
        let task_id = created
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        self.say(&format!(
            "client: task {task_id} created on A (committed before the answer)"
        ));
        self.wait("the task runs on A", Duration::from_millis(1200));
        drop(child);
        self.say("client: killed with SIGKILL while polling");
        drop(server_a);
        self.say("server A: killed with SIGKILL in the middle of the task");
        let _server_b = self.start_server_with("B", &["--liveness-grace-ms", "1000"])?;
        let killed = Instant::now();
        self.say("client restarted: collects the task by polling tasks/get on B");
        let recovered = self.client(&["--profile", "tasks", "recover"])?;
        for line in recovered.lines() {
            println!(
                "           | {}",
                line.chars().take(160).collect::<String>()
            );
        }
        ensure!(
            recovered.contains(": answer ") && recovered.contains("(run 2)"),
            "the task's result was not collected from B:\n{recovered}"
        );
        self.say(&format!(
            "server B: took the task over when A's lease lapsed, ran it again and answered ({:.1}s after the restart)",
            killed.elapsed().as_secs_f64()
        ));
        self.row("task failover: result collected from B", "yes");
        self.row(
            "task failover: runs",
            "2 (A killed mid-way; B ran it to completion)",
        );
        Ok(())
    }

    fn start_server(&self, name: &str) -> Result<Running> {
        self.start_server_with(name, &[])
    }

    fn start_server_with(&self, name: &str, extra: &[&str]) -> Result<Running> {
        let mut child = Command::new(self.bin.join("server"))
            .args([
                "--port",
                &self.port.to_string(),
                "--backend",
                "sqlite",
                "--store",
            ])
            .arg(self.folder.join("server.db"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting server {name}"))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let running = Running(child);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("LISTENING") {
                    let _ = tx.send(line);
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .with_context(|| format!("server {name} did not start listening"))?;
        self.say(&format!(
            "server {name}: listening on port {} (SQLite store)",
            self.port
        ));
        Ok(running)
    }

    fn client_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin.join("client"));
        cmd.arg("--url")
            .arg(self.url())
            .arg("--store")
            .arg(self.folder.join("client.db"))
            .args(args)
            .stderr(Stdio::null());
        cmd
    }

    fn client(&self, args: &[&str]) -> Result<String> {
        let output = self
            .client_command(args)
            .output()
            .with_context(|| format!("running client {}", args.join(" ")))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!(
                "client {} failed ({}):\n{stdout}",
                args.join(" "),
                output.status
            );
        }
        Ok(stdout)
    }

    /// (initialize requests, sessions restored) as counted by the server.
    fn stats(&self) -> Result<(u64, u64)> {
        let out = self.client(&["call", "stats"])?;
        let count = |name: &str| -> Option<u64> {
            let key = format!("\\\"{name}\\\":");
            let at = out.find(&key)? + key.len();
            out[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        };
        match (count("initialize"), count("restored")) {
            (Some(i), Some(r)) => Ok((i, r)),
            _ => bail!("unexpected stats answer: {out}"),
        }
    }

    fn kill_client_mid_call(&self, tag: &str, after: Duration) -> Result<()> {
        let args = format!(r#"{{"count":{SLOW_COUNT},"delay_ms":{SLOW_DELAY_MS},"tag":"{tag}"}}"#);
        let child = self
            .client_command(&["call", "slow_progress", &args])
            .stdout(Stdio::null())
            .spawn()
            .context("starting the client's long call")?;
        let mut running = Running(child);
        self.wait("the call runs", after);
        if let Some(status) = running.0.try_wait()? {
            bail!(
                "the client finished ({status}) before it could be killed; the call was too short"
            );
        }
        drop(running);
        self.say("client: killed with SIGKILL in the middle of the call");
        Ok(())
    }

    /// Waits, showing that it is waiting.
    fn wait(&self, what: &str, how_long: Duration) {
        let until = Instant::now() + how_long;
        print!("{} {what} ", self.at());
        while Instant::now() < until {
            print!(".");
            std::io::stdout().flush().ok();
            thread::sleep(Duration::from_millis(200).min(until - Instant::now()));
        }
        println!();
    }

    /// What an operator sees in the server's store afterwards:
    /// `mcp-persist ls sessions`.
    fn operator_view(&self) -> Result<()> {
        let store = format!("sqlite:{}", self.folder.join("server.db").display());
        println!("\n$ mcp-persist ls sessions {store}");
        let cli = self
            .bin
            .parent()
            .context("the examples folder has a parent")?
            .join("mcp-persist");
        let output = Command::new(cli)
            .args(["ls", &store, "sessions"])
            .output()
            .context("running mcp-persist ls sessions")?;
        let listing = String::from_utf8_lossy(&output.stdout);
        print!("{listing}");
        ensure!(
            output.status.success(),
            "mcp-persist ls sessions failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        ensure!(
            listing.lines().count() >= 2,
            "mcp-persist listed no session in the demo's store"
        );
        Ok(())
    }

    fn summary(&self) {
        if self.rows.is_empty() {
            return;
        }
        let width = self.rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        println!("\nsummary");
        println!("  {:-<width$}-+-{:-<40}", "", "");
        for (k, v) in &self.rows {
            println!("  {k:<width$} | {v}");
        }
        println!("  {:-<width$}-+-{:-<40}", "", "");
        println!("  state kept in {}", self.folder.display());
    }
}

/// (progress notifications seen, answers collected) in the client's
/// `recover` output.
fn recovery_counts(out: &str) -> (usize, usize) {
    let missed = out.lines().filter(|l| l.contains(": missed ")).count();
    let answered = out.lines().filter(|l| l.contains(": answer ")).count();
    (missed, answered)
}
