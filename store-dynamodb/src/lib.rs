//! Amazon DynamoDB as an mcp-persist backend: sessions, event logs, tasks
//! and the fleet bus of MCP servers that run as one fresh instance per
//! request (AWS Lambda), with every record in one table.
//!
//! [`DynamoStore`] is both a [`KvStore`] and a [`LogStore`], so one table
//! holds everything the typed stores keep.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_persist_core::Error> {
//! use mcp_persist_core::{EventLogConfig, Stores};
//! use mcp_persist_store_dynamodb::DynamoStore;
//!
//! // Region, credentials and endpoint come from the standard AWS environment
//! // (AWS_REGION, AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, the Lambda role, ...).
//! let config = mcp_persist_store_dynamodb::aws_config::load_from_env().await;
//! let client = mcp_persist_store_dynamodb::aws_sdk_dynamodb::Client::new(&config);
//! // Once, at deployment (idempotent): never implied by opening a store.
//! DynamoStore::create_table(&client, "mcp-state").await?;
//! let store = DynamoStore::builder("mcp-state").client(client).build().await?;
//! let stores = Stores::new(store);
//! let events = stores.events(EventLogConfig::default())?;
//! # let _ = events; Ok(()) }
//! ```
//!
//! # One table
//!
//! The table has a string partition key `pk` and a number sort key `sk`, and
//! DynamoDB's TTL on the attribute `ttl`. [`DynamoStore::create_table`] makes
//! it (on-demand capacity) and is safe to call again and from many processes
//! at once; opening a store never creates anything. A table with another key
//! schema is [`Error::InvalidInput`] at [`DynamoStoreBuilder::build`]; a
//! missing one is [`Error::NotFound`] saying how to create it.
//!
//! * **A key-value record** is one item `pk = k<key>`, `sk = 0`: the value
//!   (`d`, binary), its version (`v`), its expiry (`x`, milliseconds) and
//!   DynamoDB's `ttl`. Every write is one `UpdateItem` whose condition is
//!   the precondition ([`PutMode`](mcp_persist_core::PutMode)) and the
//!   record's liveness, so compare-and-swap is DynamoDB's own.
//! * **Versions** never repeat for a key: a delete leaves a tombstone item
//!   (no value) that keeps the version for [`TOMBSTONE_KEEP`] before
//!   DynamoDB's TTL removes it, and the first version of a key that has no
//!   item is the wall clock in microseconds (milliseconds × 1000), above
//!   every version the key had before as long as clocks do not run back.
//! * **TTL**: the expiry is kept in milliseconds and every read compares it
//!   with [`kit::now`](mcp_persist_core::kit::now), so an expired record is
//!   never returned; DynamoDB's TTL attribute (the expiry plus
//!   [`SWEEP_MARGIN`], so a writer's clock a little behind AWS's never has
//!   a live record deleted) reclaims the space lazily, up to days later.
//! * **A log** is a head item `pk = l<log>`, `sk = 0` (last sequence number
//!   `s`, floor `f`, expiry, life) and one item per record with the sequence
//!   number as sort key. An append is one `TransactWriteItems`: the head's
//!   number moves from `s` to `s + n` on condition that it is still `s`, and
//!   the `n` records are put, all or nothing. So numbers are contiguous,
//!   never reused (trims and deletes move the floor; the head stays), and
//!   a record is visible exactly when its number is in `(f, s]`.
//! * **Group commit**: appends to one log from one store (and its clones)
//!   that arrive while a transaction is in flight are committed together in
//!   the next one, up to DynamoDB's limits (100 items, 4 MB per transaction,
//!   so 99 records with the head). A single append larger than that is
//!   committed in consecutive transactions, in order: a crash can then keep
//!   a prefix of it, and an append from another process may land between
//!   its parts.
//! * **Size**: one value or log record is at most [`MAX_VALUE_BYTES`]
//!   (DynamoDB's 400 KB per item, less room for the key and attributes).
//!   Larger ones are refused with [`Error::TooLarge`] and nothing is
//!   written: values are **not** chunked. Keep large payloads elsewhere.
//! * **Tails and the fleet bus poll**: [`LogStore::wait_after`] reads the log
//!   every [`DynamoStoreBuilder::poll_interval`] (default
//!   [`DEFAULT_POLL_INTERVAL`], 100 ms) until a record comes, so a tailing
//!   reader or another instance's bus sees an append after at most one
//!   interval plus a read's round trip (about 100 to 110 ms within a region),
//!   at two read requests per poll.
//! * **Log TTL**: a log's expiry lives on its head and every append with a
//!   TTL refreshes it (in the same transaction, so with no slack). Log
//!   records carry no TTL attribute: a log's records live as long as the
//!   log, and rewriting each record's attribute at every append would cost a
//!   write per record. Reads of an expired log are empty; its records are
//!   reclaimed by [`Backend::sweep_expired`](mcp_persist_core::Backend::sweep_expired),
//!   or overwritten when the log is written again.
//! * **Throttling** and transient errors are retried by the SDK with
//!   exponential backoff ([`DynamoStoreBuilder::retry`]); throttling that
//!   outlasts the retries is [`Error::Backend`] with a [`Throttled`]
//!   source saying what to do, and the call changed nothing.
//! * **Lost answers**: every write carries a random token; a conditional
//!   write that fails because its own earlier attempt landed (its answer was
//!   lost and the SDK retried) is recognised as a success, never reported as
//!   a `Conflict` and applied again.
//! * **Reads are strongly consistent** (`ConsistentRead`), so a record
//!   committed by one instance is read by the next, wherever it runs.
//! * **`list`** scans the table (it is meant for tools and sweeps); so does
//!   the sweep.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | (none) | | this crate has no features of its own: it is whole as it is |
//! | `dynamodb` of `mcp-persist` | no | this crate, as `mcp_persist::dynamodb`, and `dynamodb://` in `mcp_persist::backends()` |
//!
//! It uses the AWS SDK with rustls and the tokio runtime, without the SSO
//! and credential-process providers, the same build the Secrets Manager
//! backend uses.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aws_sdk_dynamodb::{Client, config::retry::RetryConfig};
use mcp_persist_core::{Error, Result};
#[allow(unused_imports)] // for the docs' links
use mcp_persist_core::{KvStore, LogStore};

