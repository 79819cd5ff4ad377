//! Typed stores: MCP meaning over the two backend primitives.
//!
//! Each store owns its record schemas ([`records`](crate::records)) and its
//! invariants; the key layout of every kind it keeps is declared once in
//! [`declare`](crate::declare), where the table of keys is.
//!
//! | store | kinds |
//! |---|---|
//! | [`ClientStateStore`] | [`SERVER_PROFILE`](crate::declare::SERVER_PROFILE), [`LEGACY_SESSION`](crate::declare::LEGACY_SESSION), [`IN_FLIGHT_REQUEST`](crate::declare::IN_FLIGHT_REQUEST) |
//! | [`AuthStore`] | [`CREDENTIALS`](crate::declare::CREDENTIALS), [`REFRESH_LEASE`](crate::declare::REFRESH_LEASE), [`RESOURCE_ISSUER`](crate::declare::RESOURCE_ISSUER), [`PENDING_AUTHORIZATION`](crate::declare::PENDING_AUTHORIZATION), [`DPOP_KEY`](crate::declare::DPOP_KEY) |
//! | [`ServerSessionStore`] | [`SERVER_SESSION`](crate::declare::SERVER_SESSION) |
//! | [`EventLog`] | [`EVENT_STREAM`](crate::declare::EVENT_STREAM), [`EVENT`](crate::declare::EVENT) |
//! | [`SharedKeyStore`] | [`SHARED_KEY_RING`](crate::declare::SHARED_KEY_RING) |
//! | [`TaskStore`] | [`TASK`](crate::declare::TASK), [`TASK_INBOX`](crate::declare::TASK_INBOX) |
//! | [`CallStore`] | [`CALL_RECORD`](crate::declare::CALL_RECORD) |
//! | [`NotificationBus`] | [`FLEET_NOTICE`](crate::declare::FLEET_NOTICE) |
//! | [`InstanceLeases`] | [`INSTANCE_LEASE`](crate::declare::INSTANCE_LEASE) |
//! | | [`HEARTBEAT`](crate::declare::HEARTBEAT) |
//! | [`ToolLock`] | [`TOOL_LOCK`](crate::declare::TOOL_LOCK) |

mod bundle;
mod bus;
pub mod calls;
mod client;
pub(crate) mod credentials;
mod events;
pub mod inspect;
mod keys;
pub(crate) mod liveness;
mod session;
pub(crate) mod tasks;
#[cfg(test)]
pub(crate) mod testkit;
pub(crate) mod tool_lock;

pub use bundle::Stores;
pub use bus::{BusMessage, BusRetention, FleetNotice, MAX_NOTICE_BYTES, NotificationBus};
pub use calls::{
    Begin, CallAnswer, CallKey, CallRecord, CallStatus, CallStore, KeptAnswer, MAX_CALL_KEY_BYTES,
};
pub use client::{ClientStateStore, MAX_REQUEST_ID};
pub use credentials::{AuthStore, DpopKey, RefreshLease, RefreshOutcome};
pub use events::{EventDurability, EventLog, EventLogConfig, StoredEvent, StreamOrigin};
pub use keys::{KeyRing, SharedKey, SharedKeyStore};
pub use liveness::{Heartbeat, InstanceLease, InstanceLeases, Liveness, OwnLease};
pub use session::ServerSessionStore;
pub use tasks::{
    MAX_TASK_ID_BYTES, ResumableOperation, TaskId, TaskOwner, TaskRecord, TaskStatus, TaskStore,
    TaskUpdate,
};
pub use tool_lock::ToolLock;

use std::time::Duration;

use crate::{
    Key, KvStore, PutMode, PutOptions, Result, Version,
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

pub(crate) async fn read<T: Record>(kv: &dyn KvStore, key: &Key) -> Result<Option<Stored<T>>> {
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
    key: &Key,
    record: &T,
    mode: PutMode,
    ttl: Option<Duration>,
) -> Result<Version> {
    kv.put(key, encode(record)?, PutOptions::new(mode).with_ttl(ttl))
        .await
}
