//! Conformance tests of the typed stores over a backend.
//!
//! These prove that the MCP-level promises hold on a given backend: records
//! round-trip, state is kept per server and per issuer, request ids never
//! repeat, a rotated refresh token is never lost, and event replay stays
//! within its stream.

use super::key;
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{KvFixture, LogFixture};
use crate::{
    AuthStore, ClientRegistration, ClientStateStore, CredentialKey, Credentials, Error, EventLog,
    EventLogConfig, InFlightRequest, LegacySession, PendingAuthorization, PutMode, PutOptions,
    RefreshOutcome, Secret, ServerKey, ServerProfile, ServerSession, ServerSessionStore, SessionId,
    Timestamp,
    records::{DiscoverCache, encode},
    types::{ProtocolEra, ProtocolVersion, RequestId},
};

fn server(path: &str) -> ServerKey {
    ServerKey::new(&format!("https://mcp.example.com{path}"), "default").expect("valid server key")
}

fn legacy_session(id: &str) -> LegacySession {
    let mut last_event_ids = BTreeMap::new();
    last_event_ids.insert("standalone".to_owned(), "evt-1".to_owned());
    LegacySession {
        session_id: SessionId::new(id).expect("valid session id"),
        protocol_version: ProtocolVersion::new("2025-11-25").expect("valid version"),
        initialize_result: serde_json::json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": true}, "logging": {}},
            "serverInfo": {"name": "conformance", "version": "1.0.0"},
            "instructions": "Be kind. ✓",
        }),
        request_id_high_water: 0,
        last_event_ids,
        created_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    }
}

fn credentials(issuer: &str, access: &str, refresh: &str) -> Credentials {
    Credentials {
        key: CredentialKey::new(issuer, "https://mcp.example.com/mcp").expect("valid key"),
        access_token: Secret::new(access),
        token_type: "Bearer".into(),
        expires_at: Some(Timestamp::now().plus(Duration::from_secs(3600))),
        refresh_token: Some(Secret::new(refresh)),
        scopes: vec!["mcp:tools".into()],
        client: ClientRegistration {
            client_id: format!("client-of-{issuer}"),
            client_secret: Some(Secret::new("client-secret")),
            metadata_url: None,
            token_endpoint_auth_method: Some("client_secret_basic".into()),
        },
        server_metadata: Some(serde_json::json!({"issuer": issuer})),
        obtained_at: Timestamp::now(),
    }
}

/// Profile, session and `InitializeResult` round-trip exactly.
pub async fn client_state_roundtrip(f: &dyn KvFixture) {
    let store = ClientStateStore::new(f.open_kv().await);
    let key = server("/mcp");
    assert!(store.profile(&key).await.expect("profile").is_none());
    assert!(store.session(&key).await.expect("session").is_none());

    let profile = ServerProfile {
        era: ProtocolEra::Modern,
        protocol_version: ProtocolVersion::new("2026-07-28").expect("version"),
        verdict_at: Timestamp::now(),
        discover: Some(DiscoverCache {
            result: serde_json::json!({"supportedVersions": ["2026-07-28"]}),
            fetched_at: Timestamp::now(),
            ttl_ms: 60_000,
            cache_scope: Some("shared".into()),
        }),
    };
    store
        .save_profile(&key, &profile)
        .await
        .expect("save profile");
    let session = legacy_session("sess-roundtrip");
    store
        .save_session(&key, &session, PutMode::Create)
        .await
        .expect("save session");

    // A reopened store, as after a restart.
    let store = ClientStateStore::new(f.open_kv().await);
    assert_eq!(store.profile(&key).await.expect("profile"), Some(profile));
    let stored = store
        .session(&key)
        .await
        .expect("session")
        .expect("present");
    assert_eq!(stored.record, session);
    assert_eq!(
        stored.record.initialize_result["instructions"],
        "Be kind. ✓"
    );

    // A second initialize racing the first does not overwrite it.
    let err = store
        .save_session(&key, &legacy_session("sess-other"), PutMode::Create)
        .await
        .expect_err("second create");
    assert!(matches!(err, Error::AlreadyExists { .. }), "got {err:?}");

    store.forget_session(&key).await.expect("forget");
    assert!(store.session(&key).await.expect("session").is_none());
}

/// State recorded for one endpoint or profile is never seen under another.
pub async fn client_state_is_per_server_key(f: &dyn KvFixture) {
    let store = ClientStateStore::new(f.open_kv().await);
    let a = server("/a");
    let a_sub = server("/a/b");
    let a_other_profile = ServerKey::new("https://mcp.example.com/a", "second").expect("key");
    store
        .save_session(&a, &legacy_session("sess-a"), PutMode::Create)
        .await
        .expect("save");
    assert!(store.session(&a_sub).await.expect("session").is_none());
    assert!(
        store
            .session(&a_other_profile)
            .await
            .expect("session")
            .is_none()
    );
    // Spellings of the same URL share state.
    let a_spelled = ServerKey::new("HTTPS://MCP.example.com:443/a/", "default").expect("key");
    assert_eq!(
        store
            .session(&a_spelled)
            .await
            .expect("session")
            .expect("present")
            .record
            .session_id
            .as_str(),
        "sess-a"
    );
    // Journals of one server do not show under a server whose URL extends it.
    let sid = SessionId::new("sess-a").expect("id");
    store
        .record_inflight(&a, &sid, &inflight(1, "tools/call"))
        .await
        .expect("journal");
    assert!(
        store
            .inflight(&a_sub, &sid)
            .await
            .expect("inflight")
            .is_empty()
    );
    assert_eq!(store.inflight(&a, &sid).await.expect("inflight").len(), 1);
    assert!(store.journal(&a_sub).await.expect("journal").is_empty());
    assert!(
        store
            .journal(&a_other_profile)
            .await
            .expect("journal")
            .is_empty()
    );
    let all = store.journal(&a).await.expect("journal");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].0, sid);
}

