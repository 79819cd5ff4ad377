//! What a client sees when it moves between instances: the SSE retry
//! interval the server was configured with on every stream, a session DELETE
//! answered with a status every official SDK accepts (and 404 when there is
//! no session to end), and calls of a killed instance ended with an error.

use crate::support;

use crate::slow_store::SlowStore;
use crate::support::{Instance, raw_initialize};
use mcp_persist_core::{MemoryStore, Stores};

/// The `retry:` values in an SSE body.
fn retries(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("retry:"))
        .map(|v| v.trim().to_owned())
        .collect()
}

async fn post_body(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
) -> anyhow::Result<String> {
    let mut request = http
        .post(url)
        .header("x-demo-user", "alice")
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    let body = match session {
        Some(session) => {
            request = request.header("mcp-session-id", session);
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        }
        None => serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "retry-test", "version": "1"}}
        }),
    };
    Ok(request.body(body.to_string()).send().await?.text().await?)
}

/// POSTs `call` as alice in `session` (2025-11-25); the response, its SSE
/// body unread.
async fn post_call(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    call: &serde_json::Value,
) -> anyhow::Result<reqwest::Response> {
    Ok(http
        .post(url)
        .header("x-demo-user", "alice")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(call.to_string())
        .send()
        .await?)
}

/// A `tools/call` of the demo's `slow_progress` tool with JSON-RPC id `id`:
/// `count` progress events `delay_ms` apart, tagged `tag` (progress token
/// `p-<tag>`).
fn slow_progress(id: u64, count: u64, delay_ms: u64, tag: &str) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": "slow_progress",
            "arguments": { "count": count, "delay_ms": delay_ms, "tag": tag },
            "_meta": { "progressToken": format!("p-{tag}") }
        }
    })
}

/// Reads `response`'s SSE body until it holds `n` events with data (10 s
/// at most per chunk); the body read so far.
async fn read_events(response: &mut reqwest::Response, n: usize) -> anyhow::Result<String> {
    let mut body = String::new();
    while support::event_ids(&body).len() < n {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), response.chunk())
            .await??
            .ok_or_else(|| anyhow::anyhow!("the call's stream ended early: {body}"))?;
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    Ok(body)
}

/// The configured interval, not rmcp's 3 s default, on POST and GET streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_retry_on_every_stream() -> anyhow::Result<()> {
    for configured in ["750", "200"] {
        let instance = Instance::in_process(
            Stores::new(MemoryStore::new()),
            &["--sse-retry-ms", configured],
        )
        .await?;
        let http = reqwest::Client::new();
        let url = instance.url();
        let init = post_body(&http, &url, None).await?;
        assert_eq!(
            retries(&init),
            vec![configured.to_owned()],
            "initialize: {init}"
        );
        let session = raw_initialize(&http, &url, "alice").await?;
        let post = post_body(&http, &url, Some(&session)).await?;
        assert_eq!(retries(&post), vec![configured.to_owned()], "POST: {post}");
        // The standalone GET stream: read its first event only.
        let mut get = http
            .get(&url)
            .header("x-demo-user", "alice")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "text/event-stream")
            .send()
            .await?;
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), get.chunk())
            .await??
            .unwrap_or_default();
        let first = String::from_utf8_lossy(&first);
        assert_eq!(retries(&first), vec![configured.to_owned()], "GET: {first}");
    }
    Ok(())
}

