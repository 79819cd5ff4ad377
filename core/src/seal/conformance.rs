//! The sealing suite (feature `conformance`): what encryption at rest must
//! prove on every backend, judged from the bytes the backend really keeps.
//!
//! A backend's test file gives two closures: one that opens the backend at a
//! [`Place`] (as for [`backend_conformance!`](crate::backend_conformance!)),
//! and one that returns every byte the backend keeps there, as stored
//! (files, database pages, Redis `DUMP`s and stream entries):
//!
//! ```ignore
//! // tests/sealing.rs
//! mcp_persist_core::seal_conformance!(
//!     open: |place| async move { SqliteStore::open(place.dir.join("store.db")).await },
//!     raw: |place| async move { files_under(&place.dir) },
//! );
//! ```
//!
//! It stamps:
//!
//! * no planted secret (every declared secret field of every kind, secrets
//!   made by the typed stores, the sealing keys) in the raw bytes, and with
//!   everything sealed no record content at all;
//! * ciphertexts swapped between two keys, two sessions, two logs and two
//!   positions of one log, and a wrong or missing key: typed errors naming
//!   the record and the key id, no panic;
//! * plain text accepted, then refused, and sealed by `rekey`; TTLs kept;
//!   rekey twice;
//! * rotation under load: two server processes and a client writing while
//!   `rekey` runs, nothing lost or stale; a `rekey` killed with SIGKILL
//!   half-way, then run again to completion;
//! * the key-value and log conformance suites through the seal.
//!
//! Like the rest of [`conformance`](crate::conformance), this is a test
//! suite, not a stable API.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    io::{BufRead, BufReader},
    pin::Pin,
    process::{Child, Command, Stdio},
    sync::{Arc, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use base64::{Engine as _, engine::general_purpose::STANDARD};

use super::{Keyring, Rekey, RekeyOptions, SealKey, SealProblem, Sealed, Sealing, check};
use crate::{
    BusRetention, ClientRegistration, CredentialKey, Credentials, Error, EventLogConfig,
    FleetNotice, Key, KvStore, LegacySession, LogStore, PendingAuthorization, PutMode, PutOptions,
    RefreshOutcome, Secret, ServerKey, ServerSession, SessionId, Stores, TaskId, TaskOwner,
    TaskRecord, Timestamp,
    conformance::{
        crash::{Opened, Opener, Place, PlaceGuard},
        key, samples,
    },
    declare::{self, Space},
    types::ProtocolVersion,
};

/// How a suite reads every byte its backend keeps at a place.
pub type RawReader =
    Arc<dyn Fn(Place) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// Gives a raw-reading closure its signature (see [`seal_conformance!`](crate::seal_conformance!)).
#[doc(hidden)]
pub fn __raw<F, Fut>(raw: F) -> RawReader
where
    F: Fn(Place) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<u8>> + Send + 'static,
{
    Arc::new(move |place| Box::pin(raw(place)))
}

/// One test's backend: a fresh place, how to open it, how to read it raw.
pub struct SealFixture {
    place: Place,
    _guard: PlaceGuard,
    open: Opener,
    raw: RawReader,
}

impl SealFixture {
    /// A fresh place for a backend opened by `open` and read by `raw`.
    pub fn new(open: Opener, raw: RawReader) -> SealFixture {
        let (place, guard) = Place::fresh();
        SealFixture {
            place,
            _guard: guard,
            open,
            raw,
        }
    }

    /// Opens the backend (not sealed) again, as a restarted process would.
    pub async fn open(&self) -> Opened {
        (self.open)(self.place.clone()).await
    }

    /// Every byte the backend keeps, as stored.
    pub async fn raw_bytes(&self) -> Vec<u8> {
        (self.raw)(self.place.clone()).await
    }
}

/// A test key and its text.
fn new_key() -> (SealKey, String) {
    let (key, text) = SealKey::generate().expect("a random key");
    (key, text.expose_secret().to_owned())
}

/// Every form a key's material could take in storage.
fn key_forms(text: &str) -> Vec<Vec<u8>> {
    let raw = STANDARD.decode(text).expect("our own base64");
    let hex = crate::kit::hex(&raw);
    vec![text.as_bytes().to_vec(), raw, hex.into_bytes()]
}

fn find(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

const CANARY: &str = "seal-suite-canary-stored-in-plain-text-0123456789";

/// Writes a plain record straight to the backend, so that reading the raw
/// bytes can be shown to see record values at all.
async fn plant_canary(opened: &Opened) {
    opened
        .kv
        .put(
            &key("canary/plain"),
            CANARY.as_bytes().to_vec(),
            PutOptions::default(),
        )
        .await
        .expect("write the canary");
}

/// Reads the raw bytes and checks that the canary is there: a reader that
/// saw nothing would prove nothing.
async fn raw_with_canary(f: &SealFixture) -> Vec<u8> {
    let raw = f.raw_bytes().await;
    assert!(
        find(&raw, CANARY.as_bytes()),
        "the raw reader does not see a plain record's value ({} bytes read): it proves nothing",
        raw.len()
    );
    raw
}

fn assert_absent(raw: &[u8], needles: &[String], what: &str) {
    for needle in needles {
        assert!(
            !find(raw, needle.as_bytes()),
            "{what} `{needle}` is in the backend's raw bytes"
        );
    }
}

fn sealed_parts(
    opened: &Opened,
    sealing: &Sealing,
) -> (Arc<dyn KvStore>, Option<Arc<dyn LogStore>>) {
    let kv: Arc<dyn KvStore> = Arc::new(Sealed::new(opened.kv.clone(), sealing.clone()));
    let log = opened
        .log
        .as_ref()
        .map(|l| Arc::new(Sealed::new(l.clone(), sealing.clone())) as Arc<dyn LogStore>);
    (kv, log)
}

fn bundle(opened: &Opened, sealing: &Sealing) -> Stores {
    Stores::from_parts(opened.kv.clone(), opened.log.clone()).encrypted(sealing.clone())
}

async fn write_samples(opened: &Opened, sealing: &Sealing) {
    let (kv, log) = sealed_parts(opened, sealing);
    for sample in samples::all() {
        match sample.declaration.space {
            Space::Kv => {
                kv.put(&sample.key, sample.bytes.clone(), PutOptions::default())
                    .await
                    .expect("write a sample");
            }
            Space::Log => {
                if let Some(log) = &log {
                    log.append(&sample.key, vec![sample.bytes.clone()], None)
                        .await
                        .expect("append a sample");
                }
            }
        }
    }
}

/// The secrets in every sample of a kind `sealing` seals.
fn sample_secrets(sealing: &Sealing) -> Vec<String> {
    samples::all()
        .into_iter()
        .filter(|s| sealing.seals(s.declaration.space, &s.key))
        .flat_map(|s| s.secrets)
        .collect()
}

/// One sample of every kind, sealed with the default scope: none of the
/// planted secrets and none of the key's forms is in the raw bytes, and the
/// kinds without secrets are still stored in plain text.
pub async fn samples_leave_no_secret_in_raw_bytes(f: &SealFixture) {
    let opened = f.open().await;
    let (k, text) = new_key();
    let sealing = Sealing::new(Keyring::new(k));
    plant_canary(&opened).await;
    write_samples(&opened, &sealing).await;
    let raw = raw_with_canary(f).await;
    let secrets = sample_secrets(&sealing);
    assert!(secrets.len() >= 8, "the samples plant secrets");
    assert_absent(&raw, &secrets, "the planted secret");
    for form in key_forms(&text) {
        assert!(!find(&raw, &form), "the sealing key is in the raw bytes");
    }
    // A kind without secrets is not sealed by default: its envelope shows.
    assert!(
        find(&raw, br#""kind":"server_session""#),
        "records without secrets stay plain by default"
    );
}

/// Everything sealed: no record of any kind shows its envelope, so no
/// content at all is in the raw bytes; leases excepted.
pub async fn everything_sealed_leaves_no_content_in_raw_bytes(f: &SealFixture) {
    let opened = f.open().await;
    let (k, _) = new_key();
    let sealing = Sealing::new(Keyring::new(k)).seal_everything();
    plant_canary(&opened).await;
    write_samples(&opened, &sealing).await;
    let raw = raw_with_canary(f).await;
    for sample in samples::all() {
        if sample.declaration.space == Space::Log && opened.log.is_none() {
            continue;
        }
        let envelope = format!(r#""kind":"{}""#, sample.declaration.kind);
        let sealed = sealing.seals(sample.declaration.space, &sample.key);
        assert_eq!(
            !find(&raw, envelope.as_bytes()),
            sealed,
            "{}: sealed is {sealed}, yet its envelope {} in the raw bytes",
            sample.declaration.kind,
            if sealed { "shows" } else { "does not show" }
        );
    }
}

/// Real flows through the typed stores of a sealed bundle (credentials and
/// a refresh, a pending authorization, a shared key, event streams,
/// sessions, tasks, the bus): none of their secrets, and with everything
/// sealed none of their content, reaches the raw bytes.
pub async fn typed_flows_leave_no_secret_in_raw_bytes(f: &SealFixture) {
    let opened = f.open().await;
    let (k, text) = new_key();
    let sealing = Sealing::new(Keyring::new(k)).seal_everything();
    let stores = bundle(&opened, &sealing);
    plant_canary(&opened).await;
    let mut secrets = vec![
        "flow-access-token-1".to_owned(),
        "flow-refresh-token-1".to_owned(),
        "flow-client-secret-1".to_owned(),
        "flow-access-token-2".to_owned(),
        "flow-refresh-token-2".to_owned(),
        "flow-pkce-verifier-1".to_owned(),
        "flow-oauth-state-1".to_owned(),
    ];
    let content = [
        "flow-principal-marker",
        "flow-event-payload-marker",
        "flow-initialize-marker",
    ];
    let auth = stores.credentials();
    let creds = Credentials::new(
        CredentialKey::new("https://as.example", "https://mcp.example/mcp").expect("key"),
        Secret::new(&secrets[0]),
        ClientRegistration::new("c").with_client_secret(Secret::new(&secrets[2])),
    )
    .with_refresh_token(Secret::new(&secrets[1]));
    let version = auth.save(&creds).await.expect("save credentials");
    let (access2, refresh2) = (secrets[3].clone(), secrets[4].clone());
    let refreshed = auth
        .refresh(
            &creds.key,
            version,
            Duration::from_secs(5),
            |c| async move {
                let mut c = c.with_refresh_token(Secret::new(refresh2));
                c.access_token = Secret::new(access2);
                Ok(c)
            },
        )
        .await
        .expect("refresh");
    assert!(matches!(refreshed, RefreshOutcome::Refreshed(_)));
    auth.save_pending(
        &PendingAuthorization::new(
            Secret::new(&secrets[5]),
            Secret::new(&secrets[6]),
            "https://as.example",
            "https://mcp.example/mcp",
        ),
        Duration::from_secs(600),
    )
    .await
    .expect("save a pending authorization");
    let ring = stores
        .shared_keys()
        .get_or_create("request-state")
        .await
        .expect("shared key");
    secrets.push(ring.active.secret.expose_secret().to_owned());
    let sessions = stores.sessions(Duration::from_secs(3600));
    let session_id = SessionId::new("flow-session-1").expect("id");
    sessions
        .create(&ServerSession::new(
            session_id.clone(),
            serde_json::json!({"clientInfo": {"name": content[2]}}),
            Some(content[0].to_owned()),
        ))
        .await
        .expect("session");
    stores
        .client_state()
        .save_session(
            &ServerKey::new("https://mcp.example/mcp", "default").expect("key"),
            &LegacySession::new(
                SessionId::new("flow-client-session").expect("id"),
                ProtocolVersion::new("2025-11-25").expect("version"),
                serde_json::json!({"serverInfo": {"name": content[2]}}),
            ),
            PutMode::Overwrite,
        )
        .await
        .expect("client session");
    if opened.log.is_some() {
        let events = stores.events(EventLogConfig::default()).expect("events");
        for stream in ["flow-stream-a", "flow-stream-b"] {
            let id = events
                .append(
                    stream,
                    Some(&session_id),
                    &serde_json::json!({"marker": content[1]}),
                )
                .await
                .expect("event");
            // The id's first part is the stream's secret token.
            let token = id.to_string().split('-').next().expect("token").to_owned();
            secrets.push(token);
        }
        let tasks = stores.tasks().expect("tasks");
        tasks
            .create(&TaskRecord::new(
                TaskId::new("flow-task-1").expect("id"),
                Some(content[0].to_owned()),
                TaskOwner::new("i-1", 1, Timestamp::now().plus(Duration::from_secs(60))),
            ))
            .await
            .expect("task");
        stores
            .bus(BusRetention::default())
            .expect("bus")
            .publish(
                FleetNotice::ResourceUpdated {
                    uri: format!("file:///{}", content[1]),
                },
                None,
            )
            .await
            .expect("publish");
    }
    let raw = raw_with_canary(f).await;
    assert_absent(&raw, &secrets, "the secret");
    let content: Vec<String> = content.iter().map(|s| (*s).to_owned()).collect();
    assert_absent(&raw, &content, "with everything sealed, the content");
    for form in key_forms(&text) {
        assert!(!find(&raw, &form), "the sealing key is in the raw bytes");
    }
    // And it all reads back through the seal.
    let loaded = auth.load(&creds.key).await.expect("load").expect("stored");
    assert_eq!(
        loaded
            .record
            .refresh_token
            .as_ref()
            .map(Secret::expose_secret),
        Some("flow-refresh-token-2")
    );
    assert!(sessions.load(&session_id).await.expect("load").is_some());
}

fn sealing_error(result: crate::Result<impl std::fmt::Debug>) -> (String, SealProblem) {
    match result {
        Err(Error::Sealing { key, problem }) => (key, problem),
        other => panic!("expected a sealing error, got {other:?}"),
    }
}

/// Ciphertexts copied between two credentials, two sessions, two logs and
/// two positions of one log: each read fails with [`Error::Sealing`] naming
/// the record it was read from; nothing panics; the originals still read.
pub async fn swapped_ciphertexts_fail_naming_the_record(f: &SealFixture) {
    let opened = f.open().await;
    let (k, _) = new_key();
    let sealing = Sealing::new(Keyring::new(k)).seal_everything();
    let (kv, log) = sealed_parts(&opened, &sealing);
    let raw = &opened.kv;

    // Two credentials, and two sessions: B's ciphertext put under A's key.
    for (a, b) in [
        (
            declare::CREDENTIALS.key(&["https://as.example", "https://a.example/mcp"]),
            declare::CREDENTIALS.key(&["https://as.example", "https://b.example/mcp"]),
        ),
        (
            declare::SERVER_SESSION.key(&["session-a"]),
            declare::SERVER_SESSION.key(&["session-b"]),
        ),
    ] {
        kv.put(&a, b"{\"a\":1}".to_vec(), PutOptions::default())
            .await
            .expect("write a");
        kv.put(&b, b"{\"b\":2}".to_vec(), PutOptions::default())
            .await
            .expect("write b");
        let b_bytes = raw.get(&b).await.expect("raw b").expect("stored").value;
        raw.put(&a, b_bytes, PutOptions::default())
            .await
            .expect("swap");
        let (name, problem) = sealing_error(kv.get(&a).await);
        assert_eq!(name, a.as_str(), "the error names the record read");
        assert!(
            matches!(problem, SealProblem::Unopenable { .. }),
            "{problem:?}"
        );
        assert_eq!(
            kv.get(&b).await.expect("b still opens").map(|e| e.value),
            Some(b"{\"b\":2}".to_vec())
        );
    }

    // The typed stores surface the same error, and do not overwrite.
    let swapped = declare::SERVER_SESSION.key(&["session-a"]);
    let stores = bundle(&opened, &sealing);
    let (name, _) = sealing_error(
        stores
            .sessions(Duration::from_secs(60))
            .load(&SessionId::new("session-a").expect("id"))
            .await,
    );
    assert_eq!(name, swapped.as_str());

    let Some(log) = log else {
        return;
    };
    let raw_log = opened.log.as_ref().expect("log");
    // Two logs (two sessions' streams): a record of B appended to A.
    let (la, lb) = (
        declare::EVENT.key(&["session-a:0"]),
        declare::EVENT.key(&["session-b:0"]),
    );
    log.append(&la, vec![b"a1".to_vec()], None)
        .await
        .expect("append");
    log.append(&lb, vec![b"b1".to_vec()], None)
        .await
        .expect("append");
    let b1 = raw_log.read_after(&lb, 0, 10).await.expect("raw read");
    let seqs = raw_log
        .append(&la, vec![b1[0].data.clone()], None)
        .await
        .expect("raw append");
    let (name, problem) = sealing_error(log.read_after(&la, 0, 10).await);
    assert_eq!(name, format!("{la}#{}", seqs[0]));
    assert!(
        matches!(problem, SealProblem::Unopenable { .. }),
        "{problem:?}"
    );

    // Two positions of one log: the same writer's records in swapped order.
    let lc = declare::EVENT.key(&["session-c:0"]);
    log.append(&lc, vec![b"first".to_vec()], None)
        .await
        .expect("append");
    log.append(&lc, vec![b"second".to_vec()], None)
        .await
        .expect("append");
    let records = raw_log.read_after(&lc, 0, 10).await.expect("raw read");
    raw_log.delete_log(&lc).await.expect("delete");
    let seqs = raw_log
        .append(
            &lc,
            vec![records[1].data.clone(), records[0].data.clone()],
            None,
        )
        .await
        .expect("raw append in swapped order");
    let (name, problem) = sealing_error(log.read_after(&lc, 0, 10).await);
    assert_eq!(name, format!("{lc}#{}", seqs[1]));
    assert!(
        matches!(problem, SealProblem::OutOfOrder { .. }),
        "{problem:?}"
    );
    // A record copied to a second position of its own log, likewise.
    let ld = declare::EVENT.key(&["session-d:0"]);
    log.append(&ld, vec![b"once".to_vec()], None)
        .await
        .expect("append");
    let once = raw_log.read_after(&ld, 0, 10).await.expect("raw read");
    let seqs = raw_log
        .append(&ld, vec![once[0].data.clone()], None)
        .await
        .expect("raw append a copy");
    let (name, problem) = sealing_error(log.read_after(&ld, 0, 10).await);
    assert_eq!(name, format!("{ld}#{}", seqs[0]));
    assert!(
        matches!(problem, SealProblem::OutOfOrder { .. }),
        "{problem:?}"
    );
    // A key-value ciphertext appended to a log does not open either.
    let cred = declare::CREDENTIALS.key(&["https://as.example", "https://b.example/mcp"]);
    let value = raw.get(&cred).await.expect("raw").expect("stored").value;
    let le = declare::EVENT.key(&["session-e:0"]);
    let seqs = raw_log
        .append(&le, vec![value], None)
        .await
        .expect("raw append");
    let (name, _) = sealing_error(log.read_after(&le, 0, 10).await);
    assert_eq!(name, format!("{le}#{}", seqs[0]));
}

/// A record sealed with a key the ring lacks is an error naming the record
/// and the key id it needs (never the key), in key-value records and logs;
/// with the key back as an old key, it opens. Damaged and future envelopes
/// are typed errors too.
pub async fn wrong_or_missing_key_names_the_key_id(f: &SealFixture) {
    let opened = f.open().await;
    let (k1, t1) = new_key();
    let (k2, t2) = new_key();
    let (id1, id2) = (k1.id(), k2.id());
    let writer = Sealing::new(Keyring::new(k1)).seal_everything();
    let reader = Sealing::new(Keyring::new(k2)).seal_everything();
    let (kv1, log1) = sealed_parts(&opened, &writer);
    let (kv2, log2) = sealed_parts(&opened, &reader);
    let cred = declare::CREDENTIALS.key(&["https://as.example", "https://mcp.example/mcp"]);
    kv1.put(&cred, b"{}".to_vec(), PutOptions::default())
        .await
        .expect("write");
    let err = kv2.get(&cred).await.expect_err("the ring lacks the key");
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Sealing { key, problem: SealProblem::MissingKey { key_id } }
            if key == cred.as_str() && *key_id == id1),
        "{err:?}"
    );
    assert!(
        text.contains(&id1.to_string()) && text.contains(cred.as_str()),
        "{text}"
    );
    for secret in [&t1, &t2] {
        assert!(!text.contains(secret.as_str()) && !format!("{err:?}").contains(secret.as_str()));
    }
    // Nothing was changed by the failed read: with the old key, it opens.
    reader.set_keyring(Keyring::parse(&format!("{t2}\n{t1}"), "the test").expect("ring"));
    assert_eq!(reader.keyring().ids(), vec![id2, id1]);
    assert_eq!(
        kv2.get(&cred).await.expect("opens").map(|e| e.value),
        Some(b"{}".to_vec())
    );

    // Damaged envelopes: cut short, and of a form from the future.
    let sealed = opened
        .kv
        .get(&cred)
        .await
        .expect("raw")
        .expect("stored")
        .value;
    let cut = declare::CREDENTIALS.key(&["https://as.example", "https://cut.example/mcp"]);
    opened
        .kv
        .put(&cut, sealed[..20].to_vec(), PutOptions::default())
        .await
        .expect("raw write");
    let (name, problem) = sealing_error(kv2.get(&cut).await);
    assert_eq!(name, cut.as_str());
    assert!(
        matches!(problem, SealProblem::Malformed { .. }),
        "{problem:?}"
    );
    let mut future = sealed.clone();
    future[4] = 9;
    opened
        .kv
        .put(&cut, future, PutOptions::default())
        .await
        .expect("raw write");
    let (_, problem) = sealing_error(kv2.get(&cut).await);
    assert_eq!(problem, SealProblem::NewerFormat { form: 9 });

    if let (Some(log1), Some(log2)) = (log1, log2) {
        let name = declare::EVENT.key(&["s:0"]);
        let seqs = log1
            .append(&name, vec![b"x".to_vec()], None)
            .await
            .expect("append");
        reader.set_keyring(Keyring::parse(&t2, "the test").expect("ring"));
        let (record, problem) = sealing_error(log2.read_after(&name, 0, 10).await);
        assert_eq!(record, format!("{name}#{}", seqs[0]));
        assert_eq!(problem, SealProblem::MissingKey { key_id: id1 });
    }
}

/// Rekey options for a store holding the samples: the sample refresh lease
/// was taken "now", so rekey waits it out before sealing the credential
/// beside it; with the default 30 s lease TTL that wait is the whole test.
fn patient_briefly() -> RekeyOptions {
    RekeyOptions::default().lease_ttl(Duration::from_millis(500))
}

/// A store written before sealing was on: its plain records read through
/// the seal; refusing plain text makes them errors; `rekey` seals every
/// plain record of a kind kept until deleted (and lists the ones with a TTL
/// it cannot know); after it, the refusing reader reads them.
pub async fn plaintext_is_read_then_sealed_by_rekey(f: &SealFixture) {
    let opened = f.open().await;
    plant_canary(&opened).await;
    for sample in samples::all() {
        match (sample.declaration.space, &opened.log) {
            (Space::Kv, _) => {
                opened
                    .kv
                    .put(&sample.key, sample.bytes.clone(), PutOptions::default())
                    .await
                    .expect("plain write");
            }
            (Space::Log, Some(log)) => {
                log.append(&sample.key, vec![sample.bytes.clone()], None)
                    .await
                    .expect("plain append");
            }
            (Space::Log, None) => {}
        }
    }
    let (k, _) = new_key();
    let sealing = Sealing::new(Keyring::new(k));
    let creds = declare::CREDENTIALS.key(&["https://as.example", "https://mcp.example/mcp"]);
    let (kv, _) = sealed_parts(&opened, &sealing);
    let plain = kv.get(&creds).await.expect("plain reads").expect("stored");
    assert!(find(&plain.value, samples::PLANTED.as_bytes()));
    let strict = sealing.clone().refuse_plaintext();
    let (strict_kv, _) = sealed_parts(&opened, &strict);
    let (name, problem) = sealing_error(strict_kv.get(&creds).await);
    assert_eq!(
        (name.as_str(), problem),
        (creds.as_str(), SealProblem::Plaintext)
    );
    // A kind the scope does not seal stays readable in plain text.
    let session = declare::SERVER_SESSION.key(&["sess-1"]);
    assert!(
        strict_kv
            .get(&session)
            .await
            .expect("plain by scope")
            .is_some()
    );

    let report = Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
        .options(patient_briefly())
        .run(|_| {})
        .await
        .expect("rekey");
    // Credentials, DPoP keys and shared key rings live until deleted:
    // sealed. Pending authorizations, stream tokens and keyed calls' answers
    // have a TTL a plain record does not tell: left to expire (their next
    // write seals them).
    let kept_secrets = |d: &declare::Declaration| {
        d.space == Space::Kv && !d.secret_fields.is_empty() && d.lifetime == declare::Lifetime::Kept
    };
    let sealed_kinds = declare::ALL.iter().filter(|d| kept_secrets(d)).count();
    assert_eq!(report.sealed_plaintext, sealed_kinds, "{report:?}");
    let mut left: Vec<String> = report
        .plain_until_expiry
        .iter()
        .map(Key::to_string)
        .collect();
    left.sort();
    let mut expected = vec![
        declare::PENDING_AUTHORIZATION
            .key(&["0123abcd"])
            .to_string(),
        declare::EVENT_STREAM.key(&["sess-1:0"]).to_string(),
        declare::CALL_RECORD
            .key(&["00112233445566778899aabbccddeeff", "order-1041"])
            .to_string(),
        // The canary: a key no declaration knows, whose TTL nobody knows.
        "canary/plain".to_owned(),
    ];
    expected.sort();
    assert_eq!(left, expected);
    assert!(strict_kv.get(&creds).await.expect("sealed now").is_some());
    // The records the backend now holds are sealed. (The plain bytes written
    // before may linger in the backend's free space, such as a database's
    // free pages and write-ahead log, until it is compacted: the module
    // docs say so; what rekey promises is the records.)
    for sample in samples::all() {
        let sealed_now = kept_secrets(sample.declaration);
        if sealed_now {
            let stored = opened
                .kv
                .get(&sample.key)
                .await
                .expect("raw read")
                .expect("stored")
                .value;
            assert!(super::info(&stored).is_some(), "{} is sealed", sample.key);
            let secrets: Vec<String> = sample.secrets.clone();
            assert_absent(&stored, &secrets, "a secret sealed by rekey");
        }
    }
    let again = Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
        .options(patient_briefly())
        .run(|_| {})
        .await
        .expect("rekey again");
    assert_eq!((again.sealed_plaintext, again.resealed), (0, 0));
}

/// After a rotation, `rekey` re-seals every record under the new key
/// (keeping each record's expiry instant exactly, and its TTL), a second
/// run does nothing, the old key can leave the ring for key-value records,
/// and the logs still under it are reported with their expiry.
pub async fn rekey_rotates_keeps_ttls_and_runs_twice(f: &SealFixture) {
    let opened = f.open().await;
    let (k1, _) = new_key();
    let (k2, _) = new_key();
    let (id1, id2) = (k1.id(), k2.id());
    let sealing = Sealing::new(Keyring::new(k1)).seal_everything();
    write_samples(&opened, &sealing).await;
    let (kv, log) = sealed_parts(&opened, &sealing);
    let short = declare::SERVER_SESSION.key(&["short-lived"]);
    kv.put(
        &short,
        b"{}".to_vec(),
        PutOptions::new(PutMode::Create).with_ttl(Duration::from_millis(1500)),
    )
    .await
    .expect("write with a TTL");
    let kept = declare::SERVER_SESSION.key(&["kept"]);
    kv.put(&kept, b"{\"kept\":1}".to_vec(), PutOptions::default())
        .await
        .expect("write");
    let expiry_before = super::info(
        &opened
            .kv
            .get(&short)
            .await
            .expect("raw")
            .expect("live")
            .value,
    )
    .expect("sealed")
    .expires_at
    .expect("has an expiry");

    sealing.set_keyring(sealing.keyring().rotated(k2));
    let mut progress = Vec::new();
    let opened_again = f.open().await;
    let report = Rekey::new(&sealing, opened_again.kv.clone(), opened_again.log.clone())
        .options(RekeyOptions::default().lease_ttl(Duration::from_millis(500)))
        .run(|p| progress.push((p.done, p.total)))
        .await
        .expect("rekey");
    assert!(report.is_complete(), "{report:?}");
    // Key-value leases stay plain whatever the scope (a heartbeat is
    // transient too, but a log record: rekey does not rewrite logs).
    let leases = samples::all()
        .iter()
        .filter(|s| {
            s.declaration.space == Space::Kv
                && s.declaration.lifetime == declare::Lifetime::Transient
        })
        .count();
    let kv_samples = samples::all()
        .iter()
        .filter(|s| s.declaration.space == Space::Kv)
        .count();
    assert_eq!(report.resealed, kv_samples - leases + 2, "{report:?}");
    assert_eq!(report.plain_by_scope, leases);
    assert_eq!(progress.last().map(|(d, t)| d == t), Some(true));
    assert!(progress.windows(2).all(|w| w[1].0 == w[0].0 + 1));
    let after = super::info(
        &opened
            .kv
            .get(&short)
            .await
            .expect("raw")
            .expect("live")
            .value,
    )
    .expect("sealed");
    assert_eq!((after.key_id, after.expires_at), (id2, Some(expiry_before)));

    // Logs are not rewritten: listed, with when they go.
    if opened.log.is_some() {
        let logs: BTreeSet<String> = report.logs.iter().map(|l| l.log.to_string()).collect();
        assert!(logs.contains(declare::FLEET_NOTICE.prefix), "{logs:?}");
        assert!(report.logs.iter().all(|l| l.by_key.contains_key(&id1)));
    }

    // Twice: nothing left to do.
    let again = Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
        .run(|_| {})
        .await
        .expect("rekey again");
    assert_eq!((again.resealed, again.sealed_plaintext), (0, 0));
    assert_eq!(again.current, report.resealed);

    // The old key leaves the ring: every key-value record still opens.
    sealing.set_keyring(sealing.keyring().without(id1));
    for k in opened.kv.list("").await.expect("list") {
        kv.get(&k)
            .await
            .unwrap_or_else(|e| panic!("{k} does not open without the old key: {e}"));
    }
    let found = check(&*opened.kv, opened.log.as_deref(), &sealing, |_| {})
        .await
        .expect("check");
    let missing: BTreeSet<_> = found.missing.iter().map(|(_, id)| *id).collect();
    if opened.log.is_some() {
        assert_eq!(missing, BTreeSet::from([id1]), "only logs need the old key");
        assert!(
            found
                .missing
                .iter()
                .all(|(name, _)| name.contains("records)"))
        );
        let name = declare::FLEET_NOTICE.key(&[]);
        let (_, problem) = sealing_error(log.expect("log").read_after(&name, 0, 10).await);
        assert_eq!(problem, SealProblem::MissingKey { key_id: id1 });
    } else {
        assert!(missing.is_empty());
    }

    // The TTL held through the re-seal.
    let deadline = Instant::now() + Duration::from_secs(10);
    while kv.get(&short).await.expect("get").is_some() {
        assert!(
            Instant::now() < deadline,
            "the re-sealed record never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kv.get(&kept).await.expect("get").is_some());
}

// ------------------------------------------------------------ processes

const ROLE_VAR: &str = "MCP_PERSIST_SEAL_ROLE";
const DIR_VAR: &str = "MCP_PERSIST_SEAL_DIR";
const NAME_VAR: &str = "MCP_PERSIST_SEAL_NAME";
const KEYS_VAR: &str = "MCP_PERSIST_SEAL_KEYS";
const SERVER_KEYS: usize = 8;
const LEASE_TTL: Duration = Duration::from_millis(800);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn server_key(j: usize) -> ServerKey {
    ServerKey::new(&format!("https://mcp{j}.example/mcp"), "default").expect("server key")
}

fn load_credential() -> CredentialKey {
    CredentialKey::new("https://as.example", "https://load.example/mcp").expect("key")
}

fn refresh_number(c: &Credentials) -> u64 {
    c.refresh_token
        .as_ref()
        .and_then(|t| t.expose_secret().strip_prefix("load-rt-"))
        .and_then(|n| n.parse().ok())
        .expect("a load refresh token")
}

/// Runs this process's part when the suite started it as a child, and
/// returns whether it was one.
pub fn child_main(open: &Opener) -> bool {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return false;
    };
    std::panic::set_hook(Box::new(|info| {
        eprintln!("sealing child failed: {info}");
        std::process::abort();
    }));
    let place = Place {
        dir: std::env::var_os(DIR_VAR).expect("dir").into(),
        name: std::env::var(NAME_VAR).expect("name"),
    };
    let ring = Keyring::parse(&std::env::var(KEYS_VAR).expect("keys"), "the parent").expect("ring");
    let sealing = Sealing::new(ring).seal_everything();
    let stop = place.dir.join("stop");
    runtime().block_on(async move {
        let opened = open(place).await;
        match role.as_str() {
            "server" => server_child(opened, sealing, &stop).await,
            "client" => client_child(opened, sealing, &stop).await,
            "rekey" => {
                Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
                    .options(RekeyOptions::default().lease_ttl(LEASE_TTL))
                    .run(|p| println!("PROGRESS {} {}", p.done, p.total))
                    .await
                    .expect("rekey");
                println!("DONE");
            }
            other => panic!("unknown role {other:?}"),
        }
    });
    true
}

/// Reserves request ids on shared client sessions (compare-and-swap) and
/// appends events to its own stream, until told to stop.
async fn server_child(opened: Opened, sealing: Sealing, stop: &std::path::Path) {
    let stores = bundle(&opened, &sealing);
    let client = stores.client_state();
    let events = stores.events(EventLogConfig::default()).ok();
    let stream = format!("load-{}", std::process::id());
    let mut n: u64 = 0;
    while !stop.exists() {
        n += 1;
        let j = (n as usize * 7 + std::process::id() as usize) % SERVER_KEYS;
        let ids = client
            .reserve_request_ids(&server_key(j), 1)
            .await
            .expect("reserve an id");
        println!("ACK ids {j} {}", ids.start);
        if let (Some(events), 0) = (&events, n % 3) {
            let id = events
                .append(&stream, None, &serde_json::json!({"n": n}))
                .await
                .expect("append an event");
            println!("ACK event {} {} {n}", id.stream(), id.seq());
        }
    }
    println!("DONE");
}

/// Refreshes one credential again and again through the refresh protocol
/// (lease, then compare-and-swap), until told to stop.
async fn client_child(opened: Opened, sealing: Sealing, stop: &std::path::Path) {
    let auth = bundle(&opened, &sealing).credentials();
    let key = load_credential();
    while !stop.exists() {
        let current = auth.load(&key).await.expect("load").expect("stored");
        let next = refresh_number(&current.record) + 1;
        let outcome = auth
            .refresh(&key, current.version, LEASE_TTL, |c| async move {
                Ok(c.with_refresh_token(Secret::new(format!("load-rt-{next}"))))
            })
            .await
            .expect("refresh");
        if let RefreshOutcome::Refreshed(stored) = outcome {
            println!("ACK cred {}", refresh_number(&stored.record));
        }
        // A client refreshes now and then, not in a tight loop.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("DONE");
}

fn spawn(child_test: &str, role: &str, place: &Place, keys: &str) -> Child {
    Command::new(std::env::current_exe().expect("path of the test binary"))
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .env(DIR_VAR, &place.dir)
        .env(NAME_VAR, &place.name)
        .env(KEYS_VAR, keys)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child process")
}

/// Lines a child prints, complete ones only, as they come.
fn lines_of(child: &mut Child) -> (mpsc::Receiver<String>, thread::JoinHandle<()>) {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if !line.ends_with('\n') => break,
                Ok(_) => {
                    let at = line
                        .find("ACK ")
                        .or_else(|| line.find("PROGRESS "))
                        .or_else(|| line.find("DONE"));
                    if let Some(at) = at
                        && tx.send(line[at..].trim_end().to_owned()).is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    (rx, reader)
}

/// What the records a load test starts from are: `records` server sessions,
/// `SERVER_KEYS` client sessions, a few credentials, the load credential,
/// and a few event streams, all sealed under `sealing`'s key.
async fn populate(opened: &Opened, sealing: &Sealing, records: usize) -> BTreeMap<String, Vec<u8>> {
    let stores = bundle(opened, sealing);
    let sessions = stores.sessions(Duration::from_secs(3600));
    for i in 0..records {
        sessions
            .create(&ServerSession::new(
                SessionId::new(format!("filler-{i:04}")).expect("id"),
                serde_json::json!({"i": i}),
                Some(format!("principal-{i}")),
            ))
            .await
            .expect("session");
    }
    let client = stores.client_state();
    for j in 0..SERVER_KEYS {
        client
            .save_session(
                &server_key(j),
                &LegacySession::new(
                    SessionId::new(format!("client-session-{j}")).expect("id"),
                    ProtocolVersion::new("2025-11-25").expect("version"),
                    serde_json::json!({"j": j}),
                ),
                PutMode::Create,
            )
            .await
            .expect("client session");
    }
    let auth = stores.credentials();
    for i in 0..20 {
        auth.save(
            &Credentials::new(
                CredentialKey::new("https://as.example", &format!("https://r{i}.example/mcp"))
                    .expect("key"),
                Secret::new(format!("access-{i}")),
                ClientRegistration::new("c"),
            )
            .with_refresh_token(Secret::new(format!("refresh-{i}"))),
        )
        .await
        .expect("credentials");
    }
    auth.save(
        &Credentials::new(
            load_credential(),
            Secret::new("load-at"),
            ClientRegistration::new("c"),
        )
        .with_refresh_token(Secret::new("load-rt-0")),
    )
    .await
    .expect("load credential");
    if let Ok(events) = stores.events(EventLogConfig::default()) {
        for s in 0..4 {
            for n in 0..5 {
                events
                    .append(&format!("before-{s}"), None, &serde_json::json!({"n": n}))
                    .await
                    .expect("event");
            }
        }
    }
    // What each record holds, read back through the seal.
    let (kv, _) = sealed_parts(opened, sealing);
    let mut contents = BTreeMap::new();
    for k in opened.kv.list("").await.expect("list") {
        if let Some(entry) = kv.get(&k).await.expect("read back") {
            contents.insert(k.to_string(), entry.value);
        }
    }
    contents
}

/// Checks that every sealed key-value record is under `active`.
async fn assert_all_under(opened: &Opened, active: super::KeyId) {
    for k in opened.kv.list("").await.expect("list") {
        let Some(entry) = opened.kv.get(&k).await.expect("raw read") else {
            continue;
        };
        if let Some(info) = super::info(&entry.value) {
            assert_eq!(info.key_id, active, "{k} is still under an old key");
        } else {
            let transient =
                declare::of_key(&k).is_some_and(|d| d.lifetime == declare::Lifetime::Transient);
            assert!(transient, "{k} is in plain text");
        }
    }
}

/// Two server processes reserve request ids (compare-and-swap on shared
/// records) and append events, and a client process refreshes a credential
/// again and again, while `rekey` re-seals the store under a new key (and
/// waits halfway until each of them has acknowledged a write): every
/// acknowledged write is there afterwards (no id handed out twice or lost,
/// the last rotated refresh token stored, every event readable), and every
/// key-value record is under the new key.
pub fn rotation_under_load(open: &Opener, child_test: &str) {
    let (place, _guard) = Place::fresh();
    let rt = runtime();
    let (k1, t1) = new_key();
    let (k2, t2) = new_key();
    let id2 = k2.id();
    let opened = rt.block_on(open(place.clone()));
    let sealing = Sealing::new(Keyring::new(k1)).seal_everything();
    rt.block_on(populate(&opened, &sealing, 300));
    sealing.set_keyring(sealing.keyring().rotated(k2));
    let keys = format!("{t2},{t1}");

    let mut children: Vec<Child> = ["server", "server", "client"]
        .iter()
        .map(|role| spawn(child_test, role, &place, &keys))
        .collect();
    let streams: Vec<_> = children.iter_mut().map(lines_of).collect();
    let mut acks: Vec<Vec<String>> = vec![Vec::new(); children.len()];
    let wait_for = |acks: &mut Vec<Vec<String>>, at_least: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        for (i, (lines, _)) in streams.iter().enumerate() {
            while acks[i].len() < at_least {
                let left = deadline.saturating_duration_since(Instant::now());
                let line = lines.recv_timeout(left).unwrap_or_else(|_| {
                    panic!("child {i} acknowledged {} writes only", acks[i].len())
                });
                if line.starts_with("ACK ") {
                    acks[i].push(line);
                }
            }
        }
    };
    wait_for(&mut acks, 10);
    let before: Vec<usize> = acks.iter().map(Vec::len).collect();
    // The rekey stops halfway (half the records under the new key, half
    // under the old) until every writer has acknowledged a write made
    // since: writers go on while a rekey is under way, however quick the
    // rekey is next to the slowest writer's pace (a refresh every few tens
    // of milliseconds, against a rekey that can take less under load).
    let (halfway_tx, halfway_rx) = mpsc::channel::<()>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let started = Instant::now();
    let (report, halfway) = thread::scope(|scope| {
        // Owned here, so that a panic below lets the rekey go on at once.
        let resume_tx = resume_tx;
        let rekey = scope.spawn(|| {
            let mut halfway_tx = Some(halfway_tx);
            rt.block_on(
                Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
                    .options(RekeyOptions::default().lease_ttl(LEASE_TTL))
                    .run(move |p| {
                        if p.done >= p.total / 2
                            && let Some(tx) = halfway_tx.take()
                        {
                            let _ = tx.send(());
                            let _ = resume_rx.recv_timeout(Duration::from_secs(150));
                        }
                    }),
            )
        });
        let halfway = halfway_rx.recv().is_ok();
        if halfway {
            for (i, (lines, _)) in streams.iter().enumerate() {
                acks[i].extend(lines.try_iter().filter(|l| l.starts_with("ACK ")));
            }
            let paused: Vec<usize> = acks.iter().map(Vec::len).collect();
            let deadline = Instant::now() + Duration::from_secs(120);
            for (i, (lines, _)) in streams.iter().enumerate() {
                while acks[i].len() <= paused[i] {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let line = lines.recv_timeout(left).unwrap_or_else(|_| {
                        panic!(
                            "child {i} acknowledged nothing while the rekey was halfway \
                             ({} writes before it)",
                            paused[i]
                        )
                    });
                    if line.starts_with("ACK ") {
                        acks[i].push(line);
                    }
                }
            }
            let _ = resume_tx.send(());
        }
        (rekey.join().expect("the rekey thread"), halfway)
    });
    let report = report.expect("rekey under load");
    assert!(halfway, "the rekey never reached its halfway point");
    let took = started.elapsed();
    for (i, (lines, _)) in streams.iter().enumerate() {
        acks[i].extend(lines.try_iter().filter(|l| l.starts_with("ACK ")));
    }
    let during: Vec<usize> = acks.iter().map(Vec::len).collect();
    assert!(
        during.iter().zip(&before).all(|(d, b)| d > b),
        "every writer made progress while rekey ran ({before:?} before, {during:?} after)"
    );
    eprintln!(
        "rekey under load: {} records re-sealed in {took:?} (its halfway pause included) while the writers acknowledged {:?} writes",
        report.resealed,
        during
            .iter()
            .zip(&before)
            .map(|(d, b)| d - b)
            .collect::<Vec<_>>()
    );
    wait_for(&mut acks, during.iter().max().copied().unwrap_or(0) + 10);
    std::fs::write(place.dir.join("stop"), b"").expect("stop file");
    for (i, (mut child, (lines, reader))) in children.drain(..).zip(streams).enumerate() {
        let status = child.wait().expect("reap a child");
        reader.join().expect("reader");
        let mut done = false;
        for line in lines.try_iter() {
            if line.starts_with("ACK ") {
                acks[i].push(line);
            } else if line == "DONE" {
                done = true;
            }
        }
        assert!(status.success() && done, "child {i} failed: {status}");
    }
    assert!(
        report.is_complete(),
        "rekey under load left work: {report:?}"
    );
    assert!(report.resealed >= 300, "{report:?}");

    rt.block_on(async {
        // A fresh open, and only the new key for key-value records.
        let opened = open(place.clone()).await;
        assert_all_under(&opened, id2).await;
        let only_new =
            Sealing::new(Keyring::parse(&t2, "the test").expect("ring")).seal_everything();
        let stores = bundle(&opened, &only_new);
        let mut ids: BTreeMap<usize, BTreeSet<i64>> = BTreeMap::new();
        let mut last_refresh = 0;
        let mut events: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for line in acks.iter().flatten() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ACK", "ids", j, start] => {
                    let fresh = ids
                        .entry(j.parse().expect("j"))
                        .or_default()
                        .insert(start.parse().expect("start"));
                    assert!(fresh, "request id {start} of server {j} handed out twice");
                }
                ["ACK", "cred", n] => last_refresh = last_refresh.max(n.parse().expect("n")),
                ["ACK", "event", stream, seq, n] => {
                    events.insert(
                        ((*stream).to_owned(), seq.parse().expect("seq")),
                        n.parse().expect("n"),
                    );
                }
                other => panic!("unexpected line {other:?}"),
            }
        }
        for (j, starts) in &ids {
            let session = stores
                .client_state()
                .session(&server_key(*j))
                .await
                .expect("opens with the new key")
                .expect("stored");
            let reserved = i64::try_from(starts.len()).expect("count");
            assert_eq!(
                session.record.request_id_high_water, reserved,
                "server key {j}: ids handed out are lost or stale"
            );
            assert_eq!(
                starts.iter().copied().collect::<Vec<_>>(),
                (0..reserved).collect::<Vec<_>>()
            );
        }
        assert!(last_refresh > 0, "the client refreshed");
        let stored = stores
            .credentials()
            .load(&load_credential())
            .await
            .expect("opens")
            .expect("stored");
        assert_eq!(
            refresh_number(&stored.record),
            last_refresh,
            "a rotated refresh token was lost"
        );
        if let Some(log) = &opened.log {
            let log = Sealed::new(log.clone(), sealing.clone());
            for ((stream, seq), n) in &events {
                let name = declare::EVENT.key(&[stream]);
                let found = log
                    .read_after(&name, seq - 1, 1)
                    .await
                    .expect("read the event");
                let record: serde_json::Value = serde_json::from_slice(
                    &found.first().expect("acknowledged event present").data,
                )
                .expect("an event record");
                assert_eq!(found[0].seq, *seq);
                assert_eq!(record["record"]["payload"]["n"], *n);
            }
        }
    });
}

/// `rekey` runs in a child process that is killed with SIGKILL part-way;
/// the store is then half under each key, every record reads, and a second
/// run completes the job without losing or changing any record; a third
/// finds nothing to do.
pub fn sigkill_of_rekey_then_rerun_completes(open: &Opener, child_test: &str) {
    const RECORDS: usize = 600;
    let (place, _guard) = Place::fresh();
    let rt = runtime();
    let (k1, t1) = new_key();
    let (k2, t2) = new_key();
    let (id1, id2) = (k1.id(), k2.id());
    let opened = rt.block_on(open(place.clone()));
    let sealing = Sealing::new(Keyring::new(k1)).seal_everything();
    let contents = rt.block_on(populate(&opened, &sealing, RECORDS));
    sealing.set_keyring(sealing.keyring().rotated(k2));

    let mut child = spawn(child_test, "rekey", &place, &format!("{t2},{t1}"));
    let (lines, reader) = lines_of(&mut child);
    let mut last = (0, 0);
    while last.0 < RECORDS / 4 {
        let line = lines
            .recv_timeout(Duration::from_secs(120))
            .expect("rekey made progress");
        assert_ne!(line, "DONE", "rekey finished before it could be killed");
        let mut words = line.split_whitespace().skip(1);
        last = (
            words.next().and_then(|w| w.parse().ok()).expect("done"),
            words.next().and_then(|w| w.parse().ok()).expect("total"),
        );
    }
    child.kill().expect("SIGKILL rekey");
    let status = child.wait().expect("reap rekey");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "rekey died of something else: {status}"
        );
    }
    reader.join().expect("reader");
    assert!(last.0 < last.1, "killed half-way");

    rt.block_on(async {
        let opened = open(place.clone()).await;
        let found = check(&*opened.kv, opened.log.as_deref(), &sealing, |_| {})
            .await
            .expect("check");
        assert!(found.is_readable(), "{found:?}");
        assert!(
            found.by_key.get(&id1).copied().unwrap_or(0) > 0
                && found.by_key.get(&id2).copied().unwrap_or(0) > 0,
            "the kill left the store half under each key: {:?}",
            found.by_key
        );
        let report = Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
            .options(RekeyOptions::default().lease_ttl(LEASE_TTL))
            .run(|_| {})
            .await
            .expect("rekey again");
        assert!(report.is_complete(), "{report:?}");
        assert!(report.resealed > 0 && report.current > 0, "{report:?}");
        assert_all_under(&opened, id2).await;
        let only_new =
            Sealing::new(Keyring::parse(&t2, "the test").expect("ring")).seal_everything();
        let (kv, _) = sealed_parts(&opened, &only_new);
        for (k, value) in &contents {
            let k = key(k);
            if declare::of_key(&k).is_some_and(|d| d.lifetime == declare::Lifetime::Transient) {
                continue;
            }
            let now = kv
                .get(&k)
                .await
                .expect("opens with the new key")
                .expect("still there");
            assert_eq!(&now.value, value, "{k} changed");
        }
        let third = Rekey::new(&sealing, opened.kv.clone(), opened.log.clone())
            .run(|_| {})
            .await
            .expect("a third run");
        assert_eq!((third.resealed, third.sealed_plaintext), (0, 0));
    });
}

