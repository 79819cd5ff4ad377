//! The [`LogStore`]: a head item per log and an item per record, appends
//! group-committed in `TransactWriteItems`.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    operation::transact_write_items::TransactWriteItemsError,
    types::{
        AttributeValue, DeleteRequest, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
        Update, WriteRequest,
    },
};
use mcp_persist_core::{
    Error, Key, LogRecord, LogStore, Result,
    kit::{self, check_value},
    retry::Backoff,
};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::{
    BACKEND, Counters, DynamoStore, Inner, TOMBSTONE_KEEP,
    error::{ServiceError, build_error, is_throttling},
    item::{
        self, DATA, EXPIRES, FLOOR, Item, LAST, LIFE, PK, SK, TTL, TTL_ALIAS, WRITER, log_pk,
        millis, n, s,
    },
    kv::{Expr, ttl_attribute},
};

/// DynamoDB's limits on one transaction: 100 items (the head and 99
/// records here) and 4 MB in all (some room kept under it).
const MAX_TX_RECORDS: usize = 99;
const MAX_TX_BYTES: usize = 4_000_000;
/// `BatchWriteItem` takes 25 requests at most.
const BATCH_WRITE: usize = 25;
/// How long one append keeps trying against other writers of its log.
const CONTENDED_FOR: Duration = Duration::from_secs(60);
/// Heads remembered between appends (the next append of a log then needs
/// no read first); forgotten all at once past this many logs.
const HEADS_CACHED: usize = 4096;

/// A log's head item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    /// The last sequence number handed out.
    last: u64,
    /// Records at or below it are gone.
    floor: u64,
    /// This life's number, carried by its records.
    life: u64,
    /// When the log expires (milliseconds), if it does.
    expires: Option<u64>,
    /// The token of the last append.
    writer: Option<u64>,
}

impl Head {
    fn parse(found: &Item, log: &str) -> Result<Option<Head>> {
        let Some(last) = item::number(found, LAST, log)? else {
            return Ok(None);
        };
        let floor = item::number(found, FLOOR, log)?.unwrap_or(0);
        if floor > last {
            return Err(Error::corrupt(
                log,
                format!("the log's floor {floor} is above its last sequence number {last}"),
            ));
        }
        Ok(Some(Head {
            last,
            floor,
            life: item::number(found, LIFE, log)?.unwrap_or(0),
            expires: item::number(found, EXPIRES, log)?,
            writer: item::number(found, WRITER, log)?,
        }))
    }

    fn live(&self, now_ms: u64) -> bool {
        self.expires.is_none_or(|at| at > now_ms)
    }
}

/// The last number after `count` more records numbered above `base`;
/// [`Error::Corrupt`] when the numbers run out, which only a head changed
/// outside this store makes happen.
fn grow(log: &str, base: u64, count: u64) -> Result<u64> {
    base.checked_add(count)
        .ok_or_else(|| Error::corrupt(log, format!("sequence number {base} cannot grow any more")))
}

/// An append waiting for its transaction.
pub(crate) struct Pending {
    records: Vec<Vec<u8>>,
    ttl: Option<Duration>,
    reply: oneshot::Sender<Result<Vec<u64>>>,
}

/// The appends of one log waiting in this process, and whether a committer
/// is at work on them.
#[derive(Default)]
pub(crate) struct Queue {
    pending: VecDeque<Pending>,
    running: bool,
}

