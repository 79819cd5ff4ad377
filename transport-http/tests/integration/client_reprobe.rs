//! A stored era verdict that stops working is re-probed once, not looped:
//! a server replaced on the same address by a legacy-only one costs one
//! `server/discover`, and a server that keeps refusing fails the request
//! after that one probe.

use crate::client_support;

use std::sync::{Arc, atomic::Ordering};

use crate::client_support::{Fixture, TestServer};
use mcp_persist_core::{ClientStateStore, MemoryStore, ProtocolEra, ServerKey};
use mcp_persist_transport_http::client::{ClientNotice, DurableClientBuilder};
use rmcp::{
    model::{CallToolRequestParams, ErrorCode, ProtocolVersion},
    service::{ClientLifecycleMode, ClientServiceExt, ServiceError},
};

fn echo() -> CallToolRequestParams {
    CallToolRequestParams::new("echo").with_arguments(
        serde_json::json!({"n": 1})
            .as_object()
            .cloned()
            .expect("object"),
    )
}

fn auto() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    }
}

fn count(server: &TestServer, method: &str) -> usize {
    server
        .wire
        .lock()
        .expect("lock")
        .iter()
        .filter(|r| r.http_method == "POST" && r.rpc_method.as_deref() == Some(method))
        .count()
}

async fn stored_era(store: &Arc<MemoryStore>, url: &str) -> Option<ProtocolEra> {
    let key = ServerKey::new(url, "default").expect("key");
    ClientStateStore::new(store.clone())
        .profile(&key)
        .await
        .expect("profile")
        .map(|p| p.era)
}

fn assert_refused(result: Result<rmcp::model::CallToolResult, ServiceError>) {
    match result {
        Err(ServiceError::McpError(e)) => assert!(
            [ErrorCode::UNSUPPORTED_PROTOCOL_VERSION.0, -32004, -32001].contains(&e.code.0),
            "{e:?}"
        ),
        other => panic!("expected an unsupported-version error, got {other:?}"),
    }
}

#[tokio::test]
async fn modern_verdict_against_a_now_legacy_server_is_reprobed_once() {
    let modern = client_support::start_server_with(1, Fixture::Rmcp).await;
    let url = modern.url.clone();
    let addr = modern.addr;
    let store = Arc::new(MemoryStore::new());

    // A modern verdict with a fresh discover cache is stored.
    let (transport, handle) = DurableClientBuilder::new(&url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve_with_lifecycle(transport, auto()).await.expect("serve");
    client.call_tool(echo()).await.expect("echo");
    handle.flush().await;
    client.cancel().await.expect("close");
    assert_eq!(stored_era(&store, &url).await, Some(ProtocolEra::Modern));
    drop(modern);

    // The same address now serves a legacy-only server.
    let legacy = client_support::start_server_on(Some(addr), 1, Fixture::LegacyOnly).await;

    // Started on the cached verdict: the refused call forgets it and probes
    // once; the running rmcp service cannot switch eras, so the call fails.
    let (transport, handle) = DurableClientBuilder::new(&url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve_with_lifecycle(transport, auto()).await.expect("serve");
    assert_refused(client.call_tool(echo()).await);
    // A second refusal in the same process probes no more.
    assert_refused(client.call_tool(echo()).await);
    handle.flush().await;
    client.cancel().await.expect("close");
    assert_eq!(count(&legacy, "server/discover"), 1, "one re-probe");
    assert_eq!(count(&legacy, "tools/call"), 2);
    let stale: Vec<_> = handle
        .notices()
        .into_iter()
        .filter(|n| matches!(n, ClientNotice::StaleVerdict { .. }))
        .collect();
    assert_eq!(stale.len(), 1, "{stale:?}");
    let ClientNotice::StaleVerdict {
        stale: old,
        new_verdict,
        ..
    } = &stale[0]
    else {
        unreachable!()
    };
    assert_eq!(old, "modern 2026-07-28");
    assert_eq!(new_verdict.as_deref(), Some("legacy 2025-11-25"));
    assert_eq!(stored_era(&store, &url).await, Some(ProtocolEra::Legacy));

    // The restarted client goes straight to initialize and succeeds: no
    // further probe.
    let (transport, handle) = DurableClientBuilder::new(&url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve_with_lifecycle(transport, auto()).await.expect("serve");
    let result = client
        .call_tool(echo())
        .await
        .expect("echo on the legacy server");
    assert_eq!(result.is_error, Some(false));
    handle.flush().await;
    client.cancel().await.expect("close");
    assert_eq!(count(&legacy, "server/discover"), 1, "still one probe");
    assert_eq!(legacy.stats.initializes.load(Ordering::SeqCst), 1);
    assert_eq!(legacy.stats.runs_of("echo"), 1);
}

#[tokio::test]
async fn a_server_that_keeps_refusing_fails_after_one_reprobe() {
    let server = client_support::start_server_with(1, Fixture::Refusing).await;
    let store = Arc::new(MemoryStore::new());
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve_with_lifecycle(transport, auto()).await.expect("serve");
    assert_eq!(count(&server, "server/discover"), 1, "the startup probe");

    // Refused: one re-probe (still modern, version supported), one retry,
    // refused again: the error surfaces.
    assert_refused(client.call_tool(echo()).await);
    assert_eq!(count(&server, "server/discover"), 2);
    assert_eq!(count(&server, "tools/call"), 2);

    // Refused again in the same process: no probe, no retry.
    assert_refused(client.call_tool(echo()).await);
    assert_eq!(count(&server, "server/discover"), 2);
    assert_eq!(count(&server, "tools/call"), 3);
    handle.flush().await;
    client.cancel().await.expect("close");
    let stale = handle
        .notices()
        .into_iter()
        .filter(|n| matches!(n, ClientNotice::StaleVerdict { .. }))
        .count();
    assert_eq!(stale, 1);
    // The re-probe stored what it found.
    assert_eq!(
        stored_era(&store, &server.url).await,
        Some(ProtocolEra::Modern)
    );
}
