//! AWS Secrets Manager as an mcp-persist backend, for credentials.
//!
//! Companies keep OAuth tokens and client secrets in a secrets manager, not
//! on a laptop's disk or in a shared database: a fleet of clients shares one
//! credential through it, and every rotation is auditable.
//! [`SecretsManagerStore`] is a [`KvStore`] over Secrets Manager, and
//! **deliberately no [`LogStore`]**: Secrets
//! Manager cannot hold an event log. Route credentials here and everything
//! else to a backend that holds logs, in one call with
//! [`SecretsManagerStoreBuilder::build_split`].
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_persist_core::Error> {
//! use mcp_persist_core::{CredentialKey, MemoryStore};
//! use mcp_persist_store_vault::SecretsManagerStore;
//!
//! // Region, credentials and endpoint come from the standard AWS environment
//! // (AWS_REGION, AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, profiles, ...).
//! // Credentials go to Secrets Manager, under `my-agent/`; everything else
//! // to the other backend (an `mcp_persist_store_sqlite::SqliteStore` in
//! // production, memory here).
//! let stores = SecretsManagerStore::builder("my-agent/")
//!     .build_split(MemoryStore::new())
//!     .await?;
//! let key = CredentialKey::new("https://auth.example.com", "https://mcp.example.com/mcp")?;
//! if let Some(stored) = stores.credentials().load(&key).await? {
//!     println!("token expires at {:?}", stored.record.expires_at);
//! }
//! # Ok(()) }
//! ```
//!
//! # How records are kept
//!
//! * **One secret per key**, named `<prefix><escaped key>`: bytes outside
//!   the characters secret names allow are written `=XX` (hex), `=` itself
//!   included, so the mapping is reversible and collision-free. A key whose
//!   name would pass 512 characters is cut and followed by `=H` and its
//!   SHA-256; its full text is kept in the secret's description, and every
//!   read checks it. Prefixes of two stores must not be prefixes of one
//!   another, and none is empty (refused: every secret of the account
//!   would be the store's). Every secret under the prefix is taken for a
//!   record: one written by anything else reads as
//!   [`Error::Corrupt`] ("not written by mcp-persist"), so keep other
//!   secrets, such as the [sealing keyring](SecretsManagerKeys), outside it.
//! * **The value is the secret's binary value, whole**: up to 64 KiB
//!   ([`MAX_VALUE_BYTES`]); one byte more is [`Error::TooLarge`] and writes
//!   nothing. The record's version, expiry, a digest of key and value, and
//!   a link to the version it replaced live in the id of the secret version
//!   (the client request token, which Secrets Manager lets the writer
//!   choose). So writes are idempotent: a retried call carries the same
//!   token and is recognised; and a write whose answer was lost is known to
//!   have landed even after others wrote over it, so it is never reported
//!   as a `Conflict` and applied twice.
//! * **Compare-and-swap through staging labels**: a write adds a version
//!   under a pending label, then moves `AWSCURRENT` to it with
//!   `RemoveFromVersionId` set to the version it read. If another writer
//!   moved the label first, the move fails and the write is
//!   [`Error::Conflict`] (an `Update`) or reads again (an `Overwrite`).
//! * **Versions** are counters kept in the version stamps. A delete writes a
//!   tombstone version rather than deleting the secret, so counting goes on;
//!   and a new counter is never below the clock in microseconds, so versions
//!   keep increasing even after the sweep removed a secret for good (as
//!   long as clocks do not run backwards past that).
//! * **TTL** is kept in the version stamp and honoured on every read; an
//!   expired record is absent. [`Backend::sweep_expired`](mcp_persist_core::Backend::sweep_expired) removes the
//!   secrets of expired and deleted records from the service, with a
//!   recovery window or without one ([`Deletion`]).
//! * **Clocks.** Expiry is judged by this machine's wall clock against the
//!   absolute time in the stamp. A clock stepped forward makes records
//!   expire early for reads, and one stepped back keeps them longer; a
//!   sweep only removes records that expired at least [`SWEEP_MARGIN`] ago, so a
//!   brief forward step never deletes a live record for good.
//! * **Rate**: Secrets Manager allows about 50 write calls per second per
//!   account. Write calls are spaced by a rate limiter
//!   ([`SecretsManagerStoreBuilder::max_writes_per_second`]), and overwrites
//!   of one key that arrive while one is in flight are coalesced into a single
//!   write (each still gets its own version). Throttling answers are retried
//!   by the SDK with backoff, then surface as [`Error::Backend`] with a
//!   [`Throttled`] source.
//! * **Versions per secret**: Secrets Manager keeps about 100 versions of
//!   a secret and removes superseded ones only once they are a day old; a
//!   key written much more than 100 times a day fails with
//!   `LimitExceededException` (an [`Error::Backend`] with a [`ServiceError`]
//!   source). Credentials change a few times a day; keep fast-changing state
//!   (request numbering, sessions) in another backend, as
//!   [`build_split`](SecretsManagerStoreBuilder::build_split) does.
//! * **No secret text in errors or logs**: errors keep the service's code and
//!   message and the transport error, never a response body; traces name
//!   keys (public identifiers) and sizes, never values. A test captures every
//!   trace line, the AWS SDK's included, at every level, and finds no token.
//!
//! # Sealing keys
//!
//! [`SecretsManagerKeys`] reads the keyring that seals records at rest
//! ([`mcp_persist_core::seal`]) from one secret; writing a new version of it
//! rotates the keys for every process that reloads.
//!
//! # No logs
//!
//! ```compile_fail,E0277
//! // A store that holds no logs cannot be put where logs go.
//! # async fn f(vault: mcp_persist_store_vault::SecretsManagerStore) {
//! let stores = mcp_persist_core::Stores::new(vault);
//! # }
//! ```
//!
//! A bundle built with this store and no log store answers
//! [`Stores::events`](mcp_persist_core::Stores::events) with
//! [`Error::Unsupported`].
//!
//! # Features
//!
//! This crate has no cargo features. It uses the AWS SDK with rustls and
//! the tokio runtime, and without the SSO and credential-process providers.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{fmt, sync::Arc, time::Duration};

use aws_sdk_secretsmanager::{Client, config::retry::RetryConfig};
use mcp_persist_core::{Error, KvStore, LogStore, Result, Stores};

mod error;
mod gate;
mod keysource;
mod names;
mod opener;
mod stamp;
mod store;

/// The AWS SDK configuration loader this crate was built with.
pub use aws_config;
/// The Secrets Manager client this crate was built with, to build one explicitly.
pub use aws_sdk_secretsmanager;
pub use error::{ServiceError, Throttled};
pub use keysource::SecretsManagerKeys;
pub use opener::SecretsManagerOpener;

/// How long ago a record must have expired before
/// [`Backend::sweep_expired`](mcp_persist_core::Backend::sweep_expired)
/// removes its secret, unless
/// [`SecretsManagerStoreBuilder::sweep_margin`] says otherwise: the kit's
/// margin.
pub use mcp_persist_core::kit::SWEEP_MARGIN;

/// The backend's name in errors and traces.
pub const BACKEND: &str = "secrets-manager";

/// The largest value one secret holds: 64 KiB, the service's limit.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The default ceiling on write calls per second, under the service's
/// 50 per second per account.
pub const DEFAULT_WRITES_PER_SECOND: u32 = 40;

/// How the sweep removes the secrets of expired and deleted records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// Schedule the deletion, recoverable for this many days (7 to 30).
    /// A write that raced the sweep is restored.
    RecoveryWindowDays(u8),
    /// Delete at once, skipping the recovery window. A write landing in the
    /// instant between the sweep's last check and its delete is lost.
    Immediate,
}