fn record_size(pk: &str, record: &[u8]) -> usize {
    item::item_size(pk.len(), record.len())
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The outcome of one transaction attempt that did not commit.
enum Refused {
    /// The head was not as expected: it is now this (`None`: unknown).
    Head(Option<Option<Head>>),
    /// Another transaction held an item, or the service throttled: retry.
    Busy,
}

impl Inner {
    fn cached_head(&self, pk: &str) -> Option<Option<Head>> {
        lock(&self.heads).get(pk).copied().map(Some)
    }

    fn remember_head(&self, pk: &str, head: Option<Head>) {
        let mut heads = lock(&self.heads);
        match head {
            Some(head) => {
                if heads.len() >= HEADS_CACHED {
                    heads.clear();
                }
                heads.insert(pk.to_owned(), head);
            }
            None => {
                heads.remove(pk);
            }
        }
    }

    async fn read_head(&self, pk: &str, log: &str) -> Result<Option<Head>> {
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
        let head = match out.item() {
            // A head that does not parse is forgotten too: the next append
            // reads it again, and fails on it, rather than trusting what
            // this store remembered.
            Some(found) => Head::parse(found, log).inspect_err(|_| self.remember_head(pk, None))?,
            None => None,
        };
        self.remember_head(pk, head);
        Ok(head)
    }

    /// Queues an append and waits for the transaction that commits it.
    pub(crate) async fn append(
        self: &Arc<Self>,
        log: &str,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        for record in &records {
            check_value(record, self.max_value)?;
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let pk = log_pk(log);
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queues = lock(&self.queues);
            let queue = queues.entry(pk.clone()).or_default();
            queue.pending.push_back(Pending {
                records,
                ttl,
                reply,
            });
            !std::mem::replace(&mut queue.running, true)
        };
        if lead {
            // A task of its own: the commit goes on if this caller is dropped.
            tokio::spawn(self.clone().drain(pk, log.to_owned()).in_current_span());
        }
        answer.await.map_err(|_| {
            Error::backend(
                BACKEND,
                ServiceError::new("TransactWriteItems", "the committer of this log stopped"),
            )
        })?
    }

    /// Commits the queued appends of one log, as many per transaction as
    /// fit, until none is left.
    async fn drain(self: Arc<Self>, pk: String, log: String) {
        loop {
            let batch = {
                let mut queues = lock(&self.queues);
                let Some(queue) = queues.get_mut(&pk) else {
                    return;
                };
                let mut batch: Vec<Pending> = Vec::new();
                let (mut count, mut bytes) = (0, 0);
                while let Some(next) = queue.pending.front() {
                    let size: usize = next.records.iter().map(|r| record_size(&pk, r)).sum();
                    let fits = count + next.records.len() <= MAX_TX_RECORDS
                        && bytes + size <= MAX_TX_BYTES;
                    if !batch.is_empty() && !fits {
                        break;
                    }
                    count += next.records.len();
                    bytes += size;
                    batch.extend(queue.pending.pop_front());
                    if !fits {
                        break;
                    }
                }
                if batch.is_empty() {
                    queues.remove(&pk);
                    return;
                }
                batch
            };
            self.commit_batch(&pk, &log, batch).await;
        }
    }

    /// Commits `batch` (one transaction, or consecutive ones for a single
    /// append over the limits) and answers each caller.
    async fn commit_batch(&self, pk: &str, log: &str, batch: Vec<Pending>) {
        let ttl = batch.iter().rev().find_map(|p| p.ttl);
        let records: Vec<&[u8]> = batch
            .iter()
            .flat_map(|p| p.records.iter().map(Vec::as_slice))
            .collect();
        let mut seqs = Vec::with_capacity(records.len());
        let mut outcome = Ok(());
        let mut rest = records.as_slice();
        while !rest.is_empty() {
            let (mut take, mut bytes) = (0, 0);
            while take < rest.len() && take < MAX_TX_RECORDS {
                let size = record_size(pk, rest[take]);
                if take > 0 && bytes + size > MAX_TX_BYTES {
                    break;
                }
                bytes += size;
                take += 1;
            }
            let (part, later) = rest.split_at(take);
            if !later.is_empty() {
                tracing::debug!(
                    log,
                    records = part.len(),
                    "append over one transaction: committing it in parts"
                );
            }
            match self.commit(pk, log, part, ttl).await {
                Ok(first) => seqs.extend(first..first + part.len() as u64),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
            rest = later;
        }
        let mut seqs = seqs.into_iter();
        for pending in batch {
            let answer = match &outcome {
                Ok(()) => Ok(seqs.by_ref().take(pending.records.len()).collect()),
                Err(e) => Err(copy_error(e)),
            };
            let _ = pending.reply.send(answer);
        }
    }

    /// Commits `records` in one transaction that also moves the head, and
    /// returns the first record's sequence number. Loses races to other
    /// writers of the log (other processes, other stores) and tries again.
    async fn commit(
        &self,
        pk: &str,
        log: &str,
        records: &[&[u8]],
        ttl: Option<Duration>,
    ) -> Result<u64> {
        let token = item::random_u64();
        let started = Instant::now();
        let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(100));
        let mut known = self.cached_head(pk);
        let mut round = 0u32;
        loop {
            let head = match known.take() {
                Some(head) => head,
                None => self.read_head(pk, log).await?,
            };
            let now = millis(kit::now());
            let (base, floor, life, fresh) = match head {
                Some(h) if h.live(now) => (h.last, h.floor, h.life, false),
                Some(h) => (h.last, h.last, item::random_u64(), true),
                None => (0, 0, item::random_u64(), true),
            };
            let last = grow(log, base, records.len() as u64)?;
            let expires = ttl.map(|ttl| millis(kit::expires_at(ttl)));
            match self
                .transact(
                    pk,
                    head,
                    records,
                    token,
                    (base, last, floor, life, fresh),
                    expires,
                    now,
                )
                .await?
            {
                Ok(()) => {
                    let kept = if fresh {
                        None
                    } else {
                        head.and_then(|h| h.expires)
                    };
                    self.remember_head(
                        pk,
                        Some(Head {
                            last,
                            floor,
                            life,
                            expires: expires.or(kept),
                            writer: Some(token),
                        }),
                    );
                    if fresh && head.is_some() {
                        tracing::debug!(log, base, "an expired or deleted log starts a new life");
                    }
                    return Ok(base + 1);
                }
                Err(Refused::Head(Some(Some(current)))) if current.writer == Some(token) => {
                    // Our transaction landed on an earlier attempt whose
                    // answer was lost.
                    self.remember_head(pk, Some(current));
                    return Ok(base + 1);
                }
                Err(Refused::Head(current)) => {
                    known = current;
                    if let Some(current) = known {
                        self.remember_head(pk, current);
                    }
                }
                Err(Refused::Busy) => known = None,
            }
            round += 1;
            if started.elapsed() >= CONTENDED_FOR {
                return Err(Error::Timeout {
                    operation: "appending to a log other writers kept changing",
                    after: CONTENDED_FOR,
                });
            }
            if round > 1 {
                // Jittered, so racing writers spread out.
                let pause = backoff.next_pause();
                let jitter = item::random_u64() % (pause.as_micros() as u64 + 1);
                tokio::time::sleep(Duration::from_micros(jitter)).await;
            }
        }
    }

    /// One `TransactWriteItems`: the head's move from `base` to `last` on
    /// condition that it is still at `base` (and live, unless `fresh`), and
    /// the records. The outer `Result` is a failure to report; the inner
    /// one says whether the transaction committed.
    #[allow(clippy::too_many_arguments)]
    async fn transact(
        &self,
        pk: &str,
        head: Option<Head>,
        records: &[&[u8]],
        token: u64,
        (base, last, floor, life, fresh): (u64, u64, u64, u64, bool),
        expires: Option<u64>,
        now: u64,
    ) -> Result<std::result::Result<(), Refused>> {
        let mut expr = Expr::default();
        let mut set = vec![
            format!("{LAST} = {}", expr.value(":s", n(last))),
            format!("{WRITER} = {}", expr.value(":w", n(token))),
        ];
        let mut remove = Vec::new();
        if fresh {
            set.push(format!("{FLOOR} = {}", expr.value(":f", n(floor))));
            set.push(format!("{LIFE} = {}", expr.value(":l", n(life))));
        }
        match expires {
            Some(at) => {
                expr.uses_ttl = true;
                set.push(format!("{EXPIRES} = {}", expr.value(":x", n(at))));
                set.push(format!(
                    "{TTL_ALIAS} = {}",
                    expr.value(":t", n(ttl_attribute(at)))
                ));
            }
            None if fresh => {
                expr.uses_ttl = true;
                remove.push(EXPIRES.to_owned());
                remove.push(TTL_ALIAS.to_owned());
            }
            None => {}
        }
        let condition = match head {
            None => format!("attribute_not_exists({LAST})"),
            Some(_) if fresh => format!("{LAST} = {}", expr.value(":base", n(base))),
            // The floor too: a head remembered from an earlier append would
            // otherwise go on over a floor changed outside the store (a floor
            // above the last number is damage), which only the next read
            // noticed. Another process's trim fails the condition as well,
            // and the append goes on from the head it gives back.
            Some(h) => format!(
                "{LAST} = {} AND (attribute_not_exists({EXPIRES}) OR {EXPIRES} > {}) AND {}",
                expr.value(":base", n(base)),
                expr.value(":now", n(now)),
                if h.floor == 0 {
                    format!(
                        "(attribute_not_exists({FLOOR}) OR {FLOOR} = {})",
                        expr.value(":floor", n(0))
                    )
                } else {
                    format!("{FLOOR} = {}", expr.value(":floor", n(h.floor)))
                },
            ),
        };
        let mut update = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            update.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        let mut head_update = Update::builder()
            .table_name(&self.table)
            .key(PK, s(pk))
            .key(SK, n(0))
            .update_expression(update)
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if expr.uses_ttl {
            head_update = head_update.expression_attribute_names(TTL_ALIAS, TTL);
        }
        for (name, value) in expr.values {
            head_update = head_update.expression_attribute_values(name, value);
        }
        let head_update = head_update
            .build()
            .map_err(|e| build_error("TransactWriteItems", e))?;
        let mut call = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(head_update).build());
        for (i, record) in records.iter().enumerate() {
            let put = Put::builder()
                .table_name(&self.table)
                .item(PK, s(pk))
                .item(SK, n(base + 1 + i as u64))
                .item(DATA, AttributeValue::B(record.to_vec().into()))
                .item(LIFE, n(life))
                .build()
                .map_err(|e| build_error("TransactWriteItems", e))?;
            call = call.transact_items(TransactWriteItem::builder().put(put).build());
        }
        Counters::bump(&self.counters.transact_write_items);
        let err = match call.send().await {
            Ok(_) => return Ok(Ok(())),
            Err(err) => err,
        };
        let log = pk.get(1..).unwrap_or_default();
        match err.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                let reasons = cancelled.cancellation_reasons();
                let head_reason = reasons.first();
                if head_reason.and_then(|r| r.code()) == Some("ConditionalCheckFailed") {
                    let current = match head_reason.and_then(|r| r.item()) {
                        Some(found) if !found.is_empty() => Some(Head::parse(found, log)?),
                        // No item given back: the head is absent, or the
                        // answer did not say; read it.
                        _ => None,
                    };
                    return Ok(Err(Refused::Head(current)));
                }
                if reasons.iter().any(|r| {
                    r.code()
                        .is_some_and(|c| c == "TransactionConflict" || is_throttling(c))
                }) {
                    return Ok(Err(Refused::Busy));
                }
                Err(self.sdk_error("TransactWriteItems", err))
            }
            Some(TransactWriteItemsError::TransactionInProgressException(_)) => {
                Ok(Err(Refused::Busy))
            }
            _ => Err(self.sdk_error("TransactWriteItems", err)),
        }
    }

    /// The number the next append to `log` gives its first record, from
    /// the head item as [`commit`](Self::commit) finds it: one above its
    /// last number, or 1 without a head (or a head without a last number).
    pub(crate) async fn next_seq(&self, log: &str) -> Result<u64> {
        let pk = log_pk(log);
        let last = self.read_head(&pk, log).await?.map_or(0, |h| h.last);
        grow(log, last, 1)
    }

    pub(crate) async fn read_after(
        &self,
        log: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let pk = log_pk(log);
        // A gap can only come from a trim racing this read; the second
        // look sees the trim's floor. A gap that stays is damage.
        for attempt in 0..2 {
            let Some(head) = self.read_head(&pk, log).await? else {
                return Ok(Vec::new());
            };
            if !head.live(millis(kit::now())) {
                return Ok(Vec::new());
            }
            let from = after.max(head.floor);
            if from >= head.last {
                return Ok(Vec::new());
            }
            let records = self.query(&pk, log, from + 1, head.last, limit).await?;
            let mut expected = from + 1;
            let mut gap = None;
            for record in &records {
                if record.seq != expected {
                    gap = Some(expected);
                    break;
                }
                expected += 1;
            }
            let complete = records.len() >= limit || expected > head.last;
            match gap {
                None if complete => return Ok(records),
                None => gap = Some(expected),
                Some(_) => {}
            }
            if attempt == 1 {
                return Err(Error::corrupt(
                    log,
                    format!(
                        "record {} is missing below the log's last number {} (deleted outside mcp-persist?)",
                        gap.unwrap_or(expected),
                        head.last
                    ),
                ));
            }
        }
        Ok(Vec::new())
    }

    /// The records of `pk` numbered `from..=to`, at most `limit`.
    async fn query(
        &self,
        pk: &str,
        log: &str,
        from: u64,
        to: u64,
        limit: usize,
    ) -> Result<Vec<LogRecord>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let page = i32::try_from(limit - out.len()).unwrap_or(i32::MAX).max(1);
            Counters::bump(&self.counters.query);
            let answer = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression(format!("{PK} = :pk AND {SK} BETWEEN :lo AND :hi"))
                .expression_attribute_values(":pk", s(pk))
                .expression_attribute_values(":lo", n(from))
                .expression_attribute_values(":hi", n(to))
                .limit(page)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| self.sdk_error("Query", e))?;
            for found in answer.items() {
                let seq = item::number(found, SK, log)?
                    .ok_or_else(|| Error::corrupt(log, "a record has no sequence number"))?;
                let data = item::bytes(found, DATA, log)?
                    .ok_or_else(|| Error::corrupt(log, format!("record {seq} holds no data")))?;
                out.push(LogRecord::new(seq, data));
            }
            match answer.last_evaluated_key {
                Some(next) if !next.is_empty() && out.len() < limit => start = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// The sequence numbers of the record items of `pk` in `from..=to`.
    pub(crate) async fn record_numbers(
        &self,
        pk: &str,
        log: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            Counters::bump(&self.counters.query);
            let answer = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .projection_expression(SK)
                .key_condition_expression(format!("{PK} = :pk AND {SK} BETWEEN :lo AND :hi"))
                .expression_attribute_values(":pk", s(pk))
                .expression_attribute_values(":lo", n(from))
                .expression_attribute_values(":hi", n(to))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| self.sdk_error("Query", e))?;
            for found in answer.items() {
                out.extend(item::number(found, SK, log)?);
            }
            match answer.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// Deletes the record items `seqs` of `pk`, 25 per `BatchWriteItem`.
    pub(crate) async fn delete_records(&self, pk: &str, seqs: &[u64]) -> Result<()> {
        for chunk in seqs.chunks(BATCH_WRITE) {
            let mut requests = Vec::with_capacity(chunk.len());
            for seq in chunk {
                let delete = DeleteRequest::builder()
                    .key(PK, s(pk))
                    .key(SK, n(*seq))
                    .build()
                    .map_err(|e| build_error("BatchWriteItem", e))?;
                requests.push(WriteRequest::builder().delete_request(delete).build());
            }
            let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
            for _ in 0..20 {
                Counters::bump(&self.counters.batch_write_item);
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, std::mem::take(&mut requests))
                    .send()
                    .await
                    .map_err(|e| self.sdk_error("BatchWriteItem", e))?;
                requests = out
                    .unprocessed_items
                    .and_then(|mut left| left.remove(&self.table))
                    .unwrap_or_default();
                if requests.is_empty() {
                    break;
                }
                tokio::time::sleep(backoff.next_pause()).await;
            }
            if !requests.is_empty() {
                tracing::warn!(
                    left = requests.len(),
                    "some records were not deleted; the sweep reclaims them"
                );
            }
        }
        Ok(())
    }

    pub(crate) async fn trim(&self, log: &str, before: u64) -> Result<u64> {
        let pk = log_pk(log);
        let Some(head) = self.read_head(&pk, log).await? else {
            return Ok(0);
        };
        if !head.live(millis(kit::now())) {
            return Ok(0);
        }
        let new_floor = before.saturating_sub(1).min(head.last);
        if new_floor <= head.floor {
            return Ok(0);
        }
        Counters::bump(&self.counters.update_item);
        let moved = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, s(&pk))
            .key(SK, n(0))
            .update_expression(format!("SET {FLOOR} = :f"))
            .condition_expression(format!("{LIFE} = :l AND {FLOOR} < :f"))
            .expression_attribute_values(":f", n(new_floor))
            .expression_attribute_values(":l", n(head.life))
            .send()
            .await;
        match moved {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                // Trimmed further, or restarted, meanwhile.
                return Ok(0);
            }
            Err(e) => return Err(self.sdk_error("UpdateItem", e)),
        }
        self.remember_head(&pk, None);
        let gone = self
            .record_numbers(&pk, log, head.floor + 1, new_floor)
            .await?;
        self.delete_records(&pk, &gone).await?;
        tracing::debug!(log, floor = new_floor, dropped = gone.len(), "log trimmed");
        Ok(gone.len() as u64)
    }

    pub(crate) async fn delete_log(&self, log: &str) -> Result<()> {
        let pk = log_pk(log);
        let now = kit::now();
        Counters::bump(&self.counters.update_item);
        // The head stays, expired and with its floor at its last number, so
        // a later append continues the numbering; DynamoDB's TTL removes it
        // after `TOMBSTONE_KEEP`.
        let ended = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, s(&pk))
            .key(SK, n(0))
            .update_expression(format!(
                "SET {FLOOR} = {LAST}, {EXPIRES} = :now, {TTL_ALIAS} = :t"
            ))
            .condition_expression(format!("attribute_exists({LAST})"))
            .expression_attribute_names(TTL_ALIAS, TTL)
            .expression_attribute_values(":now", n(millis(now)))
            .expression_attribute_values(":t", n(kit::expires_at_secs(now.plus(TOMBSTONE_KEEP))))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        self.remember_head(&pk, None);
        let head = match ended {
            Ok(out) => out
                .attributes()
                .map(|found| Head::parse(found, log))
                .transpose()?
                .flatten(),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                return Ok(());
            }
            Err(e) => return Err(self.sdk_error("UpdateItem", e)),
        };
        if let Some(head) = head {
            let gone = self.record_numbers(&pk, log, 1, head.last).await?;
            self.delete_records(&pk, &gone).await?;
        }
        Ok(())
    }

    async fn wait_after(
        &self,
        log: &str,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let records = self.read_after(log, after, limit).await?;
            let now = tokio::time::Instant::now();
            if !records.is_empty() || now >= deadline {
                return Ok(records);
            }
            tokio::time::sleep_until((now + self.poll).min(deadline)).await;
        }
    }
}

