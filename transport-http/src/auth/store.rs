//! rmcp's `CredentialStore` and `StateStore` over core's
//! [`CredentialStore`](mcp_persist_core::CredentialStore).

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use mcp_persist_core::{
    ClientRegistration, CredentialKey, CredentialStore as CoreStore, Credentials,
    Error as StoreError, PendingAuthorization, RefreshLease, Secret, Timestamp, Version,
};
use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore as RmcpCredentialStore,
    StateStore as RmcpStateStore, StoredAuthorizationState, StoredCredentials,
};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

/// The issuer recorded for credentials from an authorization server whose
/// metadata names none (a pre-2025 server reached through fallback URLs).
pub const UNNAMED_ISSUER: &str = "urn:mcp-persist:unnamed-issuer";

/// What both rmcp adapters of one resource share with the flow in
/// [`super`].
pub(crate) struct Shared {
    pub(crate) store: CoreStore,
    /// The canonical resource URL.
    pub(crate) resource: String,
    pub(crate) lease_ttl: Duration,
    pub(crate) pending_ttl: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The issuer whose credentials `load` hands out.
    issuer: Option<String>,
    /// The registration in use with `issuer`, as configured by the flow
    /// (rmcp keeps the client secret to itself).
    registration: Option<ClientRegistration>,
    /// The authorization server metadata of `issuer`, as discovered.
    metadata: Option<Value>,
    /// The version `load` last returned, for the compare-and-swap of a
    /// refresh made under rmcp's guard.
    loaded: Option<Version>,
    /// Whether a refresh lease taken through rmcp's guard is held.
    guarded: bool,
    /// `Some` while a refresh runs inside core's refresh protocol: `save`
    /// hands the result back instead of writing it.
    capture: Option<Option<StoredCredentials>>,
}

pub(crate) fn store_error(what: &str, error: StoreError) -> AuthError {
    // Core errors never carry secrets; the text names keys built from URLs
    // and hashes only.
    AuthError::CredentialStoreError(format!("{what}: {error}"))
}

fn now_secs() -> u64 {
    Timestamp::now().as_unix_millis() / 1000
}

