//! The fleet notification bus across server processes: a change announced on
//! instance B reaches a `subscriptions/listen` stream held on instance A
//! (2026-07-28), only when its filter asks for it, and a legacy session's
//! standalone stream on A (2025-11-25).

mod support;

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use support::{Instance, raw_initialize, run_demo_server_if_asked};

#[test]
fn demo_server_process() {
    run_demo_server_if_asked();
}

fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "bus-test", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {}
    })
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
        .header("mcp-method", method)
        .header("x-demo-user", "alice");
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    request
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

    /// Reads until a message with `method` comes; fails after `wait`.
    async fn until(&mut self, method: &str, wait: Duration) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                Some(m) if m["method"] == method => return Ok(m),
                Some(_) => {}
                None => bail!("no {method} within {wait:?}"),
            }
        }
    }
}

async fn listen(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    filter: Value,
) -> anyhow::Result<Stream> {
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
        "params": { "_meta": modern_meta(), "notifications": filter }
    });
    let response = modern(http, url, "subscriptions/listen", None)
        .body(body.to_string())
        .send()
        .await?;
    if response.status() != 200 {
        bail!(
            "listen answered {}: {}",
            response.status(),
            response.text().await?
        );
    }
    let mut stream = Stream {
        response,
        buffer: String::new(),
    };
    let ack = stream
        .next(Duration::from_secs(10))
        .await?
        .context("no acknowledgement")?;
    anyhow::ensure!(
        ack["method"] == "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    Ok(stream)
}

async fn touch(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let body = json!({
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": { "name": "touch_tools", "arguments": {}, "_meta": modern_meta() }
    });
    let text = modern(http, url, "tools/call", Some("touch_tools"))
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    anyhow::ensure!(text.contains("published"), "touch_tools: {text}");
    Ok(())
}

async fn across(a: &Instance, b: &Instance) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    // Modern listeners on A: one for tool changes, one for prompts only.
    let mut tools = listen(&http, &a.url(), 41, json!({ "toolsListChanged": true })).await?;
    let mut prompts = listen(&http, &a.url(), 42, json!({ "promptsListChanged": true })).await?;
    // A legacy session on A, with its standalone stream open.
    let session = raw_initialize(&http, &a.url(), "alice").await?;
    let response = http
        .get(a.url())
        .header("x-demo-user", "alice")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "text/event-stream")
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "GET answered {}",
        response.status()
    );
    let mut legacy = Stream {
        response,
        buffer: String::new(),
    };
    // Give A's tail a moment to be waiting, then announce on B.
    tokio::time::sleep(Duration::from_millis(200)).await;
    touch(&http, &b.url()).await?;
    let heard = tools
        .until("notifications/tools/list_changed", Duration::from_secs(10))
        .await?;
    assert_eq!(
        heard["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 41,
        "{heard}"
    );
    legacy
        .until("notifications/tools/list_changed", Duration::from_secs(10))
        .await?;
    // The prompts-only listener heard nothing of it.
    if let Some(m) = prompts.next(Duration::from_millis(500)).await? {
        panic!("a prompts-only listener got {m}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bus_across_processes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = ["--backend", "sqlite", "--store", db.as_str()];
    let a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    across(&a, &b).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bus_across_processes() -> anyhow::Result<()> {
    let Ok(url) = std::env::var("MCP_PERSIST_REDIS_URL") else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        anyhow::ensure!(
            !ci,
            "MCP_PERSIST_REDIS_URL is not set: run the tests through `cargo xtask test`"
        );
        eprintln!("skipped: MCP_PERSIST_REDIS_URL is not set (`cargo xtask test` starts Redis)");
        return Ok(());
    };
    let prefix = format!("bus-test-{}:", std::process::id());
    let args = [
        "--backend",
        "redis",
        "--store",
        url.as_str(),
        "--redis-prefix",
        prefix.as_str(),
    ];
    let a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    across(&a, &b).await
}
