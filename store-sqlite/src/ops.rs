//! The SQL of every operation, on one connection. The writer thread runs the
//! writes inside its shared transaction; reads run on a reader connection.

use std::time::Duration;

use mcp_persist_core::{
    Error, Key, KvEntry, LogRecord, PutMode, Result, Timestamp, Version,
    backend::DEFAULT_MAX_VALUE_BYTES, kit,
};
use rusqlite::{Connection, ErrorCode, OptionalExtension, Row, params};

use crate::{
    checksum,
    error::{Ctx, bad_row},
};

/// Milliseconds since the Unix epoch by the kit's clock: expiry instants are
/// stored this way so that every process sharing the file agrees on them.
pub(crate) fn now_ms() -> i64 {
    millis(kit::now())
}

fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_unix_millis()).unwrap_or(i64::MAX)
}

/// The expiry instant of a write made now with `ttl`, by the kit's rule
/// (rounded up: a record never expires early).
fn expiry(ttl: Option<Duration>) -> Option<i64> {
    ttl.map(|ttl| millis(kit::expires_at(ttl)))
}

/// The name under which a damaged version clock is reported.
const VERSION_CLOCK: &str = "the SQLite version clock (table counters)";

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn version_of(row: &Row<'_>, idx: usize, key: &str) -> Result<Version> {
    let n: i64 = row
        .get(idx)
        .map_err(|e| bad_row(key, "a version that is not an integer", Some(e)))?;
    u64::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .map(Version::new)
        .ok_or_else(|| bad_row(key, &format!("the invalid version {n}"), None))
}

fn current_version(
    conn: &Connection,
    ctx: Ctx<'_>,
    key: &str,
    now: i64,
) -> Result<Option<Version>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT version FROM kv WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
        )
        .map_err(|e| ctx.sql(e))?;
    let mut rows = stmt.query(params![key, now]).map_err(|e| ctx.sql(e))?;
    match rows.next().map_err(|e| ctx.sql(e))? {
        Some(row) => version_of(row, 0, key).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn kv_get(conn: &Connection, ctx: Ctx<'_>, key: &str) -> Result<Option<KvEntry>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT value, version, checksum FROM kv \
             WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
        )
        .map_err(|e| ctx.sql(e))?;
    let mut rows = stmt.query(params![key, now_ms()]).map_err(|e| ctx.sql(e))?;
    let Some(row) = rows.next().map_err(|e| oversized_or(ctx, key, e))? else {
        return Ok(None);
    };
    let value: Vec<u8> = row
        .get(0)
        .map_err(|e| bad_row(key, "a value that is not a blob", Some(e)))?;
    check_size(ctx, key, value.len())?;
    let version = version_of(row, 1, key)?;
    let sum = stored_checksum(row, 2, key)?;
    let raw_version = version.get().cast_signed();
    if sum != checksum::of_value(key, raw_version, &value) {
        return Err(checksum_mismatch(
            ctx,
            key,
            &format!("the value at version {version:?}"),
        ));
    }
    Ok(Some(KvEntry::new(value, version)))
}

/// The checksum column of a row; a row without one is damaged.
fn stored_checksum(row: &Row<'_>, idx: usize, key: &str) -> Result<i64> {
    let sum: Option<i64> = row
        .get(idx)
        .map_err(|e| bad_row(key, "a checksum that is not an integer", Some(e)))?;
    sum.ok_or_else(|| bad_row(key, "no checksum", None))
}

fn checksum_mismatch(ctx: Ctx<'_>, key: &str, what: &str) -> Error {
    // Names the row, never its bytes.
    tracing::warn!(
        db = ctx.db,
        key,
        what,
        "SQLite row fails its checksum; not returned"
    );
    bad_row(
        key,
        &format!(
            "{what}, which fails its checksum: the bytes were changed outside this store \
             (disk damage or a stray write); restore the database from a backup, or \
             overwrite or delete the record"
        ),
        None,
    )
}

/// Why the version clock could not give `key` (at version `floor`) a greater
/// version: read again only to say so.
fn damaged_clock(conn: &Connection, ctx: Ctx<'_>, key: &str, floor: u64) -> Error {
    let found: rusqlite::Result<Option<String>> = conn
        .prepare_cached("SELECT quote(value) FROM counters WHERE name = 'kv_version'")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)).optional());
    let clock = match found {
        Ok(Some(value)) => format!("the version clock {value}"),
        Ok(None) => "no version clock".to_owned(),
        Err(e) => return ctx.sql(e),
    };
    tracing::warn!(db = ctx.db, key, %clock, "SQLite version clock is damaged; put refused");
    bad_row(
        VERSION_CLOCK,
        &format!(
            "{clock}, which cannot give key `{key}` (at version {floor}) a greater version; \
             set it to at least the greatest version in table kv"
        ),
        None,
    )
}