/// DELETE of a live session answers 204 (the Python SDK accepts only 200
/// and 204); a DELETE with no live session to end answers 404, as the spec
/// says, and another principal's session gets exactly the same 404 and
/// stays alive. On either instance of a fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_answers_204_for_a_session_and_404_otherwise() -> anyhow::Result<()> {
    let stores = Stores::new(MemoryStore::new());
    let a = Instance::in_process(stores.clone(), &[]).await?;
    let b = Instance::in_process(stores, &[]).await?;
    let http = reqwest::Client::new();
    let delete = |url: String, user: &'static str, id: String| {
        let http = http.clone();
        async move {
            let r = http
                .delete(&url)
                .header("x-demo-user", user)
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-11-25")
                .send()
                .await?;
            let status = r.status().as_u16();
            let mut headers: Vec<(String, String)> = r
                .headers()
                .iter()
                .filter(|(k, _)| k.as_str() != "date")
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            headers.sort();
            anyhow::Ok((status, headers, r.text().await?))
        }
    };
    let alices = raw_initialize(&http, &a.url(), "alice").await?;
    let bobs = raw_initialize(&http, &a.url(), "bob").await?;
    for url in [a.url(), b.url()] {
        let unknown = delete(url.clone(), "alice", "0123456789abcdef".into()).await?;
        assert_eq!(unknown.0, 404, "{unknown:?}");
        let foreign = delete(url.clone(), "alice", bobs.clone()).await?;
        assert_eq!(foreign, unknown, "another principal's session");
    }
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _) = support::raw_post(&http, &b.url(), "bob", &bobs, list.clone()).await?;
    assert_eq!(status, 200, "bob's session survived alice's DELETE");

    let own = delete(b.url(), "alice", alices.clone()).await?;
    assert_eq!(own.0, 204, "{own:?}");
    let unknown = delete(b.url(), "alice", "0123456789abcdef".into()).await?;
    for url in [a.url(), b.url()] {
        let again = delete(url, "alice", alices.clone()).await?;
        assert_eq!(again, unknown, "an ended session is an unknown one");
    }
    let (status, _) = support::raw_post(&http, &a.url(), "alice", &alices, list).await?;
    assert_eq!(status, 404);
    Ok(())
}

/// The instance running a call is killed: the instance the client resumes
/// on answers the call with an error saying so within a few seconds of the
/// death, instead of tailing the stream silently until `tail_idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_call_is_answered_on_the_other_instance() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
    ];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let http = reqwest::Client::new();
    let session = raw_initialize(&http, &a.url(), "alice").await?;
    let call = slow_progress(2, 1000, 50, "orphan");
    let mut response = post_call(&http, &a.url(), &session, &call).await?;
    // Read until three progress events have arrived, keeping the last id.
    let body = read_events(&mut response, 4).await?;
    let last = support::event_ids(&body)
        .last()
        .cloned()
        .unwrap_or_default();
    drop(response);
    a.kill().await?;
    let killed = std::time::Instant::now();
    let (status, replay) = support::raw_resume(&http, &b.url(), "alice", &session, &last).await?;
    let took = killed.elapsed();
    assert_eq!(status, 200, "{replay}");
    let answer = replay
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .find(|m| m.get("error").is_some())
        .ok_or_else(|| anyhow::anyhow!("no error answer in the replay: {replay}"))?;
    assert_eq!(answer["id"], 2, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("stopped") && message.contains("re-issue"),
        "{message}"
    );
    eprintln!("orphaned call answered {took:?} after the kill");
    assert!(
        took < std::time::Duration::from_secs(15),
        "the orphaned call was answered only after {took:?}"
    );
    Ok(())
}

/// The same through a real rmcp client behind a load balancer: its call
/// fails with the orphan error within the grace period plus a retry or two,
/// not after `tail_idle` (60 s) or its own request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_gets_the_orphan_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
        "--sse-retry-ms",
        "200",
    ];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let balancer = support::Balancer::new(a.addr()).await?;
    let (client, mut progress) = support::connect(&balancer.url(), "alice").await?;
    let call = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let args = serde_json::json!({ "count": 1000, "delay_ms": 50, "tag": "orphan" });
            let serde_json::Value::Object(args) = args else {
                unreachable!("an object literal")
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }
    });
    for _ in 0..3 {
        tokio::time::timeout(std::time::Duration::from_secs(10), progress.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("client closed"))?;
    }
    a.kill().await?;
    let killed = std::time::Instant::now();
    balancer.switch(b.addr());
    balancer.cut();
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(20), call).await??;
    let took = killed.elapsed();
    let error = outcome.expect_err("a call whose instance died cannot succeed");
    let text = error.to_string();
    assert!(text.contains("re-issue"), "{text}");
    eprintln!("rmcp client got the orphan error {took:?} after the kill");
    Ok(())
}

/// With pipelined events, killing the writer loses at most its commit
/// window: a client resuming after the kill either gets the stream from
/// the event after its last one, with no gap, up to the orphan error, or,
/// when its last event was in the lost window, 410 saying the events were
/// lost. Never a gap, never a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_crash_loses_at_most_the_window() -> anyhow::Result<()> {
    crash_mid_stream("--pipelined-events").await
}

