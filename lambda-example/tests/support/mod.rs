//! What the tests share: moto's address, the table, and small parsers of
//! MCP's SSE bodies.

#![allow(dead_code, unreachable_pub)]

use mcp_persist_store_dynamodb::{
    DynamoStore,
    aws_sdk_dynamodb::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    },
};

pub const URL_VAR: &str = "MCP_PERSIST_MOTO_URL";

/// moto's address; `None` (after a notice) when it is not set outside CI.
/// Under CI a missing address fails the test.
/// A service's URL from `var`; `None` (after a notice) outside CI when it
/// is not set, a failure under CI.
pub fn service_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            assert!(
                !ci,
                "{var} is not set; under CI the {what} tests must run (start it with `cargo xtask test`)"
            );
            eprintln!(
                "notice: {var} is not set; skipping (run `cargo xtask test` to start {what})"
            );
            None
        }
    }
}

pub fn moto_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            assert!(
                !ci,
                "{URL_VAR} is not set; under CI the Lambda tests must run (start moto with `cargo xtask test`)"
            );
            eprintln!(
                "notice: {URL_VAR} is not set; skipping (run `cargo xtask test` to start moto)"
            );
            None
        }
    }
}

/// A fresh table on moto, made by the deployment's setup call.
pub async fn fresh_table(moto: &str, what: &str) -> String {
    let table = format!(
        "lambda-{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_000)
            .unwrap_or(0)
    );
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(moto)
        .build();
    DynamoStore::create_table(&Client::from_conf(config), &table)
        .await
        .expect("create the table");
    table
}

/// The environment a function or server process gets: fake AWS
/// credentials, the region, and the store URL on moto.
pub fn store_env(moto: &str, table: &str) -> Vec<(String, String)> {
    [
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        (
            "MCP_STORE_URL",
            format!("dynamodb://{table}?endpoint={moto}&poll_ms=20"),
        ),
        ("MCP_LIVENESS_GRACE_MS", "1000".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// One SSE event: its id (if any) and its data.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: Option<String>,
    pub data: serde_json::Value,
}

/// The events of an SSE body that carry JSON data (priming events carry none).
pub fn events(body: &str) -> Vec<Event> {
    let mut out = Vec::new();
    for block in body.replace("\r\n", "\n").split("\n\n") {
        let mut id = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim());
            }
        }
        if let Ok(data) = serde_json::from_str(&data) {
            out.push(Event { id, data });
        }
    }
    out
}

/// The JSON-RPC answer in a body, JSON or SSE.
pub fn answer(body: &str) -> serde_json::Value {
    if body.trim_start().starts_with('{') {
        return serde_json::from_str(body).expect("a JSON body");
    }
    events(body)
        .into_iter()
        .map(|e| e.data)
        .find(|d| d.get("id").is_some() && (d.get("result").is_some() || d.get("error").is_some()))
        .unwrap_or_else(|| panic!("no answer in {body}"))
}

/// The text of the first content block of a tool result.
pub fn tool_text(answer: &serde_json::Value) -> String {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no tool text in {answer}"))
        .to_owned()
}

/// `_meta` of a 2026-07-28 request from a client of the tasks extension.
pub fn modern_meta() -> serde_json::Value {
    serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "modern-test", "version": "2" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    })
}
