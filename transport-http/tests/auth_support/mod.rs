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
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
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
    /// Whether it advertises DPoP (`ES256`) and issues DPoP-bound tokens to
    /// token requests with a valid proof.
    pub dpop: AtomicBool,
    /// Whether its token endpoint requires its nonce in proofs.
    pub require_nonce: AtomicBool,
    /// Authorization requests it received.
    pub authorizations: AtomicUsize,
    /// The `jkt` of every valid proof of a token request, in order.
    pub proof_jkts: Mutex<Vec<String>>,
    /// Token -> the `jkt` it is bound to (access and refresh tokens).
    pub bound: Mutex<HashMap<String, String>>,
    /// Nonce challenges it sent.
    pub nonce_challenges: AtomicUsize,
    /// Assertions it accepts with the JWT-bearer grant.
    pub assertions: Mutex<HashSet<String>>,
    /// JWT-bearer grants it answered with a token.
    pub jwt_bearer: AtomicUsize,
    /// Playing an enterprise identity provider: the ID tokens whose owner
    /// it trades for an ID-JAG (token exchange, SEP-990), and the client id
    /// at the resource's authorization server its ID-JAGs name.
    id_tokens: Mutex<HashMap<String, String>>,
    /// ID-JAGs it issued.
    pub token_exchanges: AtomicUsize,
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
    pub fn authorizations(&self) -> usize {
        self.authorizations.load(Ordering::SeqCst)
    }
    pub fn code_exchanges(&self) -> usize {
        self.code_exchanges.load(Ordering::SeqCst)
    }
    pub fn jwt_bearer_grants(&self) -> usize {
        self.jwt_bearer.load(Ordering::SeqCst)
    }
    /// Plays an enterprise identity provider for `id_token`: trades it for
    /// an ID-JAG naming `client_id` (the client at the authorization server
    /// the exchange names), which this server then accepts as a JWT-bearer
    /// assertion.
    pub fn accept_id_token(&self, id_token: &str, client_id: &str) {
        self.id_tokens
            .lock()
            .unwrap()
            .insert(id_token.to_owned(), client_id.to_owned());
        self.secrets.lock().unwrap().push(id_token.to_owned());
    }
    pub fn token_exchanges(&self) -> usize {
        self.token_exchanges.load(Ordering::SeqCst)
    }
    /// A workload assertion it accepts from now on (and counts as a secret).
    pub fn accept_assertion(&self, assertion: &str) {
        self.assertions.lock().unwrap().insert(assertion.to_owned());
        self.secrets.lock().unwrap().push(assertion.to_owned());
    }
}

/// The issuer of the enterprise identity provider the test authorization
/// servers play (`AuthServer::accept_id_token`).
pub const IDP_ISSUER: &str = "http://127.0.0.1:9/idp";

/// The nonce the test authorization servers ask DPoP proofs for.
pub const AS_NONCE: &str = "as-nonce-1";
/// The nonce the test MCP server asks DPoP proofs for.
pub const RS_NONCE: &str = "rs-nonce-1";

fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    base64_decode(&s.replace('-', "+").replace('_', "/"))
}

fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n =
            chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A verified DPoP proof.
pub struct Proof {
    pub jkt: String,
    pub claims: Value,
}

