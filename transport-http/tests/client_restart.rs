//! The user story, with real processes: a client process is killed with
//! SIGKILL in the middle of a slow tool call; a new process on the same
//! store continues the session without `initialize`, collects the answer
//! and the progress it missed, and never reuses a request id.
//!
//! Runs on the SQLite and the file store (and Redis, for answered calls after
//! a return from `main`). The test binary is its own child:
//! started with `MCP_PERSIST_CLIENT_CHILD` set, it plays a client process.

mod client_support;

use client_support::Fixture;

use std::{process::Stdio, sync::atomic::Ordering, time::Duration};

use mcp_persist_core::{KvStore, Stores};
use mcp_persist_transport_http::client::{
    ClientHandle, DurableClientBuilder, RecoveredMessage, Recovery,
};
use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    model::{
        CallToolRequestParams, NumberOrString, ProgressNotificationParam, ProgressToken,
        RequestMetaObject, ResourceUpdatedNotificationParam,
    },
    service::NotificationContext,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const CHILD_ENV: &str = "MCP_PERSIST_CLIENT_CHILD";

/// The client example of the crate's README, verbatim (checked by
/// `readme_example_is_this_one`), run by the `readme` child.
mod readme {
    // README example: begin
    use mcp_persist_core::Stores;
    use mcp_persist_transport_http::client::{DurableClientBuilder, Recovery, TaskOutcome};
    use rmcp::{ServiceExt, model::CallToolRequestParams};

    async fn run(url: &str, stores: &Stores) -> Result<(), Box<dyn std::error::Error>> {
        let (transport, handle) = DurableClientBuilder::new(url, stores).build().await?;
        // After a restart: the stored server facts, before any network call.
        if let Some(info) = handle.initialize_result() {
            println!("{} {}", info.server_info.name, info.server_info.version);
        }
        let client = ().serve(transport).await?; // no `initialize` on a stored session
        // The answers the previous process never saw, collected beside new calls.
        let mut recovering = Vec::new();
        for recovery in handle.recover() {
            let (handle, peer) = (handle.clone(), client.peer().clone());
            recovering.push(tokio::spawn(async move {
                match recovery {
                    Recovery::Resumable(resumed) => match resumed.collect().await {
                        // rmcp's ServerResult (or ErrorData), after the progress missed.
                        Ok((_missed, answer)) => println!("recovered: {answer:?}"),
                        // Still listed: `handle.recover()` again retries.
                        Err(error) => println!("not now: {error}"),
                    },
                    Recovery::Task(task) => match task.collect().await {
                        Ok(TaskOutcome::Answer(answer)) => println!("task: {answer:?}"),
                        Ok(other) => println!("task: {other:?}"),
                        Err(error) => println!("task not now: {error}"),
                    },
                    // No stream to resume, to a server that runs a keyed call once:
                    // sent again with its key (2026-07-28 calls, lost sessions).
                    Recovery::Reissue(call) => match call.send_with(&peer).await {
                        Ok(answer) => println!("sent again: {answer:?}"),
                        Err(error) => println!("not now: {error}"),
                    },
                    // No cursor, or its session is gone: the application decides.
                    Recovery::Lost { request, .. } => {
                        println!("lost: {} {:?}", request.method, request.params);
                        handle.dismiss(&request);
                    }
                    _ => {}
                }
            }));
        }
        let echo = client.call_tool(CallToolRequestParams::new("echo")).await?;
        println!("new call: {echo:?}");
        for task in recovering {
            task.await?;
        }
        client.cancel().await?; // keeps the session; `handle.end_session()` ends it
        Ok(())
    }
    // README example: end

    /// The example, for the child that runs it.
    pub(super) async fn example(url: &str, stores: &Stores) -> Result<(), String> {
        run(url, stores).await.map_err(|e| e.to_string())
    }
}

