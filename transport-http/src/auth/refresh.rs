//! The shared refresh: an expiring token is refreshed once across every
//! process sharing the store (through core's refresh protocol), before rmcp
//! looks at it.

use std::time::Duration;

use mcp_persist_core::{BoxError, Credentials, RefreshOutcome};
use tracing::{Instrument, info, warn};

use super::{DurableAuthClient, REFRESH_MARGIN, Registration, workload::workload_grant};

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
    /// the store, before rmcp reads it, and returns the credentials in force
    /// afterwards (the refreshed ones, or the stored ones when no refresh
    /// was due or it failed). A refresh token is spent through rmcp; a
    /// workload identity gets a new token with a fresh assertion. Failures
    /// are logged and left to rmcp's own refresh.
    pub(super) async fn ensure_fresh(&self) -> Option<Credentials> {
        let issuer = self.shared.issuer()?;
        let key = self.shared.key(&issuer).ok()?;
        let _one_task = self.refreshing.lock().await;
        let current = match self.shared.store.load(&key).await {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => {
                warn!(error = %e, "reading stored credentials failed");
                return None;
            }
        };
        let workload = match &self.config.registration {
            Registration::WorkloadIdentity {
                client_id,
                assertion,
                ..
            } => Some((client_id.clone(), assertion.clone())),
            _ => None,
        };
        let renewable = current.record.refresh_token.is_some() || workload.is_some();
        if !renewable
            || !current
                .record
                .expires_within(refresh_margin(&current.record))
        {
            return Some(current.record);
        }
        let span = tracing::info_span!(
            "mcp_persist.credentials.refresh",
            otel.name = "mcp_persist.credentials.refresh",
            otel.kind = "client",
            mcp_persist.outcome = tracing::field::Empty,
        );
        crate::telemetry::continue_trace(&span, None);
        let manager = self.inner.auth_manager.clone();
        let shared = self.shared.clone();
        let oauth_http = self.oauth_http.clone();
        let refresh_issuer = issuer.clone();
        let outcome = self
            .shared
            .store
            .refresh(
                &key,
                current.version,
                self.shared.lease_ttl,
                |previous| async move {
                    if previous.refresh_token.is_none()
                        && let Some((client_id, assertion)) = workload
                    {
                        return workload_grant(
                            &oauth_http,
                            &shared,
                            &refresh_issuer,
                            client_id.as_deref(),
                            &assertion,
                            &previous.scopes,
                        )
                        .await
                        .map_err(|e| Box::new(e) as BoxError);
                    }
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
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        let telemetry = &self.config.telemetry;
        match outcome {
            Ok(RefreshOutcome::Refreshed(stored)) => {
                info!(issuer = %issuer, "refresh won: this process refreshed and stored the rotated token");
                span.record("mcp_persist.outcome", "refreshed");
                telemetry.credential_refresh(true);
                Some(stored.record)
            }
            Ok(RefreshOutcome::RefreshedByOther(stored)) => {
                info!(issuer = %issuer, "refresh lost or waited: using the token another process stored");
                span.record("mcp_persist.outcome", "refreshed_by_other");
                Some(stored.record)
            }
            Ok(_) => Some(current.record),
            Err(e) => {
                warn!(issuer = %issuer, error = %e, "shared refresh failed; rmcp will retry on its own");
                span.record("mcp_persist.outcome", "failed");
                telemetry.credential_refresh(false);
                Some(current.record)
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
