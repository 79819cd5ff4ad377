//! rmcp's refresh guard over core's refresh lease: rmcp's own guarded
//! refresh (the fallback for a token the server refused before its expiry)
//! takes the same lease as the shared refresh.

use std::{sync::Arc, time::Duration};

use mcp_persist_core::{RefreshLease, retry::Backoff};
use rmcp::transport::auth::{AuthError, CredentialRefreshGuard};
use tracing::{debug, warn};

use super::shared::{Shared, store_error};

/// The refresh lease held for rmcp's guard; released when rmcp drops it.
struct LeaseGuard {
    shared: Arc<Shared>,
    lease: Option<RefreshLease>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.shared.set_guarded(false);
        if let Some(lease) = self.lease.take() {
            let store = self.shared.store.clone();
            // Released in the background: the lease's TTL bounds it anyway
            // when no runtime is left to run the release.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    if let Err(e) = store.release(lease).await {
                        warn!(error = %e, "releasing the refresh lease failed; it lapses with its TTL");
                    }
                });
            }
        }
    }
}

/// rmcp's refresh guard over core's refresh lease (a compare-and-swap
/// `Create`, taken over only after this process watched it unchanged for
/// the lease TTL): waits for another holder up to twice the lease TTL.
/// None while core's refresh protocol already holds the lease.
pub(super) async fn acquire_lease(
    shared: &Arc<Shared>,
) -> Result<Option<CredentialRefreshGuard>, AuthError> {
    if shared.capturing() {
        // Core's refresh protocol already holds the lease.
        return Ok(None);
    }
    let Some(issuer) = shared.issuer() else {
        return Ok(None);
    };
    let key = shared
        .key(&issuer)
        .map_err(|e| store_error("credential key", e))?;
    let deadline = tokio::time::Instant::now() + shared.lease_ttl.saturating_mul(2);
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    loop {
        match shared.store.try_lease(&key, shared.lease_ttl).await {
            Ok(Some(lease)) => {
                shared.set_guarded(true);
                debug!(issuer = %issuer, "refresh lease taken");
                return Ok(Some(CredentialRefreshGuard::new(LeaseGuard {
                    shared: shared.clone(),
                    lease: Some(lease),
                })));
            }
            Ok(None) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(AuthError::CredentialStoreError(format!(
                        "another process held the refresh lease for longer than {:?}",
                        shared.lease_ttl.saturating_mul(2)
                    )));
                }
                debug!(issuer = %issuer, "refresh lease held elsewhere; waiting");
                backoff.sleep_before(deadline).await;
            }
            Err(e) => return Err(store_error("taking the refresh lease", e)),
        }
    }
}
