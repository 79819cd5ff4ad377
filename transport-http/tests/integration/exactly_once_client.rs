//! The durable client's half of exactly-once calls: every `tools/call` it
//! sends carries an idempotency key, journaled with the call. A client
//! process SIGKILLed mid-call, restarted, finds the call in `recover()`:
//! to a server that advertises exactly-once calls it is sent again with its
//! key and answered, the tool having run once; to one that does not (stock
//! rmcp), it is reported lost with its outcome unknown and not sent again.

use crate::support;

use std::{sync::Arc, time::Duration};

use crate::support::{Instance, JsonChild, demo};
use anyhow::Context as _;
use mcp_persist_core::{ClientStateStore, MemoryStore, ServerKey, Stores};
use mcp_persist_transport_http::client::{DurableClientBuilder, LostReason, Recovery};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

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
        // Dual era, as an application would: the 2026-07-28 revision (no
        // session, no stream to resume) where the server speaks it, and
        // `initialize` where it does not (the TypeScript SDK server).
        let client =
            rmcp::service::ClientServiceExt::serve_with_lifecycle((), transport, lifecycle())
                .await
                .expect("serve");
        let say = |v: Value| println!("{v}");
        match role.as_str() {
            "first" => {
                let peer = client.peer().clone();
                tokio::spawn(async move {
                    let tag = std::env::var("TAG").unwrap_or_else(|_| "c1".to_owned());
                    let call = CallToolRequestParams::new("charge").with_arguments(
                        json!({"tag": tag, "delay_ms": 2500})
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
                // A legacy session's call is first resumed in its session:
                // when the server forgot it, collecting says so, and after
                // the next request (which re-initializes) the call is sent
                // again in the new session.
                let mut recoveries = handle.recover();
                if recoveries
                    .iter()
                    .any(|r| matches!(r, Recovery::Resumable(_)))
                {
                    for recovery in recoveries {
                        if let Recovery::Resumable(resumed) = recovery {
                            let outcome = resumed.collect().await;
                            say(json!({"collected": format!("{:?}", outcome.map(|_| ()))}));
                        }
                    }
                    let _ = client.peer().list_tools(None).await;
                    recoveries = handle.recover();
                }
                for recovery in recoveries {
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
                            "reason": format!("{reason:?}"),
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

/// The 2026-07-28 revision first, `initialize` where the server answers
/// like a legacy one.
fn dual_era() -> rmcp::service::ClientLifecycleMode {
    rmcp::service::ClientLifecycleMode::Auto {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    }
}

/// The client process's era: `ERA=legacy` is rmcp's `initialize` alone
/// (a legacy session with resumable streams), anything else [`dual_era`].
fn lifecycle() -> rmcp::service::ClientLifecycleMode {
    match std::env::var("ERA").as_deref() {
        Ok("legacy") => rmcp::service::ClientLifecycleMode::Initialize,
        _ => dual_era(),
    }
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
    kill_and_recover_tag(url, dir, runs_file, "c1").await
}

/// [`kill_and_recover`] with the call's tag.
async fn kill_and_recover_tag(
    url: &str,
    dir: &str,
    runs_file: &std::path::Path,
    tag: &str,
) -> anyhow::Result<(Value, Value)> {
    kill_mid_call(url, dir, runs_file, tag, "dual").await?;
    let mut second = spawn_client("second", url, dir, tag, "dual")?;
    let outcome = second.json().await?;
    let last = second.json().await?;
    Ok((outcome, last))
}

/// A client process of `role` in `era` (`legacy` or `dual`).
fn spawn_client(
    role: &str,
    url: &str,
    dir: &str,
    tag: &str,
    era: &str,
) -> anyhow::Result<JsonChild> {
    JsonChild::spawn(
        &support::test_path(module_path!(), "client_process"),
        &[
            (ROLE, role),
            ("URL", url),
            ("DIR", dir),
            ("TAG", tag),
            ("ERA", era),
        ],
    )
}

/// A first client process starts the call tagged `tag` and is SIGKILLed
/// while the tool runs.
async fn kill_mid_call(
    url: &str,
    dir: &str,
    runs_file: &std::path::Path,
    tag: &str,
    era: &str,
) -> anyhow::Result<()> {
    let mut first = spawn_client("first", url, dir, tag, era)?;
    let ready = first.json().await?;
    assert_eq!(ready["interrupted"], 0, "{ready}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while runs(runs_file, &format!("charge {tag}")) == 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().await
}

/// The legacy era: a client SIGKILLed mid-call in a session the server then
/// forgets (its idle time ran out, say). The restarted process tries to
/// resume the call's stream in the stored session and hears the session is
/// gone; after its next request re-initializes, the call is sent again with
/// its key in the new session, and the answer is the one the first run
/// gave: the tool ran once. A third process finds nothing left to recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_a_call_whose_session_is_gone_is_sent_again_in_the_new_session() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let runs_file = dir.path().join("runs");
    let stores = Stores::new(MemoryStore::new());
    let server = Instance::in_process(
        stores.clone(),
        &["--runs-file", runs_file.to_str().context("utf-8")?],
    )
    .await?;
    let url = server.url();
    let folder = dir.path().to_str().context("utf-8")?;
    kill_mid_call(&url, folder, &runs_file, "g1", "legacy").await?;

    // The server forgets the session the killed process used.
    let client_store =
        mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("client.db")).await?;
    let session = ClientStateStore::new(Arc::new(client_store))
        .session(&ServerKey::new(&url, "default")?)
        .await?
        .context("the killed process stored its session")?
        .record
        .session_id;
    assert!(
        stores
            .sessions(Duration::from_secs(3600))
            .delete(&session)
            .await?,
        "the session was live on the server"
    );

    let mut second = spawn_client("second", &url, folder, "g1", "legacy")?;
    let collected = second.json().await?;
    assert!(
        collected["collected"]
            .as_str()
            .is_some_and(|c| c.contains("SessionGone")),
        "{collected}"
    );
    let outcome = second.json().await?;
    let text = outcome["answer"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.starts_with("charge g1: run "), "{outcome}");
    assert!(
        outcome["reissued"].as_str().is_some_and(|k| k.len() == 32),
        "{outcome}"
    );
    let last = second.json().await?;
    assert_eq!(last["interrupted_after"], 0, "{last}");
    assert_eq!(runs(&runs_file, "charge g1"), 1, "the tool ran twice");

    let mut third = spawn_client("second", &url, folder, "g1", "legacy")?;
    let nothing = third.json().await?;
    assert_eq!(nothing["interrupted_after"], 0, "{nothing}");
    Ok(())
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

/// Against a server written with the TypeScript SDK, which ignores the key
/// in `_meta` and promises nothing about calls sent again: a call is
/// answered as usual, and a call cut by the client's SIGKILL is reported
/// lost and not sent again (the tool ran once), with no sessions ("outcome
/// unknown") and with sessions but no event store (nothing to resume from).
/// `cargo xtask interop` starts `xtask/interop/ts-server.mjs` and runs this
/// test with its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the TypeScript SDK server that `cargo xtask interop` starts"]
async fn against_the_typescript_sdk_server_a_lost_call_is_not_sent_again() -> anyhow::Result<()> {
    let base = std::env::var("MCP_PERSIST_TS_SERVER")
        .context("MCP_PERSIST_TS_SERVER (http://host:port of the TypeScript SDK server)")?;
    let runs_file = std::path::PathBuf::from(
        std::env::var("MCP_PERSIST_TS_RUNS_FILE").context("MCP_PERSIST_TS_RUNS_FILE")?,
    );
    for (path, reason) in [("stateless", "OutcomeUnknown"), ("mcp", "NoCursor")] {
        let url = format!("{base}/{path}");
        let dir = tempfile::tempdir()?;
        // An ordinary call, keyed by the durable client, answered as usual.
        let store =
            mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("plain.db")).await?;
        let stores = Stores::new(store);
        let (transport, handle) = DurableClientBuilder::new(&url, &stores).build().await?;
        let client =
            rmcp::service::ClientServiceExt::serve_with_lifecycle((), transport, dual_era())
                .await?;
        let plain = format!("{path}-plain");
        let answer = client
            .call_tool(
                CallToolRequestParams::new("charge").with_arguments(
                    json!({"tag": plain})
                        .as_object()
                        .cloned()
                        .context("object")?,
                ),
            )
            .await?;
        let text = serde_json::to_value(&answer)?["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            text.starts_with(&format!("charge {plain}: run "))
                && text.ends_with("(key in _meta: yes)"),
            "{text}"
        );
        client.cancel().await?;
        handle.flush().await;
        assert!(
            handle.interrupted().is_empty(),
            "an answered call is no longer listed"
        );

        // A client killed mid-call: lost, and not sent again.
        let tag = format!("{path}-cut");
        let (outcome, last) = kill_and_recover_tag(
            &url,
            dir.path().to_str().context("utf-8")?,
            &runs_file,
            &tag,
        )
        .await?;
        assert_eq!(outcome["lost"], "tools/call", "{outcome}");
        assert_eq!(outcome["reason"], reason, "{outcome}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(runs(&runs_file, &format!("charge {tag}")), 1);
        assert_eq!(last["interrupted_after"], 1, "{last}");
        println!(
            "INTEROP /{path}: a call answered (\"{text}\"); a call cut by the client's SIGKILL reported lost ({reason}) and run once, not sent again"
        );
    }
    Ok(())
}
