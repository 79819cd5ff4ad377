//! Progress tokens on the wire. rmcp numbers its tokens from 0 in every
//! process, as it does request ids; the client sends each request's wire
//! id as its token instead (unique within the session across restarts, as
//! wire ids are) and gives progress back with the token the application
//! knows: its own, from the request's params, else rmcp's.

use std::{collections::HashMap, sync::Mutex};

use rmcp::model::{ClientRequest, GetMeta, JsonRpcRequest, NumberOrString, ProgressToken};
use serde_json::Value;

use super::health::lock;

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
    /// with: the application's own from `params`, else rmcp's.
    pub(crate) fn send_as_wire(
        &self,
        request: &mut JsonRpcRequest<ClientRequest>,
        wire: i64,
        rmcp_token: ProgressToken,
        params: Option<&Value>,
    ) {
        let local = own_token(params).unwrap_or(rmcp_token);
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
/// (`_meta.progressToken`), if any.
pub(crate) fn own_token(params: Option<&Value>) -> Option<ProgressToken> {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(PROGRESS_TOKEN))
        .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok())
}