/// A pipelined writer SIGKILLed after a new stream's first events went out
/// but before the stream's first commit (a window of 6 s makes "before"
/// all but certain; a kill after it fails the test) leaves nothing of the stream: no metadata, no events. Another
/// instance answers a resume from the last event the client received with
/// 410 and the same bytes as an id of a stream that never existed, and the
/// session goes on serving there. The second run: the writer started again
/// on the same store and killed the same way in a new stream of the same
/// session leaves nothing either; a call it completes after that is
/// resumable from another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writer_killed_before_a_streams_first_commit_leaves_nothing() -> anyhow::Result<()>
{
    use mcp_persist_core::{EventId, declare};
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let writer_args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
        "--pipelined-window-ms",
        "6000",
    ];
    let other = Instance::process(&[
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
        "--pipelined-events",
    ])
    .await?;
    let http = reqwest::Client::new();
    let session = raw_initialize(&http, &other.url(), "alice").await?;
    let store = mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("state.db")).await?;
    for (run, id) in [(1, 11), (2, 12)] {
        let mut writer = Instance::process(&writer_args).await?;
        let call = slow_progress(id, 1000, 20, &format!("uncommitted-{run}"));
        let mut response = post_call(&http, &writer.url(), &session, &call).await?;
        let body = read_events(&mut response, 3).await?;
        writer.kill().await?;
        let ids = support::event_ids(&body);
        let last: EventId = ids.last().map(String::as_str).unwrap_or_default().parse()?;
        // Its priming event was number 1, then one number per event.
        let seqs = ids
            .iter()
            .map(|i| i.parse::<EventId>().map(|e| e.seq()))
            .collect::<Result<Vec<_>, _>>()?;
        assert_eq!(
            seqs,
            (2..2 + ids.len() as u64).collect::<Vec<_>>(),
            "run {run}: a new stream is numbered from 1"
        );

        // Nothing of the stream reached the store.
        let stream = last.stream();
        assert!(
            mcp_persist_core::KvStore::get(&store, &declare::EVENT_STREAM.try_key(&[stream])?)
                .await?
                .is_none(),
            "run {run}: the stream's metadata was written before its first commit"
        );
        assert!(
            mcp_persist_core::LogStore::read_after(
                &store,
                &declare::EVENT.try_key(&[stream])?,
                0,
                16
            )
            .await?
            .is_empty(),
            "run {run}: events were written before the stream's first commit"
        );

        // The resume is refused exactly as one of a stream that never
        // existed is: the same status, the same bytes.
        let (status, lost) =
            support::raw_resume(&http, &other.url(), "alice", &session, &last.to_string()).await?;
        let never = format!("{}-{}-{stream}-never", "0".repeat(32), last.seq());
        let (never_status, never_body) =
            support::raw_resume(&http, &other.url(), "alice", &session, &never).await?;
        assert_eq!((status, never_status), (410, 410), "run {run}: {lost}");
        assert_eq!(
            lost, never_body,
            "run {run}: an uncommitted stream can be told apart"
        );
    }

    // The session is served on; a call that completes on a writer started
    // a third time is stored and resumable elsewhere from its first event.
    let mut writer = Instance::process(&writer_args).await?;
    let call = slow_progress(13, 3, 1, "kept");
    let body = post_call(&http, &writer.url(), &session, &call)
        .await?
        .text()
        .await?;
    let ids = support::event_ids(&body);
    assert!(body.contains("\"id\":13"), "the call was answered: {body}");
    // A resume on the writer has the stream's pending events committed at
    // once (not after the 6 s window), so the stream is stored when it
    // answers.
    let (status, replay) =
        support::raw_resume(&http, &writer.url(), "alice", &session, &ids[0]).await?;
    assert_eq!(status, 200, "{replay}");
    writer.kill().await?;
    let (status, replay) =
        support::raw_resume(&http, &other.url(), "alice", &session, &ids[0]).await?;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(
        support::event_ids(&replay),
        ids[1..],
        "every later event of the completed call, from another instance"
    );
    Ok(())
}

/// Under `Written` (committed, not synced) a SIGKILLed writer loses
/// nothing it sent: another instance replays every event the client had,
/// and everything after the last one, contiguously; never a 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_crash_loses_nothing_sent() -> anyhow::Result<()> {
    crash_mid_stream("--written-events").await
}

