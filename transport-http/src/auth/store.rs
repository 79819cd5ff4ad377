//! rmcp's `CredentialStore` and `StateStore` over core's
//! [`AuthStore`](mcp_persist_core::AuthStore).

use std::sync::Arc;

use mcp_persist_core::{PendingAuthorization, Secret};
use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore as RmcpCredentialStore,
    StateStore as RmcpStateStore, StoredAuthorizationState, StoredCredentials,
};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{
    lease::acquire_lease,
    shared::{Shared, UNNAMED_ISSUER, store_error, to_rmcp},
};

/// rmcp's [`CredentialStore`](rmcp::transport::auth::CredentialStore) for one
/// resource, over core's [`AuthStore`](mcp_persist_core::AuthStore).
///
/// rmcp's store has one slot and no key. This one serves the slot of the
/// issuer in force for its resource (the authorization server the client
/// last authorized with there):
///
/// * `load` returns only that issuer's credentials, so rmcp never sees the
///   credentials of an authorization server it is not talking to.
/// * `save` stores under the credentials' own issuer
///   (`StoredCredentials::issuer`) and makes that issuer the one in force.
/// * `acquire_refresh_guard` takes core's refresh lease (a compare-and-swap
///   `Create` with a TTL), waiting for another holder up to the lease TTL;
///   while it is held, `save` replaces the credential with compare-and-swap
///   against the version loaded under it. rmcp loads again after taking the
///   guard, so it refreshes from the newest stored token.
/// * `clear` deletes the in-force issuer's credentials (rmcp calls it when
///   the authorization server changed).
///
/// Build it through [`DurableAuth`](super::DurableAuth), which also keeps
/// what rmcp does not pass to stores: the client secret and the discovered
/// authorization server metadata.
#[derive(Clone)]
pub struct DurableCredentialStore {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for DurableCredentialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableCredentialStore")
            .field("resource", &self.shared.resource)
            .field("issuer", &self.shared.issuer())
            .field("backend", &self.shared.store.backend_name())
            .finish()
    }
}

#[async_trait::async_trait]
impl RmcpCredentialStore for DurableCredentialStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let Some(issuer) = self.shared.issuer() else {
            return Ok(None);
        };
        let key = self
            .shared
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        let stored = self
            .shared
            .store
            .load(&key)
            .await
            .map_err(|e| store_error("loading credentials", e))?;
        let Some(stored) = stored else {
            self.shared.set_loaded(None);
            return Ok(None);
        };
        self.shared.set_loaded(Some(stored.version));
        to_rmcp(&stored.record).map(Some)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let Some(credentials) = self.shared.capture(credentials) else {
            // A refresh inside core's refresh protocol: it stores the result.
            return Ok(());
        };
        let issuer = credentials
            .issuer
            .clone()
            .unwrap_or_else(|| UNNAMED_ISSUER.to_owned());
        let key = self
            .shared
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        let previous = self
            .shared
            .store
            .load(&key)
            .await
            .map_err(|e| store_error("loading credentials", e))?;
        let Some(core) = self
            .shared
            .to_core(&credentials, previous.as_ref().map(|p| &p.record))?
        else {
            // A registration without tokens (rmcp keeps a portable client
            // metadata document id after an issuer change): nothing to keep
            // but the issuer now in force.
            self.shared
                .switch_issuer(&issuer)
                .await
                .map_err(|e| store_error("recording the issuer", e))?;
            return Ok(());
        };
        let (guarded, loaded) = self.shared.guarded_version();
        let in_force = self.shared.issuer().as_deref() == Some(issuer.as_str());
        match (guarded && in_force, loaded) {
            (true, Some(version)) => {
                let v = self
                    .shared
                    .store
                    .replace(&core, version)
                    .await
                    .map_err(|e| store_error("storing the refreshed credential", e))?;
                self.shared.set_loaded(Some(v));
                info!(issuer = %issuer, resource = %self.shared.resource, "stored the rotated credential");
            }
            _ => {
                let v = self
                    .shared
                    .store
                    .save(&core)
                    .await
                    .map_err(|e| store_error("storing credentials", e))?;
                self.shared.set_loaded(Some(v));
                info!(issuer = %issuer, resource = %self.shared.resource, "stored new credentials");
            }
        }
        self.shared
            .switch_issuer(&issuer)
            .await
            .map_err(|e| store_error("recording the issuer", e))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let Some(issuer) = self.shared.issuer() else {
            return Ok(());
        };
        let key = self
            .shared
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        self.shared
            .store
            .delete(&key)
            .await
            .map_err(|e| store_error("deleting credentials", e))?;
        warn!(issuer = %issuer, resource = %self.shared.resource, "deleted the stored credentials of this issuer");
        Ok(())
    }

    async fn on_refresh_token_rejected(
        &self,
        credentials: &StoredCredentials,
    ) -> Result<(), AuthError> {
        let Some(issuer) = credentials.issuer.clone().or_else(|| self.shared.issuer()) else {
            return Ok(());
        };
        let key = self
            .shared
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        let rejected = self.shared.to_core(credentials, None)?;
        let stored = self
            .shared
            .store
            .load(&key)
            .await
            .map_err(|e| store_error("loading credentials", e))?;
        // Only the credential that was refused goes; a newer one stays.
        if let (Some(stored), Some(rejected)) = (stored, rejected)
            && stored.record.refresh_token == rejected.refresh_token
        {
            self.shared
                .store
                .delete(&key)
                .await
                .map_err(|e| store_error("deleting credentials", e))?;
            warn!(issuer = %issuer, resource = %self.shared.resource, "refresh token rejected; deleted the stored credential, authorization required");
        }
        Ok(())
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        acquire_lease(&self.shared).await
    }
}

