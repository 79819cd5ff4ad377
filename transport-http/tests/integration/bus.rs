//! The fleet notification bus across server processes: a change announced on
//! one instance reaches `subscriptions/listen` streams held on another
//! (2026-07-28) only when their filter asks for it, and legacy sessions'
//! standalone streams there (2025-11-25) when they subscribed; exactly once,
//! even when the publishing instance is killed with SIGKILL right after.

use std::time::Duration;

use crate::support::{Instance, raw_initialize, raw_post};
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

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

/// Opens a `subscriptions/listen` stream; returns it with the server's
/// acknowledgement.
async fn listen(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    filter: Value,
) -> anyhow::Result<(Stream, Value)> {
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
    Ok((stream, ack))
}

/// Calls one of the demo server's bus tools (2026-07-28, no session);
/// returns the response body.
async fn announce(
    http: &reqwest::Client,
    url: &str,
    tool: &str,
    arguments: Value,
) -> anyhow::Result<String> {
    let body = json!({
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": { "name": tool, "arguments": arguments, "_meta": modern_meta() }
    });
    Ok(modern(http, url, "tools/call", Some(tool))
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?)
}

async fn touch(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let text = announce(http, url, "touch_tools", json!({})).await?;
    anyhow::ensure!(text.contains("published"), "touch_tools: {text}");
    Ok(())
}

/// Every message `stream` delivers within `wait`.
async fn drain(stream: &mut Stream, wait: Duration) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match stream.next(left).await? {
            Some(m) => out.push(m),
            None => return Ok(out),
        }
    }
}

/// The `notifications/resources/updated` messages among `messages`.
fn updates(messages: &[Value]) -> Vec<&Value> {
    messages
        .iter()
        .filter(|m| m["method"] == "notifications/resources/updated")
        .collect()
}

/// A legacy session of `user` on `url` with its standalone stream open.
async fn legacy_stream(
    http: &reqwest::Client,
    url: &str,
    user: &str,
) -> anyhow::Result<(String, Stream)> {
    let session = raw_initialize(http, url, user).await?;
    let response = http
        .get(url)
        .header("x-demo-user", user)
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
    Ok((
        session,
        Stream {
            response,
            buffer: String::new(),
        },
    ))
}

/// A list change announced on B reaches listeners on A whose filter asks
/// for it, and a legacy session's standalone stream on A.
async fn list_change_across(a: &Instance, b: &Instance) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    // Modern listeners on A: one for tool changes, one for prompts only.
    let (mut tools, _) = listen(&http, &a.url(), 41, json!({ "toolsListChanged": true })).await?;
    let (mut prompts, _) =
        listen(&http, &a.url(), 42, json!({ "promptsListChanged": true })).await?;
    let (_, mut legacy) = legacy_stream(&http, &a.url(), "alice").await?;
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

/// A resource update published on A, which is then killed with SIGKILL,
/// reaches exactly once a listener on B whose filter names the resource and
/// a legacy session on B subscribed to it; a listener that filtered the
/// resource out, and a legacy session subscribed to another one, hear
/// nothing. Filter kinds this server does not know are left out of the
/// acknowledgement, and the stream works.
async fn resource_update_survives_its_publisher(
    mut a: Instance,
    b: &Instance,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let wanted = "demo://reports/today";
    let other = "demo://reports/yesterday";
    let (mut listener, ack) = listen(
        &http,
        &b.url(),
        51,
        json!({ "resourceSubscriptions": [wanted], "noSuchNotificationKind": true }),
    )
    .await?;
    let accepted = &ack["params"]["notifications"];
    assert_eq!(
        accepted["resourceSubscriptions"],
        json!([wanted]),
        "acknowledgement: {ack}"
    );
    assert!(
        accepted.get("noSuchNotificationKind").is_none(),
        "an unknown kind was acknowledged: {ack}"
    );
    let (mut filtered_out, _) = listen(
        &http,
        &b.url(),
        52,
        json!({ "resourceSubscriptions": [other] }),
    )
    .await?;
    let (session, mut subscribed) = legacy_stream(&http, &b.url(), "bob").await?;
    let (status, body) = raw_post(
        &http,
        &b.url(),
        "bob",
        &session,
        json!({ "jsonrpc": "2.0", "id": 7, "method": "resources/subscribe",
                "params": { "uri": wanted } }),
    )
    .await?;
    anyhow::ensure!(
        status == 200 && body.contains("\"result\""),
        "subscribe: {status} {body}"
    );
    let (carol, mut unsubscribed) = legacy_stream(&http, &b.url(), "carol").await?;
    let (status, body) = raw_post(
        &http,
        &b.url(),
        "carol",
        &carol,
        json!({ "jsonrpc": "2.0", "id": 7, "method": "resources/subscribe",
                "params": { "uri": other } }),
    )
    .await?;
    anyhow::ensure!(
        status == 200 && body.contains("\"result\""),
        "subscribe: {status} {body}"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = announce(&http, &a.url(), "touch_resource", json!({ "uri": wanted })).await?;
    anyhow::ensure!(text.contains("published"), "touch_resource: {text}");
    // The publisher dies at once: what it published is in the shared store.
    a.kill().await?;

    let heard = drain(&mut listener, Duration::from_secs(3)).await?;
    let heard = updates(&heard);
    assert_eq!(heard.len(), 1, "the listener heard {heard:?}");
    assert_eq!(heard[0]["params"]["uri"], wanted, "{:?}", heard[0]);
    assert_eq!(
        heard[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 51,
        "{:?}",
        heard[0]
    );
    let got = drain(&mut subscribed, Duration::from_secs(1)).await?;
    let got = updates(&got);
    assert_eq!(got.len(), 1, "the subscribed session got {got:?}");
    assert_eq!(got[0]["params"]["uri"], wanted, "{:?}", got[0]);
    let nothing = drain(&mut filtered_out, Duration::from_millis(300)).await?;
    assert!(
        updates(&nothing).is_empty(),
        "a filtered-out listener got {nothing:?}"
    );
    let nothing = drain(&mut unsubscribed, Duration::from_millis(300)).await?;
    assert!(
        updates(&nothing).is_empty(),
        "an unsubscribed session got {nothing:?}"
    );

    // An oversized notice is refused with a clear error; the bus carries on.
    let huge = format!("demo://{}", "x".repeat(mcp_persist_core::MAX_NOTICE_BYTES));
    let text = announce(&http, &b.url(), "touch_resource", json!({ "uri": huge })).await?;
    assert!(
        text.contains("over the limit") && !text.contains("published"),
        "an oversized notice: {}",
        &text[..text.len().min(300)]
    );
    let text = announce(&http, &b.url(), "touch_resource", json!({ "uri": wanted })).await?;
    anyhow::ensure!(text.contains("published"), "touch_resource: {text}");
    let heard = drain(&mut listener, Duration::from_secs(2)).await?;
    assert_eq!(updates(&heard).len(), 1, "after the refusal: {heard:?}");
    Ok(())
}

async fn across(a: Instance, b: Instance) -> anyhow::Result<()> {
    list_change_across(&a, &b).await?;
    resource_update_survives_its_publisher(a, &b).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bus_across_processes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = ["--backend", "sqlite", "--store", db.as_str()];
    let a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    across(a, b).await
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
    across(a, b).await
}