impl Default for Deletion {
    /// The shortest recovery window, seven days.
    fn default() -> Self {
        Deletion::RecoveryWindowDays(7)
    }
}

/// A [`KvStore`] in AWS Secrets Manager. Clones share one client.
///
/// **It holds no logs** ([`SecretsManagerStore::HOLDS_LOGS`]): it implements
/// no [`LogStore`], and says so in a trace when it is built.
#[derive(Clone)]
pub struct SecretsManagerStore {
    inner: Arc<store::Inner>,
}

impl fmt::Debug for SecretsManagerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsManagerStore")
            .field("prefix", &self.inner.names.prefix())
            .field("deletion", &self.inner.deletion)
            .finish_non_exhaustive()
    }
}

impl SecretsManagerStore {
    /// Whether this backend holds event logs: it does not. Route logs to
    /// another backend ([`SecretsManagerStoreBuilder::build_split`]).
    pub const HOLDS_LOGS: bool = false;

    /// A builder for a store whose secret names start with `prefix`
    /// (characters `A-Z a-z 0-9 / _ + = . @ -`, at most 256). An empty
    /// prefix is refused by [`build`](SecretsManagerStoreBuilder::build) as
    /// [`Error::InvalidInput`]: it would make every secret of the account
    /// and region this store's.
    pub fn builder(prefix: impl Into<String>) -> SecretsManagerStoreBuilder {
        SecretsManagerStoreBuilder {
            prefix: prefix.into(),
            client: None,
            retry: None,
            deletion: Deletion::default(),
            writes_per_second: Some(DEFAULT_WRITES_PER_SECOND),
            sweep_margin: SWEEP_MARGIN,
        }
    }

