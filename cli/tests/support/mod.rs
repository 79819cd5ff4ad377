//! What the CLI's tests share: the binary, real demo servers and durable
//! clients of this workspace filling stores, and where Redis and moto are.
//!
//! `cargo xtask test` starts Redis (standalone and a cluster) and moto and
//! passes their addresses in `MCP_PERSIST_REDIS_URL`,
//! `MCP_PERSIST_REDIS_CLUSTER_URLS` and `MCP_PERSIST_MOTO_URL`. Without them, a test
//! that needs one fails under CI and otherwise prints a notice and skips.
#![allow(dead_code, deprecated, unreachable_pub)]

use std::{path::Path, process::Output, sync::Arc, time::Duration};

use anyhow::Context as _;
use mcp_persist_core::{
    AuthStore, ClientRegistration, CredentialKey, Credentials, KvStore, Secret, Stores, Timestamp,
};
use mcp_persist_transport_http::client::{DurableClientBuilder, StartKind};
use rmcp::{
    ClientHandler, ServiceExt,
    model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation},
};
use tokio::{net::TcpListener, task::JoinHandle};

#[path = "../../../transport-http/examples/server/main.rs"]
pub mod demo;

pub const REDIS_VAR: &str = "MCP_PERSIST_REDIS_URL";
pub const CLUSTER_VAR: &str = "MCP_PERSIST_REDIS_CLUSTER_URLS";
pub const MOTO_VAR: &str = "MCP_PERSIST_MOTO_URL";

/// The token text planted in credentials: it must never be printed.
pub const PLANTED_ACCESS: &str = "PLANTED-ACCESS-7d1f0c2a9e";
pub const PLANTED_REFRESH: &str = "PLANTED-REFRESH-44b9a1c03f";
pub const PLANTED_CLIENT_SECRET: &str = "PLANTED-CLIENT-SECRET-0a8e";

/// The name and version the test client declares.
pub const CLIENT_NAME: &str = "cli-test-client";
pub const CLIENT_VERSION: &str = "1.2.3";

/// Whether we run under CI, where a missing service is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// A service address; `None` (after a notice) when it is not set outside
/// CI. Under CI a missing address fails the test.
pub fn service_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => {
            assert!(
                !under_ci(),
                "{name} is not set; under CI the CLI's service tests must run (start the services with `cargo xtask test`)"
            );
            eprintln!("notice: {name} is not set; skipping (run `cargo xtask test` to start it)");
            None
        }
    }
}

/// A DynamoDB client of the test's moto server.
pub fn dynamodb_client(moto: &str) -> mcp_persist::dynamodb::aws_sdk_dynamodb::Client {
    use mcp_persist::dynamodb::aws_sdk_dynamodb::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    };
    Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(moto)
            .credentials_provider(Credentials::new(
                "testing", "testing", None, None, "cli-test",
            ))
            .build(),
    )
}

/// A Secrets Manager client of the test's moto server.
pub fn secrets_client(moto: &str) -> mcp_persist_store_vault::aws_sdk_secretsmanager::Client {
    use mcp_persist_store_vault::aws_sdk_secretsmanager::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    };
    Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(moto)
            .credentials_provider(Credentials::new(
                "testing", "testing", None, None, "cli-test",
            ))
            .build(),
    )
}

/// Runs the `mcp-persist` binary and returns its output.
pub fn cli(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .expect("the binary runs")
}