fn inflight(id: i64, method: &str) -> InFlightRequest {
    InFlightRequest {
        id: RequestId::Number(id),
        method: method.into(),
        params: Some(serde_json::json!({"name": "slow", "arguments": {"n": id}})),
        last_event_id: None,
        task_id: None,
        sent_at: Timestamp::now(),
        // Kept through every backend, so that a recovered call continues
        // its trace.
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
    }
}

/// Request ids reserved before a reopen are never handed out again, also
/// when several holders reserve at once.
pub async fn request_ids_continue_across_reopen(f: &dyn KvFixture) {
    let key = server("/ids");
    let first = {
        let store = ClientStateStore::new(f.open_kv().await);
        store
            .save_session(&key, &legacy_session("sess-ids"), PutMode::Create)
            .await
            .expect("save");
        store.reserve_request_ids(&key, 10).await.expect("reserve")
    };
    assert_eq!(first, 0..10);
    let store = ClientStateStore::new(f.open_kv().await);
    let mut handles = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let mut ranges = Vec::new();
            for _ in 0..5 {
                ranges.push(store.reserve_request_ids(&key, 10).await.expect("reserve"));
            }
            ranges
        }));
    }
    let mut ranges = vec![first];
    for h in handles {
        ranges.extend(h.await.expect("task"));
    }
    ranges.sort_by_key(|r| r.start);
    for pair in ranges.windows(2) {
        assert!(
            pair[0].end <= pair[1].start,
            "overlapping id ranges {:?}",
            pair
        );
    }
    assert_eq!(ranges.last().expect("ranges").end, 210);
    // Without a stored session there is nothing to number.
    let err = store
        .reserve_request_ids(&server("/none"), 1)
        .await
        .expect_err("no session");
    assert!(matches!(err, Error::NotFound { .. }), "got {err:?}");

    // Impossible stored marks are Corrupt naming the key, never a panic or
    // an id handed out twice: near the top of the range, and negative.
    for (path, mark) in [
        ("/ids-top", crate::MAX_REQUEST_ID - 5),
        ("/ids-max", i64::MAX),
        ("/ids-negative", -1),
    ] {
        let key = server(path);
        let mut session = legacy_session("sess-top");
        session.request_id_high_water = mark;
        store
            .save_session(&key, &session, PutMode::Create)
            .await
            .expect("save");
        let err = store
            .reserve_request_ids(&key, 10)
            .await
            .expect_err("an exhausted mark must not hand out ids");
        assert!(
            matches!(&err, Error::Corrupt { key, .. } if key.contains("session")),
            "got {err:?}"
        );
        let kept = store.session(&key).await.expect("read").expect("present");
        assert_eq!(kept.record.request_id_high_water, mark, "the mark moved");
    }
    // The last ids below the top are still handed out.
    let key = server("/ids-last");
    let mut session = legacy_session("sess-last");
    session.request_id_high_water = crate::MAX_REQUEST_ID - 10;
    store
        .save_session(&key, &session, PutMode::Create)
        .await
        .expect("save");
    assert_eq!(
        store.reserve_request_ids(&key, 10).await.expect("reserve"),
        crate::MAX_REQUEST_ID - 10..crate::MAX_REQUEST_ID
    );
}

/// Ids reserved in a session as read go on from the mark read; when the
/// session changed since (another holder reserved, or it was forgotten),
/// it is read again: no range overlaps another, and a forgotten session
/// hands out none.
pub async fn request_ids_reserved_after_a_read_never_overlap(f: &dyn KvFixture) {
    let key = server("/ids-after");
    let store = ClientStateStore::new(f.open_kv().await);
    let other = ClientStateStore::new(f.open_kv().await);
    store
        .save_session(&key, &legacy_session("sess-after"), PutMode::Create)
        .await
        .expect("save");
    let read = || async { store.session(&key).await.expect("read").expect("stored") };
    let first = read().await;
    assert_eq!(
        store
            .reserve_request_ids_after(&key, first.clone(), 10)
            .await
            .expect("reserve"),
        0..10
    );
    // The same read again, stale now.
    assert_eq!(
        store
            .reserve_request_ids_after(&key, first, 10)
            .await
            .expect("reserve"),
        10..20
    );
    // Another holder reserves between this one's read and its reservation.
    let before = read().await;
    assert_eq!(
        other.reserve_request_ids(&key, 10).await.expect("reserve"),
        20..30
    );
    assert_eq!(
        store
            .reserve_request_ids_after(&key, before, 10)
            .await
            .expect("reserve"),
        30..40
    );
    // Forgotten after the read: nothing to number, nothing written.
    let before = read().await;
    store.forget_session(&key).await.expect("forget");
    let err = store
        .reserve_request_ids_after(&key, before, 10)
        .await
        .expect_err("a forgotten session");
    assert!(matches!(err, Error::NotFound { .. }), "got {err:?}");
    assert!(store.session(&key).await.expect("read").is_none());
}

