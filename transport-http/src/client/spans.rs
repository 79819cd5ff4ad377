//! Request spans: each request the client sends is one `{method} {tool}`
//! span (kind client) from sent to answered, whose `traceparent` goes to
//! the server in `params._meta` and into the journal with the request; its
//! duration goes to `mcp.client.operation.duration`. See
//! [`telemetry`](crate::telemetry).

use std::time::Instant;

use futures::StreamExt;
use mcp_persist_core::telemetry::{Operation, Side, Telemetry};
use rmcp::{
    model::{ClientJsonRpcMessage, ClientRequest, GetMeta, ServerJsonRpcMessage},
    transport::streamable_http_client::StreamableHttpPostResponse,
};
use serde_json::Value;
use tracing::{Span, field::Empty};

use super::delegate::{PostResult, SseStream};
use crate::telemetry::{continue_trace, error_code_type, traceparent_of};

/// What the span of one request needs to end it.
pub(crate) struct RequestSpan {
    span: Span,
    started: Instant,
    method: String,
    tool: Option<String>,
    version: Option<String>,
    error: Option<String>,
    telemetry: Telemetry,
}

/// The `traceparent` the application put in the request, if any: in the
/// request's `_meta`, or in a `tools/call`'s typed params' `_meta`.
fn carried_traceparent(request: &ClientRequest) -> Option<String> {
    if let Some(traceparent) = request.get_meta().get_traceparent() {
        return Some(traceparent.to_owned());
    }
    match request {
        ClientRequest::CallToolRequest(call) => call
            .params
            .meta
            .as_ref()
            .and_then(|meta| meta.get_traceparent())
            .map(str::to_owned),
        _ => None,
    }
}

impl RequestSpan {
    /// The span of `message` if it is a request, a child of the
    /// `traceparent` the application put in it (else the root of a trace of
    /// its own), with its own `traceparent` put in the request's `_meta`.
    /// `session` is the session it goes in, `version` gives the protocol
    /// version it speaks, when known (asked only when the span is recorded
    /// or metrics are on). `None` for a message that is not a request, and
    /// when nothing would see the span: no subscriber wants it and no
    /// metrics are recorded.
    pub(crate) fn begin(
        message: &mut ClientJsonRpcMessage,
        telemetry: &Telemetry,
        session: Option<&str>,
        version: impl FnOnce() -> Option<String>,
    ) -> Option<RequestSpan> {
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        // Its fields are recorded once it is known to be wanted: with the
        // span off and no metrics, nothing would see them, and naming them
        // cost every call a few allocations (and a copy of the session's
        // whole `initialize` result, for its protocol version).
        let span = tracing::info_span!(
            "mcp.client",
            otel.name = Empty,
            otel.kind = "client",
            mcp.method.name = Empty,
            jsonrpc.request.id = %request.id,
            gen_ai.tool.name = Empty,
            mcp.protocol.version = Empty,
            mcp.session.id = Empty,
            error.type = Empty,
        );
        if span.is_disabled() && !telemetry.records_metrics() {
            return None;
        }
        let method = request.request.method().to_owned();
        let tool = match &request.request {
            ClientRequest::CallToolRequest(call) => Some(call.params.name.to_string()),
            _ => None,
        };
        // A 2026-07-28 request says its version in `_meta`.
        let version = version().or_else(|| {
            request
                .request
                .get_meta()
                .get("io.modelcontextprotocol/protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        if !span.is_disabled() {
            let name = match &tool {
                Some(tool) => format!("{method} {tool}"),
                None => method.clone(),
            };
            span.record("otel.name", name.as_str());
            span.record("mcp.method.name", method.as_str());
            if let Some(tool) = &tool {
                span.record("gen_ai.tool.name", tool.as_str());
            }
            if let Some(version) = &version {
                span.record("mcp.protocol.version", version.as_str());
            }
            if let Some(session) = session.and_then(|s| telemetry.session_attribute(s)) {
                span.record("mcp.session.id", session.as_str());
            }
        }
        continue_trace(&span, carried_traceparent(&request.request).as_deref());
        if let Some(traceparent) = traceparent_of(&span) {
            request.request.get_meta_mut().set_traceparent(traceparent);
        }
        Some(RequestSpan {
            span,
            started: Instant::now(),
            method,
            tool,
            version,
            error: None,
            telemetry: telemetry.clone(),
        })
    }

    /// The span, to run the request's sending in.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Ends the span with the POST's outcome: now for a JSON answer, an
    /// acceptance or a failure; when its stream ends for an SSE answer.
    pub(crate) fn finish<E>(mut self, response: PostResult<E>) -> PostResult<E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match response {
            Ok(StreamableHttpPostResponse::Sse(stream, sid)) => {
                Ok(StreamableHttpPostResponse::Sse(self.follow(stream), sid))
            }
            Ok(StreamableHttpPostResponse::Json(answer, sid)) => {
                if let ServerJsonRpcMessage::Error(e) = &answer {
                    self.error = Some(error_code_type(e.error.code.0));
                }
                Ok(StreamableHttpPostResponse::Json(answer, sid))
            }
            Err(e) => {
                self.error = Some("transport".to_owned());
                Err(e)
            }
            other => other,
        }
    }

    /// `stream`, watched for the request's answer; the span ends with it.
    fn follow(self, mut stream: SseStream) -> SseStream {
        let mut this = self;
        futures::stream::poll_fn(move |cx| {
            // The whole span moves into the stream (not just its error):
            // it ends when the stream is dropped.
            let this = &mut this;
            let item = stream.poll_next_unpin(cx);
            if let std::task::Poll::Ready(Some(Ok(sse))) = &item
                && let Some(data) = sse.data.as_deref()
                && data.contains("\"error\"")
                && let Ok(value) = serde_json::from_str::<Value>(data)
                && value.get("id").is_some()
                && let Some(code) = value
                    .get("error")
                    .and_then(|e| e.get("code"))
                    .and_then(Value::as_i64)
            {
                this.error = Some(code.to_string());
            }
            item
        })
        .boxed()
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        if let Some(error) = &self.error {
            self.span.record("error.type", error.as_str());
        }
        self.telemetry.operation(
            Operation {
                side: Side::Client,
                method: &self.method,
                tool: self.tool.as_deref(),
                protocol_version: self.version.as_deref(),
                error: self.error.as_deref(),
            },
            self.started.elapsed(),
        );
    }
}
