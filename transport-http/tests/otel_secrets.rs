//! No secret becomes telemetry: a full OAuth flow with a refresh, a DPoP
//! flow with a refresh, keyed tool calls and sealed records, every span
//! exported at `debug` (with the documented directive for rmcp's auth
//! module) and every metric recorded. No token, client secret, PKCE
//! verifier, authorization code, `state`, DPoP key or proof, idempotency key
//! or sealing key appears in a span's name, attributes or events, or in a
//! metric's labels; no raw session id appears in a span's attributes or
//! events (log lines, exported as span events, name sessions by their hash
//! too) or in a metric's labels.
//!
//! Its own test binary, so that the process-wide subscriber sees every span.

#![cfg(all(feature = "otel", feature = "auth"))]

mod auth_support;
mod otel_support;

use auth_support::{World, expire, headless, start, start_dpop};
use mcp_persist_core::{
    CredentialKey, ServerKey, Stores, canonical_url,
    seal::{Keyring, SealKey, Sealing},
};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    auth::{DurableAuth, DurableAuthBuild, RMCP_AUTH_LOG_DIRECTIVE},
    client::DurableClientBuilder,
    exactly_once::IDEMPOTENCY_KEY,
};
use otel_support::{Meters, finished, total};
use rmcp::{ServiceExt, model::CallToolRequestParams};

fn auth(world: &World, stores: &Stores, meters: &Meters) -> DurableAuth {
    DurableAuth::new(world.mcp_url.clone(), stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("otel-secrets-test")
        .telemetry(meters.telemetry())
}

/// One process's work: authorized (once), two keyed calls; returns the
/// session id and the idempotency key it used.
async fn run_once(
    world: &World,
    stores: &Stores,
    meters: &Meters,
    key: &str,
) -> anyhow::Result<String> {
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), stores)
        .build_with_auth(&auth(world, stores, meters))
        .await?;
    if !client.is_authorized().await {
        client.authorize(None, headless).await?;
    }
    let service = ().serve(transport).await?;
    let mut call = CallToolRequestParams::new("whoami");
    call.meta
        .get_or_insert_with(Default::default)
        .insert(IDEMPOTENCY_KEY.to_owned(), key.into());
    service.call_tool(call).await?;
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await?;
    service.cancel().await?;
    let session = stores
        .client_state()
        .session(&ServerKey::new(&world.mcp_url, "default")?)
        .await?
        .map(|s| s.record.session_id.as_str().to_owned())
        .unwrap_or_default();
    Ok(session)
}

/// What a flow must keep out of telemetry: its secrets and its session
/// ids, everywhere.
#[derive(Default)]
struct Kept {
    secrets: Vec<String>,
    sessions: Vec<String>,
}

/// A flow, a refresh and another run on `world`, on sealed SQLite.
async fn flow(world: &World, meters: &Meters, kept: &mut Kept) -> anyhow::Result<()> {
    let (seal, seal_text) = SealKey::generate()?;
    let stores = Stores::new(SqliteStore::open_in_memory().await?)
        .encrypted(Sealing::new(Keyring::new(seal)).seal_everything())
        .with_telemetry(meters.telemetry());
    let resource = canonical_url("resource", &world.mcp_url)?;
    let issuer = world.auth(0).issuer.clone();
    let key = format!("idempotency-{}", std::process::id());
    let first = run_once(world, &stores, meters, &key).await?;
    expire(&stores.credentials(), &issuer, &resource).await;
    let second = run_once(world, &stores, meters, &format!("{key}-2")).await?;
    assert_eq!(world.auth(0).refreshes(), 1);
    kept.secrets.extend(world.secrets());
    kept.secrets.extend([
        key.clone(),
        format!("{key}-2"),
        seal_text.expose_secret().to_owned(),
    ]);
    if let Some(dpop) = stores
        .credentials()
        .load_dpop_key(&CredentialKey::new(&issuer, &resource)?)
        .await?
    {
        kept.secrets
            .push(dpop.record.private_key.expose_secret().to_owned());
    }
    kept.sessions
        .extend([first, second].into_iter().filter(|s| !s.is_empty()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_an_exported_span_or_metric() -> anyhow::Result<()> {
    otel_support::install(&format!("debug,{RMCP_AUTH_LOG_DIRECTIVE}"));
    let meters = Meters::new();
    let mut kept = Kept::default();
    let bearer = start(1).await;
    flow(&bearer, &meters, &mut kept).await?;
    let dpop = start_dpop(true).await;
    flow(&dpop, &meters, &mut kept).await?;
    kept.secrets.retain(|s| s.len() >= 8);
    assert!(
        kept.secrets.len() > 10,
        "the flows issued secrets: {}",
        kept.secrets.len()
    );
    assert!(!kept.sessions.is_empty(), "the flows had sessions");

    let spans = finished();
    assert_eq!(
        spans
            .iter()
            .filter(|s| s["name"] == "mcp_persist.credentials.refresh")
            .filter(|s| s["attributes"]["mcp_persist.outcome"] == "refreshed")
            .count(),
        2,
        "one refresh per flow, each a span"
    );
    assert!(
        spans
            .iter()
            .filter(|s| s["events"].as_array().is_some_and(|e| !e.is_empty()))
            .count()
            > 5,
        "log lines are exported as span events, and scanned"
    );
    let hashed = mcp_persist_core::telemetry::hash_session_id(&kept.sessions[0]);
    assert!(
        spans.iter().any(|s| s["name"] == "tools/call whoami"
            && s["attributes"]["mcp.session.id"] == hashed.as_str()),
        "request spans carry the session hashed"
    );
    let points = meters.read();
    assert_eq!(
        total(
            &points,
            "mcp_persist.credentials.refreshes",
            &[("mcp_persist.outcome", "ok")]
        ),
        2.0
    );
    assert!(
        total(
            &points,
            "mcp_persist.store.operation.duration",
            &[("db.system.name", "sqlite")]
        ) > 0.0
    );

    for span in &spans {
        let named = format!("{} {}", span["name"], span["attributes"]);
        let whole = format!("{named} {}", span["events"]);
        for secret in &kept.secrets {
            assert!(
                !whole.contains(secret.as_str()),
                "a secret in span {}",
                span["name"]
            );
        }
        for session in &kept.sessions {
            assert!(
                !whole.contains(session.as_str()),
                "a raw session id in span {} or its events",
                span["name"]
            );
        }
    }
    for point in &points {
        let labels = format!("{:?}", point.attributes);
        for secret in kept.secrets.iter().chain(&kept.sessions) {
            assert!(
                !labels.contains(secret.as_str()),
                "a secret in a label of {}",
                point.name
            );
        }
    }
    Ok(())
}
