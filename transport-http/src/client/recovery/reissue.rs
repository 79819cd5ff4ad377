//! Sending an interrupted `tools/call` again with its idempotency key, to a
//! server that serves keyed calls exactly once: the tool runs once, however
//! often the call is sent, and the answer is the call's one answer.

use mcp_persist_core::InFlightRequest;
use rmcp::{
    RoleClient, ServiceError,
    model::{CallToolRequest, CallToolRequestParams, ClientRequest},
    service::Peer,
};
use tracing::{Instrument, info};

use super::{RecoveredAnswer, Recoverer, RecoveryError, recovery_span};
use crate::client::journal::JournalScope;

/// A `tools/call` whose answer was lost (its process stopped, its stream
/// broke, its session is gone), to a server that advertised exactly-once
/// calls: send it again with [`send_with`](Self::send_with).
pub struct ReissuedCall {
    context: Recoverer,
    scope: JournalScope,
    request: InFlightRequest,
    key: String,
}

impl std::fmt::Debug for ReissuedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReissuedCall")
            .field("request", &self.request)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReissuedCall {
    pub(super) fn new(
        context: Recoverer,
        scope: JournalScope,
        request: InFlightRequest,
        key: String,
    ) -> Self {
        ReissuedCall {
            context,
            scope,
            request,
            key,
        }
    }

    /// The request as journaled.
    pub fn request(&self) -> &InFlightRequest {
        &self.request
    }

    /// Its idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Sends the call again through the running rmcp client, with its key,
    /// and returns its answer: the kept answer if it ran, its first run's
    /// if it still runs, or the server's error (for a tool not safe to run
    /// twice whose instance stopped mid-call, `-32041`
    /// [`OUTCOME_UNKNOWN`](crate::exactly_once::OUTCOME_UNKNOWN)). Answered
    /// either way, the request leaves the journal. A transport failure
    /// leaves it listed, to be sent again later.
    pub async fn send_with(
        &self,
        client: &Peer<RoleClient>,
    ) -> Result<RecoveredAnswer, RecoveryError> {
        let span = recovery_span(&self.context.span, &self.request, "reissue");
        let mut params = self.request.params.clone().unwrap_or_default();
        if let Some(meta) = params.get_mut("_meta").and_then(|m| m.as_object_mut()) {
            // The earlier process's progress token means nothing to this one.
            meta.remove("progressToken");
            // The call sent again is a child of this recovery, itself a
            // child of the call's first attempt.
            meta.remove("traceparent");
            if let Some(traceparent) = crate::telemetry::traceparent_of(&span) {
                meta.insert("traceparent".to_owned(), traceparent.into());
            }
        }
        let params: CallToolRequestParams =
            serde_json::from_value(params).map_err(|e| RecoveryError::UnexpectedAnswer {
                reason: format!("the journaled call is not a tools/call: {e}"),
            })?;
        info!(key = %self.key, "sending an interrupted call again with its idempotency key");
        let sent = tokio::time::timeout(
            self.context.config.timeout,
            client.send_request(ClientRequest::CallToolRequest(CallToolRequest::new(params))),
        )
        .instrument(span)
        .await
        .map_err(|_| RecoveryError::Timeout {
            after: self.context.config.timeout,
        })?;
        let answer = match sent {
            Ok(result) => Ok(result),
            Err(ServiceError::McpError(error)) => Err(error),
            Err(other) => {
                return Err(RecoveryError::Transport {
                    source: Box::new(other),
                });
            }
        };
        self.context.collected(&self.scope, &self.request);
        Ok(answer)
    }
}
