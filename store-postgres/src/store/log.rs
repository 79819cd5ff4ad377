//! Logs: the `LogStore` half of [`PostgresStore`].

use crate::error::{self};
use async_trait::async_trait;
use mcp_persist_core::{Key, LogRecord, LogStore, Result};
use std::time::Duration;

use super::*;

#[async_trait]
impl LogStore for PostgresStore {
    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, true).await
    }

    /// Commits with `synchronous_commit = off` for this transaction: the
    /// records are committed and visible to every process, and survive a
    /// crash of this process, but a crash of the database server (or its
    /// machine) may lose the last of them. Appends queued with synced ones
    /// are committed synced.
    async fn append_unsynced(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        self.append_with(log, records, ttl, false).await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        if limit == 0 || after >= i64::MAX as u64 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                "read",
                log,
                &self.inner.sql.read,
                &[&log.as_str(), &clamp(after), &limit, &limit_param()],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.get(0);
                let data: Option<Vec<u8>> = row.get(1);
                let len: i32 = row.get(2);
                let data = data.ok_or_else(|| planted(log, len))?;
                let seq = u64::try_from(seq).ok().filter(|s| *s > 0).ok_or_else(|| {
                    error::bad_row(log, format!("the invalid sequence number {seq}"))
                })?;
                Ok(LogRecord::new(seq, data))
            })
            .collect()
    }

    /// Reads the log's header row alone (one `SELECT`, no lock, no write):
    /// one above its last issued number, or 1 when there is no header. An
    /// append numbers from that header whether the log is live, trimmed,
    /// expired or deleted (the header and its numbers stay until the sweep
    /// removes the header); only a log with no header starts at 1. A header
    /// whose number an append could not go on from is
    /// [`Corrupt`](mcp_persist_core::Error::Corrupt), as that append is.
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        let rows = self
            .query("next_seq", log, &self.inner.sql.next_seq, &[&log.as_str()])
            .await?;
        let head: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(|e| {
                error::bad_row(log, format!("a log header of the wrong shape ({e})"))
            })?,
            None => 0,
        };
        match u64::try_from(head) {
            Ok(last) if head < i64::MAX => Ok(Some(last + 1)),
            Ok(_) => Err(error::no_next_seq(log)),
            Err(_) => Err(error::bad_row(
                log,
                format!("the invalid last sequence number {head} in the log's header"),
            )),
        }
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let interest = self.inner.listener.interest(log.as_str());
        loop {
            // Registered before the read, so an append committed after the
            // read began wakes this wait.
            let notified = interest.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let records = self.read_after(log, after, limit).await?;
            let now = tokio::time::Instant::now();
            if !records.is_empty() || now >= deadline {
                return Ok(records);
            }
            let next = deadline.min(now + self.inner.poll_interval);
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        let target = &self.inner.target;
        self.bounded("trim", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&self.inner.sql.trim)
                .await
                .map_err(|e| error::map(e, target, log))?;
            client
                .execute(&stmt, &[&log.as_str(), &clamp(before)])
                .await
                .map_err(|e| error::map(e, target, log))
        })
        .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.query(
            "delete_log",
            log,
            &self.inner.sql.delete_log,
            &[&log.as_str()],
        )
        .await
        .map(drop)
    }
}
