//! Session binding, tried as an attacker would: two server processes on one
//! SQLite file, and every combination of principal, session id, protocol
//! version header and method, while the owner's session lives, after both
//! instances restart, after the owner ends the session, and after another
//! restart.
//!
//! For every request that is not the owner's own, nothing of the owner's is
//! read (her progress, her result, her client name, her session id) or
//! changed (her client identity as both instances and the store hold it, her
//! session's existence); another principal's session id is answered byte for
//! byte as an unknown one; and a `Last-Event-ID` of her stream is answered
//! byte for byte as one naming a stream that never existed, so neither can
//! be probed for existence.

use std::{collections::BTreeMap, time::Duration};

use crate::support::*;
use anyhow::Context as _;
use mcp_persist_core::{SessionId, Stores};
use serde_json::{Value, json};

const SECRET: &str = "alice-secret-7f3c";
const ALICE_CLIENT: &str = "alice-client";
const INTRUDER: &str = "BOB-WAS-HERE";
const UNKNOWN: &str = "5f0c8a61-1d3e-4b0e-9a51-3c8f0b2d7e44";
/// Every version header tried: each supported revision, an unsupported one,
/// garbage that sorts before and after every revision, and none at all.
const VERSIONS: &[Option<&str>] = &[
    Some("2024-11-05"),
    Some("2025-03-26"),
    Some("2025-06-18"),
    Some("2025-11-25"),
    Some("2026-07-28"),
    Some("2099-01-01"),
    Some("0-garbage"),
    Some("garbage"),
    None,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Alice,
    Bob,
    Nobody,
}

impl Who {
    fn header(self) -> Option<&'static str> {
        match self {
            Who::Alice => Some("alice"),
            Who::Bob => Some("bob"),
            Who::Nobody => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Sid {
    Alices,
    NoSession,
    Bobs,
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Initialize,
    ToolCall,
    Get,
    GetAfterAlicesEvent,
    /// Her event id with its stream part replaced: a stream nobody has.
    GetAfterNoSuchStream,
    Delete,
}

/// What a response looked like: status, headers (without the date, and
/// with any new session id masked) and body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

struct World {
    http: reqwest::Client,
    alice_session: String,
    bob_session: String,
    alice_event: String,
    no_such_stream_event: String,
}

impl World {
    fn session(&self, sid: Sid) -> Option<&str> {
        match sid {
            Sid::Alices => Some(&self.alice_session),
            Sid::Bobs => Some(&self.bob_session),
            Sid::Unknown => Some(UNKNOWN),
            Sid::NoSession => None,
        }
    }
}

fn meta(version: &str, client: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
    })
}

/// Reads a body until it ends or `wait` passes (a standalone stream never
/// ends by itself).
async fn read_for(mut response: reqwest::Response, wait: Duration) -> anyhow::Result<Answer> {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str() != "date")
        .map(|(k, v)| {
            let v = if k.as_str() == "mcp-session-id" {
                "<new session>".to_owned()
            } else {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            };
            (k.as_str().to_owned(), v)
        })
        .collect();
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            Ok(Ok(None)) | Err(_) => break,
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

async fn send(
    world: &World,
    url: &str,
    who: Who,
    sid: Sid,
    version: Option<&str>,
    method: Method,
) -> anyhow::Result<Answer> {
    let mut request = match method {
        Method::Initialize | Method::ToolCall => world
            .http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json"),
        Method::Get | Method::GetAfterAlicesEvent | Method::GetAfterNoSuchStream => {
            world.http.get(url).header("accept", "text/event-stream")
        }
        Method::Delete => world.http.delete(url),
    };
    if let Some(user) = who.header() {
        request = request.header("x-demo-user", user);
    }
    if let Some(session) = world.session(sid) {
        request = request.header("mcp-session-id", session);
    }
    if let Some(version) = version {
        request = request.header("mcp-protocol-version", version);
    }
    let body_version = version.unwrap_or("2025-11-25");
    request = match method {
        Method::Initialize => request.body(
            json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": body_version, "capabilities": {},
                           "clientInfo": {"name": INTRUDER, "version": "1"}}
            })
            .to_string(),
        ),
        Method::ToolCall => {
            let mut params = json!({"name": "whoami", "arguments": {}});
            if version.is_some_and(|v| v >= "2026-07-28") {
                params["_meta"] = meta(body_version, INTRUDER);
            }
            request.body(
                json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
                    .to_string(),
            )
        }
        Method::GetAfterAlicesEvent => request.header("last-event-id", &world.alice_event),
        Method::GetAfterNoSuchStream => {
            request.header("last-event-id", &world.no_such_stream_event)
        }
        Method::Get | Method::Delete => request,
    };
    read_for(request.send().await?, Duration::from_millis(400)).await
}

