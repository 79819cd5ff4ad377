//! The SEP-2322 multi round-trip fixtures (`input-required-result-*`): tools
//! and a prompt that answer with an `InputRequiredResult` until the client
//! retries with the `inputResponses` they asked for.
//!
//! Every `requestState` is sealed with the server's shared request-state
//! codec ([`request_state_codec`](mcp_persist_transport_http::server::request_state_codec)),
//! bound to the tool that issued it and valid for ten minutes: a retry that
//! reaches another instance opens it there, and a tampered one is refused
//! with -32602.

use std::time::Duration;

use rmcp::{
    ErrorData,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities,
        GetPromptRequestParams, GetPromptResponse, GetPromptResult, InputRequests,
        InputRequiredResult, InputResponses, RequestStateCodec, SealOptions,
    },
};
use serde_json::{Value, json};

use crate::literal::{complete_result, decode};

/// How long a sealed `requestState` stays valid.
const STATE_TTL: Duration = Duration::from_secs(600);

/// The tools, for `tools/list`.
pub(crate) fn tools() -> Value {
    let tool = |name: &str, description: &str| {
        json!({
            "name": name,
            "description": description,
            "inputSchema": { "type": "object", "properties": {} }
        })
    };
    json!([
        tool(
            "test_input_required_result_elicitation",
            "Asks for a name, then greets"
        ),
        tool(
            "test_input_required_result_list_roots",
            "Asks for the client's roots"
        ),
        tool(
            "test_input_required_result_sampling",
            "Asks the client's model a question"
        ),
        tool(
            "test_input_required_result_capabilities",
            "Asks only for what the client declared"
        ),
        tool(
            "test_input_required_result_multi_round",
            "Asks twice, carrying state between rounds"
        ),
        tool(
            "test_input_required_result_multiple_inputs",
            "Asks three things at once"
        ),
        tool(
            "test_input_required_result_request_state",
            "Round-trips a sealed requestState"
        ),
        tool(
            "test_input_required_result_tampered_state",
            "Refuses a requestState that was changed"
        ),
    ])
}

/// The prompt, for `prompts/list`.
pub(crate) fn prompt() -> Value {
    json!({
        "name": "test_input_required_result_prompt",
        "description": "Asks for context before it is rendered"
    })
}

fn elicit(message: &str, field: &str) -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": { field: { "type": "string" } },
                "required": [field]
            }
        }
    })
}

fn sample(text: &str, max_tokens: u32) -> Value {
    json!({
        "method": "sampling/createMessage",
        "params": {
            "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
            "maxTokens": max_tokens
        }
    })
}

fn roots() -> Value {
    json!({ "method": "roots/list", "params": {} })
}

fn confirm() -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "message": "Please confirm",
            "requestedSchema": {
                "type": "object",
                "properties": { "ok": { "type": "boolean" } },
                "required": ["ok"]
            }
        }
    })
}

fn ask(requests: Value, state: Option<String>) -> Result<InputRequiredResult, ErrorData> {
    let requests: InputRequests = decode(requests)?;
    Ok(InputRequiredResult::new(Some(requests), state))
}

fn text(text: String) -> Result<CallToolResponse, ErrorData> {
    let result: CallToolResult = complete_result(json!({
        "content": [{ "type": "text", "text": text }]
    }))?;
    Ok(result.into())
}

/// A string field of an accepted elicitation response; `None` for a
/// response of any other shape (the input is asked for again).
fn elicited(responses: &InputResponses, key: &str, field: &str) -> Option<String> {
    let response = responses.get(key)?.as_object()?;
    if response.get("action")?.as_str()? != "accept" {
        return None;
    }
    response
        .get("content")?
        .get(field)?
        .as_str()
        .map(str::to_owned)
}

/// The text of a sampling response.
fn sampled(responses: &InputResponses, key: &str) -> Option<String> {
    responses.get(key)?["content"]["text"]
        .as_str()
        .map(str::to_owned)
}