mod error;
mod item;
mod kv;
mod log;
mod opener;
mod sweep;
mod table;

/// The AWS SDK configuration loader this crate was built with.
pub use aws_config;
/// The DynamoDB client this crate was built with, to build one explicitly.
pub use aws_sdk_dynamodb;
pub use error::{ServiceError, Throttled};
/// How long ago a record must have expired before the sweep removes it, and
/// the margin added to DynamoDB's TTL attribute: the kit's margin.
pub use mcp_persist_core::kit::SWEEP_MARGIN;
pub use opener::DynamoOpener;

/// The backend's name in errors and traces.
pub const BACKEND: &str = "dynamodb";

/// The largest value or log record one item holds: DynamoDB's 400 KB per
/// item, less 2 KiB for the key and the other attributes.
pub const MAX_VALUE_BYTES: usize = item::ITEM_LIMIT - item::ITEM_OVERHEAD;

/// How often a tailing reader reads the log while it waits (see
/// [`DynamoStoreBuilder::poll_interval`]).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long a deleted record's tombstone keeps its version before DynamoDB's
/// TTL may remove it.
pub const TOMBSTONE_KEEP: Duration = Duration::from_secs(24 * 60 * 60);

/// Requests this store (and its clones) sent to DynamoDB, by operation: what
/// a deployment pays for. SDK retries of one call count once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requests {
    /// `GetItem` calls.
    pub get_item: u64,
    /// `UpdateItem` and `DeleteItem` calls.
    pub update_item: u64,
    /// `TransactWriteItems` calls (one per group-committed append).
    pub transact_write_items: u64,
    /// `Query` pages.
    pub query: u64,
    /// `Scan` pages.
    pub scan: u64,
    /// `BatchWriteItem` calls.
    pub batch_write_item: u64,
    /// `DescribeTable` and the table setup calls.
    pub table: u64,
}

