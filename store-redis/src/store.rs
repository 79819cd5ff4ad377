//! [`RedisStore`]: both backend traits over Redis or Redis Cluster.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, LogRecord, LogStore, PutMode, PutOptions, Result,
    Version, backend::DEFAULT_MAX_VALUE_BYTES, kit::check_value,
};
use redis::Value;
use tracing::{Instrument, debug, debug_span, info};

use crate::{
    batch::{AppendJob, Appender},
    conn::{Conn, Target, Timeouts, scan_all},
    error::{self, BACKEND},
    keys::{DEFAULT_PREFIX, KeyLayout},
    scripts::{self, DELETE, PUT},
    wire::{
        bytes_of, millis, parse_entries, parse_id, parse_record, parse_u64, status_of, unexpected,
    },
};

/// How long the version of a deleted or expired key is remembered exactly
/// (see the guarantees of [`RedisStore`]).
pub const VERSION_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

/// Records read per `XRANGE` round trip.
const READ_PAGE: usize = 256;

/// Idle dedicated connections kept for `wait_after`.
const IDLE_BLOCKING: usize = 8;

/// A [`KvStore`] and [`LogStore`] on Redis 7.0 or newer, standalone or a
/// Redis Cluster.
///
/// Open one with [`RedisStore::standalone`] or [`RedisStore::cluster`]. A
/// store is cheap to clone; clones share one connection, on which concurrent
/// operations are pipelined.
///
/// # What is stored where
///
/// Every Redis key starts with the configured prefix (default
/// `mcp-persist:`), then a Redis Cluster hash tag made of the kind and the
/// store key: `<prefix>{kv:<key>}` holds a record, `<prefix>{kv:<key>}:ver`
/// the last version handed out for it, `<prefix>{log:<name>}` a log. Each
/// operation touches the keys of one hash tag only, so it runs unchanged on a
/// Cluster.
///
/// # Guarantees
///
/// * **Compare-and-swap** runs as one Lua script: the record's value and
///   version are stored together in one string, so a `put` or `delete` with
///   a precondition is linearizable per key. A failed precondition is
///   [`Error::Conflict`] (or [`Error::AlreadyExists`] for `Create`).
/// * **Versions** are the server clock in microseconds, or one more than the
///   key's last version when the clock is behind it. The last version of a
///   deleted or expired key is remembered for [`VERSION_MEMORY`]; past that,
///   the clock keeps new versions above old ones (as long as the server's
///   clock does not step back by more than that).
/// * **TTL** rides with the write (`SET ... PX`); Redis never returns an
///   expired key and reclaims its space itself, so `sweep_expired` has
///   nothing to do.
/// * **Logs** are Redis Streams with ids `0-<seq>`. An append of one record
///   without a TTL is one `XADD`, atomic by itself. An append with a TTL
///   adds its records (`XADD`) and sets the log's expiry (`PEXPIRE`) in one
///   atomic Lua script; appends from concurrent tasks that need the script
///   are group-committed, many to a script call, each still atomic on its
///   own. The expiry set is the TTL plus a sixteenth, so that for the next
///   sixteenth of the TTL this store's single-record appends with the same
///   TTL are a plain `XADD ... NOMKSTREAM` and skip the refresh: a log lives
///   at least its TTL past every append, and at most a sixteenth longer.
///   `NOMKSTREAM` adds nothing to a log that has gone meanwhile (deleted by
///   another process), and that append is then sent as the script, so a log
///   is never created without its expiry.
///   `wait_after` blocks in `XREAD BLOCK` on a dedicated connection, never on
///   the shared one.
/// * **Durability** is Redis's: with `appendonly yes` and
///   `appendfsync always`, an acknowledged write survives a `kill -9` of the
///   server.
/// * **Errors**: a server that cannot be reached, has gone away or does not
///   answer within the operation timeout gives [`Error::Unavailable`] within
///   that time; the same store works again once the server is back (the
///   connection is re-established in the background). An answer that is not
///   in the store's format (a key written by something else) is
///   [`Error::Corrupt`] naming the key.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Conn,
    target: Target,
    layout: KeyLayout,
    timeouts: Timeouts,
    cluster: bool,
    idle_blocking: Mutex<Vec<Conn>>,
    appender: Appender,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URLs may carry a password: never print them.
        f.debug_struct("RedisStore")
            .field("cluster", &self.inner.cluster)
            .field("key_prefix", &self.inner.layout.prefix())
            .field("operation_timeout", &self.inner.timeouts.operation)
            .finish_non_exhaustive()
    }
}

