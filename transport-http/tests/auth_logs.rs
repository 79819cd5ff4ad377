//! A full flow with a refresh, a DPoP flow (with nonces and a refresh), a
//! workload identity and an enterprise-managed authorization, under a process-wide `tracing` subscriber at every
//! level (`trace`) with the documented directive for rmcp's auth module: no token,
//! client secret, PKCE verifier, authorization code, `state` value, DPoP
//! private key or proof, workload assertion, enterprise ID token or ID-JAG
//! reaches the logs, `Debug` output or error messages.
//!
//! Its own test binary, so that the global subscriber sees every event.

#![cfg(feature = "auth")]

mod auth_support;

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use auth_support::{IDP_ISSUER, World, expire, headless, start, start_dpop};
use mcp_persist_core::{CredentialKey, Secret, Stores, canonical_url};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    auth::{
        AssertionSource, DurableAuth, DurableAuthBuild, EnterpriseIdentity,
        RMCP_AUTH_LOG_DIRECTIVE, Registration,
    },
    client::DurableClientBuilder,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};

fn auth(world: &World, stores: &Stores) -> DurableAuth {
    DurableAuth::new(world.mcp_url.clone(), stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("auth-logs-test")
}

async fn run_once(world: &World, stores: &Stores) -> anyhow::Result<()> {
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), stores)
        .build_with_auth(&auth(world, stores))
        .await?;
    if !client.is_authorized().await {
        client.authorize(None, headless).await?;
    }
    let service = ().serve(transport).await?;
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await?;
    service.cancel().await?;
    Ok(())
}

