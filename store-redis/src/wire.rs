//! What crosses the wire: durations as Redis wants them, and the parsing of
//! Redis replies into records, log entries and typed errors. A leaf: the
//! store and the append batcher both build on it.

use std::time::Duration;

use mcp_persist_core::{Error, KvEntry, LogRecord, Result, Version};
use redis::Value;

use crate::error::{self, BACKEND};

/// A duration in whole milliseconds by the kit's rule (rounded up, at least
/// 1, so nothing expires early), at most about 100 years.
pub(crate) fn millis(d: Duration) -> u64 {
    const MAX: u64 = 100 * 365 * 24 * 60 * 60 * 1000;
    mcp_persist_core::kit::ttl_millis(d).min(MAX)
}

pub(crate) fn unexpected(key: &str, what: &str) -> Error {
    Error::backend(
        BACKEND,
        format!("unexpected reply from Redis for `{key}`: {what}"),
    )
}

pub(crate) fn status_of<'a>(key: &str, reply: &'a Value) -> Result<(i64, Option<&'a Value>)> {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(status)) => Ok((*status, items.get(1))),
            _ => Err(unexpected(key, "script status missing")),
        },
        _ => Err(unexpected(key, "script did not return an array")),
    }
}

pub(crate) fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Splits a stored `<version>:<value>` string.
pub(crate) fn parse_record(key: &str, mut raw: Vec<u8>) -> Result<KvEntry> {
    let sep = raw
        .iter()
        .take(21)
        .position(|&b| b == b':')
        .ok_or_else(|| error::corrupt(key, "the record has no version header"))?;
    let version = parse_u64(&raw[..sep])
        .ok_or_else(|| error::corrupt(key, "the record's version header is not a number"))?;
    raw.drain(..=sep);
    Ok(KvEntry::new(raw, Version::new(version)))
}

/// The sequence number of a stream entry id `0-<seq>`.
pub(crate) fn parse_id(log: &str, id: &[u8]) -> Result<u64> {
    id.strip_prefix(b"0-").and_then(parse_u64).ok_or_else(|| {
        error::corrupt(
            log,
            format!(
                "stream entry id `{}` was not written by this store",
                String::from_utf8_lossy(id)
            ),
        )
    })
}

/// Parses the entries of an `XRANGE` reply (or of one stream of `XREAD`).
pub(crate) fn parse_entries(log: &str, reply: Value) -> Result<Vec<LogRecord>> {
    let Value::Array(entries) = reply else {
        return match reply {
            Value::Nil => Ok(Vec::new()),
            _ => Err(unexpected(log, "stream entries are not an array")),
        };
    };
    let mut records = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(mut parts) = entry else {
            return Err(unexpected(log, "stream entry is not an array"));
        };
        if parts.len() != 2 {
            return Err(unexpected(log, "stream entry is not an id and fields"));
        }
        let fields = parts.pop().expect("length checked above");
        let id = parts.pop().expect("length checked above");
        let seq = parse_id(log, bytes_of(&id).unwrap_or_default())?;
        let Value::Array(fields) = fields else {
            return Err(unexpected(log, "stream entry fields are not an array"));
        };
        let mut data = None;
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if bytes_of(&name) == Some(b"d")
                && let Value::BulkString(bytes) = value
            {
                data = Some(bytes);
            }
        }
        let data = data.ok_or_else(|| {
            error::corrupt(log, format!("stream entry 0-{seq} has no data field"))
        })?;
        records.push(LogRecord::new(seq, data));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_is_never_zero() {
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert!(millis(Duration::MAX) < 1 << 53);
    }
}