/// The README's client example is the one this file runs.
fn readme_example_is_this_one() {
    let source = include_str!("client_restart.rs");
    let begin = source
        .find("// README example: begin\n")
        .expect("begin marker");
    let end = source
        .find("    // README example: end")
        .expect("end marker");
    let region = &source[begin + "// README example: begin\n".len()..end];
    let unindented: String = region
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let readme = include_str!("../README.md");
    assert!(
        readme.contains(&unindented),
        "the README's client example and tests/client_restart.rs differ"
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(role) = std::env::var(CHILD_ENV) {
        runtime.block_on(child(&role));
        return;
    }
    readme_example_is_this_one();
    eprintln!("the README's example after a SIGKILL ...");
    runtime.block_on(readme_story());
    eprintln!("the README's example after a SIGKILL: ok");
    for backend in ["sqlite", "file"] {
        eprintln!("user story on the {backend} store ...");
        runtime.block_on(user_story(backend));
        eprintln!("user story on the {backend} store: ok");
    }
    for backend in ["sqlite", "file", "redis"] {
        if backend == "redis" && std::env::var("MCP_PERSIST_REDIS_URL").is_err() {
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            assert!(
                !ci,
                "MCP_PERSIST_REDIS_URL is not set: run the tests through `cargo xtask test`"
            );
            eprintln!(
                "skipped on Redis: MCP_PERSIST_REDIS_URL is not set (`cargo xtask test` starts Redis)"
            );
            continue;
        }
        eprintln!("answered calls after a return from main, {backend} store ...");
        runtime.block_on(answered_story(backend));
        eprintln!("answered calls after a return from main, {backend} store: ok");
    }
    eprintln!("overlapping calls across a SIGKILL ...");
    runtime.block_on(overlap_story());
    eprintln!("overlapping calls across a SIGKILL: ok");
    eprintln!("standalone stream across a SIGKILL ...");
    runtime.block_on(standalone_story(Fixture::Rmcp));
    eprintln!("standalone stream across a SIGKILL: ok");
    eprintln!("standalone stream across a SIGKILL, cursor refused ...");
    runtime.block_on(standalone_story(Fixture::RefusesResume));
    eprintln!("standalone stream across a SIGKILL, cursor refused: ok");
}

async fn open_store(backend: &str, dir: &str) -> Stores {
    let path = std::path::Path::new(dir);
    match backend {
        "sqlite" => Stores::new(
            mcp_persist_store_sqlite::SqliteStore::open(path.join("state.db"))
                .await
                .expect("open sqlite"),
        ),
        "file" => {
            let store = mcp_persist_store_file::FileStore::open(path.join("files"))
                .await
                .expect("open file store");
            let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::new(store);
            Stores::from_parts(kv, None)
        }
        // A store driven by the application's runtime: its last writes
        // must be taken before that runtime stops.
        "redis" => {
            let url = std::env::var("MCP_PERSIST_REDIS_URL").expect("MCP_PERSIST_REDIS_URL");
            let folder = path.file_name().and_then(|n| n.to_str()).expect("folder");
            let store = mcp_persist_store_redis::RedisStore::standalone(url)
                .key_prefix(format!("client-restart-{folder}:"))
                .connect()
                .await
                .expect("open redis store");
            let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::new(store);
            Stores::from_parts(kv, None)
        }
        other => panic!("unknown backend {other}"),
    }
}

/// Prints the number of every announcement (`announce://<n>`) the server
/// sends on the standalone stream, as a JSON line, once the journal holds
/// the stream's cursor past it (the decorator records the cursor before
/// rmcp hands the message on): a message printed is one the next process
/// never sees again, however late a loaded machine runs the writer.
#[derive(Clone)]
struct Listener(ClientHandle);

impl ClientHandler for Listener {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let n = params
            .uri
            .strip_prefix("announce://")
            .and_then(|n| n.parse::<u64>().ok());
        self.0.flush().await;
        println!("{}", json!({ "message": n }));
    }
}

#[derive(Clone)]
struct Progress(tokio::sync::mpsc::UnboundedSender<f64>);

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.progress);
    }
}

/// Sends the progress token of every progress notification the handler
/// gets, as JSON.
#[derive(Clone)]
struct Tokens(tokio::sync::mpsc::UnboundedSender<Value>);

impl ClientHandler for Tokens {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self
            .0
            .send(serde_json::to_value(&params.progress_token).expect("json"));
    }
}

