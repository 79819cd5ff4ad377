//! What the Secrets Manager backend promises beyond the conformance suite:
//! the service's limits, throttling, secrets kept out of logs and errors,
//! the split with another backend, bad secrets, and the sweep.

mod common;

use mcp_persist_core::conformance::key;
use std::{
    io::Write,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use common::{Proxy, builder, client, moto_url, store, unique_prefix};
use mcp_persist_core::{
    Backend, ClientRegistration, CredentialKey, Credentials, Error, EventLogConfig, KvStore,
    PutMode, PutOptions, RefreshOutcome, Secret, Stores, Timestamp,
};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_store_vault::{
    Deletion, MAX_VALUE_BYTES, SecretsManagerStore, Throttled,
    aws_sdk_secretsmanager::primitives::Blob,
};

const ACCESS: &str = "at-5f0c8a61-SECRET-ACCESS-TOKEN-1d3e";
const REFRESH: &str = "rt-9a51-SECRET-REFRESH-TOKEN-3c8f";
const ROTATED: &str = "rt-0b2d-SECRET-ROTATED-TOKEN-7e44";

fn credentials(access: &str, refresh: &str) -> Credentials {
    Credentials::new(
        CredentialKey::new("https://auth.example.com", "https://mcp.example.com/mcp")
            .expect("valid key"),
        Secret::new(access),
        ClientRegistration::new("agent")
            .with_client_secret(Secret::new("cs-SECRET-CLIENT-SECRET"))
            .with_token_endpoint_auth_method("client_secret_basic".to_owned()),
    )
    .with_expires_at(Timestamp::now().plus(Duration::from_secs(3600)))
    .with_refresh_token(Secret::new(refresh))
    .with_scopes(vec!["mcp:tools".into()])
}

#[tokio::test]
async fn values_up_to_64_kib_fit_and_one_byte_more_is_too_large() {
    let Some(url) = moto_url() else { return };
    let store = store(&url, &unique_prefix("limits")).await;
    assert_eq!(store.max_value_bytes(), 64 * 1024);
    let full: Vec<u8> = (0..MAX_VALUE_BYTES).map(|i| (i % 251) as u8).collect();
    let v = store
        .put(&key("full"), full.clone(), PutOptions::new(PutMode::Create))
        .await
        .expect("a 64 KiB value fits");
    let entry = store
        .get(&key("full"))
        .await
        .expect("get")
        .expect("present");
    assert!(entry.value == full && entry.version == v);

    let err = store
        .put(
            &key("over"),
            vec![7; MAX_VALUE_BYTES + 1],
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect_err("64 KiB + 1 must be refused");
    assert!(
        matches!(err, Error::TooLarge { what: "value", size, limit }
            if size == MAX_VALUE_BYTES + 1 && limit == MAX_VALUE_BYTES),
        "got {err:?}"
    );
    assert!(store.get(&key("over")).await.expect("get").is_none());
}

#[tokio::test]
async fn throttling_is_retried_with_backoff_then_a_typed_error() {
    let Some(url) = moto_url() else { return };
    let proxy = Proxy::start(&url).await;
    let store = SecretsManagerStore::builder(unique_prefix("throttle"))
        .client(client(&proxy.url))
        .retry(4, Duration::from_millis(5))
        .max_writes_per_second(None)
        .build()
        .await
        .expect("store");
    let v1 = store
        .put(&key("k"), b"one".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");

    // Fewer throttling answers than attempts: the SDK retries through them.
    proxy.throttle("GetSecretValue", 3);
    let entry = store.get(&key("k")).await.expect("retried past throttling");
    assert_eq!(entry.expect("present").value, b"one");
    assert_eq!(proxy.throttled(), 3);

    // Throttled on every attempt: a typed error naming the operation.
    proxy.throttle("GetSecretValue", 100);
    let err = store
        .get(&key("k"))
        .await
        .expect_err("throttled throughout");
    assert_eq!(proxy.throttled(), 4, "every attempt was made");
    let throttled = Throttled::find(&err).unwrap_or_else(|| panic!("not typed: {err:?}"));
    assert_eq!(throttled.operation(), "GetSecretValue");
    assert_eq!(throttled.code(), "ThrottlingException");
    assert!(!err.is_transient());

    // A throttled write changes nothing.
    proxy.throttle("PutSecretValue", 100);
    let err = store
        .put(
            &key("k"),
            b"two".to_vec(),
            PutOptions::new(PutMode::Update(v1)),
        )
        .await
        .expect_err("throttled write");
    assert_eq!(
        Throttled::find(&err).map(Throttled::operation),
        Some("PutSecretValue")
    );
    proxy.throttle("PutSecretValue", 0);
    let entry = store.get(&key("k")).await.expect("get").expect("present");
    assert_eq!((entry.value.as_slice(), entry.version), (&b"one"[..], v1));
}

/// Captures every trace line, of every crate (the AWS SDK's included) and level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An error with its whole chain of sources, as `Display` and `Debug`.
fn full_text(err: &Error) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!(" / {s} {s:?}"));
        source = s.source();
    }
    text
}

