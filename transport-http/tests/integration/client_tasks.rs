//! Task-augmented calls (SEP-2663) across a client restart, against rmcp's
//! own in-memory `TaskManager` server: the durable client journals the task
//! id the server answered with; after a SIGKILL a new process collects the
//! task's result by polling `tasks/get`, without calling the tool again. A
//! task waiting for input is handed to the application; a task the server
//! no longer knows is reported as lost, never sent again.
//!
//! The crash test runs this binary as its own child: a test function
//! started with `MCP_PERSIST_TASK_CHILD` set plays a client process.

use std::{
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use mcp_persist_core::{
    ClientStateStore, InFlightRequest, RequestId, ServerKey, SessionId, Stores,
};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::client::{
    DurableClientBuilder, Recovery, RecoveryError, TaskOutcome,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        ClientCapabilities, ClientConfig, ContentBlock, CreateTaskResult, GetTaskParams,
        GetTaskResult, Implementation, InputRequest, ServerCapabilities, ServerConfig,
        ServerResult, UpdateTaskParams,
    },
    service::RequestContext,
    task_manager::{TaskManager, TaskOptions},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const CHILD_ENV: &str = "MCP_PERSIST_TASK_CHILD";

/// A server that runs `long` and `ask` as tasks on rmcp's `TaskManager`.
#[derive(Clone)]
struct TaskServer {
    tasks: TaskManager,
    /// How many `tools/call` requests reached the handler.
    calls: Arc<AtomicUsize>,
    /// How many task operations ran to their end.
    finished: Arc<AtomicUsize>,
}

impl ServerHandler for TaskServer {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let declared = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        if !declared {
            return Err(ErrorData::invalid_params("declare tasks", None));
        }
        let finished = self.finished.clone();
        let options = TaskOptions::new().with_poll_interval_ms(50);
        let task = match request.name.as_ref() {
            "long" => self.tasks.spawn(options, move |_ctx| {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok(CallToolResult::success(vec![ContentBlock::text(
                        "long done",
                    )]))
                })
            }),
            "ask" => self.tasks.spawn(options, move |ctx| {
                Box::pin(async move {
                    let answer = ctx.request_input("roots", roots_request()).await?;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                        "got {answer}"
                    ))]))
                })
            }),
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&request.task_id)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }
}

struct Server {
    url: String,
    handler: TaskServer,
    ct: tokio_util::sync::CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

async fn start_server() -> Server {
    let handler = TaskServer {
        tasks: TaskManager::new(),
        calls: Arc::default(),
        finished: Arc::default(),
    };
    let ct = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(1)))
        .with_cancellation_token(ct.child_token());
    let factory = handler.clone();
    let service = StreamableHttpService::new(
        move || Ok(factory.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let stop = ct.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Server {
        url: format!("http://{addr}/mcp"),
        handler,
        ct,
    }
}

/// What the `ask` task asks the client for: any input request will do, and
/// `roots/list` needs no parameters (deprecated by SEP-2577, still valid).
#[allow(deprecated)]
fn roots_request() -> InputRequest {
    InputRequest::ListRoots(rmcp::model::ListRootsRequest::default())
}

/// A client that declares the tasks extension.
fn tasks_client() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("task-test-client", "1.0.0"),
    )
}

fn text_of(result: &ServerResult) -> String {
    match result {
        ServerResult::CallToolResult(r) => r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default(),
        other => panic!("not a CallToolResult: {other:?}"),
    }
}

async fn sqlite(dir: &str) -> Stores {
    Stores::new(
        SqliteStore::open(std::path::Path::new(dir).join("state.db"))
            .await
            .expect("open sqlite"),
    )
}

