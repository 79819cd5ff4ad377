//! HTTP header names the client sets itself, spelled as rmcp spells them.

use std::collections::HashMap;

use http::{HeaderName, HeaderValue};
use rmcp::{model::InitializeResult, transport::common::http_header};

/// An rmcp header name constant as a [`HeaderName`].
pub(crate) fn header_name(name: &'static str) -> HeaderName {
    HeaderName::from_bytes(name.as_bytes()).expect("rmcp's header name constants are valid tokens")
}

/// The `MCP-Protocol-Version` header of a session, as rmcp's worker sends
/// it after `initialize`.
pub(crate) fn version_headers(result: &InitializeResult) -> HashMap<HeaderName, HeaderValue> {
    let mut headers = HashMap::new();
    if let Ok(v) = HeaderValue::from_str(result.protocol_version.as_str()) {
        headers.insert(header_name(http_header::HEADER_MCP_PROTOCOL_VERSION), v);
    }
    headers
}

/// Whether `name` is one of the SEP-2243 routing headers (`Mcp-Method`,
/// `Mcp-Name`, `Mcp-Param-*`) rmcp derives from a request's body.
pub(crate) fn is_routing_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    name.eq_ignore_ascii_case(http_header::HEADER_MCP_METHOD)
        || name.eq_ignore_ascii_case(http_header::HEADER_MCP_NAME)
        || name
            .get(..http_header::HEADER_MCP_PARAM_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(http_header::HEADER_MCP_PARAM_PREFIX))
}