/// The in-flight journal keeps requests until completed, with cursors.
pub async fn inflight_journal_roundtrip(f: &dyn KvFixture) {
    let store = ClientStateStore::new(f.open_kv().await);
    let key = server("/journal");
    let sid = SessionId::new("sess-journal").expect("id");
    store
        .save_session(&key, &legacy_session("sess-journal"), PutMode::Create)
        .await
        .expect("save");
    for id in 1..=3 {
        store
            .record_inflight(&key, &sid, &inflight(id, "tools/call"))
            .await
            .expect("journal");
    }
    let mut with_cursor = inflight(2, "tools/call");
    with_cursor.last_event_id = Some("cursor-2".into());
    store
        .record_inflight(&key, &sid, &with_cursor)
        .await
        .expect("update");
    let mut string_id = inflight(0, "resources/read");
    string_id.id = RequestId::String("req/with/slashes".into());
    store
        .record_inflight(&key, &sid, &string_id)
        .await
        .expect("journal");
    store
        .complete_inflight(&key, &sid, &RequestId::Number(1))
        .await
        .expect("complete");

    let store = ClientStateStore::new(f.open_kv().await);
    let left = store.inflight(&key, &sid).await.expect("inflight");
    let ids: Vec<RequestId> = left.iter().map(|r| r.id.clone()).collect();
    assert_eq!(left.len(), 3, "{ids:?}");
    assert!(ids.contains(&RequestId::Number(2)) && ids.contains(&RequestId::Number(3)));
    assert!(ids.contains(&RequestId::String("req/with/slashes".into())));
    let two = left
        .iter()
        .find(|r| r.id == RequestId::Number(2))
        .expect("2");
    assert_eq!(two.last_event_id.as_deref(), Some("cursor-2"));
    assert_eq!(two.params, with_cursor.params);
    // Forgetting the session keeps its journal: an entry leaves only when
    // completed, and the whole journal of the server lists it with the
    // session it was sent in, however that session is spelled.
    store.forget_session(&key).await.expect("forget");
    assert!(store.session(&key).await.expect("session").is_none());
    assert_eq!(store.inflight(&key, &sid).await.expect("inflight").len(), 3);
    let odd = SessionId::new("sess%2F/odd").expect("id");
    store
        .record_inflight(&key, &odd, &inflight(7, "tools/call"))
        .await
        .expect("journal");
    let store = ClientStateStore::new(f.open_kv().await);
    let all = store.journal(&key).await.expect("journal");
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(
        all.iter().filter(|(s, _)| *s == sid).count() == 3,
        "{all:?}"
    );
    assert!(
        all.iter()
            .any(|(s, r)| *s == odd && r.id == RequestId::Number(7)),
        "{all:?}"
    );
    for (session, request) in &all {
        store
            .complete_inflight(&key, session, &request.id)
            .await
            .expect("complete");
    }
    assert!(store.journal(&key).await.expect("journal").is_empty());
}

/// Credentials round-trip with their secrets, and one issuer never sees
/// another issuer's credentials for the same resource.
pub async fn credentials_roundtrip_and_issuer_isolation(f: &dyn KvFixture) {
    let store = AuthStore::new(f.open_kv().await);
    let creds = credentials("https://as-one.example", "access-1", "refresh-1");
    store.save(&creds).await.expect("save");
    let store = AuthStore::new(f.open_kv().await);
    let loaded = store
        .load(&creds.key)
        .await
        .expect("load")
        .expect("present");
    assert_eq!(loaded.record, creds);
    assert_eq!(
        loaded
            .record
            .refresh_token
            .as_ref()
            .map(Secret::expose_secret),
        Some("refresh-1")
    );
    let other =
        CredentialKey::new("https://as-two.example", "https://mcp.example.com/mcp").expect("key");
    assert!(
        store.load(&other).await.expect("load").is_none(),
        "issuer isolation broken"
    );
    let same_resource_spelled =
        CredentialKey::new("https://as-one.example", "HTTPS://mcp.example.com/mcp/").expect("key");
    assert!(
        store
            .load(&same_resource_spelled)
            .await
            .expect("load")
            .is_some()
    );
    store.delete(&creds.key).await.expect("delete");
    assert!(store.load(&creds.key).await.expect("load").is_none());
}