/// The root URIs of a `roots/list` response.
fn listed_roots(responses: &InputResponses, key: &str) -> Option<Vec<String>> {
    let roots = responses.get(key)?["roots"].as_array()?;
    Some(
        roots
            .iter()
            .filter_map(|r| r["uri"].as_str().map(str::to_owned))
            .collect(),
    )
}

/// Seals `payload` for `tool`.
fn seal(codec: &RequestStateCodec, tool: &str, payload: &Value) -> String {
    let options = SealOptions::new()
        .associated_data(tool.as_bytes())
        .ttl(STATE_TTL);
    codec.seal_with(payload.to_string().as_bytes(), &options)
}

/// Opens a `requestState` sealed for `tool`; anything else is -32602.
fn open(codec: &RequestStateCodec, tool: &str, state: Option<&str>) -> Result<Value, ErrorData> {
    let state = state.ok_or_else(|| ErrorData::invalid_params("requestState is missing", None))?;
    let bytes = codec.open_with(state, tool.as_bytes()).map_err(|e| {
        tracing::warn!(tool, error = %e, "requestState refused");
        ErrorData::invalid_params(
            format!("requestState failed its integrity check: {e}"),
            None,
        )
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|_| ErrorData::invalid_params("requestState does not hold a state", None))
}

/// Whether the client declared `capability` (its per-request
/// `clientCapabilities`, or its session's).
fn declared(capabilities: Option<&ClientCapabilities>, capability: &str) -> bool {
    capabilities
        .and_then(|c| serde_json::to_value(c).ok())
        .is_some_and(|c| c.get(capability).is_some_and(|v| !v.is_null()))
}

/// Answers one of the fixture tools, or `None` for a tool of another kind.
pub(crate) fn call_tool(
    codec: &RequestStateCodec,
    request: &CallToolRequestParams,
    capabilities: Option<&ClientCapabilities>,
) -> Option<Result<CallToolResponse, ErrorData>> {
    let name = request.name.as_ref();
    let empty = InputResponses::new();
    let responses = request.input_responses.as_ref().unwrap_or(&empty);
    let state = request.request_state.as_deref();
    let answer = match name {
        "test_input_required_result_elicitation" => {
            match elicited(responses, "user_name", "name") {
                Some(user) => text(format!("Hello, {user}!")),
                // Missing or wrong keys: ask again, never an error.
                None => ask(
                    json!({ "user_name": elicit("What is your name?", "name") }),
                    None,
                )
                .map(Into::into),
            }
        }
        "test_input_required_result_list_roots" => match listed_roots(responses, "client_roots") {
            Some(uris) => text(format!("Roots: {}", uris.join(", "))),
            None => ask(json!({ "client_roots": roots() }), None).map(Into::into),
        },
        "test_input_required_result_sampling" => match sampled(responses, "capital_question") {
            Some(answer) => text(format!("The model answered: {answer}")),
            None => ask(
                json!({ "capital_question": sample("What is the capital of France?", 100) }),
                None,
            )
            .map(Into::into),
        },
        "test_input_required_result_capabilities" => {
            if !responses.is_empty() {
                return Some(text("Thanks for the input.".to_owned()));
            }
            let mut requests = serde_json::Map::new();
            if declared(capabilities, "sampling") {
                requests.insert("question".into(), sample("Say hello", 20));
            }
            if declared(capabilities, "elicitation") {
                requests.insert("user_name".into(), elicit("What is your name?", "name"));
            }
            if declared(capabilities, "roots") {
                requests.insert("client_roots".into(), roots());
            }
            if requests.is_empty() {
                text("The client declared nothing to ask for.".to_owned())
            } else {
                ask(Value::Object(requests), None).map(Into::into)
            }
        }
        "test_input_required_result_multi_round" => multi_round(codec, name, responses, state),
        "test_input_required_result_multiple_inputs" => {
            let keys = ["user_name", "greeting", "client_roots"];
            if state.is_some() {
                if let Err(e) = open(codec, name, state) {
                    return Some(Err(e));
                }
                if keys.iter().all(|k| responses.contains_key(*k)) {
                    let user = elicited(responses, "user_name", "name").unwrap_or_default();
                    let greeting = sampled(responses, "greeting").unwrap_or_default();
                    let roots = listed_roots(responses, "client_roots").unwrap_or_default();
                    return Some(text(format!(
                        "{greeting} {user} (roots: {})",
                        roots.join(", ")
                    )));
                }
            }
            let all = json!({
                "user_name": elicit("What is your name?", "name"),
                "greeting": sample("Generate a greeting", 50),
                "client_roots": roots(),
            });
            let missing: serde_json::Map<String, Value> = all
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !responses.contains_key(*k) || state.is_none())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            ask(
                Value::Object(missing),
                Some(seal(codec, name, &json!({ "round": 1 }))),
            )
            .map(Into::into)
        }
        "test_input_required_result_request_state"
        | "test_input_required_result_tampered_state" => {
            let confirmed = responses
                .get("confirm")
                .and_then(|r| r["content"]["ok"].as_bool())
                == Some(true);
            match (state, confirmed) {
                (Some(_), true) => open(codec, name, state)
                    .and_then(|_| text("state-ok: the requestState was verified".to_owned())),
                _ => ask(
                    json!({ "confirm": confirm() }),
                    Some(seal(codec, name, &json!({ "round": 1 }))),
                )
                .map(Into::into),
            }
        }
        _ => return None,
    };
    Some(answer)
}

