//! OpenTelemetry, exported into the SDK's in-memory exporters:
//!
//! * a client SIGKILLed mid-call and restarted: the spans of both client
//!   processes and of the server are in one trace, linked parent to child
//!   through the journaled `traceparent`;
//! * a task whose instance was SIGKILLed, taken over by another instance:
//!   the takeover's run is a child of the request that created the task;
//! * the metrics an operator watches change as each scenario says, exactly
//!   where the count is deterministic.
//!
//! Its own test binary: one process-wide subscriber exports every span;
//! each test looks only at its own trace, and records metrics in its own
//! meter provider.

#![cfg(feature = "otel")]

mod otel_support;
mod support;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, ServerKey, Stores, TaskId, TaskStore, TaskUpdate, Timestamp};
use mcp_persist_transport_http::{
    client::{DurableClientBuilder, Recovery},
    telemetry::current_traceparent,
};
use otel_support::{Meters, finished, named, root_traceparent, total};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use support::{JsonChild, demo, event_ids, raw_initialize, raw_post, raw_resume};

const ROLE: &str = "MCP_PERSIST_OTEL_CLIENT";

/// A demo server process with the OpenTelemetry layer on, so that it keeps
/// `traceparent`s in what it stores.
#[test]
fn demo_server_process() {
    if std::env::var(support::DEMO_ARGS_VAR).is_ok() {
        otel_support::spans();
        support::run_demo_server_if_asked();
    }
}

/// An in-process instance of the demo server with tasks and the fleet bus,
/// over `stores`.
async fn instance(stores: Stores, args: &[&str]) -> anyhow::Result<SocketAddr> {
    let options = demo::Options::parse(args.iter().map(|s| s.to_string()))?;
    let counters = Arc::new(demo::Counters::default());
    let router = demo::durable_router_with_tasks(stores, &options, counters).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/mcp")
}

/// The client process (this binary re-executed): `first` opens a span of
/// its own, finishes a child of it, starts a slow `charge` in that trace and
/// waits to be killed, printing the spans it finished; `second` recovers
/// the call (sent again with its key), then prints its answer and spans.
#[test]
fn client_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    otel_support::spans();
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
        if role == "first" {
            let job = tracing::info_span!("job");
            let traceparent = job.in_scope(current_traceparent).expect("a traceparent");
            tracing::info_span!(parent: &job, "prepare").in_scope(|| {});
            let mut call = CallToolRequestParams::new("charge").with_arguments(
                json!({"tag": "t1", "delay_ms": 2000})
                    .as_object()
                    .cloned()
                    .expect("object"),
            );
            call.meta
                .get_or_insert_with(Default::default)
                .set_traceparent(traceparent);
            let peer = client.peer().clone();
            tokio::spawn(async move {
                let _ = peer.call_tool(call).await;
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            handle.flush().await;
            say(json!({"ready": true, "spans": finished()}));
            std::future::pending::<()>().await;
        }
        let mut answer = Value::Null;
        for recovery in handle.recover() {
            if let Recovery::Reissue(call) = recovery {
                let result = call.send_with(client.peer()).await.expect("sent");
                answer = serde_json::to_value(result.expect("a result")).expect("json");
            }
        }
        handle.flush().await;
        say(json!({"answer": answer, "spans": finished()}));
    });
}

