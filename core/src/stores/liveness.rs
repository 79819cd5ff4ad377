//! Instance liveness: which server instances of a fleet are running. The
//! rules are documented on [`InstanceLeases`].

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{read, write};
use crate::{
    Error, Key, KvStore, LogStore, PutMode, Result, Version, declare,
    records::{Record, decode, encode},
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

/// One record of the fleet's shared heartbeat log ([`HEARTBEAT`](crate::declare::HEARTBEAT)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Heartbeat {
    /// The instance that was alive when this was appended.
    pub instance_id: String,
    /// The instance shut down cleanly: dead from here on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

impl Record for Heartbeat {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::HEARTBEAT;
}

/// What an observer knows about an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// Seen alive within the grace period (or not decidable yet).
    Alive,
    /// Released, or silent for at least the grace period.
    Dead,
}

/// The liveness leases of a fleet, and this process's view of them.
///
/// Every instance that runs work on behalf of others (durable tasks, SSE
/// streams other instances replay) keeps a lease record under
/// `server/instance/<id>`: written when it registers, renewed every
/// [`renew_every`](OwnLease::renew_every), deleted when it shuts down cleanly
/// (then it is dead for every observer at once).
///
/// **Heartbeats** (when the stores route a log, as a server's do): each
/// instance also appends a small record to the shared log `server/heartbeats`
/// every [`heartbeat_every`](InstanceLeases::heartbeat_every) (a twelfth of
/// the grace period). The log orders every heartbeat of the fleet, and an
/// observer uses its *own* heartbeats as its clock: it takes its latest
/// heartbeat that completed at least `grace` ago on its own monotonic clock,
/// and an instance that appended nothing after that one has been silent for
/// at least `grace`: dead. No stored time is read and no two clocks are
/// compared, so a wall-clock step on any machine (forward or backward) can
/// neither revive a dead instance nor kill a live one; and an observer that
/// never looked at an instance before decides at once, without watching it
/// for a grace period first. So a killed instance is dead for everyone about
/// `grace` plus one heartbeat after its last heartbeat, while a live one whose
/// store writes stall for up to `grace` minus one heartbeat (and some
/// scheduling slack) stays alive. An observer that has no heartbeat of its
/// own old enough (it started less than `grace` ago, or its own appends are
/// stalled) calls every registered instance alive.
///
/// **Without a log** (key-value stores only), an observer calls an instance
/// dead when the version of its lease record has not changed for `grace`,
/// measured on the observer's own monotonic clock from its first look.
///
/// A lease is not an exclusive right by itself: work handed over after an
/// instance was declared dead is fenced by a generation number in the work's
/// own record (see [`TaskStore`](crate::stores::TaskStore)), so an instance
/// that was only paused and comes back cannot overwrite its successor.
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
    /// instance id -> (version last seen, when it was first seen at that
    /// version): the key-value-only rule.
    seen: Arc<Mutex<HashMap<String, (Version, Instant)>>>,
    /// The heartbeat log, when the stores route one.
    heartbeats: Option<Heartbeats>,
}

/// The shared heartbeat log and this process's view of it.
#[derive(Clone)]
struct Heartbeats {
    log: Arc<dyn LogStore>,
    view: Arc<Mutex<BeatView>>,
    /// Held by the one observer reading the log, so that many observations
    /// at once cost one read.
    reading: Arc<tokio::sync::Mutex<()>>,
}

/// One of this process's own heartbeats: the clock observers read.
#[derive(Debug, Clone, Copy)]
struct OwnBeat {
    seq: u64,
    issued: Instant,
    completed: Instant,
}

#[derive(Default)]
struct BeatView {
    /// This process's heartbeats, oldest first.
    own: VecDeque<OwnBeat>,
    /// Own heartbeats since the last trim.
    since_trim: u64,
    /// The log has been read through this position...
    read_through: u64,
    /// ...by a read that started at this instant.
    read_at: Option<Instant>,
    /// The newest heartbeat position seen per instance.
    latest: HashMap<String, u64>,
    /// Instances that released their lease.
    released: HashSet<String>,
    /// Instances already found dead (their lease record removed once).
    buried: HashSet<String>,
}

impl BeatView {
    /// The latest own heartbeat that completed at least `grace` before
    /// `at`, if it was issued recently enough that no trim can have removed
    /// the records after it.
    fn reference(&self, at: Instant, grace: Duration) -> Option<OwnBeat> {
        let cutoff = at.checked_sub(grace)?;
        let beat = self.own.iter().rev().find(|b| b.completed <= cutoff)?;
        let oldest_usable = at.checked_sub(grace * REFERENCE_AGE_LIMIT)?;
        (beat.issued >= oldest_usable).then_some(*beat)
    }
}