/// A client process. Prints one JSON line per step on stdout.
async fn child(role: &str) {
    let url = std::env::var("URL").expect("URL");
    let backend = std::env::var("BACKEND").expect("BACKEND");
    let dir = std::env::var("DIR").expect("DIR");
    let stores = open_store(&backend, &dir).await;
    let (transport, handle) = DurableClientBuilder::new(&url, &stores)
        .build()
        .await
        .expect("build");
    let say = |v: Value| println!("{v}");
    match role {
        "first" => {
            let (tx, mut progress) = tokio::sync::mpsc::unbounded_channel();
            let client = Progress(tx).serve(transport).await.expect("serve");
            client.list_tools(None).await.expect("list");
            let echo = client
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(json!({"n": 1}).as_object().cloned().expect("object")),
                )
                .await
                .expect("echo");
            assert_eq!(echo.is_error, Some(false));
            let mut slow = CallToolRequestParams::new("slow");
            slow.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
                NumberOrString::String("slow-work".into()),
            )));
            let peer = client.peer().clone();
            tokio::spawn(async move {
                let _ = peer.call_tool(slow).await;
            });
            // Killed mid-way: after the first progress, with the journal written.
            progress.recv().await.expect("first progress");
            handle.flush().await;
            say(json!({"ready": true, "session": handle.session_id()}));
            std::future::pending::<()>().await;
        }
        "second" => {
            let info = handle.initialize_result();
            let interrupted = handle.interrupted();
            say(json!({
                "resumed": handle.resumed(),
                "server_name": info.as_ref().map(|i| i.server_info.name.clone()),
                "server_version": info.as_ref().map(|i| i.server_info.version.clone()),
                "instructions": info.as_ref().and_then(|i| i.instructions.clone()),
                "tools_capability": info.as_ref().map(|i| i.capabilities.tools.is_some()),
                "interrupted": interrupted.iter().map(|r| json!({
                    "method": r.method, "params": r.params, "cursor": r.last_event_id,
                })).collect::<Vec<_>>(),
            }));
            let (tx, _progress) = tokio::sync::mpsc::unbounded_channel();
            let client = Progress(tx).serve(transport).await.expect("serve");
            let echo = client
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(json!({"n": 2}).as_object().cloned().expect("object")),
                )
                .await;
            say(json!({"first_request_ok": echo.is_ok(), "session": handle.session_id()}));
            for recovery in handle.recover() {
                match recovery {
                    Recovery::Resumable(resumed) => {
                        let (seen, answer) = resumed.collect().await.expect("recovered");
                        let progress = seen
                            .iter()
                            .filter_map(|m| match m {
                                RecoveredMessage::Progress(p) => Some(p.progress),
                                _ => None,
                            })
                            .collect::<Vec<_>>();
                        say(json!({"recovered": answer.expect("result"), "progress": progress}));
                    }
                    other => say(json!({"not_resumable": format!("{other:?}")})),
                }
            }
            // More calls after recovery, then a clean close: no DELETE.
            for n in 3..6 {
                client
                    .call_tool(
                        CallToolRequestParams::new("echo").with_arguments(
                            json!({ "n": n }).as_object().cloned().expect("object"),
                        ),
                    )
                    .await
                    .expect("echo");
            }
            handle.flush().await;
            say(json!({"interrupted_after": handle.interrupted().len(), "done": true}));
            client.cancel().await.expect("close");
        }
        "overlap" => {
            // Recovery runs beside new calls; this process's own slow call
            // is its third request, as the killed process's was, so rmcp
            // gives it the same progress token as that one.
            let (tx, mut progress) = tokio::sync::mpsc::unbounded_channel();
            let client = Tokens(tx).serve(transport).await.expect("serve");
            let recoveries = handle.recover();
            let recovering = tokio::spawn(async move {
                let mut tokens = Vec::new();
                let mut answered = false;
                for recovery in recoveries {
                    if let Recovery::Resumable(resumed) = recovery {
                        let (seen, answer) = resumed
                            .deliver_to_client()
                            .collect()
                            .await
                            .expect("recovered");
                        answered = answer.is_ok();
                        for message in seen {
                            if let RecoveredMessage::Progress(p) = message {
                                tokens.push(serde_json::to_value(&p.progress_token).expect("json"));
                            }
                        }
                    }
                }
                (tokens, answered)
            });
            client.list_tools(None).await.expect("list");
            client
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(json!({"n": 2}).as_object().cloned().expect("object")),
                )
                .await
                .expect("echo");
            client
                .call_tool(CallToolRequestParams::new("slow"))
                .await
                .expect("slow");
            let (recovered, answered) = recovering.await.expect("recovery task");
            // Notifications reach the handler concurrently: let them land.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut handler = Vec::new();
            while let Ok(token) = progress.try_recv() {
                handler.push(token);
            }
            say(json!({
                "handler_tokens": handler,
                "recovered_tokens": recovered,
                "recovered_answer": answered,
            }));
            client.cancel().await.expect("close");
        }
        "answer" => {
            // What an application following the README does: one call,
            // its answer, and a return from `main`: no flush, no close.
            say(json!({"interrupted": handle.interrupted().len()}));
            let client = ().serve(transport).await.expect("serve");
            let slow = client
                .call_tool(CallToolRequestParams::new("slow"))
                .await
                .expect("slow");
            say(json!({"answered": slow.is_error == Some(false)}));
        }
        "readme" => {
            drop((transport, handle));
            readme::example(&url, &stores)
                .await
                .expect("the README example");
            let (_, after) = DurableClientBuilder::new(&url, &stores)
                .build()
                .await
                .expect("build");
            say(json!({"readme_done": true, "interrupted_after": after.interrupted().len()}));
        }
        "listen" => {
            // Starts the announcements on the first run; a resumed run only
            // listens. Prints each message number; never exits by itself.
            let resumed = handle.resumed();
            let client = Listener(handle.clone())
                .serve(transport)
                .await
                .expect("serve");
            if !resumed {
                let args = json!({"count": 12, "interval_ms": 150});
                client
                    .call_tool(
                        CallToolRequestParams::new("announce")
                            .with_arguments(args.as_object().cloned().expect("object")),
                    )
                    .await
                    .expect("announce");
            }
            say(json!({"listening": true, "resumed": resumed}));
            // Keep the journal written as messages arrive.
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                handle.flush().await;
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

struct Child {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    fn spawn(role: &str, url: &str, backend: &str, dir: &str) -> Child {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("exe"))
            .env(CHILD_ENV, role)
            .env("URL", url)
            .env("BACKEND", backend)
            .env("DIR", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        Child {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("child answered in time")
            .expect("read child")
            .expect("child printed a line");
        serde_json::from_str(&line).expect("child prints JSON")
    }

    /// Reads lines until a JSON one, keeping the others.
    async fn until_json(&mut self, text: &mut Vec<String>) -> Value {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .expect("child answered in time")
                .expect("read child")
                .expect("child printed a line");
            match serde_json::from_str::<Value>(&line) {
                Ok(value) if value.is_object() => return value,
                _ => text.push(line),
            }
        }
    }

    /// Reads until a listening child says it is listening, keeping the
    /// message numbers it may print first (a replayed burst can reach the
    /// handler before the child prints that line).
    async fn until_listening(&mut self, seen: &mut Vec<u64>) -> Value {
        loop {
            let line = self.line().await;
            if line.get("listening").is_some() {
                return line;
            }
            seen.extend(line["message"].as_u64());
        }
    }
}

async fn user_story(backend: &str) {
    let server = client_support::start_server(8).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();

    // Process 1: initialize, call tools, start the slow one, die.
    let mut first = Child::spawn("first", &server.url, backend, &dir_s);
    let ready = first.line().await;
    assert_eq!(ready["ready"], true);
    let session = ready["session"].as_str().expect("session id").to_owned();
    first.child.start_kill().expect("SIGKILL");
    first.child.wait().await.expect("reaped");
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);

    // Process 2: same store.
    let mut second = Child::spawn("second", &server.url, backend, &dir_s);
    let offline = second.line().await;
    // 1. Stored server facts before any network call.
    assert_eq!(offline["resumed"], true, "{offline}");
    assert_eq!(offline["server_name"], "counting-server");
    assert_eq!(offline["server_version"], "7.1.0");
    assert_eq!(offline["instructions"], "Call slow for long work.");
    assert_eq!(offline["tools_capability"], true);
    let interrupted = offline["interrupted"].as_array().expect("list");
    assert_eq!(interrupted.len(), 1, "{offline}");
    assert_eq!(interrupted[0]["method"], "tools/call");
    assert_eq!(interrupted[0]["params"]["name"], "slow");
    assert!(interrupted[0]["cursor"].is_string(), "{offline}");

    // 2. No initialize; the first request rides the old session.
    let first_request = second.line().await;
    assert_eq!(first_request["first_request_ok"], true);
    assert_eq!(first_request["session"], session.as_str());
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);

    // 3. The slow tool's answer and the progress missed, the tool run once.
    let recovered = second.line().await;
    assert_eq!(
        recovered["recovered"]["content"][0]["text"], "slow done",
        "{recovered}"
    );
    let progress: Vec<f64> = recovered["progress"]
        .as_array()
        .expect("progress")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(!progress.is_empty(), "missed progress is replayed");
    assert_eq!(progress.last().copied(), Some(8.0), "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");

    let done = second.line().await;
    assert_eq!(done["done"], true);
    assert_eq!(done["interrupted_after"], 0);
    second.child.wait().await.expect("second exits");
    assert_eq!(server.stats.runs_of("slow"), 1, "the slow tool ran once");
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);

    // 4. One session, and no request id used twice in it.
    let requests = server.stats.requests.lock().expect("lock").clone();
    assert!(
        requests.iter().all(|(s, _, _)| *s == session),
        "{requests:?}"
    );
    let mut ids: Vec<&String> = requests.iter().map(|(_, id, _)| id).collect();
    let total = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), total, "a request id was reused: {requests:?}");
    assert_eq!(total, 7, "{requests:?}");
    // The session was kept: the server still knows it.
    assert!(
        server
            .sessions
            .sessions
            .read()
            .await
            .contains_key(session.as_str())
    );
}

