//! [`RedisStore`]: both backend traits over Redis or Redis Cluster.

mod kv;
mod log;

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use mcp_persist_core::{Error, LogRecord, Result};
use redis::Value;
use tracing::{debug, info};

use crate::{
    batch::Appender,
    conn::{Conn, Target, Timeouts},
    error::{self},
    keys::{DEFAULT_PREFIX, KeyLayout},
    wire::{bytes_of, parse_entries, parse_id, unexpected},
};

/// How long the version of a deleted or expired key is remembered exactly
/// (see the guarantees of [`RedisStore`]).
pub const VERSION_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

/// Records read per `XRANGE` round trip.
const READ_PAGE: usize = 256;

/// Idle dedicated connections kept for `wait_after`.
const IDLE_BLOCKING: usize = 8;

/// A [`KvStore`](mcp_persist_core::KvStore) and [`LogStore`](mcp_persist_core::LogStore) on Redis 7.0 or newer, standalone or a
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse_record;
    use mcp_persist_core::Version;

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
