//! The Postgres backend of mcp-persist: [`PostgresStore`] implements
//! [`KvStore`](mcp_persist_core::KvStore) and
//! [`LogStore`](mcp_persist_core::LogStore) in one schema of a Postgres
//! database, so that a fleet of MCP server instances shares sessions, SSE
//! event logs, tasks, instance leases and the fleet bus through the database
//! it already runs.
//!
//! # Guarantees
//!
//! * **Committed before `Ok`.** Every write is one committed transaction
//!   before its call returns; with the server's default
//!   `synchronous_commit = on` it is flushed to the server's WAL, so it
//!   survives a crash of the writer and of the server.
//! * **Compare-and-swap in one statement.** A `put` is one call of the
//!   schema's `kv_put` function: the precondition and the write run under a
//!   per-key transaction-level advisory lock and a row lock, so `Create` and
//!   `Update` are linearizable across every process sharing the database.
//!   A delete with a version is one `DELETE ... WHERE version = $2`.
//! * **Versions never repeat** for a key, across deletes and restarts: they
//!   come from one sequence of the schema, drawn under the key's lock.
//! * **Group commit.** An append that finds no commit running commits at
//!   once on its own task; the appends that arrive meanwhile queue, and are
//!   committed together by the next commit, in one statement (one
//!   transaction, one round trip, one WAL flush). Each caller still gets its
//!   answer only after the commit that holds its append. A batch the
//!   database refuses is retried one append at a time, so a bad append
//!   fails alone.
//! * **Sequence numbers are per log and contiguous** (1, 2, 3, …), as on
//!   every other backend, so `mcp-persist copy` moves a log between backends
//!   with its event ids unchanged: the log's row holds its last number, taken
//!   and moved on while the row is locked, so numbers grow in commit order.
//!   They go on above the old ones after a `trim`, an expiry or a
//!   `delete_log`, until the sweep reclaims the log
//!   ([`SWEEP_MARGIN`] after it ended);
//!   a log appended to after that starts again at 1, as the contract allows.
//! * **Unsynced appends** commit with `SET LOCAL synchronous_commit = off`:
//!   visible to every process at once and kept through a crash of the
//!   writer, but a crash of the database server may lose the last of them
//!   (Postgres flushes them within `3 × wal_writer_delay`, 600 ms by
//!   default). A put with
//!   [`PutOptions::unsynced`](mcp_persist_core::PutOptions::unsynced) commits
//!   the same way (a durable server keeps a keyed call's answer so).
//! * **Tailing readers are woken by `LISTEN/NOTIFY`.** Every append notifies
//!   the schema's channel with the log's name; a dedicated connection per
//!   store listens and wakes the readers of that log (`wait_after`, and so
//!   the fleet bus and the task inboxes). A notification carries nothing
//!   that matters: the tables are the truth, and a waiting reader looks
//!   again at least every [poll interval](PostgresStoreBuilder::poll_interval)
//!   (500 ms by default), so a lost notification delays, never loses.
//! * **TTL by the server's clock.** Expiry instants are `timestamptz`
//!   columns computed and compared with the server's `clock_timestamp()`,
//!   so every instance agrees whatever its own clock says; an expired row is
//!   never returned, and a sweep (every 10 minutes in the background, see
//!   [`PostgresStoreBuilder::sweep_interval`], or
//!   [`sweep_expired`](mcp_persist_core::Backend::sweep_expired)) reclaims
//!   what expired more than [`SWEEP_MARGIN`] ago, so that a forward step of
//!   the server's clock shorter than that hides rows without deleting them.
//! * **A versioned schema.** The store's tables and functions live in one
//!   schema (default [`DEFAULT_SCHEMA`]; `?schema=NAME` or
//!   [`PostgresStoreBuilder::schema`], so that several applications share a
//!   database), with its version in its `meta` table ([`SCHEMA_VERSION`]).
//!   Creating and migrating run in one transaction under the schema's
//!   advisory lock, so processes opening a new store at once all come up; an
//!   up-to-date store opens without a lock or a write. A store of a newer
//!   version is refused with [`Error::NewerSchema`](mcp_persist_core::Error::NewerSchema),
//!   a schema holding another application's tables with
//!   [`Error::InvalidInput`](mcp_persist_core::Error::InvalidInput), both
//!   untouched.
//! * **Typed errors that say what to do.** A server that cannot be reached,
//!   restarts or does not answer within the operation timeout gives
//!   [`Error::Unavailable`](mcp_persist_core::Error::Unavailable); the pool
//!   reconnects by itself once the server is back, without reopening the
//!   store. A refused password is
//!   [`Error::InvalidInput`](mcp_persist_core::Error::InvalidInput), a
//!   missing database [`Error::NotFound`](mcp_persist_core::Error::NotFound),
//!   missing rights an [`Error::Backend`](mcp_persist_core::Error::Backend)
//!   naming the `GRANT` needed, a dropped table
//!   [`Error::Corrupt`](mcp_persist_core::Error::Corrupt) naming the schema;
//!   none of them writes anything.
//! * **The password never prints**: not in errors, traces or `Debug`
//!   (servers are named by user, host, port, database and schema).
//! * **Values and records** up to 16 MiB; larger ones are refused with
//!   [`Error::TooLarge`](mcp_persist_core::Error::TooLarge) before anything
//!   is sent.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_persist_core::Error> {
//! use std::time::Duration;
//! use mcp_persist_core::{EventLogConfig, Key, KvStore, PutMode, PutOptions, Stores};
//! use mcp_persist_store_postgres::PostgresStore;
//!
//! let store = PostgresStore::builder("postgres://app:secret@db.internal:5432/app?schema=mcp")
//!     .operation_timeout(Duration::from_secs(2))
//!     .connect()
//!     .await?;
//!
//! // A raw key-value store with compare-and-swap...
//! let key = Key::new("greeting")?;
//! let v1 = store.put(&key, b"hello".to_vec(), PutOptions::new(PutMode::Create)).await?;
//! store.put(&key, b"hi".to_vec(), PutOptions::new(PutMode::Update(v1))).await?;
//!
//! // ...or the typed stores every instance on this database shares.
//! let stores = Stores::new(store.clone());
//! let events = stores.events(EventLogConfig::default())?;
//! events.append("stream-1", None, &serde_json::json!({"n": 1})).await?;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `rustls` | yes | TLS to the server through rustls (aws-lc-rs) when the URL says `sslmode=require`, trusting the platform's roots or a [`rustls::ClientConfig`] given to `PostgresStoreBuilder::tls_config`; without it `sslmode=require` is refused |
//!
//! Other `sslmode`s connect without TLS: a connection whose TLS is optional
//! protects nothing, so ask for `require`.
#![cfg_attr(
    not(feature = "rustls"),
    doc = "\n\n[`rustls::ClientConfig`]: https://docs.rs/rustls/latest/rustls/client/struct.ClientConfig.html"
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod listen;
mod opener;
mod schema;
mod store;
mod tls;
mod writer;

/// How long after its expiry a record or log may be deleted by
/// [`sweep_expired`](mcp_persist_core::Backend::sweep_expired): the kit's
/// margin.
pub use mcp_persist_core::kit::SWEEP_MARGIN;
pub use opener::PostgresOpener;
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
pub use rustls;
pub use schema::SCHEMA_VERSION;
pub use store::{DEFAULT_SCHEMA, PostgresStore, PostgresStoreBuilder, WriteStats};

// The README's example is compiled as a doctest too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
