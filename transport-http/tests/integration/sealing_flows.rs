//! Encryption at rest under real flows, on SQLite, the file store and
//! Redis: a client completes an OAuth flow and a refresh, a durable server
//! runs sessions and streams events, all on one sealed bundle; afterwards
//! the backend's raw bytes (database files, store files, Redis `DUMP`s,
//! values and stream entries) hold none of the tokens, client secrets, PKCE
//! verifiers, codes, `state` values, stream tokens or sealing key bytes,
//! while everything still reads back through the keyring.

#![allow(clippy::unwrap_used)] // helpers of tests, outside #[test] functions
#![cfg(all(feature = "auth", feature = "server"))]

use crate::support;

use std::{path::Path, sync::Arc};

use crate::auth_support::{World, expire, headless, start};
use mcp_persist_core::{
    CredentialKey, KvStore, LogStore, PutOptions, Stores, canonical_url, declare,
    seal::{Keyring, SealKey, Sealing},
};
use mcp_persist_transport_http::{
    auth::{DurableAuth, DurableAuthBuild},
    client::DurableClientBuilder,
};
use rmcp::{ServiceExt, model::CallToolRequestParams};

const CANARY: &str = "sealing-flows-canary-kept-in-plain-text";
const MARKER: &str = "sealing-flows-tool-result-marker";

enum Backend {
    Sqlite,
    File,
    Redis { url: String, prefix: String },
}

/// Whether we run under CI, where a missing service is a failure.
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

impl Backend {
    async fn open(&self, dir: &Path) -> (Arc<dyn KvStore>, Arc<dyn LogStore>) {
        match self {
            Backend::Sqlite => {
                let s = Arc::new(
                    mcp_persist_store_sqlite::SqliteStore::open(dir.join("store.db"))
                        .await
                        .unwrap(),
                );
                (s.clone(), s)
            }
            Backend::File => {
                let s = Arc::new(
                    mcp_persist_store_file::FileStore::open(dir.join("store"))
                        .await
                        .unwrap(),
                );
                (s.clone(), s)
            }
            Backend::Redis { url, prefix } => {
                let s = Arc::new(
                    mcp_persist_store_redis::RedisStore::standalone(url.clone())
                        .key_prefix(prefix.clone())
                        .connect()
                        .await
                        .unwrap(),
                );
                (s.clone(), s)
            }
        }
    }

    /// Every byte the backend keeps, as it keeps it.
    async fn raw_bytes(&self, dir: &Path) -> Vec<u8> {
        match self {
            Backend::Sqlite | Backend::File => {
                let mut raw = Vec::new();
                let mut folders = vec![dir.to_path_buf()];
                while let Some(folder) = folders.pop() {
                    for entry in std::fs::read_dir(&folder).unwrap() {
                        let path = entry.unwrap().path();
                        if path.is_dir() {
                            folders.push(path);
                        } else if let Ok(bytes) = std::fs::read(&path) {
                            raw.extend(bytes);
                        }
                    }
                }
                raw
            }
            Backend::Redis { url, prefix } => redis_bytes(url, prefix).await,
        }
    }
}

async fn redis_bytes(url: &str, prefix: &str) -> Vec<u8> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut raw = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        raw.extend(dump.unwrap_or_default());
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let value: redis::Value = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).query_async(&mut conn).await,
            "hash" => redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await,
            "stream" => {
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut conn)
                    .await
            }
            _ => Ok(redis::Value::Nil),
        }
        .unwrap();
        flatten(&value, &mut raw);
    }
    raw
}

