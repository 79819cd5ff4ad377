//! Instance liveness leases: which server instances of a fleet are running.
//!
//! Every instance that runs work on behalf of others (durable tasks, SSE
//! streams other instances replay) keeps one record under
//! `server/instance/<id>` and renews it by compare-and-swap every
//! `renew_every`. Nobody reads the record's clock fields to decide anything:
//! an observer calls an instance dead when its record is gone, or when the
//! record's version has not changed for `grace`, measured on the observer's
//! own monotonic clock. So a wall-clock step on any machine (forward or
//! backward) can neither revive a dead instance nor kill a live one, and the
//! only clock that matters is each observer's steady one.
//!
//! A lease is not an exclusive right by itself: work handed over after an
//! instance was declared dead is fenced by a generation number in the work's
//! own record (see [`TaskStore`](crate::stores::TaskStore)), so an instance
//! that was only paused and comes back cannot overwrite its successor.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{read, write};
use crate::{
    Error, Key, KvStore, PutMode, Result, Version, declare,
    records::Record,
    types::{Timestamp, hex, random_token},
};

/// The stored lease of one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InstanceLease {
    /// The instance's id (random per process).
    pub instance_id: String,
    /// When the instance registered, by its own clock (informational).
    pub started_at: Timestamp,
    /// When it last renewed, by its own clock (informational: observers
    /// never compare it with theirs).
    pub renewed_at: Timestamp,
    /// How often it promised to renew, in milliseconds.
    pub renew_every_ms: u64,
    /// Renewals so far.
    pub beats: u64,
}

impl Record for InstanceLease {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::INSTANCE_LEASE;
}

/// What an observer knows about an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// The lease changed within the grace period (or was first seen now).
    Alive,
    /// The lease is gone, or has not changed for the whole grace period.
    Dead,
}

/// The liveness leases of a fleet, and this process's view of them.
///
/// ```
/// # tokio_test_block_on(async {
/// use std::{sync::Arc, time::Duration};
/// use mcp_persist_core::{MemoryStore, stores::{InstanceLeases, Liveness}};
///
/// let leases = InstanceLeases::new(Arc::new(MemoryStore::new()), Duration::from_millis(50));
/// let me = leases.register().await?;
/// assert_eq!(leases.observe(me.id()).await?, Liveness::Alive);
/// // Nobody renews it: after the grace period an observer calls it dead.
/// tokio::time::sleep(Duration::from_millis(80)).await;
/// assert_eq!(leases.observe(me.id()).await?, Liveness::Dead);
/// # Ok::<(), mcp_persist_core::Error>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct InstanceLeases {
    kv: Arc<dyn KvStore>,
    grace: Duration,
    /// instance id -> (version last seen, when it was first seen at that version)
    seen: Arc<Mutex<HashMap<String, (Version, Instant)>>>,
}

impl std::fmt::Debug for InstanceLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceLeases")
            .field("backend", &self.kv.backend_name())
            .field("grace", &self.grace)
            .finish()
    }
}

/// This process's own lease: renew it at least every
/// [`renew_every`](OwnLease::renew_every).
#[derive(Debug, Clone)]
pub struct OwnLease {
    id: String,
    version: Version,
    renew_every: Duration,
}

impl OwnLease {
    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How often to renew.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
}