#[tokio::test(flavor = "current_thread")]
async fn no_token_text_in_logs_or_errors() {
    let Some(url) = moto_url() else { return };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix("redaction");
    let vault = SecretsManagerStore::builder(&prefix)
        .client(client(&proxy.url))
        .retry(2, Duration::from_millis(1))
        .max_writes_per_second(None)
        .build()
        .await
        .expect("store");
    let stores = vault.clone().split(mcp_persist_core::MemoryStore::new());
    let creds = stores.credentials();
    let v1 = creds
        .save(&credentials(ACCESS, REFRESH))
        .await
        .expect("save");
    let v2 = creds
        .replace(&credentials(ACCESS, ROTATED), v1)
        .await
        .expect("rotate");
    let loaded = creds
        .load(&credentials(ACCESS, REFRESH).key)
        .await
        .expect("load");
    assert_eq!(loaded.expect("stored").version, v2);

    let mut errors = Vec::new();
    // A stale compare-and-swap.
    errors.push(
        creds
            .replace(&credentials(ACCESS, REFRESH), v1)
            .await
            .expect_err("stale"),
    );
    // An oversized value holding the token.
    let huge = ACCESS
        .repeat(MAX_VALUE_BYTES / ACCESS.len() + 1)
        .into_bytes();
    errors.push(
        vault
            .put(&key("huge"), huge, PutOptions::new(PutMode::Overwrite))
            .await
            .expect_err("too large"),
    );
    // Throttled reads and writes of the credential.
    proxy.throttle("GetSecretValue", 100);
    errors.push(
        creds
            .load(&credentials(ACCESS, REFRESH).key)
            .await
            .expect_err("throttled"),
    );
    proxy.throttle("PutSecretValue", 100);
    errors.push(
        creds
            .save(&credentials(ACCESS, ROTATED))
            .await
            .expect_err("throttled"),
    );
    proxy.throttle("PutSecretValue", 0);
    // A secret holding token text that was not written by this store.
    let name = format!("{prefix}foreign");
    client(&url)
        .create_secret()
        .name(&name)
        .secret_string(format!("{{\"token\":\"{ACCESS}\"}}"))
        .send()
        .await
        .expect("create a foreign secret");
    errors.push(vault.get(&key("foreign")).await.expect_err("corrupt"));
    // The service unreachable.
    let gone = SecretsManagerStore::builder(&prefix)
        .client(client("http://127.0.0.1:9"))
        .retry(1, Duration::from_millis(1))
        .build()
        .await
        .expect("store");
    errors.push(gone.get(&key("k")).await.expect_err("unreachable"));

    assert!(
        matches!(errors[0], Error::Conflict { .. }),
        "{:?}",
        errors[0]
    );
    assert!(
        matches!(errors[1], Error::TooLarge { .. }),
        "{:?}",
        errors[1]
    );
    assert!(Throttled::find(&errors[2]).is_some(), "{:?}", errors[2]);
    assert!(Throttled::find(&errors[3]).is_some(), "{:?}", errors[3]);
    assert!(
        matches!(errors[4], Error::Corrupt { .. }),
        "{:?}",
        errors[4]
    );
    assert!(
        matches!(errors[5], Error::Unavailable { .. }),
        "{:?}",
        errors[5]
    );
    drop(_guard);

    let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf8");
    assert!(
        logs.contains("holds no logs"),
        "the store says it holds no logs when built"
    );
    for secret in [ACCESS, REFRESH, ROTATED, "cs-SECRET-CLIENT-SECRET"] {
        for err in &errors {
            let text = full_text(err);
            assert!(!text.contains(secret), "{secret} in an error: {text}");
        }
        assert!(!logs.contains(secret), "{secret} in the logs");
    }
}

