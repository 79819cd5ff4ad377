//! The layout of items in the table, and reading numbers and bytes out of
//! them (every number read is checked before any arithmetic).

use std::{
    collections::{HashMap, hash_map::RandomState},
    hash::{BuildHasher, Hasher},
    sync::atomic::{AtomicU64, Ordering},
};

use aws_sdk_dynamodb::types::AttributeValue;
use mcp_persist_core::{Error, Result, Timestamp};

/// The partition key (a string): `k<key>` for a key-value record,
/// `l<log name>` for a log.
pub(crate) const PK: &str = "pk";
/// The sort key (a number): 0 for a key-value record and for a log's head,
/// the sequence number for a log record.
pub(crate) const SK: &str = "sk";
/// The bytes of a key-value record or a log record (absent: a tombstone).
pub(crate) const DATA: &str = "d";
/// A key-value record's version.
pub(crate) const VERSION: &str = "v";
/// The expiry instant in milliseconds since the epoch (absent: never), the
/// one reads judge by.
pub(crate) const EXPIRES: &str = "x";
/// DynamoDB's TTL attribute: seconds since the epoch after which the service
/// may delete the item (lazily, typically within days).
pub(crate) const TTL: &str = "ttl";
/// The token of the last write, to recognise one's own write after a lost
/// answer and a retry.
pub(crate) const WRITER: &str = "w";
/// A log head's last sequence number handed out.
pub(crate) const LAST: &str = "s";
/// A log head's floor: records at or below it are gone (trimmed, expired,
/// deleted).
pub(crate) const FLOOR: &str = "f";
/// The life of a log: a random number that changes when an expired or
/// deleted log is written again; its records carry it.
pub(crate) const LIFE: &str = "l";

/// `TTL` is a reserved word in DynamoDB expressions: always written `#t`.
pub(crate) const TTL_ALIAS: &str = "#t";

/// DynamoDB's limit on one item: 400 KB, attribute names included.
pub(crate) const ITEM_LIMIT: usize = 400 * 1024;
/// Room kept in an item for everything but the value: the partition key
/// (at most 1 + 1024 bytes), the sort key and the other attributes.
pub(crate) const ITEM_OVERHEAD: usize = 2 * 1024;

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) fn kv_pk(key: &str) -> String {
    format!("k{key}")
}

pub(crate) fn log_pk(log: &str) -> String {
    format!("l{log}")
}

pub(crate) fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// The number attribute `name` of `item`, if present; anything but a whole
/// number in `u64` is [`Error::Corrupt`] naming `key`.
pub(crate) fn number(item: &Item, name: &str, key: &str) -> Result<Option<u64>> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(text)) => text.parse::<u64>().map(Some).map_err(|_| {
            Error::corrupt(
                key,
                format!("attribute `{name}` is {text:?}, not a whole number"),
            )
        }),
        Some(_) => Err(Error::corrupt(
            key,
            format!("attribute `{name}` is not a number"),
        )),
    }
}

/// The bytes attribute `name` of `item`, if present.
pub(crate) fn bytes(item: &Item, name: &str, key: &str) -> Result<Option<Vec<u8>>> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::B(blob)) => Ok(Some(blob.as_ref().to_vec())),
        Some(_) => Err(Error::corrupt(
            key,
            format!("attribute `{name}` is not binary"),
        )),
    }
}

/// Milliseconds since the epoch of `at`.
pub(crate) fn millis(at: Timestamp) -> u64 {
    at.as_unix_millis()
}

/// A number no other write of this process or another one is likely to
/// pick: write tokens and log lives.
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u64(mcp_persist_core::kit::now().as_unix_millis());
    // Never 0, so "absent" and a token never look alike.
    hasher.finish() | 1
}

/// The approximate size DynamoDB counts for an item with a partition key of
/// `pk_len` bytes and a value of `value_len` bytes (attribute names, numbers
/// of at most 21 bytes each).
pub(crate) fn item_size(pk_len: usize, value_len: usize) -> usize {
    // pk, sk, d, l (or v, w, x, ttl): names plus values.
    2 + pk_len + 2 + 21 + 1 + value_len + 4 * (3 + 21)
}
