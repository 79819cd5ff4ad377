//! The fixture server: the tools, resources and prompts the conformance
//! suite's server scenarios call, with the exact names and contents they
//! check.
//!
//! Results are written as JSON literals and decoded into rmcp's types, so
//! what reaches the wire is what the scenario expects, field for field.

// Logging, sampling and legacy subscriptions are deprecated in rmcp by the
// 2026-07-28 revision, and they are exactly what the 2025-11-25 scenarios
// test.
#![allow(deprecated)]

use std::{
    borrow::Cow,
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use mcp_persist_transport_http::server::FleetBus;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        CompleteRequestParams, CompleteResult, CreateMessageRequestParams, ElicitRequestParams,
        GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetTaskParams, GetTaskResult,
        ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
        LoggingLevel, LoggingMessageNotificationParam, PaginatedRequestParams,
        ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams,
        ReadResourceResponse, ReadResourceResult, Reference, RequestStateCodec, ServerConfig,
        SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
        UnsubscribeRequestParams, UpdateTaskParams,
    },
    service::{RequestContext, SubscriptionContext},
};
use serde_json::{Value, json};

use crate::{
    literal::{complete_result, decode},
    tasks::TaskRuntime,
};

/// A 1x1 red PNG, base64: the image the image scenarios expect.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A WAV header with no samples, base64: the audio the audio scenario expects.
const WAV_SILENCE: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

fn text_result(text: &str) -> Result<CallToolResponse, ErrorData> {
    let result: CallToolResult = complete_result(json!({
        "content": [{ "type": "text", "text": text }]
    }))?;
    Ok(result.into())
}

fn empty_object_schema() -> Value {
    json!({ "type": "object", "properties": {} })
}

/// The rmcp server handler every conformance server run uses, whatever
/// stores sit under it.
///
/// Cheap to clone: rmcp makes one per session (or per request, for the
/// stateless 2026-07-28 lifecycle); the log level and subscriptions are
/// shared by all clones.
#[derive(Debug, Clone)]
pub struct FixtureServer {
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
    subscriptions: Arc<Mutex<HashSet<String>>>,
    /// Seals the `requestState` of the multi round-trip fixtures.
    codec: Arc<RequestStateCodec>,
    /// Runs the task fixtures.
    tasks: TaskRuntime,
    /// Carries list changes to every instance's listen streams.
    bus: FleetBus,
}

impl FixtureServer {
    /// A fixture server with no log level set and no subscriptions, sealing
    /// `requestState` with `codec` (the fleet's shared one, see
    /// [`request_state_codec`](mcp_persist_transport_http::server::request_state_codec)),
    /// running the task fixtures on `tasks` and delivering list changes
    /// through `bus`.
    pub fn new(codec: RequestStateCodec, tasks: TaskRuntime, bus: FleetBus) -> Self {
        FixtureServer {
            log_level: Arc::default(),
            subscriptions: Arc::default(),
            codec: Arc::new(codec),
            tasks,
            bus,
        }
    }

    fn tools() -> Value {
        let mut tools = Self::plain_tools();
        for more in [
            crate::mrtr::tools(),
            crate::tasks::tools(),
            crate::stateless::tools(),
        ] {
            if let (Some(all), Value::Array(more)) = (tools.as_array_mut(), more) {
                all.extend(more);
            }
        }
        tools
    }