/// The same error for every caller of a group commit that failed.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Corrupt { key, reason, .. } => Error::corrupt(key.clone(), reason.clone()),
        Error::Timeout { operation, after } => Error::Timeout {
            operation,
            after: *after,
        },
        Error::NotFound { what, detail } => Error::NotFound {
            what,
            detail: detail.clone(),
        },
        Error::Unavailable { backend, source } => Error::Unavailable {
            backend,
            source: Box::new(ServiceError::new("TransactWriteItems", source.to_string())),
        },
        other => match crate::Throttled::find(other) {
            Some(throttled) => Error::backend(BACKEND, throttled.clone()),
            None => Error::backend(
                BACKEND,
                ServiceError::new("TransactWriteItems", other.to_string()),
            ),
        },
    }
}

#[async_trait]
impl LogStore for DynamoStore {
    fn max_record_bytes(&self) -> usize {
        self.inner.max_value
    }

    async fn append(
        &self,
        log: &Key,
        records: Vec<Vec<u8>>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u64>> {
        let span = tracing::trace_span!(
            "dynamodb.append",
            kind = mcp_persist_core::telemetry::kind_of_log(log),
            records = records.len()
        );
        self.inner
            .append(log.as_str(), records, ttl)
            .instrument(span)
            .await
    }

    async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
        self.inner
            .read_after(log.as_str(), after, limit)
            .instrument(tracing::trace_span!(
                "dynamodb.read_after",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                after
            ))
            .await
    }

