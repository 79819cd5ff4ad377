//! What both rmcp adapters of one resource share with the flows: the
//! issuer in force, the registration and metadata rmcp does not store, the
//! state of a refresh in progress, and the conversions between rmcp's
//! credentials and core's.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use mcp_persist_core::{
    AuthStore as CoreStore, ClientRegistration, CredentialKey, Credentials, Error as StoreError,
    Secret, Timestamp, Version,
};
use rmcp::transport::auth::{AuthError, StoredCredentials};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::{
    DurableAuthError,
    dpop::{DpopKeyProblem, DpopSigner, ES256, Nonces},
};

/// The issuer recorded for credentials from an authorization server whose
/// metadata names none (a pre-2025 server reached through fallback URLs).
pub const UNNAMED_ISSUER: &str = "urn:mcp-persist:unnamed-issuer";

/// What both rmcp adapters of one resource share with the flows in
/// [`super`].
pub(crate) struct Shared {
    pub(crate) store: CoreStore,
    /// The canonical resource URL.
    pub(crate) resource: String,
    pub(crate) lease_ttl: Duration,
    pub(crate) pending_ttl: Duration,
    /// The latest `DPoP-Nonce` of every origin this client talked to.
    pub(crate) nonces: Nonces,
    /// DPoP signers already loaded, by issuer.
    signers: Mutex<HashMap<String, Arc<DpopSigner>>>,
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
            nonces: Nonces::default(),
            signers: Mutex::default(),
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

    /// The authorization server metadata of the issuer in force, as
    /// discovered or stored.
    pub(crate) fn metadata(&self) -> Option<Value> {
        self.state().metadata.clone()
    }

    /// The token endpoint of the issuer in force.
    pub(crate) fn token_endpoint(&self) -> Option<String> {
        self.state()
            .metadata
            .as_ref()?
            .get("token_endpoint")?
            .as_str()
            .map(str::to_owned)
    }

    /// Whether the metadata of the issuer in force advertises DPoP with
    /// `ES256` (`dpop_signing_alg_values_supported`, RFC 9449 section 5.1).
    pub(crate) fn dpop_supported(&self) -> bool {
        self.state()
            .metadata
            .as_ref()
            .and_then(|m| m.get("dpop_signing_alg_values_supported"))
            .and_then(Value::as_array)
            .is_some_and(|algs| algs.iter().any(|a| a.as_str() == Some(ES256)))
    }

    /// The DPoP signer of `issuer` for this resource: loaded once from the
    /// store, or, with `create` and none stored, created and stored (the
    /// first process to store one wins; every other uses that one).
    ///
    /// A stored key that cannot be read or used is an error, never replaced:
    /// a new key would orphan every token bound to the old one.
    pub(crate) async fn dpop_signer(
        &self,
        issuer: &str,
        create: bool,
    ) -> Result<Arc<DpopSigner>, DurableAuthError> {
        if let Some(signer) = self
            .signers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(issuer)
        {
            return Ok(signer.clone());
        }
        let key = self
            .key(issuer)
            .map_err(|source| DurableAuthError::Store { source })?;
        let problem =
            |problem: DpopKeyProblem, source: Option<StoreError>| DurableAuthError::DpopKey {
                issuer: issuer.to_owned(),
                resource: self.resource.clone(),
                problem,
                source: source.map(|e| Box::new(e) as mcp_persist_core::BoxError),
            };
        let stored = match self.store.load_dpop_key(&key).await {
            Ok(stored) => stored,
            // The record is there and is not a usable key record.
            Err(
                e @ (StoreError::Corrupt { .. }
                | StoreError::NewerSchema { .. }
                | StoreError::Sealing { .. }),
            ) => return Err(problem(DpopKeyProblem::Unreadable, Some(e))),
            // The store could not answer (down, timed out): try again later.
            Err(source) => return Err(DurableAuthError::Store { source }),
        };
        let signer = match stored {
            Some(stored) => {
                DpopSigner::from_record(&stored.record).map_err(|p| problem(p, None))?
            }
            None if !create => return Err(problem(DpopKeyProblem::Missing, None)),
            None => {
                let (_, record) = DpopSigner::generate(&key).map_err(|p| problem(p, None))?;
                let winner = self
                    .store
                    .create_dpop_key(&record)
                    .await
                    .map_err(|source| DurableAuthError::Store { source })?;
                DpopSigner::from_record(&winner.record).map_err(|p| problem(p, None))?
            }
        };
        let signer = Arc::new(signer);
        debug!(issuer, jkt = signer.thumbprint(), "DPoP key ready");
        self.signers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(issuer.to_owned(), signer.clone());
        Ok(signer)
    }

