//! Three processes sharing one SQLite store refresh the same expiring
//! credential at once: one refresh request reaches the authorization server
//! and all three go on with the rotated token. The same again with the
//! credentials in Secrets Manager (moto) and the rest in SQLite.
//!
//! The children are this test binary run again with
//! `MCP_PERSIST_AUTH_CHILD` set; `child` does nothing otherwise.

#![cfg(feature = "auth")]

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use crate::auth_support::{backend::Backend, expire, headless, start};
use mcp_persist_core::{CredentialKey, Stores, canonical_url};
use mcp_persist_transport_http::{
    auth::{DurableAuth, DurableAuthBuild},
    client::DurableClientBuilder,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};

const CHILD: &str = "MCP_PERSIST_AUTH_CHILD";

fn auth(url: &str, stores: &Stores) -> DurableAuth {
    DurableAuth::new(url, stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("auth-processes-test")
}

/// The child's work: wait for the start signal, then one MCP request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.splitn(5, '|');
    let (db, url, go, profile, backend) = (
        PathBuf::from(parts.next().unwrap()),
        parts.next().unwrap().to_owned(),
        PathBuf::from(parts.next().unwrap()),
        parts.next().unwrap().to_owned(),
        Backend::parse(parts.next().unwrap()),
    );
    let stores = backend.open(&db).await;
    let (transport, _handle, client) = DurableClientBuilder::new(url.clone(), &stores)
        .profile(profile)
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
    assert!(go.exists(), "start signal");
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();
    println!("CHILD-DONE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_refresh_one_expiring_credential_with_one_request() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    three_processes_refresh(Backend::Sqlite, [None, None, None]).await;
}

/// Where Debian's `libfaketime` puts the library that steps a process's
/// wall clock (`cargo xtask test` installs it).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The same three processes, two of them with their wall clock stepped
/// forward (by two and by ten minutes, far past the lease TTL) through
/// libfaketime: no clock decides who holds the refresh lease, so one
/// refresh request still reaches the authorization server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_stepped_forward_still_refresh_once() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    if !std::path::Path::new(FAKETIME_LIB).exists() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        assert!(
            !ci,
            "{FAKETIME_LIB} is missing: run the tests through `cargo xtask test`, \
             which installs libfaketime"
        );
        eprintln!("skipped: libfaketime is not installed (`cargo xtask test` installs it)");
        return;
    }
    three_processes_refresh(Backend::Sqlite, [None, Some("+2m"), Some("+10m")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vault_split_three_processes_refresh_one_expiring_credential_with_one_request() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let Some(backend) = Backend::vault_split("auth-processes") else {
        return;
    };
    three_processes_refresh(backend, [None, None, None]).await;
}

/// Three child processes refresh at once, with state on `backend`; child
/// `i` has its wall clock stepped by `skews[i]` (a libfaketime offset such
/// as `+2m`), its monotonic clock untouched.
#[allow(clippy::unwrap_used)]
async fn three_processes_refresh(backend: Backend, skews: [Option<&str>; 3]) {
    let world = start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let go = dir.path().join("go");
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();

    {
        let stores = backend.open(&db).await;
        let (_transport, _handle, client) =
            DurableClientBuilder::new(world.mcp_url.clone(), &stores)
                .build_with_auth(&auth(&world.mcp_url, &stores))
                .await
                .unwrap();
        client.authorize(None, headless).await.unwrap();
        expire(&stores.credentials(), &issuer, &resource).await;
    }
    let requests_before = world.auth(0).requests();

    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for (i, skew) in skews.into_iter().enumerate() {
        let spec = format!(
            "{}|{}|{}|child-{i}|{backend}",
            db.display(),
            world.mcp_url,
            go.display()
        );
        let mut command = Command::new(&exe);
        command
            .args([
                "--exact",
                &crate::support::test_path(module_path!(), "child"),
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(skew) = skew {
            command
                .env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME", skew)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_DONT_RESET", "1");
        }
        let mut child = command.spawn().unwrap();
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
        let line = tokio::task::block_in_place(|| {
            rx.iter()
                .find(|l| l.contains("CHILD-READY"))
                .expect("child got ready")
        });
        assert!(line.contains("CHILD-READY"));
    }
    std::fs::write(&go, b"go").unwrap();
    for (mut child, rx) in children {
        // Bounded: a child that hangs is killed after two minutes.
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
    }

    assert_eq!(world.auth(0).refreshes(), 1, "exactly one refresh request");
    assert_eq!(
        world
            .auth(0)
            .rejected_refreshes
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        world.auth(0).requests(),
        requests_before + 1,
        "nothing else reached the authorization server"
    );
    let fresh = world.auth(0).refreshed_access_tokens.lock().unwrap()[0].clone();
    let bearer = world.mcp.bearer.lock().unwrap().clone();
    assert!(bearer.len() >= 3);
    assert!(
        bearer.iter().all(|t| *t == fresh),
        "all three used the new token"
    );

    let stores = backend.open(&db).await;
    let key = CredentialKey::new(&issuer, &resource).unwrap();
    backend.assert_credentials_placed(&db, &key).await;
    let stored = stores
        .credentials()
        .load(&key)
        .await
        .unwrap()
        .unwrap()
        .record;
    assert_eq!(stored.access_token.expose_secret(), fresh);
    assert!(
        world
            .auth(0)
            .is_live_refresh_token(stored.refresh_token.unwrap().expose_secret())
    );
}
