//! Records: the `KvStore` half of [`RedisStore`], and its sweep.

use crate::{
    conn::scan_all,
    error::{self, BACKEND},
    scripts::{self, DELETE, PUT},
    wire::{bytes_of, millis, parse_record, parse_u64, status_of, unexpected},
};
use async_trait::async_trait;
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, PutMode, PutOptions, Result, Version,
    backend::DEFAULT_MAX_VALUE_BYTES, kit::check_value,
};
use redis::Value;
use tracing::{Instrument, debug_span};

use super::*;

#[async_trait]
impl Backend for RedisStore {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }
}

#[async_trait]
impl KvStore for RedisStore {
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let record = self.inner.layout.record(key);
        let work = async {
            let reply: Value = redis::cmd("GET")
                .arg(&record)
                .query_async(&mut self.conn())
                .await
                .map_err(|e| error::map(e, key))?;
            match reply {
                Value::Nil => Ok(None),
                Value::BulkString(raw) => parse_record(key, raw).map(Some),
                _ => Err(unexpected(key, "GET did not return a string")),
            }
        };
        self.bounded("get", work)
            .instrument(debug_span!(
                "redis.get",
                kind = mcp_persist_core::telemetry::kind_of_key(key)
            ))
            .await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions { mode, ttl, .. } = options;
        check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
        let layout = &self.inner.layout;
        let (record, version) = (layout.record(key), layout.version(key));
        let (mode_arg, expected) = match mode {
            PutMode::Overwrite => ("o", String::new()),
            PutMode::Create => ("c", String::new()),
            PutMode::Update(v) => ("u", v.get().to_string()),
        };
        let ttl_ms = ttl.map(millis);
        let ttl_arg = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
        let companion_arg = ttl_ms
            .map(|t| t.saturating_add(millis(VERSION_MEMORY)).to_string())
            .unwrap_or_default();
        let work = async {
            let reply = PUT
                .run(
                    &mut self.conn(),
                    &[&record, &version],
                    &[
                        mode_arg.as_bytes(),
                        expected.as_bytes(),
                        &value,
                        ttl_arg.as_bytes(),
                        companion_arg.as_bytes(),
                    ],
                )
                .await
                .map_err(|e| error::map(e, key))?;
            match status_of(key, &reply)? {
                (scripts::OK, Some(v)) => bytes_of(v)
                    .and_then(parse_u64)
                    .map(Version::new)
                    .ok_or_else(|| unexpected(key, "version is not a number")),
                (scripts::EXISTS, _) => Err(Error::AlreadyExists {
                    key: key.to_string(),
                }),
                (scripts::CONFLICT, _) => Err(Error::Conflict {
                    key: key.to_string(),
                }),
                (scripts::CORRUPT, _) => Err(error::corrupt(
                    key,
                    "the stored record has no valid version header; delete it to write the key again",
                )),
                _ => Err(unexpected(key, "unknown script status")),
            }
        };
        self.bounded("put", work)
            .instrument(debug_span!(
                "redis.put",
                kind = mcp_persist_core::telemetry::kind_of_key(key),
                ?mode
            ))
            .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let layout = &self.inner.layout;
        let (record, version) = (layout.record(key), layout.version(key));
        let expected = if_version.map(|v| v.get().to_string()).unwrap_or_default();
        let grace = millis(VERSION_MEMORY).to_string();
        let work = async {
            let reply = DELETE
                .run(
                    &mut self.conn(),
                    &[&record, &version],
                    &[expected.as_bytes(), grace.as_bytes()],
                )
                .await
                .map_err(|e| error::map(e, key))?;
            match status_of(key, &reply)? {
                (scripts::OK, Some(Value::Int(deleted))) => Ok(*deleted == 1),
                (scripts::CONFLICT, _) => Err(Error::Conflict {
                    key: key.to_string(),
                }),
                _ => Err(unexpected(key, "unknown script status")),
            }
        };
        self.bounded("delete", work)
            .instrument(debug_span!(
                "redis.delete",
                kind = mcp_persist_core::telemetry::kind_of_key(key)
            ))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let layout = &self.inner.layout;
        let pattern = layout.record_pattern(prefix);
        let work = async {
            let found = scan_all(&mut self.conn(), &pattern)
                .await
                .map_err(|e| error::map(e, prefix))?;
            // A foreign Redis key that maps to no valid store key is left out.
            let mut keys: Vec<Key> = found
                .iter()
                .filter_map(|k| layout.key_of_record(k))
                .filter(|k| k.starts_with(prefix))
                .filter_map(|k| Key::new(k).ok())
                .collect();
            keys.sort_unstable();
            keys.dedup();
            Ok(keys)
        };
        self.bounded("list", work)
            .instrument(debug_span!("redis.list", prefix))
            .await
    }
}