#[tokio::test]
async fn a_bundle_without_a_log_store_refuses_event_logs() {
    let Some(url) = moto_url() else { return };
    let vault = store(&url, &unique_prefix("nologs")).await;
    assert!(!vault.holds_logs() && !SecretsManagerStore::HOLDS_LOGS);
    let stores = Stores::from_parts(Arc::new(vault), None);
    let err = stores
        .events(EventLogConfig::default())
        .expect_err("no log store");
    assert!(
        matches!(
            err,
            Error::Unsupported {
                backend: "secrets-manager",
                ..
            }
        ),
        "got {err:?}"
    );
}

/// Credentials in Secrets Manager, everything else in SQLite: a restart
/// reads the stored credential, a rotated refresh token is stored, and three
/// processes refreshing at once make one refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn split_keeps_credentials_in_secrets_manager_and_the_rest_in_sqlite() {
    let Some(url) = moto_url() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("state.db");
    let prefix = unique_prefix("split");
    let open = || open_split(&url, &prefix, &db);
    let key = credentials(ACCESS, REFRESH).key;
    let event_ids = {
        let stores = open().await;
        stores
            .credentials()
            .save(&credentials(ACCESS, REFRESH))
            .await
            .expect("save");
        let events = stores
            .events(EventLogConfig::default())
            .expect("sqlite holds logs");
        let mut ids = Vec::new();
        for n in 0..2 {
            let id = events
                .append("stream-1", None, &serde_json::json!({ "n": n }))
                .await
                .expect("append");
            ids.push(id.to_string());
        }
        ids
    };
    // The credential is a secret under the prefix, and not in SQLite.
    let vault = store(&url, &prefix).await;
    let secret_keys = vault.list("").await.expect("list");
    assert_eq!(secret_keys.len(), 1, "{secret_keys:?}");
    assert!(mcp_persist_core::declare::CREDENTIALS.matches(&secret_keys[0]));
    let sqlite = SqliteStore::open(&db).await.expect("sqlite");
    assert!(
        sqlite
            .list(mcp_persist_core::declare::CREDENTIALS.prefix)
            .await
            .expect("list")
            .is_empty()
    );

    // After a restart: the stored credential, before any network call.
    let stores = open().await;
    let stored = stores
        .credentials()
        .load(&key)
        .await
        .expect("load")
        .expect("kept");
    assert_eq!(stored.record.access_token.expose_secret(), ACCESS);
    let seen = stored.version;

    // Three processes (three stores, three clients) refresh at once.
    let refreshes = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let stores = open().await;
        let key = key.clone();
        let refreshes = refreshes.clone();
        tasks.push(tokio::spawn(async move {
            stores
                .credentials()
                .refresh(&key, seen, Duration::from_secs(30), |old| async move {
                    refreshes.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        old.refresh_token.as_ref().map(Secret::expose_secret),
                        Some(REFRESH)
                    );
                    Ok::<_, mcp_persist_core::BoxError>(credentials("at-new", ROTATED))
                })
                .await
                .expect("refresh")
        }));
    }
    let mut refreshed_here = 0;
    for task in tasks {
        match task.await.expect("task") {
            RefreshOutcome::Refreshed(s) | RefreshOutcome::RefreshedByOther(s)
                if s.record.refresh_token.as_ref().map(Secret::expose_secret) == Some(ROTATED) =>
            {
                refreshed_here += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(refreshed_here, 3);
    assert_eq!(refreshes.load(Ordering::SeqCst), 1, "exactly one refresh");
    let rotated = open()
        .await
        .credentials()
        .load(&key)
        .await
        .expect("load")
        .expect("kept");
    assert_eq!(
        rotated
            .record
            .refresh_token
            .as_ref()
            .map(Secret::expose_secret),
        Some(ROTATED)
    );
    // SQLite kept the rest.
    let events = stores.events(EventLogConfig::default()).expect("events");
    let replayed = events
        .replay_after(&event_ids[0], None)
        .await
        .expect("replay");
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].id.to_string(), event_ids[1]);
}

async fn open_split(url: &str, prefix: &str, db: &std::path::Path) -> Stores {
    let sqlite = SqliteStore::open(db).await.expect("sqlite");
    builder(url, prefix)
        .build_split(sqlite)
        .await
        .expect("split")
}

