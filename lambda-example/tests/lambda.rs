//! The function as AWS runs it: the built binary against a local
//! implementation of the Lambda Runtime API, one new process for every
//! invocation (a cold start each time), API Gateway HTTP API (v2) events
//! in, buffered HTTP responses out, state in DynamoDB (moto).
//!
//! The Runtime API, as the function sees it:
//! `GET /2018-06-01/runtime/invocation/next` hands out the next event with
//! its request id and deadline; `POST .../invocation/{id}/response` takes
//! the answer; `POST .../invocation/{id}/error` (and `.../init/error`) a
//! failure. After its answer the process asks for the next event, which
//! never comes: it is then killed with SIGKILL, as Lambda discards an
//! execution environment.

mod support;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
};
use serde_json::{Value, json};
use support::{answer, events, fresh_table, modern_meta, moto_url, store_env, tool_text};
use tokio::sync::{Notify, mpsc};

const HOST: &str = "abcdefgh.lambda-url.us-east-1.on.aws";

/// What the function posted for one invocation.
#[derive(Debug)]
enum Outcome {
    Response(Value),
    Error(Value),
}

/// The Runtime API: one pending event at a time.
#[derive(Default)]
struct RuntimeApi {
    next: Mutex<Option<(String, String)>>,
    ready: Notify,
    outcomes: Mutex<Option<mpsc::UnboundedSender<(String, Outcome)>>>,
}

async fn next(State(api): State<Arc<RuntimeApi>>) -> impl IntoResponse {
    loop {
        let waiting = api.ready.notified();
        if let Some((id, event)) = api.next.lock().expect("lock").take() {
            let deadline = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis()
                + 60_000;
            let mut headers = HeaderMap::new();
            headers.insert("lambda-runtime-aws-request-id", id.parse().expect("id"));
            headers.insert(
                "lambda-runtime-deadline-ms",
                deadline.to_string().parse().expect("deadline"),
            );
            headers.insert(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:mcp"
                    .parse()
                    .expect("arn"),
            );
            headers.insert(
                "lambda-runtime-trace-id",
                "Root=1-5759e988-bd862e3fe1be46a994272793"
                    .parse()
                    .expect("trace"),
            );
            headers.insert("content-type", "application/json".parse().expect("type"));
            return (StatusCode::OK, headers, event);
        }
        // Nothing to hand out: the caller waits, as on Lambda.
        waiting.await;
    }
}

fn posted(api: &RuntimeApi, id: String, outcome: Outcome) -> StatusCode {
    if let Some(tx) = api.outcomes.lock().expect("lock").as_ref() {
        let _ = tx.send((id, outcome));
    }
    StatusCode::ACCEPTED
}

async fn response(
    State(api): State<Arc<RuntimeApi>>,
    Path(id): Path<String>,
    body: String,
) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    posted(&api, id, Outcome::Response(value))
}

async fn error(
    State(api): State<Arc<RuntimeApi>>,
    Path(id): Path<String>,
    body: String,
) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    posted(&api, id, Outcome::Error(value))
}

async fn init_error(State(api): State<Arc<RuntimeApi>>, body: String) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    posted(&api, "init".into(), Outcome::Error(value))
}

/// A deployed function: the Runtime API on a loopback port and the
/// environment each of its processes gets.
struct Lambda {
    api: Arc<RuntimeApi>,
    address: String,
    env: Vec<(String, String)>,
    invocations: u32,
}

/// An HTTP answer, from the API Gateway v2 response the function posted.
#[derive(Debug)]
struct HttpAnswer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Lambda {
    async fn start(env: Vec<(String, String)>) -> Lambda {
        let api = Arc::new(RuntimeApi::default());
        let router = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Lambda {
            api,
            address,
            env,
            invocations: 0,
        }
    }