/// The README's example, run by a process after a SIGKILL: it collects
/// the killed process's slow call beside a new call, the tool running once.
async fn readme_story() {
    let server = client_support::start_server(8).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();

    let mut first = Child::spawn("first", &server.url, "sqlite", &dir_s);
    let ready = first.line().await;
    assert_eq!(ready["ready"], true);
    first.child.start_kill().expect("SIGKILL");
    first.child.wait().await.expect("reaped");

    let mut second = Child::spawn("readme", &server.url, "sqlite", &dir_s);
    let mut printed = Vec::new();
    let done = second.until_json(&mut printed).await;
    second.child.wait().await.expect("second exits");
    assert_eq!(done["readme_done"], true);
    assert_eq!(done["interrupted_after"], 0, "{printed:?}");
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("recovered: Ok(") && l.contains("slow done")),
        "{printed:?}"
    );
    // The new call was answered before the old one's recovery ended.
    let new_call = printed.iter().position(|l| l.starts_with("new call:"));
    let recovered = printed.iter().position(|l| l.starts_with("recovered:"));
    assert!(new_call.is_some() && new_call < recovered, "{printed:?}");
    assert_eq!(server.stats.runs_of("slow"), 1, "the slow tool ran once");
    assert_eq!(server.stats.runs_of("echo"), 2);
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
}

