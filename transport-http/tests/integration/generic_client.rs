//! What a generic client (one that declares little, such as the MCP
//! Inspector) meets on the durable server, in both protocol revisions and on
//! either of two instances sharing one store:
//!
//! * a request for a capability it never declared is refused at once, as a
//!   tool error or a `failed` task, instead of hanging the call;
//! * the handler sees the client of the request itself (its `_meta` on
//!   2026-07-28), not a placeholder;
//! * the example server names itself, takes `--help`, and works for a
//!   client that sends no progress token.

use crate::support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::slow_store::SlowStore;
use crate::support::{demo, raw_initialize_as, response_of};
use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, Stores};
use rmcp::{
    ClientHandler, ErrorData, RoleClient, ServiceExt,
    model::{
        ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
        Implementation,
    },
    service::RequestContext,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};

/// How long a refused request may take, at most, in these tests: far less
/// than any client's request timeout, far more than a loaded machine needs.
const AT_ONCE: Duration = Duration::from_secs(10);

/// Two in-process instances of the example server, with its task runtime,
/// on one memory store.
struct Fleet {
    a: String,
    b: String,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn serve(stores: Stores) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let options = demo::Options::parse(["--liveness-grace-ms".to_owned(), "1000".to_owned()])?;
    let router =
        demo::durable_router_with_tasks(stores, &options, Arc::new(demo::Counters::default()))
            .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, task))
}

async fn fleet() -> anyhow::Result<Fleet> {
    let stores = Stores::new(MemoryStore::new());
    let (a, ta) = serve(stores.clone()).await?;
    let (b, tb) = serve(stores).await?;
    Ok(Fleet {
        a,
        b,
        _tasks: vec![ta, tb],
    })
}

/// A legacy (2025-11-25) request on `session`, answered within [`AT_ONCE`].
async fn legacy(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    method: &str,
    params: Value,
) -> anyhow::Result<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": params});
    let (status, text) = tokio::time::timeout(
        AT_ONCE,
        support::raw_post(http, url, "alice", session, body),
    )
    .await
    .with_context(|| format!("{method} was not answered within {AT_ONCE:?}"))??;
    anyhow::ensure!(status == 200, "{method} answered HTTP {status}: {text}");
    response_of(&text)
}

/// A 2026-07-28 request from a client named `client` declaring
/// `capabilities`, answered within [`AT_ONCE`].
async fn modern(
    http: &reqwest::Client,
    url: &str,
    client: &str,
    capabilities: Value,
    method: &str,
    mut params: Value,
) -> anyhow::Result<Value> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": client, "version": "9.9" },
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    let mut request = http
        .post(url)
        .header("x-demo-user", "alice")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
    {
        request = request.header("mcp-name", name);
    }
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params});
    let response = tokio::time::timeout(AT_ONCE, async {
        let response = request.body(body.to_string()).send().await?;
        anyhow::Ok(response.text().await?)
    })
    .await
    .with_context(|| format!("{method} was not answered within {AT_ONCE:?}"))??;
    response_of(&response)
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A legacy client that declared neither elicitation nor sampling: a tool
/// that asks it for either gets a tool error at once naming the missing
/// capability, on the instance that created the session and on the one
/// that restores it from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_requests_for_undeclared_capabilities_are_refused_at_once() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let http = reqwest::Client::new();
    let session = raw_initialize_as(&http, &fleet.a, "alice", "bare-client").await?;
    for url in [&fleet.a, &fleet.b] {
        let answer = legacy(
            &http,
            url,
            &session,
            "tools/call",
            json!({"name": "ask_name", "arguments": {}}),
        )
        .await?;
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        assert!(
            text_of(&answer).contains("`elicitation`"),
            "the refusal names the capability: {answer}"
        );
        let answer = legacy(
            &http,
            url,
            &session,
            "tools/call",
            json!({"name": "ask_sampling", "arguments": {"prompt": "hi"}}),
        )
        .await?;
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        assert!(
            text_of(&answer).contains("`sampling`"),
            "the refusal names the capability: {answer}"
        );
    }
    Ok(())
}

