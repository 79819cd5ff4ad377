//! The connections the store runs its commands on.
//!
//! Every operation is written once against [`ConnectionLike`]; [`Conn`] lets
//! the same code run on a reconnecting standalone connection, a dedicated
//! connection for blocking reads, or a Redis Cluster connection.

use std::time::Duration;

use redis::{
    Client, Cmd, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    cluster_routing::{RoutingInfo, SingleNodeRoutingInfo},
};

/// A connection of any of the kinds the store uses.
#[derive(Clone)]
pub(crate) enum Conn {
    /// Standalone, shared: reconnects by itself after the server comes back.
    Manager(ConnectionManager),
    /// Standalone, dedicated to one blocking command at a time.
    Dedicated(MultiplexedConnection),
    /// Redis Cluster: routes each command to the node owning its key's slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Dedicated(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Dedicated(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Dedicated(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Timeouts of the connections a store opens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) operation: Duration,
}

/// Where the store connects to, kept to open dedicated connections later.
#[derive(Clone)]
pub(crate) enum Target {
    Standalone(Client),
    /// The client for dedicated connections has no response timeout: their
    /// blocking reads are bounded by the store itself.
    Cluster {
        blocking: Box<ClusterClient>,
    },
}

impl Target {
    /// Opens the shared connection and returns it with the target.
    pub(crate) async fn connect_standalone(url: &str, t: Timeouts) -> RedisResult<(Conn, Target)> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(t.connect))
            // Every operation is bounded by the store itself (one timer per
            // operation rather than two).
            .set_response_timeout(None)
            // While the server is down, a command waits for at most a few
            // quick reconnect attempts, then fails; the next command tries
            // again.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok((Conn::Manager(manager), Target::Standalone(client)))
    }

    /// Opens a cluster connection through any of `urls` (seed nodes).
    pub(crate) async fn connect_cluster(
        urls: &[String],
        t: Timeouts,
    ) -> RedisResult<(Conn, Target)> {
        let shared = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(t.connect)
            .response_timeout(t.operation)
            .retries(2)
            .build()?;
        let blocking = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(t.connect)
            .retries(2)
            .build()?;
        let conn = shared.get_async_connection().await?;
        Ok((
            Conn::Cluster(conn),
            Target::Cluster {
                blocking: Box::new(blocking),
            },
        ))
    }

    /// Opens a connection for one blocking command at a time, so that a
    /// blocked `XREAD` never holds up the shared connection.
    pub(crate) async fn dedicated(&self, t: Timeouts) -> RedisResult<Conn> {
        match self {
            Target::Standalone(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(t.connect))
                    .set_response_timeout(None);
                Ok(Conn::Dedicated(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            Target::Cluster { blocking } => {
                Ok(Conn::Cluster(blocking.get_async_connection().await?))
            }
        }
    }
}

/// Runs `SCAN MATCH pattern` to the end on every primary and returns the keys.
pub(crate) async fn scan_all(conn: &mut Conn, pattern: &[u8]) -> RedisResult<Vec<Vec<u8>>> {
    match conn {
        Conn::Cluster(cluster) => {
            let mut keys = Vec::new();
            for (host, port) in primaries(cluster).await? {
                let route =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                let mut cursor = 0u64;
                loop {
                    let reply = cluster
                        .route_command(scan_cmd(cursor, pattern), route.clone())
                        .await?;
                    cursor = parse_scan_reply(reply, &mut keys)?;
                    if cursor == 0 {
                        break;
                    }
                }
            }
            Ok(keys)
        }
        other => {
            let mut keys = Vec::new();
            let mut cursor = 0u64;
            loop {
                let reply: Value = scan_cmd(cursor, pattern).query_async(other).await?;
                cursor = parse_scan_reply(reply, &mut keys)?;
                if cursor == 0 {
                    return Ok(keys);
                }
            }
        }
    }
}

/// One `SCAN` step on a standalone server: the next cursor and the keys.
pub(crate) async fn scan_step(
    conn: &mut Conn,
    cursor: u64,
    pattern: &[u8],
) -> RedisResult<(u64, Vec<Vec<u8>>)> {
    let reply: Value = scan_cmd(cursor, pattern).query_async(conn).await?;
    let mut keys = Vec::new();
    let next = parse_scan_reply(reply, &mut keys)?;
    Ok((next, keys))
}

fn scan_cmd(cursor: u64, pattern: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

fn unexpected(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_owned(),
    ))
}

fn parse_scan_reply(reply: Value, keys: &mut Vec<Vec<u8>>) -> RedisResult<u64> {
    let Value::Array(mut parts) = reply else {
        return Err(unexpected("SCAN did not return an array"));
    };
    if parts.len() != 2 {
        return Err(unexpected("SCAN did not return a cursor and keys"));
    }
    let batch = parts.pop().expect("length checked above");
    let cursor = parts.pop().expect("length checked above");
    let cursor = match cursor {
        Value::BulkString(b) => std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected("SCAN cursor is not a number"))?,
        Value::Int(n) => u64::try_from(n).map_err(|_| unexpected("negative SCAN cursor"))?,
        _ => return Err(unexpected("SCAN cursor is not a number")),
    };
    let Value::Array(batch) = batch else {
        return Err(unexpected("SCAN keys are not an array"));
    };
    for key in batch {
        if let Value::BulkString(k) = key {
            keys.push(k);
        }
    }
    Ok(cursor)
}

/// The addresses of the cluster's primaries, from `CLUSTER SLOTS`.
async fn primaries(cluster: &mut ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let reply = cluster
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let Value::Array(ranges) = reply else {
        return Err(unexpected("CLUSTER SLOTS did not return an array"));
    };
    let mut nodes: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(unexpected("CLUSTER SLOTS range is not an array"));
        };
        let Some(Value::Array(primary)) = fields.get(2) else {
            return Err(unexpected("CLUSTER SLOTS range has no primary"));
        };
        let host = match primary.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            _ => return Err(unexpected("CLUSTER SLOTS primary has no host")),
        };
        let port = match primary.get(1) {
            Some(Value::Int(p)) => {
                u16::try_from(*p).map_err(|_| unexpected("CLUSTER SLOTS port out of range"))?
            }
            _ => return Err(unexpected("CLUSTER SLOTS primary has no port")),
        };
        if !nodes.iter().any(|(h, p)| *h == host && *p == port) {
            nodes.push((host, port));
        }
    }
    Ok(nodes)
}
