//! The [`KvStore`]: one item per key, every write one conditional
//! `UpdateItem`.

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    operation::update_item::UpdateItemError,
    types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure},
};
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, PutMode, PutOptions, Result, Version,
    kit::{self, check_value},
};
use tracing::Instrument;

use crate::{
    BACKEND, Counters, DynamoStore, Inner, SWEEP_MARGIN, TOMBSTONE_KEEP,
    item::{
        self, DATA, EXPIRES, Item, PK, SK, TTL, TTL_ALIAS, VERSION, WRITER, kv_pk, millis, n, s,
    },
};

/// The value of DynamoDB's TTL attribute for a record expiring at
/// `expires_ms`: its second, rounded up, plus the sweep margin.
pub(crate) fn ttl_attribute(expires_ms: u64) -> u64 {
    kit::expires_at_secs(
        mcp_persist_core::Timestamp::from_unix_millis(expires_ms).plus(SWEEP_MARGIN),
    )
}

/// The first version of a key without an item: the clock in microseconds
/// (DynamoDB sets `v = if_not_exists(v, floor) + 1`).
fn version_floor(now_ms: u64) -> u64 {
    now_ms.saturating_mul(1000)
}

/// An expression with its placeholders, so that only values that are used
/// are sent (DynamoDB refuses unused ones).
#[derive(Default)]
pub(crate) struct Expr {
    pub(crate) values: Vec<(&'static str, AttributeValue)>,
    pub(crate) uses_ttl: bool,
}

impl Expr {
    pub(crate) fn value(&mut self, name: &'static str, value: AttributeValue) -> &'static str {
        self.values.push((name, value));
        name
    }
}

/// A live record read from an item: `None` when absent, a tombstone or
/// expired at `now_ms`.
pub(crate) fn live_entry(item: &Item, key: &str, now_ms: u64) -> Result<Option<KvEntry>> {
    let Some(value) = item::bytes(item, DATA, key)? else {
        return Ok(None);
    };
    if let Some(expires) = item::number(item, EXPIRES, key)?
        && expires <= now_ms
    {
        return Ok(None);
    }
    let version = item::number(item, VERSION, key)?
        .ok_or_else(|| Error::corrupt(key, "the record has no version"))?;
    Ok(Some(KvEntry::new(value, Version::new(version))))
}

impl Inner {
    async fn update(
        &self,
        key: &str,
        update: String,
        condition: Option<String>,
        expr: Expr,
    ) -> std::result::Result<Item, UpdateOutcome> {
        Counters::bump(&self.counters.update_item);
        let mut call = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, s(kv_pk(key)))
            .key(SK, n(0))
            .update_expression(update)
            .set_condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if expr.uses_ttl {
            call = call.expression_attribute_names(TTL_ALIAS, TTL);
        }
        for (name, value) in expr.values {
            call = call.expression_attribute_values(name, value);
        }
        match call.send().await {
            Ok(out) => Ok(out.attributes.unwrap_or_default()),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => Err(
                    UpdateOutcome::ConditionFailed(failed.item().cloned().unwrap_or_default()),
                ),
                _ => Err(UpdateOutcome::Failed(self.sdk_error("UpdateItem", e))),
            },
        }
    }

