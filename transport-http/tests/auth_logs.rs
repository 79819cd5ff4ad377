//! A full flow with a refresh, under a process-wide `tracing` subscriber at
//! debug level with the documented directive for rmcp's auth module: no
//! token, client secret, PKCE verifier, authorization code or `state` value
//! reaches the logs, `Debug` output or error messages.
//!
//! Its own test binary, so that the global subscriber sees every event.

#![cfg(feature = "auth")]

mod auth_support;

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use auth_support::{World, expire, headless, start};
use mcp_persist_core::{CredentialKey, Stores, canonical_url};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    auth::{DurableAuth, DurableAuthBuild, RMCP_AUTH_LOG_DIRECTIVE},
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
        .with_env_filter(format!("debug,{RMCP_AUTH_LOG_DIRECTIVE}"))
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
    let debug_output = format!(
        "{client:?} {:?} {creds:?} {error:?} {chain}",
        current.record
    );
    service.cancel().await.unwrap();

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("refreshed"), "the refresh is logged:\n{logs}");
    let secrets = world.secrets();
    assert!(
        secrets.len() >= 8,
        "tokens, client secret, verifier, codes and states were issued"
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