    /// The signer for a token request of grant `grant` to the issuer in
    /// force, or `None` when it goes without a proof: DPoP is used when
    /// `enabled` and the issuer advertises it, and always when a DPoP-bound
    /// refresh token is spent (its key must then exist).
    pub(crate) async fn token_request_signer(
        &self,
        grant: &str,
        enabled: bool,
    ) -> Result<Option<Arc<DpopSigner>>, DurableAuthError> {
        let Some(issuer) = self.issuer() else {
            return Ok(None);
        };
        let bound = if grant == "refresh_token" {
            let key = self
                .key(&issuer)
                .map_err(|source| DurableAuthError::Store { source })?;
            self.store
                .load(&key)
                .await
                .map_err(|source| DurableAuthError::Store { source })?
                .is_some_and(|c| is_dpop(&c.record))
        } else {
            false
        };
        if bound {
            return self.dpop_signer(&issuer, false).await.map(Some);
        }
        if enabled && self.dpop_supported() {
            return self.dpop_signer(&issuer, true).await.map(Some);
        }
        if enabled
            && let Some(algs) = self
                .state()
                .metadata
                .as_ref()
                .and_then(|m| m.get("dpop_signing_alg_values_supported"))
        {
            warn!(issuer, advertised = %algs, "the authorization server does not offer ES256 for DPoP; requesting a bearer token");
        }
        Ok(None)
    }

    /// The version `load` last returned (for the compare-and-swap of a
    /// refresh made under rmcp's guard).
    pub(crate) fn set_loaded(&self, version: Option<Version>) {
        self.state().loaded = version;
    }

    /// Whether a lease taken through rmcp's guard is held, and the version
    /// loaded under it.
    pub(crate) fn guarded_version(&self) -> (bool, Option<Version>) {
        let state = self.state();
        (state.guarded, state.loaded)
    }

    /// Marks the lease taken through rmcp's guard as held or released.
    pub(crate) fn set_guarded(&self, guarded: bool) {
        self.state().guarded = guarded;
    }

    /// Whether a refresh runs inside core's refresh protocol (which holds
    /// the lease and stores the result itself).
    pub(crate) fn capturing(&self) -> bool {
        self.state().capture.is_some()
    }

    /// While capturing, keeps `credentials` as the refresh's result and
    /// returns `None`; otherwise gives them back to be stored.
    pub(crate) fn capture(&self, credentials: StoredCredentials) -> Option<StoredCredentials> {
        match self.state().capture.as_mut() {
            Some(slot) => {
                *slot = Some(credentials);
                None
            }
            None => Some(credentials),
        }
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
            Some(t) if t.eq_ignore_ascii_case("dpop") => DPOP.to_owned(),
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

/// The token type of DPoP-bound tokens (RFC 9449 section 5).
pub(crate) const DPOP: &str = "DPoP";

/// Whether `credentials` hold a DPoP-bound access token.
pub(crate) fn is_dpop(credentials: &Credentials) -> bool {
    credentials.token_type.eq_ignore_ascii_case(DPOP)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use mcp_persist_core::AuthStore;

    use crate::auth::{DEFAULT_LEASE_TTL, DEFAULT_PENDING_TTL};

    #[test]
    fn absolute_expiry_round_trips_through_rmcp_shape() {
        let creds = mcp_persist_core::Credentials::new(
            mcp_persist_core::CredentialKey::new("https://as.example", "https://mcp.example/mcp")
                .expect("valid key"),
            Secret::new("AT-secret-1"),
            ClientRegistration::new("client-1").with_client_secret(Secret::new("CS-secret-1")),
        )
        .with_expires_at(Timestamp::from_unix_millis(1_000_000_000 + 3_600_000))
        .with_refresh_token(Secret::new("RT-secret-1"))
        .with_scopes(vec!["mcp:basic".into()])
        .with_obtained_at(Timestamp::from_unix_millis(1_000_000_000));
        let rmcp = to_rmcp(&creds).expect("converts");
        assert_eq!(rmcp.token_received_at, Some(1_000_000));
        assert_eq!(rmcp.issuer.as_deref(), Some("https://as.example"));
        let debug = format!("{rmcp:?} {creds:?}");
        assert!(!debug.contains("secret-1"), "{debug}");
        let shared = Shared::new(
            AuthStore::new(Arc::new(mcp_persist_core::MemoryStore::new())),
            "https://mcp.example/mcp".into(),
            DEFAULT_LEASE_TTL,
            DEFAULT_PENDING_TTL,
            None,
        );
        let back = shared
            .to_core(&rmcp, Some(&creds))
            .expect("converts")
            .expect("has tokens");
        assert_eq!(back, creds);
    }
}