    /// A store configured from the standard AWS environment, with defaults.
    pub async fn from_env(prefix: impl Into<String>) -> Result<Self> {
        Self::builder(prefix).build().await
    }

    /// Whether this store holds event logs: never ([`Self::HOLDS_LOGS`]).
    pub fn holds_logs(&self) -> bool {
        Self::HOLDS_LOGS
    }

    /// The prefix of this store's secret names.
    pub fn prefix(&self) -> &str {
        self.inner.names.prefix()
    }

    /// The Secrets Manager client in use.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// A bundle with credentials here and everything else in `rest`.
    pub fn split<B: KvStore + LogStore>(self, rest: B) -> Stores {
        Stores::new(rest).with_credentials(Arc::new(self))
    }
}

/// Configures a [`SecretsManagerStore`].
#[derive(Debug)]
pub struct SecretsManagerStoreBuilder {
    prefix: String,
    client: Option<Client>,
    retry: Option<RetryConfig>,
    deletion: Deletion,
    writes_per_second: Option<u32>,
    sweep_margin: Duration,
}

impl SecretsManagerStoreBuilder {
    /// Uses this client instead of one configured from the environment.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Retries each call up to `max_attempts` times in all, with exponential
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

    /// How the sweep removes secrets (default: a 7-day recovery window).
    pub fn deletion(mut self, deletion: Deletion) -> Self {
        self.deletion = deletion;
        self
    }

    /// How long ago a record must have expired before the sweep removes its
    /// secret (default [`SWEEP_MARGIN`]): a record expired more recently,
    /// perhaps only because the wall clock stepped forward, is kept.
    pub fn sweep_margin(mut self, margin: Duration) -> Self {
        self.sweep_margin = margin;
        self
    }

    /// At most this many write calls start per second, from this store and
    /// its clones ([`DEFAULT_WRITES_PER_SECOND`] unless set); `None` removes
    /// the limit. Each record write is two calls (a new version, then the
    /// label move). Processes sharing an account share the service's limit:
    /// divide it between them.
    pub fn max_writes_per_second(mut self, limit: Option<u32>) -> Self {
        self.writes_per_second = limit;
        self
    }

    /// Builds the store. Without an explicit client, loads the standard AWS
    /// configuration; a missing region is [`Error::InvalidInput`].
    pub async fn build(self) -> Result<SecretsManagerStore> {
        let names = names::Names::new(self.prefix)?;
        if let Deletion::RecoveryWindowDays(days) = self.deletion
            && !(7..=30).contains(&days)
        {
            return Err(Error::invalid(
                "recovery window",
                format!("{days} days; Secrets Manager allows 7 to 30"),
            ));
        }
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
        tracing::info!(
            prefix = names.prefix(),
            backend = BACKEND,
            "Secrets Manager store ready; it holds no logs: route event logs to another backend"
        );
        Ok(SecretsManagerStore {
            inner: Arc::new(store::Inner {
                client,
                names,
                deletion: self.deletion,
                sweep_margin_ms: u64::try_from(self.sweep_margin.as_millis()).unwrap_or(u64::MAX),
                limiter: gate::RateLimiter::new(self.writes_per_second),
                coalescer: gate::Coalescer::default(),
            }),
        })
    }

    /// Builds the store and a [`Stores`] bundle with credentials in it and
    /// everything else (client state, server sessions, event logs) in
    /// `rest`, a backend that holds logs, such as SQLite.
    pub async fn build_split<B: KvStore + LogStore>(self, rest: B) -> Result<Stores> {
        Ok(self.build().await?.split(rest))
    }
}

/// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