/// A stored value over the size limit was planted: this crate never writes one.
fn check_size(ctx: Ctx<'_>, key: &str, len: usize) -> Result<()> {
    if len > DEFAULT_MAX_VALUE_BYTES {
        return Err(oversized(ctx, key, Some(len)));
    }
    Ok(())
}

fn oversized(ctx: Ctx<'_>, key: &str, len: Option<usize>) -> Error {
    tracing::warn!(
        db = ctx.db,
        key,
        len,
        "SQLite row holds a value over the size limit; not returned"
    );
    let size = len.map_or_else(
        || format!("more than {READ_LENGTH_LIMIT}"),
        |n| n.to_string(),
    );
    bad_row(
        key,
        &format!(
            "a value of {size} bytes, over the limit of {DEFAULT_MAX_VALUE_BYTES} bytes \
             that this store writes: it was written outside this store; delete or \
             overwrite the record"
        ),
        None,
    )
}

/// Maps a read error: a value the read connection refused to load for its
/// size ([`READ_LENGTH_LIMIT`]) is a [`Error::Corrupt`] naming the key.
fn oversized_or(ctx: Ctx<'_>, key: &str, e: rusqlite::Error) -> Error {
    if e.sqlite_error_code() == Some(ErrorCode::TooBig) {
        oversized(ctx, key, None)
    } else {
        ctx.sql(e)
    }
}

/// The most a read connection loads as one value or row: the largest value
/// this crate writes plus room for its key and numbers. A larger one was
/// planted, and is refused by SQLite before it is allocated.
pub(crate) const READ_LENGTH_LIMIT: usize = DEFAULT_MAX_VALUE_BYTES + 64 * 1024;

pub(crate) fn kv_put(
    conn: &Connection,
    ctx: Ctx<'_>,
    key: &str,
    value: &[u8],
    mode: PutMode,
    ttl: Option<Duration>,
) -> Result<Version> {
    let now = now_ms();
    let current = current_version(conn, ctx, key, now)?;
    mode.check(key, current)?;
    // One clock for every key: versions of a key keep increasing after a
    // delete without keeping a tombstone per deleted key. The clock is
    // checked before any arithmetic, in the same statement that advances it
    // (one statement per put): a damaged clock (not an integer, negative,
    // at the maximum, or behind this key's version) fails this write alone,
    // as `Corrupt`, and never hands out a version twice.
    let floor = current.map_or(0, Version::get);
    let next: Option<i64> = conn
        .prepare_cached(
            "UPDATE counters SET value = value + 1 \
             WHERE name = 'kv_version' AND typeof(value) = 'integer' \
             AND value >= ?1 AND value < 9223372036854775807 RETURNING value",
        )
        .and_then(|mut stmt| stmt.query_row([clamp(floor)], |row| row.get(0)).optional())
        .map_err(|e| ctx.sql(e))?;
    let Some(next) = next.filter(|next| *next > 0) else {
        return Err(damaged_clock(conn, ctx, key, floor));
    };
    let sum = checksum::of_value(key, next, value);
    conn.prepare_cached(
        "INSERT INTO kv (key, value, version, expires_at, checksum) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (key) DO UPDATE SET \
         value = excluded.value, version = excluded.version, \
         expires_at = excluded.expires_at, checksum = excluded.checksum",
    )
    .and_then(|mut stmt| stmt.execute(params![key, value, next, expiry(ttl), sum]))
    .map_err(|e| ctx.sql(e))?;
    Ok(Version::new(next.cast_unsigned()))
}

pub(crate) fn kv_delete(
    conn: &Connection,
    ctx: Ctx<'_>,
    key: &str,
    if_version: Option<Version>,
) -> Result<bool> {
    let current = current_version(conn, ctx, key, now_ms())?;
    if let Some(want) = if_version {
        PutMode::Update(want).check(key, current)?;
    }
    // Also removes an expired row, which counts as absent.
    conn.prepare_cached("DELETE FROM kv WHERE key = ?1")
        .and_then(|mut stmt| stmt.execute([key]))
        .map_err(|e| ctx.sql(e))?;
    Ok(current.is_some())
}

