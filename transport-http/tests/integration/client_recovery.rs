//! The durable client against a real rmcp server in this process: 404
//! recovery, bad stored state, a store failing at runtime, state kept per
//! endpoint and profile, and recovery of interrupted requests.

use crate::client_support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use mcp_persist_core::{
    Backend, ClientStateStore, Error, InFlightRequest, KvEntry, KvStore, MemoryStore, PutMode,
    PutOptions, RequestId, Result as StoreResult, ServerKey, Version,
};
use mcp_persist_transport_http::client::{
    ClientNotice, DurableClientBuilder, LostReason, Recovery, StartKind,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};
use serde_json::json;

fn echo(n: i64) -> CallToolRequestParams {
    CallToolRequestParams::new("echo")
        .with_arguments(json!({ "n": n }).as_object().cloned().expect("object"))
}

/// Runs one client process's worth of work: `calls` echo calls, then a
/// clean close (which keeps the session).
async fn run_client(
    url: &str,
    store: &Arc<MemoryStore>,
    calls: i64,
) -> (StartKind, Vec<ClientNotice>) {
    let (transport, handle) = DurableClientBuilder::new(url, store.clone())
        .build()
        .await
        .expect("build");
    let client = ().serve(transport).await.expect("serve");
    for n in 0..calls {
        client.call_tool(echo(n)).await.expect("echo");
    }
    handle.flush().await;
    client.cancel().await.expect("close");
    (handle.start(), handle.notices())
}