#[tokio::test]
async fn secrets_not_written_by_this_store_are_typed_errors_and_kept() {
    let Some(url) = moto_url() else { return };
    let prefix = unique_prefix("foreign");
    let store = store(&url, &prefix).await;
    let raw = client(&url);
    raw.create_secret()
        .name(format!("{prefix}foreign"))
        .secret_string("hand-made")
        .send()
        .await
        .expect("create");
    let err = store
        .get(&key("foreign"))
        .await
        .expect_err("foreign secret");
    assert!(
        matches!(err, Error::Corrupt { ref key, .. } if key == "foreign"),
        "{err:?}"
    );
    assert_eq!(store.list("").await.expect("list"), vec!["foreign"]);
    let err = store
        .put(
            &key("foreign"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect_err("create over a foreign secret");
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    let err = store
        .put(
            &key("foreign"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Update(mcp_persist_core::Version::new(1))),
        )
        .await
        .expect_err("update of a foreign secret");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    // The hand-made value is still there.
    let value = raw
        .get_secret_value()
        .secret_id(format!("{prefix}foreign"))
        .send()
        .await
        .expect("get");
    assert_eq!(value.secret_string(), Some("hand-made"));
    // An explicit overwrite replaces it.
    store
        .put(
            &key("foreign"),
            b"mine".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("overwrite");
    assert_eq!(
        store
            .get(&key("foreign"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"mine"
    );

    // A version stamped by a newer schema is refused, not misread or overwritten.
    raw.create_secret()
        .name(format!("{prefix}newer"))
        .client_request_token(format!("mp2{}", "0".repeat(53)))
        .secret_binary(Blob::new(b"future".to_vec()))
        .send()
        .await
        .expect("create");
    let err = store.get(&key("newer")).await.expect_err("newer schema");
    assert!(
        matches!(err, Error::NewerSchema { found: 2, .. }),
        "{err:?}"
    );
    let err = store
        .put(
            &key("newer"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect_err("overwrite of a newer record");
    assert!(matches!(err, Error::NewerSchema { .. }), "{err:?}");
    let err = store
        .delete(&key("newer"), None)
        .await
        .expect_err("delete of a newer record");
    assert!(matches!(err, Error::NewerSchema { .. }), "{err:?}");
}

#[tokio::test]
async fn long_keys_fit_secret_names_and_list_back() {
    let Some(url) = moto_url() else { return };
    let prefix = unique_prefix("names");
    let store = store(&url, &prefix).await;
    let mut keys = vec![
        format!("long/{}", "a".repeat(1019)),
        format!("long/{}b", "a".repeat(1018)),
        format!("long/{}", "é".repeat(509)),
        "long/short key with spaces".to_owned(),
    ];
    for (i, key) in keys.iter().enumerate() {
        store
            .put(
                &mcp_persist_core::conformance::key(key),
                vec![i as u8],
                PutOptions::new(PutMode::Create),
            )
            .await
            .expect("put");
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            store
                .get(&mcp_persist_core::conformance::key(key))
                .await
                .expect("get")
                .expect("present")
                .value,
            vec![i as u8]
        );
    }
    keys.sort();
    assert_eq!(store.list("long/").await.expect("list"), keys);
    assert_eq!(
        store.list(&keys[0][..600]).await.expect("list"),
        keys[..2].to_vec()
    );
    assert_eq!(
        store.list(&keys[1]).await.expect("list"),
        vec![keys[1].clone()]
    );
    // Every name the service holds is a valid secret name.
    let listed = client(&url)
        .list_secrets()
        .filters(
            mcp_persist_store_vault::aws_sdk_secretsmanager::types::Filter::builder()
                .key("name".into())
                .values(&prefix)
                .build(),
        )
        .send()
        .await
        .expect("list");
    assert_eq!(listed.secret_list().len(), keys.len());
    for entry in listed.secret_list() {
        let name = entry.name().expect("name");
        assert!(name.len() <= 512, "{} characters", name.len());
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/_+=.@-".contains(&b))
        );
    }
}

async fn sweep_removes_dead_secrets(deletion: Deletion) {
    let Some(url) = moto_url() else { return };
    let prefix = unique_prefix("sweep");
    let store = builder(&url, &prefix)
        .deletion(deletion)
        .sweep_margin(Duration::ZERO)
        .build()
        .await
        .expect("store");
    let expiring = store
        .put(
            &key("expiring"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(Duration::from_millis(100))),
        )
        .await
        .expect("put");
    let deleted = store
        .put(
            &key("deleted"),
            b"y".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    assert!(
        store
            .delete(&key("deleted"), Some(deleted))
            .await
            .expect("delete")
    );
    store
        .put(
            &key("kept"),
            b"z".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    while store.get(&key("expiring")).await.expect("get").is_some() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.sweep_expired().await.expect("sweep"), 2);
    assert_eq!(store.sweep_expired().await.expect("sweep"), 0);
    assert_eq!(store.list("").await.expect("list"), vec!["kept"]);
    assert!(store.get(&key("deleted")).await.expect("get").is_none());
    let described = client(&url)
        .describe_secret()
        .secret_id(format!("{prefix}deleted"))
        .send()
        .await;
    match deletion {
        Deletion::Immediate => assert!(described.is_err(), "deleted for good"),
        Deletion::RecoveryWindowDays(_) => {
            assert!(described.expect("recoverable").deleted_date().is_some())
        }
    }
    // The keys can be written again, at greater versions than ever before.
    let again = store
        .put(
            &key("deleted"),
            b"back".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("create after the sweep");
    assert!(again > deleted);
    let again = store
        .put(
            &key("expiring"),
            b"back".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("create after the sweep");
    assert!(again > expiring);
    assert_eq!(
        store
            .get(&key("deleted"))
            .await
            .expect("get")
            .expect("back")
            .value,
        b"back"
    );
    assert_eq!(
        store.list("").await.expect("list"),
        vec!["deleted", "expiring", "kept"]
    );
}

#[tokio::test]
async fn sweep_with_a_recovery_window() {
    sweep_removes_dead_secrets(Deletion::RecoveryWindowDays(7)).await;
}

#[tokio::test]
async fn sweep_skipping_the_recovery_window() {
    sweep_removes_dead_secrets(Deletion::Immediate).await;
}

/// Overwrites of one key arriving while a write of it is in flight become
/// one more write, and each still gets its own version.
#[tokio::test(flavor = "current_thread")]
async fn overwrites_during_a_write_are_coalesced() {
    let Some(url) = moto_url() else { return };
    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix("coalesce");
    let store = SecretsManagerStore::builder(&prefix)
        .client(client(&proxy.url))
        .max_writes_per_second(None)
        .build()
        .await
        .expect("store");
    store
        .put(
            &key("token"),
            b"0".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    let puts_before = proxy.count("PutSecretValue");

    proxy.hold("PutSecretValue");
    let first = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .put(
                    &key("token"),
                    b"1".to_vec(),
                    PutOptions::new(PutMode::Overwrite),
                )
                .await
        }
    });
    proxy.until_held().await;
    let mut rest = Vec::new();
    for i in 2..=16u32 {
        let store = store.clone();
        rest.push(tokio::spawn(async move {
            store
                .put(
                    &key("token"),
                    i.to_string().into_bytes(),
                    PutOptions::new(PutMode::Overwrite),
                )
                .await
        }));
    }
    // On this one thread, every spawned put runs up to its queue before we go on.
    tokio::task::yield_now().await;
    proxy.release();
    let mut versions = vec![first.await.expect("task").expect("put")];
    for task in rest {
        versions.push(task.await.expect("task").expect("put"));
    }
    assert_eq!(
        proxy.count("PutSecretValue") - puts_before,
        2,
        "16 overwrites, 2 writes"
    );
    let mut distinct = versions.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 16, "every overwrite has its own version");
    let entry = store
        .get(&key("token"))
        .await
        .expect("get")
        .expect("present");
    assert_eq!(entry.value, b"16");
    assert_eq!(Some(&entry.version), versions.iter().max());
}

/// A write whose answers are lost is retried with the same client request
/// tokens, and recognised as the same write: one new version, not two.
#[tokio::test]
async fn retried_writes_are_idempotent() {
    let Some(url) = moto_url() else { return };
    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix("idempotent");
    let store = SecretsManagerStore::builder(&prefix)
        .client(client(&proxy.url))
        .retry(3, Duration::from_millis(1))
        .max_writes_per_second(None)
        .build()
        .await
        .expect("store");
    let v1 = store
        .put(&key("k"), b"one".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");

    // The new version lands, but its answer is lost: the SDK sends it again.
    proxy.lose_answers("PutSecretValue", 1);
    let puts = proxy.count("PutSecretValue");
    let v2 = store
        .put(
            &key("k"),
            b"two".to_vec(),
            PutOptions::new(PutMode::Update(v1)),
        )
        .await
        .expect("put through a lost answer");
    assert_eq!(proxy.count("PutSecretValue") - puts, 2, "sent twice");
    // Now the label move lands and its answer is lost: the retry finds the
    // label already moved, and the store recognises its own version.
    proxy.lose_answers("UpdateSecretVersionStage", 1);
    let v3 = store
        .put(
            &key("k"),
            b"three".to_vec(),
            PutOptions::new(PutMode::Update(v2)),
        )
        .await
        .expect("put through a lost answer");
    assert!(v1 < v2 && v2 < v3);
    let entry = store.get(&key("k")).await.expect("get").expect("present");
    assert_eq!((entry.value.as_slice(), entry.version), (&b"three"[..], v3));

    let versions = client(&url)
        .list_secret_version_ids()
        .secret_id(format!("{prefix}k"))
        .include_deprecated(true)
        .send()
        .await
        .expect("versions");
    assert_eq!(versions.versions().len(), 3, "one version per write");
}

/// A write whose label move landed but whose answer was lost, and which
/// another process wrote over before the retry, still reports success: the
/// later version names it as its predecessor. Reporting `Conflict` would
/// make the caller apply its change twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_write_overwritten_before_its_retry_still_succeeds() {
    let Some(url) = moto_url() else { return };
    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix("landed");
    let a = SecretsManagerStore::builder(&prefix)
        .client(client(&proxy.url))
        .retry(3, Duration::from_millis(1))
        .max_writes_per_second(None)
        .build()
        .await
        .expect("store");
    let b = store(&url, &prefix).await;
    let v1 = a
        .put(&key("n"), b"1".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");

    proxy.lose_answers("UpdateSecretVersionStage", 1);
    proxy.hold_after("UpdateSecretVersionStage", 1);
    let write = tokio::spawn({
        let a = a.clone();
        async move {
            a.put(
                &key("n"),
                b"2".to_vec(),
                PutOptions::new(PutMode::Update(v1)),
            )
            .await
        }
    });
    // The move landed, its answer was lost, and the retry is held.
    proxy.until_held().await;
    let seen = b.get(&key("n")).await.expect("get").expect("present");
    assert_eq!(seen.value, b"2");
    b.put(
        &key("n"),
        b"3".to_vec(),
        PutOptions::new(PutMode::Update(seen.version)),
    )
    .await
    .expect("another process writes over it");
    proxy.release();
    let v2 = write
        .await
        .expect("task")
        .expect("the write landed, so it succeeded");
    assert_eq!(v2, seen.version);
    assert_eq!(
        b.get(&key("n")).await.expect("get").expect("present").value,
        b"3"
    );
}

/// Region, credentials and endpoint from the standard AWS environment
/// variables. The environment is the process's, so the test runs itself
/// again as a child process with the variables set.
#[tokio::test]
async fn configuration_from_the_standard_aws_environment() {
    const CHILD: &str = "MCP_PERSIST_VAULT_ENV_CHILD";
    match std::env::var(CHILD).as_deref() {
        Ok("configured") => {
            let prefix = unique_prefix("env");
            let store = SecretsManagerStore::from_env(&prefix)
                .await
                .expect("from env");
            store
                .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
                .await
                .expect("put");
            assert_eq!(
                store
                    .get(&key("k"))
                    .await
                    .expect("get")
                    .expect("present")
                    .value,
                b"v"
            );
            return;
        }
        Ok("no-region") => {
            let err = SecretsManagerStore::from_env("p/")
                .await
                .expect_err("no region");
            assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
            return;
        }
        _ => {}
    }
    let Some(url) = moto_url() else { return };
    let run = |mode: &str, region: Option<&str>| {
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
        child
            .args([
                "--exact",
                "configuration_from_the_standard_aws_environment",
                "--test-threads=1",
            ])
            .env(CHILD, mode)
            .env("AWS_ENDPOINT_URL", &url)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/aws-credentials",
            )
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_REGION")
            .env_remove("AWS_REGION");
        if let Some(region) = region {
            child.env("AWS_REGION", region);
        }
        let out = child.output().expect("run the child");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child {mode} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("configured", Some("us-east-1"));
    run("no-region", None);
}
