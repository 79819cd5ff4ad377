//! Exactly-once tool calls: a `tools/call` carrying an idempotency key in
//! `_meta` runs its tool at most once per (principal, key), on any instance,
//! and every attempt gets the first one's answer; across a broken
//! connection, another instance, a SIGKILLed instance, another principal and
//! both protocol eras.
//!
//! The tools are the example server's `charge` (never run twice for a key)
//! and `refresh` (declared safe to re-run): each notes `<tool> <tag>` in the
//! runs file, so the file counts how often a tool really ran.

use crate::support;

use std::{path::Path, time::Duration};

use crate::support::{Instance, raw_initialize, response_of};
use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, Stores};
use mcp_persist_transport_http::server::calls::{EXACTLY_ONCE, IDEMPOTENCY_KEY, OUTCOME_UNKNOWN};
use serde_json::{Value, json};

/// How often `<tool> <tag>` ran, by the runs file.
fn runs(file: &Path, tool: &str, tag: &str) -> usize {
    let line = format!("{tool} {tag}");
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

/// A 2026-07-28 `tools/call` of `tool` as `user`, with `key` (if any) in
/// `_meta`; the whole JSON-RPC response.
async fn call(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    tool: &str,
    args: Value,
    key: Option<&str>,
) -> anyhow::Result<Value> {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "keyed", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if let Some(key) = key {
        meta[IDEMPOTENCY_KEY] = json!(key);
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": tool, "arguments": args, "_meta": meta}});
    let text = http
        .post(url)
        .header("x-demo-user", user)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    response_of(&text)
}

fn text_of(response: &Value) -> anyhow::Result<String> {
    response["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no text result in {response}"))
}

fn code_of(response: &Value) -> Option<i64> {
    response["error"]["code"].as_i64()
}

/// Waits until `<tool> <tag>` has started `n` times.
async fn started(file: &Path, tool: &str, tag: &str, n: usize) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while runs(file, tool, tag) < n {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{tool} {tag} did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_call_runs_once_on_any_instance_and_every_attempt_gets_its_answer()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("runs");
    let args = ["--runs-file", file.to_str().context("utf-8")?];
    let stores = Stores::new(MemoryStore::new());
    let a = Instance::in_process(stores.clone(), &args).await?;
    let b = Instance::in_process(stores.clone(), &args).await?;
    let http = reqwest::Client::new();

    // The first attempt runs the tool; a second, on the other instance,
    // gets the same answer without running it.
    let first = call(
        &http,
        &a.url(),
        "alice",
        "charge",
        json!({"tag": "k1"}),
        Some("k1"),
    )
    .await?;
    let answer = text_of(&first)?;
    let again = call(
        &http,
        &b.url(),
        "alice",
        "charge",
        json!({"tag": "k1"}),
        Some("k1"),
    )
    .await?;
    assert_eq!(text_of(&again)?, answer);
    assert_eq!(runs(&file, "charge", "k1"), 1);

    // The same key for another call is refused, and runs nothing.
    let other = call(
        &http,
        &b.url(),
        "alice",
        "charge",
        json!({"tag": "k1", "delay_ms": 1}),
        Some("k1"),
    )
    .await?;
    assert_eq!(code_of(&other), Some(-32602), "{other}");
    assert_eq!(runs(&file, "charge", "k1"), 1);

    // Another principal's key of the same text is a call of its own; the
    // first principal's answer is untouched.
    let bob = call(
        &http,
        &b.url(),
        "bob",
        "charge",
        json!({"tag": "k1"}),
        Some("k1"),
    )
    .await?;
    assert_ne!(text_of(&bob)?, answer);
    assert_eq!(runs(&file, "charge", "k1"), 2);
    let alice = call(
        &http,
        &a.url(),
        "alice",
        "charge",
        json!({"tag": "k1"}),
        Some("k1"),
    )
    .await?;
    assert_eq!(text_of(&alice)?, answer);
    assert_eq!(runs(&file, "charge", "k1"), 2);

    // Without a key, every call runs.
    for _ in 0..2 {
        call(
            &http,
            &a.url(),
            "alice",
            "charge",
            json!({"tag": "nokey"}),
            None,
        )
        .await?;
    }
    assert_eq!(runs(&file, "charge", "nokey"), 2);

    // A malformed key is refused before anything runs.
    let bad = call(
        &http,
        &a.url(),
        "alice",
        "charge",
        json!({"tag": "bad"}),
        Some("a b"),
    )
    .await?;
    assert_eq!(code_of(&bad), Some(-32602), "{bad}");
    assert_eq!(runs(&file, "charge", "bad"), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_waits_for_the_same_call_running_elsewhere_and_a_dropped_one_still_finishes()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("runs");
    let args = ["--runs-file", file.to_str().context("utf-8")?];
    let stores = Stores::new(MemoryStore::new());
    let a = Instance::in_process(stores.clone(), &args).await?;
    let b = Instance::in_process(stores.clone(), &args).await?;
    let http = reqwest::Client::new();

    // Two attempts at once on two instances: one run, one answer.
    let slow = json!({"tag": "k2", "delay_ms": 800});
    let (a_url, b_url) = (a.url(), b.url());
    let (x, y) = tokio::join!(
        call(&http, &a_url, "alice", "charge", slow.clone(), Some("k2")),
        async {
            started(&file, "charge", "k2", 1).await?;
            call(&http, &b_url, "alice", "charge", slow.clone(), Some("k2")).await
        }
    );
    assert_eq!(text_of(&x?)?, text_of(&y?)?);
    assert_eq!(runs(&file, "charge", "k2"), 1);

    // A client that goes away mid-call (a broken stream, a killed client):
    // the call runs to its end, and the attempt after it gets the answer
    // without a second run.
    let slow = json!({"tag": "k3", "delay_ms": 600});
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        call(&http, &a.url(), "alice", "charge", slow.clone(), Some("k3")),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the first attempt was meant to be cut off"
    );
    started(&file, "charge", "k3", 1).await?;
    let after = call(&http, &b.url(), "alice", "charge", slow, Some("k3")).await?;
    assert!(text_of(&after)?.starts_with("charge k3: run "), "{after}");
    assert_eq!(runs(&file, "charge", "k3"), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_advertises_it_and_a_legacy_session_gets_it_too() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("runs");
    let args = ["--runs-file", file.to_str().context("utf-8")?];
    let stores = Stores::new(MemoryStore::new());
    let a = Instance::in_process(stores.clone(), &args).await?;
    let b = Instance::in_process(stores.clone(), &args).await?;
    let http = reqwest::Client::new();

    // In `initialize` (2025-11-25) and in `server/discover` (2026-07-28).
    let init = http
        .post(a.url())
        .header("x-demo-user", "alice")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "c", "version": "1"}}})
            .to_string(),
        )
        .send()
        .await?
        .text()
        .await?;
    let init = response_of(&init)?;
    assert!(
        init["result"]["capabilities"]["extensions"][EXACTLY_ONCE].is_object(),
        "{init}"
    );
    let discover = http
        .post(a.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "server/discover")
        .body(
            json!({"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": { "name": "c", "version": "1" },
                "io.modelcontextprotocol/clientCapabilities": {}}}})
            .to_string(),
        )
        .send()
        .await?
        .text()
        .await?;
    let discover = response_of(&discover)?;
    assert!(
        discover["result"]["capabilities"]["extensions"][EXACTLY_ONCE].is_object(),
        "{discover}"
    );

    // A legacy call, then the same key from a new session on the other
    // instance (as after the first session was lost): one run, one answer.
    let keyed = |session_id: u64| {
        json!({"jsonrpc": "2.0", "id": session_id, "method": "tools/call",
               "params": {"name": "charge", "arguments": {"tag": "k4"},
                          "_meta": {IDEMPOTENCY_KEY: "k4"}}})
    };
    let first = raw_initialize(&http, &a.url(), "alice").await?;
    let (status, body) = support::raw_post(&http, &a.url(), "alice", &first, keyed(5)).await?;
    assert_eq!(status, 200, "{body}");
    let answer = text_of(&response_of(&body)?)?;
    let second = raw_initialize(&http, &b.url(), "alice").await?;
    let (_, body) = support::raw_post(&http, &b.url(), "alice", &second, keyed(6)).await?;
    let again = response_of(&body)?;
    assert_eq!(text_of(&again)?, answer);
    assert_eq!(again["id"], 6, "the answer carries the new request's id");
    assert_eq!(runs(&file, "charge", "k4"), 1);
    Ok(())
}