/// Whether `who` is the principal `sid` is bound to.
fn owns(who: Who, sid: Sid) -> bool {
    matches!(
        (who, sid),
        (Who::Alice, Sid::Alices) | (Who::Bob, Sid::Bobs)
    )
}

/// Runs every combination on `url`; returns how many of the owner's own
/// reads saw her data (to show the check can see a leak).
async fn matrix(world: &World, url: &str, phase: &str) -> anyhow::Result<usize> {
    const METHODS: [Method; 6] = [
        Method::Initialize,
        Method::ToolCall,
        Method::Get,
        Method::GetAfterAlicesEvent,
        Method::GetAfterNoSuchStream,
        Method::Delete,
    ];
    const SIDS: [Sid; 4] = [Sid::Alices, Sid::NoSession, Sid::Bobs, Sid::Unknown];
    let mut owner_reads = 0;
    for who in [Who::Alice, Who::Bob, Who::Nobody] {
        for &version in VERSIONS {
            let mut answers = BTreeMap::new();
            for method in METHODS {
                for sid in SIDS {
                    // A principal ending or re-initializing its own session
                    // is its right; the matrix keeps both sessions alive.
                    if owns(who, sid) && matches!(method, Method::Initialize | Method::Delete) {
                        continue;
                    }
                    let answer = send(world, url, who, sid, version, method)
                        .await
                        .with_context(|| {
                            format!("{phase}: {who:?} {sid:?} {version:?} {method:?}")
                        })?;
                    let leaked = [SECRET, ALICE_CLIENT, world.alice_session.as_str()]
                        .iter()
                        .any(|s| answer.body.contains(s));
                    if who == Who::Alice && sid == Sid::Alices {
                        owner_reads += usize::from(leaked);
                    } else {
                        assert!(
                            !leaked,
                            "{phase}: {who:?} with {sid:?}, version {version:?}, {method:?} read alice's data: {answer:?}"
                        );
                    }
                    answers.insert((method as u8, sid as u8), answer);
                }
            }
            let answer = |method: Method, sid: Sid| &answers[&(method as u8, sid as u8)];
            // Another principal's id answers exactly as an unknown id.
            let foreign: &[Sid] = match who {
                Who::Alice => &[Sid::Bobs],
                Who::Bob => &[Sid::Alices],
                Who::Nobody => &[Sid::Alices, Sid::Bobs],
            };
            for method in METHODS {
                for &sid in foreign {
                    assert_eq!(
                        answer(method, sid),
                        answer(method, Sid::Unknown),
                        "{phase}: {who:?} with {sid:?} (another principal's), version {version:?}, {method:?}: differs from an unknown id"
                    );
                }
            }
            // Her stream's event id answers exactly as a stream nobody has,
            // in every session and in none, but her own.
            for sid in SIDS {
                if who == Who::Alice && sid == Sid::Alices {
                    continue;
                }
                assert_eq!(
                    answer(Method::GetAfterAlicesEvent, sid),
                    answer(Method::GetAfterNoSuchStream, sid),
                    "{phase}: {who:?} with {sid:?}, version {version:?}: alice's Last-Event-ID differs from a stream that never existed"
                );
            }
            if version == Some("2025-11-25") {
                // The answers compared are the refusals, not an accident.
                let gone = answer(Method::GetAfterNoSuchStream, Sid::NoSession);
                assert_eq!(gone.status, 410, "{phase}: {who:?}: {gone:?}");
                let unknown_delete = answer(Method::Delete, Sid::Unknown);
                assert_eq!(
                    unknown_delete.status, 404,
                    "{phase}: {who:?}: DELETE of an unknown session: {unknown_delete:?}"
                );
            }
        }
    }
    Ok(owner_reads)
}

/// The owner's client identity as the instance at `url` holds it, read by
/// the owner in her session.
async fn alices_identity(world: &World, url: &str) -> anyhow::Result<(u16, Value)> {
    let answer = send(
        world,
        url,
        Who::Alice,
        Sid::Alices,
        Some("2025-11-25"),
        Method::ToolCall,
    )
    .await?;
    if answer.status != 200 {
        return Ok((answer.status, Value::Null));
    }
    let data = answer
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .find(|l| l.contains("\"result\""))
        .context("no result event")?;
    let message: Value = serde_json::from_str(data.trim())?;
    let text = message["result"]["content"][0]["text"]
        .as_str()
        .context("text")?;
    Ok((answer.status, serde_json::from_str(text)?))
}

