//! The core of mcp-persist: what an MCP client and server keep across
//! crashes, redeploys and cold starts, and the backend contract it is kept
//! through.
//!
//! # What is persisted
//!
//! **Client side**, per server ([`ServerKey`]: canonical endpoint URL plus a
//! profile name), in a [`ClientStateStore`]:
//!
//! * [`ServerProfile`]: the protocol era the server speaks and the version in
//!   use, and a cached `server/discover` result with its TTL, so a restart
//!   does not probe again.
//! * [`LegacySession`]: the `Mcp-Session-Id`, the server's whole
//!   `InitializeResult` (capabilities, server info, instructions), the
//!   request-id high-water mark (ids never repeat within a session) and the
//!   last SSE event id of every open stream.
//! * [`InFlightRequest`]: the journal of requests sent and not yet answered,
//!   so that after a restart the answer can be collected instead of the work
//!   running again.
//!
//! **Credentials**, per authorization-server issuer and resource
//! ([`CredentialKey`]), in a [`AuthStore`]: [`Credentials`] (access
//! token with an absolute expiry, refresh token, scopes, the
//! [`ClientRegistration`]) and, for a short TTL, [`PendingAuthorization`]s.
//! Refreshes are guarded so that processes sharing a store spend a refresh
//! token once, and the rotated token is never lost.
//!
//! **Server side**: [`ServerSession`]s in a [`ServerSessionStore`] (the client's
//! `initialize` params and the principal the session is bound to, expiring
//! after an idle TTL), the SSE event log in an [`EventLog`], whose
//! [`EventId`]s carry an unguessable per-stream token, and the secret keys a
//! fleet must share (such as the one sealing SEP-2322 `requestState`) in a
//! [`SharedKeyStore`], created once and rotated with the previous key kept.
//!
//! Every record is written with its kind and schema version (see
//! [`records`]); one written by a newer version of this crate is
//! [`Error::NewerSchema`], a damaged one [`Error::Corrupt`] naming its key.
//! Tokens and secrets are [`Secret`]s, which never print.
//!
//! # Where
//!
//! The typed stores sit on two backend traits, [`KvStore`] (get, put with
//! compare-and-swap and TTL, delete, list) and [`LogStore`] (append, read
//! after, trim, delete). This crate has an in-memory backend,
//! [`MemoryStore`]; `mcp-persist-store-file`, `-store-sqlite`, `-store-redis`
//! and `-store-vault` add durable ones. A [`Stores`] bundle routes each kind
//! of state to a backend.
//!
//! # Encryption at rest
//!
//! [`Stores::encrypted`] seals records with AES-256-GCM before they reach
//! any backend (those with secrets by default, or all of them), with keys
//! from an environment variable, a file or a secrets manager, rotated while
//! the fleet runs: see [`seal`].
//!
//! # Example
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use mcp_persist_core::*;
//!
//! let stores = Stores::new(MemoryStore::new());
//! let client = stores.client_state();
//! let server = ServerKey::new("https://mcp.example.com/mcp", "default")?;
//!
//! // After a real `initialize`, keep the session...
//! let session = LegacySession::new(
//!     SessionId::new("5f0c8a61-1d3e-4b0e-9a51-3c8f0b2d7e44")?,
//!     ProtocolVersion::new("2025-11-25")?,
//!     serde_json::json!({
//!         "protocolVersion": "2025-11-25",
//!         "capabilities": {"tools": {}},
//!         "serverInfo": {"name": "example", "version": "1.0"},
//!     }),
//! );
//! client.save_session(&server, &session, PutMode::Create).await?;
//! let ids = client.reserve_request_ids(&server, 100).await?;
//! assert_eq!(ids, 0..100);
//!
//! // ...and after a restart, read it back before any network call.
//! let restored = client.session(&server).await?.expect("stored");
//! assert_eq!(restored.record.initialize_result["serverInfo"]["name"], "example");
//! // Request numbering continues above every id reserved before.
//! assert_eq!(client.reserve_request_ids(&server, 100).await?, 100..200);
//!
//! // Server side: events are replayed after a Last-Event-ID, with their ids.
//! let events = stores.events(EventLogConfig::default())?;
//! let first = events.append("stream-1", None, &serde_json::json!({"n": 1})).await?;
//! let second = events.append("stream-1", None, &serde_json::json!({"n": 2})).await?;
//! let replayed = events.replay_after(&first.to_string(), None).await?;
//! assert_eq!(replayed.len(), 1);
//! assert_eq!(replayed[0].id, second);
//! # Ok::<_, Error>(()) }).unwrap();
//! ```
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `conformance` | [`conformance`]: the test suite every backend must pass, and its macros |
//! | `otel` | [`telemetry::Telemetry`] records OpenTelemetry metrics (through the OpenTelemetry API; the application picks the exporter) |
#![cfg_attr(
    feature = "conformance",
    doc = "\n\n[`conformance`]: crate::conformance"
)]
#![cfg_attr(
    not(feature = "conformance"),
    doc = "\n\n[`conformance`]: crate#features"
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
pub mod declare;
mod error;
mod key;
pub mod kit;
pub mod memory;
pub mod observe;
pub mod records;
pub mod registry;
pub mod retry;
pub mod seal;
mod secret;
pub mod stores;
pub mod telemetry;
mod types;

pub use backend::{Backend, KvEntry, KvStore, LogRecord, LogStore, PutMode, PutOptions, Version};
pub use error::{BoxError, Error, Result};
pub use key::{Key, MAX_KEY_BYTES};
pub use memory::MemoryStore;
pub use records::{
    ClientRegistration, CredentialKey, Credentials, DiscoverCache, InFlightRequest, LegacySession,
    PendingAuthorization, ServerProfile, ServerSession,
};
pub use secret::Secret;
pub use stores::{
    AuthStore, BusMessage, BusRetention, CallAnswer, CallKey, CallRecord, CallStatus, CallStore,
    ClientStateStore, DpopKey, EventDurability, EventLog, EventLogConfig, FleetNotice,
    InstanceLease, InstanceLeases, KeptAnswer, KeyRing, Liveness, MAX_NOTICE_BYTES, MAX_REQUEST_ID,
    NotificationBus, OwnLease, RefreshLease, RefreshOutcome, ResumableOperation,
    ServerSessionStore, SharedKey, SharedKeyStore, Stored, StoredEvent, Stores, TaskId, TaskOwner,
    TaskRecord, TaskStatus, TaskStore, TaskUpdate,
};
pub use types::{
    EventId, MAX_PROFILE_BYTES, MAX_SESSION_ID_BYTES, MAX_STREAM_ID_BYTES, ProtocolEra,
    ProtocolVersion, RequestId, ServerKey, SessionId, Timestamp, canonical_url,
};

/// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
