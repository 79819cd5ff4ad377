//! Logs: the `LogStore` half of [`RedisStore`].

use crate::{
    batch::AppendJob,
    error::{self},
    scripts::{self, LAST_ID},
    wire::{millis, parse_entries, status_of, unexpected},
};
use async_trait::async_trait;
use mcp_persist_core::{
    Key, LogRecord, LogStore, Result, backend::DEFAULT_MAX_VALUE_BYTES, kit::check_value,
};
use redis::Value;
use std::time::Duration;
use tracing::{Instrument, debug, debug_span};

use super::*;

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
                    kind = mcp_persist_core::telemetry::kind_of_log(log),
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
                kind = mcp_persist_core::telemetry::kind_of_log(log),
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
            .instrument(debug_span!(
                "redis.read_after",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                after
            ))
            .await
    }

    /// Reads the last id Redis generated for the log's stream (`XINFO
    /// STREAM`, in a read-only script that checks the key's type first):
    /// the next append's `XADD ... 0-*` is numbered one above it. Redis
    /// keeps that id when records are trimmed, so the answer goes on above
    /// them; a log deleted or expired has no key, and its next append
    /// starts a new stream at 1. Writes nothing. A key of another type is
    /// the append's [`Error::Corrupt`]; a last id this store never writes,
    /// or the last one there is, leaves no number for an append (Redis
    /// refuses it) and is [`Error::Corrupt`] too.
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let stream = self.inner.layout.log(log);
        let work = async {
            let reply = LAST_ID
                .run(&mut self.conn(), &[&stream], &[])
                .await
                .map_err(|e| error::map(e, log))?;
            let last = match status_of(log, &reply)? {
                (scripts::OK, None) => 0,
                (scripts::OK, Some(id)) => parse_id(log, bytes_of(id).unwrap_or_default())?,
                (scripts::CORRUPT, _) => return Err(error::corrupt(log, error::WRONG_TYPE)),
                _ => {
                    return Err(unexpected(
                        log,
                        "the next-number script gave an unknown status",
                    ));
                }
            };
            let next = last.checked_add(1).ok_or_else(|| {
                error::corrupt(
                    log,
                    format!("the log's sequence numbers are exhausted (last 0-{last})"),
                )
            })?;
            Ok(Some(next))
        };
        self.bounded("next_seq", work)
            .instrument(debug_span!(
                "redis.next_seq",
                kind = mcp_persist_core::telemetry::kind_of_log(log)
            ))
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
            let span = debug_span!(
                "redis.wait_after",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                after,
                ?timeout
            );
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
            .instrument(debug_span!(
                "redis.trim",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                before
            ))
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
            .instrument(debug_span!(
                "redis.delete_log",
                kind = mcp_persist_core::telemetry::kind_of_log(log)
            ))
            .await
    }
}