    pub(crate) async fn get(&self, key: &str) -> Result<Option<KvEntry>> {
        Counters::bump(&self.counters.get_item);
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, s(kv_pk(key)))
            .key(SK, n(0))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.sdk_error("GetItem", e))?;
        match out.item() {
            Some(found) => live_entry(found, key, millis(kit::now())),
            None => Ok(None),
        }
    }

    pub(crate) async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        options: PutOptions,
    ) -> Result<Version> {
        check_value(&value, self.max_value)?;
        let now = millis(kit::now());
        let token = item::random_u64();
        let mut expr = Expr::default();
        let mut update = format!(
            "SET {DATA} = {}, {VERSION} = if_not_exists({VERSION}, {}) + {}, {WRITER} = {}",
            expr.value(":d", AttributeValue::B(value.into())),
            expr.value(":floor", n(version_floor(now))),
            expr.value(":one", n(1)),
            expr.value(":w", n(token)),
        );
        expr.uses_ttl = true;
        match options.ttl {
            Some(ttl) => {
                let expires = millis(kit::expires_at(ttl));
                update.push_str(&format!(
                    ", {EXPIRES} = {}, {TTL_ALIAS} = {}",
                    expr.value(":x", n(expires)),
                    expr.value(":t", n(ttl_attribute(expires))),
                ));
            }
            None => update.push_str(&format!(" REMOVE {EXPIRES}, {TTL_ALIAS}")),
        }
        let condition = match options.mode {
            PutMode::Overwrite => None,
            PutMode::Create => Some(format!(
                "attribute_not_exists({DATA}) OR {EXPIRES} <= {}",
                expr.value(":now", n(now))
            )),
            PutMode::Update(version) => Some(format!(
                "{VERSION} = {} AND attribute_exists({DATA}) AND \
                 (attribute_not_exists({EXPIRES}) OR {EXPIRES} > {})",
                expr.value(":ver", n(version.get())),
                expr.value(":now", n(now)),
            )),
        };
        match self.update(key, update, condition, expr).await {
            Ok(written) => item::number(&written, VERSION, key)?
                .map(Version::new)
                .ok_or_else(|| Error::corrupt(key, "the write returned no version")),
            Err(UpdateOutcome::ConditionFailed(current)) => {
                if item::number(&current, WRITER, key)? == Some(token) {
                    // An earlier attempt of this very call landed; its
                    // answer was lost and the SDK tried again.
                    tracing::debug!(key, "a retried write had landed already");
                    return item::number(&current, VERSION, key)?
                        .map(Version::new)
                        .ok_or_else(|| Error::corrupt(key, "the record has no version"));
                }
                match options.mode {
                    PutMode::Create => Err(Error::AlreadyExists { key: key.into() }),
                    _ => Err(Error::Conflict { key: key.into() }),
                }
            }
            Err(UpdateOutcome::Failed(e)) => Err(e),
        }
    }

    pub(crate) async fn delete(&self, key: &str, if_version: Option<Version>) -> Result<bool> {
        let now = millis(kit::now());
        let token = item::random_u64();
        let mut expr = Expr {
            uses_ttl: true,
            ..Expr::default()
        };
        let reap = kit::expires_at_secs(kit::now().plus(TOMBSTONE_KEEP));
        let update = format!(
            "REMOVE {DATA}, {EXPIRES} SET {TTL_ALIAS} = {}, {WRITER} = {}",
            expr.value(":t", n(reap)),
            expr.value(":w", n(token)),
        );
        let mut condition = format!(
            "attribute_exists({DATA}) AND (attribute_not_exists({EXPIRES}) OR {EXPIRES} > {})",
            expr.value(":now", n(now))
        );
        if let Some(version) = if_version {
            condition.push_str(&format!(
                " AND {VERSION} = {}",
                expr.value(":ver", n(version.get()))
            ));
        }
        match self.update(key, update, Some(condition), expr).await {
            Ok(_) => Ok(true),
            Err(UpdateOutcome::ConditionFailed(current)) => {
                if item::number(&current, WRITER, key)? == Some(token) {
                    return Ok(true);
                }
                match if_version {
                    Some(_) => Err(Error::Conflict { key: key.into() }),
                    None => Ok(false),
                }
            }
            Err(UpdateOutcome::Failed(e)) => Err(e),
        }
    }

    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let now = millis(kit::now());
        let mut keys = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            Counters::bump(&self.counters.scan);
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .projection_expression(PK)
                .filter_expression(format!(
                    "begins_with({PK}, :p) AND attribute_exists({DATA}) AND \
                     (attribute_not_exists({EXPIRES}) OR {EXPIRES} > :now)"
                ))
                .expression_attribute_values(":p", s(kv_pk(prefix)))
                .expression_attribute_values(":now", n(now))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| self.sdk_error("Scan", e))?;
            for found in out.items() {
                if let Some(AttributeValue::S(pk)) = found.get(PK)
                    && let Some(text) = pk.strip_prefix('k')
                {
                    keys.push(Key::new(text).map_err(|e| Error::Corrupt {
                        key: text.to_owned(),
                        reason: "an item's key is not a valid key".into(),
                        source: Some(Box::new(e)),
                    })?);
                }
            }
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => break,
            }
        }
        keys.sort();
        Ok(keys)
    }
}

pub(crate) enum UpdateOutcome {
    /// The condition did not hold; the item as it is (empty if absent).
    ConditionFailed(Item),
    Failed(Error),
}

#[async_trait]
impl Backend for DynamoStore {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    async fn sweep_expired(&self) -> Result<u64> {
        self.inner
            .sweep()
            .instrument(tracing::debug_span!("dynamodb.sweep", table = %self.inner.table))
            .await
    }
}

#[async_trait]
impl KvStore for DynamoStore {
    fn max_value_bytes(&self) -> usize {
        self.inner.max_value
    }

    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        self.inner
            .get(key.as_str())
            .instrument(tracing::trace_span!(
                "dynamodb.get",
                kind = mcp_persist_core::telemetry::kind_of_key(key)
            ))
            .await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let span = tracing::trace_span!("dynamodb.put", kind = mcp_persist_core::telemetry::kind_of_key(key), bytes = value.len(), mode = ?options.mode);
        self.inner
            .put(key.as_str(), value, options)
            .instrument(span)
            .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        self.inner
            .delete(key.as_str(), if_version)
            .instrument(tracing::trace_span!(
                "dynamodb.delete",
                kind = mcp_persist_core::telemetry::kind_of_key(key)
            ))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.inner
            .list(prefix)
            .instrument(tracing::debug_span!("dynamodb.list", prefix))
            .await
    }
}
