use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use super::{Stored, read, write};
use crate::retry::Backoff;
use crate::{
    BoxError, Error, Key, KvStore, PutMode, Result, Secret, Version, declare,
    records::{CredentialKey, Credentials, PendingAuthorization, Record},
    types::{Timestamp, hex, random_token},
};

/// OAuth credentials keyed by issuer and resource, with a cross-process
/// refresh guard.
///
/// Two promises:
///
/// * **No lost rotation.** A refreshed credential is saved with
///   compare-and-swap against the version it was refreshed from
///   ([`replace`](AuthStore::replace)), so when two processes refresh
///   at once the second write fails with `Conflict` instead of putting back a
///   refresh token the authorization server already rotated away.
/// * **One refresher at a time.** [`refresh`](AuthStore::refresh) takes
///   a lease (a compare-and-swap `Create`) before spending the refresh
///   token; a process that finds the lease taken waits for the winner's new
///   credential instead of spending the same refresh token again.
///
/// No clock decides who holds a lease. The lease record has no TTL: a
/// waiter takes a lease over (by compare-and-swap on the version it saw)
/// only after it has itself watched that same version, unchanged, for the
/// lease TTL on its own monotonic clock. A wall-clock step on any machine,
/// forward or back, therefore cannot hand one lease to two holders; and a
/// holder's result is stored with compare-and-swap against the credential
/// version it refreshed, so even a holder stalled past the TTL cannot put
/// back a rotated-away token.
#[derive(Clone, Debug)]
pub struct AuthStore {
    kv: Arc<dyn KvStore>,
    /// Lease key -> (version last seen, since when), on this process's
    /// monotonic clock.
    seen_leases: Arc<Mutex<HashMap<String, (Version, tokio::time::Instant)>>>,
}

/// A held right to refresh one credential, until it is released, or until
/// another process has watched it unchanged for the lease TTL.
#[derive(Debug)]
pub struct RefreshLease {
    key: Key,
    version: Version,
    /// When the lease could be taken over at the earliest, by this
    /// process's clock (informational: nobody compares clocks).
    pub expires_at: Timestamp,
}

/// How [`AuthStore::refresh`] got the credential it returns.
#[derive(Debug)]
#[non_exhaustive]
pub enum RefreshOutcome {
    /// This process refreshed it.
    Refreshed(Stored<Credentials>),
    /// Another process refreshed it while this one waited.
    RefreshedByOther(Stored<Credentials>),
}