/// An rmcp client that declares elicitation and answers "Zed".
#[derive(Clone)]
struct Answering;

impl ClientHandler for Answering {
    fn get_info(&self) -> ClientConfig {
        let capabilities = ClientCapabilities::builder().enable_elicitation().build();
        ClientConfig::new(capabilities, Implementation::new("answering-client", "2.0"))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"name": "Zed"})))
    }
}

/// The check refuses nothing a client declared: a client with elicitation is
/// asked, and its answer reaches the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_capability_is_still_asked() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-demo-user", "alice".parse()?);
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()?;
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(fleet.a.clone()),
    );
    let client = Answering.serve(transport).await?;
    let result = tokio::time::timeout(
        AT_ONCE,
        client.call_tool(rmcp::model::CallToolRequestParams::new("ask_name")),
    )
    .await
    .context("ask_name was not answered")??;
    let text = result.content[0].as_text().context("text")?.text.clone();
    assert_eq!(text, "Hello, Zed!", "{result:?}");
    client.cancel().await?;
    Ok(())
}

/// A 2026-07-28 task asking a client that declared the tasks extension but
/// not elicitation: the task ends `failed` at once with the refusal, as
/// every instance reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asking_for_an_undeclared_capability_fails_at_once() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let http = reqwest::Client::new();
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let task = created_task(&http, &fleet.a, "tasks-only", &caps, "ask_name").await?;
    let started = std::time::Instant::now();
    let failed = loop {
        let got = modern(
            &http,
            &fleet.b,
            "tasks-only",
            caps.clone(),
            "tasks/get",
            json!({"taskId": task}),
        )
        .await?;
        let status = got["result"]["status"].as_str().unwrap_or_default();
        assert_ne!(
            status, "input_required",
            "a question the client cannot answer was put to it: {got}"
        );
        if status == "failed" {
            break got;
        }
        anyhow::ensure!(
            started.elapsed() < AT_ONCE,
            "the task did not fail within {AT_ONCE:?}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let error = &failed["result"]["error"];
    assert_eq!(error["code"], -32021, "{failed}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("`elicitation`")),
        "{failed}"
    );
    // The same answer on the instance that ran it.
    let on_a = modern(
        &http,
        &fleet.a,
        "tasks-only",
        caps,
        "tasks/get",
        json!({"taskId": task}),
    )
    .await?;
    assert_eq!(on_a["result"]["status"], "failed", "{on_a}");
    Ok(())
}

/// `whoami` reports the client of the request: on 2026-07-28 the one its
/// `_meta` names (two clients in turn on one instance, each seeing itself),
/// on 2025-11-25 the session's, on either instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_sees_the_requests_own_client() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let http = reqwest::Client::new();
    for (client, caps) in [
        ("inspector-like", json!({})),
        ("sampler", json!({"sampling": {}})),
    ] {
        let answer = modern(
            &http,
            &fleet.a,
            client,
            caps.clone(),
            "tools/call",
            json!({"name": "whoami", "arguments": {}}),
        )
        .await?;
        let who: Value =
            serde_json::from_str(&text_of(&answer)).with_context(|| format!("whoami: {answer}"))?;
        assert_eq!(who["client"], client, "{who}");
        assert_eq!(who["clientVersion"], "9.9", "{who}");
        assert_eq!(who["capabilities"], caps, "{who}");
    }
    let session = raw_initialize_as(&http, &fleet.a, "alice", "legacy-client").await?;
    for url in [&fleet.a, &fleet.b] {
        let answer = legacy(
            &http,
            url,
            &session,
            "tools/call",
            json!({"name": "whoami", "arguments": {}}),
        )
        .await?;
        let who: Value = serde_json::from_str(&text_of(&answer))?;
        assert_eq!(who["client"], "legacy-client", "{who}");
        assert_eq!(who["session"], session.as_str(), "{who}");
    }
    Ok(())
}

