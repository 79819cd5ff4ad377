//! Idempotency keys: every `tools/call` the client sends carries one in its
//! `_meta` (the application's own, if it set one), journaled with the call.
//! A server that serves keyed calls exactly once (it advertises
//! [`EXACTLY_ONCE`](crate::exactly_once::EXACTLY_ONCE)) runs the call once
//! however often it is sent, so a call interrupted by a crash or a lost
//! session can be sent again with its key ([`Recovery::Reissue`](super::Recovery::Reissue)).

use mcp_persist_core::RequestId;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta};
use serde_json::Value;

use crate::exactly_once::IDEMPOTENCY_KEY;

/// The key of a `tools/call` in `message`: the one it carries, or a new
/// random one put into its `_meta`. `None` for any other message, or when
/// no random key could be had (the call then goes without one).
pub(crate) fn ensure_key(message: &mut ClientJsonRpcMessage) -> Option<String> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return None;
    };
    // The application's own key, in the typed params' `_meta`.
    if let Some(Value::String(key)) = call
        .params
        .meta
        .as_ref()
        .and_then(|meta| meta.get(IDEMPOTENCY_KEY))
    {
        return Some(key.clone());
    }
    let meta = request.request.get_meta_mut();
    if let Some(Value::String(key)) = meta.0.0.get(IDEMPOTENCY_KEY) {
        return Some(key.clone());
    }
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    let key = mcp_persist_core::kit::hex(&bytes);
    meta.0
        .0
        .insert(IDEMPOTENCY_KEY.to_owned(), Value::String(key.clone()));
    Some(key)
}

/// The key a journaled request's params carry, if any.
pub(crate) fn key_in(params: Option<&Value>) -> Option<&str> {
    params?.get("_meta")?.get(IDEMPOTENCY_KEY)?.as_str()
}

/// The journal id of a keyed call to a server without sessions: the same
/// for every attempt of the call, in any process, so a call sent again
/// replaces its entry instead of adding one.
pub(crate) fn journal_id(key: &str) -> RequestId {
    RequestId::String(format!("key-{key}"))
}

#[cfg(test)]
mod tests {
    use rmcp::model::ClientJsonRpcMessage;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_call_gets_a_new_random_key_unless_it_has_one() {
        let call = || -> ClientJsonRpcMessage {
            serde_json::from_value(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                          "params": {"name": "t"}}))
            .expect("a tools/call")
        };
        let (mut first, mut second) = (call(), call());
        let key = ensure_key(&mut first).expect("a key");
        assert_eq!(key.len(), 32);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{key}"
        );
        assert_ne!(
            ensure_key(&mut second),
            Some(key.clone()),
            "each call its own"
        );
        // Sent again, the call keeps its key; and it is on the wire.
        assert_eq!(ensure_key(&mut first), Some(key.clone()));
        let params = serde_json::to_value(&first).expect("JSON")["params"].clone();
        assert_eq!(key_in(Some(&params)), Some(key.as_str()));
    }
}
