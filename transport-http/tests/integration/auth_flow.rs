//! Durable OAuth credentials against a local authorization server and a
//! protected rmcp server: restarts, refresh with rotation, and migration to
//! a new authorization server. Restart and refresh run twice: with
//! everything in SQLite, and with credentials in Secrets Manager (moto) and
//! the rest in SQLite.

#![cfg(feature = "auth")]

use std::sync::atomic::Ordering;

use crate::auth_support::{World, backend::Backend, expire, headless, start};
use mcp_persist_core::{AuthStore, CredentialKey, Stores, canonical_url};
use mcp_persist_transport_http::{
    auth::{DurableAuth, DurableAuthBuild},
    client::DurableClientBuilder,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};

fn auth(world: &World, stores: &Stores) -> DurableAuth {
    DurableAuth::new(world.mcp_url.clone(), stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("auth-flow-test")
}

/// One "process": build the transport, authorize if needed, call a tool.
async fn run_once(world: &World, stores: &Stores) -> anyhow::Result<()> {
    run_once_with(world, stores, auth(world, stores)).await
}

async fn run_once_with(world: &World, stores: &Stores, auth: DurableAuth) -> anyhow::Result<()> {
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), stores)
        .build_with_auth(&auth)
        .await?;
    if !client.is_authorized().await {
        client.authorize(None, headless).await?;
    }
    let service = ().serve(transport).await?;
    service.list_all_tools().await?;
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await?;
    service.cancel().await?;
    Ok(())
}

