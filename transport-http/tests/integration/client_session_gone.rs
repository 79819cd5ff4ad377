//! A server that forgot the session, against the durable client: a real
//! rmcp server restarted on the same address (so it knows no session any
//! more), and one that answers 404 to `DELETE`. Collecting an interrupted
//! request says `SessionGone` and keeps the request listed, ending the
//! session succeeds, `start()` stops claiming the old session was resumed,
//! the next start is fresh, and rmcp logs no error on the way.

use crate::client_support;

use std::{
    io::Write,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use crate::client_support::{Fixture, TestServer};
use crate::slow_store::SlowStore;
use mcp_persist_core::{ClientStateStore, InFlightRequest, MemoryStore, RequestId, ServerKey};
use mcp_persist_transport_http::client::{
    ClientHandle, ClientStateSource, DurableClientBuilder, DurableTransport, LostReason, Recovery,
    RecoveryError, StartKind,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};
use serde_json::json;

fn echo(n: i64) -> CallToolRequestParams {
    CallToolRequestParams::new("echo")
        .with_arguments(json!({ "n": n }).as_object().cloned().expect("object"))
}

/// A new process's durable client of `url`, its state in `store`.
async fn build(url: &str, store: impl ClientStateSource) -> (DurableTransport, ClientHandle) {
    DurableClientBuilder::new(url, store)
        .build()
        .await
        .expect("build")
}

/// A first process: one call, then a clean close that keeps the session.
/// Then a request of that session is journaled as interrupted, with a
/// stream cursor, as a process killed mid-call leaves it.
async fn session_with_interrupted_call(url: &str, store: &Arc<MemoryStore>) -> InFlightRequest {
    let (transport, handle) = DurableClientBuilder::new(url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(1)).await.expect("echo");
    handle.flush().await;
    client.cancel().await.expect("close");
    let key = ServerKey::new(url, "default").expect("key");
    let state = ClientStateStore::new(store.clone());
    let session = state
        .session(&key)
        .await
        .expect("read")
        .expect("stored")
        .record
        .session_id;
    let mut request = InFlightRequest::new(
        RequestId::Number(900),
        "tools/call",
        Some(json!({"name": "slow"})),
    );
    request.last_event_id = Some("0/stream-of-900".into());
    state
        .record_inflight(&key, &session, &request)
        .await
        .expect("journal");
    request
}

/// The same server address, a new server process: no session survives.
async fn restart(server: TestServer, fixture: Fixture) -> TestServer {
    let addr = server.addr;
    drop(server);
    client_support::start_server_on(Some(addr), 1, fixture).await
}

async fn forgotten_session_case(fixture: Fixture) {
    let server = client_support::start_server_with(1, fixture).await;
    let store = Arc::new(MemoryStore::new());
    let interrupted = session_with_interrupted_call(&server.url, &store).await;
    let server = restart(server, fixture).await;

    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .recovery_timing(Duration::from_secs(10), Duration::from_millis(50))
        .build()
        .await
        .expect("build");
    assert!(handle.resumed(), "the stored session is offered");
    let stale = handle.session_id().expect("stored session");
    assert_eq!(handle.interrupted(), vec![interrupted.clone()]);

    // Collecting: the server's 404 on the resuming GET is `SessionGone`.
    let recoveries = handle.recover();
    assert_eq!(recoveries.len(), 1, "{recoveries:?}");
    let Some(Recovery::Resumable(resumed)) = recoveries.into_iter().next() else {
        panic!("the journaled request had a cursor");
    };
    let error = resumed.collect().await.expect_err("the session is gone");
    assert!(
        matches!(error, RecoveryError::SessionGone),
        "expected SessionGone, got {error:?}"
    );
    // Still listed: nothing is lost because one collection failed. Asked
    // again, it is lost, and says why.
    assert_eq!(handle.interrupted(), vec![interrupted.clone()]);
    assert_lost_with_session_gone(&handle, &interrupted);

    // The stored session is known to be gone: no longer offered.
    assert_eq!(handle.session_id(), None);
    assert!(!handle.resumed());
    assert!(
        matches!(handle.start(), StartKind::Replaced { ref expired, session_id: None } if *expired == stale),
        "{:?}",
        handle.start()
    );
    // So `serve` initializes at once instead of first meeting a 404.
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(3)).await.expect("echo");
    let fresh = handle.session_id().expect("a new session");
    assert_ne!(fresh, stale);
    assert_eq!(
        handle.start(),
        StartKind::Replaced {
            expired: stale.clone(),
            session_id: Some(fresh)
        }
    );
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
    client.cancel().await.expect("close");
    // Ending it: whatever the server answers to the DELETE (rmcp 202, or a
    // 404 from a server that forgot it), the session is ended.
    handle.end_session().await.expect("end_session succeeds");
    assert_eq!(handle.session_id(), None);
    // A session the server had already forgotten ends without a word too.
    let (_transport, gone) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert_eq!(gone.start(), StartKind::Fresh);
    gone.end_session().await.expect("nothing to end");
    // The request of the forgotten session is still listed, lost: neither
    // the 404 nor the ended sessions erased it.
    assert_lost_with_session_gone(&gone, &interrupted);
    drop(gone);

    // The next process starts fresh, with one real initialize.
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert_eq!(handle.start(), StartKind::Fresh);
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(2)).await.expect("echo");
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 2);
    assert_lost_with_session_gone(&handle, &interrupted);
    client.cancel().await.expect("close");
}