/// Two refreshers that read the same credential race to store their
/// rotated tokens: exactly one wins, the loser gets `Conflict`, and the
/// winner's token is what stays.
pub async fn refresh_rotation_race_newer_token_wins(f: &dyn KvFixture) {
    let store = AuthStore::new(f.open_kv().await);
    let creds = credentials("https://as.example", "access-0", "refresh-0");
    let v0 = store.save(&creds).await.expect("save");
    let mut handles = Vec::new();
    for i in 1..=2 {
        let store = AuthStore::new(f.open_kv().await);
        let mut fresh = creds.clone();
        fresh.access_token = Secret::new(format!("access-{i}"));
        fresh.refresh_token = Some(Secret::new(format!("refresh-{i}")));
        handles.push(tokio::spawn(
            async move { (i, store.replace(&fresh, v0).await) },
        ));
    }
    let mut winners = Vec::new();
    for h in handles {
        match h.await.expect("task") {
            (i, Ok(_)) => winners.push(i),
            (_, Err(Error::Conflict { .. })) => {}
            (_, Err(e)) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one rotation must win");
    let stored = store
        .load(&creds.key)
        .await
        .expect("load")
        .expect("present");
    assert_eq!(
        stored
            .record
            .refresh_token
            .as_ref()
            .map(Secret::expose_secret),
        Some(format!("refresh-{}", winners[0]).as_str()),
        "the winner's rotated token must be the stored one"
    );
    assert!(stored.version > v0);
}

/// Four holders refreshing the same credential at once through
/// [`AuthStore::refresh`]: the refresh function runs exactly once, and
/// every holder ends with the new token.
pub async fn refresh_lease_has_one_holder(f: &dyn KvFixture) {
    let store = AuthStore::new(f.open_kv().await);
    let creds = credentials("https://as.example", "old-access", "old-refresh");
    let seen = store.save(&creds).await.expect("save");
    let calls = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..4 {
        let store = AuthStore::new(f.open_kv().await);
        let calls = Arc::clone(&calls);
        let key = creds.key.clone();
        handles.push(tokio::spawn(async move {
            store
                .refresh(&key, seen, Duration::from_secs(20), |old| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        old.refresh_token.as_ref().map(Secret::expose_secret),
                        Some("old-refresh")
                    );
                    // Hold the lease a moment, as a network round trip would.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let mut fresh = old;
                    fresh.access_token = Secret::new("new-access");
                    fresh.refresh_token = Some(Secret::new("new-refresh"));
                    Ok(fresh)
                })
                .await
                .expect("refresh")
        }));
    }
    let mut refreshed_here = 0;
    for h in handles {
        let outcome = h.await.expect("task");
        if matches!(outcome, RefreshOutcome::Refreshed(_)) {
            refreshed_here += 1;
        }
        let stored = outcome.into_stored();
        assert_eq!(stored.record.access_token.expose_secret(), "new-access");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the refresh token was spent more than once"
    );
    assert_eq!(refreshed_here, 1);
    // A failed refresh leaves the credential as it was and frees the lease.
    let current = store
        .load(&creds.key)
        .await
        .expect("load")
        .expect("present");
    let err = store
        .refresh(
            &creds.key,
            current.version,
            Duration::from_secs(5),
            |_| async { Err::<Credentials, _>("invalid_grant".into()) },
        )
        .await
        .expect_err("refresh must fail");
    assert!(matches!(err, Error::Refresh { .. }), "got {err:?}");
    assert!(
        store
            .try_lease(&creds.key, Duration::from_secs(5))
            .await
            .expect("lease")
            .is_some()
    );
    assert_eq!(
        store
            .load(&creds.key)
            .await
            .expect("load")
            .expect("present")
            .version,
        current.version
    );
}

/// A pending authorization is taken exactly once, and expires.
pub async fn pending_authorization_taken_once(f: &dyn KvFixture) {
    let store = AuthStore::new(f.open_kv().await);
    let pending = PendingAuthorization {
        pkce_verifier: Secret::new("verifier-abc"),
        state: Secret::new("state-123"),
        expected_issuer: "https://as.example".into(),
        resource: "https://mcp.example.com/mcp".into(),
        redirect_uri: Some("http://127.0.0.1:9/callback".into()),
        extra: None,
        created_at: Timestamp::now(),
    };
    store
        .save_pending(&pending, Duration::from_secs(600))
        .await
        .expect("save");
    // The key never holds the state text.
    let kv = f.open_kv().await;
    for key in kv
        .list(crate::declare::PENDING_AUTHORIZATION.prefix)
        .await
        .expect("list")
    {
        assert!(
            !key.contains("state-123"),
            "state value used as a key: {key}"
        );
    }
    let mut handles = Vec::new();
    for _ in 0..4 {
        let store = AuthStore::new(f.open_kv().await);
        handles.push(tokio::spawn(async move {
            store.take_pending("state-123").await.expect("take")
        }));
    }
    let mut taken = 0;
    for h in handles {
        if let Some(p) = h.await.expect("task") {
            assert_eq!(p, pending);
            taken += 1;
        }
    }
    assert_eq!(taken, 1, "a pending authorization must be used once");
    assert!(
        store
            .take_pending("state-123")
            .await
            .expect("take")
            .is_none()
    );
    let mut short = pending.clone();
    short.state = Secret::new("state-short");
    store
        .save_pending(&short, Duration::from_millis(150))
        .await
        .expect("save");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store
            .peek_pending("state-short")
            .await
            .expect("peek")
            .is_none(),
        "expired pending returned"
    );
}

/// Server sessions round-trip, cannot be created twice, expire when idle and
/// stay alive while touched.
pub async fn server_session_roundtrip(f: &dyn KvFixture) {
    let store = ServerSessionStore::new(f.open_kv().await, Duration::from_secs(600));
    let session = ServerSession {
        session_id: SessionId::new("srv-1").expect("id"),
        initialize_params: serde_json::json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "c", "version": "1"},
        }),
        principal: Some("user-42".into()),
        created_at: Timestamp::now(),
        last_seen: Timestamp::now(),
    };
    store.create(&session).await.expect("create");
    let err = store.create(&session).await.expect_err("duplicate");
    assert!(matches!(err, Error::AlreadyExists { .. }), "got {err:?}");
    let other_instance = ServerSessionStore::new(f.open_kv().await, Duration::from_secs(600));
    assert_eq!(
        other_instance
            .load(&session.session_id)
            .await
            .expect("load"),
        Some(session.clone())
    );
    assert!(
        other_instance
            .touch(&session.session_id)
            .await
            .expect("touch")
    );
    assert!(
        other_instance
            .delete(&session.session_id)
            .await
            .expect("delete"),
        "a live session was ended"
    );
    assert!(
        !store
            .delete(&session.session_id)
            .await
            .expect("delete again"),
        "nothing left to end"
    );
    assert!(
        store
            .load(&session.session_id)
            .await
            .expect("load")
            .is_none()
    );
    assert!(
        !store
            .touch(&SessionId::new("srv-unknown").expect("id"))
            .await
            .expect("touch")
    );

    let idle = ServerSessionStore::new(f.open_kv().await, Duration::from_millis(300));
    let mut short = session.clone();
    short.session_id = SessionId::new("srv-idle").expect("id");
    idle.create(&short).await.expect("create");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        idle.load(&short.session_id).await.expect("load").is_none(),
        "idle session not expired"
    );
}

