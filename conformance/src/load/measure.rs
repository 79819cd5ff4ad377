//! What the store holds after a run, measured from the backend itself:
//! Redis `MEMORY USAGE` of every key, SQLite pages, Postgres relation sizes.
//!
//! Bytes are grouped by the record kind a key or log belongs to, as core
//! declares it ([`declare::of_key`], [`declare::of_log`]); Redis's version
//! companions (the `:ver` keys that remember a record's last version after
//! it is gone) count under their record's kind, on a row of their own.
//!
//! For event logs the measurement also fits `bytes = per_log + per_record x
//! records` over every log (least squares), which splits what a stream costs
//! by itself from what each of its events costs.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail};
use mcp_persist_core::declare;
use serde::Serialize;

/// The bytes of one kind of record.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindUsage {
    /// Keys (records) or logs.
    pub items: u64,
    /// Records inside the logs (0 for key-value kinds).
    pub records: u64,
    /// Bytes, as the backend accounts them.
    pub bytes: u64,
}

/// `bytes = per_log + per_record x records`, fitted over logs of one kind.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Fit {
    /// What a log costs with no record in it.
    pub per_log: f64,
    /// What each record adds.
    pub per_record: f64,
}

/// What the store holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    /// How the bytes were measured.
    pub method: String,
    /// Bytes per kind (`<kind>` and, on Redis, `<kind> versions`).
    pub kinds: BTreeMap<String, KindUsage>,
    /// The backend's own total (Redis `used_memory` summed over the nodes,
    /// the SQLite file's used pages, the Postgres relations' sizes).
    pub total_bytes: u64,
    /// The fit over the event logs, when they vary in length.
    pub event_fit: Option<Fit>,
}

impl Usage {
    /// The bytes and items of every row whose name starts with `kind`.
    pub fn of(&self, kind: &str) -> (u64, u64) {
        self.kinds
            .iter()
            .filter(|(name, _)| *name == kind || name.starts_with(&format!("{kind} ")))
            .fold((0, 0), |(bytes, items), (name, k)| {
                // Companions count bytes, not items: their record is the item.
                let items = if name == kind { items + k.items } else { items };
                (bytes + k.bytes, items)
            })
    }

    /// Bytes per live server session.
    pub fn per_session(&self) -> Option<f64> {
        let (bytes, items) = self.of(declare::SERVER_SESSION.kind);
        (items > 0).then(|| bytes as f64 / items as f64)
    }

    /// Bytes per SSE stream, its events apart: its metadata record (when it
    /// has one) and what its log costs with no event in it.
    pub fn per_stream(&self) -> Option<f64> {
        let logs = self.kinds.get(declare::EVENT.kind)?.items;
        if logs == 0 {
            return None;
        }
        let (meta, _) = self.of(declare::EVENT_STREAM.kind);
        let fixed = self.event_fit.map_or(0.0, |f| f.per_log);
        Some(meta as f64 / logs as f64 + fixed)
    }

    /// Bytes per stored event.
    pub fn per_event(&self) -> Option<f64> {
        if let Some(fit) = self.event_fit {
            return Some(fit.per_record);
        }
        let k = self.kinds.get(declare::EVENT.kind)?;
        (k.records > 0).then(|| k.bytes as f64 / k.records as f64)
    }
}

/// Least squares over `(records, bytes)`; `None` when every log has the
/// same length.
fn fit(points: &[(u64, u64)]) -> Option<Fit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    let sxy: f64 = points
        .iter()
        .map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my))
        .sum();
    if sxx == 0.0 {
        return None;
    }
    let per_record = sxy / sxx;
    Some(Fit {
        per_log: my - per_record * mx,
        per_record,
    })
}

/// The kind of a record key or log name, as core declares it.
fn kind_of(name: &str, log: bool) -> String {
    let found = if log {
        declare::of_log(name)
    } else {
        declare::of_key(name)
    };
    found.map_or_else(|| "other".to_owned(), |d| d.kind.to_owned())
}

/// Measures the store `url` names (the URL the fleet opened).
pub async fn measure(url: &str) -> Result<Usage> {
    if let Some(nodes) = redis_nodes(url) {
        redis_usage(&nodes).await
    } else if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || sqlite_usage(&path))
            .await
            .context("measuring SQLite")?
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres_usage(url).await
    } else {
        bail!("cannot measure the store {url}: redis, redis+cluster, sqlite and postgres are known")
    }
}