/// Three server processes on one SQLite file. A `charge` whose instance is
/// SIGKILLed mid-run is answered "outcome unknown" on the others, for good,
/// and never runs again; a `refresh` (declared safe to re-run) runs once
/// more on the instance the attempt reaches, and that answer is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_instances_call_is_unknown_or_run_again_if_declared_safe() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("runs");
    let db = dir.path().join("state.db");
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.to_str().context("utf-8")?,
        "--liveness-grace-ms",
        "600",
        "--runs-file",
        file.to_str().context("utf-8")?,
    ];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let mut c = Instance::process(&args).await?;
    let http = reqwest::Client::new();

    let slow = json!({"tag": "k5", "delay_ms": 20_000});
    let doomed = {
        let (http, url, slow) = (http.clone(), a.url(), slow.clone());
        tokio::spawn(async move { call(&http, &url, "alice", "charge", slow, Some("k5")).await })
    };
    started(&file, "charge", "k5", 1).await?;
    a.kill().await?;
    assert!(doomed.await?.is_err(), "the killed instance answered");
    for _ in 0..2 {
        let answer = call(&http, &b.url(), "alice", "charge", slow.clone(), Some("k5")).await?;
        assert_eq!(
            code_of(&answer),
            Some(i64::from(OUTCOME_UNKNOWN.0)),
            "{answer}"
        );
        assert_eq!(answer["error"]["data"]["idempotencyKey"], "k5", "{answer}");
    }
    assert_eq!(runs(&file, "charge", "k5"), 1);

    let slow = json!({"tag": "k6", "delay_ms": 3_000});
    let doomed = {
        let (http, url, slow) = (http.clone(), c.url(), slow.clone());
        tokio::spawn(async move { call(&http, &url, "alice", "refresh", slow, Some("k6")).await })
    };
    started(&file, "refresh", "k6", 1).await?;
    c.kill().await?;
    assert!(doomed.await?.is_err(), "the killed instance answered");
    let rerun = call(
        &http,
        &b.url(),
        "alice",
        "refresh",
        slow.clone(),
        Some("k6"),
    )
    .await?;
    let answer = text_of(&rerun)?;
    assert_eq!(runs(&file, "refresh", "k6"), 2);
    let again = call(&http, &b.url(), "alice", "refresh", slow, Some("k6")).await?;
    assert_eq!(text_of(&again)?, answer);
    assert_eq!(runs(&file, "refresh", "k6"), 2);
    Ok(())
}

