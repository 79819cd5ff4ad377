//! Answers read from an SSE event's data without building their JSON tree.
//! Of an answer the client needs only its id (to give rmcp its own id
//! back) and, for tasks, three fields of its result; everything else is
//! passed on byte for byte.

use serde::Deserialize;
use serde_json::{Value, value::RawValue};

use rmcp::model::NumberOrString;

/// The top level of a JSON-RPC message, borrowed from the text it was
/// read from; other members are skipped without being kept.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
}

/// A JSON-RPC response or error as an SSE event carries it.
pub(crate) struct StreamAnswer<'a> {
    data: &'a str,
    /// Where the id's JSON text sits in `data`.
    id: std::ops::Range<usize>,
    result: Option<&'a RawValue>,
}

impl<'a> StreamAnswer<'a> {
    /// `data` read as an answer (a message with an id and no method);
    /// `None` for a request, a notification, or text that is not JSON.
    pub(crate) fn read(data: &'a str) -> Option<Self> {
        let head: Head<'a> = serde_json::from_str(data).ok()?;
        if head.method.is_some() {
            return None;
        }
        let raw = head.id?.get();
        // A borrowed raw value is a slice of the text it was read from.
        let start = (raw.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
        let id = start..start + raw.len();
        (data.get(id.clone()) == Some(raw)).then_some(StreamAnswer {
            data,
            id,
            result: head.result,
        })
    }

    fn id_text(&self) -> &'a str {
        &self.data[self.id.clone()]
    }

    /// The id, if it is an integer (the only ids the client renumbers).
    pub(crate) fn wire_id(&self) -> Option<i64> {
        self.id_text().parse().ok()
    }

    /// The id as rmcp reads it; `None` for `null` or a malformed id.
    pub(crate) fn id(&self) -> Option<NumberOrString> {
        serde_json::from_str(self.id_text()).ok()
    }

    /// The text with `id` in place of the answer's id, everything else
    /// unchanged.
    pub(crate) fn with_id(&self, id: &NumberOrString) -> String {
        let id = id.clone().into_json_value().to_string();
        let mut text = String::with_capacity(self.data.len() + id.len());
        text.push_str(&self.data[..self.id.start]);
        text.push_str(&id);
        text.push_str(&self.data[self.id.end..]);
        text
    }

    /// What the answer's result says of a task.
    pub(crate) fn task(&self) -> TaskFields {
        self.result
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default()
    }
}

/// The members of an answer's `result` that say what became of a task
/// (any JSON, as a server wrote them; only strings count).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TaskFields {
    #[serde(rename = "resultType", default)]
    result_type: Option<Value>,
    #[serde(default)]
    status: Option<Value>,
    #[serde(rename = "taskId", default)]
    task_id: Option<Value>,
}

impl TaskFields {
    /// The fields of `result`, an answer's result read as JSON.
    pub(crate) fn of(result: &Value) -> Self {
        TaskFields {
            result_type: result.get("resultType").cloned(),
            status: result.get("status").cloned(),
            task_id: result.get("taskId").cloned(),
        }
    }

    fn task_id(&self) -> Option<String> {
        self.task_id.as_ref()?.as_str().map(str::to_owned)
    }

    fn is_created_task(&self) -> bool {
        self.result_type.as_ref().and_then(Value::as_str) == Some("task")
    }

    /// The task an answer to `tasks/get` reports ended (completed, failed
    /// or cancelled).
    pub(crate) fn ended(&self) -> Option<String> {
        if self.is_created_task() {
            return None;
        }
        let status = self.status.as_ref()?.as_str()?;
        if !matches!(status, "completed" | "failed" | "cancelled") {
            return None;
        }
        self.task_id()
    }

    /// The task a `CreateTaskResult` (`resultType: "task"`, the task's
    /// fields inlined) reports created.
    pub(crate) fn created(&self) -> Option<String> {
        if !self.is_created_task() {
            return None;
        }
        self.task_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gets_its_id_replaced_and_nothing_else_changed() {
        let data = r#"{"jsonrpc":"2.0", "id" : 17 ,"result":{"content":[{"type":"text","text":"id 17 \"x\""}]}}"#;
        let answer = StreamAnswer::read(data).expect("an answer");
        assert_eq!(answer.wire_id(), Some(17));
        assert_eq!(answer.id(), Some(NumberOrString::Number(17)));
        let text = answer.with_id(&NumberOrString::String("local-1".into()));
        assert_eq!(
            text,
            r#"{"jsonrpc":"2.0", "id" : "local-1" ,"result":{"content":[{"type":"text","text":"id 17 \"x\""}]}}"#
        );
        let error = r#"{"jsonrpc":"2.0","error":{"code":-1,"message":"m"},"id":4}"#;
        let answer = StreamAnswer::read(error).expect("an error answer");
        assert_eq!(
            answer.with_id(&NumberOrString::Number(0)),
            r#"{"jsonrpc":"2.0","error":{"code":-1,"message":"m"},"id":0}"#
        );
    }

    #[test]
    fn what_is_not_an_answer_is_not_read_as_one() {
        for data in [
            r#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"result":1}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":"#,
            "not json",
            "[1,2]",
        ] {
            assert!(StreamAnswer::read(data).is_none(), "{data}");
        }
        let text_id = StreamAnswer::read(r#"{"id":"a","result":{}}"#).expect("an answer");
        assert_eq!(text_id.wire_id(), None, "only integers are wire ids");
        assert_eq!(text_id.id(), Some(NumberOrString::String("a".into())));
    }

    #[test]
    fn task_fields_say_what_became_of_a_task() {
        let read = |result: &str| {
            let data = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
            let from_text = StreamAnswer::read(&data).expect("an answer").task();
            let value: Value = serde_json::from_str(result).expect("json");
            let from_tree = TaskFields::of(&value);
            let both = (
                (from_text.created(), from_text.ended()),
                (from_tree.created(), from_tree.ended()),
            );
            assert_eq!(both.0, both.1, "{result}");
            both.0
        };
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            read(r#"{"resultType":"task","taskId":"t1","status":"working"}"#),
            (some("t1"), None)
        );
        assert_eq!(
            read(r#"{"taskId":"t2","status":"completed","extra":[1,{"a":2}]}"#),
            (None, some("t2"))
        );
        assert_eq!(read(r#"{"taskId":"t3","status":"working"}"#), (None, None));
        assert_eq!(read(r#"{"taskId":7,"status":"failed"}"#), (None, None));
        assert_eq!(read(r#"{"content":[]}"#), (None, None));
        assert_eq!(read(r#""a string result""#), (None, None));
    }
}
