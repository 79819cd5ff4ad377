//! Between stored task records and rmcp's task types: status, timestamps,
//! payloads, and the errors the extension prescribes.

use mcp_persist_core::{TaskRecord, TaskStatus as StoredStatus, Timestamp};
use rmcp::{
    ErrorData,
    model::{DetailedTask, InputRequests, JsonObject, Task, TaskPayload, TaskStatus},
};
use serde_json::Value;

/// The error every task request gets for an id it may not see: unknown,
/// expired, malformed or another principal's, all alike.
pub(super) fn unknown_task(id: &str) -> ErrorData {
    // The id is echoed only when it is short and printable, so an oversized
    // or binary id cannot bloat the answer.
    let shown = if id.len() <= mcp_persist_core::stores::MAX_TASK_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_graphic())
    {
        id
    } else {
        "<invalid id>"
    };
    ErrorData::invalid_params(format!("unknown task: {shown}"), None)
}

/// A store failure, for the client: what failed and what to do, not the
/// backend's details (those go to the log).
pub(super) fn store_error(what: &str, e: &mcp_persist_core::Error) -> ErrorData {
    use mcp_persist_core::Error;
    tracing::warn!(error = %e, "{what} failed");
    match e {
        Error::TooLarge { size, limit, .. } => ErrorData::invalid_params(
            format!("{what}: {size} bytes is over the store's limit of {limit} bytes"),
            None,
        ),
        Error::NewerSchema { .. } => ErrorData::internal_error(
            format!(
                "{what}: the task was stored by a newer version of the server; upgrade this instance"
            ),
            None,
        ),
        Error::Corrupt { .. } => {
            ErrorData::internal_error(format!("{what}: the task's stored record is damaged"), None)
        }
        _ => ErrorData::internal_error(
            format!("{what}: the task store is unavailable; retry later"),
            None,
        ),
    }
}

fn status(s: StoredStatus) -> TaskStatus {
    match s {
        StoredStatus::Working => TaskStatus::Working,
        StoredStatus::InputRequired => TaskStatus::InputRequired,
        StoredStatus::Completed => TaskStatus::Completed,
        StoredStatus::Failed => TaskStatus::Failed,
        // Cancelled, and any status a later schema adds.
        _ => TaskStatus::Cancelled,
    }
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-07-28T09:30:00.250Z`.
pub(super) fn rfc3339(t: Timestamp) -> String {
    let ms = t.as_unix_millis();
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Eras of 400 years (146 097 days) starting on 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// The base task fields of `record`.
pub(super) fn task(record: &TaskRecord) -> Task {
    let mut task = Task::new(
        record.task_id.as_str(),
        status(record.status),
        rfc3339(record.created_at),
        rfc3339(record.last_updated_at),
    );
    task.ttl_ms = record.ttl_ms;
    task.poll_interval_ms = record.poll_interval_ms;
    task.status_message = record.status_message.clone();
    task
}

fn object(value: Option<&Value>) -> JsonObject {
    match value {
        Some(Value::Object(map)) => map.clone(),
        _ => JsonObject::new(),
    }
}

/// What `tasks/get` answers for `record`.
pub(super) fn detailed(record: &TaskRecord) -> Result<DetailedTask, ErrorData> {
    let payload = match record.status {
        StoredStatus::Working => TaskPayload::Working,
        StoredStatus::InputRequired => {
            let mut requests = InputRequests::new();
            for (key, request) in &record.input_requests {
                let request = serde_json::from_value(request.clone()).map_err(|e| {
                    tracing::warn!(task = %record.task_id, %key, error = %e, "stored input request does not parse");
                    ErrorData::internal_error("a stored input request is damaged", None)
                })?;
                requests.insert(key.clone(), request);
            }
            TaskPayload::InputRequired {
                input_requests: requests,
            }
        }
        StoredStatus::Completed => TaskPayload::Completed {
            result: object(record.result.as_ref()),
        },
        StoredStatus::Failed => TaskPayload::Failed {
            error: object(record.error.as_ref()),
        },
        _ => TaskPayload::Cancelled,
    };
    Ok(DetailedTask::new(task(record), payload))
}

/// `error` as the JSON object a failed task inlines.
pub(super) fn error_object(error: &ErrorData) -> Value {
    serde_json::to_value(error).unwrap_or_else(
        |_| serde_json::json!({ "code": -32603, "message": "the operation failed" }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(
            rfc3339(Timestamp::from_unix_millis(0)),
            "1970-01-01T00:00:00.000Z"
        );
        // 2024-02-29T23:59:59.999Z, a leap day.
        assert_eq!(
            rfc3339(Timestamp::from_unix_millis(1_709_251_199_999)),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339(Timestamp::from_unix_millis(1_785_231_000_250)),
            "2026-07-28T09:30:00.250Z"
        );
    }

    #[test]
    fn unknown_task_never_echoes_oversized_ids() {
        let long = "x".repeat(10_000);
        let e = unknown_task(&long);
        assert!(e.message.len() < 100, "{}", e.message);
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    }
}
