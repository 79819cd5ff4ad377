//! Acceptance tests of the durable server: real rmcp clients against two
//! instances on one store (in-process for the memory backend, child
//! processes killed with SIGKILL for SQLite), behind a TCP load balancer.

use std::time::Duration;

use crate::support::*;
use mcp_persist_core::{MemoryStore, Stores};

/// Two instances sharing one store.
struct Cluster {
    a: Instance,
    b: Instance,
    _dir: Option<tempfile::TempDir>,
}

async fn memory_cluster(args: &[&str]) -> anyhow::Result<Cluster> {
    let stores = Stores::new(MemoryStore::new());
    Ok(Cluster {
        a: Instance::in_process(stores.clone(), args).await?,
        b: Instance::in_process(stores, args).await?,
        _dir: None,
    })
}

async fn sqlite_cluster(args: &[&str]) -> anyhow::Result<Cluster> {
    process_cluster("sqlite", "state.db", args).await
}

async fn file_cluster(args: &[&str]) -> anyhow::Result<Cluster> {
    process_cluster("file", "state", args).await
}

/// Two child processes sharing the Redis server `cargo xtask test` starts
/// (`MCP_PERSIST_REDIS_URL`), under a key prefix of their own. `None`, with a
/// notice, when no server was given outside CI; under CI that is a failure.
async fn redis_cluster(args: &[&str]) -> anyhow::Result<Option<Cluster>> {
    let Ok(url) = std::env::var("MCP_PERSIST_REDIS_URL") else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        anyhow::ensure!(
            !ci,
            "MCP_PERSIST_REDIS_URL is not set: run the tests through `cargo xtask test`"
        );
        eprintln!("skipped: MCP_PERSIST_REDIS_URL is not set (`cargo xtask test` starts Redis)");
        return Ok(None);
    };
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let prefix = format!(
        "server-test-{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut all = vec![
        "--backend",
        "redis",
        "--store",
        &url,
        "--redis-prefix",
        &prefix,
    ];
    all.extend_from_slice(args);
    Ok(Some(Cluster {
        a: Instance::process(&all).await?,
        b: Instance::process(&all).await?,
        _dir: None,
    }))
}

/// Two child processes on one store of `backend` at `name` in a temp dir.
async fn process_cluster(backend: &str, name: &str, args: &[&str]) -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(name);
    let path = path.to_str().expect("utf-8 temp path");
    let mut all = vec!["--backend", backend, "--store", path];
    all.extend_from_slice(args);
    Ok(Cluster {
        a: Instance::process(&all).await?,
        b: Instance::process(&all).await?,
        _dir: Some(dir),
    })
}

/// A client initializes on A; A dies; its next request lands on B, which
/// restores the session without a new `initialize` and still knows the
/// client's capabilities (sampling works).
async fn restore_scenario(mut cluster: Cluster) -> anyhow::Result<()> {
    let lb = Balancer::new(cluster.a.addr()).await?;
    let (client, _progress) = connect(&lb.url(), "alice").await?;
    assert_eq!(
        stats(&client).await?,
        (1, 0),
        "A answered the one initialize"
    );

    cluster.a.kill().await?;
    lb.switch(cluster.b.addr());
    lb.cut();

    let reply = call(
        &client,
        "ask_sampling",
        serde_json::json!({"prompt": "ping"}),
    )
    .await?;
    assert!(
        reply.contains("pong"),
        "sampling through the restored session: {reply}"
    );
    assert_eq!(
        stats(&client).await?,
        (0, 1),
        "B restored the session and saw no initialize from the client"
    );
    client.cancel().await?;
    Ok(())
}

async fn progress_until(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Progress>,
    seen: &mut Vec<Progress>,
    count: usize,
) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(30), async {
        while seen.len() < count {
            match rx.recv().await {
                Some(p) => seen.push(p),
                None => anyhow::bail!("progress channel closed after {} events", seen.len()),
            }
        }
        Ok(())
    })
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "only {} of {count} progress notifications arrived",
            seen.len()
        )
    })?
}