async fn stored(store: &AuthStore, issuer: &str, resource: &str) -> mcp_persist_core::Credentials {
    let key = CredentialKey::new(issuer, resource).expect("valid key");
    store
        .load(&key)
        .await
        .expect("store readable")
        .expect("stored")
        .record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reuses_stored_credentials_and_an_expired_token_is_refreshed_once() {
    restart_and_refresh(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vault_split_restart_reuses_credentials_and_refresh_stores_rotated_token() {
    let Some(backend) = Backend::vault_split("auth-flow") else {
        return;
    };
    restart_and_refresh(backend).await;
}

/// A first authorization, a restart, then a refresh, with state on `backend`.
#[allow(clippy::unwrap_used)]
async fn restart_and_refresh(backend: Backend) {
    let world = start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    let key = CredentialKey::new(&issuer, &resource).unwrap();

    // First run: a full authorization.
    let stores = backend.open(&db).await;
    run_once(&world, &stores).await.unwrap();
    assert_eq!(world.auth(0).registrations(), 1);
    assert_eq!(world.auth(0).code_exchanges.load(Ordering::SeqCst), 1);
    let first = stored(&stores.credentials(), &issuer, &resource).await;
    assert!(first.client.client_secret.is_some(), "registration kept");
    assert!(first.server_metadata.is_some(), "metadata kept");
    assert!(first.expires_at.is_some(), "absolute expiry kept");
    drop(stores);
    backend.assert_credentials_placed(&db, &key).await;

    // Restart with a valid token: nothing reaches the authorization server,
    // and the first MCP request carries the stored token.
    let before = world.auth(0).requests();
    let bearer_before = world.mcp.bearer.lock().unwrap().len();
    // (Discovery in the first run probed the endpoint without a token.)
    let refused_before = world.mcp.unauthorized.load(Ordering::SeqCst);
    let stores = backend.open(&db).await;
    run_once(&world, &stores).await.unwrap();
    assert_eq!(
        world.auth(0).requests(),
        before,
        "no authorization-server request after a restart"
    );
    assert_eq!(
        world.mcp.unauthorized.load(Ordering::SeqCst),
        refused_before,
        "{:?}",
        world.mcp.refused.lock().unwrap()
    );
    let used: Vec<String> = world.mcp.bearer.lock().unwrap()[bearer_before..].to_vec();
    assert!(!used.is_empty());
    assert!(used.iter().all(|t| t == first.access_token.expose_secret()));

    // Time passes: the stored token expires. The next run refreshes once,
    // with the stored client secret, and stores the rotated refresh token.
    expire(&stores.credentials(), &issuer, &resource).await;
    drop(stores);
    let stores = backend.open(&db).await;
    run_once(&world, &stores).await.unwrap();
    assert_eq!(world.auth(0).refreshes(), 1);
    assert_eq!(world.auth(0).rejected_refreshes.load(Ordering::SeqCst), 0);
    assert_eq!(
        *world.auth(0).refresh_scopes.lock().unwrap(),
        [None],
        "a refresh keeps the original grant unless refresh scopes are set"
    );
    assert_eq!(world.auth(0).registrations(), 1, "no second registration");
    let second = stored(&stores.credentials(), &issuer, &resource).await;
    assert_ne!(
        second.refresh_token, first.refresh_token,
        "rotated token stored"
    );
    assert!(
        world
            .auth(0)
            .is_live_refresh_token(second.refresh_token.as_ref().unwrap().expose_secret())
    );
    assert!(
        !world
            .auth(0)
            .is_live_refresh_token(first.refresh_token.as_ref().unwrap().expose_secret())
    );
    let last = world.mcp.bearer.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last, second.access_token.expose_secret());
    assert!(second.expires_at.unwrap() > first.obtained_at);
    drop(stores);
    // A process started now finds the rotated token where it was stored.
    let reopened = stored(&backend.open(&db).await.credentials(), &issuer, &resource).await;
    assert_eq!(reopened.refresh_token, second.refresh_token);
    backend.assert_credentials_placed(&db, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_authorization_server_gets_a_new_registration_and_never_the_old_credentials() {
    let world = start(2).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let stores = Backend::Sqlite.open(&db).await;
    run_once(&world, &stores).await.unwrap();
    let as1 = stored(&stores.credentials(), &world.auth(0).issuer, &resource).await;

    // The resource now names another authorization server.
    world.migrate_to(1);
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth(&world, &stores))
        .await
        .unwrap();
    assert_eq!(
        client.issuer().as_deref(),
        Some(world.auth(0).issuer.as_str())
    );
    // The old token is refused; the application authorizes again.
    let refused = match ().serve(transport).await {
        Ok(service) => {
            let r = service.list_all_tools().await;
            let _ = service.cancel().await;
            r.is_err()
        }
        Err(_) => true,
    };
    assert!(
        refused,
        "the old issuer's token is refused after the migration"
    );
    client.authorize(None, headless).await.unwrap();
    assert_eq!(
        client.issuer().as_deref(),
        Some(world.auth(1).issuer.as_str())
    );
    assert_eq!(
        world.auth(1).registrations(),
        1,
        "registered with the new server"
    );
    let seen = world.auth(1).client_ids_seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(
        !seen.contains(&as1.client.client_id),
        "the old client id never reached the new server"
    );
    let as1_secrets = world.auth(0).secrets.lock().unwrap().clone();
    drop(client);

    // A restart uses the new issuer's credentials, with no request to either
    // authorization server; the old issuer's stay stored under their key.
    let before = (world.auth(0).requests(), world.auth(1).requests());
    run_once(&world, &stores).await.unwrap();
    assert_eq!((world.auth(0).requests(), world.auth(1).requests()), before);
    let as2 = stored(&stores.credentials(), &world.auth(1).issuer, &resource).await;
    assert_ne!(as2.client.client_id, as1.client.client_id);
    assert!(!as1_secrets.contains(&as2.access_token.expose_secret().to_owned()));
    let as1_again = stored(&stores.credentials(), &world.auth(0).issuer, &resource).await;
    assert_eq!(as1_again.client.client_id, as1.client.client_id);
}

/// A client acting on its own behalf (client-credentials grant) gets its
/// token once; a restarted process uses the stored token without asking the
/// authorization server again, and the secret and token never reach a
/// `Debug` print of the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::unwrap_used)]
async fn a_client_credentials_token_survives_a_restart() {
    let world = start(1).await;
    let secret = "cc-secret-do-not-print";
    world.auth(0).pre_register("machine-client", secret);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let machine = |stores: &Stores| {
        DurableAuth::new(world.mcp_url.clone(), stores.credentials()).pre_registered(
            "machine-client",
            Some(mcp_persist_core::Secret::new(secret)),
            None,
        )
    };
    let call = |transport| async {
        let service = ().serve(transport).await?;
        service
            .call_tool(CallToolRequestParams::new("whoami"))
            .await?;
        service.cancel().await?;
        anyhow::Ok(())
    };

    // First process: no stored token; one client-credentials grant.
    {
        let stores = Stores::new(
            mcp_persist_store_sqlite::SqliteStore::open(&db)
                .await
                .unwrap(),
        );
        let (transport, _handle, client) =
            DurableClientBuilder::new(world.mcp_url.clone(), &stores)
                .build_with_auth(&machine(&stores))
                .await
                .unwrap();
        assert!(!client.is_authorized().await);
        client.authorize_client_credentials(None).await.unwrap();
        assert!(client.is_authorized().await);
        let printed = format!("{client:?}");
        assert!(!printed.contains(secret), "the secret printed: {printed}");
        call(transport).await.unwrap();
    }
    assert_eq!(world.auth(0).client_credentials_grants(), 1);
    let requests = world.auth(0).requests();

    // Second process, same file: the stored token, no authorization server.
    let stores = Stores::new(
        mcp_persist_store_sqlite::SqliteStore::open(&db)
            .await
            .unwrap(),
    );
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&machine(&stores))
        .await
        .unwrap();
    assert!(client.is_authorized().await, "the token was not restored");
    call(transport).await.unwrap();
    assert_eq!(
        world.auth(0).requests(),
        requests,
        "a restart asked the authorization server again"
    );
    assert_eq!(world.mcp.tool_calls.load(Ordering::SeqCst), 2);
}

/// Without a pre-registered secret the grant is refused up front, typed.
#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn client_credentials_need_a_pre_registered_secret() {
    let world = start(1).await;
    let stores = Stores::new(mcp_persist_core::MemoryStore::new());
    let (_transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth(&world, &stores))
        .await
        .unwrap();
    let err = client.authorize_client_credentials(None).await.unwrap_err();
    assert!(
        matches!(
            err,
            mcp_persist_transport_http::auth::DurableAuthError::NoClientSecret
        ),
        "{err:?}"
    );
    assert_eq!(world.auth(0).requests(), 0);
}

/// A client registered with a signing key never enters the browser flow,
/// and its key never prints.
#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn a_key_registered_client_is_kept_to_client_credentials() {
    use mcp_persist_transport_http::auth::{DurableAuthError, Registration};
    let world = start(1).await;
    let stores = Stores::new(mcp_persist_core::MemoryStore::new());
    let pem = "-----BEGIN PRIVATE KEY-----\nnot-a-real-key-do-not-print\n-----END PRIVATE KEY-----";
    let auth = DurableAuth::new(world.mcp_url.clone(), stores.credentials()).registration(
        Registration::PreRegisteredKey {
            client_id: "machine".to_owned(),
            signing_key: mcp_persist_core::Secret::new(pem),
            algorithm: rmcp::transport::JwtSigningAlgorithm::ES256,
            issuer: None,
        },
    );
    let printed = format!("{auth:?}");
    assert!(!printed.contains("not-a-real-key"), "{printed}");
    let (_transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth)
        .await
        .unwrap();
    let err = client.authorize(None, headless).await.unwrap_err();
    assert!(
        matches!(err, DurableAuthError::KeyClientNeedsClientCredentials),
        "{err:?}"
    );
    // The malformed key is refused by the grant, typed, without its text.
    let err = client.authorize_client_credentials(None).await.unwrap_err();
    let message = format!("{err:?} {err}");
    assert!(!message.contains("not-a-real-key"), "{message}");
    assert!(!client.is_authorized().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_scopes_are_sent_when_configured() {
    let world = start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let stores = Backend::Sqlite.open(&dir.path().join("state.db")).await;
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    let with_scopes = || auth(&world, &stores).refresh_scopes(["mcp"]);
    run_once_with(&world, &stores, with_scopes()).await.unwrap();
    expire(&stores.credentials(), &issuer, &resource).await;
    run_once_with(&world, &stores, with_scopes()).await.unwrap();
    assert_eq!(world.auth(0).refreshes(), 1);
    assert_eq!(
        *world.auth(0).refresh_scopes.lock().unwrap(),
        [Some("mcp".to_owned())]
    );
}