async fn stored_client_name(
    path: &std::path::Path,
    session: &str,
) -> anyhow::Result<Option<String>> {
    let stores = Stores::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?);
    let sessions = stores.sessions(Duration::from_secs(3600));
    Ok(sessions.load(&SessionId::new(session)?).await?.map(|s| {
        assert_eq!(
            s.principal.as_deref(),
            Some("alice"),
            "the binding never changes"
        );
        s.initialize_params["clientInfo"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }))
}

async fn start(path: &str) -> anyhow::Result<(Instance, Instance)> {
    let args = [
        "--backend",
        "sqlite",
        "--store",
        path,
        "--sse-retry-ms",
        "100",
    ];
    Ok((
        Instance::process(&args).await?,
        Instance::process(&args).await?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_but_the_owners_reaches_her_session_whatever_it_claims() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    let path = db.to_str().context("utf-8 path")?;
    let (mut a, mut b) = start(path).await?;
    let http = reqwest::Client::new();

    let alice_session = raw_initialize_as(&http, &a.url(), "alice", ALICE_CLIENT).await?;
    let bob_session = raw_initialize_as(&http, &b.url(), "bob", "bob-client").await?;
    // Alice's call: its progress and its result carry her data.
    let (status, body) = raw_post(
        &http,
        &a.url(),
        "alice",
        &alice_session,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "slow_progress",
            "arguments": {"count": 4, "delay_ms": 0, "tag": SECRET},
            "_meta": {"progressToken": "p1"}}}),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let ids = event_ids(&body);
    // The first id after priming: later progress and the result follow it.
    let alice_event = ids
        .iter()
        .find(|id| id.as_str() != "0")
        .context("an event id")?
        .clone();
    // The same id naming a stream nobody has: the stream part replaced by a
    // random UUID.
    let (token, rest) = alice_event.split_once('-').context("token")?;
    let (seq, _stream) = rest.split_once('-').context("sequence")?;
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let hex = mcp_persist_core::kit::hex(&random);
    let no_such_stream_event = format!(
        "{token}-{seq}-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    let world = World {
        http,
        alice_session,
        bob_session,
        alice_event,
        no_such_stream_event,
    };

    // Live, on both instances (B restores sessions from the store).
    let mut owner_reads = 0;
    for instance in [&a, &b] {
        owner_reads += matrix(&world, &instance.url(), "live").await?;
    }
    for instance in [&a, &b] {
        let (status, me) = alices_identity(&world, &instance.url()).await?;
        assert_eq!(status, 200);
        assert_eq!(
            me["client"], ALICE_CLIENT,
            "nobody changed her client identity"
        );
        assert_eq!(me["session"], world.alice_session.as_str());
    }
    assert_eq!(
        stored_client_name(&db, &world.alice_session)
            .await?
            .as_deref(),
        Some(ALICE_CLIENT)
    );

    // Both instances restarted: nothing cached, everything from the store.
    a.kill().await?;
    b.kill().await?;
    (a, b) = start(path).await?;
    for instance in [&a, &b] {
        owner_reads += matrix(&world, &instance.url(), "restarted").await?;
    }
    assert!(
        owner_reads >= 4,
        "the owner's own resumptions read her events ({owner_reads}): the check sees data when it is there"
    );
    let (_, me) = alices_identity(&world, &b.url()).await?;
    assert_eq!(me["client"], ALICE_CLIENT);

    // The owner ends her session; then nobody reaches anything of hers, and
    // nothing brings the session back.
    let ended = send(
        &world,
        &a.url(),
        Who::Alice,
        Sid::Alices,
        Some("2025-11-25"),
        Method::Delete,
    )
    .await?;
    assert!(ended.status < 300, "owner's DELETE: {ended:?}");
    for instance in [&a, &b] {
        matrix(&world, &instance.url(), "deleted").await?;
    }
    a.kill().await?;
    b.kill().await?;
    (a, b) = start(path).await?;
    for instance in [&a, &b] {
        matrix(&world, &instance.url(), "deleted, restarted").await?;
        let (status, _) = alices_identity(&world, &instance.url()).await?;
        assert_eq!(status, 404, "the ended session stays ended");
    }
    assert_eq!(stored_client_name(&db, &world.alice_session).await?, None);
    Ok(())
}
