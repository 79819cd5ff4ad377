//! The authorization scenarios (`auth/...`): the durable, authenticated
//! client with persistence on, credentials in SQLite.
//!
//! The client authorizes headlessly: it follows the authorization URL to the
//! redirect the suite's authorization server answers with. Before its first
//! authorization it asks the server unauthenticated, as a client that has
//! just been pointed at a URL does, and authorizes with the 401's
//! `WWW-Authenticate` challenge (its `scope` and `resource_metadata`). When a
//! request is refused later (the token expired beyond refresh, the resource
//! moved to another authorization server, or a 403 asks for more scope), it
//! authorizes again with that request's challenge, which discovers the
//! authorization server afresh, registers there if it is new, and requests
//! the scope the server named.
//! Credentials persist in a SQLite file: a fresh one in a temporary folder,
//! or the file named by `MCP_PERSIST_AUTH_DB` (so a second run starts from
//! the credentials of the first).
//!
//! DPoP is on (the library's default): where the authorization server
//! advertises it, tokens are DPoP-bound to a key stored with them. The
//! scenario context decides the grant: an identity provider's ID token means
//! enterprise-managed authorization, a workload JWT the JWT-bearer grant
//! (the JWT handed over in a file, as a platform would), a client id and
//! secret or key the client-credentials grant in those scenarios, and the
//! authorization code flow otherwise.

use anyhow::Context;
use mcp_persist_core::{BoxError, Secret, Stores};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    auth::{
        AssertionSource, DurableAuth, DurableAuthBuild, DurableAuthClient, EnterpriseIdentity,
        Registration, auth_challenge,
    },
    client::DurableClientBuilder,
};
use rmcp::{
    ClientLifecycleMode, ClientServiceExt,
    model::{CallToolRequestParams, ProtocolVersion},
    transport::JwtSigningAlgorithm,
};
use serde_json::{Map, Value, json};

const REDIRECT_URI: &str = "http://localhost:3000/callback";
/// The client id metadata document URL the suite expects (`auth/basic-cimd`).
const CLIENT_METADATA_URL: &str = "https://conformance-test.local/client-metadata.json";

async fn headless(url: String) -> Result<String, BoxError> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let response = http.get(&url).send().await?;
    let location = response
        .headers()
        .get("location")
        .ok_or("the authorization endpoint answered without a redirect")?
        .to_str()?
        .to_owned();
    Ok(location)
}

fn arguments(schema: &Map<String, Value>) -> Option<Map<String, Value>> {
    let properties = schema.get("properties")?.as_object()?;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut args = Map::new();
    for (name, property) in properties {
        if !required.contains(&name.as_str()) {
            continue;
        }
        let value = match property.get("type").and_then(Value::as_str) {
            Some("number") => json!(1.0),
            Some("integer") => json!(1),
            Some("boolean") => json!(true),
            _ => json!("test"),
        };
        args.insert(name.clone(), value);
    }
    Some(args)
}

/// One MCP session: list the tools and call each. After a failed session,
/// with `retry`, the client is authorized afresh, with the failure's
/// challenge when it had one.
async fn exercise(
    url: &str,
    stores: &Stores,
    auth: &DurableAuth,
    grant: &Grant,
    retry: bool,
) -> anyhow::Result<Result<(), anyhow::Error>> {
    let (transport, _handle, client) = DurableClientBuilder::new(url, stores)
        .build_with_auth(auth)
        .await?;
    if !client.is_authorized().await {
        let challenge = first_challenge(url).await;
        tracing::info!(challenge = ?challenge, "authorizing");
        grant
            .authorize(&client, challenge.as_deref())
            .await
            .context("authorization")?;
    }
    let outcome = async {
        // 2026-07-28 servers get `server/discover`, older ones `initialize`.
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::LATEST],
            legacy_version: None,
        };
        let service = ().serve_with_lifecycle(transport, lifecycle).await?;
        let tools = service.list_all_tools().await?;
        for tool in tools {
            let mut params = CallToolRequestParams::new(tool.name.clone());
            if let Some(args) = arguments(&tool.input_schema) {
                params = params.with_arguments(args);
            }
            service.call_tool(params).await?;
        }
        service.cancel().await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if let (Err(e), true) = (&outcome, retry) {
        // The next attempt authorizes afresh, for what the server asked.
        let challenge = e.chain().find_map(auth_challenge);
        tracing::info!(challenge = ?challenge, "session refused; authorizing again");
        grant.authorize(&client, challenge.as_deref()).await?;
    }
    Ok(outcome)
}

/// How the client gets its tokens.
enum Grant {
    /// Authorization code with PKCE, through the (headless) user agent.
    AuthorizationCode,
    /// Client credentials (SEP-1046): the client acts on its own behalf.
    ClientCredentials,
    /// Enterprise-managed authorization (SEP-990) with the user's ID token
    /// at the enterprise identity provider.
    Enterprise(EnterpriseIdentity),
    /// Workload identity (SEP-1933): the JWT-bearer grant.
    WorkloadIdentity,
}

impl Grant {
    async fn authorize(
        &self,
        client: &DurableAuthClient<reqwest::Client>,
        challenge: Option<&str>,
    ) -> Result<(), mcp_persist_transport_http::auth::DurableAuthError> {
        match self {
            Grant::AuthorizationCode => client.authorize(challenge, headless).await,
            Grant::ClientCredentials => client.authorize_client_credentials(challenge).await,
            Grant::Enterprise(identity) => client.authorize_enterprise(challenge, identity).await,
            Grant::WorkloadIdentity => client.authorize_workload_identity(challenge).await,
        }
    }
}

