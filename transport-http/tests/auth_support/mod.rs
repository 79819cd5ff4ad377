//! A local OAuth world for the auth tests: authorization servers (RFC 8414
//! metadata, dynamic registration, authorization and token endpoints that
//! count requests and rotate refresh tokens) and an rmcp MCP server that
//! publishes RFC 9728 metadata and checks `Authorization: Bearer`.

#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

pub mod backend;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, Uri, header},
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
};
use mcp_persist_core::{AuthStore, BoxError, CredentialKey, Timestamp};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};

static COUNTER: AtomicU64 = AtomicU64::new(1);

fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{n}-{nanos:x}{:x}", std::process::id())
}

/// One authorization server and what it saw.
#[derive(Default)]
pub struct AuthServer {
    pub issuer: String,
    /// Every HTTP request it received.
    pub requests: AtomicUsize,
    pub registrations: AtomicUsize,
    pub code_exchanges: AtomicUsize,
    pub refreshes: AtomicUsize,
    pub client_credentials: AtomicUsize,
    pub rejected_refreshes: AtomicUsize,
    /// The `scope` of every accepted refresh request, in order.
    pub refresh_scopes: Mutex<Vec<Option<String>>>,
    /// Lifetime of issued access tokens, in seconds.
    pub expires_in: AtomicU64,
    /// client id -> secret.
    clients: Mutex<HashMap<String, String>>,
    /// code -> client id.
    codes: Mutex<HashMap<String, String>>,
    /// Live refresh tokens -> client id.
    live_refresh: Mutex<HashMap<String, String>>,
    /// Access tokens it issued.
    pub access_tokens: Mutex<HashSet<String>>,
    /// Access tokens issued by refreshes, in order.
    pub refreshed_access_tokens: Mutex<Vec<String>>,
    /// Every secret it issued or was sent: tokens, client secrets, PKCE
    /// verifiers.
    pub secrets: Mutex<Vec<String>>,
    /// Client ids presented at its authorization and token endpoints.
    pub client_ids_seen: Mutex<Vec<String>>,
}

impl AuthServer {
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
    pub fn refreshes(&self) -> usize {
        self.refreshes.load(Ordering::SeqCst)
    }
    pub fn registrations(&self) -> usize {
        self.registrations.load(Ordering::SeqCst)
    }
    /// Registers a confidential client out of band (for the
    /// client-credentials grant).
    pub fn pre_register(&self, client_id: &str, secret: &str) {
        self.clients
            .lock()
            .unwrap()
            .insert(client_id.to_owned(), secret.to_owned());
    }
    pub fn client_credentials_grants(&self) -> usize {
        self.client_credentials.load(Ordering::SeqCst)
    }
    pub fn is_live_refresh_token(&self, token: &str) -> bool {
        self.live_refresh.lock().unwrap().contains_key(token)
    }
}

/// What the MCP server saw.
#[derive(Default)]
pub struct McpStats {
    /// Bearer token of every authorized request.
    pub bearer: Mutex<Vec<String>>,
    pub unauthorized: AtomicUsize,
    /// Method, path and whether a bearer was sent, of every refused request.
    pub refused: Mutex<Vec<String>>,
    pub tool_calls: AtomicUsize,
}

pub struct World {
    pub mcp_url: String,
    pub servers: Vec<Arc<AuthServer>>,
    /// Which authorization server the MCP server names now.
    pub current: Arc<AtomicUsize>,
    pub mcp: Arc<McpStats>,
    ct: tokio_util::sync::CancellationToken,
}