fn assert_exactly_once(seen: &[Progress], tag: &str, count: usize) {
    // rmcp hands notifications to the client handler concurrently, so two
    // that arrive back to back may be observed out of order; the stream and
    // its replay carry them in order (the core conformance suite checks
    // that). What matters here: none lost, none twice.
    let mut values: Vec<f64> = seen.iter().map(|p| p.progress).collect();
    values.sort_by(f64::total_cmp);
    let expected: Vec<f64> = (1..=count).map(|i| i as f64).collect();
    assert_eq!(values, expected, "every progress of {tag} exactly once");
    assert!(
        seen.iter().all(|p| p.message.as_deref() == Some(tag)),
        "no progress of another stream leaked into {tag}'s"
    );
}

/// A slow tool on A sends 100 progress notifications; the client's
/// connection is cut halfway and it resumes on B with `Last-Event-ID` while
/// A is still writing. It receives every later notification and the result
/// exactly once, in order; a second client's concurrent stream never leaks.
async fn replay_scenario(cluster: Cluster) -> anyhow::Result<()> {
    const COUNT: usize = 100;
    let lb = Balancer::new(cluster.a.addr()).await?;
    let (one, mut one_progress) = connect(&lb.url(), "alice").await?;
    let (two, mut two_progress) = connect(&cluster.a.url(), "bob").await?;

    let one_call = tokio::spawn(async move {
        let r = call(
            &one,
            "slow_progress",
            serde_json::json!({"count": COUNT, "delay_ms": 15, "tag": "one"}),
        )
        .await;
        (one, r)
    });
    let two_call = tokio::spawn(async move {
        let r = call(
            &two,
            "slow_progress",
            serde_json::json!({"count": COUNT, "delay_ms": 10, "tag": "two"}),
        )
        .await;
        (two, r)
    });

    let mut seen = Vec::new();
    progress_until(&mut one_progress, &mut seen, COUNT / 2).await?;
    lb.switch(cluster.b.addr());
    lb.cut();

    let (one, result) = one_call.await?;
    assert_eq!(result?, "done one", "the final result arrives through B");
    progress_until(&mut one_progress, &mut seen, COUNT).await?;
    tokio::task::yield_now().await;
    while let Ok(extra) = one_progress.try_recv() {
        seen.push(extra);
    }
    assert_exactly_once(&seen, "one", COUNT);

    let (two, result) = two_call.await?;
    assert_eq!(result?, "done two");
    let mut seen_two = Vec::new();
    progress_until(&mut two_progress, &mut seen_two, COUNT).await?;
    assert_exactly_once(&seen_two, "two", COUNT);

    one.cancel().await?;
    two.cancel().await?;
    drop(cluster);
    Ok(())
}

/// Another principal presenting a live session id gets the same 404 as an
/// unknown session, on A and on B; the owner keeps using it on both.
async fn binding_scenario(cluster: Cluster) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let session = raw_initialize(&http, &cluster.a.url(), "alice").await?;
    let unknown = raw_post(
        &http,
        &cluster.a.url(),
        "alice",
        "5f0c8a61-1d3e-4b0e-9a51-3c8f0b2d7e44",
        list.clone(),
    )
    .await?;
    assert_eq!(unknown.0, 404);

    for instance in [&cluster.a, &cluster.b] {
        let stolen = raw_post(&http, &instance.url(), "mallory", &session, list.clone()).await?;
        assert_eq!(
            stolen, unknown,
            "another principal sees exactly an unknown session"
        );
        let anonymous = raw_post(&http, &instance.url(), "", &session, list.clone()).await?;
        assert_eq!(anonymous.0, 404, "no principal is another principal");
    }
    for instance in [&cluster.a, &cluster.b] {
        let (status, body) =
            raw_post(&http, &instance.url(), "alice", &session, list.clone()).await?;
        assert_eq!(
            status, 200,
            "the owner keeps the session on every instance: {body}"
        );
        assert!(body.contains("slow_progress"));
    }
    Ok(())
}

