//! The conformance client: plays the client scenario named in
//! `MCP_CONFORMANCE_SCENARIO` against the suite's mock server, whose URL is
//! the program's last argument.
//!
//! Every scenario the client knows connects, lists the tools and calls them
//! (with the arguments the suite's `MCP_CONFORMANCE_CONTEXT` names, or
//! arguments built from each tool's input schema), answering sampling,
//! elicitation and roots requests with fixed, schema-conforming values. The
//! revision comes from `MCP_CONFORMANCE_PROTOCOL_VERSION`: 2025-11-25 and
//! older use the `initialize` handshake, 2026-07-28 the discover lifecycle.
//!
//! Authorization scenarios (`auth/...`) are played by [`crate::auth`]: the
//! durable client with mcp-persist's OAuth credential storage.

// Sampling and roots are deprecated in rmcp by the 2026-07-28 revision, and
// the 2025-11-25 scenarios still exercise them.
#![allow(deprecated)]

use std::time::Duration;

use anyhow::{Context, Result};
use mcp_persist_core::Stores;
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_transport_http::client::DurableClientBuilder;
use rmcp::{
    ClientHandler, ErrorData, RoleClient,
    model::{
        CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
        CreateMessageResult, ElicitRequestParams, ElicitResult, Implementation, ListRootsResult,
        ProtocolVersion, Tool,
    },
    service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::scratch::RemoveOnDrop;

/// How long one scenario may take before the client gives up on its own,
/// so the suite never has to kill it. The suite starts every scenario of a
/// leg at once (about thirty client processes), beside the other legs: on
/// two busy cores an authorization scenario that passes took 22 to 27 s, so
/// the deadline leaves room for twice that.
pub const SCENARIO_DEADLINE: Duration = Duration::from_secs(55);

/// What the suite tells the client about the scenario
/// (`MCP_CONFORMANCE_CONTEXT`, JSON).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioContext {
    /// Tool calls the scenario wants made, in order; empty means "call every
    /// listed tool".
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call named by the scenario context.
#[derive(Debug, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments, if any.
    #[serde(default)]
    pub arguments: Option<Map<String, Value>>,
}

/// The scenario the suite asked for, read from the environment.
#[derive(Debug)]
pub struct Scenario {
    /// The scenario name (`MCP_CONFORMANCE_SCENARIO`).
    pub name: String,
    /// The revision the scenario runs at (`MCP_CONFORMANCE_PROTOCOL_VERSION`).
    pub protocol_version: ProtocolVersion,
    /// The scenario context (`MCP_CONFORMANCE_CONTEXT`).
    pub context: ScenarioContext,
}

impl Scenario {
    /// Reads the scenario from the variables the suite sets.
    pub fn from_env() -> Result<Self> {
        let name = std::env::var("MCP_CONFORMANCE_SCENARIO").context(
            "MCP_CONFORMANCE_SCENARIO is not set: run this program from the conformance suite",
        )?;
        let version = std::env::var("MCP_CONFORMANCE_PROTOCOL_VERSION")
            .unwrap_or_else(|_| ProtocolVersion::LATEST_WITH_INITIALIZE.to_string());
        let protocol_version: ProtocolVersion = serde_json::from_value(Value::String(version))
            .context("MCP_CONFORMANCE_PROTOCOL_VERSION is not a protocol version")?;
        let context = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
            Ok(raw) => serde_json::from_str(&raw).with_context(|| {
                format!("MCP_CONFORMANCE_CONTEXT is not the expected JSON: {raw}")
            })?,
            Err(_) => ScenarioContext::default(),
        };
        Ok(Self {
            name,
            protocol_version,
            context,
        })
    }

    /// Plays the scenario against the mock server at `url`, through
    /// `transport`.
    pub async fn run(&self, url: &str, transport: ClientTransport) -> Result<()> {
        if self.name.starts_with("auth/") {
            return crate::auth::run(&self.name, url).await;
        }
        let lifecycle = self.lifecycle();
        tracing::info!(scenario = %self.name, %url, ?lifecycle, ?transport, "playing scenario");
        let client = match transport {
            ClientTransport::Stock => {
                let transport = StreamableHttpClientTransport::from_config(
                    StreamableHttpClientTransportConfig::with_uri(url.to_string()),
                );
                ScenarioHandler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .with_context(|| format!("connecting to {url}"))?
            }
            ClientTransport::Durable => {
                let dir = std::env::temp_dir().join(format!(
                    "mcp-persist-conformance-client-{}",
                    std::process::id()
                ));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let _cleanup = RemoveOnDrop(dir.clone());
                let backend = SqliteStore::open(dir.join("client.sqlite"))
                    .await
                    .context("opening the client's SQLite store")?;
                let stores = Stores::new(backend);
                let (transport, handle) = DurableClientBuilder::new(url.to_string(), &stores)
                    .profile(self.name.clone())
                    .build()
                    .await
                    .context("building the durable client transport")?;
                tracing::info!(start = ?handle.start(), "durable client transport ready");
                ScenarioHandler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .with_context(|| format!("connecting to {url}"))?
            }
        };
        let outcome = self.exercise(&client).await;
        if let Err(e) = client.cancel().await {
            tracing::warn!(error = %e, "closing the client");
        }
        outcome
    }

    fn lifecycle(&self) -> ClientLifecycleMode {
        // The schema-dereferencing scenario's mock serves only the handshake.
        if self.protocol_version.has_initialize() || self.name == "json-schema-ref-no-deref" {
            return ClientLifecycleMode::Initialize;
        }
        let mut preferred = vec![self.protocol_version.clone()];
        preferred.extend(
            ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .rev()
                .filter(|v| **v != self.protocol_version)
                .cloned(),
        );
        ClientLifecycleMode::Discover {
            preferred_versions: preferred,
        }
    }

    async fn exercise(&self, client: &RunningService<RoleClient, ScenarioHandler>) -> Result<()> {
        let tools = client
            .list_tools(Default::default())
            .await
            .context("listing tools")?;
        tracing::info!(count = tools.tools.len(), "listed tools");
        if self.name == "initialize" || self.name == "json-schema-ref-no-deref" {
            return Ok(());
        }
        let calls: Vec<(String, Option<Map<String, Value>>)> = if self.context.tool_calls.is_empty()
        {
            tools
                .tools
                .iter()
                .map(|t| (t.name.to_string(), arguments_for(t, &tools.tools)))
                .collect()
        } else {
            self.context
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect()
        };
        for (name, arguments) in calls {
            let mut params = CallToolRequestParams::new(name.clone());
            if let Some(arguments) = arguments {
                params = params.with_arguments(arguments);
            }
            match client.call_tool(params).await {
                Ok(result) => {
                    tracing::info!(tool = %name, is_error = ?result.is_error, "tool answered")
                }
                Err(e) => tracing::warn!(tool = %name, error = %e, "tool call failed"),
            }
        }
        Ok(())
    }
}

