//! The wire names of exactly-once tool calls, shared by the durable server
//! ([`server::calls`](crate::server::calls)) and the durable client.
//!
//! A `tools/call` whose `_meta` carries a key under [`IDEMPOTENCY_KEY`] is
//! run at most once per principal and key by a server that advertises the
//! capability extension [`EXACTLY_ONCE`]; sending it again with the same key
//! gets its one answer.

use rmcp::model::ErrorCode;

/// The `_meta` field of a `tools/call` that holds its idempotency key.
pub const IDEMPOTENCY_KEY: &str = "io.mcp-persist/idempotencyKey";

/// The capability extension a server serving keyed calls exactly once
/// advertises (in its `initialize` result and `server/discover`).
pub const EXACTLY_ONCE: &str = "io.mcp-persist/exactlyOnce";

/// The instance running the call stopped before it answered, and its tool
/// may not run twice: whether it ran is unknown. `data` names the key and
/// the tool.
pub const OUTCOME_UNKNOWN: ErrorCode = ErrorCode(-32041);

/// The call is still running on a live instance after the server's wait
/// limit: send the same key again later.
pub const STILL_RUNNING: ErrorCode = ErrorCode(-32042);

/// The call completed, but its answer was over the size limit the server
/// keeps.
pub const ANSWER_NOT_KEPT: ErrorCode = ErrorCode(-32043);

/// Whether a server's capabilities (an `initialize` or `server/discover`
/// result's `capabilities`, as JSON) advertise [`EXACTLY_ONCE`].
pub fn advertised(capabilities: &serde_json::Value) -> bool {
    capabilities
        .get("extensions")
        .and_then(|e| e.get(EXACTLY_ONCE))
        .is_some_and(serde_json::Value::is_object)
}