/// A server configuration offering tools.
fn with_tools() -> rmcp::model::ServerConfig {
    rmcp::model::ServerConfig::new(
        rmcp::model::ServerCapabilities::builder()
            .enable_tools()
            .build(),
    )
}

/// A handler whose `boom` tool counts its runs, then panics.
#[derive(Clone, Default)]
struct Panics(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ServerHandler for Panics {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        with_tools()
    }
    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        panic!("the tool failed in a way it did not expect");
    }
}

/// A durable server serving [`Panics`] with `config`, on a free port.
async fn panicking_server(
    config: mcp_persist_transport_http::server::ExactlyOnce,
) -> anyhow::Result<(String, Panics)> {
    let handler = Panics::default();
    let server =
        mcp_persist_transport_http::server::DurableServer::builder(Stores::new(MemoryStore::new()))
            .exactly_once(config)
            // The principal is the `x-demo-user` header, as in the example
            // server.
            .principal_from(|parts| {
                parts
                    .headers
                    .get("x-demo-user")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            })
            .build()?;
    let served = handler.clone();
    let router =
        axum::Router::new().nest_service("/mcp", server.service(move || Ok(served.clone())));
    Ok((serve(router).await?, handler))
}

/// A keyed call whose tool panics is settled at once: the attempt that ran
/// it hears that it panicked; the next attempt hears "outcome unknown" right
/// away (it used to wait the whole wait limit and hear "still running", for
/// as long as the instance lived), or runs it again when it is declared
/// safe to re-run. Never a second run otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_whose_tool_panics_is_settled_at_once() -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let config =
        mcp_persist_transport_http::server::ExactlyOnce::new().wait_limit(Duration::from_secs(3));

    let (url, tool) = panicking_server(config.clone()).await?;
    let first = call(&http, &url, "alice", "boom", json!({}), Some("p1")).await?;
    assert_eq!(code_of(&first), Some(-32603), "{first}");
    assert_eq!(first["error"]["data"]["idempotencyKey"], "p1", "{first}");
    // Left running, each attempt would wait the (short) wait limit and
    // hear "still running".
    for _attempt in 0..2 {
        let again = call(&http, &url, "alice", "boom", json!({}), Some("p1")).await?;
        assert_eq!(
            code_of(&again),
            Some(i64::from(OUTCOME_UNKNOWN.0)),
            "{again}"
        );
    }
    assert_eq!(tool.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Another principal's attempt under the same key is a call of its
    // own: it runs, and learns nothing of alice's.
    let bob = call(&http, &url, "bob", "boom", json!({}), Some("p1")).await?;
    assert_eq!(code_of(&bob), Some(-32603), "{bob}");
    assert_eq!(tool.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Another key is another call: it runs.
    let other = call(&http, &url, "alice", "boom", json!({}), Some("p2")).await?;
    assert_eq!(code_of(&other), Some(-32603), "{other}");
    assert_eq!(tool.0.load(std::sync::atomic::Ordering::SeqCst), 3);

    let (url, tool) = panicking_server(config.rerunnable(["boom"])).await?;
    for run in 1..=2 {
        let answer = call(&http, &url, "alice", "boom", json!({}), Some("p1")).await?;
        assert_eq!(code_of(&answer), Some(-32603), "{answer}");
        assert_eq!(tool.0.load(std::sync::atomic::Ordering::SeqCst), run);
    }
    Ok(())
}

/// A handler that answers every tool with "ok", unwrapped.
#[derive(Clone)]
struct Plain;

impl rmcp::ServerHandler for Plain {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        with_tools()
    }

    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        if request.name == "slow" {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        Ok(
            rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text("ok")])
                .into(),
        )
    }
}

