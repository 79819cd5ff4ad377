//! [`PostgresStore`]: both backend traits on a Postgres database.

mod kv;
mod log;

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use mcp_persist_core::{
    Backend, Error, Key, Result,
    backend::DEFAULT_MAX_VALUE_BYTES,
    kit::{self, check_value},
    registry::OpenMode,
};
use tokio::sync::oneshot;
use tokio_postgres::{Config, config::Host};

use crate::{
    error::{self, NAME, Target},
    listen::Listener,
    schema::{self, Names},
    tls::{self, Tls},
    writer::{Committer, Counters, Job, Writer},
};

/// The schema a store uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "mcp_persist";

/// The longest TTL honoured: a hundred years. Longer ones are kept this
/// long (Postgres timestamps end in the year 294276).
const MAX_TTL_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Counters of the group commit, from [`PostgresStore::write_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WriteStats {
    /// Transactions of appends committed.
    pub transactions: u64,
    /// Appends committed in them; `appends / transactions` is the average
    /// group size.
    pub appends: u64,
    /// Appends waiting for the writer when it last took a batch.
    pub queued: usize,
}

/// A [`KvStore`](mcp_persist_core::KvStore) and [`LogStore`](mcp_persist_core::LogStore) in one schema of a Postgres database
/// (Postgres 11 or newer).
///
/// Open one with [`PostgresStore::connect`] or [`PostgresStore::builder`].
/// Clones share one connection pool, one group-commit writer and one
/// listening connection.
///
/// See the [crate docs](crate) for what it guarantees.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    names: Names,
    target: Target,
    sql: Sql,
    timeout: Duration,
    poll_interval: Duration,
    appends: Arc<Committer>,
    counters: Arc<Counters>,
    listener: Arc<Listener>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.stop();
        self.pool.close();
    }
}

/// The statements of one schema, built once.
struct Sql {
    get: String,
    put: String,
    /// A put that commits without waiting for the WAL flush
    /// ([`PutOptions::unsynced`](mcp_persist_core::PutOptions::unsynced)):
    /// the statement is its own transaction, so the local setting holds
    /// for its commit alone.
    put_unsynced: String,
    delete: String,
    delete_if: String,
    list: String,
    read: String,
    /// The last number a log issued, from its header (expired or not).
    next_seq: String,
    trim: String,
    delete_log: String,
    sweep: String,
}

impl Sql {
    fn new(names: &Names) -> Sql {
        const LIVE: &str = "(expires_at IS NULL OR expires_at > clock_timestamp())";
        Sql {
            get: names.sql(&format!(
                "SELECT CASE WHEN octet_length(value) <= $2 THEN value END, octet_length(value), \
                 version FROM {{s}}.kv WHERE key = $1 AND {LIVE}"
            )),
            put: names.sql("SELECT {s}.kv_put($1, $2, $3, $4, $5)"),
            put_unsynced: names.sql(
                "SELECT {s}.kv_put($1, $2, $3, $4, $5), \
                 set_config('synchronous_commit', 'off', true)",
            ),
            delete: names.sql(&format!(
                "DELETE FROM {{s}}.kv WHERE key = $1 RETURNING {LIVE}"
            )),
            delete_if: names.sql(&format!(
                "DELETE FROM {{s}}.kv WHERE key = $1 AND version = $2 AND {LIVE}"
            )),
            list: names.sql(&format!(
                "SELECT key FROM {{s}}.kv WHERE key >= $1 AND starts_with(key, $1) AND {LIVE} \
                 ORDER BY key"
            )),
            read: names.sql(
                "SELECT r.seq, CASE WHEN octet_length(r.data) <= $4 THEN r.data END, \
                 octet_length(r.data) \
                 FROM {s}.logs l JOIN {s}.log_records r ON r.log_id = l.id \
                 WHERE l.name = $1 AND (l.expires_at IS NULL OR l.expires_at > clock_timestamp()) \
                 AND r.seq > $2 ORDER BY r.seq LIMIT $3",
            ),
            next_seq: names.sql("SELECT head FROM {s}.logs WHERE name = $1"),
            trim: names.sql(&format!(
                "DELETE FROM {{s}}.log_records WHERE log_id = \
                 (SELECT id FROM {{s}}.logs WHERE name = $1 AND {LIVE}) AND seq < $2"
            )),
            delete_log: names.sql("SELECT {s}.delete_log($1)"),
            sweep: names.sql("SELECT {s}.sweep($1)"),
        }
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `Target` holds no password.
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.target)
            .field("operation_timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`PostgresStore`] before it connects.
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct PostgresStoreBuilder {
    config: Result<Config>,
    schema: Option<String>,
    pool_size: usize,
    connect_timeout: Duration,
    operation_timeout: Duration,
    poll_interval: Duration,
    sweep_interval: Option<Duration>,
    mode: OpenMode,
    #[cfg(feature = "rustls")]
    tls: Option<rustls::ClientConfig>,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tokio-postgres's Config hides the password in its Debug.
        f.debug_struct("PostgresStoreBuilder")
            .field("config", &self.config.as_ref().ok())
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("poll_interval", &self.poll_interval)
            .field("sweep_interval", &self.sweep_interval)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// A URL as shown in messages: rebuilt from its parsed parts with the
/// password masked, or not at all when it does not parse as a URL with a
/// host (a password could then sit anywhere in it).
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.has_host() => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("****"));
            }
            format!("`{parsed}`")
        }
        _ => "the URL (not shown: it is malformed, and may hold a password)".to_owned(),
    }
}

/// Splits `?schema=` off a URL, leaving what tokio-postgres understands.
fn parse_url(url: &str) -> Result<(Config, Option<String>)> {
    let shown = shown(url);
    let usage = |why: String| Error::invalid("Postgres URL", format!("{shown}: {why}"));
    let mut parsed = url::Url::parse(url).map_err(|e| usage(format!("not a valid URL ({e})")))?;
    if !parsed.has_host() {
        return Err(usage(
            "it names no host; write postgres://USER:PASSWORD@HOST:PORT/DATABASE".into(),
        ));
    }
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(usage(
            "write postgres://USER:PASSWORD@HOST:PORT/DATABASE".into(),
        ));
    }
    let mut schema = None;
    let mut rest = Vec::new();
    for (name, value) in parsed.query_pairs() {
        if name == "schema" {
            schema = Some(value.into_owned());
        } else {
            rest.push((name.into_owned(), value.into_owned()));
        }
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    let config = Config::from_str(parsed.as_str()).map_err(|e| usage(e.to_string()))?;
    Ok((config, schema))
}

/// A configuration without a user is refused: there is no default login.
fn check_user(config: &Config) -> Result<()> {
    match config.get_user() {
        Some(_) => Ok(()),
        None => Err(Error::invalid(
            "Postgres URL",
            "it names no user: write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
        )),
    }
}

/// Checks a URL as [`PostgresStoreBuilder::connect`] does before it
/// connects: its form, options, user and schema name.
pub(crate) fn check_url(url: &str) -> Result<()> {
    let (config, schema) = parse_url(url)?;
    schema::check_name(schema.as_deref().unwrap_or(DEFAULT_SCHEMA))?;
    check_user(&config)
}

impl PostgresStore {
    /// A builder for the database a URL names:
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`, with `?schema=NAME`
    /// for the schema the store lives in (default [`DEFAULT_SCHEMA`]) and
    /// any option tokio-postgres knows (`sslmode=require` for TLS,
    /// `application_name`, `connect_timeout`, ...). A malformed URL is
    /// reported by [`connect`](PostgresStoreBuilder::connect).
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        match parse_url(url) {
            Ok((config, schema)) => {
                let builder = PostgresStoreBuilder::new(Ok(config));
                match schema {
                    Some(schema) => builder.schema(schema),
                    None => builder,
                }
            }
            Err(e) => PostgresStoreBuilder::new(Err(e)),
        }
    }

    /// A builder for a tokio-postgres configuration made by the application.
    pub fn from_config(config: Config) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Ok(config))
    }

    /// Connects to the database a URL names with default settings (see
    /// [`builder`](Self::builder)), creating or migrating the schema.
    pub async fn connect(url: &str) -> Result<PostgresStore> {
        Self::builder(url).connect().await
    }

    /// The schema the store lives in.
    pub fn schema(&self) -> &str {
        &self.inner.names.plain
    }

    /// What the group commit has done so far.
    pub fn write_stats(&self) -> WriteStats {
        let c = &self.inner.counters;
        WriteStats {
            transactions: c.transactions.load(Ordering::Relaxed),
            appends: c.operations.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection that listens for appends is up (it is opened
    /// by the first `wait_after`).
    pub fn is_listening(&self) -> bool {
        self.inner.listener.is_connected()
    }

    /// Runs `fut` within the operation timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.inner.timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(error::no_reply(
                operation,
                self.inner.timeout,
                &self.inner.target,
            )),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|e| error::map_pool(e, &self.inner.target, self.inner.timeout))
    }

    /// Runs one statement and returns its rows.
    async fn query(
        &self,
        operation: &'static str,
        key: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let target = &self.inner.target;
        self.bounded(operation, async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(sql)
                .await
                .map_err(|e| error::map(e, target, key))?;
            client
                .query(&stmt, params)
                .await
                .map_err(|e| error::map(e, target, key))
        })
        .await
    }

    async fn append_with(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
        synced: bool,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, DEFAULT_MAX_VALUE_BYTES)?;
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            log: log.to_string(),
            records,
            ttl_ms: ttl.map(ttl_ms),
            synced,
            reply,
        };
        // Each commit is bounded by the operation timeout; this limit also
        // covers the wait in the queue.
        let limit = self.inner.timeout * 2;
        let work = async {
            self.inner.appends.submit(job).await;
            answer.await
        };
        match tokio::time::timeout(limit, work).await {
            Ok(Ok(result)) => result,
            // The task committing this append's group was cancelled while
            // the statement ran.
            Ok(Err(_)) => Err(Error::Unavailable {
                backend: NAME,
                source: Box::new(error::Explained(format!(
                    "the commit of this append on {} was abandoned midway (the task running \
                     it was cancelled); it may or may not have been applied",
                    self.inner.target
                ))),
            }),
            Err(_) => Err(error::no_reply("an append", limit, &self.inner.target)),
        }
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(kit::ttl_millis(ttl).min(MAX_TTL_MS)).unwrap_or(i64::MAX)
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn limit_param() -> i32 {
    i32::try_from(DEFAULT_MAX_VALUE_BYTES).unwrap_or(i32::MAX)
}

