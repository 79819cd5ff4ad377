//! The Redis backend of mcp-persist: [`RedisStore`] implements
//! [`KvStore`](mcp_persist_core::KvStore) and
//! [`LogStore`](mcp_persist_core::LogStore) on one Redis server or on a
//! Redis Cluster, so that a fleet of MCP server instances behind a load
//! balancer shares sessions and SSE event logs, and a fleet of clients shares
//! credentials.
//!
//! * Compare-and-swap runs as a Lua script over a record that holds its value
//!   and version together; TTL rides with the write (`SET ... PX`).
//! * Logs are Redis Streams: an append adds its records and refreshes the
//!   log's expiry in one atomic step; `read_after` is an exclusive `XRANGE`;
//!   `wait_after` tails a log with `XREAD BLOCK` on a dedicated connection.
//! * Keys that an operation touches together share a Redis Cluster hash tag,
//!   so the same code runs on a standalone server and on a Cluster.
//! * A server that cannot be reached gives a typed
//!   [`Error::Unavailable`](mcp_persist_core::Error::Unavailable) within the
//!   operation timeout, never a panic, and the store reconnects by itself.
//!
//! See [`RedisStore`] for the key layout and every guarantee. Durability is
//! the server's: run Redis with `appendonly yes` and `appendfsync always` to
//! keep every acknowledged write through a crash of the server.
//!
//! Needs Redis 7.0 or newer (logs use stream ids with an automatic sequence
//! part).
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_persist_core::Error> {
//! use std::time::Duration;
//! use mcp_persist_core::{Key, EventLogConfig, KvStore, PutOptions, PutMode, Stores};
//! use mcp_persist_store_redis::RedisStore;
//!
//! let redis = RedisStore::standalone("redis://127.0.0.1:6379/")
//!     .key_prefix("my-mcp-server:")
//!     .operation_timeout(Duration::from_secs(2))
//!     .connect()
//!     .await?;
//!
//! // As a raw key-value store, with compare-and-swap...
//! let v1 = redis.put(&Key::new("greeting")?, b"hello".to_vec(), PutOptions::new(PutMode::Create)).await?;
//! redis.put(&Key::new("greeting")?, b"hello again".to_vec(), PutOptions::new(PutMode::Update(v1))).await?;
//!
//! // ...or behind the typed stores of mcp-persist-core: sessions and SSE
//! // event logs shared by every instance that connects to the same Redis.
//! let stores = Stores::new(redis.clone());
//! let events = stores.events(EventLogConfig::default())?;
//! let id = events.append("stream-1", None, &serde_json::json!({"n": 1})).await?;
//! # let _ = id;
//!
//! // A Redis Cluster runs the very same code.
//! let cluster = RedisStore::cluster(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
//!     .connect()
//!     .await?;
//! # let _ = cluster;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! This crate has no optional features.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod conn;
mod error;
mod keys;
mod opener;
mod scripts;
mod store;
mod wire;

pub use opener::RedisOpener;
pub use store::{RedisStore, RedisStoreBuilder, VERSION_MEMORY};

// The README's example is compiled as a doctest too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