/// Its standard output as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Its standard error as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs the binary and expects exit code `code`; returns standard output.
pub fn cli_expect(args: &[&str], code: i32) -> String {
    let output = cli(args);
    assert_eq!(
        output.status.code(),
        Some(code),
        "mcp-persist {args:?}\nstdout:\n{}\nstderr:\n{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// A demo server of this workspace, in this process, on `stores`.
pub struct Server {
    pub url: String,
    pub counters: Arc<demo::Counters>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(stores: Stores) -> anyhow::Result<Server> {
        Server::start_at(stores, "127.0.0.1:0").await
    }

    /// A server at `addr`: a client's stored state is for one endpoint URL,
    /// so a replacement instance takes over its predecessor's address.
    pub async fn start_at(stores: Stores, addr: &str) -> anyhow::Result<Server> {
        let options = demo::Options::parse(Vec::<String>::new())?;
        let counters = Arc::new(demo::Counters::default());
        let router = demo::durable_router_with_tasks(stores, &options, counters.clone()).await?;
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                // The predecessor's listener closes once its task is gone.
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Server {
            url: format!("http://{addr}/mcp"),
            counters,
            task,
        })
    }

    pub fn initializes(&self) -> u64 {
        self.counters
            .initialize
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn restored(&self) -> u64 {
        self.counters
            .restored
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct TestClient;

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(CLIENT_NAME, CLIENT_VERSION),
        )
    }
}

/// What a durable client run did.
pub struct ClientRun {
    pub start: StartKind,
    pub session_id: Option<String>,
    pub whoami: String,
}

/// A durable client of this workspace on `stores`: connects to `url`
/// (resuming a stored session if there is one), calls `slow_progress` and
/// `whoami`, and stops without ending the session.
pub async fn client_run(url: &str, stores: &Stores) -> anyhow::Result<ClientRun> {
    let (transport, handle) = DurableClientBuilder::new(url, stores)
        .profile("default")
        .build()
        .await?;
    let start = handle.start();
    let client = TestClient.serve(transport).await?;
    let args = serde_json::json!({"count": 3, "delay_ms": 0, "tag": "t"});
    let serde_json::Value::Object(args) = args else {
        anyhow::bail!("object")
    };
    client
        .call_tool(CallToolRequestParams::new("slow_progress").with_arguments(args))
        .await?;
    let result = client
        .call_tool(CallToolRequestParams::new("whoami"))
        .await?;
    let whoami = serde_json::to_string(&result.content)?;
    let session_id = handle.session_id().map(|s| s.to_string());
    handle.flush().await;
    drop(client);
    Ok(ClientRun {
        start,
        session_id,
        whoami,
    })
}

/// Plants credentials holding the test's token texts.
pub async fn plant_credentials(stores: &Stores) -> anyhow::Result<()> {
    let auth: AuthStore = stores.credentials();
    let creds = Credentials::new(
        CredentialKey::new("https://auth.example.test", "https://mcp.example.test/mcp")?,
        Secret::new(PLANTED_ACCESS),
        ClientRegistration::new("cli-test").with_client_secret(Secret::new(PLANTED_CLIENT_SECRET)),
    )
    .with_refresh_token(Secret::new(PLANTED_REFRESH))
    .with_scopes(vec!["mcp:read".into(), "mcp:tools".into()])
    .with_expires_at(Timestamp::now().plus(Duration::from_secs(3600)));
    auth.save(&creds).await?;
    Ok(())
}

/// A legacy session through raw HTTP as principal `user`: initialize, then
/// a `slow_progress` call with `count` progress notifications. Returns the
/// session id and the SSE event ids of the call's stream.
pub async fn raw_session_with_events(
    url: &str,
    user: &str,
    count: u32,
) -> anyhow::Result<(String, Vec<String>)> {
    let http = reqwest::Client::new();
    let response = http
        .post(url)
        .header("x-demo-user", user)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            serde_json::json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "cli-raw-client", "version": "9.9"}}
            })
            .to_string(),
        )
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "initialize: {}",
        response.status()
    );
    let session = response
        .headers()
        .get("mcp-session-id")
        .context("no session id")?
        .to_str()?
        .to_owned();
    response.text().await?;
    let (status, _) = raw_post(
        &http,
        url,
        user,
        &session,
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    anyhow::ensure!(status == 202, "initialized: {status}");
    let (status, body) = raw_post(
        &http,
        url,
        user,
        &session,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "slow_progress",
            "arguments": {"count": count, "delay_ms": 0, "tag": "copied"},
            "_meta": {"progressToken": "p1"}}}),
    )
    .await?;
    anyhow::ensure!(status == 200, "call: {status} {body}");
    let ids = event_ids(&body)
        .into_iter()
        .filter(|id| id != "0")
        .collect();
    Ok((session, ids))
}

pub async fn raw_post(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    session: &str,
    body: serde_json::Value,
) -> anyhow::Result<(u16, String)> {
    let response = http
        .post(url)
        .header("x-demo-user", user)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// A resuming GET with `Last-Event-ID`; status and body read to its end.
pub async fn raw_resume(
    url: &str,
    user: &str,
    session: &str,
    last_event_id: &str,
) -> anyhow::Result<(u16, String)> {
    let response = reqwest::Client::new()
        .get(url)
        .header("x-demo-user", user)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "text/event-stream")
        .header("last-event-id", last_event_id)
        .send()
        .await?;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .context("the resumed stream did not end")??;
    Ok((status, body))
}

/// The ids of the SSE events in `body` that carry data, in order: a
/// priming event (an id and empty data, which opens every stream and every
/// resumed one) is not an event of the call.
pub fn event_ids(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| {
            event.lines().any(|l| {
                l.strip_prefix("data:")
                    .is_some_and(|d| !d.trim().is_empty())
            })
        })
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("id:")))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// A filled server store and client store in `dir`, both SQLite (or file
/// stores), by a real server and a real client; credentials planted in the
/// client store: where they are, the client's session id, and a raw
/// session's id and the event ids of one of its calls.
pub struct Filled {
    /// The address the filling server listened on.
    pub server_addr: String,
    pub server_store: String,
    pub client_store: String,
    pub client_session: String,
    pub raw_session: String,
    pub raw_events: Vec<String>,
}