/// `handle` lists `request` as lost because its session is gone.
fn assert_lost_with_session_gone(handle: &ClientHandle, request: &InFlightRequest) {
    let recoveries = handle.recover();
    assert!(
        matches!(
            &recoveries[..],
            [Recovery::Lost { request: lost, reason: LostReason::SessionGone, .. }] if lost == request
        ),
        "{recoveries:?}"
    );
}

/// A process meets the 404 of a server that forgot the session and exits
/// without calling `recover()`: the requests journaled in that session stay
/// listed in every later process, lost with the reason, until dismissed.
#[tokio::test]
async fn a_404_erases_no_journaled_request() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    let interrupted = session_with_interrupted_call(&server.url, &store).await;
    let server = restart(server, Fixture::Rmcp).await;
    let build = || build(&server.url, store.clone());

    let (transport, handle) = build().await;
    let stale = handle.session_id().expect("stored session");
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(2)).await.expect("echo after the 404");
    assert!(handle.session_id().is_some_and(|s| s != stale));
    // Exits without looking at what was interrupted, and without a flush.
    client.cancel().await.expect("close");
    drop(handle);

    for _restart in 0..2 {
        let (_transport, handle) = build().await;
        assert!(handle.resumed(), "the new session is stored");
        assert_eq!(handle.interrupted(), vec![interrupted.clone()]);
        assert_lost_with_session_gone(&handle, &interrupted);
    }
    // Dismissed, it is gone for good (no flush: dropping commits it).
    let (_transport, handle) = build().await;
    handle.dismiss(&interrupted);
    drop((_transport, handle));
    let (_transport, handle) = build().await;
    assert!(
        handle.interrupted().is_empty(),
        "{:?}",
        handle.interrupted()
    );
    let key = ServerKey::new(&server.url, "default").expect("key");
    assert!(
        ClientStateStore::new(store.clone())
            .journal(&key)
            .await
            .expect("journal")
            .is_empty()
    );
}

/// On a runtime that runs on one thread (this test's), dropping a client
/// cannot wait for its store. A client built right after, in the same
/// process, still starts from what the dropped one ended with: a request
/// it dismissed is not handed back, however long the store takes to
/// delete it. (Found failing under load in CI: the next client read the
/// store while the dismissal was still being written.)
#[tokio::test]
async fn a_client_built_right_after_a_drop_starts_from_what_it_ended_with() {
    let server = client_support::start_server(1).await;
    let memory = Arc::new(MemoryStore::new());
    let interrupted = session_with_interrupted_call(&server.url, &memory).await;
    // Deletes take 300 ms: the dropped client's last writes are still
    // under way when the next client reads.
    let store =
        Arc::new(SlowStore::new(MemoryStore::clone(&memory)).deletes(Duration::from_millis(300)));
    let build = || build(&server.url, store.clone());

    let (transport, handle) = build().await;
    assert_eq!(handle.interrupted(), vec![interrupted.clone()]);
    handle.dismiss(&interrupted);
    drop((transport, handle));
    for _next in 0..2 {
        let (_transport, handle) = build().await;
        assert!(handle.resumed(), "the session is still stored");
        assert!(
            handle.interrupted().is_empty(),
            "a dismissed request came back: {:?}",
            handle.interrupted()
        );
    }
}

#[tokio::test]
async fn restarted_server_gives_session_gone_and_end_session_succeeds() {
    forgotten_session_case(Fixture::Rmcp).await;
}

#[tokio::test]
async fn server_answering_404_to_delete_still_ends_the_session() {
    forgotten_session_case(Fixture::DeleteNotFound).await;
}

#[tokio::test]
async fn end_session_on_a_forgotten_session_succeeds_against_a_404_delete() {
    let server = client_support::start_server_with(1, Fixture::DeleteNotFound).await;
    let store = Arc::new(MemoryStore::new());
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(1)).await.expect("echo");
    client.cancel().await.expect("close");
    handle
        .end_session()
        .await
        .expect("a 404 to DELETE ends it too");
    let key = ServerKey::new(&server.url, "default").expect("key");
    assert!(
        ClientStateStore::new(store.clone())
            .session(&key)
            .await
            .expect("read")
            .is_none(),
        "the stored session is forgotten"
    );
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

/// After the server forgot the session, a resumed process re-initializes
/// once; `start()` then says the stored session was replaced, and rmcp
/// logs no error about the old session's stream.
#[tokio::test]
async fn start_after_an_expired_session_reports_the_replacement_and_logs_no_error() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // This test's runtime runs on this thread only: every task it spawns
    // logs here.
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    session_with_interrupted_call(&server.url, &store).await;
    let server = restart(server, Fixture::Rmcp).await;

    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    let old = handle.session_id().expect("stored session");
    assert_eq!(
        handle.start(),
        StartKind::Resumed {
            session_id: old.clone()
        }
    );
    let client = ().serve(transport).await.expect("serve");
    // Let rmcp's standalone GET meet the 404 before the call re-initializes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.call_tool(echo(2)).await.expect("echo after 404");
    let new = handle.session_id().expect("new session");
    assert_ne!(new, old);
    assert_eq!(
        handle.start(),
        StartKind::Replaced {
            expired: old,
            session_id: Some(new)
        }
    );
    assert!(!handle.resumed());
    client.cancel().await.expect("close");

    let text = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("utf-8");
    assert!(
        !text.lines().any(|l| l.contains("ERROR")),
        "an error was logged:\n{text}"
    );
    assert!(text.contains("re-initializ"), "{text}");
}