impl RefreshOutcome {
    /// The credential, however it came.
    pub fn into_stored(self) -> Stored<Credentials> {
        match self {
            RefreshOutcome::Refreshed(s) | RefreshOutcome::RefreshedByOther(s) => s,
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    holder: String,
    taken_at: Timestamp,
}

impl Record for LeaseRecord {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::REFRESH_LEASE;
}

/// Which issuer a resource was last authorized with.
#[derive(Serialize, Deserialize)]
pub(crate) struct ResourceIssuer {
    issuer: String,
    updated_at: Timestamp,
}

impl Record for ResourceIssuer {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::RESOURCE_ISSUER;
}

/// A client's DPoP key pair (RFC 9449) for one authorization server
/// (issuer) and resource.
///
/// A DPoP-bound access token, and for a public client its refresh token, is
/// bound to this key: a client that keeps its tokens but loses its key must
/// authorize again. So the key is created once, with compare-and-swap
/// ([`AuthStore::create_dpop_key`]: the first writer wins and every process
/// uses that key), kept beside the credentials and sealed like them when the
/// store encrypts (its private key is a declared secret field).
///
/// Core stores it and does no cryptography: the HTTP layer generates the
/// pair and signs proofs. `Debug` prints no key material.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DpopKey {
    /// The issuer and resource the key is used with.
    pub key: CredentialKey,
    /// The JWS algorithm of its proofs (`ES256`).
    pub algorithm: String,
    /// The private key, in the encoding the signer chose (PKCS#8 DER in
    /// base64url for `ES256`).
    pub private_key: Secret,
    /// The public key as a JWK, without any private member.
    pub public_jwk: serde_json::Value,
    /// The RFC 7638 SHA-256 thumbprint of `public_jwk`, base64url: the `jkt`
    /// that tokens bound to this key carry.
    pub thumbprint: String,
    /// When the pair was created.
    pub created_at: Timestamp,
}

impl DpopKey {
    /// A key pair created now for `key`.
    pub fn new(
        key: CredentialKey,
        algorithm: impl Into<String>,
        private_key: Secret,
        public_jwk: serde_json::Value,
        thumbprint: impl Into<String>,
    ) -> Self {
        DpopKey {
            key,
            algorithm: algorithm.into(),
            private_key,
            public_jwk,
            thumbprint: thumbprint.into(),
            created_at: Timestamp::now(),
        }
    }
}

impl Record for DpopKey {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::DPOP_KEY;
}

impl AuthStore {
    /// A store over `kv`.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        AuthStore {
            kv,
            seen_leases: Arc::default(),
        }
    }

    /// Whether this process has watched the lease at `key` stay at
    /// `version` for at least `ttl`.
    fn lease_left_for(&self, key: &str, version: Version, ttl: Duration) -> bool {
        let now = tokio::time::Instant::now();
        let mut seen = self.seen_leases.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() > 1024 {
            seen.retain(|_, (_, since)| now.duration_since(*since) < ttl * 4);
        }
        match seen.get(key) {
            Some((v, since)) if *v == version => now.duration_since(*since) >= ttl,
            _ => {
                seen.insert(key.to_owned(), (version, now));
                false
            }
        }
    }

    fn token_key(key: &CredentialKey) -> Result<Key> {
        declare::CREDENTIALS.try_key(&[&key.issuer, &key.resource])
    }

    fn lease_key(key: &CredentialKey) -> Result<Key> {
        declare::REFRESH_LEASE.try_key(&[&key.issuer, &key.resource])
    }

    fn issuer_key(resource: &str) -> Result<Key> {
        declare::RESOURCE_ISSUER.try_key(&[resource])
    }

    fn pending_key(state: &str) -> Key {
        // The state value is a secret of the flow: only its hash names a key.
        declare::PENDING_AUTHORIZATION.key(&[&hex(&Sha256::digest(state.as_bytes()))])
    }

    /// The credential for `key`, with its version.
    pub async fn load(&self, key: &CredentialKey) -> Result<Option<Stored<Credentials>>> {
        read(&*self.kv, &Self::token_key(key)?).await
    }

    /// Stores a credential obtained by a full authorization (not a refresh),
    /// replacing whatever was there.
    pub async fn save(&self, credentials: &Credentials) -> Result<Version> {
        let v = write(
            &*self.kv,
            &Self::token_key(&credentials.key)?,
            credentials,
            PutMode::Overwrite,
            None,
        )
        .await?;
        debug!(issuer = %credentials.key.issuer, resource = %credentials.key.resource, "stored credentials");
        Ok(v)
    }

    /// Stores a refreshed credential only if the stored one is still at
    /// `expected`; otherwise [`Error::Conflict`], and the newer one stays.
    pub async fn replace(&self, credentials: &Credentials, expected: Version) -> Result<Version> {
        write(
            &*self.kv,
            &Self::token_key(&credentials.key)?,
            credentials,
            PutMode::Update(expected),
            None,
        )
        .await
    }

    /// Deletes the credential for `key` (after the server revoked it, say).
    pub async fn delete(&self, key: &CredentialKey) -> Result<()> {
        self.kv.delete(&Self::token_key(key)?, None).await?;
        Ok(())
    }

    /// Tries to take the refresh lease of `key`. `None` when another holder
    /// has it; a lease this process has watched unchanged for `ttl` (its
    /// holder died or hangs) is taken over by compare-and-swap.
    pub async fn try_lease(
        &self,
        key: &CredentialKey,
        ttl: Duration,
    ) -> Result<Option<RefreshLease>> {
        let lease_key = Self::lease_key(key)?;
        let record = LeaseRecord {
            holder: hex(&random_token()?),
            taken_at: Timestamp::now(),
        };
        let mode = match read::<LeaseRecord>(&*self.kv, &lease_key).await? {
            None => PutMode::Create,
            Some(held) if self.lease_left_for(&lease_key, held.version, ttl) => {
                PutMode::Update(held.version)
            }
            Some(_) => return Ok(None),
        };
        match write(&*self.kv, &lease_key, &record, mode, None).await {
            Ok(version) => {
                if let PutMode::Update(_) = mode {
                    warn!(issuer = %key.issuer, ?ttl, "took over a refresh lease its holder left unchanged for the lease TTL");
                }
                Ok(Some(RefreshLease {
                    key: lease_key,
                    version,
                    expires_at: record.taken_at.plus(ttl),
                }))
            }
            Err(Error::AlreadyExists { .. } | Error::Conflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Gives a lease back early. Releasing a lease that already lapsed (and
    /// may now be someone else's) does nothing.
    pub async fn release(&self, lease: RefreshLease) -> Result<()> {
        match self.kv.delete(&lease.key, Some(lease.version)).await {
            Ok(_) | Err(Error::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Refreshes the credential for `key` that the caller read at `seen`, at
    /// most once across every process sharing the store.
    ///
    /// * If the stored credential is already newer than `seen`, it is
    ///   returned and `refresh_fn` is not called.
    /// * Otherwise the lease is taken (held for at most `lease_ttl`),
    ///   `refresh_fn` is called with the stored credential, and its result is
    ///   stored with compare-and-swap before the lease is released.
    /// * A process that finds the lease taken waits for the holder's new
    ///   credential and returns it; when the holder leaves the lease
    ///   unchanged for `lease_ttl` (it died), the waiter takes it over. It
    ///   gives up with [`Error::Timeout`] after twice `lease_ttl`.
    ///
    /// A failing `refresh_fn` gives [`Error::Refresh`] and leaves the stored
    /// credential as it was.
    pub async fn refresh<F, Fut>(
        &self,
        key: &CredentialKey,
        seen: Version,
        lease_ttl: Duration,
        refresh_fn: F,
    ) -> Result<RefreshOutcome>
    where
        F: FnOnce(Credentials) -> Fut + Send,
        Fut: Future<Output = std::result::Result<Credentials, BoxError>> + Send,
    {
        let patience = lease_ttl.saturating_mul(2);
        let deadline = tokio::time::Instant::now() + patience;
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
        loop {
            let current = self.load(key).await?.ok_or_else(|| Error::NotFound {
                what: "credentials",
                detail: Some(format!(
                    "none stored for issuer {} and resource {}",
                    key.issuer, key.resource
                )),
            })?;
            if current.version != seen {
                debug!(issuer = %key.issuer, "credential already refreshed by another holder");
                return Ok(RefreshOutcome::RefreshedByOther(current));
            }
            if let Some(lease) = self.try_lease(key, lease_ttl).await? {
                // Someone may have refreshed between our read and our lease.
                let current = match self.load(key).await? {
                    Some(c) if c.version == seen => c,
                    Some(c) => {
                        self.release(lease).await?;
                        return Ok(RefreshOutcome::RefreshedByOther(c));
                    }
                    None => {
                        self.release(lease).await?;
                        return Err(Error::NotFound {
                            what: "credentials",
                            detail: None,
                        });
                    }
                };
                let result = refresh_fn(current.record).await;
                let outcome = match result {
                    Ok(fresh) => match self.replace(&fresh, seen).await {
                        Ok(version) => {
                            info!(issuer = %key.issuer, resource = %key.resource, "refreshed credential and stored the rotated token");
                            Ok(RefreshOutcome::Refreshed(Stored {
                                record: fresh,
                                version,
                            }))
                        }
                        Err(e) => Err(e),
                    },
                    Err(source) => {
                        warn!(issuer = %key.issuer, "credential refresh failed");
                        Err(Error::Refresh { source })
                    }
                };
                self.release(lease).await?;
                return outcome;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    operation: "waiting for another process's credential refresh",
                    after: patience,
                });
            }
            backoff.sleep_before(deadline).await;
        }
    }

    /// The issuer whose credentials are in force for `resource` (the
    /// canonical resource URL of a [`CredentialKey`]): the authorization
    /// server the client last authorized with there. Credentials of any other
    /// issuer stay stored under their own key and are never handed out for
    /// this resource while another issuer is in force.
    pub async fn current_issuer(&self, resource: &str) -> Result<Option<String>> {
        Ok(
            read::<ResourceIssuer>(&*self.kv, &Self::issuer_key(resource)?)
                .await?
                .map(|s| s.record.issuer),
        )
    }

    /// Records `issuer` as the authorization server in force for `resource`
    /// (after the client met a new one there).
    pub async fn set_current_issuer(&self, resource: &str, issuer: &str) -> Result<()> {
        let record = ResourceIssuer {
            issuer: issuer.to_owned(),
            updated_at: Timestamp::now(),
        };
        write(
            &*self.kv,
            &Self::issuer_key(resource)?,
            &record,
            PutMode::Overwrite,
            None,
        )
        .await?;
        debug!(issuer, resource, "issuer in force for resource recorded");
        Ok(())
    }

    /// Keeps a pending authorization under its `state` for `ttl`.
    pub async fn save_pending(&self, pending: &PendingAuthorization, ttl: Duration) -> Result<()> {
        let key = Self::pending_key(pending.state.expose_secret());
        write(&*self.kv, &key, pending, PutMode::Overwrite, Some(ttl)).await?;
        Ok(())
    }

    /// Takes the pending authorization for `state` out of the store: of two
    /// concurrent takers, only one gets it.
    pub async fn take_pending(&self, state: &str) -> Result<Option<PendingAuthorization>> {
        let key = Self::pending_key(state);
        let Some(stored) = read::<PendingAuthorization>(&*self.kv, &key).await? else {
            return Ok(None);
        };
        match self.kv.delete(&key, Some(stored.version)).await {
            Ok(_) => Ok(Some(stored.record)),
            Err(Error::Conflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the pending authorization for `state` without taking it.
    pub async fn peek_pending(&self, state: &str) -> Result<Option<PendingAuthorization>> {
        Ok(read(&*self.kv, &Self::pending_key(state))
            .await?
            .map(|s: Stored<PendingAuthorization>| s.record))
    }

    /// The DPoP key pair stored for `key`, with its version.
    ///
    /// A record that cannot be read (damaged, sealed with a key the ring no
    /// longer has, written by a newer version) is an error, never `None`: a
    /// caller that created a new pair instead would orphan every token bound
    /// to the old one.
    pub async fn load_dpop_key(&self, key: &CredentialKey) -> Result<Option<Stored<DpopKey>>> {
        read(
            &*self.kv,
            &declare::DPOP_KEY.try_key(&[&key.issuer, &key.resource])?,
        )
        .await
    }

    /// Stores `dpop` as the key pair of its issuer and resource unless one is
    /// stored already (a compare-and-swap `Create`), and returns the pair in
    /// force: `dpop` itself, or the one another process stored first. Every
    /// process sharing the store therefore signs with the same key.
    pub async fn create_dpop_key(&self, dpop: &DpopKey) -> Result<Stored<DpopKey>> {
        let key = declare::DPOP_KEY.try_key(&[&dpop.key.issuer, &dpop.key.resource])?;
        match write(&*self.kv, &key, dpop, PutMode::Create, None).await {
            Ok(version) => {
                info!(issuer = %dpop.key.issuer, resource = %dpop.key.resource, "stored a new DPoP key pair");
                Ok(Stored {
                    record: dpop.clone(),
                    version,
                })
            }
            Err(Error::AlreadyExists { .. }) => read(&*self.kv, &key).await?.ok_or_else(|| {
                Error::NotFound {
                    what: "DPoP key",
                    detail: Some(format!(
                        "created by another process and deleted again, for issuer {} and resource {}",
                        dpop.key.issuer, dpop.key.resource
                    )),
                }
            }),
            Err(e) => Err(e),
        }
    }

    /// The name of the backend holding credentials.
    pub fn backend_name(&self) -> &'static str {
        self.kv.backend_name()
    }

    /// Every stored credential key (for tools and migrations).
    pub async fn keys(&self) -> Result<Vec<Key>> {
        self.kv.list(declare::CREDENTIALS.prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[tokio::test]
    async fn the_first_dpop_key_stored_is_the_one_every_caller_gets() {
        let store = AuthStore::new(Arc::new(MemoryStore::new()));
        let key = CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap();
        assert!(store.load_dpop_key(&key).await.unwrap().is_none());
        let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "x": "AQ", "y": "Ag"});
        let first = DpopKey::new(
            key.clone(),
            "ES256",
            Secret::new("first"),
            jwk.clone(),
            "t1",
        );
        let second = DpopKey::new(key.clone(), "ES256", Secret::new("second"), jwk, "t2");
        let stored = store.create_dpop_key(&first).await.unwrap();
        assert_eq!(stored.record, first);
        let raced = store.create_dpop_key(&second).await.unwrap();
        assert_eq!(raced.record, first, "the later pair is not stored");
        let loaded = store.load_dpop_key(&key).await.unwrap().unwrap();
        assert_eq!(loaded.record.private_key.expose_secret(), "first");
        assert!(!format!("{loaded:?}").contains("first"));
    }

    #[tokio::test]
    async fn the_issuer_in_force_is_per_resource_and_replaced() {
        let store = AuthStore::new(Arc::new(MemoryStore::new()));
        let resource = "https://mcp.example/mcp";
        assert_eq!(store.current_issuer(resource).await.unwrap(), None);
        store
            .set_current_issuer(resource, "https://as1.example")
            .await
            .unwrap();
        store
            .set_current_issuer(resource, "https://as2.example")
            .await
            .unwrap();
        assert_eq!(
            store.current_issuer(resource).await.unwrap().as_deref(),
            Some("https://as2.example")
        );
        assert_eq!(
            store
                .current_issuer("https://other.example/mcp")
                .await
                .unwrap(),
            None
        );
    }
}