impl Drop for World {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl World {
    pub fn auth(&self, i: usize) -> &AuthServer {
        &self.servers[i]
    }
    /// Every secret any authorization server issued or received.
    pub fn secrets(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|s| s.secrets.lock().unwrap().clone())
            .collect()
    }
    /// Makes the MCP server name authorization server `i` from now on; it
    /// then accepts only that server's tokens.
    pub fn migrate_to(&self, i: usize) {
        self.current.store(i, Ordering::SeqCst);
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn pairs(s: &str) -> HashMap<String, String> {
    reqwest::Url::parse(&format!("http://x/?{s}"))
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

async fn metadata(State(s): State<Arc<AuthServer>>) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let i = &s.issuer;
    json_response(
        StatusCode::OK,
        json!({
            "issuer": i,
            "authorization_endpoint": format!("{i}/authorize"),
            "token_endpoint": format!("{i}/token"),
            "registration_endpoint": format!("{i}/register"),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        }),
    )
}

async fn register(State(s): State<Arc<AuthServer>>, body: String) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    s.registrations.fetch_add(1, Ordering::SeqCst);
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = unique("client");
    let secret = unique("client-secret");
    s.clients.lock().unwrap().insert(id.clone(), secret.clone());
    s.secrets.lock().unwrap().push(secret.clone());
    json_response(
        StatusCode::CREATED,
        json!({
            "client_id": id,
            "client_secret": secret,
            "client_name": request["client_name"],
            "redirect_uris": request["redirect_uris"],
            "token_endpoint_auth_method": "client_secret_basic",
        }),
    )
}

async fn authorize(State(s): State<Arc<AuthServer>>, uri: Uri) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let q = pairs(uri.query().unwrap_or(""));
    let client_id = q.get("client_id").cloned().unwrap_or_default();
    s.client_ids_seen.lock().unwrap().push(client_id.clone());
    if !s.clients.lock().unwrap().contains_key(&client_id) {
        return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_client"}));
    }
    let code = unique("code");
    s.codes.lock().unwrap().insert(code.clone(), client_id);
    // Authorization codes and state values are secrets too: either one in
    // a log lets a reader finish or forge the flow.
    {
        let mut secrets = s.secrets.lock().unwrap();
        secrets.push(code.clone());
        if let Some(state) = q.get("state").filter(|v| !v.is_empty()) {
            secrets.push(state.clone());
        }
    }
    let mut redirect = reqwest::Url::parse(&q["redirect_uri"]).unwrap();
    redirect
        .query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &q["state"])
        .append_pair("iss", &s.issuer);
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, redirect.as_str())
        .body(Body::empty())
        .unwrap()
}

fn basic_client(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = String::from_utf8(base64_decode(encoded)?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let unescape = |s: &str| pairs(&format!("v={s}")).remove("v").unwrap_or_default();
    Some((unescape(id), unescape(secret)))
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buf = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fn issue(s: &AuthServer, client_id: &str) -> (String, String) {
    let access = unique("access-token");
    let refresh = unique("refresh-token");
    s.access_tokens.lock().unwrap().insert(access.clone());
    s.live_refresh
        .lock()
        .unwrap()
        .insert(refresh.clone(), client_id.to_owned());
    s.secrets
        .lock()
        .unwrap()
        .extend([access.clone(), refresh.clone()]);
    (access, refresh)
}

async fn token(State(s): State<Arc<AuthServer>>, headers: HeaderMap, body: String) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let form = pairs(&body);
    let Some((client_id, secret)) = basic_client(&headers) else {
        return json_response(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    };
    s.client_ids_seen.lock().unwrap().push(client_id.clone());
    if s.clients.lock().unwrap().get(&client_id) != Some(&secret) {
        return json_response(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    }
    let expires_in = s.expires_in.load(Ordering::SeqCst);
    let (access, refresh) = match form.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let code = form.get("code").cloned().unwrap_or_default();
            if s.codes.lock().unwrap().remove(&code).as_deref() != Some(client_id.as_str()) {
                return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
            }
            match form.get("code_verifier") {
                Some(v) if !v.is_empty() => s.secrets.lock().unwrap().push(v.clone()),
                _ => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": "invalid_request"}),
                    );
                }
            }
            s.code_exchanges.fetch_add(1, Ordering::SeqCst);
            issue(&s, &client_id)
        }
        Some("refresh_token") => {
            let presented = form.get("refresh_token").cloned().unwrap_or_default();
            // Rotation: a refresh token works once.
            let owner = s.live_refresh.lock().unwrap().remove(&presented);
            if owner.as_deref() != Some(client_id.as_str()) {
                s.rejected_refreshes.fetch_add(1, Ordering::SeqCst);
                return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
            }
            s.refreshes.fetch_add(1, Ordering::SeqCst);
            s.refresh_scopes
                .lock()
                .unwrap()
                .push(form.get("scope").cloned());
            let issued = issue(&s, &client_id);
            s.refreshed_access_tokens
                .lock()
                .unwrap()
                .push(issued.0.clone());
            issued
        }
        Some("client_credentials") => {
            if form.get("resource").is_none_or(String::is_empty) {
                return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_target"}));
            }
            s.client_credentials.fetch_add(1, Ordering::SeqCst);
            // No refresh token for this grant (RFC 6749 4.4.3).
            let (access, _) = issue(&s, &client_id);
            return json_response(
                StatusCode::OK,
                json!({
                    "access_token": access,
                    "token_type": "Bearer",
                    "expires_in": expires_in,
                    "scope": "mcp",
                }),
            );
        }
        _ => {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": "unsupported_grant_type"}),
            );
        }
    };
    json_response(
        StatusCode::OK,
        json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": expires_in,
            "refresh_token": refresh,
            "scope": "mcp",
        }),
    )
}