/// Streams progress from an instance started with `level`, kills it with
/// SIGKILL mid-stream and resumes on another instance of the same store.
async fn crash_mid_stream(level: &str) -> anyhow::Result<()> {
    let written = level == "--written-events";
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
        level,
    ];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let http = reqwest::Client::new();
    let session = raw_initialize(&http, &a.url(), "alice").await?;
    let call = slow_progress(3, 100_000, 1, "piped");
    let mut response = post_call(&http, &a.url(), &session, &call).await?;
    let body = read_events(&mut response, 200).await?;
    a.kill().await?;
    // The last complete event the client received.
    let complete = &body[..body.rfind("\n\n").unwrap_or(0)];
    let last = support::event_ids(complete)
        .last()
        .cloned()
        .unwrap_or_default();
    let seq = |id: &str| -> u64 {
        id.split('-')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_default()
    };
    if written {
        // Every event the client received is in the store: a resume from
        // the first one replays all the later ones it had.
        let got = support::event_ids(complete);
        let (status, replay) =
            support::raw_resume(&http, &b.url(), "alice", &session, &got[0]).await?;
        assert_eq!(status, 200, "{replay}");
        let replayed = support::event_ids(&replay);
        assert_eq!(
            &replayed[..got.len() - 1],
            &got[1..],
            "events sent before the kill are missing"
        );
    }
    let (status, replay) = support::raw_resume(&http, &b.url(), "alice", &session, &last).await?;
    if written {
        assert_eq!(status, 200, "a written stream lost events: {replay}");
    }
    match status {
        410 => assert!(replay.contains("lost"), "410 without saying why: {replay}"),
        200 => {
            let ids = support::event_ids(&replay);
            if let Some(first) = ids.first() {
                assert_eq!(seq(first), seq(&last) + 1, "a gap after {last}: {first}");
            }
            let seqs: Vec<u64> = ids.iter().map(|i| seq(i)).collect();
            assert!(
                seqs.windows(2).all(|w| w[1] == w[0] + 1),
                "not contiguous: {seqs:?}"
            );
            assert!(
                replay.contains("re-issue"),
                "the orphan error ends it: {replay}"
            );
        }
        other => panic!("resume answered {other}: {replay}"),
    }
    eprintln!("{level}: resume after the kill answered {status}");
    Ok(())
}

/// The durable client, restarted after the instance running its call was
/// killed, reports the call as lost (`RecoveryError::Orphaned`), keeps it
/// listed for the application, and does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_client_reports_an_orphaned_call_as_lost() -> anyhow::Result<()> {
    use mcp_persist_transport_http::client::{DurableClientBuilder, Recovery, RecoveryError};
    use rmcp::ServiceExt as _;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--liveness-grace-ms",
        "1000",
    ];
    let mut a = Instance::process(&args).await?;
    let b = Instance::process(&args).await?;
    let balancer = support::Balancer::new(a.addr()).await?;
    let client_store =
        mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("client.db")).await?;
    let stores = Stores::new(client_store);
    let (transport, handle) = DurableClientBuilder::new(balancer.url(), &stores)
        .build()
        .await?;
    let client = ().serve(transport).await?;
    let call = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let args = serde_json::json!({ "count": 1000, "delay_ms": 50, "tag": "lost" });
            let serde_json::Value::Object(args) = args else {
                unreachable!("an object literal")
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    handle.flush().await;
    // The client process goes away mid-call, then the instance dies.
    call.abort();
    drop(client);
    drop(handle);
    a.kill().await?;
    balancer.switch(b.addr());
    balancer.cut();
    let (_transport, handle) = DurableClientBuilder::new(balancer.url(), &stores)
        .build()
        .await?;
    let mut outcomes = Vec::new();
    for recovery in handle.recover() {
        match recovery {
            Recovery::Resumable(resumed) => outcomes.push(resumed.collect().await.map(|_| ())),
            other => panic!("expected a resumable call, got {other:?}"),
        }
    }
    assert_eq!(outcomes.len(), 1, "one interrupted call");
    match &outcomes[0] {
        Err(RecoveryError::Orphaned { .. }) => {}
        other => panic!("expected the call reported as lost, got {other:?}"),
    }
    assert_eq!(handle.interrupted().len(), 1, "a lost call stays listed");
    Ok(())
}

