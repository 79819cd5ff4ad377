//! Reclaiming the space of expired records, deleted records and expired
//! logs: a scan of the table, and conditional deletes that never remove
//! what changed since the scan saw it.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use mcp_persist_core::{Result, Timestamp, kit};

use crate::{
    Counters, Inner,
    item::{self, DATA, EXPIRES, Item, LAST, LIFE, PK, SK, TTL, VERSION, millis, n, s},
};

/// What the scan saw of one log.
#[derive(Default)]
struct LogSeen {
    /// Record numbers and their lives.
    records: Vec<(u64, u64)>,
}

impl Inner {
    /// Deletes the item `pk`/`sk` if `condition` (over `values`) still
    /// holds; whether it did.
    async fn delete_if(
        &self,
        pk: &str,
        sk: u64,
        condition: &str,
        values: Vec<(&'static str, AttributeValue)>,
    ) -> Result<bool> {
        Counters::bump(&self.counters.update_item);
        let mut call = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(PK, s(pk))
            .key(SK, n(sk))
            .condition_expression(condition);
        for (name, value) in values {
            call = call.expression_attribute_values(name, value);
        }
        match call.send().await {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.sdk_error("DeleteItem", e)),
        }
    }

    /// Removes key-value records that expired at least the sweep margin ago,
    /// tombstones past their keeping time, and the records and heads of logs
    /// that expired at least the margin ago; returns how many items went.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let now = kit::now();
        let margin = self.sweep_margin;
        let dead =
            |expired_ms: u64| kit::sweepable(Timestamp::from_unix_millis(expired_ms), now, margin);
        let mut removed = 0;
        let mut logs: BTreeMap<String, LogSeen> = BTreeMap::new();
        let mut start: Option<Item> = None;
        loop {
            Counters::bump(&self.counters.scan);
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| self.sdk_error("Scan", e))?;
            for found in out.items() {
                let Some(AttributeValue::S(pk)) = found.get(PK) else {
                    continue;
                };
                let sk = item::number(found, SK, pk)?.unwrap_or(0);
                if let Some(key) = pk.strip_prefix('k') {
                    let version = item::number(found, VERSION, key)?.unwrap_or(0);
                    let expired = item::number(found, EXPIRES, key)?;
                    let tombstone = !found.contains_key(DATA);
                    let reap_s = item::number(found, TTL, key)?;
                    let (condition, values) = match (tombstone, expired, reap_s) {
                        (false, Some(at), _) if dead(at) => (
                            format!("{VERSION} = :v AND {EXPIRES} = :x"),
                            vec![(":v", n(version)), (":x", n(at))],
                        ),
                        (true, _, Some(reap)) if reap.saturating_mul(1000) <= millis(now) => (
                            format!("{VERSION} = :v AND attribute_not_exists({DATA})"),
                            vec![(":v", n(version))],
                        ),
                        _ => continue,
                    };
                    if self.delete_if(pk, 0, &condition, values).await? {
                        removed += 1;
                    }
                } else if pk.starts_with('l') && sk > 0 {
                    let life = item::number(found, LIFE, pk)?.unwrap_or(0);
                    logs.entry(pk.clone()).or_default().records.push((sk, life));
                } else if pk.starts_with('l') {
                    logs.entry(pk.clone()).or_default();
                }
            }
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => break,
            }
        }
        for (pk, seen) in logs {
            removed += self.sweep_log(&pk, seen, &dead).await?;
        }
        if removed > 0 {
            tracing::info!(table = %self.table, removed, "swept expired and deleted items");
        }
        Ok(removed)
    }

    /// Sweeps one log: its records if the whole log is dead (absent head, or
    /// expired past the margin), else the records of older lives and below
    /// the floor. Each delete is conditioned on the record's life, so a
    /// record a new life wrote since is kept.
    async fn sweep_log(
        &self,
        pk: &str,
        seen: LogSeen,
        dead: &(dyn Fn(u64) -> bool + Sync),
    ) -> Result<u64> {
        let log = pk.get(1..).unwrap_or_default();
        // The head as it is now, not as the scan saw it.
        let head = self.read_head_item(pk).await?;
        let (keep_life, floor, whole) = match &head {
            None => (None, 0, true),
            Some(h) => {
                let expired = item::number(h, EXPIRES, log)?;
                let life = item::number(h, LIFE, log)?.unwrap_or(0);
                let floor = item::number(h, crate::item::FLOOR, log)?.unwrap_or(0);
                (Some(life), floor, expired.is_some_and(dead))
            }
        };
        let mut removed = 0;
        for (seq, life) in seen.records {
            let stale = whole || Some(life) != keep_life || seq <= floor;
            if stale
                && self
                    .delete_if(pk, seq, &format!("{LIFE} = :l"), vec![(":l", n(life))])
                    .await?
            {
                removed += 1;
            }
        }
        if whole && let Some(h) = head {
            let last = item::number(&h, LAST, log)?.unwrap_or(0);
            let expired = item::number(&h, EXPIRES, log)?.unwrap_or(0);
            if self
                .delete_if(
                    pk,
                    0,
                    &format!("{LAST} = :s AND {EXPIRES} = :x"),
                    vec![(":s", n(last)), (":x", n(expired))],
                )
                .await?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    async fn read_head_item(&self, pk: &str) -> Result<Option<Item>> {
        Counters::bump(&self.counters.get_item);
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, s(pk))
            .key(SK, n(0))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.sdk_error("GetItem", e))?;
        Ok(out.item)
    }
}