/// Which HTTP transport the client speaks through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTransport {
    /// mcp-persist's durable transport with its state on SQLite (a fresh
    /// database per run): persistence on. The default.
    Durable,
    /// rmcp's own reqwest transport, for comparison.
    Stock,
}

/// Arguments for a tool built from its input schema: every required
/// property gets a plain value of its type. The schema-echo tool gets the
/// input schema of the other tool, exactly as it was received, so the
/// scenario can check that nothing was lost in parsing.
fn arguments_for(tool: &Tool, all: &[Tool]) -> Option<Map<String, Value>> {
    if tool.name == "json_schema_echo" {
        let other = all.iter().find(|t| t.name != tool.name)?;
        let mut arguments = Map::new();
        arguments.insert(
            "schema".into(),
            Value::Object((*other.input_schema).clone()),
        );
        return Some(arguments);
    }
    let schema = &tool.input_schema;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if required.is_empty() {
        return None;
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut arguments = Map::new();
    for name in required {
        let kind = properties
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let value = match kind {
            Some("number") => json!(1.5),
            Some("integer") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("test"),
        };
        arguments.insert(name.to_string(), value);
    }
    Some(arguments)
}

/// Answers what the mock servers ask of a client: sampling with a fixed
/// completion, elicitation with every field's default (or a plain value of
/// its type), roots with one fixed root.
#[derive(Debug, Clone, Copy)]
pub struct ScenarioHandler;

impl ClientHandler for ScenarioHandler {
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = serde_json::from_value(json!({
            "sampling": {},
            "elicitation": { "form": {} },
            "roots": { "listChanged": false }
        }))
        .unwrap_or_default();
        let mut info = ClientConfig::new(
            capabilities,
            Implementation::new("mcp-persist-conformance-client", env!("CARGO_PKG_VERSION")),
        );
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _cx: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let asked = serde_json::to_value(&params.messages).unwrap_or_default();
        tracing::info!(%asked, "sampling requested");
        serde_json::from_value(json!({
            "role": "assistant",
            "content": { "type": "text", "text": "This is a fixed completion from the conformance client." },
            "model": "conformance-fixed-model",
            "stopReason": "endTurn"
        }))
        .map_err(|e| ErrorData::internal_error(format!("sampling answer does not decode: {e}"), None))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _cx: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = serde_json::to_value(&request).unwrap_or_default();
        let mut content = Map::new();
        if let Some(properties) = request
            .pointer("/requestedSchema/properties")
            .and_then(Value::as_object)
        {
            for (name, property) in properties {
                let value = match property.get("default") {
                    Some(default) => default.clone(),
                    None => match property.get("type").and_then(Value::as_str) {
                        Some("number") => json!(1.5),
                        Some("integer") => json!(1),
                        Some("boolean") => json!(true),
                        Some("array") => json!([]),
                        _ => match property.get("enum").and_then(Value::as_array) {
                            Some(options) => options.first().cloned().unwrap_or(json!("test")),
                            None => json!("test"),
                        },
                    },
                };
                content.insert(name.clone(), value);
            }
        }
        serde_json::from_value(json!({ "action": "accept", "content": content })).map_err(|e| {
            ErrorData::internal_error(format!("elicitation answer does not decode: {e}"), None)
        })
    }

    async fn list_roots(
        &self,
        _cx: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        serde_json::from_value(json!({
            "roots": [{ "uri": "file:///conformance-root", "name": "conformance root" }]
        }))
        .map_err(|e| ErrorData::internal_error(format!("roots answer does not decode: {e}"), None))
    }
}