fn runs(file: &std::path::Path, line: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

fn spans_of(report: &Value) -> Vec<Value> {
    report["spans"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_cut_by_a_sigkill_is_one_trace_across_both_client_processes_and_the_server()
-> anyhow::Result<()> {
    otel_support::spans();
    let dir = tempfile::tempdir()?;
    let runs_file = dir.path().join("runs");
    let meters = Meters::new();
    let stores = Stores::new(MemoryStore::new()).with_telemetry(meters.telemetry());
    let server = support::Instance::in_process(
        stores,
        &["--runs-file", runs_file.to_str().context("utf-8")?],
    )
    .await?;
    let url = server.url();
    let folder = dir.path().to_str().context("utf-8")?;
    let env = |role| [(ROLE, role), ("URL", url.as_str()), ("DIR", folder)];

    let mut first = JsonChild::spawn("client_process", &env("first"))?;
    let ready = first.json().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs(&runs_file, "charge t1") == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().await?;
    let mut second = JsonChild::spawn("client_process", &env("second"))?;
    let report = second.json().await?;
    assert!(
        report["answer"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("charge t1: run ")),
        "{report}"
    );
    assert_eq!(runs(&runs_file, "charge t1"), 1, "the tool ran twice");

    // The first process: the span it finished before it was killed names
    // the trace of the call.
    let first_spans = spans_of(&ready);
    let prepare = first_spans
        .iter()
        .find(|s| s["name"] == "prepare")
        .with_context(|| format!("no prepare span: {first_spans:?}"))?;
    let trace = prepare["trace"].as_str().context("trace")?.to_owned();

    // The server's spans of that trace: the first attempt, a child of the
    // first process's request span, and the attempt sent again.
    let server_spans = finished();
    let served = named(&server_spans, &trace, "tools/call charge");
    assert_eq!(served.len(), 2, "two attempts served: {server_spans:?}");
    assert!(served.iter().all(|s| s["kind"] == "Server"), "{served:?}");
    assert!(
        served
            .iter()
            .all(|s| s["attributes"]["gen_ai.tool.name"] == "charge"
                && s["attributes"]["mcp.method.name"] == "tools/call"),
        "{served:?}"
    );

    // The second process continues that very trace: its recovery is a child
    // of the first process's request span (the parent of the first attempt
    // served), and the call it sends again a child of the recovery, itself
    // the parent of the second attempt served.
    let second_spans = spans_of(&report);
    let recover = named(&second_spans, &trace, "mcp_persist.recover tools/call");
    assert_eq!(recover.len(), 1, "{second_spans:?}");
    assert_eq!(recover[0]["attributes"]["mcp_persist.recovery"], "reissue");
    let resent = named(&second_spans, &trace, "tools/call charge");
    assert_eq!(resent.len(), 1, "{second_spans:?}");
    assert_eq!(resent[0]["kind"], "Client");
    assert_eq!(resent[0]["parent"], recover[0]["span"]);
    let (again, first_attempt): (Vec<&Value>, Vec<&Value>) = served
        .iter()
        .copied()
        .partition(|s| s["parent"] == resent[0]["span"]);
    assert_eq!(again.len(), 1, "the call sent again was served: {served:?}");
    assert_eq!(first_attempt.len(), 1, "{served:?}");
    assert_eq!(recover[0]["parent"], first_attempt[0]["parent"]);
    assert_ne!(
        first_attempt[0]["parent"], prepare["parent"],
        "the first attempt's parent is the first process's request span, not its job"
    );

    // And the server recorded both attempts' durations.
    let points = meters.read();
    assert_eq!(
        total(
            &points,
            "mcp.server.operation.duration",
            &[
                ("mcp.method.name", "tools/call"),
                ("gen_ai.tool.name", "charge")
            ]
        ),
        2.0
    );
    Ok(())
}

/// A 2026-07-28 JSON-RPC call over raw HTTP carrying `traceparent`; the
/// JSON-RPC response.
async fn rpc(
    url: &str,
    traceparent: &str,
    method: &str,
    mut params: Value,
) -> anyhow::Result<Value> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "otel-test", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        },
        "traceparent": traceparent,
    });
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let text = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .header("x-demo-user", "alice")
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    support::response_of(&text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_taken_over_by_another_instance_continues_the_trace_of_its_request()
-> anyhow::Result<()> {
    otel_support::spans();
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    let runs_file = dir.path().join("runs");
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.to_str().context("utf-8")?,
        "--liveness-grace-ms",
        "1000",
        "--runs-file",
        runs_file.to_str().context("utf-8")?,
    ];
    let mut a = support::Instance::process(&args).await?;
    let meters = Meters::new();
    let stores = Stores::new(mcp_persist_store_sqlite::SqliteStore::open(&db).await?)
        .with_telemetry(meters.telemetry());
    let b = url(instance(stores.clone(), &args).await?);

    let (trace, traceparent) = root_traceparent();
    let created = rpc(
        &a.url(),
        &traceparent,
        "tools/call",
        json!({"name": "long_job", "arguments": {"steps": 20, "step_ms": 100, "tag": "otel"}}),
    )
    .await?;
    let task = created["result"]["taskId"]
        .as_str()
        .with_context(|| format!("not a task: {created}"))?
        .to_owned();
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.kill().await?;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = rpc(&b, &traceparent, "tasks/get", json!({"taskId": task})).await?;
        if got["result"]["status"] == "completed" {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "not completed: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The record keeps the creating request's span: A's server span, a
    // child of the client's traceparent.
    let record = stores
        .tasks()?
        .load(&TaskId::new(task.clone())?)
        .await?
        .context("the task record")?
        .record;
    let kept = record.traceparent.clone().context("a traceparent kept")?;
    let parts: Vec<&str> = kept.split('-').collect();
    assert_eq!(parts[1], trace, "the task's trace is the request's");
    let takeover = named(&finished(), &trace, "mcp_persist.task.takeover")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(takeover.len(), 1, "one takeover run");
    assert_eq!(
        takeover[0]["parent"], parts[2],
        "a child of the creating request"
    );
    assert_eq!(
        takeover[0]["attributes"]["mcp_persist.task.generation"],
        "2"
    );

    let points = meters.read();
    assert_eq!(total(&points, "mcp_persist.tasks.takeovers", &[]), 1.0);
    assert_eq!(
        total(
            &points,
            "mcp_persist.tasks.transitions",
            &[("mcp_persist.task.status", "completed")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &points,
            "mcp_persist.tasks.transitions",
            &[("mcp_persist.task.status", "working")]
        ),
        0.0,
        "created on A, whose metrics are not these"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_metrics_an_operator_watches_count_what_happened() -> anyhow::Result<()> {
    otel_support::spans();
    let memory = MemoryStore::new();
    let (meters_a, meters_b) = (Meters::new(), Meters::new());
    let a = url(instance(
        Stores::new(memory.clone()).with_telemetry(meters_a.telemetry()),
        &["--liveness-grace-ms", "1000"],
    )
    .await?);
    let b = url(instance(
        Stores::new(memory.clone()).with_telemetry(meters_b.telemetry()),
        &["--liveness-grace-ms", "1000"],
    )
    .await?);
    let http = reqwest::Client::new();

    // A legacy session on A: a call with 5 progress events, answered on
    // its POST stream. Stored: the priming event, 5 progress events and the
    // response.
    let session = raw_initialize(&http, &a, "carol").await?;
    let (status, body) = raw_post(
        &http,
        &a,
        "carol",
        &session,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "slow_progress", "arguments": {"count": 5, "delay_ms": 5},
                          "_meta": {"progressToken": "p"}}}),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let ids = event_ids(&body);
    assert_eq!(ids.len(), 6, "5 progress events and the answer: {body}");
    let appended = meters_a.total(
        "mcp_persist.events.appended",
        &[("mcp_persist.durability", "synced")],
    );
    assert_eq!(
        appended, 7.0,
        "the priming event, 5 progress events, the answer"
    );

    // Resumed on B after the second progress event: B restores the session
    // from the store and replays the 4 events after it.
    let (status, replay) = raw_resume(&http, &b, "carol", &session, &ids[1]).await?;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(event_ids(&replay), ids[2..].to_vec());
    let points = meters_b.read();
    assert_eq!(
        total(
            &points,
            "mcp_persist.sessions.restored",
            &[("mcp_persist.side", "server")]
        ),
        1.0
    );
    assert_eq!(total(&points, "mcp_persist.events.replayed", &[]), 4.0);
    assert_eq!(
        total(
            &meters_a.read(),
            "mcp.server.operation.duration",
            &[("mcp.method.name", "tools/call")]
        ),
        1.0
    );
    assert!(
        total(
            &points,
            "mcp_persist.store.operation.duration",
            &[("db.system.name", "memory")]
        ) > 0.0,
        "{points:?}"
    );
    // Each sample names the kind of record read (the replay's events),
    // never the key.
    assert!(
        total(
            &points,
            "mcp_persist.store.operation.duration",
            &[
                ("db.operation.name", "read_after"),
                ("mcp_persist.record.kind", "event")
            ]
        ) > 0.0,
        "{points:?}"
    );

    // A bus notice published on A reaches both instances.
    let (status, _) = raw_post(
        &http,
        &a,
        "carol",
        &session,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "touch_tools", "arguments": {}}}),
    )
    .await?;
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while meters_b.total("mcp_persist.bus.lag", &[]) < 1.0
        || meters_a.total("mcp_persist.bus.lag", &[]) < 1.0
    {
        anyhow::ensure!(Instant::now() < deadline, "the notice was not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(meters_b.total("mcp_persist.bus.lag", &[]), 1.0);
    // Each instance's delivery is a child of the publication, in its trace
    // (a delivery's span ends just after its lag is recorded).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans = finished();
        let publish = spans
            .iter()
            .filter(|s| s["name"] == "mcp_persist.bus.publish")
            .find(|p| {
                spans
                    .iter()
                    .any(|s| s["name"] == "tools/call touch_tools" && s["span"] == p["parent"])
            })
            .context("the publication, a child of the call that published")?;
        let deliveries: Vec<&Value> = spans
            .iter()
            .filter(|s| s["name"] == "mcp_persist.bus.deliver" && s["parent"] == publish["span"])
            .collect();
        assert!(deliveries.iter().all(|d| d["trace"] == publish["trace"]));
        if deliveries.len() == 2 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "one delivery per instance: {deliveries:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A task running on A that another instance takes over behind A's
    // back: A finds its lease lost and stops the operation.
    let (_, traceparent) = root_traceparent();
    let task = start_long_job(&a, &traceparent).await?;
    assert_eq!(
        meters_a.total(
            "mcp_persist.tasks.transitions",
            &[("mcp_persist.task.status", "working")]
        ),
        1.0
    );
    let store = Stores::new(memory.clone()).tasks()?;
    take_over_elsewhere(&store, &task).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while meters_a.total("mcp_persist.leases.lost", &[]) < 1.0 {
        anyhow::ensure!(Instant::now() < deadline, "the lost lease was not noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Starts the demo's `long_job` (100 steps of 100 ms) as a task on the
/// server at `url`; its id.
async fn start_long_job(url: &str, traceparent: &str) -> anyhow::Result<TaskId> {
    let created = rpc(
        url,
        traceparent,
        "tools/call",
        json!({"name": "long_job", "arguments": {"steps": 100, "step_ms": 100}}),
    )
    .await?;
    Ok(TaskId::new(
        created["result"]["taskId"]
            .as_str()
            .with_context(|| format!("not a task: {created}"))?,
    )?)
}

/// Hands `task` to a silent instance "elsewhere", behind the back of the
/// instance running it: the next generation, leased for a minute.
async fn take_over_elsewhere(store: &TaskStore, task: &TaskId) -> anyhow::Result<()> {
    let taken = store
        .update(task, |record| {
            record.take_over(
                "elsewhere".to_owned(),
                Timestamp::now().plus(Duration::from_secs(60)),
            )?;
            Ok(true)
        })
        .await?;
    assert!(matches!(taken, TaskUpdate::Updated(_)));
    Ok(())
}

/// A task taken over behind its instance's back, on an instance whose
/// task watchers read their inbox only once a minute: the fenced run finds
/// out before its watcher looks, from its own refused progress write or
/// from the sweep taking the task back from the silent new owner. That
/// lease was lost all the same, and is counted once; the run taken back,
/// cancelled, loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_lost_to_a_takeover_is_counted_however_the_run_finds_out() -> anyhow::Result<()> {
    otel_support::spans();
    let memory = MemoryStore::new();
    let meters = Meters::new();
    let options = demo::Options::parse(["--liveness-grace-ms", "1000"].map(String::from))?;
    let stores = Stores::new(memory.clone()).with_telemetry(meters.telemetry());
    let server = demo::durable_server(stores, &options)?;
    let tasks = demo::register_tasks(server.tasks(), &options)
        .inbox_poll(Duration::from_secs(60))
        .start()
        .await?;
    let counters = Arc::new(demo::Counters::default());
    let service = server
        .service(move || Ok(demo::DemoHandler::new(counters.clone()).with_tasks(tasks.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let a = url(listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await;
    });

    let (_, traceparent) = root_traceparent();
    let task = start_long_job(&a, &traceparent).await?;
    let store = Stores::new(memory.clone()).tasks()?;
    take_over_elsewhere(&store, &task).await?;
    // The sweep takes the task back from the silent "elsewhere".
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let record = store.load(&task).await?.context("the task")?.record;
        if record.owner.generation > 2 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sweep did not take the task back: {:?}",
            record.owner
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while meters.total("mcp_persist.leases.lost", &[]) < 1.0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the lease lost to the takeover was not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = rpc(
        &a,
        &traceparent,
        "tasks/cancel",
        json!({"taskId": task.as_str()}),
    )
    .await?;
    anyhow::ensure!(
        cancelled.get("result").is_some(),
        "not cancelled: {cancelled}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store
        .load(&task)
        .await?
        .context("the task")?
        .record
        .status
        .is_terminal()
    {
        anyhow::ensure!(Instant::now() < deadline, "the cancelled task did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        meters.total("mcp_persist.leases.lost", &[]),
        1.0,
        "one lease lost, counted once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_counts_its_journal_its_requests_and_its_restored_session() -> anyhow::Result<()>
{
    otel_support::spans();
    let server = support::Instance::in_process(Stores::new(MemoryStore::new()), &[]).await?;
    let meters = Meters::new();
    let stores = Stores::new(MemoryStore::new()).with_telemetry(meters.telemetry());
    let call = |delay: u64| {
        CallToolRequestParams::new("slow_progress").with_arguments(
            json!({"count": 1, "delay_ms": delay})
                .as_object()
                .cloned()
                .expect("object"),
        )
    };

    // First process: a session, and a call journaled while it runs.
    {
        let (transport, handle) = DurableClientBuilder::new(server.url(), &stores)
            .build()
            .await?;
        let client = rmcp::ServiceExt::serve((), transport).await?;
        let peer = client.peer().clone();
        let slow = tokio::spawn(async move { peer.call_tool(call(800)).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        while meters.total("mcp_persist.journal.pending", &[]) < 1.0 {
            anyhow::ensure!(Instant::now() < deadline, "the call was never pending");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        slow.await??;
        handle.flush().await;
        assert_eq!(meters.total("mcp_persist.journal.pending", &[]), 0.0);
        assert_eq!(
            meters.total(
                "mcp_persist.sessions.restored",
                &[("mcp_persist.side", "client")]
            ),
            0.0
        );
        client.cancel().await?;
    }
    // Second process: the stored session is taken up.
    let (transport, _handle) = DurableClientBuilder::new(server.url(), &stores)
        .build()
        .await?;
    let client = rmcp::ServiceExt::serve((), transport).await?;
    client.call_tool(call(0)).await?;
    client.cancel().await?;
    let points = meters.read();
    assert_eq!(
        total(
            &points,
            "mcp_persist.sessions.restored",
            &[("mcp_persist.side", "client")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &points,
            "mcp.client.operation.duration",
            &[
                ("mcp.method.name", "tools/call"),
                ("gen_ai.tool.name", "slow_progress")
            ]
        ),
        2.0
    );
    assert_eq!(
        total(
            &points,
            "mcp.client.operation.duration",
            &[("mcp.method.name", "initialize")]
        ),
        2.0,
        "one real initialize, one answered from the store"
    );
    // The client's request spans carry the session hashed, never raw.
    let key = ServerKey::new(&server.url(), "default")?;
    let stored = stores
        .client_state()
        .session(&key)
        .await?
        .context("a stored session")?
        .record
        .session_id;
    let hashed = mcp_persist_core::telemetry::hash_session_id(stored.as_str());
    let spans = finished();
    let ours: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "tools/call slow_progress" && s["kind"] == "Client")
        .filter(|s| s["attributes"]["mcp.session.id"] == hashed.as_str())
        .collect();
    assert_eq!(ours.len(), 2, "both calls' spans carry the hashed session");
    assert!(
        spans
            .iter()
            .all(|s| !s["attributes"].to_string().contains(stored.as_str())),
        "a raw session id in a span attribute"
    );
    Ok(())
}