impl InstanceLeases {
    /// Leases in `kv`; an instance whose lease has not changed for `grace`
    /// is dead. Instances renew every third of `grace`.
    pub fn new(kv: Arc<dyn KvStore>, grace: Duration) -> Self {
        InstanceLeases {
            kv,
            grace,
            seen: Arc::default(),
        }
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    fn key(id: &str) -> Result<Key> {
        declare::INSTANCE_LEASE.try_key(&[id])
    }

    /// A fresh random instance id (128 bits), to name this process before
    /// it registers.
    pub fn new_instance_id() -> Result<String> {
        Ok(hex(&random_token()?))
    }

    /// Registers this process under a fresh random id.
    pub async fn register(&self) -> Result<OwnLease> {
        self.register_as(Self::new_instance_id()?).await
    }

    /// Registers this process under `id` (from
    /// [`new_instance_id`](InstanceLeases::new_instance_id)).
    pub async fn register_as(&self, id: String) -> Result<OwnLease> {
        let renew_every = (self.grace / 3).max(Duration::from_millis(1));
        let now = Timestamp::now();
        let lease = InstanceLease {
            instance_id: id.clone(),
            started_at: now,
            renewed_at: now,
            renew_every_ms: u64::try_from(renew_every.as_millis()).unwrap_or(u64::MAX),
            beats: 0,
        };
        let version = write(&*self.kv, &Self::key(&id)?, &lease, PutMode::Create, None).await?;
        info!(instance = %id, ?renew_every, "instance lease registered");
        Ok(OwnLease {
            id,
            version,
            renew_every,
        })
    }

    /// Renews `lease`. When the record was removed meanwhile (an observer
    /// declared this instance dead during a long pause), it is written
    /// again and the caller is told so with `Ok(false)`: work it held may
    /// have been handed over, and its own records' generations say which.
    pub async fn renew(&self, lease: &mut OwnLease) -> Result<bool> {
        let key = Self::key(&lease.id)?;
        let current = read::<InstanceLease>(&*self.kv, &key).await?;
        let (mut record, mode, intact) = match current {
            Some(stored) if stored.version == lease.version => {
                (stored.record, PutMode::Update(stored.version), true)
            }
            Some(stored) => (stored.record, PutMode::Update(stored.version), false),
            None => (
                InstanceLease {
                    instance_id: lease.id.clone(),
                    started_at: Timestamp::now(),
                    renewed_at: Timestamp::now(),
                    renew_every_ms: u64::try_from(lease.renew_every.as_millis())
                        .unwrap_or(u64::MAX),
                    beats: 0,
                },
                PutMode::Create,
                false,
            ),
        };
        record.beats = record.beats.saturating_add(1);
        record.renewed_at = Timestamp::now();
        lease.version = write(&*self.kv, &key, &record, mode, None).await?;
        if !intact {
            info!(instance = %lease.id, "instance lease was taken away while paused; registered again");
        }
        Ok(intact)
    }

    /// Removes this process's lease (a clean shutdown): observers call it
    /// dead at once.
    pub async fn release(&self, lease: &OwnLease) -> Result<()> {
        self.kv
            .delete(&Self::key(&lease.id)?, Some(lease.version))
            .await?;
        Ok(())
    }

    /// Whether instance `id` is alive, as far as this observer can tell.
    ///
    /// The first observation of a lease counts as alive; the instance is
    /// dead once the record is gone, or once this observer has seen the same
    /// version for at least the grace period. A dead instance's record is
    /// removed (only if still at the version observed).
    pub async fn observe(&self, id: &str) -> Result<Liveness> {
        let key = Self::key(id)?;
        let Some(entry) = self.kv.get(&key).await? else {
            self.forget(id);
            return Ok(Liveness::Dead);
        };
        let now = Instant::now();
        let stale_since = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            match seen.get(id) {
                Some((version, since)) if *version == entry.version => Some(*since),
                _ => {
                    seen.insert(id.to_owned(), (entry.version, now));
                    None
                }
            }
        };
        match stale_since {
            Some(since) if now.duration_since(since) >= self.grace => {
                debug!(instance = %id, grace = ?self.grace, "instance lease not renewed within the grace period: dead");
                match self.kv.delete(&key, Some(entry.version)).await {
                    Ok(_) | Err(Error::Conflict { .. }) => {}
                    Err(e) => return Err(e),
                }
                self.forget(id);
                Ok(Liveness::Dead)
            }
            _ => Ok(Liveness::Alive),
        }
    }

    fn forget(&self, id: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// The ids of every registered instance (live or not yet observed dead).
    pub async fn list(&self) -> Result<Vec<String>> {
        let keys = self.kv.list(declare::INSTANCE_LEASE.prefix).await?;
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(stored) = read::<InstanceLease>(&*self.kv, &key).await? {
                ids.push(stored.record.instance_id);
            }
        }
        Ok(ids)
    }
}
