//! Durable tasks across server processes: created on one instance, read,
//! answered and cancelled on another, and ended or taken over when the
//! instance running them is killed with SIGKILL. Requests are raw 2026-07-28
//! JSON-RPC over HTTP, as any client of the tasks extension sends them.

use std::time::{Duration, Instant};

use crate::support::Instance;
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// Two server processes on one store, and where the store lives.
struct Fleet {
    a: Instance,
    b: Instance,
    dir: tempfile::TempDir,
    /// Where the server processes note each task run.
    runs: std::path::PathBuf,
    /// The store arguments, to start more instances on it.
    args: Vec<String>,
}

impl Fleet {
    async fn start(backend: &[&str]) -> anyhow::Result<Fleet> {
        let dir = tempfile::tempdir()?;
        let runs = dir.path().join("runs.log");
        let mut args: Vec<String> = backend.iter().map(|s| s.to_string()).collect();
        if args.iter().any(|a| a == "{dir}") {
            let db = dir.path().join("state.db");
            for a in &mut args {
                if a == "{dir}" {
                    *a = db.display().to_string();
                }
            }
        }
        args.extend([
            "--liveness-grace-ms".to_owned(),
            "1000".to_owned(),
            "--runs-file".to_owned(),
            runs.display().to_string(),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(Fleet {
            a: Instance::process(&refs).await?,
            b: Instance::process(&refs).await?,
            dir,
            runs,
            args,
        })
    }

    async fn sqlite() -> anyhow::Result<Fleet> {
        Fleet::start(&["--backend", "sqlite", "--store", "{dir}"]).await
    }

    /// On the Redis server `cargo xtask test` starts; `None` outside CI when
    /// there is none (under CI that is a failure).
    async fn redis() -> anyhow::Result<Option<Fleet>> {
        let Ok(url) = std::env::var("MCP_PERSIST_REDIS_URL") else {
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            anyhow::ensure!(
                !ci,
                "MCP_PERSIST_REDIS_URL is not set: run the tests through `cargo xtask test`"
            );
            eprintln!(
                "skipped: MCP_PERSIST_REDIS_URL is not set (`cargo xtask test` starts Redis)"
            );
            return Ok(None);
        };
        let prefix = format!("tasks-test-{}-{}:", std::process::id(), rand_suffix());
        Ok(Some(
            Fleet::start(&[
                "--backend",
                "redis",
                "--store",
                &url,
                "--redis-prefix",
                &prefix,
            ])
            .await?,
        ))
    }

    fn runs(&self) -> Vec<String> {
        std::fs::read_to_string(&self.runs)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// A 2026-07-28 client of the tasks extension, speaking raw JSON-RPC.
struct Client {
    http: reqwest::Client,
    user: Option<String>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Client {
    fn new(user: Option<&str>) -> Client {
        Client {
            http: reqwest::Client::new(),
            user: user.map(str::to_owned),
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Sends `method` with `params` to `url`; the JSON-RPC response
    /// (`result` or `error` inside).
    async fn rpc(&self, url: &str, method: &str, mut params: Value) -> anyhow::Result<Value> {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": { "name": "tasks-test", "version": "1" },
            "io.modelcontextprotocol/clientCapabilities": {
                "elicitation": {},
                "extensions": { "io.modelcontextprotocol/tasks": {} }
            }
        });
        let name = params
            .get("name")
            .or_else(|| params.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        if let Some(name) = name {
            request = request.header("mcp-name", name);
        }
        if let Some(user) = &self.user {
            request = request.header("x-demo-user", user);
        }
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = request.body(body.to_string()).send().await?;
        let status = response.status();
        let text = response.text().await?;
        let message = if text.trim_start().starts_with('{') {
            text.clone()
        } else {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .find(|d| d.contains("\"id\""))
                .with_context(|| format!("no response in HTTP {status}: {text}"))?
                .to_owned()
        };
        Ok(serde_json::from_str(&message)?)
    }

    async fn call_task(&self, url: &str, tool: &str, args: Value) -> anyhow::Result<String> {
        let answer = self
            .rpc(
                url,
                "tools/call",
                json!({ "name": tool, "arguments": args }),
            )
            .await?;
        let result = &answer["result"];
        anyhow::ensure!(result["resultType"] == "task", "not a task: {answer}");
        Ok(result["taskId"].as_str().context("taskId")?.to_owned())
    }

    async fn get(&self, url: &str, task: &str) -> anyhow::Result<Value> {
        self.rpc(url, "tasks/get", json!({ "taskId": task })).await
    }

    /// Polls `tasks/get` on `url` until `done` holds for the result.
    async fn wait_for(
        &self,
        url: &str,
        task: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let start = Instant::now();
        loop {
            let answer = self.get(url, task).await?;
            if done(&answer["result"]) {
                return Ok(answer["result"].clone());
            }
            if start.elapsed() > within {
                bail!("task {task} not there within {within:?}: last answer {answer}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn status_is(s: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["status"] == s
}

fn terminal(r: &Value) -> bool {
    matches!(
        r["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// Created on A, read, answered and completed through B.
async fn input_through_the_other_instance(fleet: &Fleet) -> anyhow::Result<()> {
    let alice = Client::new(Some("alice"));
    let (a, b) = (fleet.a.url(), fleet.b.url());
    let task = alice.call_task(&a, "ask_name", json!({})).await?;
    // Visible on B at once: committed before CreateTaskResult.
    let first = alice.get(&b, &task).await?;
    assert!(first["result"]["taskId"] == task.as_str(), "{first}");
    let asking = alice
        .wait_for(
            &b,
            &task,
            Duration::from_secs(10),
            status_is("input_required"),
        )
        .await?;
    assert!(
        asking["inputRequests"]["name"]["method"] == "elicitation/create",
        "{asking}"
    );
    let ack = alice
        .rpc(
            &b,
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "name": { "action": "accept", "content": { "name": "Zed" } } } }),
        )
        .await?;
    assert_eq!(ack["result"], json!({ "resultType": "complete" }), "{ack}");
    let done = alice
        .wait_for(&a, &task, Duration::from_secs(10), terminal)
        .await?;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"], "Hello, Zed!",
        "{done}"
    );
    Ok(())
}

/// Cancelled through B, the operation on A stops and the task ends
/// `cancelled`; cancelling again is acknowledged and changes nothing.
async fn cancel_through_the_other_instance(fleet: &Fleet) -> anyhow::Result<()> {
    let alice = Client::new(Some("alice"));
    let (a, b) = (fleet.a.url(), fleet.b.url());
    let task = alice
        .call_task(&a, "long_job", json!({ "steps": 600, "step_ms": 100 }))
        .await?;
    let ack = alice
        .rpc(&b, "tasks/cancel", json!({ "taskId": task }))
        .await?;
    assert_eq!(ack["result"], json!({ "resultType": "complete" }), "{ack}");
    let done = alice
        .wait_for(&b, &task, Duration::from_secs(10), terminal)
        .await?;
    assert_eq!(done["status"], "cancelled", "{done}");
    let again = alice
        .rpc(&a, "tasks/cancel", json!({ "taskId": task }))
        .await?;
    assert_eq!(
        again["result"],
        json!({ "resultType": "complete" }),
        "{again}"
    );
    assert_eq!(alice.get(&a, &task).await?["result"]["status"], "cancelled");
    Ok(())
}

/// Another principal, or none, gets exactly what an unknown id gets, on
/// every task method and both instances; malformed and oversized ids get
/// the same -32602 and the server keeps serving.
async fn other_principals_see_nothing(fleet: &Fleet) -> anyhow::Result<()> {
    let alice = Client::new(Some("alice"));
    let task = alice
        .call_task(
            &fleet.a.url(),
            "long_job",
            json!({ "steps": 50, "step_ms": 100 }),
        )
        .await?;
    let unknown = "0123456789abcdef0123456789abcdef";
    let normalise = |answer: &Value, id: &str| -> Value {
        let mut error = answer["error"].clone();
        if let Some(m) = error["message"].as_str() {
            error["message"] = Value::String(m.replace(id, "<id>"));
        }
        error
    };
    for url in [fleet.a.url(), fleet.b.url()] {
        for (method, extra) in [
            ("tasks/get", json!({})),
            ("tasks/cancel", json!({})),
            (
                "tasks/update",
                json!({ "inputResponses": { "name": { "action": "accept", "content": {} } } }),
            ),
        ] {
            let with = |id: &str| {
                let mut p = extra.clone();
                p["taskId"] = Value::String(id.to_owned());
                p
            };
            let baseline = normalise(&alice.rpc(&url, method, with(unknown)).await?, unknown);
            assert_eq!(baseline["code"], -32602, "{method}: {baseline}");
            for intruder in [Client::new(Some("mallory")), Client::new(None)] {
                let answer = intruder.rpc(&url, method, with(&task)).await?;
                assert_eq!(
                    normalise(&answer, &task),
                    baseline,
                    "{method} by {:?}",
                    intruder.user
                );
            }
        }
        // Malformed and oversized ids: the same error, and nothing breaks.
        for bad in ["x".repeat(10_000), "has space".to_owned(), String::new()] {
            let answer = alice.get(&url, &bad).await?;
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
        }
    }
    // The owner still sees it, and it was not cancelled by anyone else.
    let seen = alice.get(&fleet.b.url(), &task).await?;
    assert_eq!(seen["result"]["status"], "working", "{seen}");
    // An input response that is not an object: -32602, the task unharmed.
    let bad = alice
        .rpc(
            &fleet.b.url(),
            "tasks/update",
            json!({ "taskId": task, "inputResponses": { "name": 42 } }),
        )
        .await?;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // An oversized one (20 MiB): refused, by the HTTP layer or with a
    // JSON-RPC error, and the task and the server are unharmed.
    let huge = "y".repeat(20 * 1024 * 1024);
    let task2 = alice
        .call_task(&fleet.a.url(), "ask_name", json!({}))
        .await?;
    alice
        .wait_for(
            &fleet.a.url(),
            &task2,
            Duration::from_secs(10),
            status_is("input_required"),
        )
        .await?;
    let answer = alice
        .rpc(
            &fleet.b.url(),
            "tasks/update",
            json!({ "taskId": task2, "inputResponses": { "name": { "action": "accept", "content": { "name": huge } } } }),
        )
        .await;
    if let Ok(answer) = answer {
        assert!(
            answer["error"]["code"].is_i64(),
            "an oversized input response was accepted"
        );
    }
    let still = alice.get(&fleet.a.url(), &task2).await?;
    assert_eq!(still["result"]["status"], "input_required", "{still}");
    Ok(())
}

/// A (running a resumable and a non-resumable task) is killed: B ends the
/// fragile one `failed` with a message saying why, and runs the resumable
/// one again to `completed`, exactly once.
async fn owner_killed(mut fleet: Fleet) -> anyhow::Result<()> {
    let alice = Client::new(Some("alice"));
    let (a, b) = (fleet.a.url(), fleet.b.url());
    let resumable = alice
        .call_task(
            &a,
            "long_job",
            json!({ "steps": 20, "step_ms": 100, "tag": "r" }),
        )
        .await?;
    let fragile = alice
        .call_task(&a, "fragile_job", json!({ "steps": 600, "step_ms": 100 }))
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet.a.kill().await?;
    let killed = Instant::now();
    let failed = alice
        .wait_for(&b, &fragile, Duration::from_secs(15), terminal)
        .await?;
    let noticed = killed.elapsed();
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("stopped") && message.contains("re-issue"),
        "{message}"
    );
    eprintln!("orphaned task reported failed {noticed:?} after the kill");
    let done = alice
        .wait_for(&b, &resumable, Duration::from_secs(20), terminal)
        .await?;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("(run 2)"), "{text}");
    // Exactly once: one finished run, by generation 2, and a started run 1.
    let runs = fleet.runs();
    let of = |what: &str| {
        runs.iter()
            .filter(|l| l.starts_with(what) && l.contains(&resumable))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(of("done"), vec![format!("done {resumable} 2")], "{runs:?}");
    assert_eq!(
        of("start"),
        vec![
            format!("start {resumable} 1"),
            format!("start {resumable} 2")
        ],
        "{runs:?}"
    );
    // A restarted A (a new instance on the same store) sees the outcome too.
    let refs: Vec<&str> = fleet.args.iter().map(String::as_str).collect();
    let a2 = Instance::process(&refs).await?;
    assert_eq!(
        alice.get(&a2.url(), &resumable).await?["result"]["status"],
        "completed"
    );
    let _ = &fleet.dir;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tasks_across_processes() -> anyhow::Result<()> {
    let fleet = Fleet::sqlite().await?;
    input_through_the_other_instance(&fleet).await?;
    cancel_through_the_other_instance(&fleet).await?;
    other_principals_see_nothing(&fleet).await?;
    owner_killed(fleet).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tasks_across_processes() -> anyhow::Result<()> {
    let Some(fleet) = Fleet::redis().await? else {
        return Ok(());
    };
    input_through_the_other_instance(&fleet).await?;
    cancel_through_the_other_instance(&fleet).await?;
    other_principals_see_nothing(&fleet).await?;
    owner_killed(fleet).await
}

/// A task record written by a newer version of the server: a typed error
/// naming the cause, and the record is not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_task_is_refused_and_kept() -> anyhow::Result<()> {
    use mcp_persist_core::{KvStore, PutMode, PutOptions};
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    let store = mcp_persist_store_sqlite::SqliteStore::open(&db).await?;
    let bytes = br#"{"kind":"task","schema":7,"record":{"future":true}}"#.to_vec();
    store
        .put(
            &mcp_persist_core::declare::TASK.key(&["from-the-future"]),
            bytes.clone(),
            PutOptions::new(PutMode::Create),
        )
        .await?;
    let db_arg = db.display().to_string();
    let a = Instance::process(&["--backend", "sqlite", "--store", &db_arg]).await?;
    let alice = Client::new(Some("alice"));
    for method in ["tasks/get", "tasks/cancel"] {
        let answer = alice
            .rpc(&a.url(), method, json!({ "taskId": "from-the-future" }))
            .await?;
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("newer version"), "{method}: {answer}");
    }
    assert_eq!(
        store
            .get(&mcp_persist_core::declare::TASK.key(&["from-the-future"]))
            .await?
            .context("kept")?
            .value,
        bytes
    );
    Ok(())
}