/// The backend key under which the client session of the server whose path
/// contains `path_part` is stored, found through `list` as a tool would.
async fn raw_session_key(kv: &dyn crate::KvStore, path_part: &str) -> crate::Key {
    kv.list(crate::declare::LEGACY_SESSION.prefix)
        .await
        .expect("list")
        .into_iter()
        .find(|k| k.contains(path_part))
        .expect("the session's key is listed")
}

/// A record written by a newer schema is `NewerSchema` through every typed
/// store, and is left untouched.
pub async fn newer_schema_is_typed_error(f: &dyn KvFixture) {
    let kv = f.open_kv().await;
    let store = ClientStateStore::new(kv.clone());
    let key = server("/future");
    store
        .save_session(&key, &legacy_session("sess-future"), PutMode::Create)
        .await
        .expect("save");
    let raw_key = raw_session_key(&*kv, "future").await;
    let mut envelope: serde_json::Value =
        serde_json::from_slice(&kv.get(&raw_key).await.expect("get").expect("present").value)
            .expect("json");
    envelope["schema"] = serde_json::json!(2);
    envelope["record"]["field_from_the_future"] = serde_json::json!(true);
    let future = serde_json::to_vec(&envelope).expect("json");
    kv.put(
        &raw_key,
        future.clone(),
        PutOptions::new(PutMode::Overwrite),
    )
    .await
    .expect("put");

    let err = store
        .session(&key)
        .await
        .expect_err("newer schema must not load");
    assert!(
        matches!(
            err,
            Error::NewerSchema {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "got {err:?}"
    );
    // A compare-and-swap update refuses too, and the record stays as written.
    assert!(store.reserve_request_ids(&key, 1).await.is_err());
    assert_eq!(
        kv.get(&raw_key).await.expect("get").expect("present").value,
        future
    );
}

/// Garbage and truncated records are `Corrupt` naming the key; other keys
/// still read.
pub async fn corrupt_record_is_typed_error(f: &dyn KvFixture) {
    let kv = f.open_kv().await;
    let store = ClientStateStore::new(kv.clone());
    let good = server("/good");
    let bad = server("/bad");
    store
        .save_session(&good, &legacy_session("sess-good"), PutMode::Create)
        .await
        .expect("save");
    store
        .save_session(&bad, &legacy_session("sess-bad"), PutMode::Create)
        .await
        .expect("save");
    let raw_key = raw_session_key(&*kv, "bad").await;
    let bytes = encode(&legacy_session("sess-bad")).expect("encode");
    for broken in [
        bytes[..bytes.len() / 2].to_vec(),
        b"\xff\xfe garbage".to_vec(),
    ] {
        kv.put(&raw_key, broken, PutOptions::new(PutMode::Overwrite))
            .await
            .expect("put");
        let err = store
            .session(&bad)
            .await
            .expect_err("corrupt must not load");
        assert!(
            matches!(err, Error::Corrupt { ref key, .. } if raw_key == *key),
            "got {err:?}"
        );
        assert!(
            store
                .session(&good)
                .await
                .expect("good still reads")
                .is_some()
        );
    }
}

fn event_store(kv: Arc<dyn crate::KvStore>, log: Arc<dyn crate::LogStore>) -> EventLog {
    EventLog::new(kv, log, EventLogConfig::new(Duration::from_secs(600), 1000))
}

/// Events replay after an id with their original ids, in order.
pub async fn event_replay_roundtrip(f: &dyn LogFixture) {
    let store = event_store(f.open_kv().await, f.open_log().await);
    let sid = SessionId::new("sess-ev").expect("id");
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(
            store
                .append(&key("s1"), Some(&sid), &serde_json::json!({"n": n}))
                .await
                .expect("append"),
        );
    }
    let replayed = store
        .replay_after(&ids[3].to_string(), Some(&sid))
        .await
        .expect("replay");
    assert_eq!(
        replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        ids[4..].to_vec()
    );
    assert_eq!(replayed[0].payload, serde_json::json!({"n": 4}));
    assert!(
        store
            .replay_after(&ids[9].to_string(), Some(&sid))
            .await
            .expect("replay")
            .is_empty()
    );
    // Ids are distinct strings, and all carry the stream's token.
    let texts: std::collections::HashSet<String> = ids.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), ids.len());
}

