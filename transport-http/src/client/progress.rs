//! Progress tokens on the wire. rmcp numbers its tokens from 0 in every
//! process, as it does request ids; the client sends each request's wire
//! id as its token instead (unique within the session across restarts, as
//! wire ids are) and gives progress back with the token the application
//! knows: its own, from the request's params, else rmcp's.

use std::{collections::HashMap, sync::Mutex};

use rmcp::model::{
    ClientRequest, GetExtensions, GetMeta, JsonRpcRequest, MetaObject, NumberOrString,
    ProgressToken,
};
use serde_json::Value;

use super::{delegate::method_and_params, health::lock};

const PROGRESS_TOKEN: &str = "progressToken";

/// The token the application knows, by the wire id of each request in
/// flight that asked for progress.
#[derive(Debug, Default)]
pub(crate) struct ProgressTokens {
    by_wire: Mutex<HashMap<i64, ProgressToken>>,
}

impl ProgressTokens {
    /// Sends `request` (renumbered to `wire`) with `wire` as its progress
    /// token, in place of rmcp's `rmcp_token` (taken off with
    /// [`take_rmcp_token`]), and remembers which token progress goes back
    /// with: the application's own from the request's params, else rmcp's.
    pub(crate) fn send_as_wire(
        &self,
        request: &mut JsonRpcRequest<ClientRequest>,
        wire: i64,
        rmcp_token: ProgressToken,
    ) {
        let local = token_in_params(&request.request).unwrap_or(rmcp_token);
        lock(&self.by_wire).insert(wire, local);
        request
            .request
            .get_meta_mut()
            .set_progress_token(ProgressToken(NumberOrString::Number(wire)));
    }

    /// The request sent as `wire` is answered (or never went out): its
    /// progress has ended.
    pub(crate) fn forget(&self, wire: i64) {
        lock(&self.by_wire).remove(&wire);
    }

    /// A progress notification (an SSE event's data) with the wire token
    /// of a request in flight, rewritten with the token the application
    /// knows; `None` for anything else.
    pub(crate) fn back(&self, data: &str) -> Option<String> {
        let mut value = serde_json::from_str::<Value>(data).ok()?;
        if value.get("method").and_then(Value::as_str) != Some("notifications/progress") {
            return None;
        }
        let token = value.get("params")?.get(PROGRESS_TOKEN)?.clone();
        let wire = serde_json::from_value::<ProgressToken>(token).ok()?;
        let NumberOrString::Number(wire) = wire.0 else {
            return None;
        };
        let local = lock(&self.by_wire).get(&wire).cloned()?;
        value["params"][PROGRESS_TOKEN] = serde_json::to_value(&local).ok()?;
        serde_json::to_string(&value).ok()
    }
}

/// Takes the progress token rmcp set on a request's envelope (its `_meta`
/// extension), if any. It wins over one the application put in the
/// params; taken off, the params show the application's view, which is
/// what is journaled.
pub(crate) fn take_rmcp_token(
    request: &mut JsonRpcRequest<ClientRequest>,
) -> Option<ProgressToken> {
    let meta = request.request.get_meta_mut();
    let token = meta.get_progress_token()?;
    meta.0.0.remove(PROGRESS_TOKEN);
    Some(token)
}

/// The progress token the application put in a request's params
/// (`_meta.progressToken`), if any. For a `tools/call`, read where the
/// params' `_meta` on the wire takes it from, the first place winning: the
/// request's meta, rmcp's older meta extension, the typed params' `_meta`;
/// for any other request, from its params as JSON.
fn token_in_params(request: &ClientRequest) -> Option<ProgressToken> {
    let ClientRequest::CallToolRequest(call) = request else {
        return own_token(method_and_params(request).1.as_ref());
    };
    let token = request
        .get_meta()
        .0
        .0
        .get(PROGRESS_TOKEN)
        .or_else(|| {
            request
                .extensions()
                .get::<MetaObject>()
                .and_then(|legacy| legacy.0.get(PROGRESS_TOKEN))
        })
        .or_else(|| call.params.meta.as_ref()?.0.0.get(PROGRESS_TOKEN))?;
    serde_json::from_value(token.clone()).ok()
}

/// The progress token the application put in a request's params
/// (`_meta.progressToken`), if any.
pub(crate) fn own_token(params: Option<&Value>) -> Option<ProgressToken> {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(PROGRESS_TOKEN))
        .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok())
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientJsonRpcMessage, RequestMetaObject};
    use serde_json::json;

    use super::*;

    fn request(value: Value) -> JsonRpcRequest<ClientRequest> {
        match serde_json::from_value(value).expect("a request") {
            ClientJsonRpcMessage::Request(request) => request,
            other => panic!("not a request: {other:?}"),
        }
    }

    fn meta(token: Value) -> MetaObject {
        MetaObject(
            json!({ "progressToken": token })
                .as_object()
                .expect("an object")
                .clone(),
        )
    }

    /// Every place a `tools/call` can carry a progress token, alone and
    /// together: the token read from the typed request is the one its
    /// params carry on the wire.
    #[test]
    fn the_application_s_token_is_the_one_its_params_carry_on_the_wire() {
        let places = |mask: u8| {
            let mut call = request(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                           "params": {"name": "t", "arguments": {"a": 1}}}));
            let ClientRequest::CallToolRequest(c) = &mut call.request else {
                panic!("a tools/call")
            };
            if mask & 1 != 0 {
                c.params.meta = Some(RequestMetaObject(meta(json!("params"))));
            }
            if mask & 2 != 0 {
                call.request.extensions_mut().insert(meta(json!("legacy")));
            }
            if mask & 4 != 0 {
                call.request.get_meta_mut().0 = meta(json!(3));
            }
            call
        };
        let mut seen = std::collections::HashSet::new();
        for mask in 0..8 {
            let call = places(mask);
            let on_the_wire = serde_json::to_value(&call).expect("JSON")["params"].clone();
            let expected = own_token(Some(&on_the_wire));
            assert_eq!(
                token_in_params(&call.request),
                expected,
                "places {mask:03b}"
            );
            seen.insert(format!("{expected:?}"));
        }
        assert_eq!(seen.len(), 4, "each place, and none, was the winner once");
    }

    #[test]
    fn progress_goes_back_with_the_application_s_own_token_else_rmcp_s() {
        let tokens = ProgressTokens::default();
        let rmcp = || ProgressToken(NumberOrString::Number(0));
        let cases = [
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "t", "_meta": {"progressToken": "mine"}}}),
                ProgressToken(NumberOrString::String("mine".into())),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "t"}}),
                rmcp(),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                       "params": {"uri": "file:///a", "_meta": {"progressToken": 41}}}),
                ProgressToken(NumberOrString::Number(41)),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read",
                       "params": {"uri": "file:///a"}}),
                rmcp(),
            ),
        ];
        for (wire, (value, expected)) in (100..).zip(cases) {
            let mut request = request(value);
            tokens.send_as_wire(&mut request, wire, rmcp());
            assert_eq!(
                request.request.get_meta().get_progress_token(),
                Some(ProgressToken(NumberOrString::Number(wire))),
                "the request goes out with the wire token"
            );
            assert_eq!(lock(&tokens.by_wire).get(&wire), Some(&expected));
        }
    }
}
