//! DPoP with a durable key, workload identity and enterprise-managed
//! authorization, against authorization and MCP servers written here
//! (`auth_support`, whose authorization server also plays the enterprise
//! identity provider): the DPoP server binds
//! access and refresh tokens to the key of the token request's proof and
//! asks for nonces; the MCP server checks every proof.
//!
//! The restart test runs two child processes (this binary again, with
//! `MCP_PERSIST_DPOP_CHILD` set) on the parent's sealed SQLite store.

#![cfg(feature = "auth")]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::Ordering,
    time::Duration,
};

use crate::auth_support::{IDP_ISSUER, World, expire, headless, start, start_dpop};
use mcp_persist_core::{
    CredentialKey, KvStore, PutMode, PutOptions, Stores, canonical_url, declare,
    seal::{Keyring, SealKey},
};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::{
    auth::{
        AssertionSource, DpopKeyProblem, DurableAuth, DurableAuthBuild, DurableAuthError,
        EnterpriseIdentity, Registration,
    },
    client::DurableClientBuilder,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};

const CHILD: &str = "MCP_PERSIST_DPOP_CHILD";

fn auth(url: &str, stores: &Stores) -> DurableAuth {
    DurableAuth::new(url, stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("auth-dpop-test")
}

/// The SQLite store at `db`, sealed with the keyring written as `ring`.
#[allow(clippy::unwrap_used)]
async fn sealed(db: &Path, ring: &str) -> (Stores, SqliteStore) {
    let backend = SqliteStore::open(db).await.unwrap();
    let keyring = Keyring::parse(ring, "test").unwrap();
    (Stores::new(backend.clone()).encrypted(keyring), backend)
}

#[allow(clippy::unwrap_used)]
async fn call_tool(
    url: &str,
    stores: &Stores,
) -> mcp_persist_transport_http::auth::DurableAuthClient<reqwest::Client> {
    let (transport, _handle, client) = DurableClientBuilder::new(url, stores)
        .build_with_auth(&auth(url, stores))
        .await
        .unwrap();
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    client
}

/// A child: wait for the start signal, then one MCP session, printing the
/// DPoP thumbprint it signed with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.splitn(4, '|');
    let (db, url, go, ring) = (
        PathBuf::from(parts.next().unwrap()),
        parts.next().unwrap().to_owned(),
        PathBuf::from(parts.next().unwrap()),
        parts.next().unwrap().to_owned(),
    );
    let (stores, _) = sealed(&db, &ring).await;
    let (transport, _handle, client) = DurableClientBuilder::new(url.clone(), &stores)
        .profile(format!("child-{}", std::process::id()))
        .build_with_auth(&auth(&url, &stores))
        .await
        .unwrap();
    assert!(
        client.is_authorized().await,
        "credentials stored by the parent"
    );
    println!("CHILD-READY");
    for _ in 0..3000 {
        if go.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    println!("JKT={}", client.dpop_thumbprint().await.unwrap().unwrap());
    println!("CHILD-DONE");
}

/// Two restarted processes on one sealed store, with an expiring
/// DPoP-bound credential: neither asks for a new authorization, the bound
/// refresh token is spent once (with a proof of the stored key, which the
/// server insists on), the key is the one created before, and every proof
/// the servers saw carries its thumbprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_restarted_processes_keep_the_dpop_key_and_spend_the_bound_refresh_token_once() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let world = start_dpop(true).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let go = dir.path().join("go");
    let (_, ring) = SealKey::generate().unwrap();
    let ring = ring.expose_secret().to_owned();
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    let key = CredentialKey::new(&issuer, &resource).unwrap();

    let (stores, raw) = sealed(&db, &ring).await;
    let (_transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth(&world.mcp_url, &stores))
        .await
        .unwrap();
    client.authorize(None, headless).await.unwrap();
    drop(client);
    call_tool(&world.mcp_url, &stores).await;
    let stored_key = stores
        .credentials()
        .load_dpop_key(&key)
        .await
        .unwrap()
        .unwrap();
    let jkt = stored_key.record.thumbprint.clone();
    let creds = stores
        .credentials()
        .load(&key)
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(creds.token_type, "DPoP", "a DPoP-bound token was issued");
    assert_eq!(*world.auth(0).proof_jkts.lock().unwrap(), vec![jkt.clone()]);
    assert!(world.auth(0).nonce_challenges.load(Ordering::SeqCst) >= 1);
    assert!(world.mcp.nonce_challenges.load(Ordering::SeqCst) >= 1);
    // Sealed at rest: the backend holds no private key text.
    let raw_key = declare::DPOP_KEY.key(&[&issuer, &resource]);
    let bytes = raw.get(&raw_key).await.unwrap().unwrap().value;
    let private = stored_key.record.private_key.expose_secret().to_owned();
    assert!(!String::from_utf8_lossy(&bytes).contains(&private));
    assert!(!String::from_utf8_lossy(&bytes).contains("private_key"));
    expire(&stores.credentials(), &issuer, &resource).await;
    drop(stores);
    let authorizations = world.auth(0).authorizations();
    let exchanges = world.auth(0).code_exchanges();
    let registrations = world.auth(0).registrations();

    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for _ in 0..2 {
        let spec = format!("{}|{}|{}|{ring}", db.display(), world.mcp_url, go.display());
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                &crate::support::test_path(module_path!(), "child"),
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        children.push((child, rx));
    }
    for (_, rx) in &children {
        tokio::task::block_in_place(|| {
            rx.iter()
                .find(|l| l.contains("CHILD-READY"))
                .expect("child got ready")
        });
    }
    std::fs::write(&go, b"go").unwrap();
    let mut printed = Vec::new();
    for (mut child, rx) in children {
        let mut status = None;
        for _ in 0..12_000 {
            if let Some(s) = child.try_wait().unwrap() {
                status = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let Some(status) = status else {
            let _ = child.kill();
            panic!("child did not finish");
        };
        assert!(status.success(), "child failed: {status}");
        let lines: Vec<String> = rx.try_iter().collect();
        assert!(lines.iter().any(|l| l.contains("CHILD-DONE")), "{lines:?}");
        printed.extend(
            lines
                .iter()
                .filter_map(|l| l.strip_prefix("JKT="))
                .map(str::to_owned),
        );
    }

    let server = world.auth(0);
    assert_eq!(
        server.authorizations(),
        authorizations,
        "no authorization request"
    );
    assert_eq!(server.code_exchanges(), exchanges, "no code exchange");
    assert_eq!(server.registrations(), registrations, "no registration");
    assert_eq!(
        server.refreshes(),
        1,
        "the bound refresh token was spent once"
    );
    assert_eq!(server.rejected_refreshes.load(Ordering::SeqCst), 0);
    assert_eq!(
        printed,
        vec![jkt.clone(), jkt.clone()],
        "both children signed with the stored key"
    );
    assert!(
        server.proof_jkts.lock().unwrap().iter().all(|j| *j == jkt),
        "every token-request proof carries the stored key's jkt"
    );
    let seen = world.mcp.proof_jkts.lock().unwrap().clone();
    assert!(seen.len() >= 3);
    assert!(seen.iter().all(|j| *j == jkt), "every MCP proof carries it");
    let (stores, _) = sealed(&db, &ring).await;
    let after = stores
        .credentials()
        .load_dpop_key(&key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        after.version, stored_key.version,
        "the key record was never rewritten"
    );
    assert_eq!(after.record, stored_key.record);
    let creds = stores
        .credentials()
        .load(&key)
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(creds.token_type, "DPoP");
    assert!(server.is_live_refresh_token(creds.refresh_token.unwrap().expose_secret()));
}

/// A DPoP key that cannot be read (damaged, sealed with a key the keyring
/// does not hold), or is gone while tokens bound to it are stored, is a typed
/// error at connect time; the record is left as it was, never replaced by a
/// new key that would orphan the bound refresh token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_or_missing_key_is_a_typed_error_never_a_new_key() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let world = start_dpop(false).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let (_, ring) = SealKey::generate().unwrap();
    let (stores, backend) = sealed(&db, ring.expose_secret()).await;
    let (_t, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&auth(&world.mcp_url, &stores))
        .await
        .unwrap();
    client.authorize(None, headless).await.unwrap();
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    let key = CredentialKey::new(&issuer, &resource).unwrap();
    let raw_key = declare::DPOP_KEY.key(&[&issuer, &resource]);
    let stored_key = stores
        .credentials()
        .load_dpop_key(&key)
        .await
        .unwrap()
        .expect("authorizing stored a DPoP key")
        .record;
    let connect = |stores: Stores| {
        let url = world.mcp_url.clone();
        async move { auth(&url, &stores).connect(reqwest::Client::new()).await }
    };
    let is_unreadable = |error: &DurableAuthError| {
        matches!(
            error,
            DurableAuthError::DpopKey {
                problem: DpopKeyProblem::Unreadable,
                ..
            }
        )
    };

    // Damaged.
    let damaged = b"{\"kind\":\"dpop_key\",\"schema\":1,\"record\":{\"oops\":1}}".to_vec();
    backend
        .put(
            &raw_key,
            damaged.clone(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .unwrap();
    let error = connect(stores.clone())
        .await
        .expect_err("a damaged key is refused");
    assert!(is_unreadable(&error), "{error:?}");
    let still = backend.get(&raw_key).await.unwrap().unwrap().value;
    assert_eq!(still, damaged, "the damaged record is kept, not replaced");

    // Sealed with a key this keyring does not hold (the credentials still
    // open): the key is unreadable, not missing.
    backend.delete(&raw_key, None).await.unwrap();
    let (_, other_ring) = SealKey::generate().unwrap();
    let (foreign, _) = sealed(&db, other_ring.expose_secret()).await;
    foreign
        .credentials()
        .create_dpop_key(&stored_key)
        .await
        .unwrap();
    let sealed_elsewhere = backend.get(&raw_key).await.unwrap().unwrap().value;
    let error = connect(stores.clone())
        .await
        .expect_err("a key sealed with another keyring is refused");
    assert!(is_unreadable(&error), "{error:?}");
    assert!(
        !format!("{error} {error:?}").contains(stored_key.private_key.expose_secret()),
        "{error:?}"
    );
    let still = backend.get(&raw_key).await.unwrap().unwrap().value;
    assert_eq!(still, sealed_elsewhere, "the sealed record is kept");

    // The whole store opened with the wrong keyring: a typed store error,
    // and nothing written.
    let credentials = declare::CREDENTIALS.key(&[&issuer, &resource]);
    let before = backend.get(&credentials).await.unwrap().unwrap();
    let (_, wrong_ring) = SealKey::generate().unwrap();
    let (wrong, _) = sealed(&db, wrong_ring.expose_secret()).await;
    let error = connect(wrong)
        .await
        .expect_err("the wrong keyring is refused");
    assert!(
        matches!(
            &error,
            DurableAuthError::Store {
                source: mcp_persist_core::Error::Sealing { .. }
            }
        ),
        "{error:?}"
    );
    let after = backend.get(&credentials).await.unwrap().unwrap();
    assert_eq!(after.version, before.version, "the credentials are kept");
    let still = backend.get(&raw_key).await.unwrap().unwrap().value;
    assert_eq!(still, sealed_elsewhere, "no new key");

    // Missing while bound tokens are stored.
    backend.delete(&raw_key, None).await.unwrap();
    let error = connect(stores.clone())
        .await
        .expect_err("a missing key is refused");
    assert!(
        matches!(
            error,
            DurableAuthError::DpopKey {
                problem: DpopKeyProblem::Missing,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(backend.get(&raw_key).await.unwrap().is_none(), "no new key");

    // With the bound credentials gone too, a new authorization makes a new
    // key, and the tokens it gets are bound to that one.
    backend.delete(&credentials, None).await.unwrap();
    let client = connect(stores.clone())
        .await
        .expect("nothing bound is left");
    client.authorize(None, headless).await.unwrap();
    let fresh = stores
        .credentials()
        .load_dpop_key(&key)
        .await
        .unwrap()
        .expect("a new key")
        .record;
    assert_ne!(fresh.thumbprint, stored_key.thumbprint);
    assert_eq!(
        client.dpop_thumbprint().await.unwrap().as_deref(),
        Some(fresh.thumbprint.as_str())
    );
}

/// Workload identity: the JWT-bearer grant with an assertion from a
/// callback, its token stored like any other (a restart uses it), and
/// renewed with a fresh assertion once it nears expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_identity_token_is_stored_and_renewed_with_a_fresh_assertion() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let world: World = start(1).await;
    let server = world.servers[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token.jwt");
    std::fs::write(&file, "workload-assertion-1\n").unwrap();
    server.accept_assertion("workload-assertion-1");
    let stores = Stores::new(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
    let config = |stores: &Stores| {
        auth(&world.mcp_url, stores).registration(Registration::WorkloadIdentity {
            client_id: Some("workload-1".into()),
            assertion: AssertionSource::file(&file),
            issuer: None,
        })
    };
    let (transport, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&config(&stores))
        .await
        .unwrap();
    client.authorize_workload_identity(None).await.unwrap();
    assert_eq!(server.jwt_bearer_grants(), 1);
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();

    // A restart uses the stored token: no grant.
    let (transport, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&config(&stores))
        .await
        .unwrap();
    assert!(client.is_authorized().await);
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    assert_eq!(server.jwt_bearer_grants(), 1, "the stored token was used");

    // Near expiry, the next request renews it with the platform's new token.
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    expire(&stores.credentials(), &server.issuer, &resource).await;
    std::fs::write(&file, "workload-assertion-2").unwrap();
    server.accept_assertion("workload-assertion-2");
    let (transport, _h, _client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&config(&stores))
        .await
        .unwrap();
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    assert_eq!(server.jwt_bearer_grants(), 2, "renewed once");

    // A refused grant is a typed error, not retried.
    std::fs::write(&file, "unknown-assertion").unwrap();
    let (_t, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&config(&stores))
        .await
        .unwrap();
    let requests = server.requests();
    let error = client.authorize_workload_identity(None).await.unwrap_err();
    assert!(
        matches!(
            &error,
            DurableAuthError::TokenRequest { status: 400, error: Some(e), .. } if e == "invalid_grant"
        ),
        "{error:?}"
    );
    assert!(!format!("{error} {error:?}").contains("unknown-assertion"));
    // Discovery (metadata) plus the one token request.
    assert!(server.requests() - requests <= 2, "no retry");
}

/// Enterprise-managed authorization: the user's ID token is exchanged at the
/// enterprise identity provider for an ID-JAG, redeemed at the resource's
/// authorization server; the token and its expiry are stored by issuer and
/// resource, so a restarted process calls the server with no new exchange.
/// An ID token the provider does not know is a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enterprise_token_is_stored_and_a_restart_needs_no_new_exchange() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let world: World = start(1).await;
    let server = world.servers[0].clone();
    server.pre_register("enterprise-client", "enterprise-secret");
    server.accept_id_token("user-id-token", "enterprise-client");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let config = |stores: &Stores| {
        DurableAuth::new(world.mcp_url.clone(), stores.credentials()).pre_registered(
            "enterprise-client",
            Some(mcp_persist_core::Secret::new("enterprise-secret")),
            None,
        )
    };
    let identity = |id_token: &str| {
        EnterpriseIdentity::with_id_token(
            IDP_ISSUER,
            format!("{}/token", server.issuer),
            "idp-client",
            mcp_persist_core::Secret::new(id_token),
        )
    };
    {
        let stores = Stores::new(SqliteStore::open(&db).await.unwrap());
        let (_t, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
            .build_with_auth(&config(&stores))
            .await
            .unwrap();
        client
            .authorize_enterprise(None, &identity("user-id-token"))
            .await
            .unwrap();
        assert_eq!(server.token_exchanges(), 1);
        assert_eq!(server.jwt_bearer_grants(), 1);
    }

    // A new process on the same file: stored, with its expiry, by issuer
    // and resource; the MCP server is called with it, no exchange made.
    let stores = Stores::new(SqliteStore::open(&db).await.unwrap());
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let key = CredentialKey::new(&server.issuer, &resource).unwrap();
    let stored = stores
        .credentials()
        .load(&key)
        .await
        .unwrap()
        .expect("stored by issuer and resource")
        .record;
    assert!(stored.expires_at.is_some(), "its expiry is stored");
    assert!(stored.refresh_token.is_none());
    let (transport, _h, client) = DurableClientBuilder::new(world.mcp_url.clone(), &stores)
        .build_with_auth(&config(&stores))
        .await
        .unwrap();
    assert!(client.is_authorized().await);
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    assert_eq!(server.token_exchanges(), 1, "no new exchange");
    assert_eq!(server.jwt_bearer_grants(), 1, "no new grant");
    assert_eq!(server.authorizations(), 0, "no user agent");

    // An ID token the provider refuses: typed, with no token text.
    let error = client
        .authorize_enterprise(None, &identity("stolen-id-token"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, DurableAuthError::Enterprise { .. }),
        "{error:?}"
    );
    assert!(!format!("{error} {error:?}").contains("stolen-id-token"));
    let after = stores
        .credentials()
        .load(&key)
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(after, stored, "the stored token is kept");
}