/// A session idle past its TTL is 404 on every instance, and an rmcp
/// client re-initializes by itself.
async fn expiry_scenario(cluster: Cluster) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (client, _progress) = connect(&cluster.a.url(), "alice").await?;
    assert_eq!(stats(&client).await?, (1, 0));
    let session = raw_initialize(&http, &cluster.a.url(), "alice").await?;
    assert_eq!(
        raw_post(&http, &cluster.a.url(), "alice", &session, list.clone())
            .await?
            .0,
        200
    );

    // The idle TTL of these clusters is 300 ms.
    tokio::time::sleep(Duration::from_millis(700)).await;

    for instance in [&cluster.a, &cluster.b] {
        let (status, _) = raw_post(&http, &instance.url(), "alice", &session, list.clone()).await?;
        assert_eq!(status, 404, "an expired session is gone on every instance");
    }
    // The rmcp client gets the 404, re-initializes and carries on.
    assert_eq!(
        stats(&client).await?,
        (3, 0),
        "client and raw initializes, then the client's new one"
    );
    client.cancel().await?;
    Ok(())
}

/// A session ended with DELETE on one instance, while another instance
/// holds it in memory: with strict sessions the other instance answers 404
/// at once (by default it notices at its next coalesced touch, up to a tenth
/// of the idle TTL later).
async fn strict_delete_scenario(cluster: Cluster) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let session = raw_initialize(&http, &cluster.a.url(), "alice").await?;
    // B restores the session and now holds it; a second request there has
    // touched it, so B would not look at the store again for a while.
    for _ in 0..2 {
        let (status, _) =
            raw_post(&http, &cluster.b.url(), "alice", &session, list.clone()).await?;
        assert_eq!(status, 200);
    }
    let deleted = http
        .delete(cluster.a.url())
        .header("x-demo-user", "alice")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await?;
    assert!(
        deleted.status().is_success(),
        "DELETE answered {}",
        deleted.status()
    );
    let (status, _) = raw_post(&http, &cluster.b.url(), "alice", &session, list.clone()).await?;
    assert_eq!(status, 404, "a session ended on A is gone on B at once");
    let (status, _) = raw_post(&http, &cluster.a.url(), "alice", &session, list).await?;
    assert_eq!(status, 404, "the instance that ended it knows it at once");
    Ok(())
}

/// Bad `Last-Event-ID`s get an HTTP error that says what is wrong.
async fn bad_resumption_scenario(cluster: Cluster) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let (a, b) = (cluster.a.url(), cluster.b.url());
    let mine = raw_initialize(&http, &a, "alice").await?;
    let other = raw_initialize(&http, &a, "alice").await?;
    let call = serde_json::json!({
        "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "slow_progress", "arguments": {"count": 10, "delay_ms": 0, "tag": "t"},
                   "_meta": {"progressToken": "p"}}
    });
    let (status, body) = raw_post(&http, &a, "alice", &mine, call).await?;
    assert_eq!(status, 200);
    let ids = event_ids(&body);
    assert!(
        ids.len() >= 11,
        "10 progress and the result carry ids: {ids:?}"
    );
    let last = ids.last().expect("ids");
    let before_last = &ids[ids.len() - 2];

    let (status, body) = raw_resume(&http, &a, "alice", &mine, "not-an-event-id").await?;
    assert_eq!(status, 400);
    assert!(body.contains("malformed Last-Event-ID"), "{body}");

    let forged = format!("{}{}", "0".repeat(32), &last[32..]);
    let (status, body) = raw_resume(&http, &b, "alice", &mine, &forged).await?;
    assert_eq!(status, 410);
    assert!(body.contains("expired or never existed"), "{body}");

    // Another session's stream is answered as one that never existed: the
    // answer says nothing about other sessions.
    let foreign = raw_resume(&http, &b, "alice", &other, last).await?;
    assert_eq!(foreign, (status, body));

    // These clusters keep 4 events per stream: the ones after the first
    // are gone.
    let (status, body) = raw_resume(&http, &b, "alice", &mine, &ids[0]).await?;
    assert_eq!(status, 410);
    assert!(
        body.contains("events after this Last-Event-ID have expired"),
        "{body}"
    );

    // A good id replays the rest of the stream, with its original id, and
    // ends; it starts with a priming event naming the resumed-from id.
    let (status, body) = raw_resume(&http, &b, "alice", &mine, before_last).await?;
    assert_eq!(status, 200);
    assert_eq!(event_ids(&body), vec![last.clone()], "{body}");
    assert!(
        body.contains(&format!("id: {before_last}\n")),
        "the priming event names the resumed-from id: {body}"
    );
    assert!(body.contains("done t"), "{body}");

    // Resuming after the final response ends at once with nothing to send
    // (the stream is complete; no waiting for events that cannot come).
    let after_last = tokio::time::timeout(
        Duration::from_secs(30),
        raw_resume(&http, &b, "alice", &mine, last),
    )
    .await
    .map_err(|_| anyhow::anyhow!("a resume after the final response kept waiting"))??;
    assert_eq!(after_last.0, 200);
    assert!(event_ids(&after_last.1).is_empty(), "{}", after_last.1);
    Ok(())
}