/// The keyring every reopen of [`sealed_opener`] shares in one process.
fn suite_sealing() -> Sealing {
    static RING: OnceLock<Keyring> = OnceLock::new();
    let ring = RING.get_or_init(|| Keyring::new(new_key().0)).clone();
    Sealing::new(ring).seal_everything()
}

/// `open`, with every record sealed: the key-value and log suites run
/// through it prove that the seal keeps versions, compare-and-swap, TTL,
/// order and limits as the backend has them.
pub fn sealed_opener(open: Opener) -> Opener {
    Arc::new(move |place| {
        let opening = open(place);
        Box::pin(async move {
            let opened = opening.await;
            let sealing = suite_sealing();
            let (kv, log) = sealed_parts(&opened, &sealing);
            Opened { kv, log }
        })
    })
}

/// Stamps the [sealing suite](self) for a backend with logs. See the module
/// docs for the two closures.
///
/// `seal_conformance!(in_process, open: …, raw: …)` leaves out the tests
/// with child processes, for a backend that lives in one process.
#[macro_export]
macro_rules! seal_conformance {
    (open: $open:expr, raw: $raw:expr $(,)?) => {
        $crate::seal_conformance!(@suite $open, $raw; processes);
    };
    (in_process, open: $open:expr, raw: $raw:expr $(,)?) => {
        $crate::seal_conformance!(@suite $open, $raw;);
    };
    (@suite $open:expr, $raw:expr; $($processes:ident)?) => {
        mod seal_conformance {
            #[allow(unused_imports)]
            use super::*;

            fn opener() -> $crate::conformance::crash::Opener {
                $crate::conformance::__opener($open, $crate::conformance::crash::Opened::both)
            }

            async fn fixture() -> $crate::seal::conformance::SealFixture {
                $crate::seal::conformance::SealFixture::new(
                    opener(),
                    $crate::seal::conformance::__raw($raw),
                )
            }

            $crate::__seal_tests!(
                samples_leave_no_secret_in_raw_bytes,
                everything_sealed_leaves_no_content_in_raw_bytes,
                typed_flows_leave_no_secret_in_raw_bytes,
                swapped_ciphertexts_fail_naming_the_record,
                wrong_or_missing_key_names_the_key_id,
                plaintext_is_read_then_sealed_by_rekey,
                rekey_rotates_keeps_ttls_and_runs_twice,
            );

            $( $crate::__seal_process_tests!($processes); )?

            mod through_the_seal {
                #[allow(unused_imports)]
                use super::*;

                async fn sealed() -> $crate::conformance::PlaceFixture {
                    $crate::conformance::PlaceFixture::new(
                        $crate::seal::conformance::sealed_opener(opener()),
                    )
                }

                $crate::kv_conformance!(sealed());
                $crate::log_conformance!(sealed());
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __seal_process_tests {
    (processes) => {
        /// Not a test of its own: the entry point of the suite's child
        /// processes (it returns at once when run by the harness).
        #[test]
        fn seal_child() {
            $crate::seal::conformance::child_main(&opener());
        }

        #[test]
        fn rotation_under_load() {
            $crate::seal::conformance::rotation_under_load(
                &opener(),
                &$crate::conformance::crash::test_name(module_path!(), "seal_child"),
            );
        }

        #[test]
        fn sigkill_of_rekey_then_rerun_completes() {
            $crate::seal::conformance::sigkill_of_rekey_then_rerun_completes(
                &opener(),
                &$crate::conformance::crash::test_name(module_path!(), "seal_child"),
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __seal_tests {
    ($($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let fixture = fixture().await;
                $crate::seal::conformance::$name(&fixture).await;
            }
        )+
    };
}