    /// One strongly consistent `GetItem` of the log's head item, and no
    /// write: one above the head's last number, or 1 when there is no head.
    /// An append numbers from that head whether the log is live, trimmed,
    /// expired or deleted (an expired or deleted log starts a new life,
    /// numbered on from its head); only a log whose head is gone (swept, or
    /// removed by DynamoDB's TTL) starts at 1 again. A head an append could
    /// not parse or go on from is the same [`Error::Corrupt`].
    async fn next_seq(&self, log: &Key) -> Result<Option<u64>> {
        self.inner
            .next_seq(log.as_str())
            .instrument(tracing::trace_span!(
                "dynamodb.next_seq",
                kind = mcp_persist_core::telemetry::kind_of_log(log)
            ))
            .await
            .map(Some)
    }

    async fn wait_after(
        &self,
        log: &Key,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<LogRecord>> {
        self.inner
            .wait_after(log.as_str(), after, limit, timeout)
            .instrument(tracing::trace_span!(
                "dynamodb.wait_after",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                after
            ))
            .await
    }

    async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
        self.inner
            .trim(log.as_str(), before)
            .instrument(tracing::debug_span!(
                "dynamodb.trim",
                kind = mcp_persist_core::telemetry::kind_of_log(log),
                before
            ))
            .await
    }

    async fn delete_log(&self, log: &Key) -> Result<()> {
        self.inner
            .delete_log(log.as_str())
            .instrument(tracing::debug_span!(
                "dynamodb.delete_log",
                kind = mcp_persist_core::telemetry::kind_of_log(log)
            ))
            .await
    }
}
