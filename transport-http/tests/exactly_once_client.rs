//! The durable client's half of exactly-once calls: every `tools/call` it
//! sends carries an idempotency key, journaled with the call. A client
//! process SIGKILLed mid-call, restarted, finds the call in `recover()`:
//! to a server that advertises exactly-once calls it is sent again with its
//! key and answered, the tool having run once; to one that does not (stock
//! rmcp), it is reported lost with its outcome unknown and not sent again.

mod support;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, Stores};
use mcp_persist_transport_http::client::{DurableClientBuilder, LostReason, Recovery};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use support::{Instance, JsonChild, demo};

const ROLE: &str = "MCP_PERSIST_EXACTLY_ONCE_CLIENT";

/// A client process (this test binary re-executed): `first` starts a slow
/// `charge` and waits to be killed; `second` recovers. One JSON line a step.
#[test]
fn client_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let url = std::env::var("URL").expect("URL");
        let dir = std::env::var("DIR").expect("DIR");
        let store = mcp_persist_store_sqlite::SqliteStore::open(format!("{dir}/client.db"))
            .await
            .expect("open");
        let stores = Stores::new(store);
        let (transport, handle) = DurableClientBuilder::new(&url, &stores)
            .build()
            .await
            .expect("build");
        // The 2026-07-28 revision: no session, no stream to resume.
        let client = rmcp::service::ClientServiceExt::serve_with_lifecycle(
            (),
            transport,
            rmcp::service::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("serve");
        let say = |v: Value| println!("{v}");
        match role.as_str() {
            "first" => {
                let peer = client.peer().clone();
                tokio::spawn(async move {
                    let call = CallToolRequestParams::new("charge").with_arguments(
                        json!({"tag": "c1", "delay_ms": 2500})
                            .as_object()
                            .cloned()
                            .expect("object"),
                    );
                    let _ = peer.call_tool(call).await;
                });
                // In flight past the journal's window, then committed.
                tokio::time::sleep(Duration::from_millis(300)).await;
                handle.flush().await;
                say(json!({"ready": true, "interrupted": handle.interrupted().len()}));
                std::future::pending::<()>().await;
            }
            _ => {
                for recovery in handle.recover() {
                    match recovery {
                        Recovery::Reissue(call) => {
                            let key = call.key().to_owned();
                            let answer = call.send_with(client.peer()).await.expect("sent");
                            let answer =
                                serde_json::to_value(answer.expect("a result")).expect("json");
                            say(json!({"reissued": key, "answer": answer}));
                        }
                        Recovery::Lost {
                            request, reason, ..
                        } => say(json!({
                            "lost": request.method,
                            "outcome_unknown": reason == LostReason::OutcomeUnknown,
                        })),
                        other => say(json!({"other": format!("{other:?}")})),
                    }
                }
                handle.flush().await;
                say(json!({"done": true, "interrupted_after": handle.interrupted().len()}));
            }
        }
    });
}

fn runs(file: &std::path::Path, line: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

/// The client killed mid-call and restarted against `url`; what the second
/// process printed for the interrupted call, and its last line.
async fn kill_and_recover(
    url: &str,
    dir: &str,
    runs_file: &std::path::Path,
) -> anyhow::Result<(Value, Value)> {
    let spawn = |role| {
        JsonChild::spawn(
            "client_process",
            &[(ROLE, role), ("URL", url), ("DIR", dir)],
        )
    };
    let mut first = spawn("first")?;
    let ready = first.json().await?;
    assert_eq!(ready["interrupted"], 0, "{ready}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while runs(runs_file, "charge c1") == 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().await?;
    let mut second = spawn("second")?;
    let outcome = second.json().await?;
    let last = second.json().await?;
    Ok((outcome, last))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_client_sends_its_call_again_and_the_tool_runs_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs_file = dir.path().join("runs");
    let server = Instance::in_process(
        Stores::new(MemoryStore::new()),
        &["--runs-file", runs_file.to_str().context("utf-8")?],
    )
    .await?;
    let (outcome, last) = kill_and_recover(
        &server.url(),
        dir.path().to_str().context("utf-8")?,
        &runs_file,
    )
    .await?;
    let text = outcome["answer"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.starts_with("charge c1: run "), "{outcome}");
    assert!(
        outcome["reissued"].as_str().is_some_and(|k| k.len() == 32),
        "{outcome}"
    );
    assert_eq!(runs(&runs_file, "charge c1"), 1, "the tool ran twice");
    assert_eq!(last["interrupted_after"], 0, "{last}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn against_stock_rmcp_the_call_is_lost_with_its_outcome_unknown() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs_file = dir.path().join("runs");
    let options = demo::Options::parse([
        "--runs-file".to_owned(),
        runs_file.to_str().context("utf-8")?.to_owned(),
    ])?;
    let router = demo::rmcp_default_router(&options, Arc::new(demo::Counters::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let (outcome, last) =
        kill_and_recover(&url, dir.path().to_str().context("utf-8")?, &runs_file).await?;
    assert_eq!(outcome["lost"], "tools/call", "{outcome}");
    assert_eq!(outcome["outcome_unknown"], true, "{outcome}");
    // Not sent again: the stock server ran it once, before the kill.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&runs_file, "charge c1"), 1);
    assert_eq!(
        last["interrupted_after"], 1,
        "a lost call stays listed: {last}"
    );
    Ok(())
}