/// The example names itself in `serverInfo`, and `slow_progress` without a
/// progress token is a call that sends no progress, in both revisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_names_itself_and_needs_no_progress_token() -> anyhow::Result<()> {
    let fleet = fleet().await?;
    let http = reqwest::Client::new();
    let response = http
        .post(&fleet.a)
        .header("x-demo-user", "alice")
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}
            })
            .to_string(),
        )
        .send()
        .await?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .context("session id")?
        .to_str()?
        .to_owned();
    let init = response_of(&response.text().await?)?;
    let info = &init["result"]["serverInfo"];
    assert_eq!(info["name"], "mcp-persist-example-server", "{init}");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"), "{init}");

    let args =
        json!({"name": "slow_progress", "arguments": {"count": 3, "delay_ms": 1, "tag": "quiet"}});
    let answer = legacy(&http, &fleet.b, &session, "tools/call", args.clone()).await?;
    assert_eq!(text_of(&answer), "done quiet", "{answer}");
    let answer = modern(&http, &fleet.b, "t", json!({}), "tools/call", args).await?;
    assert_eq!(text_of(&answer), "done quiet", "{answer}");
    Ok(())
}

/// `--help` (or `-h`, anywhere) asks for the usage, which lists every flag
/// the server takes; a bad flag or value is a one-line error.
#[test]
fn the_example_has_a_help_listing_its_flags() {
    for args in [vec!["--help"], vec!["--port", "1", "-h"]] {
        let command = demo::Command::parse(args.iter().map(|s| s.to_string())).expect("parses");
        assert!(matches!(command, demo::Command::Help), "{args:?}");
    }
    let flags: Vec<&str> = demo::USAGE
        .split_whitespace()
        .filter(|w| w.starts_with("--") && *w != "--help")
        .collect();
    for flag in [
        "--backend",
        "--store",
        "--redis-prefix",
        "--port",
        "--idle-ttl-ms",
        "--strict-sessions",
        "--sse-retry-ms",
        "--tail-idle-ms",
        "--event-retention-ms",
        "--event-max",
        "--pipelined-events",
        "--written-events",
        "--liveness-grace-ms",
        "--runs-file",
        "--rmcp-defaults",
    ] {
        assert!(flags.contains(&flag), "--help lists {flag}");
    }
    // Each listed flag is one the server takes.
    for flag in flags {
        let mut args = vec![flag.trim_end_matches(',').to_owned()];
        if demo::Options::parse(args.clone()).is_err() {
            args.push("1".to_owned());
        }
        demo::Options::parse(args.clone())
            .unwrap_or_else(|e| panic!("--help lists {args:?}, which does not parse: {e:#}"));
    }
    let bad =
        demo::Options::parse(["--port".to_owned(), "eighty".to_owned()]).expect_err("not a number");
    assert!(format!("{bad:#}").contains("--port"), "{bad:#}");
    let unknown = demo::Options::parse(["--bogus".to_owned()]).expect_err("unknown");
    assert!(format!("{unknown:#}").contains("--bogus"), "{unknown:#}");
}