/// A stored value over the size limit: this store never writes one.
fn planted(key: &str, len: i32) -> Error {
    tracing::warn!(
        key,
        len,
        "postgres row holds a value over the size limit; not returned"
    );
    error::bad_row(
        key,
        format!(
            "a value of {len} bytes, over the limit of {DEFAULT_MAX_VALUE_BYTES} bytes that \
             this store writes: it was written outside this store; delete or overwrite it"
        ),
    )
}

impl PostgresStoreBuilder {
    fn new(config: Result<Config>) -> Self {
        PostgresStoreBuilder {
            config,
            schema: None,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(500),
            sweep_interval: Some(Duration::from_secs(600)),
            mode: OpenMode::Create,
            #[cfg(feature = "rustls")]
            tls: None,
        }
    }

    /// The schema the store lives in (default [`DEFAULT_SCHEMA`]); stores
    /// in different schemas share a database without seeing each other.
    /// 1 to 48 lowercase ASCII letters, digits and `_`, starting with a
    /// letter.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// How many connections the pool keeps at most (default 16). The
    /// listening connection is one more.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long one attempt to connect may take (default 5 s), unless the
    /// URL sets `connect_timeout`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an operation may wait for the server before it fails with
    /// [`Error::Unavailable`] (default 5 s). `wait_after` may wait for its
    /// own timeout on top of this.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How often a waiting reader looks again without being notified
    /// (default 500 ms): what a lost notification can delay it by.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// How often the store deletes, in the background, the records and
    /// logs that expired more than [`SWEEP_MARGIN`](kit::SWEEP_MARGIN) ago
    /// (default every 10 minutes; `None` leaves it to explicit
    /// [`sweep_expired`](Backend::sweep_expired) calls). Expired state is
    /// never returned either way: this only reclaims its space.
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every.map(|e| e.max(Duration::from_secs(1)));
        self
    }

    /// Whether connecting may create the schema ([`OpenMode::Create`], the
    /// default) or must find a store there and write nothing while opening
    /// ([`OpenMode::Existing`]: anything else is [`Error::NotFound`]).
    pub fn open_mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// The rustls configuration of `sslmode=require` connections (default:
    /// the platform's trusted roots, through aws-lc-rs), e.g. to trust a
    /// private CA.
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    pub fn tls_config(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Connects, and creates or migrates the schema. Fails with
    /// [`Error::InvalidInput`] for a malformed URL or schema name or a login
    /// the server refuses, [`Error::Unavailable`] when the server cannot be
    /// reached, [`Error::NewerSchema`] for a store of a newer version of
    /// this crate (left untouched) and [`Error::NotFound`] under
    /// [`OpenMode::Existing`] when there is no store.
    pub async fn connect(self) -> Result<PostgresStore> {
        let mut config = self.config?;
        let schema = self.schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
        schema::check_name(&schema)?;
        check_user(&config)?;
        if config.get_hosts().is_empty() {
            config.host("localhost");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("mcp-persist");
        }
        let names = Names::new(&schema);
        let target = target_of(&config, &schema);
        #[cfg(feature = "rustls")]
        let tls = tls::connector(config.get_ssl_mode(), self.tls.as_ref())?;
        #[cfg(not(feature = "rustls"))]
        let tls = tls::connector(config.get_ssl_mode())?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::None => {
                Manager::from_config(config.clone(), tokio_postgres::NoTls, manager_config)
            }
            #[cfg(feature = "rustls")]
            Tls::Rustls(t) => Manager::from_config(config.clone(), t.clone(), manager_config),
        };
        let timeout = self.operation_timeout;
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(self.connect_timeout.max(timeout)))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| Error::invalid("Postgres pool", e.to_string()))?;
        {
            let mut client = pool
                .get()
                .await
                .map_err(|e| error::map_pool(e, &target, timeout))?;
            let client: &mut tokio_postgres::Client = &mut client;
            schema::prepare(client, &names, &target, self.mode).await?;
        }
        tracing::info!(%target, "connected to postgres");
        let counters = Arc::new(Counters::default());
        let appends = Committer::new(Writer {
            pool: pool.clone(),
            target: target.clone(),
            sql: names.sql("SELECT {s}.append($1, $2, $3, $4, $5)"),
            timeout,
            counters: Arc::clone(&counters),
        });
        let listener = Listener::new(config, tls, names.channel.clone());
        let store = PostgresStore {
            inner: Arc::new(Inner {
                sql: Sql::new(&names),
                pool,
                names,
                target,
                timeout,
                poll_interval: self.poll_interval,
                appends,
                counters,
                listener,
            }),
        };
        // A reader deletes nothing, expired or not.
        if let Some(every) = self.sweep_interval
            && self.mode != OpenMode::ReadOnly
        {
            spawn_sweeper(Arc::downgrade(&store.inner), every);
        }
        Ok(store)
    }
}

