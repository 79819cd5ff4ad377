//! Two MCP server processes on one DynamoDB table (moto), and on one
//! Postgres database, as a fleet
//! behind a load balancer: a session restored by the other one, a stream
//! replayed by the other one, a task taken over after its instance is
//! killed with SIGKILL, and a bus notice delivered exactly once although
//! its publisher is killed right after publishing.

mod support;

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use support::{answer, events, fresh_table, modern_meta, moto_url, store_env, tool_text};
use tokio::io::{AsyncBufReadExt, BufReader};

/// One server process (`mcp-lambda-example --listen`).
struct Server {
    child: tokio::process::Child,
    url: String,
}

impl Server {
    async fn start(env: &[(String, String)]) -> anyhow::Result<Server> {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-lambda-example"))
            .args(["--listen", "127.0.0.1:0"])
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the server did not start within 30 s")??
            .context("the server exited")?;
        let address = line
            .strip_prefix("LISTENING ")
            .with_context(|| format!("unexpected first line {line:?}"))?;
        Ok(Server {
            url: format!("http://{address}/mcp"),
            child,
        })
    }

    async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }
}

async fn legacy(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: Value,
) -> anyhow::Result<reqwest::Response> {
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25");
    }
    Ok(request.body(body.to_string()).send().await?)
}

fn modern(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    request
}

async fn modern_call(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    mut params: Value,
) -> anyhow::Result<Value> {
    params["_meta"] = modern_meta();
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let text = modern(http, url, method, name.as_deref())
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    Ok(answer(&text))
}

/// An open SSE response, read message by message.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    /// The next JSON message, or `None` when nothing came within `wait`.
    async fn next(&mut self, wait: Duration) -> anyhow::Result<Option<Value>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Ok(Some(serde_json::from_str(&data)?));
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return Ok(None),
                Ok(chunk) => match chunk? {
                    Some(bytes) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                    None => bail!("the stream ended"),
                },
            }
        }
    }

    /// How many messages with `method` come within `wait`.
    async fn count(&mut self, method: &str, wait: Duration) -> anyhow::Result<usize> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut seen = 0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                Some(m) if m["method"] == method => seen += 1,
                Some(_) => {}
                None => return Ok(seen),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_table() -> anyhow::Result<()> {
    let Some(moto) = moto_url() else {
        return Ok(());
    };
    let table = fresh_table(&moto, "fleet").await;
    fleet(&store_env(&moto, &table)).await
}

/// The same fleet on one Postgres database (a Lambda function or a
/// container next to RDS): only the store URL differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_postgres_database() -> anyhow::Result<()> {
    let Some(base) = support::service_url("MCP_PERSIST_POSTGRES_URL", "Postgres") else {
        return Ok(());
    };
    let mut url = url::Url::parse(&base)?;
    let schema = format!(
        "fleet_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos()
    );
    url.query_pairs_mut().append_pair("schema", &schema);
    let env: Vec<(String, String)> = store_env("unused", "unused")
        .into_iter()
        .map(|(k, v)| {
            let v = if k == "MCP_STORE_URL" {
                url.to_string()
            } else {
                v
            };
            (k, v)
        })
        .collect();
    fleet(&env).await
}

/// Restore, replay, a task taken over after SIGKILL and a bus notice
/// delivered once, by two server processes started with `env`.
async fn fleet(env: &[(String, String)]) -> anyhow::Result<()> {
    let env = env.to_vec();
    let a = Server::start(&env).await?;
    let b = Server::start(&env).await?;
    let http = reqwest::Client::new();

    // Restore: initialize on A, served by B without a new initialize.
    let init = legacy(
        &http,
        &a.url,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "fleet-test", "version": "3"}}}),
    )
    .await?;
    let session = init
        .headers()
        .get("mcp-session-id")
        .context("session id")?
        .to_str()?
        .to_owned();
    init.text().await?;
    legacy(
        &http,
        &a.url,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    let stats = legacy(
        &http,
        &b.url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "stats", "arguments": {}}}),
    )
    .await?
    .text()
    .await?;
    let stats: Value = serde_json::from_str(&tool_text(&answer(&stats)))?;
    assert_eq!(stats["initialize"], 0, "{stats}");
    assert_eq!(stats["restored"], 1, "{stats}");

    // Replay: a tool call's stream on A, resumed on B.
    let call = legacy(
        &http,
        &a.url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "slow_progress", "arguments": {"count": 4, "delay_ms": 5},
                          "_meta": {"progressToken": "p"}}}),
    )
    .await?
    .text()
    .await?;
    let sent: Vec<(Option<String>, Value)> =
        events(&call).into_iter().map(|e| (e.id, e.data)).collect();
    assert_eq!(sent.len(), 5, "{call}");
    let from = sent[1].0.clone().context("event id")?;
    let replay = http
        .get(&b.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", &from)
        .send()
        .await?
        .text()
        .await?;
    let replayed: Vec<(Option<String>, Value)> = events(&replay)
        .into_iter()
        .map(|e| (e.id, e.data))
        .collect();
    assert_eq!(replayed, sent[2..].to_vec(), "{replay}");

    // The bus: a listen stream on B hears a notice published on A exactly
    // once, though A is killed with SIGKILL right after publishing.
    let body = json!({"jsonrpc": "2.0", "id": 4, "method": "subscriptions/listen",
        "params": {"_meta": modern_meta(), "notifications": {"toolsListChanged": true}}});
    let response = modern(&http, &b.url, "subscriptions/listen", None)
        .body(body.to_string())
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let mut listen = Stream {
        response,
        buffer: String::new(),
    };
    let ack = listen.next(Duration::from_secs(10)).await?.context("ack")?;
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    let published = modern_call(
        &http,
        &a.url,
        "tools/call",
        json!({"name": "touch_tools", "arguments": {}}),
    )
    .await?;
    assert_eq!(tool_text(&published), "published");

    // Tasks: created on A, A killed with SIGKILL, taken over and completed by B.
    let created = modern_call(
        &http,
        &a.url,
        "tools/call",
        json!({"name": "long_job", "arguments": {"steps": 10, "step_ms": 100}}),
    )
    .await?;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task = created["result"]["taskId"]
        .as_str()
        .context("task id")?
        .to_owned();
    a.kill().await;
    assert_eq!(
        listen
            .count("notifications/tools/list_changed", Duration::from_secs(2))
            .await?,
        1,
        "the notice reached the listener exactly once"
    );
    let started = std::time::Instant::now();
    let done = loop {
        let got = modern_call(&http, &b.url, "tasks/get", json!({"taskId": task})).await?;
        if got["result"]["status"] == "completed" {
            break got;
        }
        assert_eq!(got["result"]["status"], "working", "{got}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not completed: {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .context("result text")?;
    assert!(text.contains("(run 2"), "taken over once: {text}");
    // A new instance changes nothing for the listener: no second delivery.
    let a2 = Server::start(&env).await?;
    assert_eq!(
        listen
            .count(
                "notifications/tools/list_changed",
                Duration::from_millis(800)
            )
            .await?,
        0
    );
    a2.kill().await;
    b.kill().await;
    Ok(())
}
