//! The fixtures of the stateless revision's server scenarios
//! (`server-stateless`, SEP-2575; `http-custom-header-server-validation`,
//! SEP-2243): diagnostic tools, a tool that changes the tool list through
//! the fleet bus, and a tool whose argument travels in a custom header.

// Logging is deprecated by the 2026-07-28 revision, and is what one
// diagnostic tool is about.
#![allow(deprecated)]

use std::time::Duration;

use mcp_persist_core::FleetNotice;
use mcp_persist_transport_http::server::FleetBus;
use rmcp::{
    ErrorData, RoleServer,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, InputRequests,
        InputRequiredResult, LoggingMessageNotificationParam, Tool,
    },
    service::RequestContext,
};
use serde_json::{Value, json};

use crate::literal::{complete_result, decode};

/// The custom-header tool's name.
pub(crate) const CUSTOM_HEADER_TOOL: &str = "test_custom_header";

/// The tools, for `tools/list`.
pub(crate) fn tools() -> Value {
    let plain = |name: &str, description: &str| {
        json!({
            "name": name,
            "description": description,
            "inputSchema": { "type": "object", "properties": {} }
        })
    };
    json!([
        plain(
            "test_missing_capability",
            "Needs the client's sampling capability"
        ),
        plain(
            "test_streaming_elicitation",
            "Asks the user something, through an incomplete result"
        ),
        plain(
            "test_logging_tool",
            "Logs three messages when the request asks for a log level"
        ),
        plain(
            "test_trigger_tool_change",
            "Changes the tool list: every listen stream of the fleet hears it"
        ),
        custom_header_tool(),
    ])
}

fn custom_header_tool() -> Value {
    json!({
        "name": CUSTOM_HEADER_TOOL,
        "description": "Echoes `region`, which also travels in the Mcp-Param-Region header",
        "inputSchema": {
            "type": "object",
            "properties": {
                "region": { "type": "string", "x-mcp-header": "Region" }
            },
            "required": ["region"]
        }
    })
}

/// The tool definition rmcp checks `Mcp-Param-*` headers against, for the
/// one tool that declares them.
pub(crate) fn tool(name: &str) -> Option<Tool> {
    (name == CUSTOM_HEADER_TOOL)
        .then(|| decode(custom_header_tool()).ok())
        .flatten()
}

fn text(text: &str) -> Result<CallToolResponse, ErrorData> {
    complete_result::<CallToolResult>(json!({ "content": [{ "type": "text", "text": text }] }))
        .map(Into::into)
}

/// Answers a `tools/call` of a stateless fixture, or `None` for other tools.
pub(crate) async fn call_tool(
    bus: &FleetBus,
    request: &CallToolRequestParams,
    cx: &RequestContext<RoleServer>,
) -> Option<Result<CallToolResponse, ErrorData>> {
    let args = Value::Object(request.arguments.clone().unwrap_or_default());
    let capabilities = cx.client_capabilities();
    Some(match request.name.as_ref() {
        "test_missing_capability" => {
            if capabilities.as_ref().is_some_and(|c| c.sampling.is_some()) {
                text("The client declared sampling.")
            } else {
                let mut required = ClientCapabilities::default();
                required.sampling = Some(Default::default());
                Err(ErrorData::missing_required_client_capability(required))
            }
        }
        "test_streaming_elicitation" => {
            let answered = request
                .input_responses
                .as_ref()
                .and_then(|r| r.get("confirm"))
                .cloned();
            match answered {
                Some(answer) => text(&format!("Answered: {answer}")),
                None => decode::<InputRequests>(json!({
                    "confirm": {
                        "method": "elicitation/create",
                        "params": {
                            "message": "Continue?",
                            "requestedSchema": {
                                "type": "object",
                                "properties": { "ok": { "type": "boolean" } },
                                "required": ["ok"]
                            }
                        }
                    }
                }))
                .map(|requests| InputRequiredResult::new(Some(requests), None).into()),
            }
        }
        "test_logging_tool" => {
            // Only a request that names a log level gets log messages.
            if cx.meta.log_level().is_some() {
                for step in ["started", "working", "done"] {
                    let param: Result<LoggingMessageNotificationParam, _> = decode(json!({
                        "level": "info",
                        "logger": "conformance-server",
                        "data": step
                    }));
                    if let Ok(param) = param
                        && let Err(e) = cx.peer.notify_logging_message(param).await
                    {
                        tracing::warn!(error = %e, "could not send a log message");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            text("Logged as asked.")
        }
        "test_trigger_tool_change" => match bus.publish(FleetNotice::ToolsListChanged).await {
            Ok(()) => text("The tool list changed."),
            Err(e) => Err(ErrorData::internal_error(
                format!("publishing the change failed: {e}"),
                None,
            )),
        },
        CUSTOM_HEADER_TOOL => {
            let region = args["region"].as_str().unwrap_or_default();
            text(&format!("Region: {region}"))
        }
        _ => return None,
    })
}