/// The Redis nodes a store URL names, or `None` for another backend.
fn redis_nodes(url: &str) -> Option<Vec<String>> {
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        Some(
            rest.split('?')
                .next()
                .unwrap_or_default()
                .trim_end_matches('/')
                .split(',')
                .map(|n| format!("redis://{}/", n.trim()))
                .collect(),
        )
    } else if url.starts_with("redis://") {
        Some(vec![url.split('?').next().unwrap_or(url).to_owned()])
    } else {
        None
    }
}

/// A connection to one Redis node.
async fn connect(node: &str) -> Result<redis::aio::MultiplexedConnection> {
    redis::Client::open(node)
        .context("a Redis node URL")?
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to {node}"))
}

/// One page of a node's keys from `cursor`: the next cursor (0 at the end)
/// and the keys.
async fn scan(
    conn: &mut redis::aio::MultiplexedConnection,
    cursor: u64,
) -> Result<(u64, Vec<Vec<u8>>)> {
    Ok(redis::cmd("SCAN")
        .arg(cursor)
        .arg("COUNT")
        .arg(1000)
        .query_async(conn)
        .await?)
}

/// The cost cut a run measures on Redis: `stream-node-max-bytes` lowered
/// from its default (4,096) to this, so that a short stream's first node
/// is not reserved at 4 KB whatever it holds.
pub const STREAM_NODE_MAX_BYTES: u64 = 1024;

/// On Redis, sets `stream-node-max-bytes` to [`STREAM_NODE_MAX_BYTES`] on
/// every node and writes every SSE event log again, entry by entry with its
/// ids and expiry, so that the same events are held as a server so
/// configured would have held them; returns the logs rewritten, or `None`
/// for a store that is not Redis. For the end of a run only: a log written
/// meanwhile by a server would race with the rewrite.
pub async fn repack_redis_streams(url: &str) -> Result<Option<u64>> {
    let Some(nodes) = redis_nodes(url) else {
        return Ok(None);
    };
    let mut rewritten = 0u64;
    for node in &nodes {
        let mut conn = connect(node).await?;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("stream-node-max-bytes")
            .arg(STREAM_NODE_MAX_BYTES)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("CONFIG SET stream-node-max-bytes on {node}"))?;
        let mut logs = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = scan(&mut conn, cursor).await?;
            // Event logs only: the heartbeat and bus logs are still being
            // written by the live fleet.
            logs.extend(keys.into_iter().filter(|k| {
                matches!(parse_redis_key(k), Some((name, true, _)) if kind_of(&name, true) == declare::EVENT.kind)
            }));
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        for key in logs {
            type Entry = (String, Vec<(Vec<u8>, Vec<u8>)>);
            let entries: Vec<Entry> = redis::cmd("XRANGE")
                .arg(key.as_slice())
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await?;
            let ttl: i64 = redis::cmd("PTTL")
                .arg(key.as_slice())
                .query_async(&mut conn)
                .await?;
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("DEL").arg(key.as_slice()).ignore();
            for (id, fields) in &entries {
                let xadd = pipe.cmd("XADD").arg(key.as_slice()).arg(id);
                for (field, value) in fields {
                    xadd.arg(field.as_slice()).arg(value.as_slice());
                }
                xadd.ignore();
            }
            if ttl > 0 {
                pipe.cmd("PEXPIRE").arg(key.as_slice()).arg(ttl).ignore();
            }
            if !entries.is_empty() {
                let _: () = pipe.query_async(&mut conn).await?;
                rewritten += 1;
            }
        }
    }
    Ok(Some(rewritten))
}

/// The store key or log name inside a Redis key `<prefix>{kv:NAME}[:ver]`
/// or `<prefix>{log:NAME}`: (name, is a log, is a version companion).
fn parse_redis_key(key: &[u8]) -> Option<(String, bool, bool)> {
    let text = std::str::from_utf8(key).ok()?;
    let open = text.find('{')?;
    let rest = &text[open + 1..];
    let (rest, companion) = match rest.strip_suffix(":ver") {
        Some(r) if r.ends_with('}') => (r, true),
        _ => (rest, false),
    };
    let body = rest.strip_suffix('}')?;
    if let Some(name) = body.strip_prefix("kv:") {
        Some((name.to_owned(), false, companion))
    } else {
        body.strip_prefix("log:")
            .map(|name| (name.to_owned(), true, false))
    }
}