/// The challenge an unauthenticated client meets first: the 401 to its
/// `initialize`, or, on a server that lets `initialize` through, to the
/// `tools/list` after it. `None` when neither is refused (or the server is
/// unreachable: the authorization then finds out).
async fn first_challenge(url: &str) -> Option<String> {
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<String>| {
        let mut request = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(session) = session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        request.send()
    };
    let challenge = |response: &reqwest::Response| {
        let refused = matches!(response.status().as_u16(), 401 | 403);
        refused
            .then(|| response.headers().get("www-authenticate")?.to_str().ok())
            .flatten()
            .map(str::to_owned)
    };
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "mcp-persist-conformance-client", "version": "1"}
        }
    });
    let response = post(init, None).await.ok()?;
    if let Some(found) = challenge(&response) {
        return Some(found);
    }
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let _ = post(initialized, session.clone()).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let response = post(list, session).await.ok()?;
    challenge(&response)
}

/// Plays an `auth/...` scenario against the suite's server at `url`, with
/// the suite's `MCP_CONFORMANCE_CONTEXT` (client id and secret of a
/// pre-registered client, when the scenario gives them).
pub async fn run(scenario: &str, url: &str) -> anyhow::Result<()> {
    let context: Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or(Value::Null);
    let temp = std::env::temp_dir().join(format!(
        "mcp-persist-conformance-auth-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&temp).with_context(|| format!("creating {}", temp.display()))?;
    let _cleanup = crate::scratch::RemoveOnDrop(temp.clone());
    let db = std::env::var_os("MCP_PERSIST_AUTH_DB")
        .map(Into::into)
        .unwrap_or_else(|| temp.join("credentials.db"));
    let stores = Stores::new(SqliteStore::open(&db).await?);

    // A client id metadata document where the authorization server supports
    // them (the suite's server accepts its fixed URL without fetching it),
    // dynamic registration elsewhere.
    let mut auth = DurableAuth::new(url.to_owned(), stores.credentials())
        .redirect_uri(REDIRECT_URI)
        .registration(Registration::MetadataDocument {
            url: CLIENT_METADATA_URL.to_owned(),
            client_name: "mcp-persist-conformance-client".to_owned(),
        });
    let text = |name: &str| context.get(name).and_then(Value::as_str);
    let key_client = context
        .get("client_id")
        .and_then(Value::as_str)
        .zip(context.get("private_key_pem").and_then(Value::as_str));
    if let Some(jwt) = text("valid_jwt") {
        // The platform's token, handed over in a file the client reads
        // before every token request.
        let file = temp.join("workload.jwt");
        std::fs::write(&file, jwt).with_context(|| format!("writing {}", file.display()))?;
        auth = auth.registration(Registration::WorkloadIdentity {
            client_id: text("client_id").map(str::to_owned),
            assertion: AssertionSource::file(file),
            issuer: None,
        });
    } else if let Some((client_id, pem)) = key_client {
        let algorithm = match context.get("signing_algorithm").and_then(Value::as_str) {
            Some("ES384") => JwtSigningAlgorithm::ES384,
            Some("RS256") => JwtSigningAlgorithm::RS256,
            Some("RS384") => JwtSigningAlgorithm::RS384,
            Some("RS512") => JwtSigningAlgorithm::RS512,
            _ => JwtSigningAlgorithm::ES256,
        };
        auth = auth.registration(Registration::PreRegisteredKey {
            client_id: client_id.to_owned(),
            signing_key: Secret::new(pem),
            algorithm,
            issuer: None,
        });
    } else if let Some(client_id) = context.get("client_id").and_then(Value::as_str) {
        auth = auth.pre_registered(
            client_id,
            context
                .get("client_secret")
                .and_then(Value::as_str)
                .map(Secret::new),
            context
                .get("issuer")
                .and_then(Value::as_str)
                .map(str::to_owned),
        );
    }
    // The client-credentials scenarios give the client's id and secret and
    // expect it to act on its own behalf.
    let enterprise = (|| {
        Some(EnterpriseIdentity::with_id_token(
            text("idp_issuer")?,
            text("idp_token_endpoint")?,
            text("idp_client_id")?,
            Secret::new(text("idp_id_token")?),
        ))
    })();
    let grant = if let Some(identity) = enterprise {
        Grant::Enterprise(identity)
    } else if text("valid_jwt").is_some() {
        Grant::WorkloadIdentity
    } else if scenario.starts_with("auth/client-credentials") {
        Grant::ClientCredentials
    } else {
        Grant::AuthorizationCode
    };
    tracing::info!(scenario, "playing authorization scenario");

    // Three sessions at most: a session may find the token refused (expired,
    // the resource moved to another authorization server, or a 403 asking
    // for more scope) and authorize again; a step-up after a re-authorization
    // takes the third. The suite checks separately against loops.
    let mut last = Ok(());
    for attempt in 1..=3 {
        last = exercise(url, &stores, &auth, &grant, attempt < 3).await?;
        match &last {
            Ok(()) => break,
            Err(e) => tracing::warn!(attempt, error = %e, "MCP session failed"),
        }
    }
    last
}