fn resource_of(world: &World) -> String {
    canonical_url("resource", &world.mcp_url).expect("a valid resource URL")
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_debug_output_and_errors_of_a_full_flow_with_a_refresh_hold_no_secret() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(format!("trace,{RMCP_AUTH_LOG_DIRECTIVE}"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let world = start(1).await;
    let stores = Stores::new(SqliteStore::open_in_memory().await.unwrap());
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    run_once(&world, &stores).await.unwrap();
    expire(&stores.credentials(), &issuer, &resource).await;
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth(&world, &stores))
        .await
        .unwrap();
    let service = ().serve(transport).await.unwrap();
    service.list_all_tools().await.unwrap();
    assert_eq!(world.auth(0).refreshes(), 1);
    let creds = stores.credentials();
    let key = CredentialKey::new(&issuer, &resource).unwrap();
    let current = creds.load(&key).await.unwrap().unwrap();
    // An error path too: a redirect whose `state` matches no pending
    // authorization.
    let error = client
        .authorize(None, |url: String| async move {
            let redirect = headless(url).await?;
            Ok(redirect.replace("state=", "state=x"))
        })
        .await
        .expect_err("an unknown state is refused");
    let mut chain = format!("{error}");
    let mut source = std::error::Error::source(&error);
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    let mut debug_output = format!(
        "{client:?} {:?} {creds:?} {error:?} {chain}",
        current.record
    );
    service.cancel().await.unwrap();

    // DPoP, with nonces at both servers, and a refresh with a proof.
    let dpop = start_dpop(true).await;
    let dpop_stores = Stores::new(SqliteStore::open_in_memory().await.unwrap());
    run_once(&dpop, &dpop_stores).await.unwrap();
    let dpop_issuer = dpop.auth(0).issuer.clone();
    expire(
        &dpop_stores.credentials(),
        &dpop_issuer,
        &resource_of(&dpop),
    )
    .await;
    run_once(&dpop, &dpop_stores).await.unwrap();
    assert_eq!(dpop.auth(0).refreshes(), 1);
    let dpop_key = CredentialKey::new(&dpop_issuer, &resource_of(&dpop)).unwrap();
    let key_record = dpop_stores
        .credentials()
        .load_dpop_key(&dpop_key)
        .await
        .unwrap()
        .expect("a DPoP key is stored")
        .record;
    let private_key = key_record.private_key.expose_secret().to_owned();
    debug_output.push_str(&format!("{key_record:?}"));

    // A workload identity.
    let assertion = format!("workload-assertion-{}", std::process::id());
    world.auth(0).accept_assertion(&assertion);
    let wif_stores = Stores::new(SqliteStore::open_in_memory().await.unwrap());
    let given = assertion.clone();
    let wif = auth(&world, &wif_stores).registration(Registration::WorkloadIdentity {
        client_id: None,
        assertion: AssertionSource::from_fn(move |_audience| {
            let given = given.clone();
            async move { Ok(Secret::new(given)) }
        }),
        issuer: None,
    });
    let (transport, _handle, wif_client) =
        DurableClientBuilder::new(world.mcp_url.clone(), &wif_stores)
            .build_with_auth(&wif)
            .await
            .unwrap();
    wif_client.authorize_workload_identity(None).await.unwrap();
    let service = ().serve(transport).await.unwrap();
    service.list_all_tools().await.unwrap();
    service.cancel().await.unwrap();
    debug_output.push_str(&format!("{wif:?} {wif_client:?}"));

    // Enterprise-managed: the user's ID token for an ID-JAG, redeemed.
    let id_token = format!("user-id-token-{}", std::process::id());
    world
        .auth(0)
        .pre_register("enterprise-client", "enterprise-secret");
    world
        .auth(0)
        .accept_id_token(&id_token, "enterprise-client");
    let ema_stores = Stores::new(SqliteStore::open_in_memory().await.unwrap());
    let ema = DurableAuth::new(world.mcp_url.clone(), ema_stores.credentials()).pre_registered(
        "enterprise-client",
        Some(Secret::new("enterprise-secret")),
        None,
    );
    let identity = EnterpriseIdentity::with_id_token(
        IDP_ISSUER,
        format!("{}/token", world.auth(0).issuer),
        "idp-client",
        Secret::new(id_token.clone()),
    );
    let (transport, _handle, ema_client) =
        DurableClientBuilder::new(world.mcp_url.clone(), &ema_stores)
            .build_with_auth(&ema)
            .await
            .unwrap();
    ema_client
        .authorize_enterprise(None, &identity)
        .await
        .unwrap();
    let service = ().serve(transport).await.unwrap();
    service.list_all_tools().await.unwrap();
    service.cancel().await.unwrap();
    assert_eq!(world.auth(0).token_exchanges(), 1);
    debug_output.push_str(&format!("{ema:?} {ema_client:?} {identity:?}"));

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("refreshed"), "the refresh is logged:\n{logs}");
    let as_proofs = dpop.auth(0).proof_jkts.lock().unwrap().len();
    let mcp_proofs = dpop.mcp.proofs.lock().unwrap().len();
    assert!(as_proofs >= 2, "token requests carried proofs");
    assert!(mcp_proofs >= 3, "MCP requests carried proofs");
    let mut secrets = world.secrets();
    secrets.extend(dpop.secrets());
    secrets.push(private_key);
    assert!(
        secrets.len() >= 8 + as_proofs + mcp_proofs + 2,
        "tokens, client secret, verifier, codes, states, DPoP proofs, the DPoP private key and the assertion are all checked"
    );
    assert!(secrets.contains(&assertion));
    assert!(secrets.contains(&id_token));
    assert!(
        secrets.iter().any(|s| s.ends_with(&b64_signature())),
        "the ID-JAG is checked"
    );
    for secret in &secrets {
        let leaks: Vec<String> = logs
            .lines()
            .filter(|l| l.contains(secret.as_str()))
            .map(|l| l.replace(secret.as_str(), "<SECRET>"))
            .collect();
        assert!(
            leaks.is_empty(),
            "a secret leaked into the logs, in:\n{}",
            leaks.join("\n")
        );
        assert!(
            !debug_output.contains(secret.as_str()),
            "a secret leaked into Debug"
        );
    }
}

/// The signature part of the test identity provider's ID-JAGs.
fn b64_signature() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"test-signature")
}
