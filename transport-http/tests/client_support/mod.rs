//! A counting rmcp test server (2025-11-25, event store on) for the client
//! tests, and helpers to run client child processes.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use mcp_persist_core::{EventStoreConfig, MemoryStore, Stores};
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
            Tool::new("slow", "slow work with progress", schema),
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
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        *self.stats.runs.lock().unwrap().entry(name).or_default() += 1;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

pub struct TestServer {
    pub url: String,
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
    let stats = Arc::new(Stats::default());
    let stores = Stores::new(MemoryStore::new());
    let events = DurableEventStore::new(
        stores.events(EventStoreConfig::default()).unwrap(),
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
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = ct.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    TestServer {
        url: format!("http://{addr}/mcp"),
        stats,
        sessions,
        ct,
    }
}
