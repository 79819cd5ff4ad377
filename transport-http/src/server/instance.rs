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
use tracing::{info, warn};

/// One instance's id and lease. Registered on first use and renewed in the
/// background while any clone of the server is alive.
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

    /// Registers the lease and starts renewing it, once.
    pub(crate) async fn ensure_started(self: &Arc<Self>) -> Result<()> {
        self.started
            .get_or_try_init(|| async {
                let lease = self.leases.register_as(self.id.clone()).await?;
                tokio::spawn(renew(Arc::downgrade(self), lease, self.stop.subscribe()));
                Ok::<(), mcp_persist_core::Error>(())
            })
            .await?;
        Ok(())
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