enum Endpoint {
    Standalone(String),
    Cluster(Vec<String>),
}

/// Settings of a [`RedisStore`] before it connects.
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedisStoreBuilder {
    endpoint: Endpoint,
    prefix: String,
    timeouts: Timeouts,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("cluster", &matches!(self.endpoint, Endpoint::Cluster(_)))
            .field("key_prefix", &self.prefix)
            .field("connect_timeout", &self.timeouts.connect)
            .field("operation_timeout", &self.timeouts.operation)
            .finish()
    }
}

impl RedisStore {
    /// A store on one Redis server, e.g. `redis://127.0.0.1:6379/`
    /// (`rediss://` for TLS is not built in; `redis://user:password@host/db`
    /// carries credentials).
    pub fn standalone(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Endpoint::Standalone(url.into()))
    }

    /// A store on a Redis Cluster, reached through any of these seed nodes;
    /// the rest of the cluster is discovered from them.
    pub fn cluster<I, S>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::new(Endpoint::Cluster(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// The prefix of every Redis key this store writes.
    pub fn key_prefix(&self) -> &str {
        self.inner.layout.prefix()
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// Whether this store uses the default key prefix (no
    /// [`key_prefix`](RedisStoreBuilder::key_prefix) was given).
    pub fn has_default_prefix(&self) -> bool {
        self.key_prefix() == DEFAULT_PREFIX
    }

    /// The key prefixes under which the server holds records of any
    /// mcp-persist store (this one's included), found by scanning at most
    /// `budget` keys and stopping after five: what a tool shows an operator
    /// whose store looks empty because they named no prefix. `None` on a
    /// cluster (each node would need scanning) or when the scan fails.
    pub async fn prefixes_in_use(&self, budget: usize) -> Option<Vec<String>> {
        if self.inner.cluster {
            return None;
        }
        let mut conn = self.conn();
        let mut found = std::collections::BTreeSet::new();
        let (mut cursor, mut seen) = (0u64, 0usize);
        loop {
            // A record's key is `<prefix>{kv:<key>}`.
            let (next, keys) = crate::conn::scan_step(&mut conn, cursor, b"*{kv:*")
                .await
                .ok()?;
            for key in &keys {
                if let Some(at) = key.windows(4).position(|w| w == b"{kv:") {
                    found.insert(String::from_utf8_lossy(&key[..at]).into_owned());
                }
            }
            seen += 1000;
            cursor = next;
            if cursor == 0 || seen >= budget || found.len() >= 5 {
                return Some(found.into_iter().collect());
            }
        }
    }

    fn conn(&self) -> Conn {
        self.inner.shared.clone()
    }

    /// Runs `fut` within the operation timeout.
    /// One `XADD` of one record; with `if_live`, only into an existing
    /// stream (`NOMKSTREAM`), and `None` when there is none.
    async fn xadd(
        &self,
        log: &str,
        stream: &[u8],
        record: &[u8],
        if_live: bool,
    ) -> Result<Option<u64>> {
        let mut cmd =
            redis::Cmd::with_capacity(5 + usize::from(if_live), stream.len() + record.len() + 24);
        cmd.arg("XADD").arg(stream);
        if if_live {
            cmd.arg("NOMKSTREAM");
        }
        cmd.arg("0-*").arg("d").arg(record);
        let reply: Value = cmd
            .query_async(&mut self.conn())
            .await
            .map_err(|e| error::map(e, log))?;
        if reply == Value::Nil && if_live {
            return Ok(None);
        }
        let id = bytes_of(&reply).ok_or_else(|| unexpected(log, "XADD returned no id"))?;
        parse_id(log, id).map(Some)
    }

    async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let after = self.inner.timeouts.operation;
        match tokio::time::timeout(after, fut).await {
            Ok(result) => result,
            Err(_) => Err(error::no_reply(operation, after)),
        }
    }

    /// A dedicated connection for a blocking read, and whether it was idle
    /// in the pool (then it may have died with a server restart meanwhile).
    async fn blocking_conn(&self, pooled: bool) -> Result<(Conn, bool)> {
        if pooled {
            let idle = self
                .inner
                .idle_blocking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            if let Some(conn) = idle {
                return Ok((conn, true));
            }
        }
        debug!("opening a dedicated connection for blocking reads");
        let t = self.inner.timeouts;
        match tokio::time::timeout(t.operation, self.inner.target.dedicated(t)).await {
            Ok(conn) => conn
                .map(|c| (c, false))
                .map_err(|e| error::map(e, "(connection)")),
            Err(_) => Err(error::no_reply("connect", t.operation)),
        }
    }

    fn return_blocking_conn(&self, conn: Conn) {
        let mut idle = self
            .inner
            .idle_blocking
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_BLOCKING {
            idle.push(conn);
        }
    }

    async fn read_page(
        &self,
        log: &str,
        stream: &[u8],
        after: u64,
        count: usize,
    ) -> Result<Vec<LogRecord>> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(stream)
            .arg(format!("(0-{after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count);
        let reply: Value = cmd
            .query_async(&mut self.conn())
            .await
            .map_err(|e| error::map(e, log))?;
        parse_entries(log, reply)
    }
}

impl RedisStoreBuilder {
    fn new(endpoint: Endpoint) -> Self {
        RedisStoreBuilder {
            endpoint,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeouts: Timeouts {
                connect: Duration::from_secs(2),
                operation: Duration::from_secs(5),
            },
        }
    }

    /// The prefix of every Redis key the store writes (default
    /// `mcp-persist:`). Stores with different prefixes share a server without
    /// seeing each other's keys. It may not contain `{` or `}`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one attempt to connect may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// How long an operation may wait for the server before it fails with
    /// [`Error::Unavailable`] (default 5 s). `wait_after` may block for its
    /// own timeout on top of this.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.operation = timeout;
        self
    }

    /// Connects. Fails with [`Error::InvalidInput`] for a malformed URL or
    /// prefix and [`Error::Unavailable`] when the server cannot be reached.
    pub async fn connect(self) -> Result<RedisStore> {
        let layout = KeyLayout::new(&self.prefix)?;
        let t = self.timeouts;
        let (cluster, connecting) = match &self.endpoint {
            Endpoint::Standalone(url) => {
                check_url(url)?;
                (false, Target::connect_standalone(url, t).await)
            }
            Endpoint::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(Error::invalid(
                        "Redis Cluster URLs",
                        "at least one seed node is needed",
                    ));
                }
                for url in urls {
                    check_url(url)?;
                }
                (true, Target::connect_cluster(urls, t).await)
            }
        };
        let (shared, target) = connecting.map_err(|e| match e.kind() {
            redis::ErrorKind::InvalidClientConfig => Error::invalid("Redis URL", e.to_string()),
            _ => error::map(e, "(connection)"),
        })?;
        info!(cluster, key_prefix = %layout.prefix(), "connected to redis");
        Ok(RedisStore {
            inner: Arc::new(Inner {
                appender: Appender::start(shared.clone(), cluster, t.operation),
                shared,
                target,
                layout,
                timeouts: t,
                cluster,
                idle_blocking: Mutex::new(Vec::new()),
            }),
        })
    }
}