async fn redis_usage(nodes: &[String]) -> Result<Usage> {
    let mut usage = Usage {
        method: format!(
            "Redis MEMORY USAGE (SAMPLES 0) of every key on {} node(s)",
            nodes.len()
        ),
        ..Usage::default()
    };
    let mut points = Vec::new();
    for node in nodes {
        let mut conn = connect(node).await?;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await?;
        usage.total_bytes += info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_default();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = scan(&mut conn, cursor).await?;
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("MEMORY")
                    .arg("USAGE")
                    .arg(key.as_slice())
                    .arg("SAMPLES")
                    .arg(0);
            }
            let sizes: Vec<Option<u64>> = if keys.is_empty() {
                Vec::new()
            } else {
                pipe.query_async(&mut conn).await?
            };
            let parsed: Vec<Option<(String, bool, bool)>> =
                keys.iter().map(|k| parse_redis_key(k)).collect();
            let mut lens = redis::pipe();
            let mut logs = Vec::new();
            for (i, p) in parsed.iter().enumerate() {
                if let Some((_, true, _)) = p {
                    lens.cmd("XLEN").arg(keys[i].as_slice());
                    logs.push(i);
                }
            }
            let lengths: Vec<u64> = if logs.is_empty() {
                Vec::new()
            } else {
                lens.query_async(&mut conn).await?
            };
            let mut length_of = BTreeMap::new();
            for (i, len) in logs.into_iter().zip(lengths) {
                length_of.insert(i, len);
            }
            for (i, p) in parsed.into_iter().enumerate() {
                let bytes = sizes.get(i).copied().flatten().unwrap_or_default();
                let (row, records) = match p {
                    Some((name, true, _)) => (kind_of(&name, true), length_of.get(&i).copied()),
                    Some((name, false, true)) => {
                        (format!("{} versions", kind_of(&name, false)), None)
                    }
                    Some((name, false, false)) => (kind_of(&name, false), None),
                    None => ("other".to_owned(), None),
                };
                if row == declare::EVENT.kind
                    && let Some(records) = records
                {
                    points.push((records, bytes));
                }
                let k = usage.kinds.entry(row).or_default();
                k.items += 1;
                k.records += records.unwrap_or_default();
                k.bytes += bytes;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    usage.event_fit = fit(&points);
    Ok(usage)
}

/// Bytes per kind from the raw sizes of what each row holds, scaled so that
/// they add up to `total` (the pages or relation sizes the backend uses).
struct Raw {
    kinds: BTreeMap<String, KindUsage>,
    points: Vec<(u64, u64)>,
}

impl Raw {
    fn new() -> Raw {
        Raw {
            kinds: BTreeMap::new(),
            points: Vec::new(),
        }
    }

    fn record(&mut self, kind: String, bytes: u64) {
        let k = self.kinds.entry(kind).or_default();
        k.items += 1;
        k.bytes += bytes;
    }

    fn log(&mut self, kind: String, records: u64, bytes: u64) {
        if kind == declare::EVENT.kind {
            self.points.push((records, bytes));
        }
        let k = self.kinds.entry(kind).or_default();
        k.items += 1;
        k.records += records;
        k.bytes += bytes;
    }

    fn scaled(self, method: String, total: u64) -> Usage {
        let raw: u64 = self.kinds.values().map(|k| k.bytes).sum();
        let factor = if raw == 0 {
            1.0
        } else {
            total as f64 / raw as f64
        };
        let kinds = self
            .kinds
            .into_iter()
            .map(|(name, mut k)| {
                k.bytes = (k.bytes as f64 * factor).round() as u64;
                (name, k)
            })
            .collect();
        let points: Vec<(u64, u64)> = self
            .points
            .into_iter()
            .map(|(r, b)| (r, (b as f64 * factor).round() as u64))
            .collect();
        Usage {
            method: format!("{method}; raw row sizes scaled by {factor:.2} to the total"),
            kinds,
            total_bytes: total,
            event_fit: fit(&points),
        }
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn sqlite_usage(path: &str) -> Result<Usage> {
    let conn = rusqlite::Connection::open(path).with_context(|| format!("opening {path}"))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // Move the write-ahead log into the file, so its pages count.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let pragma = |name: &str| -> Result<u64> {
        let v: i64 = conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))?;
        Ok(u64::try_from(v).unwrap_or_default())
    };
    let page = pragma("page_size")?;
    let used = pragma("page_count")?.saturating_sub(pragma("freelist_count")?) * page;
    let now = now_millis();
    let mut raw = Raw::new();
    // Each row costs its columns plus a few bytes of b-tree cell; the
    // scaling below spreads the rest of the pages over them.
    let mut kv = conn.prepare(
        "SELECT key, length(key) + length(value) + 24 FROM kv \
         WHERE expires_at IS NULL OR expires_at > ?1",
    )?;
    let rows = kv.query_map([now], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    for row in rows {
        let (key, bytes) = row?;
        raw.record(
            kind_of(&key, false),
            u64::try_from(bytes).unwrap_or_default(),
        );
    }
    let mut logs = conn.prepare(
        "SELECT l.name, length(l.name) + 24, count(r.seq), \
                coalesce(sum(length(r.data) + 24), 0) \
         FROM logs l LEFT JOIN log_records r ON r.log_id = l.id \
         WHERE l.expires_at IS NULL OR l.expires_at > ?1 GROUP BY l.id",
    )?;
    let rows = logs.query_map([now], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    for row in rows {
        let (name, head, records, bytes) = row?;
        raw.log(
            kind_of(&name, true),
            u64::try_from(records).unwrap_or_default(),
            u64::try_from(head + bytes).unwrap_or_default(),
        );
    }
    Ok(raw.scaled(format!("SQLite pages in use ({page} B each)"), used))
}

async fn postgres_usage(url: &str) -> Result<Usage> {
    // The store's own option is not one the driver knows.
    let (base, schema) = match url.split_once('?') {
        Some((base, query)) => {
            let mut schema = None;
            let mut kept = Vec::new();
            for pair in query.split('&') {
                match pair.strip_prefix("schema=") {
                    Some(s) => schema = Some(s.to_owned()),
                    None => kept.push(pair),
                }
            }
            let base = if kept.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", kept.join("&"))
            };
            (base, schema)
        }
        None => (url.to_owned(), None),
    };
    let schema = schema.unwrap_or_else(|| mcp_persist_store_postgres::DEFAULT_SCHEMA.to_owned());
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .context("connecting to Postgres")?;
    let driver = tokio::spawn(connection);
    let mut total = 0u64;
    for table in ["kv", "logs", "log_records"] {
        let row = client
            .query_one(
                "SELECT pg_total_relation_size(format('%I.%I', $1::text, $2::text)::regclass)",
                &[&schema, &table],
            )
            .await?;
        total += u64::try_from(row.get::<_, i64>(0)).unwrap_or_default();
    }
    let mut raw = Raw::new();
    // A heap tuple costs its header (23 B, aligned to 24) and a 4 B line
    // pointer besides its columns; the scaling spreads indexes and free
    // space.
    for row in client
        .query(
            &format!(
                "SELECT key, octet_length(key) + octet_length(value) + 44 FROM \"{schema}\".kv \
                 WHERE expires_at IS NULL OR expires_at > now()"
            ),
            &[],
        )
        .await?
    {
        raw.record(
            kind_of(row.get::<_, &str>(0), false),
            u64::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
        );
    }
    for row in client
        .query(
            &format!(
                "SELECT l.name, octet_length(l.name) + 52, count(r.seq), \
                        coalesce(sum(octet_length(r.data) + 44), 0)::bigint \
                 FROM \"{schema}\".logs l LEFT JOIN \"{schema}\".log_records r ON r.log_id = l.id \
                 WHERE l.expires_at IS NULL OR l.expires_at > now() GROUP BY l.id"
            ),
            &[],
        )
        .await?
    {
        let head = u64::try_from(row.get::<_, i32>(1)).unwrap_or_default();
        let bytes = u64::try_from(row.get::<_, i64>(3)).unwrap_or_default();
        raw.log(
            kind_of(row.get::<_, &str>(0), true),
            u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
            head + bytes,
        );
    }
    drop(client);
    let _ = driver.await;
    Ok(raw.scaled("Postgres relation sizes (tables and indexes)".into(), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_keys_name_their_records() {
        let session = declare::SERVER_SESSION.key(&["abc"]);
        let key = format!("mcp-persist:{{kv:{session}}}");
        assert_eq!(
            parse_redis_key(key.as_bytes()),
            Some((session.to_string(), false, false))
        );
        let ver = format!("{key}:ver");
        assert_eq!(
            parse_redis_key(ver.as_bytes()),
            Some((session.to_string(), false, true))
        );
        let log = declare::EVENT.key(&["s:1"]);
        let stream = format!("p:{{log:{log}}}");
        assert_eq!(
            parse_redis_key(stream.as_bytes()),
            Some((log.to_string(), true, false))
        );
        assert_eq!(kind_of(&log, true), "event");
        assert_eq!(kind_of(&session, false), "server_session");
        assert_eq!(parse_redis_key(b"no tag"), None);
    }

    #[test]
    fn fit_splits_fixed_and_per_record_cost() {
        let f = fit(&[(1, 600), (3, 800), (5, 1000)]).expect("fit");
        assert!((f.per_log - 500.0).abs() < 1e-9 && (f.per_record - 100.0).abs() < 1e-9);
        assert!(fit(&[(2, 10), (2, 12)]).is_none());
    }
}