    fn plain_tools() -> Value {
        json!([
            { "name": "test_simple_text", "description": "Returns a simple text response", "inputSchema": empty_object_schema() },
            { "name": "test_image_content", "description": "Returns an image", "inputSchema": empty_object_schema() },
            { "name": "test_audio_content", "description": "Returns an audio clip", "inputSchema": empty_object_schema() },
            { "name": "test_embedded_resource", "description": "Returns an embedded resource", "inputSchema": empty_object_schema() },
            { "name": "test_multiple_content_types", "description": "Returns text, an image and a resource", "inputSchema": empty_object_schema() },
            { "name": "test_tool_with_logging", "description": "Sends three log messages while it runs", "inputSchema": empty_object_schema() },
            { "name": "test_error_handling", "description": "Always fails with a tool error", "inputSchema": empty_object_schema() },
            { "name": "test_tool_with_progress", "description": "Reports progress three times", "inputSchema": empty_object_schema() },
            {
                "name": "test_sampling",
                "description": "Asks the client for an LLM completion",
                "inputSchema": {
                    "type": "object",
                    "properties": { "prompt": { "type": "string", "description": "What to ask" } },
                    "required": ["prompt"]
                }
            },
            {
                "name": "test_elicitation",
                "description": "Asks the user for their name and email",
                "inputSchema": {
                    "type": "object",
                    "properties": { "message": { "type": "string", "description": "What to show the user" } },
                    "required": ["message"]
                }
            },
            { "name": "test_elicitation_sep1034_defaults", "description": "Elicitation whose fields all have defaults (SEP-1034)", "inputSchema": empty_object_schema() },
            { "name": "test_elicitation_sep1330_enums", "description": "Elicitation with every enum schema shape (SEP-1330)", "inputSchema": empty_object_schema() },
            {
                "name": "json_schema_2020_12_tool",
                "description": "Input schema using JSON Schema 2020-12 features",
                "inputSchema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "$defs": {
                        "address": {
                            "$anchor": "addressDef",
                            "type": "object",
                            "properties": { "street": { "type": "string" }, "city": { "type": "string" } }
                        }
                    },
                    "properties": {
                        "name": { "type": "string" },
                        "address": { "$ref": "#/$defs/address" },
                        "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                        "phone": { "type": "string" },
                        "email": { "type": "string" }
                    },
                    "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                    "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
                    "then": { "required": ["phone"] },
                    "else": { "required": ["email"] },
                    "additionalProperties": false
                }
            },
            { "name": "test_reconnection", "description": "Runs long enough for a client to lose and resume its stream", "inputSchema": empty_object_schema() }
        ])
    }

    async fn logging_tool(&self, cx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        for step in [
            "Tool execution started",
            "Tool processing data",
            "Tool execution completed",
        ] {
            let param: LoggingMessageNotificationParam = decode(json!({
                "level": "info",
                "logger": "conformance-server",
                "data": step
            }))?;
            if let Err(e) = cx.peer.notify_logging_message(param).await {
                tracing::warn!(error = %e, "could not send a log message");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn progress_tool(&self, cx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let Some(token) = cx.meta.get_progress_token() else {
            return Ok(());
        };
        for (progress, message) in [(0.0, "Starting"), (50.0, "Halfway"), (100.0, "Done")] {
            let param = ProgressNotificationParam::new(token.clone(), progress)
                .with_total(100.0)
                .with_message(message);
            if let Err(e) = cx.peer.notify_progress(param).await {
                tracing::warn!(error = %e, "could not send a progress notification");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn sampling_tool(
        &self,
        args: &serde_json::Map<String, Value>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let prompt = args
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or("Hello");
        let params: CreateMessageRequestParams = decode(json!({
            "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
            "maxTokens": 100
        }))?;
        match cx.peer.create_message(params).await {
            Ok(result) => {
                let reply = serde_json::to_value(&result.message.content)
                    .ok()
                    .and_then(|c| {
                        let first = if c.is_array() {
                            c.get(0).cloned()
                        } else {
                            Some(c)
                        };
                        first.and_then(|b| b.get("text").and_then(Value::as_str).map(String::from))
                    })
                    .unwrap_or_else(|| "(no text)".into());
                text_result(&format!("LLM response: {reply}"))
            }
            Err(e) => {
                let result: CallToolResult = complete_result(json!({
                    "content": [{ "type": "text", "text": format!("Sampling failed: {e}") }],
                    "isError": true
                }))?;
                Ok(result.into())
            }
        }
    }

    async fn elicit(
        &self,
        message: &str,
        schema: Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let params: ElicitRequestParams = decode(json!({
            "mode": "form",
            "message": message,
            "requestedSchema": schema
        }))?;
        match cx.peer.create_elicitation(params).await {
            Ok(result) => {
                let answer = serde_json::to_string(&result).unwrap_or_default();
                text_result(&format!("Elicitation answered: {answer}"))
            }
            Err(e) => {
                let result: CallToolResult = complete_result(json!({
                    "content": [{ "type": "text", "text": format!("Elicitation failed: {e}") }],
                    "isError": true
                }))?;
                Ok(result.into())
            }
        }
    }
}

impl ServerHandler for FixtureServer {
    fn get_info(&self) -> ServerConfig {
        // Decoding a literal that is checked by the crate's tests; the
        // fallback keeps the server up should rmcp ever reject it.
        serde_json::from_value(json!({
            "protocolVersion": ProtocolVersion::LATEST_WITH_INITIALIZE,
            "capabilities": {
                "tools": { "listChanged": true },
                "resources": { "subscribe": true, "listChanged": false },
                "prompts": { "listChanged": false },
                "logging": {},
                "completions": {},
                "extensions": { "io.modelcontextprotocol/tasks": {} }
            },
            "serverInfo": { "name": "mcp-persist-conformance-server", "version": env!("CARGO_PKG_VERSION") },
            "instructions": "The mcp-persist conformance server: the suite's fixture tools, resources and prompts."
        }))
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "server info fixture does not decode");
            ServerConfig::default()
        })
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        complete_result(json!({ "tools": Self::tools() }))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(answer) = self.tasks.call_tool(&request, &cx).await {
            return answer;
        }
        if let Some(answer) = crate::stateless::call_tool(&self.bus, &request, &cx).await {
            return answer;
        }
        let capabilities = cx.client_capabilities();
        if let Some(answer) = crate::mrtr::call_tool(&self.codec, &request, capabilities.as_ref()) {
            return answer;
        }
        let args = request.arguments.clone().unwrap_or_default();
        let content = |blocks: Value| -> Result<CallToolResponse, ErrorData> {
            let result: CallToolResult = complete_result(json!({ "content": blocks }))?;
            Ok(result.into())
        };
        match request.name.as_ref() {
            "test_simple_text" => text_result("This is a simple text response for testing."),
            "test_image_content" => content(json!([
                { "type": "image", "data": PNG_1X1, "mimeType": "image/png" }
            ])),
            "test_audio_content" => content(json!([
                { "type": "audio", "data": WAV_SILENCE, "mimeType": "audio/wav" }
            ])),
            "test_embedded_resource" => content(json!([{
                "type": "resource",
                "resource": {
                    "uri": "test://embedded-resource",
                    "mimeType": "text/plain",
                    "text": "This is an embedded resource content."
                }
            }])),
            "test_multiple_content_types" => content(json!([
                { "type": "text", "text": "Multiple content types test:" },
                { "type": "image", "data": PNG_1X1, "mimeType": "image/png" },
                {
                    "type": "resource",
                    "resource": {
                        "uri": "test://mixed-content-resource",
                        "mimeType": "application/json",
                        "text": "{\"test\":\"data\",\"value\":123}"
                    }
                }
            ])),
            "test_tool_with_logging" => {
                self.logging_tool(&cx).await?;
                text_result("Tool with logging executed successfully")
            }
            "test_error_handling" => {
                let result: CallToolResult = complete_result(json!({
                    "content": [{ "type": "text", "text": "This tool intentionally returns an error for testing" }],
                    "isError": true
                }))?;
                Ok(result.into())
            }
            "test_tool_with_progress" => {
                self.progress_tool(&cx).await?;
                text_result("Progress tool completed")
            }
            "test_sampling" => self.sampling_tool(&args, &cx).await,
            "test_elicitation" => {
                let message = args
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("Please provide your information");
                self.elicit(
                    message,
                    json!({
                        "type": "object",
                        "properties": {
                            "username": { "type": "string", "description": "Your name" },
                            "email": { "type": "string", "description": "Your email address" }
                        },
                        "required": ["username", "email"]
                    }),
                    &cx,
                )
                .await
            }
            "test_elicitation_sep1034_defaults" => {
                self.elicit(
                    "Please review these values; every field has a default",
                    json!({
                        "type": "object",
                        "properties": {
                            "name": { "type": "string", "description": "Name", "default": "John Doe" },
                            "age": { "type": "integer", "description": "Age", "default": 30 },
                            "score": { "type": "number", "description": "Score", "default": 95.5 },
                            "status": {
                                "type": "string",
                                "description": "Status",
                                "enum": ["active", "inactive", "pending"],
                                "default": "active"
                            },
                            "verified": { "type": "boolean", "description": "Verified", "default": true }
                        }
                    }),
                    &cx,
                )
                .await
            }
            "test_elicitation_sep1330_enums" => {
                self.elicit(
                    "Please pick from these lists",
                    json!({
                        "type": "object",
                        "properties": {
                            "untitledSingle": { "type": "string", "enum": ["option1", "option2", "option3"] },
                            "titledSingle": {
                                "type": "string",
                                "oneOf": [
                                    { "const": "value1", "title": "First Option" },
                                    { "const": "value2", "title": "Second Option" },
                                    { "const": "value3", "title": "Third Option" }
                                ]
                            },
                            "legacyEnum": {
                                "type": "string",
                                "enum": ["opt1", "opt2", "opt3"],
                                "enumNames": ["Option One", "Option Two", "Option Three"]
                            },
                            "untitledMulti": {
                                "type": "array",
                                "items": { "type": "string", "enum": ["option1", "option2", "option3"] }
                            },
                            "titledMulti": {
                                "type": "array",
                                "items": {
                                    "anyOf": [
                                        { "const": "value1", "title": "First Choice" },
                                        { "const": "value2", "title": "Second Choice" },
                                        { "const": "value3", "title": "Third Choice" }
                                    ]
                                }
                            }
                        }
                    }),
                    &cx,
                )
                .await
            }
            "json_schema_2020_12_tool" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or("world");
                text_result(&format!("Hello, {name}!"))
            }
            "test_reconnection" => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                text_result("Reconnection test completed")
            }
            other => Err(ErrorData::invalid_params(
                format!("unknown tool: {other}"),
                None,
            )),
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        crate::stateless::tool(name)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        FleetBus::accept(requested)
    }

    async fn listen(&self, cx: SubscriptionContext) -> Result<(), ErrorData> {
        self.bus.listen(cx).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get_task(request, &cx).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.update_task(request, &cx).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(request, &cx).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        complete_result(json!({
            "resources": [
                {
                    "uri": "test://static-text",
                    "name": "Static Text Resource",
                    "description": "A static text resource",
                    "mimeType": "text/plain"
                },
                {
                    "uri": "test://static-binary",
                    "name": "Static Binary Resource",
                    "description": "A static binary resource",
                    "mimeType": "image/png"
                }
            ]
        }))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        complete_result(json!({
            "resourceTemplates": [{
                "uriTemplate": "test://template/{id}/data",
                "name": "Template Resource",
                "description": "A resource whose URI takes an id",
                "mimeType": "application/json"
            }]
        }))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.as_str();
        let contents = match uri {
            "test://static-text" => json!([{
                "uri": uri,
                "mimeType": "text/plain",
                "text": "This is the content of the static text resource."
            }]),
            "test://static-binary" => json!([{
                "uri": uri,
                "mimeType": "image/png",
                "blob": PNG_1X1
            }]),
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
            {
                Some(id) => json!([{
                    "uri": uri,
                    "mimeType": "application/json",
                    "text": json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") }).to_string()
                }]),
                None => {
                    return Err(ErrorData::resource_not_found(
                        format!("no resource at {uri}"),
                        Some(json!({ "uri": uri })),
                    ));
                }
            },
        };
        let result: ReadResourceResult = complete_result(json!({ "contents": contents }))?;
        Ok(result.into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .map_err(|_| ErrorData::internal_error("subscriptions lock poisoned", None))?
            .insert(request.uri.to_string());
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .map_err(|_| ErrorData::internal_error("subscriptions lock poisoned", None))?
            .remove(request.uri.as_str());
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        complete_result(json!({
            "prompts": [
                { "name": "test_simple_prompt", "description": "A prompt without arguments" },
                {
                    "name": "test_prompt_with_arguments",
                    "description": "A prompt with two arguments",
                    "arguments": [
                        { "name": "arg1", "description": "First argument", "required": true },
                        { "name": "arg2", "description": "Second argument", "required": true }
                    ]
                },
                {
                    "name": "test_prompt_with_embedded_resource",
                    "description": "A prompt that embeds a resource",
                    "arguments": [
                        { "name": "resourceUri", "description": "The resource to embed", "required": true }
                    ]
                },
                { "name": "test_prompt_with_image", "description": "A prompt with an image" },
                crate::mrtr::prompt()
            ]
        }))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if let Some(answer) = crate::mrtr::get_prompt(&request) {
            return answer;
        }
        let args = request.arguments.clone().unwrap_or_default();
        let arg = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let messages = match request.name.as_str() {
            "test_simple_prompt" => json!([
                { "role": "user", "content": { "type": "text", "text": "This is a simple prompt for testing." } }
            ]),
            "test_prompt_with_arguments" => json!([{
                "role": "user",
                "content": {
                    "type": "text",
                    "text": format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2"))
                }
            }]),
            "test_prompt_with_embedded_resource" => {
                let uri = match arg("resourceUri") {
                    u if u.is_empty() => "test://example-resource".to_string(),
                    u => u,
                };
                json!([
                    {
                        "role": "user",
                        "content": {
                            "type": "resource",
                            "resource": { "uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing." }
                        }
                    },
                    { "role": "user", "content": { "type": "text", "text": "Please process the embedded resource above." } }
                ])
            }
            "test_prompt_with_image" => json!([
                { "role": "user", "content": { "type": "image", "data": PNG_1X1, "mimeType": "image/png" } },
                { "role": "user", "content": { "type": "text", "text": "Please analyze the image above." } }
            ]),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown prompt: {other}"),
                    None,
                ));
            }
        };
        let result: GetPromptResult = complete_result(json!({ "messages": messages }))?;
        Ok(result.into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let prefix = request.argument.value.as_str();
        let candidates: &[&str] = match &request.r#ref {
            Reference::Prompt(_) => &["python", "pytorch", "rust", "ruby", "typescript"],
            _ => &["1", "2", "3", "10", "20"],
        };
        let values: Vec<&str> = candidates
            .iter()
            .copied()
            .filter(|v| v.starts_with(prefix))
            .collect();
        complete_result(json!({
            "completion": { "values": values, "total": values.len(), "hasMore": false }
        }))
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self
            .log_level
            .lock()
            .map_err(|_| ErrorData::internal_error("log level lock poisoned", None))? =
            Some(request.level);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> RequestStateCodec {
        RequestStateCodec::try_new(vec![7u8; 32]).expect("a 32-byte key")
    }

    #[test]
    fn fixtures_decode() {
        let bus = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(FleetBus::start(mcp_persist_core::NotificationBus::new(
                std::sync::Arc::new(mcp_persist_core::MemoryStore::new()),
                mcp_persist_core::BusRetention::default(),
            )))
            .expect("bus");
        let server = FixtureServer::new(
            codec(),
            TaskRuntime::Rmcp(rmcp::task_manager::TaskManager::new()),
            bus,
        );
        let info = server.get_info();
        assert_eq!(info.server_info.name, "mcp-persist-conformance-server");
        let tools: ListToolsResult =
            decode(json!({ "tools": FixtureServer::tools() })).expect("tools decode");
        assert!(tools.tools.iter().any(|t| t.name == "test_reconnection"));
        assert!(
            tools
                .tools
                .iter()
                .any(|t| t.name == "test_input_required_result_multi_round")
        );
    }

    /// Every input request the multi round-trip fixtures build decodes as
    /// rmcp's type, and a state sealed for one tool opens for no other.
    #[test]
    fn multi_round_trip_fixtures_decode_and_bind_their_state() {
        let codec = codec();
        for tool in FixtureServer::tools().as_array().expect("array") {
            let name = tool["name"].as_str().expect("name");
            if !name.starts_with("test_input_required_result_") {
                continue;
            }
            let request = CallToolRequestParams::new(name.to_owned());
            let sampling: rmcp::model::ClientCapabilities =
                decode(json!({"sampling": {}})).expect("capabilities");
            let answer = crate::mrtr::call_tool(&codec, &request, Some(&sampling))
                .expect("a fixture tool")
                .expect("round 1 answers");
            assert!(
                matches!(answer, CallToolResponse::InputRequired(_)),
                "{name} did not ask for input"
            );
        }
        let mut request = CallToolRequestParams::new("test_input_required_result_request_state");
        let CallToolResponse::InputRequired(first) = crate::mrtr::call_tool(&codec, &request, None)
            .expect("fixture")
            .expect("round 1")
        else {
            panic!("no input required");
        };
        let state = first.request_state.expect("sealed state");
        request.input_responses = Some(
            [(
                "confirm".to_owned(),
                json!({"action": "accept", "content": {"ok": true}}),
            )]
            .into_iter()
            .collect(),
        );
        request.request_state = Some(state.clone());
        assert!(
            crate::mrtr::call_tool(&codec, &request, None)
                .expect("fixture")
                .is_ok()
        );
        let mut other = request.clone();
        other.name = "test_input_required_result_tampered_state".into();
        assert!(
            crate::mrtr::call_tool(&codec, &other, None)
                .expect("fixture")
                .is_err(),
            "a state sealed for one tool opened for another"
        );
        request.request_state = Some(format!("{state}-TAMPERED"));
        assert!(
            crate::mrtr::call_tool(&codec, &request, None)
                .expect("fixture")
                .is_err()
        );
    }
}
