//! [`ToolLock`]: one operator tool at a time on a store.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::{read, write};
use crate::{
    Error, Key, KvStore, PutMode, Result, Version, declare, records::Record, types::Timestamp,
};

/// Who holds a tool lock, and since when.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ToolLockRecord {
    holder: String,
    taken_at: Timestamp,
}

impl Record for ToolLockRecord {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::TOOL_LOCK;
}

/// A lease that lets one operator tool at a time work on a store (a `copy`
/// into it, say), on any backend: a record created only if absent, with a
/// TTL, renewed by compare-and-swap while held.
///
/// A holder that stops renewing (killed, hung, cut off) loses the lock once
/// the TTL has run out; a holder whose renewal fails sees [`lost`](Self::lost)
/// turn true and must stop before it writes more. Release deletes the record
/// only while it is still this holder's.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::{sync::Arc, time::Duration};
/// use mcp_persist_core::{MemoryStore, stores::ToolLock};
/// let kv = Arc::new(MemoryStore::new());
/// let held = ToolLock::try_acquire(kv.clone(), "copy", "copy by pid 1", Duration::from_secs(10))
///     .await?
///     .expect("free");
/// let second = ToolLock::try_acquire(kv.clone(), "copy", "copy by pid 2", Duration::from_secs(10)).await?;
/// assert!(second.is_none());
/// assert_eq!(ToolLock::holder(&*kv, "copy").await?.as_deref(), Some("copy by pid 1"));
/// held.release().await?;
/// assert!(ToolLock::holder(&*kv, "copy").await?.is_none());
/// # Ok::<_, mcp_persist_core::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct ToolLock {
    kv: Arc<dyn KvStore>,
    key: Key,
    version: Arc<std::sync::Mutex<Version>>,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl ToolLock {
    /// Takes the lock `name` for `holder` (a description for whoever waits,
    /// no secret), held `ttl` past each renewal (renewed every fifth of
    /// it). `None` when someone else holds it.
    pub async fn try_acquire(
        kv: Arc<dyn KvStore>,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<ToolLock>> {
        let key = declare::TOOL_LOCK.try_key(&[name])?;
        let record = ToolLockRecord {
            holder: holder.to_owned(),
            taken_at: Timestamp::now(),
        };
        let version = match write(&*kv, &key, &record, PutMode::Create, Some(ttl)).await {
            Ok(version) => version,
            Err(Error::AlreadyExists { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        debug!(lock = name, "tool lock taken");
        let version = Arc::new(std::sync::Mutex::new(version));
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = {
            let (kv, key, version, lost) = (kv.clone(), key.clone(), version.clone(), lost.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 5).await;
                    let current = *version.lock().unwrap_or_else(|p| p.into_inner());
                    match write(&*kv, &key, &record, PutMode::Update(current), Some(ttl)).await {
                        Ok(next) => *version.lock().unwrap_or_else(|p| p.into_inner()) = next,
                        Err(e) => {
                            warn!(lock = %key, error = %e, "tool lock lost: its renewal failed");
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            })
        };
        Ok(Some(ToolLock {
            kv,
            key,
            version,
            lost,
            renewer,
        }))
    }

    /// Who holds the lock `name` now, if anyone.
    pub async fn holder(kv: &dyn KvStore, name: &str) -> Result<Option<String>> {
        let key = declare::TOOL_LOCK.try_key(&[name])?;
        Ok(read::<ToolLockRecord>(kv, &key)
            .await?
            .map(|s| s.record.holder))
    }

    /// Whether a renewal failed: the lock may be someone else's now.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Gives the lock back, if it is still this holder's.
    pub async fn release(self) -> Result<()> {
        self.renewer.abort();
        let version = *self.version.lock().unwrap_or_else(|p| p.into_inner());
        match self.kv.delete(&self.key, Some(version)).await {
            Ok(_) | Err(Error::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