/// Interleaved streams never leak into each other's replay, and one
/// stream's id cannot be rewritten to read another.
pub async fn event_replay_never_crosses_streams(f: &dyn LogFixture) {
    let store = event_store(f.open_kv().await, f.open_log().await);
    let a_sess = SessionId::new("sess-a").expect("id");
    let b_sess = SessionId::new("sess-b").expect("id");
    let mut a_ids = Vec::new();
    let mut b_ids = Vec::new();
    for n in 0..5 {
        a_ids.push(
            store
                .append(&key("a"), Some(&a_sess), &serde_json::json!({"a": n}))
                .await
                .expect("append"),
        );
        b_ids.push(
            store
                .append(&key("b"), Some(&b_sess), &serde_json::json!({"b": n}))
                .await
                .expect("append"),
        );
    }
    let replayed = store
        .replay_after(&a_ids[0].to_string(), Some(&a_sess))
        .await
        .expect("replay");
    assert_eq!(replayed.len(), 4);
    assert!(
        replayed
            .iter()
            .all(|e| e.id.stream() == "a" && e.payload.get("a").is_some())
    );
    // Rewriting the stream part of a's id to b's keeps a's token: refused.
    let forged = format!("{}-{}-b", &a_ids[0].to_string()[..32], b_ids[0].seq());
    let err = store
        .replay_after(&forged, Some(&b_sess))
        .await
        .expect_err("forged id");
    assert!(matches!(err, Error::NotFound { .. }), "got {err:?}");
    // b's genuine id asked for under a's session: refused, says so.
    let err = store
        .replay_after(&b_ids[0].to_string(), Some(&a_sess))
        .await
        .expect_err("other session");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
    // A session's stream asked for by a request naming no session: refused
    // (a sessionless request must never read a session's events).
    let err = store
        .replay_after(&a_ids[0].to_string(), None)
        .await
        .expect_err("no session");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
    // A stream recorded without a session, asked for within a session:
    // refused too, so no session reaches sessionless streams.
    let loose = store
        .append(&key("loose"), None, &serde_json::json!({"loose": 0}))
        .await
        .expect("append");
    let err = store
        .replay_after(&loose.to_string(), Some(&a_sess))
        .await
        .expect_err("sessionless stream");
    assert!(matches!(err, Error::InvalidInput { .. }), "got {err:?}");
}