/// A pipelined server that lost the events after the client's stored
/// cursor (its writer died inside the commit window) answers the resume
/// with 410; the durable client reports the call as lost
/// (`RecoveryError::EventsGone`), keeps it listed and does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_client_reports_a_call_in_a_lost_window_as_lost() -> anyhow::Result<()> {
    use mcp_persist_core::{ServerKey, SessionId};
    use mcp_persist_transport_http::client::{DurableClientBuilder, Recovery, RecoveryError};
    use rmcp::ServiceExt as _;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db").display().to_string();
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.as_str(),
        "--pipelined-events",
    ];
    let server = Instance::process(&args).await?;
    let stores = Stores::new(
        mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("client.db")).await?,
    );
    let (transport, handle) = DurableClientBuilder::new(server.url(), &stores)
        .build()
        .await?;
    let client = ().serve(transport).await?;
    let call = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let args = serde_json::json!({ "count": 1000, "delay_ms": 20, "tag": "window" });
            let serde_json::Value::Object(args) = args else {
                unreachable!("an object literal")
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("slow_progress").with_arguments(args),
            )
            .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    handle.flush().await;
    call.abort();
    drop(client);
    drop(handle);

    // The journaled cursor moves past what the server committed, as when
    // the client received events its writer never committed.
    let key = ServerKey::new(&server.url(), "default")?;
    let state = stores.client_state();
    let session: SessionId = state
        .session(&key)
        .await?
        .expect("a stored session")
        .record
        .session_id;
    let mut journal = state.inflight(&key, &session).await?;
    anyhow::ensure!(journal.len() == 1, "one call journaled: {journal:?}");
    let mut request = journal.remove(0);
    let cursor = request.last_event_id.clone().expect("a stream cursor");
    let mut parts: Vec<&str> = cursor.splitn(3, '-').collect();
    let ahead = (parts[1].parse::<u64>()? + 100_000).to_string();
    parts[1] = &ahead;
    request.last_event_id = Some(parts.join("-"));
    state.record_inflight(&key, &session, &request).await?;

    let (_transport, handle) = DurableClientBuilder::new(server.url(), &stores)
        .build()
        .await?;
    let mut outcomes = Vec::new();
    for recovery in handle.recover() {
        match recovery {
            Recovery::Resumable(resumed) => outcomes.push(resumed.collect().await.map(|_| ())),
            other => panic!("expected a resumable call, got {other:?}"),
        }
    }
    assert_eq!(outcomes.len(), 1, "one interrupted call");
    match &outcomes[0] {
        Err(RecoveryError::EventsGone) => {}
        other => panic!("expected the call reported as lost, got {other:?}"),
    }
    assert_eq!(handle.interrupted().len(), 1, "a lost call stays listed");
    Ok(())
}

/// The request a POST stream answers is in the store as soon as the
/// stream's first event id can reach the client, so an instance stopping
/// right after it can never leave a stream whose orphan error could name no
/// request (it went out with `"id": null`, which no client can match: found
/// by `cargo xtask load`, an instance SIGKILLed just after a call began).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_names_its_request_before_its_first_event_goes_out() -> anyhow::Result<()> {
    let memory = MemoryStore::new();
    let stores = Stores::from_parts(
        // Writes of SSE stream metadata take 300 ms: the gap in which an
        // instance could stop between a stream's first event and the
        // record of the request it answers, made wide enough to see.
        std::sync::Arc::new(SlowStore::new(memory.clone()).puts_of(
            &mcp_persist_core::declare::EVENT_STREAM,
            std::time::Duration::from_millis(300),
        )),
        Some(std::sync::Arc::new(memory.clone())),
    );
    let instance = Instance::in_process(stores.clone(), &[]).await?;
    let http = reqwest::Client::new();
    let session = raw_initialize(&http, &instance.url(), "alice").await?;
    for id in [2, 3] {
        let call = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": "slow_progress",
                "arguments": { "count": 2, "delay_ms": 400, "tag": format!("named-{id}") },
                "_meta": { "progressToken": format!("p-{id}") }
            }
        });
        let mut response = post_call(&http, &instance.url(), &session, &call).await?;
        // The stream's first event, its priming event (an id, no message).
        let ids = |body: &str| -> Vec<String> {
            body.lines()
                .filter_map(|l| l.strip_prefix("id:"))
                .map(|s| s.trim().to_owned())
                .collect()
        };
        let mut body = String::new();
        while ids(&body).is_empty() {
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), response.chunk())
                .await??
                .ok_or_else(|| anyhow::anyhow!("the call's stream ended early: {body}"))?;
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(
            support::event_ids(&body).is_empty(),
            "the first event carried a message; the priming event was meant: {body}"
        );
        let first: mcp_persist_core::EventId = ids(&body)[0].parse()?;
        let origin = stores
            .events(mcp_persist_core::EventLogConfig::default())?
            .origin(first.stream())
            .await?
            .ok_or_else(|| anyhow::anyhow!("no record of the stream"))?;
        assert_eq!(
            origin.request,
            Some(serde_json::json!(id)),
            "the stream's first event went out before its request was recorded"
        );
        drop(response);
    }
    Ok(())
}