pub(crate) fn kv_list(conn: &Connection, ctx: Ctx<'_>, prefix: &str) -> Result<Vec<Key>> {
    // Keys compare bytewise (BINARY collation on UTF-8), so the keys under a
    // prefix are one contiguous run of the index starting at the prefix.
    let mut stmt = conn
        .prepare_cached(
            "SELECT key FROM kv WHERE key >= ?1 \
             AND (expires_at IS NULL OR expires_at > ?2) ORDER BY key",
        )
        .map_err(|e| ctx.sql(e))?;
    let mut rows = stmt
        .query(params![prefix, now_ms()])
        .map_err(|e| ctx.sql(e))?;
    let mut keys = Vec::new();
    while let Some(row) = rows.next().map_err(|e| ctx.sql(e))? {
        let key: String = row
            .get(0)
            .map_err(|e| bad_row(prefix, "a key that is not text", Some(e)))?;
        if !key.starts_with(prefix) {
            break;
        }
        let valid = Key::new(key.as_str()).map_err(|e| {
            Error::corrupt(
                key,
                format!("a stored key that no store could have written: {e}"),
            )
        })?;
        keys.push(valid);
    }
    Ok(keys)
}

/// The instant before which a sweep may delete what expired: [`SWEEP_MARGIN`]
/// before now, so that a wall clock stepped forward for a moment cannot make
/// a sweep delete live rows for good.
fn sweep_before(now: i64) -> i64 {
    let margin = i64::try_from(kit::SWEEP_MARGIN.as_millis()).unwrap_or(i64::MAX);
    now.saturating_sub(margin)
}