/// The example opens its store through the URL registry: `--store URL`
/// alone, or the older `--backend NAME --store PATH`, name the same store,
/// so a second start finds what the first wrote; a malformed or unknown
/// store is a clear error, and a bad prefix never reaches a URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_opens_any_store_url_and_the_older_flags() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let parse = |args: &[&str]| demo::Options::parse(args.iter().map(|s| s.to_string()));
    let db = dir.path().join("state.db");
    let db = db.to_str().context("utf-8 path")?;
    let folder = dir.path().join("state");
    std::fs::create_dir(&folder)?;
    let folder = folder.to_str().context("utf-8 path")?;
    let (sqlite_url, file_url) = (format!("sqlite:{db}"), format!("file:{folder}"));
    let pairs = [
        (
            vec!["--store", sqlite_url.as_str()],
            vec!["--backend", "sqlite", "--store", db],
        ),
        (
            vec!["--store", file_url.as_str()],
            vec!["--backend", "file", "--store", folder],
        ),
    ];
    for (url_form, older_form) in pairs {
        let first = demo::open_stores(&parse(&url_form)?).await?;
        let made = first.shared_keys().get_or_create("demo").await?;
        drop(first);
        // The second start, by the other form, finds the first one's key.
        let second = demo::open_stores(&parse(&older_form)?).await?;
        let found = second.shared_keys().get_or_create("demo").await?;
        assert_eq!(
            found.active.id, made.active.id,
            "{older_form:?} does not see {url_form:?}'s key"
        );
    }
    assert_eq!(parse(&[])?.store_url()?, "memory:");
    assert_eq!(
        parse(&[
            "--backend",
            "redis",
            "--store",
            "redis://127.0.0.1:1/",
            "--redis-prefix",
            "a:b"
        ])?
        .store_url()?,
        "redis://127.0.0.1:1/?prefix=a:b"
    );
    for (args, says) in [
        (vec!["--store", "nosuch:x"], "sqlite:"),
        (vec!["--backend", "sqlite"], "needs --store"),
        (vec!["--backend", "memory", "--store", "x"], "no store"),
        (
            vec!["--backend", "oracle", "--store", "x"],
            "unknown backend",
        ),
        (
            vec!["--store", "redis://h/", "--redis-prefix", "a&b=c"],
            "--redis-prefix",
        ),
    ] {
        let err = match parse(&args) {
            Ok(options) => demo::open_stores(&options).await.expect_err("refused"),
            Err(e) => e,
        };
        assert!(format!("{err:#}").contains(says), "{args:?}: {err:#}");
    }
    Ok(())
}

/// A server whose one tool runs `ask_later` as a resumable task: the first
/// run waits, a run taken over by another instance does what [`Rerun`]
/// says.
#[derive(Clone)]
struct TakeoverHandler {
    tasks: mcp_persist_transport_http::server::DurableTasks,
}

impl rmcp::ServerHandler for TakeoverHandler {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        context: RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let created = self
            .tasks
            .spawn_resumable(
                &context,
                rmcp::task_manager::TaskOptions::default(),
                "ask_later",
                json!({}),
            )
            .await?;
        Ok(rmcp::model::CallToolResponse::Task(created))
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.tasks.get_task(request, &context).await
    }
}

/// What a run of `ask_later` taken over from a stopped instance does.
#[derive(Clone, Copy)]
enum Rerun {
    /// Asks the client for elicitation.
    Asks,
    /// Finishes after 100 ms.
    Finishes,
}

/// Every generation of `ask_later` that started, in order.
type Runs = Arc<Mutex<Vec<u64>>>;

/// A served instance: its URL, its task runtime and its server's task.
type Instance = (
    String,
    mcp_persist_transport_http::server::DurableTasks,
    tokio::task::JoinHandle<()>,
);

async fn takeover_instance(stores: Stores, rerun: Rerun, runs: Runs) -> anyhow::Result<Instance> {
    takeover_instance_polling(stores, rerun, runs, Duration::from_millis(500)).await
}

