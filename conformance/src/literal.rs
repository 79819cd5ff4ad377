//! Fixture literals: JSON written as the scenarios expect it, decoded into
//! rmcp's types. Shared by the fixture server and its multi-round-trip
//! tools.

use rmcp::ErrorData;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Decodes a fixture literal into an rmcp type. A literal that does not
/// decode is a bug in the fixture; the scenario sees an internal error naming
/// the type instead of the server going down.
pub(crate) fn decode<T: DeserializeOwned>(value: Value) -> Result<T, ErrorData> {
    serde_json::from_value(value).map_err(|e| {
        ErrorData::internal_error(
            format!(
                "fixture does not decode as {}: {e}",
                std::any::type_name::<T>()
            ),
            None,
        )
    })
}

/// Decodes a result literal, marked complete (`resultType`, 2026-07-28) as
/// rmcp's own constructors do; rmcp strips the mark for older peers.
pub(crate) fn complete_result<T: DeserializeOwned>(mut value: Value) -> Result<T, ErrorData> {
    if let Some(object) = value.as_object_mut() {
        object
            .entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    }
    decode(value)
}
