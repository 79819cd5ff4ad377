//! This server instance's identity and liveness lease, shared by everything
//! that needs other instances to know whether it still runs: the streams it
//! writes (a replaying instance ends a dead writer's stream with an error)
//! and the tasks it runs (another instance fails or takes them over).

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use mcp_persist_core::{InstanceLeases, Liveness, OwnLease, Result, Stores};
use tokio::sync::{OnceCell, watch};
use tracing::{debug, info, warn};

/// One instance's id and lease. Registered on first use (or at build, in a
/// runtime) and kept alive in the background while any clone of the server
/// is alive: heartbeats every [`check_every`](Self::check_every), the lease
/// record every third of the grace period.
pub(crate) struct InstanceLife {
    id: String,
    leases: InstanceLeases,
    started: OnceCell<()>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for InstanceLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceLife")
            .field("id", &self.id)
            .field("grace", &self.leases.grace())
            .finish()
    }
}

impl InstanceLife {
    pub(crate) fn new(stores: &Stores, grace: Duration) -> Result<Arc<Self>> {
        Ok(Arc::new(InstanceLife {
            id: InstanceLeases::new_instance_id()?,
            leases: stores.instance_leases(grace),
            started: OnceCell::new(),
            stop: watch::channel(false).0,
        }))
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn grace(&self) -> Duration {
        self.leases.grace()
    }

    /// How often a watcher of another instance's work should ask whether it
    /// still runs: every heartbeat, or every half grace period without
    /// heartbeats.
    pub(crate) fn check_every(&self) -> Duration {
        self.leases
            .heartbeat_every()
            .unwrap_or(self.leases.grace() / 2)
    }

    /// Registers the lease and starts keeping it alive, once.
    pub(crate) async fn ensure_started(self: &Arc<Self>) -> Result<()> {
        self.started
            .get_or_try_init(|| async {
                let lease = self.leases.register_as(self.id.clone()).await?;
                if let Some(every) = self.leases.heartbeat_every() {
                    tokio::spawn(beat(
                        Arc::downgrade(self),
                        lease.clone(),
                        every,
                        self.stop.subscribe(),
                    ));
                }
                tokio::spawn(renew(Arc::downgrade(self), lease, self.stop.subscribe()));
                Ok::<(), mcp_persist_core::Error>(())
            })
            .await?;
        Ok(())
    }

    /// [`ensure_started`](Self::ensure_started) in the background, when
    /// called inside a Tokio runtime (otherwise at first use).
    pub(crate) fn start_in_background(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let life = Arc::downgrade(self);
        runtime.spawn(async move {
            let Some(life) = life.upgrade() else {
                return;
            };
            if let Err(e) = life.ensure_started().await {
                warn!(instance = %life.id, error = %e, "could not register this instance's liveness lease; retrying at the next request");
            }
        });
    }

    /// Whether instance `other` is alive, as this instance observes it.
    pub(crate) async fn observe(&self, other: &str) -> Result<Liveness> {
        if other == self.id {
            return Ok(Liveness::Alive);
        }
        self.leases.observe(other).await
    }

    /// Stops renewing and releases the lease: others see this instance as
    /// stopped at once.
    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// Appends a heartbeat every `every`, on a fixed rate: a heartbeat that
/// took long (a stalled store) is followed at once by the next, so the gap
/// between two committed heartbeats is the stall, not the stall plus a
/// period.
async fn beat(
    life: Weak<InstanceLife>,
    lease: OwnLease,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; registering appended a heartbeat.
    ticks.tick().await;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(life) = life.upgrade() else {
            return;
        };
        match life.leases.heartbeat(&lease).await {
            Ok(()) if failing => {
                failing = false;
                info!(instance = %life.id, "heartbeats are committed again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                warn!(instance = %life.id, error = %e, "appending a heartbeat failed; other instances call this one stopped once that lasts the grace period");
            }
            Err(e) => debug!(instance = %life.id, error = %e, "appending a heartbeat failed again"),
        }
    }
}

async fn renew(life: Weak<InstanceLife>, mut lease: OwnLease, mut stop: watch::Receiver<bool>) {
    let every = lease.renew_every();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                if let Some(life) = life.upgrade() {
                    let _ = life.leases.release(&lease).await;
                    info!(instance = %life.id, "instance lease released");
                }
                return;
            }
        }
        let Some(life) = life.upgrade() else {
            return;
        };
        match life.leases.renew(&mut lease).await {
            Ok(true) => {}
            Ok(false) => {
                warn!(instance = %life.id, "this instance was presumed stopped during a pause; its work may have moved")
            }
            Err(e) => warn!(instance = %life.id, error = %e, "renewing the instance lease failed"),
        }
    }
}