    /// Delivers `event` to a new process of the function (a cold start),
    /// waits for what it posts, then kills it.
    async fn invoke_raw(&mut self, event: Value) -> Outcome {
        self.invocations += 1;
        let id = format!("req-{}", self.invocations);
        let (tx, mut rx) = mpsc::unbounded_channel();
        *self.api.outcomes.lock().expect("lock") = Some(tx);
        *self.api.next.lock().expect("lock") = Some((id.clone(), event.to_string()));
        self.api.ready.notify_waiters();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-lambda-example"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", &self.address)
            .env("AWS_LAMBDA_FUNCTION_NAME", "mcp")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/mcp")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
            .env("MCP_ALLOWED_HOSTS", HOST)
            .env("MCP_STREAM_WINDOW_MS", "1500")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the function");
        let (got, outcome) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("invocation {id} got no answer within a minute"))
            .expect("an outcome");
        assert_eq!(got, id, "the answer is for this invocation");
        // Still alive, waiting for the next event: discard it like Lambda.
        assert!(
            child.try_wait().expect("poll").is_none(),
            "the function exited after invocation {id}"
        );
        child.start_kill().expect("SIGKILL");
        let status = child.wait().await.expect("reap");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "{status}");
        }
        outcome
    }

    /// An HTTP request to the function URL, as a v2 event.
    async fn http(
        &mut self,
        method: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> HttpAnswer {
        let mut all: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        all.insert("host".into(), HOST.into());
        let event = json!({
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": "/mcp",
            "rawQueryString": "",
            "headers": all,
            "requestContext": {
                "accountId": "123456789012",
                "apiId": "abcdefgh",
                "domainName": HOST,
                "domainPrefix": "abcdefgh",
                "http": {
                    "method": method,
                    "path": "/mcp",
                    "protocol": "HTTP/1.1",
                    "sourceIp": "127.0.0.1",
                    "userAgent": "lambda-test"
                },
                "requestId": format!("http-{}", self.invocations + 1),
                "routeKey": "$default",
                "stage": "$default",
                "time": "25/Nov/2026:10:00:00 +0000",
                "timeEpoch": 1_795_600_000_000u64
            },
            "body": body.map(Value::to_string),
            "isBase64Encoded": false
        });
        match self.invoke_raw(event).await {
            Outcome::Response(r) => HttpAnswer {
                status: r["statusCode"].as_u64().unwrap_or(0) as u16,
                headers: r["headers"]
                    .as_object()
                    .map(|h| {
                        h.iter()
                            .map(|(k, v)| {
                                (k.to_ascii_lowercase(), v.as_str().unwrap_or("").to_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                body: r["body"].as_str().unwrap_or("").to_owned(),
            },
            Outcome::Error(e) => panic!("the invocation failed: {e}"),
        }
    }

    /// A JSON-RPC POST in the legacy session `session` (none: initialize).
    async fn legacy(&mut self, session: Option<&str>, body: Value) -> HttpAnswer {
        let mut headers = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        if let Some(session) = session {
            headers.push(("mcp-session-id", session));
            headers.push(("mcp-protocol-version", "2025-11-25"));
        }
        self.http("POST", &headers, Some(&body)).await
    }

    /// A 2026-07-28 JSON-RPC request (no session).
    async fn modern(&mut self, id: u64, method: &str, mut params: Value) -> Value {
        params["_meta"] = modern_meta();
        let name = params
            .get("name")
            .or_else(|| params.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut headers = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
        ];
        if let Some(name) = &name {
            headers.push(("mcp-name", name));
        }
        let reply = self.http("POST", &headers, Some(&body)).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(
            !reply.headers.contains_key("mcp-session-id"),
            "no session on 2026-07-28: {reply:?}"
        );
        answer(&reply.body)
    }
}

/// Every invocation a new process: one `initialize`, in the first; the
/// session restored from DynamoDB in every later one; a tool call's events
/// replayed by another invocation after `Last-Event-ID`; and a 2026-07-28
/// task created in one invocation, run by another and collected by a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invocation_a_cold_start() {
    let Some(moto) = moto_url() else { return };
    let table = fresh_table(&moto, "cold").await;
    let mut lambda = Lambda::start(store_env(&moto, &table)).await;

    // 1. initialize: a new session, stored.
    let init = lambda
        .legacy(
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "lambda-test", "version": "7.1"}
            }}),
        )
        .await;
    assert_eq!(init.status, 200, "{init:?}");
    let session = init
        .headers
        .get("mcp-session-id")
        .cloned()
        .unwrap_or_else(|| panic!("no session id: {init:?}"));
    let init = answer(&init.body);
    assert_eq!(
        init["result"]["serverInfo"]["name"], "mcp-persist-lambda-example",
        "{init}"
    );

    // 2. initialized, in another process.
    let ack = lambda
        .legacy(
            Some(&session),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
    assert_eq!(ack.status, 202, "{ack:?}");

    // 3. A cold process serves the session: the client it knows is the one
    // that initialized, and this process answered no initialize itself.
    let who = lambda
        .legacy(
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                   "params": {"name": "whoami", "arguments": {}}}),
        )
        .await;
    assert_eq!(who.status, 200, "{who:?}");
    let who: Value = serde_json::from_str(&tool_text(&answer(&who.body))).expect("json");
    assert_eq!(who["client"], "lambda-test", "{who}");
    assert_eq!(who["clientVersion"], "7.1", "{who}");
    let stats = lambda
        .legacy(
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {"name": "stats", "arguments": {}}}),
        )
        .await;
    let stats: Value = serde_json::from_str(&tool_text(&answer(&stats.body))).expect("json");
    assert_eq!(
        stats["initialize"], 0,
        "no initialize after the first: {stats}"
    );
    assert_eq!(
        stats["restored"], 1,
        "the session came from the table: {stats}"
    );

    // 4. A tool call with progress: the whole stream, each event with its id.
    let call = lambda
        .legacy(
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                   "params": {"name": "slow_progress", "arguments": {"count": 3, "delay_ms": 10},
                              "_meta": {"progressToken": "p-4"}}}),
        )
        .await;
    assert_eq!(call.status, 200, "{call:?}");
    let sent = events(&call.body);
    let progress: Vec<&support::Event> = sent
        .iter()
        .filter(|e| e.data["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{}", call.body);
    assert_eq!(tool_text(&answer(&call.body)), "done after 3 steps");
    let first = progress[0].id.clone().expect("events carry ids");

    // 5. Another invocation replays what followed the first progress event.
    let replay = lambda
        .http(
            "GET",
            &[
                ("accept", "text/event-stream"),
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "2025-11-25"),
                ("last-event-id", &first),
            ],
            None,
        )
        .await;
    assert_eq!(replay.status, 200, "{replay:?}");
    let replayed = events(&replay.body);
    let later: Vec<(Option<String>, Value)> = sent
        .iter()
        .skip_while(|e| e.id.as_deref() != Some(first.as_str()))
        .skip(1)
        .map(|e| (e.id.clone(), e.data.clone()))
        .collect();
    assert_eq!(later.len(), 3, "two progress events and the answer");
    assert_eq!(
        replayed
            .iter()
            .map(|e| (e.id.clone(), e.data.clone()))
            .collect::<Vec<_>>(),
        later,
        "the later events, in order, with their original ids"
    );

    // 6. 2026-07-28, no session: a task created in one invocation...
    let who = lambda
        .modern(10, "tools/call", json!({"name": "whoami", "arguments": {}}))
        .await;
    assert!(tool_text(&who).contains("modern-test"), "{who}");
    let created = lambda
        .modern(
            11,
            "tools/call",
            json!({"name": "long_job", "arguments": {"steps": 4, "step_ms": 25}}),
        )
        .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task = created["result"]["taskId"]
        .as_str()
        .expect("task id")
        .to_owned();
    // ...run by the next invocation that asks about it, and collected by a
    // later one: each a new process.
    let started = Instant::now();
    let mut polls = 0;
    let done = loop {
        polls += 1;
        let got = lambda
            .modern(12 + polls, "tasks/get", json!({"taskId": task}))
            .await;
        if got["result"]["status"] == "completed" {
            break got;
        }
        assert_eq!(got["result"]["status"], "working", "{got}");
        assert!(
            polls < 5 && started.elapsed() < Duration::from_secs(60),
            "the task did not complete: {got}"
        );
    };
    assert_eq!(polls, 2, "the first poll runs it, the second collects it");
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no result: {done}"));
    assert!(
        text.starts_with("job done after 4 steps (run 2"),
        "taken over by the invocation after the one that created it: {text}"
    );
}

/// A function whose table is missing answers each invocation with an
/// error (`/invocation/{id}/error`) saying how to create the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_an_invocation_error_that_says_what_to_do() {
    let Some(moto) = moto_url() else { return };
    let mut lambda = Lambda::start(store_env(&moto, "no-such-table")).await;
    let event = json!({
        "version": "2.0", "routeKey": "$default", "rawPath": "/mcp", "rawQueryString": "",
        "headers": {"host": HOST, "content-type": "application/json"},
        "requestContext": {"accountId": "1", "apiId": "a", "domainName": HOST, "domainPrefix": "a",
            "http": {"method": "POST", "path": "/mcp", "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "t"},
            "requestId": "r", "routeKey": "$default", "stage": "$default", "time": "t", "timeEpoch": 0},
        "body": "{}", "isBase64Encoded": false
    });
    match lambda.invoke_raw(event).await {
        Outcome::Error(e) => {
            let text = e.to_string();
            assert!(
                text.contains("no-such-table") && text.contains("create"),
                "{text}"
            );
        }
        Outcome::Response(r) => panic!("a missing table was answered: {r}"),
    }
}