/// A process that calls a tool slower than the journal's window (so the
/// call is journaled), gets its answer and returns from `main` without a
/// flush: the next process finds nothing interrupted, run after run.
async fn answered_story(backend: &str) {
    let server = client_support::start_server(1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();
    for run in 0..4 {
        let mut child = Child::spawn("answer", &server.url, backend, &dir_s);
        let start = child.line().await;
        assert_eq!(
            start["interrupted"], 0,
            "run {run}: a call answered in the run before is listed again"
        );
        assert_eq!(child.line().await["answered"], true);
        let status = child.child.wait().await.expect("exits");
        assert!(status.success(), "run {run}: {status}");
    }
    let mut last = Child::spawn("answer", &server.url, backend, &dir_s);
    assert_eq!(last.line().await["interrupted"], 0);
    last.child.start_kill().expect("kill");
    last.child.wait().await.expect("reaped");
    assert_eq!(server.stats.runs_of("slow"), 4, "each call ran once");
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
}

/// A process killed in the middle of a slow call with progress; the next
/// process resumes the session and calls the same tool while the old call
/// still runs on the server. The server sees two different progress
/// tokens in the one session, the new call's progress reaches the new
/// process's handler with the token rmcp knows, and the old call's
/// recovered progress carries the token its application gave it, both
/// from `collect` and, delivered, in the handler.
async fn overlap_story() {
    let server = client_support::start_server(8).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();

    let mut first = Child::spawn("first", &server.url, "sqlite", &dir_s);
    let ready = first.line().await;
    assert_eq!(ready["ready"], true);
    first.child.start_kill().expect("SIGKILL");
    first.child.wait().await.expect("reaped");

    let mut second = Child::spawn("overlap", &server.url, "sqlite", &dir_s);
    let report = second.line().await;
    second.child.wait().await.expect("second exits");

    let tokens = server.stats.progress_tokens.lock().expect("lock").clone();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert_eq!(tokens[0].0, tokens[1].0, "one session: {tokens:?}");
    assert_ne!(
        tokens[0].1, tokens[1].1,
        "two calls in flight in one session shared a progress token"
    );

    let (delivered, own): (Vec<&Value>, Vec<&Value>) = report["handler_tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .partition(|t| **t == json!("slow-work"));
    assert_eq!(own.len(), 8, "the new call's progress: {report}");
    assert!(own.iter().all(|t| *t == own[0]), "{report}");
    let recovered = report["recovered_tokens"].as_array().expect("tokens");
    assert!(!recovered.is_empty(), "{report}");
    assert!(
        recovered.iter().all(|t| *t == json!("slow-work")),
        "the old call's progress carries its application's token: {report}"
    );
    assert_eq!(
        delivered.len(),
        recovered.len(),
        "recovered progress reaches the handler too: {report}"
    );
    assert_eq!(report["recovered_answer"], true, "{report}");
    assert_eq!(server.stats.runs_of("slow"), 2);
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
}

/// The session's standalone GET stream outlives a SIGKILL: a client killed
/// while the server is announcing resumes that stream from its stored cursor
/// and receives every message, the ones sent while no process was listening
/// included, each once. When the server refuses the cursor (the events
/// expired), the client opens a fresh stream and goes on with what comes
/// next.
async fn standalone_story(fixture: Fixture) {
    let server = client_support::start_server_with(1, fixture).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();
    let mut seen: Vec<u64> = Vec::new();

    let mut first = Child::spawn("listen", &server.url, "sqlite", &dir_s);
    let started = first.until_listening(&mut seen).await;
    assert_eq!(started["resumed"], false, "{started}");
    while seen.len() < 3 {
        let line = first.line().await;
        seen.extend(line["message"].as_u64());
    }
    // Every message printed is in the journal already.
    first.child.start_kill().expect("SIGKILL");
    first.child.wait().await.expect("reaped");
    // Messages go on while nobody listens.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut second = Child::spawn("listen", &server.url, "sqlite", &dir_s);
    let started = second.until_listening(&mut seen).await;
    assert_eq!(started["resumed"], true, "{started}");
    while !seen.contains(&12) {
        let line = second.line().await;
        seen.extend(line["message"].as_u64());
    }
    second.child.start_kill().expect("SIGKILL");
    second.child.wait().await.expect("reaped");
    // rmcp hands notifications to the handler concurrently, so a replayed
    // burst may print out of order; the server sends them in order.
    seen.sort_unstable();
    if fixture == Fixture::RefusesResume {
        let mut unique = seen.clone();
        unique.dedup();
        assert_eq!(unique, seen, "an announcement arrived twice: {seen:?}");
        let gets: Vec<bool> = server
            .wire
            .lock()
            .expect("lock")
            .iter()
            .filter(|r| r.http_method == "GET")
            .map(|r| r.last_event_id_header)
            .collect();
        assert!(
            gets.windows(2).any(|w| w == [true, false]),
            "the refused resume was not followed by a fresh GET: {gets:?}"
        );
    } else {
        assert_eq!(
            seen,
            (1..=12).collect::<Vec<u64>>(),
            "every announcement exactly once"
        );
    }
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
}