/// Two elicitations, the first answer carried to the end in the sealed
/// state.
fn multi_round(
    codec: &RequestStateCodec,
    name: &str,
    responses: &InputResponses,
    state: Option<&str>,
) -> Result<CallToolResponse, ErrorData> {
    let first = || {
        ask(
            json!({ "step1": elicit("Step 1: What is your name?", "name") }),
            Some(seal(codec, name, &json!({ "round": 1 }))),
        )
        .map(Into::into)
    };
    if state.is_none() {
        return first();
    }
    let carried = open(codec, name, state)?;
    match carried["round"].as_u64() {
        Some(1) => match elicited(responses, "step1", "name") {
            Some(user) => ask(
                json!({ "step2": elicit("Step 2: What is your favorite color?", "color") }),
                Some(seal(codec, name, &json!({ "round": 2, "name": user }))),
            )
            .map(Into::into),
            None => first(),
        },
        Some(2) => {
            let user = carried["name"].as_str().unwrap_or_default();
            match elicited(responses, "step2", "color") {
                Some(color) => text(format!("{user} likes {color}.")),
                None => ask(
                    json!({ "step2": elicit("Step 2: What is your favorite color?", "color") }),
                    Some(seal(codec, name, &carried)),
                )
                .map(Into::into),
            }
        }
        _ => Err(ErrorData::invalid_params(
            "requestState names no round of this tool",
            None,
        )),
    }
}

/// Answers the fixture prompt, or `None` for another prompt.
pub(crate) fn get_prompt(
    request: &GetPromptRequestParams,
) -> Option<Result<GetPromptResponse, ErrorData>> {
    if request.name != "test_input_required_result_prompt" {
        return None;
    }
    let empty = InputResponses::new();
    let responses = request.input_responses.as_ref().unwrap_or(&empty);
    Some(match elicited(responses, "user_context", "context") {
        Some(context) => complete_result::<GetPromptResult>(json!({
            "description": "A prompt rendered with the client's context",
            "messages": [{
                "role": "user",
                "content": { "type": "text", "text": format!("Use this context: {context}") }
            }]
        }))
        .map(Into::into),
        None => ask(
            json!({ "user_context": elicit("What context should the prompt use?", "context") }),
            None,
        )
        .map(Into::into),
    })
}
