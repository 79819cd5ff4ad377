//! Traces that survive a crash, and what the durable client and server
//! record for an operator.
//!
//! # Spans
//!
//! Every span is a [`tracing`] span named and attributed after the
//! OpenTelemetry semantic conventions for MCP (`mcp.method.name`,
//! `jsonrpc.request.id`, `mcp.protocol.version`, `mcp.session.id`,
//! `gen_ai.tool.name`, `error.type`), so any subscriber can export them;
//! with `tracing-opentelemetry` they become OpenTelemetry spans (the
//! `otel.name` and `otel.kind` fields give their names and kinds).
//!
//! | span (`otel.name`) | kind | level | where |
//! |---|---|---|---|
//! | `{method} {tool}` | client | INFO | each request of the durable client, sent to answered |
//! | `mcp_persist.session.restore` | internal | INFO | the client takes up its stored session; the server restores one on another instance |
//! | `mcp_persist.recover {method}` | internal | INFO | collecting, polling or sending again a request of an earlier process |
//! | `mcp_persist.credentials.refresh` | client | INFO | an access-token refresh |
//! | `{method} {tool}` | server | INFO | each request a durable server serves |
//! | `mcp_persist.replay` | internal | INFO | events sent again after a `Last-Event-ID` (`mcp_persist.events.count`) |
//! | `mcp_persist.task.run`, `mcp_persist.task.takeover` | internal | INFO | a durable task's operation running, or taken over from a stopped instance |
//! | `mcp_persist.bus.publish`, `mcp_persist.bus.deliver` | producer, consumer | INFO | a fleet notice published, and delivered on an instance |
//! | `store {operation}` | client | DEBUG | each backend call (`db.system.name`, `db.operation.name`, `mcp_persist.record.kind`) |
//!
//! Session ids appear hashed by default
//! ([`SessionIds`](mcp_persist_core::telemetry::SessionIds)); log lines
//! name a session by the same hash
//! ([`SessionId::hashed`](mcp_persist_core::SessionId::hashed)), whatever
//! that setting says, since an exporter sends them as span events. Tokens,
//! verifiers, keys, idempotency keys and store keys never appear.
//!
//! # One trace across a restart
//!
//! With the feature `otel` (and a `tracing-opentelemetry` layer installed),
//! the W3C `traceparent` of a span is kept where the work outlives the
//! process, and the work continues that trace:
//!
//! * the client sends each request's `traceparent` in `params._meta` (as the
//!   conventions recommend), and journals it with the request. A request
//!   collected, polled or sent again by a later process is a **child** of
//!   the original request's span: it is the same operation finishing, and
//!   the original span's process may be gone, its span never ended;
//! * a durable server's request span is a child of the `traceparent` in the
//!   request's `_meta`; a task keeps the `traceparent` of the request that
//!   created it, and each run of its operation (a takeover on another
//!   instance included) is a **child** of that request's span;
//! * a fleet notice keeps the `traceparent` of the span that published it,
//!   and each instance's delivery is a **child** of it: a notice is
//!   delivered once per instance, so the publication's trace shows where it
//!   went and how long each delivery took (the conventions for messaging
//!   parent a single message's processing on its creation context).
//!
//! rmcp hands a request to a worker task, so the span that was current
//! where the application called `call_tool` does not reach the transport.
//! An application that wants its own span to be the parent puts
//! [`current_traceparent`] into the request's `_meta` (rmcp's
//! `Meta::set_traceparent`); without it each request is a trace of its own.
//!
//! # Metrics
//!
//! [`Telemetry`](mcp_persist_core::telemetry::Telemetry) (feature `otel`),
//! given to the bundle with `Stores::with_telemetry` or to
//! the client builder, records the instruments listed in
//! [`mcp_persist_core::telemetry`].

use serde_json::Value;
use tracing::Span;

/// The `traceparent` a request's params carry in `_meta`, if any.
pub fn traceparent_in(params: Option<&Value>) -> Option<&str> {
    params?.get("_meta")?.get("traceparent")?.as_str()
}

/// The W3C `traceparent` of the current span, for an application to put in
/// a request's `_meta` so that the request's spans become its children.
/// `None` without the feature `otel`, or when no OpenTelemetry layer is
/// installed.
///
/// ```no_run
/// # fn demo(params: &mut rmcp::model::CallToolRequestParams) {
/// if let Some(traceparent) = mcp_persist_transport_http::telemetry::current_traceparent() {
///     params.meta.get_or_insert_with(Default::default).set_traceparent(traceparent);
/// }
/// # }
/// ```
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&Span::current())
}

/// The W3C `traceparent` of `span`, when an OpenTelemetry layer gives it
/// one. Starts the span's OpenTelemetry side: set its parent first.
pub(crate) fn traceparent_of(span: &Span) -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        if span.is_disabled() {
            return None;
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        span_context.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                span_context.trace_id(),
                span_context.span_id(),
                span_context.trace_flags().to_u8()
            )
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = span;
        None
    }
}

/// Makes `span` a child of the remote span `traceparent` names; a missing
/// or malformed one makes it the root of a trace of its own (it is not
/// left under the long-lived span of the client or server it runs in).
pub(crate) fn continue_trace(span: &Span, traceparent: Option<&str>) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let context = traceparent
            .and_then(parse_traceparent)
            .map(|remote| {
                use opentelemetry::trace::TraceContextExt;
                opentelemetry::Context::new().with_remote_span_context(remote)
            })
            .unwrap_or_default();
        let _ = span.set_parent(context);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, traceparent);
}

/// A W3C `traceparent` (`00-{trace}-{span}-{flags}`) as a remote span
/// context; `None` when malformed or all zeros.
#[cfg(feature = "otel")]
pub(crate) fn parse_traceparent(value: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    if flags.len() != 2 {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// A short name of a JSON-RPC error for `error.type`: its code.
pub(crate) fn error_code_type(code: i32) -> String {
    code.to_string()
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_strictly() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse_traceparent(good).expect("parses");
        assert_eq!(
            parsed.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(parsed.is_remote() && parsed.is_sampled());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_traceparent_of_params() {
        let params = serde_json::json!({"_meta": {"traceparent": "x"}});
        assert_eq!(traceparent_in(Some(&params)), Some("x"));
        assert_eq!(traceparent_in(Some(&serde_json::json!({}))), None);
        assert_eq!(traceparent_in(None), None);
    }
}