async fn start_auth_server(ct: &tokio_util::sync::CancellationToken) -> Arc<AuthServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Arc::new(AuthServer {
        issuer: format!("http://{addr}"),
        expires_in: AtomicU64::new(3600),
        ..AuthServer::default()
    });
    let router = Router::new()
        .route("/.well-known/oauth-authorization-server", get(metadata))
        .route("/register", post(register))
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .with_state(server.clone());
    let stop = ct.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    server
}

#[derive(Clone)]
struct Tools {
    stats: Arc<McpStats>,
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info.name = "protected-server".into();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(json!({"type": "object"}).as_object().cloned().unwrap());
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "whoami", "answers", schema,
        )]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.stats.tool_calls.fetch_add(1, Ordering::SeqCst);
        Ok(CallToolResult::success(vec![ContentBlock::text("you are authorized")]).into())
    }
}

#[derive(Clone)]
struct Guard {
    servers: Vec<Arc<AuthServer>>,
    current: Arc<AtomicUsize>,
    stats: Arc<McpStats>,
    prm_url: String,
}

async fn bearer_check(State(g): State<Guard>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let server = &g.servers[g.current.load(Ordering::SeqCst)];
    match token {
        Some(t) if server.access_tokens.lock().unwrap().contains(&t) => {
            g.stats.bearer.lock().unwrap().push(t);
            next.run(request).await
        }
        _ => {
            g.stats.unauthorized.fetch_add(1, Ordering::SeqCst);
            g.stats.refused.lock().unwrap().push(format!(
                "{} {} bearer={}",
                request.method(),
                request.uri().path(),
                token.is_some()
            ));
            Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(
                    header::WWW_AUTHENTICATE,
                    format!("Bearer resource_metadata=\"{}\"", g.prm_url),
                )
                .body(Body::empty())
                .unwrap()
        }
    }
}

/// Starts `auth_servers` authorization servers and a protected MCP server
/// naming the first, all on free loopback ports.
pub async fn start(auth_servers: usize) -> World {
    let ct = tokio_util::sync::CancellationToken::new();
    let mut servers = Vec::new();
    for _ in 0..auth_servers {
        servers.push(start_auth_server(&ct).await);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mcp_url = format!("http://{addr}/mcp");
    let prm_url = format!("http://{addr}/.well-known/oauth-protected-resource/mcp");
    let current = Arc::new(AtomicUsize::new(0));
    let stats = Arc::new(McpStats::default());

    let config = StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token());
    let tools = Tools {
        stats: stats.clone(),
    };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let guard = Guard {
        servers: servers.clone(),
        current: current.clone(),
        stats: stats.clone(),
        prm_url,
    };
    let prm = {
        let servers = servers.clone();
        let current = current.clone();
        let mcp_url = mcp_url.clone();
        move || {
            let issuer = servers[current.load(Ordering::SeqCst)].issuer.clone();
            let body = json!({"resource": mcp_url, "authorization_servers": [issuer]});
            async move { json_response(StatusCode::OK, body) }
        }
    };
    let mcp = Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(guard, bearer_check));
    let router = Router::new()
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(prm.clone()),
        )
        .route("/.well-known/oauth-protected-resource", get(prm))
        .merge(mcp);
    let stop = ct.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    World {
        mcp_url,
        servers,
        current,
        mcp: stats,
        ct,
    }
}

/// The user agent of a headless test: follows the authorization URL to its
/// redirect without following the redirect itself.
pub async fn headless(url: String) -> Result<String, BoxError> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let response = http.get(&url).send().await?;
    let location = response
        .headers()
        .get(header::LOCATION)
        .ok_or("no redirect from the authorization endpoint")?
        .to_str()?
        .to_owned();
    Ok(location)
}

/// Moves the stored access token's expiry into the past, as time would.
pub async fn expire(store: &AuthStore, issuer: &str, resource: &str) {
    let key = CredentialKey::new(issuer, resource).unwrap();
    let mut stored = store.load(&key).await.unwrap().expect("credentials stored");
    stored.record.expires_at = Some(Timestamp::from_unix_millis(
        Timestamp::now().as_unix_millis() - 1000,
    ));
    store.replace(&stored.record, stored.version).await.unwrap();
}

/// Bounded wait for a condition.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
