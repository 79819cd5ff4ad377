//! Typed stores: MCP meaning over the two backend primitives.
//!
//! Each store owns its key layout (below), its record schemas
//! ([`records`](crate::records)) and its invariants. Key components that come
//! from outside (URLs, session ids, issuers) are escaped so that `/` always
//! separates components and no two inputs share a key.
//!
//! | store | key | record |
//! |---|---|---|
//! | [`ClientStateStore`] | `client/profile/<profile>/<endpoint>` | [`ServerProfile`](crate::ServerProfile) |
//! | | `client/session/<profile>/<endpoint>` | [`LegacySession`](crate::LegacySession) |
//! | | `client/inflight/<profile>/<endpoint>/<session>/<id>` | [`InFlightRequest`](crate::InFlightRequest) |
//! | [`AuthStore`] | `cred/token/<issuer>/<resource>` | [`Credentials`](crate::Credentials) |
//! | | `cred/lease/<issuer>/<resource>` | refresh lease (holder, short TTL) |
//! | | `cred/issuer/<resource>` | the issuer in force for the resource |
//! | | `cred/pending/<sha256 of state>` | [`PendingAuthorization`](crate::PendingAuthorization) |
//! | [`ServerSessionStore`] | `server/session/<session id>` | [`ServerSession`](crate::ServerSession) |
//! | [`EventLog`] | `server/stream/<stream id>` (KV) | stream owner and token |
//! | | `server/events/<stream id>` (log) | one record per SSE event |
//! | [`SharedKeyStore`] | `server/key/<name>` | [`KeyRing`] (active and previous key) |
//! | [`TaskStore`] | `server/task/<task id>` (KV) | [`TaskRecord`] |
//! | | `server/task-inbox/<task id>` (log) | wake-ups for the instance running it |
//! | [`NotificationBus`] | `server/bus` (log) | one [`BusMessage`] per published notice |
//! | [`InstanceLeases`] | `server/instance/<instance id>` | [`InstanceLease`] |
//! | | `server/heartbeats` (log) | one [`Heartbeat`] per instance and heartbeat |

mod bundle;
mod bus;
mod client;
mod credentials;
mod events;
pub mod inspect;
mod keys;
mod liveness;
mod session;
mod tasks;

pub use bundle::Stores;
pub use bus::{BusMessage, BusRetention, FleetNotice, MAX_NOTICE_BYTES, NotificationBus};
pub use client::{ClientStateStore, MAX_REQUEST_ID};
pub use credentials::{AuthStore, RefreshLease, RefreshOutcome};
pub use events::{EventDurability, EventLog, EventLogConfig, StoredEvent, StreamOrigin};
pub use keys::{KeyRing, SharedKey, SharedKeyStore};
pub use liveness::{HEARTBEAT_LOG, Heartbeat, InstanceLease, InstanceLeases, Liveness, OwnLease};
pub use session::ServerSessionStore;
pub use tasks::{
    MAX_TASK_ID_BYTES, ResumableOperation, TaskId, TaskOwner, TaskRecord, TaskStatus, TaskStore,
    TaskUpdate,
};

use std::time::Duration;

use crate::{
    KvStore, PutMode, PutOptions, Result, Version,
    records::{Record, decode, encode},
};

/// A record as read, with the version to compare-and-swap against.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    /// The record.
    pub record: T,
    /// Its version in the backend.
    pub version: Version,
}

/// Escapes a key component: `%` and `/` become `%25` and `%2F`.
pub(crate) fn component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The text a [`component`] was made from.
pub(crate) fn uncomponent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("%2F") {
            out.push('/');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else {
            out.push('%');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

pub(crate) async fn read<T: Record>(kv: &dyn KvStore, key: &str) -> Result<Option<Stored<T>>> {
    match kv.get(key).await? {
        None => Ok(None),
        Some(entry) => Ok(Some(Stored {
            record: decode(key, &entry.value)?,
            version: entry.version,
        })),
    }
}

pub(crate) async fn write<T: Record>(
    kv: &dyn KvStore,
    key: &str,
    record: &T,
    mode: PutMode,
    ttl: Option<Duration>,
) -> Result<Version> {
    kv.put(key, encode(record)?, PutOptions::new(mode).with_ttl(ttl))
        .await
}