fn flatten(value: &redis::Value, out: &mut Vec<u8>) {
    match value {
        redis::Value::BulkString(bytes) => out.extend_from_slice(bytes),
        redis::Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|v| flatten(v, out))
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        _ => {}
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn auth(world: &World, stores: &Stores) -> DurableAuth {
    DurableAuth::new(world.mcp_url.clone(), stores.credentials())
        .redirect_uri("http://127.0.0.1:9/callback")
        .dynamic_registration("sealing-test")
}

/// A client completes the OAuth flow and calls a tool, then a restarted
/// client refreshes the expired token.
async fn oauth_flow(world: &World, stores: &Stores) {
    let (transport, _handle, client) = DurableClientBuilder::new(world.mcp_url.clone(), stores)
        .build_with_auth(&auth(world, stores))
        .await
        .unwrap();
    client.authorize(None, headless).await.unwrap();
    let service = ().serve(transport).await.unwrap();
    service
        .call_tool(CallToolRequestParams::new("whoami"))
        .await
        .unwrap();
    service.cancel().await.unwrap();

    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let issuer = world.auth(0).issuer.clone();
    expire(&stores.credentials(), &issuer, &resource).await;
    let (transport, _handle, _client) = DurableClientBuilder::new(world.mcp_url.clone(), stores)
        .build_with_auth(&auth(world, stores))
        .await
        .unwrap();
    let service = ().serve(transport).await.unwrap();
    service.list_all_tools().await.unwrap();
    service.cancel().await.unwrap();
    assert_eq!(
        world.auth(0).refreshes(),
        1,
        "the restarted client refreshed"
    );
}

/// A durable server over the same bundle serves two users' sessions, whose
/// tool results go through its event log. The sessions stay open (a
/// client's cancel would delete its session) until the caller is done.
async fn server_sessions(stores: &Stores) -> (support::Instance, Vec<support::Client>) {
    let instance = support::Instance::in_process(stores.clone(), &[])
        .await
        .unwrap();
    let mut clients = Vec::new();
    for user in ["alice", "bob"] {
        let (client, _progress) = support::connect(&instance.url(), user).await.unwrap();
        let answer = support::call(
            &client,
            "slow_progress",
            serde_json::json!({"count": 2, "delay_ms": 0, "tag": MARKER}),
        )
        .await
        .unwrap();
        assert!(answer.contains(MARKER));
        clients.push(client);
    }
    (instance, clients)
}

/// Every value of every declared secret field in the records the store
/// holds, read back through the seal.
async fn stored_secrets(kv: &Arc<dyn KvStore>, sealing: &Sealing) -> Vec<String> {
    let sealed = mcp_persist_core::seal::Sealed::new(kv.clone(), sealing.clone());
    let mut secrets = Vec::new();
    for key in kv.list("").await.unwrap() {
        let Some(d) = declare::of_key(&key) else {
            continue;
        };
        let Some(entry) = sealed.get(&key).await.unwrap() else {
            continue;
        };
        let record: serde_json::Value = serde_json::from_slice(&entry.value).unwrap();
        for field in d.secret_fields {
            if let Some(serde_json::Value::String(s)) = record["record"].pointer(field) {
                secrets.push(s.clone());
            }
        }
    }
    secrets
}

async fn flows_leave_no_secret_on(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (kv, log) = backend.open(dir.path()).await;
    kv.put(
        &mcp_persist_core::Key::new("canary/plain").unwrap(),
        CANARY.as_bytes().to_vec(),
        PutOptions::default(),
    )
    .await
    .unwrap();
    let mut material = [0u8; 32];
    getrandom::fill(&mut material).unwrap();
    let key = SealKey::from_bytes(&material).unwrap();
    let material_hex = mcp_persist_core::kit::hex(&material);
    let sealing = Sealing::new(Keyring::new(key));
    let stores = Stores::from_parts(kv.clone(), Some(log.clone())).encrypted(sealing.clone());

    let world = start(1).await;
    oauth_flow(&world, &stores).await;
    let (mut instance, clients) = server_sessions(&stores).await;

    let mut secrets = world.secrets();
    assert!(
        secrets.len() >= 8,
        "tokens, secret, verifier, codes and states"
    );
    let from_records = stored_secrets(&kv, &sealing).await;
    // Credentials (tokens, client secret), stream tokens, and more.
    assert!(
        from_records.len() >= 4,
        "{} secrets in records",
        from_records.len()
    );
    secrets.extend(from_records);

    let raw = backend.raw_bytes(dir.path()).await;
    assert!(
        find(&raw, CANARY.as_bytes()),
        "the raw reader sees plain values"
    );
    assert!(
        find(&raw, MARKER.as_bytes()),
        "events carry no secret, so by default they stay plain (and the reader sees logs)"
    );
    for secret in &secrets {
        assert!(
            !find(&raw, secret.as_bytes()),
            "a secret of the flows is in the raw bytes"
        );
    }
    assert!(
        !find(&raw, &material),
        "the key's bytes are in the raw bytes"
    );
    assert!(
        !find(&raw, material_hex.as_bytes()),
        "the key's hex is in the raw bytes"
    );

    // Sessions and streams are there, and the credential reads back.
    assert!(
        !kv.list(mcp_persist_core::declare::SERVER_SESSION.prefix)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        !kv.list(mcp_persist_core::declare::EVENT_STREAM.prefix)
            .await
            .unwrap()
            .is_empty()
    );
    let resource = canonical_url("resource", &world.mcp_url).unwrap();
    let creds = stores
        .credentials()
        .load(&CredentialKey::new(&world.auth(0).issuer, &resource).unwrap())
        .await
        .unwrap()
        .expect("stored");
    assert!(
        world
            .auth(0)
            .is_live_refresh_token(creds.record.refresh_token.as_ref().unwrap().expose_secret())
    );
    for client in clients {
        client.cancel().await.unwrap();
    }
    instance.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_holds_no_secret_of_the_flows() {
    flows_leave_no_secret_on(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_store_holds_no_secret_of_the_flows() {
    flows_leave_no_secret_on(Backend::File).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_holds_no_secret_of_the_flows() {
    let url = match std::env::var("MCP_PERSIST_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
        _ => {
            assert!(
                !under_ci(),
                "MCP_PERSIST_REDIS_URL is not set; under CI the Redis tests must run"
            );
            eprintln!(
                "notice: MCP_PERSIST_REDIS_URL is not set; skipping (run `cargo xtask test`)"
            );
            return;
        }
    };
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).unwrap();
    let prefix = format!(
        "test:sealing-flows:{}:",
        mcp_persist_core::kit::hex(&suffix)
    );
    flows_leave_no_secret_on(Backend::Redis { url, prefix }).await;
}