/// rmcp's [`StateStore`](rmcp::transport::auth::StateStore) over core's
/// pending authorizations: the PKCE verifier, the `state` value and the
/// expected issuer are kept for a short TTL (so a callback may reach another
/// process), under a hash of the `state`, and removed once used.
#[derive(Clone)]
pub struct DurableStateStore {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for DurableStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableStateStore")
            .field("resource", &self.shared.resource)
            .field("ttl", &self.shared.pending_ttl)
            .finish()
    }
}

#[async_trait::async_trait]
impl RmcpStateStore for DurableStateStore {
    async fn save(
        &self,
        csrf_token: &str,
        state: StoredAuthorizationState,
    ) -> Result<(), AuthError> {
        let pending = PendingAuthorization::new(
            Secret::new(state.pkce_verifier.clone()),
            Secret::new(csrf_token),
            state.expected_issuer.clone().unwrap_or_default(),
            self.shared.resource.clone(),
        )
        .with_extra(json!({
            "require_issuer": state.require_issuer,
            "requested_scopes": state.requested_scopes,
            "created_at": state.created_at,
        }));
        self.shared
            .store
            .save_pending(&pending, self.shared.pending_ttl)
            .await
            .map_err(|e| store_error("storing the pending authorization", e))?;
        debug!(resource = %self.shared.resource, "pending authorization stored");
        Ok(())
    }

    async fn load(&self, csrf_token: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        let Some(p) = self
            .shared
            .store
            .peek_pending(csrf_token)
            .await
            .map_err(|e| store_error("loading the pending authorization", e))?
        else {
            return Ok(None);
        };
        let extra = p.extra.clone().unwrap_or_default();
        let state = json!({
            "pkce_verifier": p.pkce_verifier.expose_secret(),
            "csrf_token": p.state.expose_secret(),
            "expected_issuer": (!p.expected_issuer.is_empty()).then_some(&p.expected_issuer),
            "require_issuer": extra.get("require_issuer").cloned().unwrap_or(json!(false)),
            "created_at": extra.get("created_at").cloned().unwrap_or(json!(p.created_at.as_unix_millis() / 1000)),
            "requested_scopes": extra.get("requested_scopes").cloned().unwrap_or(json!([])),
        });
        // serde's message could quote a value: say only what failed.
        serde_json::from_value(state).map(Some).map_err(|_| {
            AuthError::InternalError("stored pending authorization is not rmcp's shape".into())
        })
    }

    async fn delete(&self, csrf_token: &str) -> Result<(), AuthError> {
        self.shared
            .store
            .take_pending(csrf_token)
            .await
            .map_err(|e| store_error("removing the pending authorization", e))?;
        Ok(())
    }
}