#[tokio::test]
async fn deleted_session_is_reinitialized_once_and_reported() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    let mut notices = handle.subscribe();
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(1)).await.expect("echo");
    let old = handle.session_id().expect("session");

    server.forget_all_sessions().await;
    client.call_tool(echo(2)).await.expect("echo after 404");
    let new = handle.session_id().expect("new session");
    assert_ne!(old, new);
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 2);

    let mut seen = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await {
        seen.push(n.clone());
        if matches!(
            n,
            ClientNotice::NewSession {
                replaced: Some(_),
                ..
            }
        ) {
            break;
        }
    }
    assert!(
        seen.contains(&ClientNotice::SessionExpired {
            session_id: old.clone()
        }),
        "{seen:?}"
    );
    assert!(
        seen.contains(&ClientNotice::NewSession {
            session_id: new.clone(),
            replaced: Some(old)
        }),
        "{seen:?}"
    );

    // The new session is stored for the next process.
    handle.flush().await;
    let key = ServerKey::new(&server.url, "default").expect("key");
    let stored = ClientStateStore::new(store.clone())
        .session(&key)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(stored.record.session_id, new);
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn restart_after_server_lost_the_session_reinitializes_once() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    run_client(&server.url, &store, 1).await;
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 1);
    // The server restarts without a session store: every session is gone.
    server.forget_all_sessions().await;

    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert!(handle.resumed());
    let old = handle.session_id().expect("stored session");
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(7)).await.expect("echo after 404");
    client.call_tool(echo(8)).await.expect("echo");
    assert_eq!(
        server.stats.initializes.load(Ordering::SeqCst),
        2,
        "one re-initialize"
    );
    let new = handle.session_id().expect("new session");
    assert_ne!(new, old);
    assert!(
        handle
            .notices()
            .contains(&ClientNotice::SessionExpired { session_id: old })
    );
    handle.flush().await;
    client.cancel().await.expect("close");

    // And the process after that resumes the new session without initialize.
    let (start, _) = run_client(&server.url, &store, 1).await;
    assert_eq!(start, StartKind::Resumed { session_id: new });
    assert_eq!(server.stats.initializes.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn state_is_kept_per_endpoint_and_profile() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    run_client(&server.url, &store, 1).await;
    // Another profile on the same endpoint starts fresh...
    let (_, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .profile("other")
        .build()
        .await
        .expect("build");
    assert_eq!(handle.start(), StartKind::Fresh);
    // ...and so does another endpoint with the same profile.
    let other_url = server.url.replace("/mcp", "/other");
    let (_, handle) = DurableClientBuilder::new(&other_url, store.clone())
        .build()
        .await
        .expect("build");
    assert_eq!(handle.start(), StartKind::Fresh);
    // The recorded one resumes.
    let (_, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert!(handle.resumed());
}

/// Stores a session with a first client, then damages the stored record
/// with `damage`; a second client must start fresh and never send the bad
/// state.
async fn bad_state_case(
    damage: impl FnOnce(serde_json::Value) -> Vec<u8>,
) -> (StartKind, Vec<ClientNotice>, String) {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    run_client(&server.url, &store, 1).await;
    let keys = store
        .list(mcp_persist_core::declare::LEGACY_SESSION.prefix)
        .await
        .expect("list");
    assert_eq!(keys.len(), 1);
    let entry = store.get(&keys[0]).await.expect("get").expect("entry");
    let envelope: serde_json::Value = serde_json::from_slice(&entry.value).expect("json");
    let old_session = envelope["record"]["session_id"]
        .as_str()
        .expect("sid")
        .to_owned();
    store
        .put(
            &keys[0],
            damage(envelope),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("damage");

    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert!(!handle.resumed());
    assert_eq!(
        handle.initialize_result(),
        None,
        "nothing bad is offered as stored"
    );
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(1)).await.expect("echo works");
    client.cancel().await.expect("close");
    assert_eq!(
        server.stats.initializes.load(Ordering::SeqCst),
        2,
        "a fresh session"
    );
    let sessions = server.stats.sessions();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert!(sessions.iter().all(|s| s.is_ascii() && !s.contains(' ')));
    assert_eq!(sessions[0], old_session);
    (handle.start(), handle.notices(), old_session)
}

/// A journal entry that does not read back is told to the application
/// and lists nothing, while the stored session still resumes, on this
/// start and the next: reading changes nothing stored.
#[tokio::test]
async fn a_damaged_journal_entry_is_reported_and_the_session_still_resumes() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    run_client(&server.url, &store, 1).await;
    let server_key = ServerKey::new(&server.url, "default").expect("key");
    let session = ClientStateStore::new(store.clone())
        .session(&server_key)
        .await
        .expect("read")
        .expect("a stored session")
        .record
        .session_id;
    let entry = mcp_persist_core::declare::IN_FLIGHT_REQUEST
        .try_key(&[
            server_key.profile(),
            server_key.endpoint(),
            session.as_str(),
            "7",
        ])
        .expect("journal key");
    store
        .put(
            &entry,
            b"\x00not a journal entry".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("damage");
    for run in 0..2 {
        let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
            .build()
            .await
            .expect("build");
        assert!(handle.resumed(), "run {run}: {:?}", handle.start());
        assert!(
            handle.notices().iter().any(|n| matches!(
                n,
                ClientNotice::BadStoredState { reason } if reason.contains("journal")
            )),
            "run {run}: {:?}",
            handle.notices()
        );
        let client = ().serve(transport).await.expect("serve");
        client.call_tool(echo(run)).await.expect("echo works");
        handle.flush().await;
        client.cancel().await.expect("close");
    }
    assert_eq!(
        server.stats.initializes.load(Ordering::SeqCst),
        1,
        "the stored session was resumed both times"
    );
    assert!(
        store.get(&entry).await.expect("get").is_some(),
        "the damaged entry is left as it is"
    );
}

#[tokio::test]
async fn corrupt_record_starts_fresh_with_a_reason() {
    let (start, notices, _) = bad_state_case(|_| b"\x00\xffnot json".to_vec()).await;
    assert!(
        matches!(start, StartKind::FreshAfterBadState { ref reason } if reason.contains("corrupt")),
        "{start:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, ClientNotice::BadStoredState { .. }))
    );
}

#[tokio::test]
async fn non_ascii_session_id_never_reaches_the_wire() {
    let (start, _, _) = bad_state_case(|mut v| {
        v["record"]["session_id"] = "bad id\u{e9}".into();
        serde_json::to_vec(&v).expect("json")
    })
    .await;
    assert!(
        matches!(start, StartKind::FreshAfterBadState { .. }),
        "{start:?}"
    );
}

#[tokio::test]
async fn unparseable_initialize_result_starts_fresh() {
    let (start, _, _) = bad_state_case(|mut v| {
        v["record"]["initialize_result"] = json!({"not": "an initialize result"});
        serde_json::to_vec(&v).expect("json")
    })
    .await;
    assert!(
        matches!(start, StartKind::FreshAfterBadState { ref reason } if reason.contains("InitializeResult")),
        "{start:?}"
    );
}

/// A stored request-id mark at the top of the range (or past it, or
/// negative) leaves no ids to continue the session with: the client starts
/// a fresh session, never panics and never repeats an id.
#[tokio::test]
async fn exhausted_or_impossible_request_ids_start_fresh() {
    for mark in [
        i64::MAX,
        mcp_persist_core::MAX_REQUEST_ID - 1,
        mcp_persist_core::MAX_REQUEST_ID + 1,
        -5,
    ] {
        let (start, _, _) = bad_state_case(|mut v| {
            v["record"]["request_id_high_water"] = mark.into();
            serde_json::to_vec(&v).expect("json")
        })
        .await;
        assert!(
            matches!(start, StartKind::FreshAfterBadState { ref reason } if reason.contains("high-water")),
            "mark {mark}: {start:?}"
        );
    }
}

#[tokio::test]
async fn newer_schema_is_neither_used_nor_overwritten() {
    let (start, notices, _) = bad_state_case(|mut v| {
        v["schema"] = 99.into();
        serde_json::to_vec(&v).expect("json")
    })
    .await;
    assert!(
        matches!(start, StartKind::InMemory { ref reason } if reason.contains("newer")),
        "{start:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, ClientNotice::StoreDegraded { .. }))
    );
}

/// A backend that starts failing when told to.
#[derive(Debug, Default)]
struct FailingStore {
    inner: MemoryStore,
    failing: AtomicBool,
}

impl FailingStore {
    fn check(&self) -> StoreResult<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::backend(
                "failing",
                std::io::Error::other("disk full"),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for FailingStore {
    fn backend_name(&self) -> &'static str {
        "failing"
    }
}

#[async_trait]
impl KvStore for FailingStore {
    async fn get(&self, key: &mcp_persist_core::Key) -> StoreResult<Option<KvEntry>> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn put(
        &self,
        key: &mcp_persist_core::Key,
        value: Vec<u8>,
        options: PutOptions,
    ) -> StoreResult<Version> {
        self.check()?;
        self.inner.put(key, value, options).await
    }
    async fn delete(
        &self,
        key: &mcp_persist_core::Key,
        if_version: Option<Version>,
    ) -> StoreResult<bool> {
        self.check()?;
        self.inner.delete(key, if_version).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Vec<mcp_persist_core::Key>> {
        self.check()?;
        self.inner.list(prefix).await
    }
}

#[tokio::test]
async fn failing_store_degrades_to_memory_and_calls_keep_working() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(FailingStore::default());
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .id_block(4)
        .journal_delay(Duration::ZERO)
        .build()
        .await
        .expect("build");
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(0)).await.expect("echo");
    handle.flush().await;
    assert!(handle.persisting());

    store.failing.store(true, Ordering::SeqCst);
    // Enough calls to need new id blocks and journal writes.
    for n in 1..20 {
        client
            .call_tool(echo(n))
            .await
            .expect("echo while the store fails");
    }
    handle.flush().await;
    assert!(!handle.persisting());
    assert!(
        handle.notices().iter().any(
            |n| matches!(n, ClientNotice::StoreDegraded { reason } if reason.contains("disk full"))
        ),
        "{:?}",
        handle.notices()
    );
    // Ids stayed unique on the wire.
    let requests = server.stats.requests.lock().expect("lock").clone();
    let mut ids: Vec<_> = requests.iter().map(|r| r.1.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn unreadable_store_at_start_gives_an_in_memory_client() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(FailingStore::default());
    store.failing.store(true, Ordering::SeqCst);
    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert!(matches!(handle.start(), StartKind::InMemory { .. }));
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(1)).await.expect("echo");
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn interrupted_requests_without_cursor_or_with_task_are_reported_not_resent() {
    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());
    run_client(&server.url, &store, 1).await;
    let key = ServerKey::new(&server.url, "default").expect("key");
    let state = ClientStateStore::new(store.clone());
    let session = state
        .session(&key)
        .await
        .expect("read")
        .expect("stored")
        .record
        .session_id;
    let lost = InFlightRequest::new(
        RequestId::Number(900),
        "tools/call",
        Some(json!({"name": "echo", "arguments": {"n": 42}})),
    );
    let mut task = lost.clone();
    task.id = RequestId::Number(901);
    task.task_id = Some("task-17".into());
    state
        .record_inflight(&key, &session, &lost)
        .await
        .expect("journal");
    state
        .record_inflight(&key, &session, &task)
        .await
        .expect("journal");
    let calls_before = server.stats.requests.lock().expect("lock").len();

    let (transport, handle) = DurableClientBuilder::new(&server.url, store.clone())
        .build()
        .await
        .expect("build");
    assert_eq!(handle.interrupted().len(), 2);
    let recoveries = handle.recover();
    let mut kinds = Vec::new();
    for r in &recoveries {
        match r {
            Recovery::Lost {
                request, reason, ..
            } => {
                assert_eq!(*reason, LostReason::NoCursor);
                assert_eq!(request.method, "tools/call");
                assert_eq!(
                    request.params.as_ref().expect("params")["arguments"]["n"],
                    42
                );
                kinds.push("lost");
            }
            Recovery::Task(task) => {
                assert_eq!(task.task_id(), "task-17");
                kinds.push("task");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    kinds.sort();
    assert_eq!(kinds, ["lost", "task"]);
    // Nothing was sent again.
    let client = ().serve(transport).await.expect("serve");
    assert_eq!(
        server.stats.requests.lock().expect("lock").len(),
        calls_before
    );
    // Dismissed entries leave the journal.
    for r in &recoveries {
        handle.dismiss(r.request());
    }
    handle.flush().await;
    assert!(
        state
            .inflight(&key, &session)
            .await
            .expect("read")
            .is_empty()
    );
    client.cancel().await.expect("close");
}
