//! Server request spans: each request a durable server's handler serves is
//! one `{method} {tool}` span (kind server), a child of the `traceparent`
//! the request carries in `_meta`; its duration goes to
//! `mcp.server.operation.duration`. See [`telemetry`](crate::telemetry).

use std::{future::Future, time::Instant};

use mcp_persist_core::telemetry::{Operation, Side, Telemetry};
use rmcp::{ErrorData, RoleServer, service::RequestContext};
use tracing::{Instrument, Span, field::Empty};

use crate::telemetry::{continue_trace, error_code_type};

/// The span of one request being served, and what ending it records.
pub(crate) struct ServedRequest {
    span: Span,
    method: String,
    tool: Option<String>,
    version: Option<String>,
    telemetry: Telemetry,
}

impl ServedRequest {
    /// The span of `method` (and `tool`, for `tools/call`) served in
    /// `context`.
    pub(crate) fn new(
        telemetry: &Telemetry,
        method: String,
        tool: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Self {
        let version = context.protocol_version().map(|v| v.to_string());
        let session = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|value| value.to_str().ok())
            .and_then(|id| telemetry.session_attribute(id));
        let name = match tool {
            Some(tool) => format!("{method} {tool}"),
            None => method.to_owned(),
        };
        let span = tracing::info_span!(
            "mcp.server",
            otel.name = %name,
            otel.kind = "server",
            mcp.method.name = %method,
            jsonrpc.request.id = %context.id,
            gen_ai.tool.name = tool,
            mcp.protocol.version = version.as_deref(),
            mcp.session.id = session.as_deref(),
            error.type = Empty,
        );
        continue_trace(&span, context.meta.get_traceparent());
        ServedRequest {
            span,
            method,
            tool: tool.map(str::to_owned),
            version,
            telemetry: telemetry.clone(),
        }
    }

    /// Runs `serving` inside the span and records how long it took.
    pub(crate) async fn serve<T>(
        self,
        serving: impl Future<Output = Result<T, ErrorData>>,
    ) -> Result<T, ErrorData> {
        let started = Instant::now();
        let result = serving.instrument(self.span.clone()).await;
        let error = result.as_ref().err().map(|e| error_code_type(e.code.0));
        if let Some(error) = &error {
            self.span.record("error.type", error.as_str());
        }
        self.telemetry.operation(
            Operation {
                side: Side::Server,
                method: &self.method,
                tool: self.tool.as_deref(),
                protocol_version: self.version.as_deref(),
                error: error.as_deref(),
            },
            started.elapsed(),
        );
        result
    }
}