/// [`takeover_instance`] whose running tasks look at their records every
/// `inbox_poll` (and when their inbox rings).
async fn takeover_instance_polling(
    stores: Stores,
    rerun: Rerun,
    runs: Runs,
    inbox_poll: Duration,
) -> anyhow::Result<Instance> {
    let server = mcp_persist_transport_http::server::DurableServer::builder(stores)
        .liveness_grace(Duration::from_millis(300))
        .build()?;
    let tasks = server
        .tasks()
        .inbox_poll(inbox_poll)
        .resumable("ask_later", move |cx, _args| {
            let runs = runs.clone();
            Box::pin(async move {
                runs.lock().unwrap_or_else(|p| p.into_inner()).push(cx.generation());
                if cx.generation() == 1 {
                    // The first run never asks: it waits to be taken over.
                    std::future::pending::<()>().await;
                }
                if let Rerun::Finishes = rerun {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return Ok(rmcp::model::CallToolResult::success(vec![]));
                }
                let request = serde_json::from_value(json!({
                    "method": "elicitation/create",
                    "params": {"message": "Name?", "requestedSchema": {"type": "object", "properties": {}}}
                }))
                .map_err(|e| {
                    rmcp::task_manager::TaskExit::Error(ErrorData::internal_error(
                        e.to_string(),
                        None,
                    ))
                })?;
                cx.request_input("name", request).await?;
                Ok(rmcp::model::CallToolResult::success(vec![]))
            })
        })
        .start()
        .await?;
    let handler = TakeoverHandler {
        tasks: tasks.clone(),
    };
    let router =
        axum::Router::new().nest_service("/mcp", server.service(move || Ok(handler.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, tasks, task))
}

/// Calls `tool` on `url` as `client` (declaring `caps`), answered with a
/// task: the task's id.
async fn created_task(
    http: &reqwest::Client,
    url: &str,
    client: &str,
    caps: &Value,
    tool: &str,
) -> anyhow::Result<String> {
    let created = modern(
        http,
        url,
        client,
        caps.clone(),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    )
    .await?;
    Ok(created["result"]["taskId"]
        .as_str()
        .with_context(|| format!("not a task: {created}"))?
        .to_owned())
}

/// Starts `ask_later` as a task on the instance at `a` (as `client`,
/// declaring `caps`), then stops that instance: its lease is released, so
/// another instance takes the task over on its next poll. The task's id.
async fn started_then_stopped(
    http: &reqwest::Client,
    a: &str,
    client: &str,
    caps: &Value,
    tasks_a: mcp_persist_transport_http::server::DurableTasks,
    serve_a: tokio::task::JoinHandle<()>,
) -> anyhow::Result<String> {
    let task = created_task(http, a, client, caps, "ask_later").await?;
    tasks_a.shutdown().await;
    serve_a.abort();
    Ok(task)
}

/// The capabilities a client declared travel with its task: when the
/// instance running it stops and another instance runs it again, that run's
/// request for an undeclared capability is refused there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_taken_over_by_another_instance_knows_what_the_client_declared() -> anyhow::Result<()>
{
    let stores = Stores::new(MemoryStore::new());
    let runs = Runs::default();
    let (a, tasks_a, serve_a) =
        takeover_instance(stores.clone(), Rerun::Asks, runs.clone()).await?;
    let (b, _tasks_b, _serve_b) = takeover_instance(stores, Rerun::Asks, runs).await?;
    let http = reqwest::Client::new();
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let task = started_then_stopped(&http, &a, "tasks-only", &caps, tasks_a, serve_a).await?;
    let started = std::time::Instant::now();
    let failed = loop {
        let got = modern(
            &http,
            &b,
            "tasks-only",
            caps.clone(),
            "tasks/get",
            json!({"taskId": task}),
        )
        .await?;
        let status = got["result"]["status"].as_str().unwrap_or_default();
        assert_ne!(status, "input_required", "{got}");
        if status == "failed" {
            break got;
        }
        anyhow::ensure!(
            started.elapsed() < AT_ONCE,
            "the task was not taken over and refused within {AT_ONCE:?}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(failed["result"]["error"]["code"], -32021, "{failed}");
    Ok(())
}

/// However many requests notice at once that the instance running a task
/// stopped, the task is taken over once: its operation runs again one time,
/// not once per request. The instance taking it over learns 300 ms late
/// that its write of the record landed, so the other requests read the
/// record naming it before its run starts (requests in that gap once found
/// the task "ours, but not running" and took it over again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_noticed_by_many_requests_at_once_is_taken_over_once() -> anyhow::Result<()> {
    let memory = MemoryStore::new();
    let runs = Runs::default();
    let (a, tasks_a, serve_a) =
        takeover_instance(Stores::new(memory.clone()), Rerun::Finishes, runs.clone()).await?;
    let late = SlowStore::new(memory.clone())
        .late_puts_of(&mcp_persist_core::declare::TASK, Duration::from_millis(300));
    let (b, _tasks_b, _serve_b) = takeover_instance(
        Stores::from_parts(Arc::new(late), Some(Arc::new(memory.clone()))),
        Rerun::Finishes,
        runs.clone(),
    )
    .await?;
    let http = reqwest::Client::new();
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let task = started_then_stopped(&http, &a, "pollers", &caps, tasks_a, serve_a).await?;

    // Four pollers of B, each at its own pace, until the task completes.
    let pollers = (0..4u64).map(|n| {
        let (http, b, caps, task) = (http.clone(), b.clone(), caps.clone(), task.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            loop {
                let got = modern(
                    &http,
                    &b,
                    "pollers",
                    caps.clone(),
                    "tasks/get",
                    json!({"taskId": task}),
                )
                .await?;
                match got["result"]["status"].as_str() {
                    Some("completed") => return anyhow::Ok(()),
                    Some("working") => {}
                    _ => anyhow::bail!("neither working nor completed: {got}"),
                }
                anyhow::ensure!(
                    started.elapsed() < AT_ONCE,
                    "the task did not complete within {AT_ONCE:?}: {got}"
                );
                tokio::time::sleep(Duration::from_millis(10 + 7 * n)).await;
            }
        })
    });
    for poller in pollers.collect::<Vec<_>>() {
        poller.await??;
    }
    let started = runs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(started, [1, 2], "the runs that started, by generation");
    let record = Stores::new(memory)
        .tasks()?
        .load(&mcp_persist_core::TaskId::new(task)?)
        .await?
        .context("the task record")?
        .record;
    assert_eq!(
        (record.runs, record.owner.generation),
        (2, 2),
        "runs and generation the record counts"
    );
    Ok(())
}

/// A run fenced by a takeover on another instance, still running here when
/// this instance takes the task over in turn, is stopped by that takeover;
/// and its watcher, woken later, leaves the newer run alone (it used to stop
/// whatever ran the task here, so the task was taken over a third time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_here_stops_the_fenced_run_and_only_that() -> anyhow::Result<()> {
    let stores = Stores::new(MemoryStore::new());
    let runs = Runs::default();
    // Runs look at their records only when their inbox rings.
    let (x, _tasks_x, _serve_x) = takeover_instance_polling(
        stores.clone(),
        Rerun::Finishes,
        runs.clone(),
        Duration::from_secs(60),
    )
    .await?;
    let http = reqwest::Client::new();
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let task = created_task(&http, &x, "fenced", &caps, "ask_later").await?;
    let id = mcp_persist_core::TaskId::new(task.clone())?;
    // Another instance, never seen alive, took it over (generation 2)
    // while generation 1 still runs here, unaware.
    stores
        .tasks()?
        .update(&id, |record| {
            record.take_over(
                "an-instance-that-stopped",
                mcp_persist_core::Timestamp::now(),
            )?;
            Ok(true)
        })
        .await?;
    let get = || {
        modern(
            &http,
            &x,
            "fenced",
            caps.clone(),
            "tasks/get",
            json!({"taskId": task}),
        )
    };
    // This instance takes it over in turn (generation 3, once it has
    // judged the other instance stopped)...
    let started = std::time::Instant::now();
    while !runs.lock().unwrap_or_else(|p| p.into_inner()).contains(&3) {
        anyhow::ensure!(
            started.elapsed() < AT_ONCE,
            "not taken over within {AT_ONCE:?}"
        );
        get().await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and generation 1's watcher wakes, while generation 3 runs.
    stores.tasks()?.ring(&id, "changed").await?;
    let started = std::time::Instant::now();
    loop {
        let got = get().await?;
        if got["result"]["status"] == "completed" {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < AT_ONCE,
            "not completed within {AT_ONCE:?}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = runs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(started, [1, 3], "the runs that started, by generation");
    Ok(())
}