/// Another instance (a reopened store) replays and tails what the first
/// one wrote.
pub async fn event_replay_after_reopen(f: &dyn LogFixture) {
    let writer = event_store(f.open_kv().await, f.open_log().await);
    let first = writer
        .append(&key("tail"), None, &serde_json::json!(1))
        .await
        .expect("append");
    let second = writer
        .append(&key("tail"), None, &serde_json::json!(2))
        .await
        .expect("append");
    let reader = event_store(f.open_kv().await, f.open_log().await);
    let replayed = reader
        .replay_after(&first.to_string(), None)
        .await
        .expect("replay");
    assert_eq!(
        replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        vec![second.clone()]
    );
    let tail = tokio::spawn({
        let reader = reader.clone();
        let second = second.clone();
        async move {
            reader
                .tail(&second, Duration::from_secs(10))
                .await
                .expect("tail")
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = writer
        .append(&key("tail"), None, &serde_json::json!(3))
        .await
        .expect("append");
    let got = tokio::time::timeout(Duration::from_secs(10), tail)
        .await
        .expect("tail returned")
        .expect("task");
    assert_eq!(
        got.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        vec![third]
    );
}

/// Malformed, unknown and forged event ids are refused with typed errors.
pub async fn forged_event_id_is_rejected(f: &dyn LogFixture) {
    let store = event_store(f.open_kv().await, f.open_log().await);
    let id = store
        .append(&key("s"), None, &serde_json::json!(null))
        .await
        .expect("append");
    let with_space = format!("{}-1-has space", &id.to_string()[..32]);
    for malformed in ["", "garbage", "1-2-3", with_space.as_str()] {
        let err = store
            .replay_after(malformed, None)
            .await
            .expect_err("malformed");
        assert!(
            matches!(err, Error::InvalidInput { .. }),
            "{malformed:?}: {err:?}"
        );
    }
    let text = id.to_string();
    let flipped = format!(
        "{}{}",
        if text.starts_with('0') { '1' } else { '0' },
        &text[1..]
    );
    let err = store
        .replay_after(&flipped, None)
        .await
        .expect_err("wrong token");
    assert!(matches!(err, Error::NotFound { .. }), "got {err:?}");
    let unknown = format!("{}-1-never-written", &text[..32]);
    let err = store
        .replay_after(&unknown, None)
        .await
        .expect_err("unknown stream");
    assert!(matches!(err, Error::NotFound { .. }), "got {err:?}");
}

/// A stream whose log expired while its metadata lived on, and was then
/// written again, never serves an event under an id sent before: those ids
/// are refused, the new events get ids no earlier event had, and they
/// replay among themselves. Synchronous events are written again by their
/// first writer and by a fresh instance; pipelined ones (one writer at a
/// time) by a fresh instance continuing the stream. (Backends that number a
/// log afresh after it expires would otherwise hand out the same ids for
/// other events.)
pub async fn restarted_event_log_never_serves_old_ids(f: &dyn LogFixture) {
    let retention = Duration::from_secs(2);
    // One after the other, pipelined first: a pipelined writer numbers its
    // stream itself, and on a backend whose numbers are shared by every log
    // appends elsewhere in between would tell it other numbers.
    let pipelined = RestartedLog::write(f, retention, crate::EventDurability::PIPELINED).await;
    let synced = RestartedLog::write(f, retention, crate::EventDurability::Synced).await;
    // The logs have expired (a log lives at most a sixteenth past its TTL);
    // the streams' metadata is kept longer than the logs, so it may still be
    // here.
    tokio::time::sleep(retention + retention / 4).await;
    pipelined.write_again(f).await;
    synced.write_again(f).await;
}

/// A pipelined writer that starts a stream whose name an expired log still
/// holds (its metadata gone too) sends the numbers the backend stores, so
/// its ids replay: a backend may number such a log afresh or go on above
/// the expired records.
pub async fn pipelined_stream_over_an_expired_log_sends_stored_numbers(f: &dyn LogFixture) {
    let retention = Duration::from_millis(800);
    let config =
        EventLogConfig::new(retention, 1000).with_durability(crate::EventDurability::PIPELINED);
    let stream = "pipelined-over-expired";
    let first = EventLog::new(f.open_kv().await, f.open_log().await, config);
    let mut old = Vec::new();
    for n in 0..3 {
        old.push(
            first
                .append(stream, None, &serde_json::json!({ "old": n }))
                .await
                .expect("append"),
        );
    }
    // Committed (within the pipeline's window, later on a loaded machine),
    // then the stream's metadata goes and its log expires.
    let waited = std::time::Instant::now();
    while first.replay_after(&old[0].to_string(), None).await.is_err() {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the pipelined events were not committed within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.open_kv()
        .await
        .delete(&crate::declare::EVENT_STREAM.key(&[stream]), None)
        .await
        .expect("delete the metadata");
    tokio::time::sleep(retention + retention / 4).await;

    let fresh = EventLog::new(f.open_kv().await, f.open_log().await, config);
    let mut new = Vec::new();
    for n in 0..3 {
        new.push(
            fresh
                .append(stream, None, &serde_json::json!({ "new": n }))
                .await
                .expect("append over the expired log"),
        );
    }
    let replayed = fresh
        .replay_after(&new[0].to_string(), None)
        .await
        .expect("the first new id replays");
    assert_eq!(
        replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        new[1..].to_vec(),
        "every id sent is the number stored"
    );
}

/// A stream written before its log expires, for
/// [`restarted_event_log_never_serves_old_ids`].
struct RestartedLog {
    config: EventLogConfig,
    writer: EventLog,
    session: SessionId,
    stream: String,
    old: Vec<crate::EventId>,
}

impl RestartedLog {
    async fn write(
        f: &dyn LogFixture,
        retention: Duration,
        durability: crate::EventDurability,
    ) -> Self {
        let config = EventLogConfig::new(retention, 1000).with_durability(durability);
        let writer = EventLog::new(f.open_kv().await, f.open_log().await, config);
        let session = SessionId::new("sess-restart").expect("id");
        let name = match durability {
            crate::EventDurability::Synced => "restarted-synced",
            _ => "restarted-pipelined",
        };
        let stream = name.to_owned();
        let mut old = Vec::new();
        for n in 0..3 {
            old.push(
                writer
                    .append(&stream, Some(&session), &serde_json::json!({ "old": n }))
                    .await
                    .expect("append"),
            );
        }
        // Stored (and, pipelined, committed) before the log expires.
        let first = writer
            .replay_after(&old[0].to_string(), Some(&session))
            .await
            .expect("replay before expiry");
        assert_eq!(first.len(), 2, "{durability:?}");
        RestartedLog {
            config,
            writer,
            session,
            stream,
            old,
        }
    }

    /// Writes the stream again after its log expired: a synchronous one by
    /// its first writer and by a fresh instance, a pipelined one (one writer
    /// at a time) by a fresh instance continuing it.
    async fn write_again(&self, f: &dyn LogFixture) {
        let RestartedLog {
            config,
            writer,
            session,
            stream,
            old,
        } = self;
        let durability = config.durability;
        let sid = Some(session);
        let fresh = EventLog::new(f.open_kv().await, f.open_log().await, *config);
        let mut new = Vec::new();
        if durability == crate::EventDurability::Synced {
            new.push(
                writer
                    .append(stream, sid, &serde_json::json!({ "new": 0 }))
                    .await
                    .expect("append after expiry"),
            );
        }
        for n in new.len()..2 {
            new.push(
                fresh
                    .append(stream, sid, &serde_json::json!({ "new": n }))
                    .await
                    .expect("append by another instance"),
            );
        }
        let sent: std::collections::HashSet<String> = old.iter().map(ToString::to_string).collect();
        for id in &new {
            assert!(
                !sent.contains(&id.to_string()),
                "{durability:?}: a new event got the id {id} an old one was sent with"
            );
        }
        // Replayed where the new events were written last (a pipelined one
        // is committed by then), then anywhere.
        let replayed = fresh
            .replay_after(&new[0].to_string(), sid)
            .await
            .expect("replay of the new events");
        assert_eq!(
            replayed
                .iter()
                .map(|e| (e.id.clone(), e.payload.clone()))
                .collect::<Vec<_>>(),
            vec![(new[1].clone(), serde_json::json!({ "new": 1 }))],
            "{durability:?}"
        );
        for store in [writer, &fresh] {
            for id in old {
                match store.replay_after(&id.to_string(), sid).await {
                    Err(Error::NotFound { .. }) => {}
                    other => panic!("{durability:?}: the old id {id} was not refused: {other:?}"),
                }
            }
        }
    }
}

/// A refresh lease whose holder died is taken over only after the waiter
/// itself watched it unchanged for the lease TTL (no clock is compared, so
/// no clock step can hand it out early), and the dead holder's late release
/// does not free its successor's lease.
pub async fn refresh_lease_takeover_is_observed_not_timed(f: &dyn KvFixture) {
    let ttl = Duration::from_millis(300);
    let creds = credentials("https://as.example", "access", "refresh");
    let holder = AuthStore::new(f.open_kv().await);
    holder.save(&creds).await.expect("save");
    let dead = holder
        .try_lease(&creds.key, ttl)
        .await
        .expect("lease")
        .expect("free lease taken");
    let waiter = AuthStore::new(f.open_kv().await);
    assert!(
        waiter
            .try_lease(&creds.key, ttl)
            .await
            .expect("lease")
            .is_none(),
        "a held lease is not handed out"
    );
    tokio::time::sleep(ttl / 2).await;
    assert!(
        waiter
            .try_lease(&creds.key, ttl)
            .await
            .expect("lease")
            .is_none(),
        "not before the waiter watched it for the TTL"
    );
    tokio::time::sleep(ttl).await;
    let taken = waiter
        .try_lease(&creds.key, ttl)
        .await
        .expect("lease")
        .expect("taken over after the TTL");
    // The first holder wakes up and releases: the new lease stays.
    holder.release(dead).await.expect("release");
    let third = AuthStore::new(f.open_kv().await);
    assert!(
        third
            .try_lease(&creds.key, ttl)
            .await
            .expect("lease")
            .is_none(),
        "the successor's lease survived the late release"
    );
    waiter.release(taken).await.expect("release");
    assert!(
        third
            .try_lease(&creds.key, ttl)
            .await
            .expect("lease")
            .is_some()
    );
}

/// Pipelined events: ids come at once; a replay on the writing instance
/// waits for the pending commits and has no gap; another instance sees
/// every event once committed; an id whose event was never stored (lost
/// with its writer) is refused, never answered with a gap.
pub async fn pipelined_events_replay_whole_and_refuse_lost_ids(f: &dyn LogFixture) {
    use crate::stores::EventDurability;
    let config = EventLogConfig::default().with_durability(EventDurability::PIPELINED);
    let writer = EventLog::new(f.open_kv().await, f.open_log().await, config);
    let sid = SessionId::new("sess-pipe").expect("id");
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(
            writer
                .append(&key("piped"), Some(&sid), &serde_json::json!({ "n": n }))
                .await
                .expect("append"),
        );
    }
    let seqs: Vec<u64> = ids.iter().map(|id| id.seq()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let replayed = writer
        .replay_after(&ids[0].to_string(), Some(&sid))
        .await
        .expect("replay on the writer");
    assert_eq!(
        replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        ids[1..].to_vec()
    );
    let other = EventLog::new(f.open_kv().await, f.open_log().await, config);
    let seen = other
        .replay_after(&ids[49].to_string(), Some(&sid))
        .await
        .expect("replay elsewhere");
    assert_eq!(seen.len(), 50);
    assert_eq!(seen[0].payload, serde_json::json!({ "n": 50 }));
    // An id past what was stored: lost, refused.
    let last = ids.last().expect("ids").to_string();
    let (token, rest) = last.split_once('-').expect("token");
    let (_, stream) = rest.split_once('-').expect("seq");
    let lost = format!("{token}-{}-{stream}", seqs.last().expect("seq") + 3);
    match other.check(&lost, Some(&sid)).await {
        Err(Error::NotFound { what: "events", .. }) => {}
        other => panic!("a lost event id was not refused: {other:?}"),
    }
}

/// A pipelined stream started over a log its name left behind (a stream
/// deleted halfway: its log, not its metadata) sends the numbers its events
/// are stored under, above the old ones, however the backend numbers a new
/// stream's first event; another instance replays them whole once they are
/// committed, with the request the stream answers.
pub async fn pipelined_stream_over_a_left_log_sends_stored_numbers(f: &dyn LogFixture) {
    use crate::stores::EventDurability;
    let log = f.open_log().await;
    let name = crate::declare::EVENT.try_key(&["reused"]).expect("a log");
    let old = crate::records::encode_event(&serde_json::json!("old")).expect("encoded");
    let left = log
        .append(&name, vec![old; 3], None)
        .await
        .expect("old records");
    let config = EventLogConfig::default().with_durability(EventDurability::PIPELINED);
    let writer = EventLog::new(f.open_kv().await, log, config);
    let request = serde_json::json!("req-1");
    let mut ids = vec![
        writer
            .append_opening("reused", None, &serde_json::Value::Null, &request)
            .await
            .expect("opening event"),
    ];
    for n in 0..5 {
        ids.push(
            writer
                .append("reused", None, &serde_json::json!({ "n": n }))
                .await
                .expect("append"),
        );
    }
    let seqs: Vec<u64> = ids.iter().map(|id| id.seq()).collect();
    assert!(
        seqs[0] > *left.last().expect("old"),
        "numbered below the old records: {seqs:?} after {left:?}"
    );
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The writer's replay waits for its commits.
    let replayed = writer
        .replay_after(&ids[0].to_string(), None)
        .await
        .expect("replay on the writer");
    assert_eq!(
        replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        ids[1..].to_vec()
    );
    let other = EventLog::new(f.open_kv().await, f.open_log().await, config);
    let seen = other
        .replay_after(&ids[0].to_string(), None)
        .await
        .expect("replay elsewhere");
    assert_eq!(
        seen.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        ids[1..].to_vec()
    );
    assert_eq!(seen[0].payload, serde_json::json!({ "n": 0 }));
    assert_eq!(
        other
            .origin("reused")
            .await
            .expect("origin")
            .and_then(|o| o.request),
        Some(request)
    );
}