/// Verifies a DPoP proof as RFC 9449 section 4.3 says: the header (`typ`,
/// `alg`, a public `jwk`), the ES256 signature with that key, `htm`, `htu`
/// (without query), a recent `iat`, a `jti`, and with `access_token` its
/// `ath`.
pub fn verify_proof(
    proof: &str,
    method: &str,
    url: &str,
    access_token: Option<&str>,
) -> Result<Proof, String> {
    let parts: Vec<&str> = proof.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        return Err("not a compact JWS".into());
    };
    let decode = |p: &str| -> Result<Value, String> {
        serde_json::from_slice(&b64url_decode(p).ok_or("bad base64url")?).map_err(|e| e.to_string())
    };
    let (h, claims) = (decode(header)?, decode(payload)?);
    if h["typ"] != "dpop+jwt" || h["alg"] != "ES256" {
        return Err(format!("bad header {h}"));
    }
    let jwk = &h["jwk"];
    if jwk.get("d").is_some() {
        return Err("private key in the header".into());
    }
    let coordinate =
        |c: &str| b64url_decode(jwk[c].as_str().unwrap_or_default()).unwrap_or_default();
    let point = [&[4u8][..], &coordinate("x"), &coordinate("y")].concat();
    let key = aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
        point,
    );
    let signature = b64url_decode(signature).ok_or("bad signature encoding")?;
    key.verify(format!("{header}.{payload}").as_bytes(), &signature)
        .map_err(|_| "the signature does not verify".to_owned())?;
    let htu = reqwest::Url::parse(url).map(|mut u| {
        u.set_query(None);
        u.to_string()
    });
    if claims["htm"] != method || claims["htu"].as_str() != htu.as_deref().ok() {
        return Err(format!("htm/htu mismatch: {claims}"));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    if claims["jti"].as_str().is_none_or(str::is_empty)
        || (claims["iat"].as_i64().unwrap_or(0) - now).abs() > 60
    {
        return Err(format!("bad jti or iat: {claims}"));
    }
    if let Some(token) = access_token {
        use sha2::Digest;
        if claims["ath"].as_str() != Some(b64url(&sha2::Sha256::digest(token.as_bytes())).as_str())
        {
            return Err("ath does not match the token".into());
        }
    }
    let canonical = format!(
        r#"{{"crv":"{}","kty":"{}","x":"{}","y":"{}"}}"#,
        jwk["crv"].as_str().unwrap_or_default(),
        jwk["kty"].as_str().unwrap_or_default(),
        jwk["x"].as_str().unwrap_or_default(),
        jwk["y"].as_str().unwrap_or_default()
    );
    use sha2::Digest;
    Ok(Proof {
        jkt: b64url(&sha2::Sha256::digest(canonical.as_bytes())),
        claims,
    })
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
    /// The `jkt` of every valid DPoP proof of an authorized request.
    pub proof_jkts: Mutex<Vec<String>>,
    /// Every proof jti seen (a replayed one is refused).
    pub jtis: Mutex<HashSet<String>>,
    /// Nonce challenges it sent.
    pub nonce_challenges: AtomicUsize,
    /// Whether it requires its nonce in proofs.
    pub require_nonce: AtomicBool,
    /// Every proof it received (secrets for the log test).
    pub proofs: Mutex<Vec<String>>,
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
    /// Every secret any authorization server issued or received, and every
    /// DPoP proof the MCP server received.
    pub fn secrets(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|s| s.secrets.lock().unwrap().clone())
            .chain(self.mcp.proofs.lock().unwrap().clone())
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
    let mut body = json!({
        "issuer": i,
        "authorization_endpoint": format!("{i}/authorize"),
        "token_endpoint": format!("{i}/token"),
        "registration_endpoint": format!("{i}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials",
            "urn:ietf:params:oauth:grant-type:jwt-bearer"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "none"],
    });
    if s.dpop.load(Ordering::SeqCst) {
        body["dpop_signing_alg_values_supported"] = json!(["ES256"]);
    }
    json_response(StatusCode::OK, body)
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
    s.authorizations.fetch_add(1, Ordering::SeqCst);
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
    // DPoP: a valid proof binds the tokens issued to its key.
    let mut jkt = None;
    if s.dpop.load(Ordering::SeqCst)
        && let Some(proof) = headers.get("dpop").and_then(|v| v.to_str().ok())
    {
        s.secrets.lock().unwrap().push(proof.to_owned());
        let verified = match verify_proof(proof, "POST", &format!("{}/token", s.issuer), None) {
            Ok(p) => p,
            Err(e) => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "invalid_dpop_proof", "error_description": e}),
                );
            }
        };
        if s.require_nonce.load(Ordering::SeqCst) && verified.claims["nonce"] != AS_NONCE {
            s.nonce_challenges.fetch_add(1, Ordering::SeqCst);
            return Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .header(header::CONTENT_TYPE, "application/json")
                .header("DPoP-Nonce", AS_NONCE)
                .body(Body::from(json!({"error": "use_dpop_nonce"}).to_string()))
                .unwrap();
        }
        s.proof_jkts.lock().unwrap().push(verified.jkt.clone());
        jkt = Some(verified.jkt);
    }
    let token_type = if jkt.is_some() { "DPoP" } else { "Bearer" };
    if form.get("grant_type").map(String::as_str)
        == Some("urn:ietf:params:oauth:grant-type:token-exchange")
    {
        // The enterprise identity provider's side: an ID-JAG for the
        // authorization server and resource the request names.
        let subject = form.get("subject_token").cloned().unwrap_or_default();
        let Some(client_id) = s.id_tokens.lock().unwrap().get(&subject).cloned() else {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
        };
        s.token_exchanges.fetch_add(1, Ordering::SeqCst);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut claims = json!({
            "iss": IDP_ISSUER, "aud": form.get("audience"), "sub": "user-1",
            "client_id": client_id, "jti": unique("jag"), "iat": now, "exp": now + 300,
            "resource": form.get("resource"),
        });
        if let Some(scope) = form.get("scope") {
            claims["scope"] = json!(scope);
        }
        let header = json!({"alg": "ES256", "typ": "oauth-id-jag+jwt"});
        let jag = format!(
            "{}.{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes()),
            b64url(b"test-signature")
        );
        s.assertions.lock().unwrap().insert(jag.clone());
        s.secrets.lock().unwrap().push(jag.clone());
        return json_response(
            StatusCode::OK,
            json!({
                "access_token": jag,
                "issued_token_type": "urn:ietf:params:oauth:token-type:id-jag",
                "token_type": "N_A",
            }),
        );
    }
    if form.get("grant_type").map(String::as_str)
        == Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        let assertion = form.get("assertion").cloned().unwrap_or_default();
        if !s.assertions.lock().unwrap().contains(&assertion) {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
        }
        s.jwt_bearer.fetch_add(1, Ordering::SeqCst);
        let (access, _) = issue(&s, "workload");
        if let Some(jkt) = &jkt {
            s.bound.lock().unwrap().insert(access.clone(), jkt.clone());
        }
        return json_response(
            StatusCode::OK,
            json!({
                "access_token": access,
                "token_type": token_type,
                "expires_in": s.expires_in.load(Ordering::SeqCst),
            }),
        );
    }
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
            // A bound refresh token works only with a proof of its key.
            let bound_to = s.bound.lock().unwrap().get(&presented).cloned();
            if bound_to.is_some() && bound_to != jkt {
                s.rejected_refreshes.fetch_add(1, Ordering::SeqCst);
                return json_response(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "invalid_grant", "error_description": "wrong DPoP key"}),
                );
            }
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
    if let Some(jkt) = &jkt {
        let mut bound = s.bound.lock().unwrap();
        bound.insert(access.clone(), jkt.clone());
        bound.insert(refresh.clone(), jkt.clone());
    }
    json_response(
        StatusCode::OK,
        json!({
            "access_token": access,
            "token_type": token_type,
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
    mcp_url: String,
}

/// Checks a DPoP-bound token's proof; the refusal to send otherwise.
fn dpop_refusal(
    g: &Guard,
    server: &AuthServer,
    request: &Request,
    token: &str,
) -> Option<Response> {
    let refuse = |error: &str| {
        Some(
            Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(
                    header::WWW_AUTHENTICATE,
                    format!(
                        "DPoP error=\"{error}\", resource_metadata=\"{}\"",
                        g.prm_url
                    ),
                )
                .body(Body::empty())
                .unwrap(),
        )
    };
    let bound = server.bound.lock().unwrap().get(token).cloned();
    let scheme_dpop = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("DPoP "));
    let Some(bound) = bound else {
        // A bearer token must be presented as one.
        return if scheme_dpop {
            refuse("invalid_token")
        } else {
            None
        };
    };
    let Some(proof) = request.headers().get("dpop").and_then(|v| v.to_str().ok()) else {
        return refuse("invalid_dpop_proof");
    };
    g.stats.proofs.lock().unwrap().push(proof.to_owned());
    let verified = match verify_proof(proof, request.method().as_str(), &g.mcp_url, Some(token)) {
        Ok(p) => p,
        Err(_) => return refuse("invalid_dpop_proof"),
    };
    if !scheme_dpop || verified.jkt != bound {
        return refuse("invalid_token");
    }
    let jti = verified.claims["jti"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if !g.stats.jtis.lock().unwrap().insert(jti) {
        return refuse("invalid_dpop_proof");
    }
    if g.stats.require_nonce.load(Ordering::SeqCst) && verified.claims["nonce"] != RS_NONCE {
        g.stats.nonce_challenges.fetch_add(1, Ordering::SeqCst);
        let mut response = refuse("use_dpop_nonce")?;
        response
            .headers_mut()
            .insert("DPoP-Nonce", http::HeaderValue::from_static(RS_NONCE));
        return Some(response);
    }
    g.stats.proof_jkts.lock().unwrap().push(verified.jkt);
    None
}

async fn bearer_check(State(g): State<Guard>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("DPoP "))
        })
        .map(str::to_owned);
    let server = &g.servers[g.current.load(Ordering::SeqCst)];
    if let Some(t) = &token
        && server.access_tokens.lock().unwrap().contains(t)
        && let Some(refusal) = dpop_refusal(&g, server, &request, t)
    {
        g.stats.unauthorized.fetch_add(1, Ordering::SeqCst);
        return refusal;
    }
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

/// Starts one DPoP authorization server (advertising `ES256`, binding
/// tokens to the key of the token request's proof) and an MCP server that
/// checks the proofs of DPoP-bound tokens; with `nonces`, both ask for
/// their nonce first.
pub async fn start_dpop(nonces: bool) -> World {
    let world = start(1).await;
    world.servers[0].dpop.store(true, Ordering::SeqCst);
    world.servers[0]
        .require_nonce
        .store(nonces, Ordering::SeqCst);
    world.mcp.require_nonce.store(nonces, Ordering::SeqCst);
    world
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
        mcp_url: mcp_url.clone(),
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