const SHORT_TTL: &[&str] = &["--idle-ttl-ms", "300"];
const FOUR_EVENTS: &[&str] = &["--event-max", "4"];

#[tokio::test(flavor = "multi_thread")]
async fn memory_restore_on_another_instance() -> anyhow::Result<()> {
    restore_scenario(memory_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_replay_on_another_instance_while_the_first_writes() -> anyhow::Result<()> {
    replay_scenario(memory_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_binding_refuses_other_principals() -> anyhow::Result<()> {
    binding_scenario(memory_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_strict_sessions_end_everywhere_at_once() -> anyhow::Result<()> {
    strict_delete_scenario(memory_cluster(&["--strict-sessions"]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_strict_sessions_end_everywhere_at_once() -> anyhow::Result<()> {
    strict_delete_scenario(sqlite_cluster(&["--strict-sessions"]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_idle_expiry() -> anyhow::Result<()> {
    expiry_scenario(memory_cluster(SHORT_TTL).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_bad_resumption_input() -> anyhow::Result<()> {
    bad_resumption_scenario(memory_cluster(FOUR_EVENTS).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_restore_after_sigkill() -> anyhow::Result<()> {
    restore_scenario(sqlite_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_replay_across_processes() -> anyhow::Result<()> {
    replay_scenario(sqlite_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_binding_refuses_other_principals() -> anyhow::Result<()> {
    binding_scenario(sqlite_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_idle_expiry() -> anyhow::Result<()> {
    expiry_scenario(sqlite_cluster(SHORT_TTL).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_bad_resumption_input() -> anyhow::Result<()> {
    bad_resumption_scenario(sqlite_cluster(FOUR_EVENTS).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn file_restore_after_sigkill() -> anyhow::Result<()> {
    restore_scenario(file_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn file_replay_across_processes() -> anyhow::Result<()> {
    replay_scenario(file_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn file_binding_refuses_other_principals() -> anyhow::Result<()> {
    binding_scenario(file_cluster(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn file_idle_expiry() -> anyhow::Result<()> {
    expiry_scenario(file_cluster(SHORT_TTL).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn file_bad_resumption_input() -> anyhow::Result<()> {
    bad_resumption_scenario(file_cluster(FOUR_EVENTS).await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_restore_after_sigkill() -> anyhow::Result<()> {
    match redis_cluster(&[]).await? {
        Some(cluster) => restore_scenario(cluster).await,
        None => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_replay_across_processes() -> anyhow::Result<()> {
    match redis_cluster(&[]).await? {
        Some(cluster) => replay_scenario(cluster).await,
        None => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_binding_refuses_other_principals() -> anyhow::Result<()> {
    match redis_cluster(&[]).await? {
        Some(cluster) => binding_scenario(cluster).await,
        None => Ok(()),
    }
}