fn check_url(url: &str) -> Result<()> {
    use redis::IntoConnectionInfo;
    // The parse error never echoes the URL, which may hold a password.
    url.into_connection_info()
        .map(|_| ())
        .map_err(|e| Error::invalid("Redis URL", e.to_string()))
}

#[async_trait]
impl Backend for RedisStore {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }
}

#[async_trait]
impl KvStore for RedisStore {
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let record = self.inner.layout.record(key);
        let work = async {
            let reply: Value = redis::cmd("GET")
                .arg(&record)
                .query_async(&mut self.conn())
                .await
                .map_err(|e| error::map(e, key))?;
            match reply {
                Value::Nil => Ok(None),
                Value::BulkString(raw) => parse_record(key, raw).map(Some),
                _ => Err(unexpected(key, "GET did not return a string")),
            }
        };
        self.bounded("get", work)
            .instrument(debug_span!("redis.get", key = key.as_str()))
            .await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions { mode, ttl, .. } = options;
        check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
        let layout = &self.inner.layout;
        let (record, version) = (layout.record(key), layout.version(key));
        let (mode_arg, expected) = match mode {
            PutMode::Overwrite => ("o", String::new()),
            PutMode::Create => ("c", String::new()),
            PutMode::Update(v) => ("u", v.get().to_string()),
        };
        let ttl_ms = ttl.map(millis);
        let ttl_arg = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
        let companion_arg = ttl_ms
            .map(|t| t.saturating_add(millis(VERSION_MEMORY)).to_string())
            .unwrap_or_default();
        let work = async {
            let reply = PUT
                .run(
                    &mut self.conn(),
                    &[&record, &version],
                    &[
                        mode_arg.as_bytes(),
                        expected.as_bytes(),
                        &value,
                        ttl_arg.as_bytes(),
                        companion_arg.as_bytes(),
                    ],
                )
                .await
                .map_err(|e| error::map(e, key))?;
            match status_of(key, &reply)? {
                (scripts::OK, Some(v)) => bytes_of(v)
                    .and_then(parse_u64)
                    .map(Version::new)
                    .ok_or_else(|| unexpected(key, "version is not a number")),
                (scripts::EXISTS, _) => Err(Error::AlreadyExists {
                    key: key.to_string(),
                }),
                (scripts::CONFLICT, _) => Err(Error::Conflict {
                    key: key.to_string(),
                }),
                (scripts::CORRUPT, _) => Err(error::corrupt(
                    key,
                    "the stored record has no valid version header; delete it to write the key again",
                )),
                _ => Err(unexpected(key, "unknown script status")),
            }
        };
        self.bounded("put", work)
            .instrument(debug_span!("redis.put", key = key.as_str(), ?mode))
            .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let layout = &self.inner.layout;
        let (record, version) = (layout.record(key), layout.version(key));
        let expected = if_version.map(|v| v.get().to_string()).unwrap_or_default();
        let grace = millis(VERSION_MEMORY).to_string();
        let work = async {
            let reply = DELETE
                .run(
                    &mut self.conn(),
                    &[&record, &version],
                    &[expected.as_bytes(), grace.as_bytes()],
                )
                .await
                .map_err(|e| error::map(e, key))?;
            match status_of(key, &reply)? {
                (scripts::OK, Some(Value::Int(deleted))) => Ok(*deleted == 1),
                (scripts::CONFLICT, _) => Err(Error::Conflict {
                    key: key.to_string(),
                }),
                _ => Err(unexpected(key, "unknown script status")),
            }
        };
        self.bounded("delete", work)
            .instrument(debug_span!("redis.delete", key = key.as_str()))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let layout = &self.inner.layout;
        let pattern = layout.record_pattern(prefix);
        let work = async {
            let found = scan_all(&mut self.conn(), &pattern)
                .await
                .map_err(|e| error::map(e, prefix))?;
            // A foreign Redis key that maps to no valid store key is left out.
            let mut keys: Vec<Key> = found
                .iter()
                .filter_map(|k| layout.key_of_record(k))
                .filter(|k| k.starts_with(prefix))
                .filter_map(|k| Key::new(k).ok())
                .collect();
            keys.sort_unstable();
            keys.dedup();
            Ok(keys)
        };
        self.bounded("list", work)
            .instrument(debug_span!("redis.list", prefix))
            .await
    }
}