pub(crate) fn kv_sweep(conn: &Connection, ctx: Ctx<'_>) -> Result<u64> {
    let removed = conn
        .prepare_cached("DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute([sweep_before(now_ms())]))
        .map_err(|e| ctx.sql(e))?;
    Ok(removed as u64)
}

pub(crate) fn log_append(
    conn: &Connection,
    ctx: Ctx<'_>,
    log: &str,
    records: &[Vec<u8>],
    ttl: Option<Duration>,
) -> Result<Vec<u64>> {
    let now = now_ms();
    let found: Option<(i64, i64, Option<i64>)> = conn
        .prepare_cached("SELECT id, last_seq, expires_at FROM logs WHERE name = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([log], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                .optional()
        })
        .map_err(|e| match e.sqlite_error_code() {
            Some(_) => ctx.sql(e),
            None => bad_row(log, "a log header of the wrong shape", Some(e)),
        })?;
    let (id, mut seq, expires) = match found {
        // An expired log starts again empty; numbering goes on above the old
        // records, which is allowed and keeps stale cursors from matching.
        Some((id, last, Some(at))) if at <= now => {
            conn.prepare_cached("DELETE FROM log_records WHERE log_id = ?1")
                .and_then(|mut stmt| stmt.execute([id]))
                .map_err(|e| ctx.sql(e))?;
            (id, last, None)
        }
        Some(header) => header,
        None => {
            let id: i64 = conn
                .prepare_cached(
                    "INSERT INTO logs (name, last_seq, expires_at) VALUES (?1, 0, NULL) \
                     RETURNING id",
                )
                .and_then(|mut stmt| stmt.query_row([log], |row| row.get(0)))
                .map_err(|e| ctx.sql(e))?;
            (id, 0, None)
        }
    };
    // The header is checked before any arithmetic: a damaged one fails this
    // append alone, as `Corrupt`, and never reuses a sequence number.
    let count = i64::try_from(records.len()).unwrap_or(i64::MAX);
    if seq < 0 || seq.checked_add(count).is_none() {
        return Err(bad_row(
            log,
            &format!("the invalid last sequence number {seq} (cannot append {count} more)"),
            None,
        ));
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO log_records (log_id, seq, data, checksum) VALUES (?1, ?2, ?3, ?4)",
        )
        .map_err(|e| ctx.sql(e))?;
    let mut seqs = Vec::with_capacity(records.len());
    for record in records {
        // Cannot overflow: checked against `count` above.
        seq += 1;
        insert
            .execute(params![
                id,
                seq,
                record,
                checksum::of_record(log, seq, record)
            ])
            .map_err(|e| ctx.sql(e))?;
        seqs.push(seq.cast_unsigned());
    }
    conn.prepare_cached("UPDATE logs SET last_seq = ?2, expires_at = ?3 WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute(params![id, seq, expiry(ttl).or(expires)]))
        .map_err(|e| ctx.sql(e))?;
    Ok(seqs)
}

pub(crate) fn log_read_after(
    conn: &Connection,
    ctx: Ctx<'_>,
    log: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<LogRecord>> {
    if limit == 0 || after >= i64::MAX as u64 {
        return Ok(Vec::new());
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT r.seq, r.data, r.checksum FROM logs l JOIN log_records r ON r.log_id = l.id \
             WHERE l.name = ?1 AND (l.expires_at IS NULL OR l.expires_at > ?2) AND r.seq > ?3 \
             ORDER BY r.seq LIMIT ?4",
        )
        .map_err(|e| ctx.sql(e))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut rows = stmt
        .query(params![log, now_ms(), clamp(after), limit])
        .map_err(|e| ctx.sql(e))?;
    let mut records = Vec::new();
    while let Some(row) = rows.next().map_err(|e| oversized_or(ctx, log, e))? {
        let seq: i64 = row
            .get(0)
            .map_err(|e| bad_row(log, "a sequence number that is not an integer", Some(e)))?;
        let data: Vec<u8> = row
            .get(1)
            .map_err(|e| bad_row(log, &format!("record {seq} that is not a blob"), Some(e)))?;
        check_size(ctx, log, data.len())?;
        let sum = stored_checksum(row, 2, log)?;
        if sum != checksum::of_record(log, seq, &data) {
            return Err(checksum_mismatch(ctx, log, &format!("record {seq}")));
        }
        let seq = u64::try_from(seq)
            .map_err(|_| bad_row(log, &format!("the invalid sequence number {seq}"), None))?;
        records.push(LogRecord::new(seq, data));
    }
    Ok(records)
}

/// The number `log_append` would give the next record of `log`: one above
/// the header's last number (kept through a trim and an expiry not yet
/// swept), or 1 when there is no header.
pub(crate) fn log_next_seq(conn: &Connection, ctx: Ctx<'_>, log: &str) -> Result<u64> {
    let last: Option<i64> = conn
        .prepare_cached("SELECT last_seq FROM logs WHERE name = ?1")
        .and_then(|mut stmt| stmt.query_row([log], |row| row.get(0)).optional())
        .map_err(|e| match e.sqlite_error_code() {
            Some(_) => ctx.sql(e),
            None => bad_row(log, "a log header of the wrong shape", Some(e)),
        })?;
    let last = last.unwrap_or(0);
    // As `log_append` checks it: a damaged header is `Corrupt`, never a
    // number that could repeat one.
    u64::try_from(last)
        .ok()
        .filter(|_| last < i64::MAX)
        .map(|last| last + 1)
        .ok_or_else(|| {
            bad_row(
                log,
                &format!("the invalid last sequence number {last} (cannot append 1 more)"),
                None,
            )
        })
}

pub(crate) fn log_trim(conn: &Connection, ctx: Ctx<'_>, log: &str, before: u64) -> Result<u64> {
    let removed = conn
        .prepare_cached(
            "DELETE FROM log_records WHERE log_id = \
             (SELECT id FROM logs WHERE name = ?1 AND (expires_at IS NULL OR expires_at > ?2)) \
             AND seq < ?3",
        )
        .and_then(|mut stmt| stmt.execute(params![log, now_ms(), clamp(before)]))
        .map_err(|e| ctx.sql(e))?;
    Ok(removed as u64)
}

pub(crate) fn log_delete(conn: &Connection, ctx: Ctx<'_>, log: &str) -> Result<()> {
    conn.prepare_cached(
        "DELETE FROM log_records WHERE log_id = (SELECT id FROM logs WHERE name = ?1)",
    )
    .and_then(|mut stmt| stmt.execute([log]))
    .map_err(|e| ctx.sql(e))?;
    conn.prepare_cached("DELETE FROM logs WHERE name = ?1")
        .and_then(|mut stmt| stmt.execute([log]))
        .map_err(|e| ctx.sql(e))?;
    Ok(())
}

pub(crate) fn log_sweep(conn: &Connection, ctx: Ctx<'_>) -> Result<u64> {
    let now = sweep_before(now_ms());
    conn.prepare_cached(
        "DELETE FROM log_records WHERE log_id IN \
         (SELECT id FROM logs WHERE expires_at IS NOT NULL AND expires_at <= ?1)",
    )
    .and_then(|mut stmt| stmt.execute([now]))
    .map_err(|e| ctx.sql(e))?;
    let removed = conn
        .prepare_cached("DELETE FROM logs WHERE expires_at IS NOT NULL AND expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute([now]))
        .map_err(|e| ctx.sql(e))?;
    Ok(removed as u64)
}
