//! The shared refresh: an expiring token is refreshed once across every
//! process sharing the store (through core's refresh protocol), before rmcp
//! looks at it.

use std::time::Duration;

use mcp_persist_core::{BoxError, Credentials, RefreshOutcome};
use tracing::{info, warn};

use super::{DurableAuthClient, REFRESH_MARGIN};

/// The margin before expiry at which `credentials` are refreshed:
/// [`REFRESH_MARGIN`], or half the token's lifetime when that is shorter.
/// Never below rmcp's own (`min(30 s, lifetime / 2)`), so the shared
/// refresh still runs first.
pub(super) fn refresh_margin(credentials: &Credentials) -> Duration {
    let Some(expires_at) = credentials.expires_at else {
        return REFRESH_MARGIN;
    };
    let lifetime = expires_at
        .as_unix_millis()
        .saturating_sub(credentials.obtained_at.as_unix_millis());
    REFRESH_MARGIN.min(Duration::from_millis(lifetime) / 2)
}

impl<C> DurableAuthClient<C> {
    /// Refreshes an expiring stored token once across every process sharing
    /// the store, before rmcp reads it. Failures are logged and left to
    /// rmcp's own refresh.
    pub(super) async fn ensure_fresh(&self) {
        let Some(issuer) = self.shared.issuer() else {
            return;
        };
        let Ok(key) = self.shared.key(&issuer) else {
            return;
        };
        let _one_task = self.refreshing.lock().await;
        let current = match self.shared.store.load(&key).await {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %e, "reading stored credentials failed");
                return;
            }
        };
        if current.record.refresh_token.is_none()
            || !current
                .record
                .expires_within(refresh_margin(&current.record))
        {
            return;
        }
        let manager = self.inner.auth_manager.clone();
        let shared = self.shared.clone();
        let outcome = self
            .shared
            .store
            .refresh(
                &key,
                current.version,
                self.shared.lease_ttl,
                |previous| async move {
                    let manager = manager.lock().await;
                    shared.begin_capture();
                    let result = manager.refresh_token().await;
                    let captured = shared.end_capture();
                    drop(manager);
                    result.map_err(|e| Box::new(e) as BoxError)?;
                    let captured = captured.ok_or_else(|| -> BoxError {
                        "the refresh returned no credential to store".into()
                    })?;
                    shared
                        .to_core(&captured, Some(&previous))
                        .map_err(|e| Box::new(e) as BoxError)?
                        .ok_or_else(|| -> BoxError { "the refresh returned no token".into() })
                },
            )
            .await;
        match outcome {
            Ok(RefreshOutcome::Refreshed(_)) => {
                info!(issuer = %issuer, "refresh won: this process refreshed and stored the rotated token");
            }
            Ok(RefreshOutcome::RefreshedByOther(_)) => {
                info!(issuer = %issuer, "refresh lost or waited: using the token another process stored");
            }
            Ok(_) => {}
            Err(e) => {
                warn!(issuer = %issuer, error = %e, "shared refresh failed; rmcp will retry on its own")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mcp_persist_core::{ClientRegistration, Secret, Timestamp};

    use super::*;

    #[test]
    fn short_lived_tokens_refresh_at_half_their_lifetime() {
        let creds = |lifetime_ms: u64| {
            mcp_persist_core::Credentials::new(
                mcp_persist_core::CredentialKey::new("https://as.example", "https://mcp.example")
                    .expect("valid key"),
                Secret::new("AT"),
                ClientRegistration::new("client-1"),
            )
            .with_expires_at(Timestamp::from_unix_millis(1_000_000 + lifetime_ms))
            .with_refresh_token(Secret::new("RT"))
            .with_obtained_at(Timestamp::from_unix_millis(1_000_000))
        };
        assert_eq!(refresh_margin(&creds(3_600_000)), REFRESH_MARGIN);
        assert_eq!(refresh_margin(&creds(20_000)), Duration::from_secs(10));
        assert_eq!(refresh_margin(&creds(0)), Duration::ZERO);
        let mut no_expiry = creds(0);
        no_expiry.expires_at = None;
        assert_eq!(refresh_margin(&no_expiry), REFRESH_MARGIN);
    }
}