impl std::fmt::Debug for InstanceLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceLeases")
            .field("backend", &self.kv.backend_name())
            .field("grace", &self.grace)
            .field(
                "heartbeats",
                &self.heartbeats.as_ref().map(|h| h.log.backend_name()),
            )
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

/// The shared heartbeat log.
fn heartbeat_log() -> Key {
    declare::HEARTBEAT.key(&[])
}
/// Heartbeats per grace period.
const BEATS_PER_GRACE: u32 = 12;
/// An own heartbeat issued longer ago than this many grace periods is no
/// reference (records after it may have been trimmed).
const REFERENCE_AGE_LIMIT: u32 = 3;
/// Records older than this many grace periods are trimmed from the log.
const TRIM_AGE: u32 = 10;
/// Own heartbeats between two trims.
const TRIM_EVERY: u64 = 256;
/// The least time the heartbeat log outlives its last append.
const MIN_LOG_TTL: Duration = Duration::from_secs(60);
/// Records read per request when catching up with the log.
const READ_BATCH: usize = 1024;

impl InstanceLeases {
    /// Leases in `kv`; an instance whose lease has not changed for `grace`
    /// is dead. Instances renew every third of `grace`. See
    /// [`with_heartbeats`](Self::with_heartbeats) for the faster rule.
    pub fn new(kv: Arc<dyn KvStore>, grace: Duration) -> Self {
        InstanceLeases {
            kv,
            grace,
            seen: Arc::default(),
            heartbeats: None,
        }
    }

