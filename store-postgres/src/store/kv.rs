//! Records: the `KvStore` half of [`PostgresStore`], and its sweep.

use crate::error::{self, NAME};
use async_trait::async_trait;
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, PutMode, PutOptions, Result, Version,
    backend::DEFAULT_MAX_VALUE_BYTES,
    kit::{self, check_value},
};

use super::*;

#[async_trait]
impl Backend for PostgresStore {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    /// Deletes records and logs that expired more than
    /// [`SWEEP_MARGIN`](kit::SWEEP_MARGIN) ago by the server's clock.
    async fn sweep_expired(&self) -> Result<u64> {
        let margin = i64::try_from(kit::SWEEP_MARGIN.as_millis()).unwrap_or(i64::MAX);
        let rows = self
            .query("sweep", "(sweep)", &self.inner.sql.sweep, &[&margin])
            .await?;
        let removed: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(u64::try_from(removed).unwrap_or(0))
    }
}

#[async_trait]
impl KvStore for PostgresStore {
    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let rows = self
            .query(
                "get",
                key,
                &self.inner.sql.get,
                &[&key.as_str(), &limit_param()],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let value: Option<Vec<u8>> = row.get(0);
        let len: i32 = row.get(1);
        let version: i64 = row.get(2);
        let Some(value) = value else {
            return Err(planted(key, len));
        };
        let version = u64::try_from(version)
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| error::bad_row(key, format!("the invalid version {version}")))?;
        Ok(Some(KvEntry::new(value, Version::new(version))))
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        check_value(&value, DEFAULT_MAX_VALUE_BYTES)?;
        let (mode, expect): (i32, Option<i64>) = match options.mode {
            PutMode::Overwrite => (0, None),
            PutMode::Create => (1, None),
            PutMode::Update(v) => match i64::try_from(v.get()) {
                Ok(v) => (2, Some(v)),
                // No version this store hands out is that large.
                Err(_) => {
                    return Err(Error::Conflict {
                        key: key.to_string(),
                    });
                }
            },
        };
        let ttl = options.ttl.map(ttl_ms);
        let sql = if options.unsynced {
            &self.inner.sql.put_unsynced
        } else {
            &self.inner.sql.put
        };
        let rows = self
            .query(
                "put",
                key,
                sql,
                &[&key.as_str(), &value, &mode, &expect, &ttl],
            )
            .await?;
        let result: i64 = rows.first().map_or(0, |r| r.get(0));
        match result {
            -1 => Err(Error::AlreadyExists {
                key: key.to_string(),
            }),
            -2 => Err(Error::Conflict {
                key: key.to_string(),
            }),
            n if n > 0 => Ok(Version::new(n.cast_unsigned())),
            n => Err(error::bad_row(
                key,
                format!(
                    "a put that returned {n} (the store's functions were changed outside mcp-persist)"
                ),
            )),
        }
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        match if_version {
            None => {
                let rows = self
                    .query("delete", key, &self.inner.sql.delete, &[&key.as_str()])
                    .await?;
                Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
            }
            Some(want) => {
                let Ok(want) = i64::try_from(want.get()) else {
                    return Err(Error::Conflict {
                        key: key.to_string(),
                    });
                };
                let target = &self.inner.target;
                let deleted = self
                    .bounded("delete", async {
                        let client = self.client().await?;
                        let stmt = client
                            .prepare_cached(&self.inner.sql.delete_if)
                            .await
                            .map_err(|e| error::map(e, target, key))?;
                        client
                            .execute(&stmt, &[&key.as_str(), &want])
                            .await
                            .map_err(|e| error::map(e, target, key))
                    })
                    .await?;
                if deleted == 1 {
                    Ok(true)
                } else {
                    Err(Error::Conflict {
                        key: key.to_string(),
                    })
                }
            }
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let rows = self
            .query("list", prefix, &self.inner.sql.list, &[&prefix])
            .await?;
        rows.iter()
            .map(|row| {
                let key: &str = row.get(0);
                Key::new(key).map_err(|e| {
                    Error::corrupt(
                        key,
                        format!("a stored key that no store could have written: {e}"),
                    )
                })
            })
            .collect()
    }
}