/// Sweeps every `every` while the store lives.
fn spawn_sweeper(inner: std::sync::Weak<Inner>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let store = PostgresStore { inner };
            match store.sweep_expired().await {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(removed, "postgres sweep removed expired state"),
                Err(e) => tracing::debug!(error = %e, "postgres sweep failed; next time"),
            }
        }
    });
}

fn target_of(config: &Config, schema: &str) -> Target {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{}", path.display()),
            }
        })
        .collect();
    Target {
        user: config.get_user().unwrap_or_default().to_owned(),
        hosts: hosts.join(","),
        dbname: config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or_default()
            .to_owned(),
        schema: schema.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_never_hold_the_password() {
        let text = shown("postgres://app:s3cret@db:5432/app?schema=x");
        assert!(text.contains("app:****@db:5432"), "{text}");
        assert!(!text.contains("s3cret"));
        for malformed in [
            "postgres:/app:s3cret@db/app",
            "app:s3cret@db",
            "postgres://app:s3cret@",
        ] {
            assert!(!shown(malformed).contains("s3cret"), "{malformed}");
        }
    }

    #[test]
    fn the_schema_option_is_split_off() {
        let (config, schema) =
            parse_url("postgresql://app:pw@db:6543/data?schema=app1&sslmode=disable")
                .expect("parses");
        assert_eq!(schema.as_deref(), Some("app1"));
        assert_eq!(config.get_dbname(), Some("data"));
        assert_eq!(config.get_ports(), &[6543]);
        assert!(!format!("{config:?}").contains("pw\""));
        let err = parse_url("postgres://app:pw@db/data?bogus=1").expect_err("unknown option");
        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
        assert!(!err.to_string().contains(":pw@"), "{err}");
        assert!(parse_url("redis://db/0").is_err());
    }

    #[test]
    fn ttls_round_up_and_stay_in_range() {
        assert_eq!(ttl_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_ms(Duration::from_micros(1_500)), 2);
        assert_eq!(ttl_ms(Duration::MAX), MAX_TTL_MS as i64);
    }
}
