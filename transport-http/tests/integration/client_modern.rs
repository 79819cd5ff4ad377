//! The 2026-07-28 era: a stored verdict and a fresh discover cache mean no
//! probe and no session header after a restart; a legacy-only server is
//! reached through one fallback, and after a restart directly.

use crate::client_support;

use std::sync::{Arc, atomic::Ordering};

use crate::client_support::{Fixture, WireRecord};
use mcp_persist_core::MemoryStore;
use mcp_persist_transport_http::client::DurableClientBuilder;
use rmcp::{
    model::{CallToolRequestParams, ProtocolVersion},
    service::{ClientLifecycleMode, ClientServiceExt},
};

fn echo() -> CallToolRequestParams {
    CallToolRequestParams::new("echo").with_arguments(
        serde_json::json!({"n": 1})
            .as_object()
            .cloned()
            .expect("object"),
    )
}

async fn run(url: &str, store: &Arc<MemoryStore>, lifecycle: ClientLifecycleMode) {
    let (transport, handle) = DurableClientBuilder::new(url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve_with_lifecycle(transport, lifecycle).await.expect("serve");
    let result = client.call_tool(echo()).await.expect("echo");
    assert_eq!(result.is_error, Some(false));
    handle.flush().await;
    client.cancel().await.expect("close");
}

fn methods(wire: &[WireRecord]) -> Vec<String> {
    wire.iter()
        .map(|r| {
            format!(
                "{} {}",
                r.http_method,
                r.rpc_method.clone().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test]
async fn modern_restart_sends_no_probe_and_no_session_header() {
    let server = client_support::start_server_with(1, Fixture::Rmcp).await;
    let store = Arc::new(MemoryStore::new());
    let modern = || ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    run(&server.url, &store, modern()).await;
    let first = server.wire.lock().expect("lock").clone();
    assert!(
        methods(&first).contains(&"POST server/discover".to_owned()),
        "{first:?}"
    );
    server.wire.lock().expect("lock").clear();

    run(&server.url, &store, modern()).await;
    let second = server.wire.lock().expect("lock").clone();
    assert_eq!(methods(&second), ["POST tools/call"], "{second:?}");
    assert!(
        second
            .iter()
            .all(|r| !r.session_header && !r.last_event_id_header),
        "{second:?}"
    );
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn legacy_only_server_is_reached_through_one_fallback_then_directly() {
    let server = client_support::start_server_with(1, Fixture::LegacyOnly).await;
    let store = Arc::new(MemoryStore::new());
    let auto = || ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    };
    run(&server.url, &store, auto()).await;
    let first = methods(&server.wire.lock().expect("lock"));
    let probes = first
        .iter()
        .filter(|m| *m == "POST server/discover")
        .count();
    assert_eq!(probes, 1, "one fallback: {first:?}");
    assert!(first.contains(&"POST initialize".to_owned()), "{first:?}");
    server.wire.lock().expect("lock").clear();

    // After a restart: no probe, no handshake; straight to the stored session.
    run(&server.url, &store, auto()).await;
    let second = methods(&server.wire.lock().expect("lock"));
    assert!(
        !second
            .iter()
            .any(|m| m.contains("server/discover") || m.contains("initialize")),
        "{second:?}"
    );
    assert!(second.contains(&"POST tools/call".to_owned()), "{second:?}");
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
}
