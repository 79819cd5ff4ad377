//! A counting rmcp test server (2025-11-25, event store on) for the client
//! tests, and helpers to run client child processes.

#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use mcp_persist_core::{EventLogConfig, MemoryStore, Stores};
use mcp_persist_transport_http::server::DurableEventStore;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
        InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
        ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
/// What the server saw.
#[derive(Debug, Default)]
pub struct Stats {
    pub initializes: AtomicUsize,
    /// Tool name -> how often it ran to the end.
    pub runs: Mutex<HashMap<String, usize>>,
    /// (session id, JSON-RPC id, method) of every request a handler got.
    pub requests: Mutex<Vec<(String, String, String)>>,
    /// (session id, progress token as JSON) of every `slow` call.
    pub progress_tokens: Mutex<Vec<(String, String)>>,
}

impl Stats {
    pub fn runs_of(&self, tool: &str) -> usize {
        self.runs.lock().unwrap().get(tool).copied().unwrap_or(0)
    }
    pub fn sessions(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.0.clone())
            .collect();
        s.dedup();
        s
    }
}

#[derive(Clone)]
struct Counting {
    stats: Arc<Stats>,
    slow_steps: u32,
}

fn session_of(context: &RequestContext<RoleServer>) -> String {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

impl Counting {
    fn note(&self, context: &RequestContext<RoleServer>, method: &str) {
        let id = match &context.id {
            rmcp::model::NumberOrString::Number(n) => n.to_string(),
            rmcp::model::NumberOrString::String(s) => format!("{s:?}"),
        };
        self.stats
            .requests
            .lock()
            .unwrap()
            .push((session_of(context), id, method.to_owned()));
    }
}

impl ServerHandler for Counting {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info.name = "counting-server".into();
        info.server_info.version = "7.1.0".into();
        info.instructions = Some("Call slow for long work.".into());
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.stats.initializes.fetch_add(1, Ordering::SeqCst);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, ErrorData> {
        // Cacheable for a minute, so a restarted client need not ask again.
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        )
        .with_ttl_ms(60_000))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.note(&context, "tools/list");
        let schema = Arc::new(
            serde_json::json!({"type": "object"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "echoes", schema.clone()),
            Tool::new("slow", "slow work with progress", schema.clone()),
            Tool::new(
                "announce",
                "answers at once, then sends `count` resource updates on the standalone stream",
                schema,
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.note(&context, "tools/call");
        let name = request.name.to_string();
        let text = match name.as_str() {
            "echo" => serde_json::to_string(&request.arguments).unwrap(),
            "slow" => {
                let token = context.meta.get_progress_token();
                self.stats
                    .progress_tokens
                    .lock()
                    .unwrap()
                    .push((session_of(&context), serde_json::to_string(&token).unwrap()));
                for step in 1..=self.slow_steps {
                    if let Some(token) = &token {
                        let _ = context
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), f64::from(step))
                                    .with_total(f64::from(self.slow_steps)),
                            )
                            .await;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                "slow done".to_owned()
            }
            "announce" => {
                // Outside the request: after the answer, one update every
                // `interval_ms` (`announce://<n>`), on the session's GET stream.
                let arg = |name: &str, default: u64| {
                    request
                        .arguments
                        .as_ref()
                        .and_then(|a| a.get(name))
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(default)
                };
                let (count, interval) = (arg("count", 10), arg("interval_ms", 100));
                let peer = context.peer.clone();
                tokio::spawn(async move {
                    for n in 1..=count {
                        tokio::time::sleep(Duration::from_millis(interval)).await;
                        let message = rmcp::model::ResourceUpdatedNotificationParam::new(format!(
                            "announce://{n}"
                        ));
                        let _ = peer.notify_resource_updated(message).await;
                    }
                });
                "announcing".to_owned()
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        *self.stats.runs.lock().unwrap().entry(name).or_default() += 1;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

/// One HTTP request as the server received it.
#[derive(Debug, Clone)]
pub struct WireRecord {
    pub http_method: String,
    pub rpc_method: Option<String>,
    pub session_header: bool,
    pub last_event_id_header: bool,
}

/// How the server answers `server/discover`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fixture {
    /// rmcp as it is (2026-07-28 supported).
    Rmcp,
    /// A legacy-only server: `server/discover` gets the pre-release code
    /// -32004 with only handshake versions supported, and so does any
    /// request carrying the 2026-07-28 version.
    LegacyOnly,
    /// Discovers as rmcp does, but refuses every other modern request with
    /// -32022 (a server that keeps refusing).
    Refusing,
    /// rmcp as it is, but a GET with `Last-Event-ID` gets 410 Gone (the
    /// events expired): no stream can be resumed.
    RefusesResume,
    /// rmcp as it is, but a DELETE gets 404, as servers answer for a
    /// session they no longer know (rmcp itself answers 202).
    DeleteNotFound,
}

/// Whether a request names the 2026-07-28 version (header or `_meta`).
fn names_modern(headers: &http::HeaderMap, rpc: Option<&serde_json::Value>) -> bool {
    let header = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        == Some("2026-07-28");
    let meta = rpc
        .and_then(|v| v.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"))
        .and_then(|v| v.as_str())
        == Some("2026-07-28");
    header || meta
}

fn refusal(
    rpc: Option<&serde_json::Value>,
    code: i32,
    supported: &[&str],
) -> axum::response::Response {
    let id = rpc.and_then(|v| v.get("id")).cloned().unwrap_or_default();
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": id,
        "error": {"code": code, "message": "Unsupported protocol version",
                  "data": {"supported": supported, "requested": "2026-07-28"}}
    });
    axum::response::Response::builder()
        .status(400)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap()
}

pub struct TestServer {
    pub wire: Arc<Mutex<Vec<WireRecord>>>,
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub stats: Arc<Stats>,
    pub sessions: Arc<LocalSessionManager>,
    ct: tokio_util::sync::CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl TestServer {
    /// Deletes every session on the server side (as an expiry would).
    pub async fn forget_all_sessions(&self) {
        let ids: Vec<_> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .cloned()
            .collect();
        for id in ids {
            use rmcp::transport::streamable_http_server::SessionManager;
            let _ = self.sessions.close_session(&id).await;
        }
    }
}

/// Starts the server on a free loopback port.
pub async fn start_server(slow_steps: u32) -> TestServer {
    start_server_with(slow_steps, Fixture::Rmcp).await
}

/// Starts the server with a wire recorder in front.
pub async fn start_server_with(slow_steps: u32, fixture: Fixture) -> TestServer {
    start_server_on(None, slow_steps, fixture).await
}

/// Starts the server on `addr` (a free port when `None`), waiting for the
/// address to be free again when a previous server just left it.
pub async fn start_server_on(
    addr: Option<std::net::SocketAddr>,
    slow_steps: u32,
    fixture: Fixture,
) -> TestServer {
    let stats = Arc::new(Stats::default());
    let stores = Stores::new(MemoryStore::new());
    let events = DurableEventStore::new(
        stores.events(EventLogConfig::default()).unwrap(),
        Duration::from_millis(300),
    );
    let sessions = Arc::new(LocalSessionManager::default().with_event_store(Arc::new(events)));
    let ct = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(1)))
        .with_cancellation_token(ct.child_token());
    let handler = Counting {
        stats: stats.clone(),
        slow_steps,
    };
    let service = StreamableHttpService::new(move || Ok(handler.clone()), sessions.clone(), config);
    let wire = Arc::new(Mutex::new(Vec::new()));
    let recorder = wire.clone();
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let recorder = recorder.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let bytes = axum::body::to_bytes(body, 1 << 20)
                            .await
                            .unwrap_or_default();
                        let rpc: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
                        let rpc_method = rpc
                            .as_ref()
                            .and_then(|v| v.get("method"))
                            .and_then(|m| m.as_str())
                            .map(str::to_owned);
                        recorder.lock().unwrap().push(WireRecord {
                            http_method: parts.method.to_string(),
                            rpc_method: rpc_method.clone(),
                            session_header: parts.headers.contains_key("mcp-session-id"),
                            last_event_id_header: parts.headers.contains_key("last-event-id"),
                        });
                        let discover = rpc_method.as_deref() == Some("server/discover");
                        let request = rpc.as_ref().is_some_and(|v| v.get("id").is_some());
                        match fixture {
                            Fixture::LegacyOnly
                                if discover
                                    || (request && names_modern(&parts.headers, rpc.as_ref())) =>
                            {
                                return refusal(
                                    rpc.as_ref(),
                                    -32004,
                                    &["2025-06-18", "2025-11-25"],
                                );
                            }
                            Fixture::Refusing
                                if request
                                    && !discover
                                    && names_modern(&parts.headers, rpc.as_ref()) =>
                            {
                                return refusal(
                                    rpc.as_ref(),
                                    -32022,
                                    &["2026-07-28", "2025-11-25"],
                                );
                            }
                            Fixture::RefusesResume
                                if parts.method == http::Method::GET
                                    && parts.headers.contains_key("last-event-id") =>
                            {
                                return axum::response::Response::builder()
                                    .status(410)
                                    .body(axum::body::Body::from("Gone: the events expired"))
                                    .unwrap();
                            }
                            Fixture::DeleteNotFound if parts.method == http::Method::DELETE => {
                                return axum::response::Response::builder()
                                    .status(404)
                                    .body(axum::body::Body::from("Not Found: Session not found"))
                                    .unwrap();
                            }
                            _ => {}
                        }
                        next.run(axum::extract::Request::from_parts(
                            parts,
                            axum::body::Body::from(bytes),
                        ))
                        .await
                    }
                },
            ));
    let listener = match addr {
        None => tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Some(addr) => {
            let mut attempts = 0;
            loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => break l,
                    Err(e) if attempts < 200 => {
                        attempts += 1;
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                    Err(e) => panic!("cannot bind {addr} again: {e}"),
                }
            }
        }
    };
    let addr = listener.local_addr().unwrap();
    let stop = ct.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    TestServer {
        wire,
        url: format!("http://{addr}/mcp"),
        addr,
        stats,
        sessions,
        ct,
    }
}