impl Requests {
    /// Every request, whatever its operation.
    pub fn total(&self) -> u64 {
        self.get_item
            + self.update_item
            + self.transact_write_items
            + self.query
            + self.scan
            + self.batch_write_item
            + self.table
    }

    /// The requests made between `earlier` and `self`.
    pub fn since(&self, earlier: &Requests) -> Requests {
        Requests {
            get_item: self.get_item - earlier.get_item,
            update_item: self.update_item - earlier.update_item,
            transact_write_items: self.transact_write_items - earlier.transact_write_items,
            query: self.query - earlier.query,
            scan: self.scan - earlier.scan,
            batch_write_item: self.batch_write_item - earlier.batch_write_item,
            table: self.table - earlier.table,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) get_item: AtomicU64,
    pub(crate) update_item: AtomicU64,
    pub(crate) transact_write_items: AtomicU64,
    pub(crate) query: AtomicU64,
    pub(crate) scan: AtomicU64,
    pub(crate) batch_write_item: AtomicU64,
    pub(crate) table: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Requests {
        Requests {
            get_item: self.get_item.load(Ordering::Relaxed),
            update_item: self.update_item.load(Ordering::Relaxed),
            transact_write_items: self.transact_write_items.load(Ordering::Relaxed),
            query: self.query.load(Ordering::Relaxed),
            scan: self.scan.load(Ordering::Relaxed),
            batch_write_item: self.batch_write_item.load(Ordering::Relaxed),
            table: self.table.load(Ordering::Relaxed),
        }
    }
}

/// What every part of the store shares.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) table: String,
    pub(crate) region: String,
    pub(crate) poll: Duration,
    pub(crate) sweep_margin: Duration,
    pub(crate) max_value: usize,
    pub(crate) counters: Counters,
    pub(crate) queues: Mutex<HashMap<String, log::Queue>>,
    pub(crate) heads: Mutex<HashMap<String, log::Head>>,
}

impl Inner {
    /// The store error for a failed call of `operation`.
    pub(crate) fn sdk_error<E, R>(
        &self,
        operation: &'static str,
        err: aws_sdk_dynamodb::error::SdkError<E, R>,
    ) -> Error
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        error::from_sdk(operation, &self.table, &self.region, err)
    }
}

/// A [`KvStore`] and
/// [`LogStore`] in one DynamoDB table. Clones
/// share one client, one group commit and one set of counters.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for DynamoStore {
    // The client is left out: its configuration holds the credentials
    // provider.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.inner.table)
            .field("region", &self.inner.region)
            .field("poll_interval", &self.inner.poll)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// A builder for a store in table `table`.
    pub fn builder(table: impl Into<String>) -> DynamoStoreBuilder {
        DynamoStoreBuilder {
            table: table.into(),
            client: None,
            retry: None,
            poll: DEFAULT_POLL_INTERVAL,
            sweep_margin: SWEEP_MARGIN,
            max_value: MAX_VALUE_BYTES,
        }
    }

    /// A store in `table`, configured from the standard AWS environment.
    pub async fn from_env(table: impl Into<String>) -> Result<Self> {
        Self::builder(table).build().await
    }

    /// Creates the table this backend needs, named `table`, with on-demand
    /// capacity, and turns on DynamoDB's TTL on its `ttl` attribute; waits
    /// until it is active. Idempotent: a table that already exists with the
    /// right key schema is left as it is (its TTL turned on if it was off),
    /// also when many processes call this at once. A table with another key
    /// schema is [`Error::InvalidInput`].
    ///
    /// Call it once at deployment (or open a store URL with `create=1`):
    /// opening a store never creates a table.
    pub async fn create_table(client: &Client, table: &str) -> Result<()> {
        table::create(client, table, None).await
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The region of the client in use.
    pub fn region(&self) -> &str {
        &self.inner.region
    }

    /// The DynamoDB client in use.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The requests sent so far by this store and its clones.
    pub fn requests(&self) -> Requests {
        self.inner.counters.snapshot()
    }
}

