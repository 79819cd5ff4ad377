//! Plain Redis commands, for what the store's interface does not cover:
//! the copy lock, and finding the key prefixes in use on a server.

use std::time::Duration;

use redis::{Cmd, FromRedisValue};

/// A connection to a standalone server or a cluster.
pub(crate) enum Conn {
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::One(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    pub(crate) async fn script<T: FromRedisValue>(
        &mut self,
        script: &redis::Script,
        key: &str,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let mut call = script.key(key);
        for arg in args {
            call.arg(*arg);
        }
        match self {
            Conn::One(c) => call.invoke_async(c).await,
            Conn::Cluster(c) => call.invoke_async(c).await,
        }
    }
}

/// Connects to a standalone server (the first URL) or a cluster.
pub(crate) async fn connect(urls: &[String], cluster: bool) -> redis::RedisResult<Conn> {
    if cluster {
        let client = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Conn::Cluster(client.get_async_connection().await?))
    } else {
        let url = urls.first().map(String::as_str).unwrap_or_default();
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)));
        Ok(Conn::One(
            redis::Client::open(url)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        ))
    }
}

/// The key prefixes under which a standalone server holds mcp-persist
/// records, found by scanning at most `budget` keys; `None` for a cluster
/// (whose nodes would each need scanning) or when the scan fails.
pub(crate) async fn prefixes_in_use(
    urls: &[String],
    cluster: bool,
    budget: usize,
) -> Option<Vec<String>> {
    if cluster {
        return None;
    }
    let mut conn = connect(urls, false).await.ok()?;
    let mut found = std::collections::BTreeSet::new();
    let mut cursor = 0u64;
    let mut seen = 0usize;
    loop {
        // A record's key is `<prefix>{kv:<key>}`.
        let (next, keys): (u64, Vec<Vec<u8>>) = conn
            .query(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("*{kv:*")
                    .arg("COUNT")
                    .arg(1000),
            )
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