#[async_trait]
impl LogStore for RedisStore {
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, DEFAULT_MAX_VALUE_BYTES)?;
        }
        if records.is_empty() && ttl.is_none() {
            return Ok(Vec::new());
        }
        let stream = self.inner.layout.log(log);
        if let [record] = records.as_slice() {
            // One record and no expiry to set: a single `XADD` is atomic by
            // itself. With a TTL whose refresh is not due yet, `NOMKSTREAM`
            // keeps the `XADD` from creating a log without an expiry; if the
            // log has gone, the script below creates it properly.
            let if_live = match ttl {
                None => Some(false),
                Some(ttl) => self
                    .inner
                    .appender
                    .expiry_covers(&stream, ttl)
                    .then_some(true),
            };
            if let Some(if_live) = if_live {
                let added = self
                    .bounded("append", self.xadd(log, &stream, record, if_live))
                    .await?;
                if let Some(seq) = added {
                    return Ok(vec![seq]);
                }
                debug!(
                    log = log.as_str(),
                    "log gone since its expiry was set; appending with the script"
                );
            }
        }
        let count = records.len();
        let work = self.inner.appender.append(|reply| AppendJob {
            log: log.to_string(),
            stream,
            ttl,
            records,
            reply,
        });
        self.bounded("append", work)
            .instrument(debug_span!(
                "redis.append",
                log = log.as_str(),
                records = count
            ))
            .await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        if limit == 0 || after == u64::MAX {
            return Ok(Vec::new());
        }
        let stream = self.inner.layout.log(log);
        let work = async {
            let mut records: Vec<LogRecord> = Vec::new();
            let mut cursor = after;
            loop {
                let want = (limit - records.len()).min(READ_PAGE);
                let page = self.read_page(log, &stream, cursor, want).await?;
                let full = page.len() == want;
                if let Some(last) = page.last() {
                    cursor = last.seq;
                }
                records.extend(page);
                if !full || records.len() == limit || cursor == u64::MAX {
                    return Ok(records);
                }
            }
        };
        // A long log is read in pages; the timeout applies to the whole read.
        self.bounded("read_after", work)
            .instrument(debug_span!("redis.read_after", log = log.as_str(), after))
            .await
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let ready = self.read_after(log, after, limit).await?;
        if !ready.is_empty() || timeout.is_zero() || limit == 0 || after == u64::MAX {
            return Ok(ready);
        }
        let stream = self.inner.layout.log(log);
        let block_ms = millis(timeout);
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(limit.min(u32::MAX as usize))
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&stream)
            .arg(format!("0-{after}"));
        let bound = timeout.saturating_add(self.inner.timeouts.operation);
        let mut pooled = true;
        let reply = loop {
            let (mut conn, was_idle) = self.blocking_conn(pooled).await?;
            let span = debug_span!("redis.wait_after", log = log.as_str(), after, ?timeout);
            match tokio::time::timeout(bound, cmd.query_async::<Value>(&mut conn))
                .instrument(span)
                .await
            {
                Ok(Ok(reply)) => {
                    self.return_blocking_conn(conn);
                    break reply;
                }
                // An idle connection that died meanwhile (the server was
                // restarted): a read is safe to try again on a fresh one.
                Ok(Err(e)) if was_idle && e.is_unrecoverable_error() => {
                    debug!(error = %e, "dropping a dead idle connection");
                    pooled = false;
                }
                Ok(Err(e)) => return Err(error::map(e, log)),
                Err(_) => return Err(error::no_reply("wait_after", bound)),
            }
        };
        match reply {
            Value::Nil => Ok(Vec::new()),
            Value::Array(mut streams) => {
                let Some(Value::Array(mut stream)) = streams.pop() else {
                    return Err(unexpected(log, "XREAD reply has no stream"));
                };
                let entries = stream
                    .pop()
                    .ok_or_else(|| unexpected(log, "XREAD reply has no entries"))?;
                parse_entries(log, entries)
            }
            Value::Map(mut streams) => {
                let (_, entries) = streams
                    .pop()
                    .ok_or_else(|| unexpected(log, "XREAD reply has no stream"))?;
                parse_entries(log, entries)
            }
            _ => Err(unexpected(log, "XREAD did not return streams")),
        }
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        if before <= 1 {
            return Ok(0);
        }
        let stream = self.inner.layout.log(log);
        let work = async {
            let dropped: u64 = redis::cmd("XTRIM")
                .arg(&stream)
                .arg("MINID")
                .arg(format!("0-{before}"))
                .query_async(&mut self.conn())
                .await
                .map_err(|e| error::map(e, log))?;
            Ok(dropped)
        };
        self.bounded("trim", work)
            .instrument(debug_span!("redis.trim", log = log.as_str(), before))
            .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        let stream = self.inner.layout.log(log);
        let work = async {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&stream)
                .query_async(&mut self.conn())
                .await
                .map_err(|e| error::map(e, log))?;
            Ok(())
        };
        self.bounded("delete", work)
            .instrument(debug_span!("redis.delete_log", log = log.as_str()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_bad_headers_are_corrupt() {
        let entry = parse_record("k", b"42:a:b".to_vec()).expect("valid record");
        assert_eq!(entry.version, Version::new(42));
        assert_eq!(entry.value, b"a:b");
        let empty = parse_record("k", b"7:".to_vec()).expect("valid record");
        assert!(empty.value.is_empty());
        for bad in [&b"no header"[..], b":x", b"12a:x", b""] {
            assert!(
                matches!(parse_record("k", bad.to_vec()), Err(Error::Corrupt { ref key, .. }) if key == "k"),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn only_store_ids_parse() {
        assert_eq!(parse_id("l", b"0-17").expect("store id"), 17);
        assert!(matches!(
            parse_id("l", b"1700000000000-0"),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(parse_id("l", b"0-"), Err(Error::Corrupt { .. })));
    }
}