/// Serves `router` on a free loopback port; its `/mcp` URL.
async fn serve(router: axum::Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(format!("http://{addr}/mcp"))
}

/// A keyed call's record is written as its stream opens only when the
/// server's own `service` wraps the handlers: a server wired by hand from
/// `session_manager()` to a handler that does not serve keyed calls writes
/// no record for them (one would be written, then released, on every call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_server_serving_keyed_calls_records_them() -> anyhow::Result<()> {
    use mcp_persist_core::KvStore as _;
    use mcp_persist_transport_http::server::DurableServer;
    let http = reqwest::Client::new();
    fn keyed(key: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": "slow", "arguments": {}, "_meta": {IDEMPOTENCY_KEY: key}}})
    }

    let store = MemoryStore::new();
    let by_hand = DurableServer::builder(Stores::new(store.clone())).build()?;
    let service = rmcp::transport::StreamableHttpService::new(
        || Ok(Plain),
        by_hand.session_manager(),
        by_hand.config(),
    );
    let service = tower_layer::Layer::layer(&by_hand.layer(), service);
    let url = serve(axum::Router::new().nest_service("/mcp", service)).await?;
    let session = raw_initialize(&http, &url, "alice").await?;
    let call = {
        let (http, url, session) = (http.clone(), url.clone(), session.clone());
        tokio::spawn(async move {
            support::raw_post(&http, &url, "alice", &session, keyed("hand")).await
        })
    };
    // While the tool runs: a record written early would be there now
    // (and released only once the request is done).
    let until = std::time::Instant::now() + Duration::from_millis(300);
    while std::time::Instant::now() < until {
        assert!(
            store
                .list(mcp_persist_core::declare::CALL_RECORD.prefix)
                .await?
                .is_empty(),
            "no record for a handler that does not serve keyed calls"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = call.await??;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text_of(&response_of(&body)?)?, "ok");

    let wrapped = DurableServer::builder(Stores::new(store.clone())).build()?;
    let url =
        serve(axum::Router::new().nest_service("/mcp", wrapped.service(|| Ok(Plain)))).await?;
    let session = raw_initialize(&http, &url, "alice").await?;
    let (status, body) =
        support::raw_post(&http, &url, "alice", &session, keyed("wrapped")).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        store
            .list(mcp_persist_core::declare::CALL_RECORD.prefix)
            .await?
            .len(),
        1,
        "the served keyed call is recorded"
    );
    Ok(())
}