/// The client processes of the crash test. Each prints JSON lines.
#[tokio::test]
async fn child_process() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return; // only meaningful as a child of the crash test
    };
    let url = std::env::var("URL").expect("URL");
    let dir = std::env::var("DIR").expect("DIR");
    let stores = sqlite(&dir).await;
    let (transport, handle) = DurableClientBuilder::new(&url, &stores)
        .build()
        .await
        .expect("build");
    let modern = role.starts_with("modern");
    let serve = |transport| async move {
        if modern {
            rmcp::service::ClientServiceExt::serve_with_lifecycle(
                tasks_client(),
                transport,
                rmcp::service::ClientLifecycleMode::Discover {
                    preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .expect("serve")
        } else {
            tasks_client().serve(transport).await.expect("serve")
        }
    };
    match role.as_str() {
        "first" | "modern_first" => {
            let client = serve(transport).await;
            let response = client
                .peer()
                .call_tool_once(CallToolRequestParams::new("long"))
                .await
                .expect("call");
            let CallToolResponse::Task(created) = response else {
                panic!("expected a task, got {response:?}");
            };
            handle.flush().await;
            println!("{}", json!({"task_id": created.task.task_id}));
            // Killed here, before it ever polls.
            std::future::pending::<()>().await;
        }
        "modern_second" => {
            let client = serve(transport).await;
            println!(
                "{}",
                json!({"interrupted": handle.interrupted().iter().map(|r| json!({
                    "method": r.method, "task_id": r.task_id,
                })).collect::<Vec<_>>()})
            );
            for recovery in handle.recover() {
                let Recovery::Task(task) = recovery else {
                    panic!("expected a task: {recovery:?}");
                };
                let outcome = task.collect_with(client.peer()).await.expect("collected");
                let TaskOutcome::Answer(Ok(result)) = outcome else {
                    panic!("expected a result: {outcome:?}");
                };
                println!(
                    "{}",
                    json!({"task_id": task.task_id(), "text": text_of(&result)})
                );
            }
            handle.flush().await;
            println!(
                "{}",
                json!({"interrupted_after": handle.interrupted().len()})
            );
            client.cancel().await.expect("close");
        }
        "second" => {
            let interrupted = handle.interrupted();
            println!(
                "{}",
                json!({"interrupted": interrupted.iter().map(|r| json!({
                    "method": r.method, "task_id": r.task_id,
                })).collect::<Vec<_>>()})
            );
            // Collected before `serve`: it needs no running service.
            for recovery in handle.recover() {
                let Recovery::Task(task) = recovery else {
                    panic!("expected a task: {recovery:?}");
                };
                let outcome = task.collect().await.expect("collected");
                let TaskOutcome::Answer(Ok(result)) = outcome else {
                    panic!("expected a result: {outcome:?}");
                };
                println!(
                    "{}",
                    json!({"task_id": task.task_id(), "text": text_of(&result)})
                );
            }
            handle.flush().await;
            println!(
                "{}",
                json!({"interrupted_after": handle.interrupted().len()})
            );
        }
        other => panic!("unknown role {other}"),
    }
}

struct Child {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    fn spawn(role: &str, url: &str, dir: &str) -> Child {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("exe"))
            .arg(crate::support::test_path(module_path!(), "child_process"))
            .args(["--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .env("URL", url)
            .env("DIR", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        Child {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next JSON object the child printed (the test harness prints
    /// other lines, and may start a line with the test's name).
    async fn json(&mut self) -> Value {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .expect("child answered in time")
                .expect("read child")
                .expect("child printed a line");
            let Some(start) = line.find('{') else {
                continue;
            };
            if let Ok(value) = serde_json::from_str::<Value>(&line[start..])
                && value.is_object()
            {
                return value;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_result_is_collected_after_a_sigkill_without_calling_again() {
    crash_story("").await;
}

/// The same with the 2026-07-28 revision: no session, the task journaled
/// all the same, collected through the new process's running client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_task_result_is_collected_after_a_sigkill() {
    crash_story("modern_").await;
}

async fn crash_story(prefix: &str) {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let server = start_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().to_str().expect("utf-8 path").to_owned();

    let mut first = Child::spawn(&format!("{prefix}first"), &server.url, &dir_s);
    let created = first.json().await;
    let task_id = created["task_id"].as_str().expect("task id").to_owned();
    first.child.start_kill().expect("SIGKILL");
    first.child.wait().await.expect("reaped");

    let mut second = Child::spawn(&format!("{prefix}second"), &server.url, &dir_s);
    let listed = second.json().await;
    let interrupted = listed["interrupted"].as_array().expect("list");
    assert_eq!(interrupted.len(), 1, "{listed}");
    assert_eq!(interrupted[0]["method"], "tools/call");
    assert_eq!(interrupted[0]["task_id"], task_id.as_str(), "{listed}");
    let collected = second.json().await;
    assert_eq!(collected["task_id"], task_id.as_str());
    assert_eq!(collected["text"], "long done", "{collected}");
    let after = second.json().await;
    assert_eq!(after["interrupted_after"], 0);
    second.child.wait().await.expect("second exits");

    assert_eq!(
        server.handler.calls.load(Ordering::SeqCst),
        1,
        "the tool was called once"
    );
    assert_eq!(server.handler.finished.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_task_waiting_for_input_is_handed_to_the_application() {
    let server = start_server().await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.expect("sqlite"));
    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    let client = tasks_client().serve(transport).await.expect("serve");
    let response = client
        .peer()
        .call_tool_once(CallToolRequestParams::new("ask"))
        .await
        .expect("call");
    assert!(matches!(response, CallToolResponse::Task(_)));
    handle.flush().await;
    // The process goes away without polling (a clean close keeps the session).
    client.cancel().await.expect("close");

    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .recovery_timing(Duration::from_secs(10), Duration::from_millis(20))
        .build()
        .await
        .expect("build");
    let client = tasks_client().serve(transport).await.expect("serve");
    let recoveries = handle.recover();
    assert_eq!(recoveries.len(), 1);
    let Some(Recovery::Task(task)) = recoveries.into_iter().next() else {
        panic!("expected a task");
    };
    let outcome = task.collect().await.expect("collect");
    let TaskOutcome::InputRequired(requests) = outcome else {
        panic!("expected input_required, got {outcome:?}");
    };
    assert!(requests.contains_key("roots"), "{requests:?}");
    assert_eq!(handle.interrupted().len(), 1, "still listed while waiting");

    // The application answers through rmcp, then collects the result.
    let mut responses = std::collections::BTreeMap::new();
    responses.insert("roots".to_owned(), json!({"roots": []}));
    client
        .peer()
        .update_task(UpdateTaskParams::new(task.task_id(), responses))
        .await
        .expect("tasks/update");
    let outcome = task.collect().await.expect("collect");
    let TaskOutcome::Answer(Ok(result)) = outcome else {
        panic!("expected a result, got {outcome:?}");
    };
    assert!(text_of(&result).starts_with("got "), "{result:?}");
    assert!(handle.interrupted().is_empty());
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 1);
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn a_task_the_server_no_longer_knows_is_lost_and_not_sent_again() {
    let server = start_server().await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.expect("sqlite"));
    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    let client = tasks_client().serve(transport).await.expect("serve");
    let session = handle.session_id().expect("session");
    handle.flush().await;
    client.cancel().await.expect("close");
    // A task the server has since forgotten (expired, or lost in a restart).
    let key = ServerKey::new(&server.url, "default").expect("key");
    let mut request = InFlightRequest::new(
        RequestId::Number(700),
        "tools/call",
        Some(json!({"name": "long"})),
    );
    request.task_id = Some("no-such-task".into());
    ClientStateStore::clone(&stores.client_state())
        .record_inflight(&key, &session, &request)
        .await
        .expect("journal");

    let (_transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    let Some(Recovery::Task(task)) = handle.recover().into_iter().next() else {
        panic!("expected a task");
    };
    let error = task.collect().await.expect_err("lost");
    assert!(
        matches!(error, RecoveryError::TaskLost { ref task_id, .. } if task_id == "no-such-task"),
        "{error:?}"
    );
    assert_eq!(
        handle.interrupted(),
        vec![request],
        "listed for the application"
    );
    assert_eq!(
        server.handler.calls.load(Ordering::SeqCst),
        0,
        "nothing sent again"
    );
}

#[tokio::test]
async fn a_task_polled_to_its_end_by_the_application_leaves_the_journal() {
    let server = start_server().await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.expect("sqlite"));
    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    let client = tasks_client().serve(transport).await.expect("serve");
    let CallToolResponse::Task(created) = client
        .peer()
        .call_tool_once(CallToolRequestParams::new("long"))
        .await
        .expect("call")
    else {
        panic!("expected a task");
    };
    handle.flush().await;
    let key = ServerKey::new(&server.url, "default").expect("key");
    let session = handle.session_id().expect("session");
    let journaled = stores
        .client_state()
        .inflight(&key, &session)
        .await
        .expect("read");
    assert_eq!(journaled.len(), 1, "journaled with its task id");
    assert_eq!(
        journaled[0].task_id.as_deref(),
        Some(created.task.task_id.as_str())
    );
    loop {
        let got = client
            .peer()
            .get_task(GetTaskParams::new(created.task.task_id.clone()))
            .await
            .expect("tasks/get");
        if got.task.status().is_terminal() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.flush().await;
    assert!(
        stores
            .client_state()
            .inflight(&key, &session)
            .await
            .expect("read")
            .is_empty(),
        "a task the application saw end is not interrupted work"
    );
    client.cancel().await.expect("close");
}

/// The same against a server spoken to in the 2026-07-28 revision, which
/// has no sessions: the task is journaled all the same, and a new process
/// collects it through its running client.
#[tokio::test]
async fn a_task_of_a_server_without_sessions_is_collected_after_a_restart() {
    let server = start_server().await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.expect("sqlite"));
    let modern = || rmcp::service::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    let client =
        rmcp::service::ClientServiceExt::serve_with_lifecycle(tasks_client(), transport, modern())
            .await
            .expect("serve");
    let CallToolResponse::Task(created) = client
        .peer()
        .call_tool_once(CallToolRequestParams::new("long"))
        .await
        .expect("call")
    else {
        panic!("expected a task");
    };
    assert_eq!(handle.session_id(), None, "no session in this revision");
    handle.flush().await;
    client.cancel().await.expect("close");

    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .recovery_timing(Duration::from_secs(10), Duration::from_millis(20))
        .build()
        .await
        .expect("build");
    let interrupted = handle.interrupted();
    assert_eq!(interrupted.len(), 1, "{interrupted:?}");
    assert_eq!(interrupted[0].method, "tools/call");
    assert_eq!(
        interrupted[0].task_id.as_deref(),
        Some(created.task.task_id.as_str())
    );
    let client =
        rmcp::service::ClientServiceExt::serve_with_lifecycle(tasks_client(), transport, modern())
            .await
            .expect("serve");
    let Some(Recovery::Task(task)) = handle.recover().into_iter().next() else {
        panic!("expected a task");
    };
    assert!(matches!(
        task.collect().await,
        Err(RecoveryError::NeedsClient)
    ));
    let outcome = task.collect_with(client.peer()).await.expect("collect");
    let TaskOutcome::Answer(Ok(result)) = outcome else {
        panic!("expected a result, got {outcome:?}");
    };
    assert_eq!(text_of(&result), "long done");
    handle.flush().await;
    assert!(handle.interrupted().is_empty());
    let (_transport, after) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    assert!(
        after.interrupted().is_empty(),
        "collected tasks leave the store"
    );
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 1);
    client.cancel().await.expect("close");
}

/// The journal of a server without sessions has always been stored under
/// the session component `sessionless`. An entry an earlier version left
/// there (planted here, for a task a plain rmcp client started) is listed
/// after an upgrade as a task of a server without sessions, not as a
/// request of a lost session: it stays listed across a restart that does
/// not collect it, is collected through the running client, and is gone
/// from the store after that.
#[tokio::test]
async fn a_task_journaled_by_an_earlier_version_without_sessions_is_collected() {
    let server = start_server().await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.expect("sqlite"));
    let modern = || rmcp::service::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    let plain = rmcp::service::ClientServiceExt::serve_with_lifecycle(
        tasks_client(),
        rmcp::transport::StreamableHttpClientTransport::from_uri(server.url.as_str()),
        modern(),
    )
    .await
    .expect("serve");
    let CallToolResponse::Task(created) = plain
        .peer()
        .call_tool_once(CallToolRequestParams::new("long"))
        .await
        .expect("call")
    else {
        panic!("expected a task");
    };
    plain.cancel().await.expect("close");
    let key = ServerKey::new(&server.url, "default").expect("key");
    let mut planted = InFlightRequest::new(
        RequestId::String("p1f2e3-0".into()),
        "tools/call",
        Some(json!({"name": "long"})),
    );
    planted.task_id = Some(created.task.task_id.clone());
    stores
        .client_state()
        .record_inflight(
            &key,
            &SessionId::new("sessionless").expect("session id"),
            &planted,
        )
        .await
        .expect("plant");

    // A first process after the upgrade lists it and leaves it.
    let (first, handle) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    assert_eq!(handle.interrupted(), vec![planted.clone()]);
    let Some(Recovery::Task(task)) = handle.recover().into_iter().next() else {
        panic!("expected a task, not a request of a lost session");
    };
    assert!(matches!(
        task.collect().await,
        Err(RecoveryError::NeedsClient)
    ));
    drop((task, handle, first));

    // The next one lists it again, and collects it.
    let (transport, handle) = DurableClientBuilder::new(&server.url, &stores)
        .recovery_timing(Duration::from_secs(10), Duration::from_millis(20))
        .build()
        .await
        .expect("build");
    assert_eq!(handle.interrupted(), vec![planted]);
    let client =
        rmcp::service::ClientServiceExt::serve_with_lifecycle(tasks_client(), transport, modern())
            .await
            .expect("serve");
    let Some(Recovery::Task(task)) = handle.recover().into_iter().next() else {
        panic!("expected a task");
    };
    assert_eq!(task.task_id(), created.task.task_id);
    let TaskOutcome::Answer(Ok(result)) = task.collect_with(client.peer()).await.expect("collect")
    else {
        panic!("expected a result");
    };
    assert_eq!(text_of(&result), "long done");
    handle.flush().await;
    client.cancel().await.expect("close");

    let (_transport, after) = DurableClientBuilder::new(&server.url, &stores)
        .build()
        .await
        .expect("build");
    assert!(after.interrupted().is_empty());
    assert!(
        stores
            .client_state()
            .journal(&key)
            .await
            .expect("journal")
            .is_empty(),
        "the collected entry left the store"
    );
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 1);
}