impl Filled {
    /// The key of the raw session's record and the log name of the stream
    /// its last event went to: a record and a log `show` finds.
    pub fn session_and_log(&self) -> (String, String) {
        let stream = self
            .raw_events
            .last()
            .and_then(|id| id.splitn(3, '-').nth(2))
            .expect("an event id is token-seq-stream");
        (session_key(&self.raw_session), events_log(stream))
    }
}

pub async fn open_local(url: &str) -> anyhow::Result<Stores> {
    Ok(if let Some(path) = url.strip_prefix("sqlite:") {
        Stores::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?)
    } else if let Some(path) = url.strip_prefix("file:") {
        Stores::new(mcp_persist_store_file::FileStore::open(path).await?)
    } else {
        anyhow::bail!("not a local store: {url}")
    })
}

pub async fn fill(dir: &Path, scheme: &str) -> anyhow::Result<Filled> {
    let (server_store, client_store) = match scheme {
        "sqlite" => (
            format!("sqlite:{}", dir.join("server.db").display()),
            format!("sqlite:{}", dir.join("client.db").display()),
        ),
        _ => (
            format!("file:{}", dir.join("server").display()),
            format!("file:{}", dir.join("client").display()),
        ),
    };
    let server_stores = open_local(&server_store).await?;
    let client_stores = open_local(&client_store).await?;
    let server = Server::start(server_stores).await?;
    let run = client_run(&server.url, &client_stores).await?;
    let (raw_session, raw_events) = raw_session_with_events(&server.url, "alice", 4).await?;
    plant_credentials(&client_stores).await?;
    let server_addr = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    drop(server);
    Ok(Filled {
        server_addr,
        server_store,
        client_store,
        client_session: run.session_id.context("the client holds a session")?,
        raw_session,
        raw_events,
    })
}

/// The key of a server session's record.
pub fn session_key(id: &str) -> String {
    mcp_persist_core::declare::SERVER_SESSION
        .key(&[id])
        .to_string()
}

/// The key of an SSE stream's record.
pub fn stream_key(stream: &str) -> String {
    mcp_persist_core::declare::EVENT_STREAM
        .key(&[stream])
        .to_string()
}

/// The name of an SSE stream's event log.
pub fn events_log(stream: &str) -> String {
    mcp_persist_core::declare::EVENT.key(&[stream]).to_string()
}

/// The key of a shared key ring.
pub fn key_ring(name: &str) -> String {
    mcp_persist_core::declare::SHARED_KEY_RING
        .key(&[name])
        .to_string()
}

/// `text` as a store key.
pub fn k(text: &str) -> mcp_persist_core::Key {
    mcp_persist_core::Key::new(text).expect("a valid key")
}

/// Writes garbage under `key` of a local store.
pub async fn plant_damage(url: &str, key: &str) -> anyhow::Result<()> {
    let kv: Arc<dyn KvStore> = if let Some(path) = url.strip_prefix("sqlite:") {
        Arc::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?)
    } else if let Some(path) = url.strip_prefix("file:") {
        Arc::new(mcp_persist_store_file::FileStore::open(path).await?)
    } else {
        anyhow::bail!("not a local store: {url}")
    };
    kv.put(
        &k(key),
        b"{\"kind\":\"server_session\",\"schema\":1,\"record\":{\"session_id\":".to_vec(),
        Default::default(),
    )
    .await?;
    Ok(())
}

/// One entry of a folder tree: what it is, its size and its modification
/// time, as `ls -l --time-style=full-iso` would show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub dir: bool,
    pub size: u64,
    pub mode: u32,
    pub modified: std::time::SystemTime,
}