impl Shared {
    pub(crate) fn new(
        store: CoreStore,
        resource: String,
        lease_ttl: Duration,
        pending_ttl: Duration,
        issuer: Option<String>,
    ) -> Self {
        Shared {
            store,
            resource,
            lease_ttl,
            pending_ttl,
            state: Mutex::new(State {
                issuer,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state holds plain values that every writer leaves consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn issuer(&self) -> Option<String> {
        self.state().issuer.clone()
    }

    pub(crate) fn key(&self, issuer: &str) -> Result<CredentialKey, StoreError> {
        CredentialKey::new(issuer, &self.resource)
    }

    /// Makes `issuer` the one in force for the resource, in memory and in
    /// the store. Credentials of the previous issuer stay where they are and
    /// are no longer handed out.
    pub(crate) async fn switch_issuer(&self, issuer: &str) -> Result<(), StoreError> {
        let previous = {
            let mut state = self.state();
            if state.issuer.as_deref() == Some(issuer) {
                return Ok(());
            }
            state.registration = None;
            state.loaded = None;
            state.issuer.replace(issuer.to_owned())
        };
        match &previous {
            Some(previous) => info!(
                previous_issuer = %previous,
                issuer,
                resource = %self.resource,
                "authorization server changed; credentials of the previous issuer are not used here"
            ),
            None => {
                debug!(issuer, resource = %self.resource, "first authorization server for resource")
            }
        }
        self.store.set_current_issuer(&self.resource, issuer).await
    }

    pub(crate) fn set_registration(&self, registration: ClientRegistration) {
        self.state().registration = Some(registration);
    }

    pub(crate) fn set_metadata(&self, metadata: Value) {
        self.state().metadata = Some(metadata);
    }

    pub(crate) fn begin_capture(&self) {
        self.state().capture = Some(None);
    }

    pub(crate) fn end_capture(&self) -> Option<StoredCredentials> {
        self.state().capture.take().flatten()
    }

    /// rmcp's credentials as core's, keeping what rmcp does not know of
    /// (client secret, metadata) from `previous` or from the flow.
    pub(crate) fn to_core(
        &self,
        rmcp: &StoredCredentials,
        previous: Option<&Credentials>,
    ) -> Result<Option<Credentials>, AuthError> {
        let Some(response) = rmcp.token_response.as_ref() else {
            return Ok(None);
        };
        // The token response's own serialization is the one stable way to
        // read it without naming oauth2's types.
        let body = serde_json::to_value(response)
            .map_err(|e| AuthError::InternalError(format!("token response: {e}")))?;
        let text = |field: &str| body.get(field).and_then(Value::as_str).map(str::to_owned);
        let access_token = text("access_token").ok_or_else(|| {
            AuthError::InternalError("token response without access token".into())
        })?;
        let issuer = rmcp
            .issuer
            .clone()
            .unwrap_or_else(|| UNNAMED_ISSUER.to_owned());
        let key = self
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        let received = rmcp.token_received_at.unwrap_or_else(now_secs);
        let expires_at = body
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|secs| Timestamp::from_unix_millis(received.saturating_add(secs) * 1000));
        let state = self.state();
        let client = match (&state.registration, previous) {
            (Some(reg), _) if reg.client_id == rmcp.client_id => reg.clone(),
            (_, Some(prev)) if prev.client.client_id == rmcp.client_id => prev.client.clone(),
            _ => ClientRegistration::new(rmcp.client_id.clone())
                .with_metadata_url(is_https(&rmcp.client_id).then(|| rmcp.client_id.clone())),
        };
        let server_metadata = if state.issuer.as_deref() == Some(issuer.as_str()) {
            state.metadata.clone()
        } else {
            None
        }
        .or_else(|| previous.and_then(|p| p.server_metadata.clone()));
        let token_type = match text("token_type") {
            Some(t) if !t.eq_ignore_ascii_case("bearer") => t,
            _ => "Bearer".to_owned(),
        };
        Ok(Some(
            Credentials::new(key, Secret::new(access_token), client)
                .with_token_type(token_type)
                .with_expires_at(expires_at)
                .with_refresh_token(text("refresh_token").map(Secret::new))
                .with_scopes(rmcp.granted_scopes.clone())
                .with_server_metadata(server_metadata)
                .with_obtained_at(Timestamp::from_unix_millis(received * 1000)),
        ))
    }
}

fn is_https(s: &str) -> bool {
    s.starts_with("https://")
}

/// Core's credentials as rmcp's. The access token's absolute expiry goes
/// back as rmcp's `token_received_at` plus `expires_in`.
pub(crate) fn to_rmcp(c: &Credentials) -> Result<StoredCredentials, AuthError> {
    let received = c.obtained_at.as_unix_millis() / 1000;
    let mut body = json!({
        "access_token": c.access_token.expose_secret(),
        "token_type": c.token_type.to_ascii_lowercase(),
    });
    if let Some(at) = c.expires_at {
        let expires = at.as_unix_millis() / 1000;
        body["expires_in"] = json!(expires.saturating_sub(received));
    }
    if let Some(r) = &c.refresh_token {
        body["refresh_token"] = json!(r.expose_secret());
    }
    if !c.scopes.is_empty() {
        body["scope"] = json!(c.scopes.join(" "));
    }
    let issuer = (c.key.issuer != UNNAMED_ISSUER).then(|| c.key.issuer.clone());
    let stored = json!({
        "client_id": c.client.client_id,
        "token_response": body,
        "granted_scopes": c.scopes,
        "token_received_at": received,
        "issuer": issuer,
    });
    // serde's message could quote a value: say only what failed.
    serde_json::from_value(stored).map_err(|_| {
        AuthError::InternalError("stored credentials do not form an rmcp token response".into())
    })
}

/// rmcp's [`CredentialStore`](rmcp::transport::auth::CredentialStore) for one
/// resource, over core's [`CredentialStore`](mcp_persist_core::CredentialStore).
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

struct LeaseGuard {
    shared: Arc<Shared>,
    lease: Option<RefreshLease>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.shared.state().guarded = false;
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
            self.shared.state().loaded = None;
            return Ok(None);
        };
        self.shared.state().loaded = Some(stored.version);
        to_rmcp(&stored.record).map(Some)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        if let Some(slot) = self.shared.state().capture.as_mut() {
            *slot = Some(credentials);
            return Ok(());
        }
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
        let (guarded, loaded) = {
            let state = self.shared.state();
            (state.guarded, state.loaded)
        };
        let in_force = self.shared.issuer().as_deref() == Some(issuer.as_str());
        match (guarded && in_force, loaded) {
            (true, Some(version)) => {
                let v = self
                    .shared
                    .store
                    .replace(&core, version)
                    .await
                    .map_err(|e| store_error("storing the refreshed credential", e))?;
                self.shared.state().loaded = Some(v);
                info!(issuer = %issuer, resource = %self.shared.resource, "stored the rotated credential");
            }
            _ => {
                let v = self
                    .shared
                    .store
                    .save(&core)
                    .await
                    .map_err(|e| store_error("storing credentials", e))?;
                self.shared.state().loaded = Some(v);
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
        if self.shared.state().capture.is_some() {
            // Core's refresh protocol already holds the lease.
            return Ok(None);
        }
        let Some(issuer) = self.shared.issuer() else {
            return Ok(None);
        };
        let key = self
            .shared
            .key(&issuer)
            .map_err(|e| store_error("credential key", e))?;
        let deadline = tokio::time::Instant::now() + self.shared.lease_ttl;
        let mut pause = Duration::from_millis(10);
        loop {
            match self
                .shared
                .store
                .try_lease(&key, self.shared.lease_ttl)
                .await
            {
                Ok(Some(lease)) => {
                    self.shared.state().guarded = true;
                    debug!(issuer = %issuer, "refresh lease taken");
                    return Ok(Some(CredentialRefreshGuard::new(LeaseGuard {
                        shared: self.shared.clone(),
                        lease: Some(lease),
                    })));
                }
                Ok(None) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(AuthError::CredentialStoreError(format!(
                            "another process held the refresh lease for longer than {:?}",
                            self.shared.lease_ttl
                        )));
                    }
                    debug!(issuer = %issuer, "refresh lease held elsewhere; waiting");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(store_error("taking the refresh lease", e)),
            }
        }
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