/// Configures a [`DynamoStore`].
#[derive(Debug)]
pub struct DynamoStoreBuilder {
    table: String,
    client: Option<Client>,
    retry: Option<RetryConfig>,
    poll: Duration,
    sweep_margin: Duration,
    max_value: usize,
}

impl DynamoStoreBuilder {
    /// Uses this client instead of one configured from the environment.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Tries each call up to `max_attempts` times in all, with exponential
    /// backoff from `initial_backoff`, on throttling and transient errors.
    /// Without it, the client's own retry configuration stays (the SDK's
    /// standard: 3 attempts).
    pub fn retry(mut self, max_attempts: u32, initial_backoff: Duration) -> Self {
        self.retry = Some(
            RetryConfig::standard()
                .with_max_attempts(max_attempts.max(1))
                .with_initial_backoff(initial_backoff),
        );
        self
    }

    /// How often [`LogStore::wait_after`]
    /// reads the log while it waits (default [`DEFAULT_POLL_INTERVAL`]): the
    /// latency of tails and of the fleet bus between instances, against two
    /// read requests per poll.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// How long ago a record must have expired before the sweep removes it
    /// (default [`SWEEP_MARGIN`]).
    pub fn sweep_margin(mut self, margin: Duration) -> Self {
        self.sweep_margin = margin;
        self
    }

    /// Refuses values and log records over `limit` bytes (default and
    /// ceiling: [`MAX_VALUE_BYTES`]). A stand-in for DynamoDB that counts
    /// binary attributes by their base64 text, as moto does, holds only
    /// about three quarters of the real limit: 300 000 bytes fit there.
    pub fn max_value_bytes(mut self, limit: usize) -> Self {
        self.max_value = limit.min(MAX_VALUE_BYTES);
        self
    }

    /// Builds the store after checking, with one `DescribeTable`, that the
    /// table exists and has this backend's key schema; it writes nothing.
    /// Without an explicit client, loads the standard AWS configuration; a
    /// missing region is [`Error::InvalidInput`]. A missing table is
    /// [`Error::NotFound`], a table with another key schema
    /// [`Error::InvalidInput`], each saying what to do.
    pub async fn build(self) -> Result<DynamoStore> {
        table::check_name(&self.table)?;
        let client = match self.client {
            Some(client) => client,
            None => {
                let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                if config.region().is_none() {
                    return Err(Error::invalid(
                        "AWS configuration",
                        "no region: set AWS_REGION (or a profile's region), or pass a client",
                    ));
                }
                Client::new(&config)
            }
        };
        let client = match self.retry {
            Some(retry) => {
                Client::from_conf(client.config().to_builder().retry_config(retry).build())
            }
            None => client,
        };
        let region = client
            .config()
            .region()
            .map(|r| r.as_ref().to_owned())
            .ok_or_else(|| {
                Error::invalid(
                    "AWS configuration",
                    "the client has no region: set AWS_REGION (or a profile's region)",
                )
            })?;
        let inner = Inner {
            client,
            table: self.table,
            region,
            poll: self.poll,
            sweep_margin: self.sweep_margin,
            max_value: self.max_value,
            counters: Counters::default(),
            queues: Mutex::default(),
            heads: Mutex::default(),
        };
        table::verify(&inner).await?;
        tracing::debug!(
            table = %inner.table,
            region = %inner.region,
            backend = BACKEND,
            "DynamoDB store ready"
        );
        Ok(DynamoStore {
            inner: Arc::new(inner),
        })
    }
}

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