/// Every file and folder under `root` (and `root` itself, as ""), with
/// sizes, modes and modification times: two snapshots are equal only when
/// nothing was created, removed, written or touched.
pub fn tree(root: &Path) -> std::collections::BTreeMap<String, TreeEntry> {
    use std::os::unix::fs::PermissionsExt;
    fn walk(root: &Path, at: &Path, out: &mut std::collections::BTreeMap<String, TreeEntry>) {
        let Ok(meta) = std::fs::symlink_metadata(at) else {
            return;
        };
        let name = at
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        out.insert(
            name,
            TreeEntry {
                dir: meta.is_dir(),
                size: if meta.is_dir() { 0 } else { meta.len() },
                mode: meta.permissions().mode(),
                modified: meta.modified().expect("mtime"),
            },
        );
        if meta.is_dir() {
            let mut children: Vec<_> = std::fs::read_dir(at)
                .expect("readable")
                .filter_map(Result::ok)
                .map(|e| e.path())
                .collect();
            children.sort();
            for child in children {
                walk(root, &child, out);
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Says what differs between two snapshots of a tree.
pub fn tree_diff(
    before: &std::collections::BTreeMap<String, TreeEntry>,
    after: &std::collections::BTreeMap<String, TreeEntry>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, was) in before {
        match after.get(name) {
            None => out.push(format!("removed {name:?}")),
            Some(now) if now != was => out.push(format!("changed {name:?}: {was:?} -> {now:?}")),
            Some(_) => {}
        }
    }
    for name in after.keys().filter(|n| !before.contains_key(*n)) {
        out.push(format!("created {name:?}"));
    }
    out
}

/// Waits until no SQLite side file (`-wal`, `-shm`) is left under `dir`:
/// the stores that filled it have closed, so the folder is at rest.
pub async fn sqlite_at_rest(dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let busy: Vec<String> = tree(dir)
            .into_keys()
            .filter(|n| n.ends_with("-wal") || n.ends_with("-shm"))
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stores that filled {} never closed: {busy:?}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A local store (`sqlite:` or `file:`) filled with `sessions` sessions and
/// `streams` event streams, each holding a progress notification and the
/// response of one call, as a server writes them. Returns the stream names.
pub async fn many_streams(
    url: &str,
    sessions: usize,
    streams: usize,
) -> anyhow::Result<Vec<String>> {
    use mcp_persist_core::{EventLogConfig, ServerSession, SessionId};
    let stores = open_local(url).await?;
    let store = stores.sessions(Duration::from_secs(3600));
    for i in 0..sessions {
        let session = ServerSession::new(
            SessionId::new(format!("session-{i:05}"))?,
            serde_json::json!({"protocolVersion": "2025-11-25", "clientInfo": {"name": "bulk", "version": "1"}}),
            Some(format!("user-{}", i % 7)),
        );
        store.create(&session).await?;
    }
    let log = stores.events(EventLogConfig::default())?;
    let mut names = Vec::new();
    for i in 0..streams {
        let name = format!("stream-{i:04}");
        log.append(
            &name,
            None,
            &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": i, "progress": 1, "total": 1}}),
        )
        .await?;
        log.append(
            &name,
            None,
            &serde_json::json!({"jsonrpc": "2.0", "id": i, "result": {"content": []}}),
        )
        .await?;
        names.push(name);
    }
    Ok(names)
}

/// What a store holds, to compare two stores: every key-value record's
/// bytes, and every event log's records with their sequence numbers.
#[derive(Debug, PartialEq, Eq)]
pub struct Contents {
    pub records: std::collections::BTreeMap<String, Vec<u8>>,
    pub logs: std::collections::BTreeMap<String, Vec<(u64, Vec<u8>)>>,
}

/// Reads everything `kv` and `log` hold (event logs are found through
/// their stream records).
pub async fn contents(
    kv: &dyn KvStore,
    log: &dyn mcp_persist_core::LogStore,
) -> anyhow::Result<Contents> {
    let mut records = std::collections::BTreeMap::new();
    let mut logs = std::collections::BTreeMap::new();
    for key in kv.list("").await? {
        if let Some(entry) = kv.get(&key).await? {
            records.insert(key.to_string(), entry.value);
        }
        let owned = mcp_persist_core::declare::EVENT_STREAM.log_of(&key);
        if let Some((name, _)) = owned {
            let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
            loop {
                let after = got.last().map_or(0, |r| r.0);
                let batch = log.read_after(&name, after, 1000).await?;
                if batch.is_empty() {
                    break;
                }
                got.extend(batch.into_iter().map(|r| (r.seq, r.data)));
            }
            logs.insert(name.to_string(), got);
        }
    }
    Ok(Contents { records, logs })
}

/// [`contents`] of a local store by URL.
pub async fn local_contents(url: &str) -> anyhow::Result<Contents> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let store = mcp_persist_store_sqlite::SqliteStore::open(path).await?;
        let got = contents(&store, &store).await;
        store.close().await?;
        got
    } else if let Some(path) = url.strip_prefix("file:") {
        let store = mcp_persist_store_file::FileStore::open(path).await?;
        contents(&store, &store).await
    } else {
        anyhow::bail!("not a local store: {url}")
    }
}

/// Adds a stream of `events` progress notifications to a local store.
pub async fn long_stream(url: &str, stream: &str, events: u64) -> anyhow::Result<()> {
    let stores = open_local(url).await?;
    let log = stores.events(mcp_persist_core::EventLogConfig::default())?;
    for progress in 0..events {
        log.append(
            stream,
            None,
            &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": stream, "progress": progress}}),
        )
        .await?;
    }
    Ok(())
}