    /// The same leases, deciding liveness by heartbeats in `log` (see the
    /// [type docs](InstanceLeases)): instances append one every
    /// [`heartbeat_every`](Self::heartbeat_every) with
    /// [`heartbeat`](Self::heartbeat), and an observer must itself be a
    /// registered instance that does so.
    pub fn with_heartbeats(mut self, log: Arc<dyn LogStore>) -> Self {
        self.heartbeats = Some(Heartbeats {
            log,
            view: Arc::default(),
            reading: Arc::default(),
        });
        self
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// How often an instance appends a heartbeat (a twelfth of the grace
    /// period), or `None` without a heartbeat log.
    pub fn heartbeat_every(&self) -> Option<Duration> {
        self.heartbeats
            .as_ref()
            .map(|_| (self.grace / BEATS_PER_GRACE).max(Duration::from_millis(1)))
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
    /// [`new_instance_id`](InstanceLeases::new_instance_id)). With
    /// heartbeats, the first one is appended before the lease is written, so
    /// an observer that finds the lease also finds a heartbeat.
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
        self.append_beat(&id, false).await?;
        let version = write(&*self.kv, &Self::key(&id)?, &lease, PutMode::Create, None).await?;
        info!(instance = %id, ?renew_every, heartbeat_every = ?self.heartbeat_every(), "instance lease registered");
        Ok(OwnLease {
            id,
            version,
            renew_every,
        })
    }

    /// Appends a heartbeat of `lease`'s instance (no-op without a heartbeat
    /// log). Committed when it returns; not synced to disk (a heartbeat lost
    /// to a power cut belongs to an instance that is gone anyway).
    pub async fn heartbeat(&self, lease: &OwnLease) -> Result<()> {
        self.append_beat(&lease.id, false).await
    }

    async fn append_beat(&self, id: &str, released: bool) -> Result<()> {
        let Some(beats) = &self.heartbeats else {
            return Ok(());
        };
        let bytes = encode(&Heartbeat {
            instance_id: id.to_owned(),
            released,
        })?;
        let ttl = MIN_LOG_TTL.max(self.grace * TRIM_AGE * 2);
        let issued = Instant::now();
        let seqs = beats
            .log
            .append_unsynced(&heartbeat_log(), vec![bytes], Some(ttl))
            .await?;
        let completed = Instant::now();
        let seq = *seqs.first().ok_or_else(|| {
            Error::backend(
                beats.log.backend_name(),
                "append returned no sequence number",
            )
        })?;
        let trim_before = {
            let mut view = beats.view.lock().unwrap_or_else(|p| p.into_inner());
            if view.own.back().is_some_and(|last| last.seq >= seq) {
                // The log was deleted and started over (it expired while no
                // instance appended, or an operator removed it): what was
                // read of the old one means nothing for the new one.
                warn!(
                    seq,
                    "the heartbeat log started over; forgetting what was read of it"
                );
                *view = BeatView::default();
            }
            view.own.push_back(OwnBeat {
                seq,
                issued,
                completed,
            });
            let keep = self.grace * (TRIM_AGE + 2);
            while view
                .own
                .front()
                .is_some_and(|b| completed.duration_since(b.completed) > keep)
            {
                view.own.pop_front();
            }
            view.since_trim += 1;
            if view.since_trim >= TRIM_EVERY {
                view.since_trim = 0;
                let cutoff = completed.checked_sub(self.grace * TRIM_AGE);
                cutoff.and_then(|cutoff| {
                    view.own
                        .iter()
                        .rev()
                        .find(|b| b.completed <= cutoff)
                        .map(|b| b.seq)
                })
            } else {
                None
            }
        };
        if let Some(before) = trim_before {
            match beats.log.trim(&heartbeat_log(), before).await {
                Ok(dropped) => debug!(dropped, "heartbeat log trimmed"),
                Err(e) => warn!(error = %e, "trimming the heartbeat log failed"),
            }
        }
        Ok(())
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
        self.append_beat(&lease.id, true).await?;
        self.kv
            .delete(&Self::key(&lease.id)?, Some(lease.version))
            .await?;
        Ok(())
    }

    /// Whether instance `id` is alive, as far as this observer can tell
    /// (see the [type docs](InstanceLeases) for the rule). An instance found dead
    /// has its lease record removed (only if still at the version seen).
    pub async fn observe(&self, id: &str) -> Result<Liveness> {
        match &self.heartbeats {
            Some(beats) => self.observe_heartbeats(beats, id).await,
            None => self.observe_versions(id).await,
        }
    }

    /// The key-value-only rule: dead once the lease is gone or has kept one
    /// version for the grace period on this observer's clock.
    async fn observe_versions(&self, id: &str) -> Result<Liveness> {
        let key = Self::key(id)?;
        // Taken before the read: a read that answers late can only make
        // the lease look fresher, never staler.
        let now = Instant::now();
        let Some(entry) = self.kv.get(&key).await? else {
            self.forget(id);
            return Ok(Liveness::Dead);
        };
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

    /// The heartbeat rule: dead once released, or silent since this
    /// process's reference heartbeat.
    async fn observe_heartbeats(&self, beats: &Heartbeats, id: &str) -> Result<Liveness> {
        self.catch_up(beats).await?;
        let verdict = {
            let view = beats.view.lock().unwrap_or_else(|p| p.into_inner());
            let Some(read_at) = view.read_at else {
                return Ok(Liveness::Alive);
            };
            if view.released.contains(id) {
                Some("released")
            } else {
                match view.reference(read_at, self.grace) {
                    // Not decidable yet: this process has no heartbeat old
                    // enough to measure a grace period against.
                    None => None,
                    Some(reference) if view.latest.get(id).is_some_and(|&s| s > reference.seq) => {
                        None
                    }
                    Some(_) => Some("silent for the grace period"),
                }
            }
        };
        let Some(why) = verdict else {
            return Ok(Liveness::Alive);
        };
        let first = beats
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .buried
            .insert(id.to_owned());
        if first {
            info!(instance = %id, why, grace = ?self.grace, "instance is dead");
            let key = Self::key(id)?;
            if let Some(entry) = self.kv.get(&key).await? {
                match self.kv.delete(&key, Some(entry.version)).await {
                    Ok(_) | Err(Error::Conflict { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Liveness::Dead)
    }

    /// Reads the heartbeats appended since the last read, unless a read
    /// started less than half a heartbeat ago (then its result stands).
    async fn catch_up(&self, beats: &Heartbeats) -> Result<()> {
        let every = self.heartbeat_every().unwrap_or(self.grace);
        let fresh = |view: &BeatView| {
            view.read_at
                .is_some_and(|at| Instant::now().duration_since(at) < every / 2)
        };
        if fresh(&beats.view.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(());
        }
        let _reading = beats.reading.lock().await;
        let (mut after, started) = {
            let view = beats.view.lock().unwrap_or_else(|p| p.into_inner());
            if fresh(&view) {
                return Ok(());
            }
            // Taken before the read: everything appended before this
            // instant is in what the read returns.
            let started = Instant::now();
            // Records at or before the reference heartbeat decide nothing:
            // skip them when this observer has not read for a while.
            let skip_to = view.reference(started, self.grace).map_or(0, |r| r.seq);
            (view.read_through.max(skip_to), started)
        };
        let mut seen: Vec<(u64, Heartbeat)> = Vec::new();
        loop {
            let records = beats
                .log
                .read_after(&heartbeat_log(), after, READ_BATCH)
                .await?;
            let count = records.len();
            for record in records {
                after = after.max(record.seq);
                match decode::<Heartbeat>(
                    &format!("{}#{}", heartbeat_log(), record.seq),
                    &record.data,
                ) {
                    Ok(beat) => seen.push((record.seq, beat)),
                    Err(e) => warn!(seq = record.seq, error = %e, "unreadable heartbeat skipped"),
                }
            }
            if count < READ_BATCH {
                break;
            }
        }
        let mut view = beats.view.lock().unwrap_or_else(|p| p.into_inner());
        for (seq, beat) in seen {
            if beat.released {
                view.released.insert(beat.instance_id);
            } else {
                view.released.remove(&beat.instance_id);
                view.buried.remove(&beat.instance_id);
                let latest = view.latest.entry(beat.instance_id).or_default();
                *latest = (*latest).max(seq);
            }
        }
        view.read_through = view.read_through.max(after);
        view.read_at = Some(view.read_at.map_or(started, |at| at.max(started)));
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    const GRACE: Duration = Duration::from_millis(300);

    /// One process's view of a fleet on `store`, with heartbeats.
    fn process(store: &Arc<MemoryStore>) -> InstanceLeases {
        InstanceLeases::new(store.clone(), GRACE).with_heartbeats(store.clone())
    }

    /// Heartbeats of every `(view, lease)` for `how_long`, one every
    /// heartbeat period.
    async fn beat_for(beating: &[(&InstanceLeases, &OwnLease)], how_long: Duration) {
        let every = GRACE / BEATS_PER_GRACE;
        let end = Instant::now() + how_long;
        while Instant::now() < end {
            for (view, lease) in beating {
                view.heartbeat(lease).await.expect("heartbeat");
            }
            tokio::time::sleep(every).await;
        }
    }

    #[tokio::test]
    async fn an_observer_decides_at_its_first_look() {
        let store = Arc::new(MemoryStore::new());
        let (watcher, worker) = (process(&store), process(&store));
        let me = watcher.register().await.expect("register");
        let it = worker.register().await.expect("register");
        beat_for(&[(&watcher, &me), (&worker, &it)], GRACE * 2).await;
        assert_eq!(
            watcher.observe(it.id()).await.expect("observe"),
            Liveness::Alive
        );

        // The worker stops; a fresh observer (heartbeating all along but
        // never looking before) needs no grace period of its own watching.
        let fresh = process(&store);
        let mine = fresh.register().await.expect("register");
        beat_for(&[(&watcher, &me), (&fresh, &mine)], GRACE * 2).await;
        assert_eq!(
            fresh.observe(it.id()).await.expect("observe"),
            Liveness::Dead
        );
        assert_eq!(
            watcher.observe(it.id()).await.expect("observe"),
            Liveness::Dead
        );
        assert!(
            store
                .get(&InstanceLeases::key(it.id()).expect("a valid id"))
                .await
                .expect("get")
                .is_none(),
            "a dead instance's lease record is removed"
        );
        // It was only paused: its next heartbeat makes it alive again.
        worker.heartbeat(&it).await.expect("heartbeat");
        tokio::time::sleep(GRACE / BEATS_PER_GRACE).await;
        assert_eq!(
            fresh.observe(it.id()).await.expect("observe"),
            Liveness::Alive
        );
    }

    #[tokio::test]
    async fn a_stall_shorter_than_the_grace_period_is_survived() {
        let store = Arc::new(MemoryStore::new());
        let (watcher, worker) = (process(&store), process(&store));
        let me = watcher.register().await.expect("register");
        let it = worker.register().await.expect("register");
        beat_for(&[(&watcher, &me), (&worker, &it)], GRACE * 2).await;
        // The worker's heartbeats stop for half the grace period while the
        // watcher looks at every heartbeat.
        for _ in 0..3 {
            let stall_end = Instant::now() + GRACE / 2;
            while Instant::now() < stall_end {
                beat_for(&[(&watcher, &me)], GRACE / BEATS_PER_GRACE).await;
                assert_eq!(
                    watcher.observe(it.id()).await.expect("observe"),
                    Liveness::Alive
                );
            }
            beat_for(&[(&watcher, &me), (&worker, &it)], GRACE / 4).await;
            assert_eq!(
                watcher.observe(it.id()).await.expect("observe"),
                Liveness::Alive
            );
        }
    }

    #[tokio::test]
    async fn released_is_dead_at_once_and_no_history_decides_nothing() {
        let store = Arc::new(MemoryStore::new());
        let (watcher, worker) = (process(&store), process(&store));
        let me = watcher.register().await.expect("register");
        let it = worker.register().await.expect("register");
        // The watcher has no heartbeat a grace period old: it cannot tell a
        // silent instance from a live one yet.
        assert_eq!(
            watcher.observe("never-registered").await.expect("observe"),
            Liveness::Alive
        );
        beat_for(&[(&watcher, &me), (&worker, &it)], GRACE * 2).await;
        assert_eq!(
            watcher.observe("never-registered").await.expect("observe"),
            Liveness::Dead
        );
        assert_eq!(
            watcher.observe(it.id()).await.expect("observe"),
            Liveness::Alive
        );
        worker.release(&it).await.expect("release");
        tokio::time::sleep(GRACE / BEATS_PER_GRACE).await;
        assert_eq!(
            watcher.observe(it.id()).await.expect("observe"),
            Liveness::Dead
        );
    }
}
