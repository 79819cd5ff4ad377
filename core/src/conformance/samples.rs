//! One stored record of every declared kind, with planted secrets: what a
//! test plants in a store to prove that tools and logs never show a secret
//! and that every kind is handled.
//!
//! Each sample's secret fields hold text starting with [`PLANTED`]; no
//! other field does. The samples are checked against the record types by
//! this crate's tests: a declared secret field that the type does not
//! redact, or a `Secret` field the declaration does not name, fails them.

use serde_json::{Value, json};

use crate::{
    Key,
    declare::{self, Declaration},
};

/// The start of every planted secret's text.
pub const PLANTED: &str = "planted-secret-";

/// A record of one kind, as bytes a backend would hold.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Sample {
    /// The kind.
    pub declaration: &'static Declaration,
    /// Its key (a key-value kind) or log name (a log kind).
    pub key: Key,
    /// The encoded record (for a log kind, one record of the log).
    pub bytes: Vec<u8>,
    /// The secret texts planted in it, one per declared secret field.
    pub secrets: Vec<String>,
}

fn planted(kind: &str, field: &str) -> String {
    format!(
        "{PLANTED}{kind}-{}",
        field.trim_start_matches('/').replace('/', "-")
    )
}

fn sample(declaration: &'static Declaration, components: &[&str], record: Value) -> Sample {
    let mut record = record;
    let mut secrets = Vec::new();
    for field in declaration.secret_fields {
        let text = planted(declaration.kind, field);
        *record
            .pointer_mut(field)
            .unwrap_or_else(|| panic!("{}: the sample has no {field}", declaration.kind)) =
            Value::String(text.clone());
        secrets.push(text);
    }
    let envelope =
        json!({"kind": declaration.kind, "schema": declaration.schema, "record": record});
    Sample {
        declaration,
        key: declaration.key(components),
        bytes: serde_json::to_vec(&envelope).expect("JSON serializes"),
        secrets,
    }
}

/// One sample of every kind in [`declare::ALL`], in that order.
///
/// # Panics
///
/// When a declaration has no sample here: adding a kind means adding its
/// sample, which this crate's tests enforce.
pub fn all() -> Vec<Sample> {
    let now = 1_767_000_000_000_u64;
    let endpoint = "https://mcp.example/mcp";
    let issuer = "https://as.example";
    declare::ALL
        .iter()
        .map(|d| match d.kind {
            "server_profile" => sample(
                d,
                &["default", endpoint],
                json!({"era": "modern", "protocol_version": "2026-07-28", "verdict_at": now,
                       "discover": null}),
            ),
            "legacy_session" => sample(
                d,
                &["default", endpoint],
                json!({"session_id": "sess-1", "protocol_version": "2025-11-25",
                       "initialize_result": {"serverInfo": {"name": "s", "version": "1"}},
                       "request_id_high_water": 7, "last_event_ids": {}, "created_at": now,
                       "updated_at": now}),
            ),
            "in_flight_request" => sample(
                d,
                &["default", endpoint, "sess-1", "n3"],
                json!({"id": 3, "method": "tools/call", "params": {"name": "t"},
                       "last_event_id": null, "task_id": null, "sent_at": now}),
            ),
            "credentials" => sample(
                d,
                &[issuer, endpoint],
                json!({"key": {"issuer": issuer, "resource": endpoint}, "access_token": "",
                       "token_type": "Bearer", "expires_at": now, "refresh_token": "",
                       "scopes": ["mcp"], "client": {"client_id": "c", "client_secret": "",
                       "metadata_url": null, "token_endpoint_auth_method": null},
                       "server_metadata": null, "obtained_at": now}),
            ),
            "refresh_lease" => sample(
                d,
                &[issuer, endpoint],
                json!({"holder": "00ff", "taken_at": now}),
            ),
            "resource_issuer" => sample(
                d,
                &[endpoint],
                json!({"issuer": issuer, "updated_at": now}),
            ),
            "pending_authorization" => sample(
                d,
                &["0123abcd"],
                json!({"pkce_verifier": "", "state": "", "expected_issuer": issuer,
                       "resource": endpoint, "redirect_uri": null, "extra": null,
                       "created_at": now}),
            ),
            "dpop_key" => sample(
                d,
                &[issuer, endpoint],
                json!({"key": {"issuer": issuer, "resource": endpoint}, "algorithm": "ES256",
                       "private_key": "",
                       "public_jwk": {"kty": "EC", "crv": "P-256", "x": "AQ", "y": "Ag"},
                       "thumbprint": "jkt-1", "created_at": now}),
            ),
            "server_session" => sample(
                d,
                &["sess-1"],
                json!({"session_id": "sess-1", "initialize_params": {"protocolVersion": "2025-11-25"},
                       "principal": "alice", "created_at": now, "last_seen": now}),
            ),
            "event_stream" => sample(
                d,
                &["sess-1:0"],
                json!({"session": "sess-1", "token": "", "created_at": now,
                       "dropped_through": 0}),
            ),
            "event" => sample(
                d,
                &["sess-1:0"],
                json!({"payload": {"jsonrpc": "2.0", "method": "notifications/progress"}}),
            ),
            "shared_key_ring" => sample(
                d,
                &["request-state"],
                json!({"active": {"id": "0011223344556677", "secret": "", "created_at": now},
                       "previous": {"id": "8899aabbccddeeff", "secret": "", "created_at": now}}),
            ),
            "task" => sample(
                d,
                &["task-1"],
                json!({"task_id": "task-1", "principal": "alice", "status": "working",
                       "status_message": null, "created_at": now, "last_updated_at": now,
                       "ttl_ms": 60000, "poll_interval_ms": null, "input_requests": {},
                       "input_responses": {}, "used_input_keys": [], "result": null,
                       "error": null, "cancel_requested": false,
                       "owner": {"instance": "i-1", "generation": 1, "lease_expires_at": now},
                       "resumable": null, "runs": 1}),
            ),
            "task_inbox" => sample(d, &["task-1"], json!({"reason": "input"})),
            "call_record" => sample(
                d,
                &["00112233445566778899aabbccddeeff", "order-1041"],
                json!({"principal": "alice", "tool": "charge", "digest": "ab", "status": "done",
                       "owner": "i-1", "runs": 1, "answer": "", "answer_not_kept_bytes": null,
                       "created_at": now, "updated_at": now}),
            ),
            "fleet_notice" => sample(
                d,
                &[],
                json!({"notice": {"kind": "tools_list_changed"}, "published_at": now,
                       "origin": null}),
            ),
            "instance_lease" => sample(
                d,
                &["i-1"],
                json!({"instance_id": "i-1", "started_at": now, "renewed_at": now,
                       "renew_every_ms": 1000, "beats": 3}),
            ),
            "instance_heartbeat" => sample(d, &[], json!({"instance_id": "i-1"})),
            "tool_lock" => sample(
                d,
                &["copy"],
                json!({"holder": "mcp-persist copy, process 7", "taken_at": now}),
            ),
            other => panic!("no sample of the declared kind {other}: add one in conformance::samples"),
        })
        .collect()
}
