//! OAuth for durable clients: credentials that survive restarts, keyed by the
//! authorization server's issuer, shared safely between processes.
//!
//! [`DurableAuth`] describes how a client authorizes with the MCP server at
//! one URL (the resource) and where its credentials live: a core
//! [`CredentialStore`] on any backend. [`DurableAuth::connect`] gives a
//! [`DurableAuthClient`], rmcp's `AuthClient` with durable stores inside, and
//! [`DurableAuthBuild::build_with_auth`] turns a
//! [`DurableClientBuilder`] into an authenticated, durable transport in one
//! call.
//!
//! # What it guarantees
//!
//! * **No second authorization after a restart.** The access token (with an
//!   absolute expiry), the rotated refresh token, the granted scopes, the
//!   client registration (id, secret or metadata-document URL) and the
//!   authorization server metadata are stored. A restarted client with a
//!   valid token makes no request to the authorization server: its first
//!   MCP request carries the stored token.
//! * **A refresh token is spent once.** Processes sharing a store refresh an
//!   expiring credential through core's lease (a compare-and-swap `Create`
//!   with a TTL): one process refreshes and stores the rotated token with
//!   compare-and-swap, the others wait for it and use it. The rotated
//!   refresh token always replaces the old one.
//! * **Credentials never cross authorization servers.** Credentials are keyed
//!   by issuer and resource. When the protected resource names a new
//!   authorization server, the client registers again there; the old
//!   issuer's client id, secret and tokens are never sent to the new one
//!   (MCP 2026-07-28, SEP-2352).
//! * **Pending authorizations** (PKCE verifier, `state`, expected issuer)
//!   are stored for a short TTL (10 minutes by default), under a hash of the
//!   `state`, and removed once used: a redirect may reach another process.
//! * **Secrets never print.** Tokens, client secrets and PKCE verifiers are
//!   core [`Secret`]s; no `Debug`, log line or
//!   error of this module carries their text.
//!
//! # How rmcp's unkeyed credential slot is mapped
//!
//! rmcp's `CredentialStore::load()` takes no key. There is one
//! [`DurableCredentialStore`] per resource; it holds which issuer is in force
//! for the resource (recorded in the store, so it survives restarts).
//! `load` returns only that issuer's credentials; `save` stores under the
//! credentials' own `issuer` and makes it the one in force. When discovery
//! finds a new issuer, [`DurableAuthClient::authorize`] switches to it before
//! anything else, so rmcp sees no credentials and the client registers
//! again; going back to an earlier issuer finds that issuer's registration.
//!
//! rmcp refreshes under its `acquire_refresh_guard` but refreshes whatever it
//! loads after taking the guard, so a process that waited would spend the
//! winner's new refresh token a second time. [`DurableAuthClient`] therefore
//! refreshes an expiring token itself, before rmcp looks at it, through
//! core's [`CredentialStore::refresh`] (which returns the winner's token to
//! a process that waited), with rmcp's own token request inside. rmcp's
//! guarded refresh remains as the fallback (a token the server refused
//! before its expiry).
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_persist_core::{MemoryStore, Stores};
//! use mcp_persist_transport_http::{
//!     auth::{DurableAuth, DurableAuthBuild},
//!     client::DurableClientBuilder,
//! };
//! use rmcp::ServiceExt;
//!
//! // A durable backend in production: `SqliteStore`, `FileStore`, ...
//! let stores = Stores::new(MemoryStore::new());
//! let endpoint = "https://mcp.example.com/mcp";
//! let auth = DurableAuth::new(endpoint, stores.credentials())
//!     .redirect_uri("http://127.0.0.1:8765/callback")
//!     .dynamic_registration("my-agent");
//! let (transport, _handle, auth_client) = DurableClientBuilder::new(endpoint, &stores)
//!     .build_with_auth(&auth)
//!     .await?;
//! if !auth_client.is_authorized().await {
//!     // Once per issuer: send the user to the URL, return the redirect.
//!     auth_client
//!         .authorize(None, |url: String| async move {
//!             println!("open {url}");
//!             let redirect: String = read_redirect_from_the_browser();
//!             Ok(redirect)
//!         })
//!         .await?;
//! }
//! let client = ().serve(transport).await?;
//! client.list_all_tools().await?;
//! # Ok(()) }
//! # fn read_redirect_from_the_browser() -> String { String::new() }
//! ```

mod store;

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use http::{HeaderName, HeaderValue};
use mcp_persist_core::{
    BoxError, ClientRegistration, CredentialStore, Error as StoreError, RefreshOutcome, Secret,
};
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::{
        AuthClient, AuthError, AuthorizationManager, JwtSigningAlgorithm, WWWAuthenticateParams,
        auth::{
            AuthorizationCallback, AuthorizationMetadata, ClientCredentialsConfig,
            OAuthClientConfig,
        },
        streamable_http_client::{
            StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
            StreamableHttpResponseLimits,
        },
    },
};
use tracing::{debug, info, warn};

use self::store::Shared;
pub use self::store::{DurableCredentialStore, DurableStateStore, UNNAMED_ISSUER};
use crate::client::{ClientError, ClientHandle, DurableClientBuilder, DurableTransport};

/// How long a refresh lease is held at most (30 s by default).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// How long a pending authorization is kept (10 minutes by default).
pub const DEFAULT_PENDING_TTL: Duration = Duration::from_secs(600);
/// How long before its expiry an access token is refreshed at most (60 s,
/// more than rmcp's own 30 s, so the shared refresh runs before rmcp's). A
/// short-lived token is refreshed once half its lifetime is left, as rmcp
/// does, so a token that lives less than the margin is not refreshed on
/// every call.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// The margin before expiry at which `credentials` are refreshed:
/// [`REFRESH_MARGIN`], or half the token's lifetime when that is shorter.
/// Never below rmcp's own (`min(30 s, lifetime / 2)`), so the shared
/// refresh still runs first.
fn refresh_margin(credentials: &mcp_persist_core::Credentials) -> Duration {
    let Some(expires_at) = credentials.expires_at else {
        return REFRESH_MARGIN;
    };
    let lifetime = expires_at
        .as_unix_millis()
        .saturating_sub(credentials.obtained_at.as_unix_millis());
    REFRESH_MARGIN.min(Duration::from_millis(lifetime) / 2)
}

/// How the client is registered with an authorization server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Registration {
    /// Dynamic client registration (RFC 7591) under this client name, with
    /// each new issuer.
    Dynamic {
        /// The `client_name` sent.
        client_name: String,
    },
    /// A client registered beforehand with one authorization server.
    PreRegistered {
        /// The client id.
        client_id: String,
        /// The client secret of a confidential client.
        client_secret: Option<Secret>,
        /// The issuer the registration belongs to; when set, the client
        /// refuses to present it to any other authorization server.
        issuer: Option<String>,
    },
    /// A client registered beforehand with a public key: it authenticates
    /// with a JWT assertion signed by the private key (`private_key_jwt`,
    /// RFC 7523). Only the client-credentials grant
    /// ([`DurableAuthClient::authorize_client_credentials`]) uses it.
    PreRegisteredKey {
        /// The client id (the assertion's `iss` and `sub`).
        client_id: String,
        /// The private key, PEM (PKCS#8 EC or RSA).
        signing_key: Secret,
        /// The signing algorithm, such as `ES256` or `RS256`.
        algorithm: JwtSigningAlgorithm,
        /// The issuer the registration belongs to; when set, the client
        /// refuses to present it to any other authorization server.
        issuer: Option<String>,
    },
    /// A client id metadata document (its HTTPS URL is the client id), used
    /// where the server supports it, dynamic registration elsewhere.
    MetadataDocument {
        /// The document's URL.
        url: String,
        /// The client name for dynamic registration where documents are not
        /// supported.
        client_name: String,
    },
}

/// Errors of [`DurableAuth`] and [`DurableAuthClient`]. None carries token
/// text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableAuthError {
    /// The resource URL is not valid.
    #[error("invalid resource URL")]
    InvalidResource {
        /// The validation error.
        #[source]
        source: StoreError,
    },
    /// The credential store failed.
    #[error("the credential store failed")]
    Store {
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// rmcp's OAuth machinery failed (discovery, registration, token
    /// exchange).
    #[error("OAuth {step} failed")]
    OAuth {
        /// Which step.
        step: &'static str,
        /// rmcp's error.
        #[source]
        source: Box<AuthError>,
    },
    /// The pre-registered client belongs to another authorization server.
    #[error(
        "the pre-registered client belongs to issuer {expected}, but the resource now names {found}; register with the new authorization server"
    )]
    IssuerMismatch {
        /// The issuer of the registration.
        expected: String,
        /// The issuer discovered.
        found: String,
    },
    /// The application's authorizer (browser, callback listener) failed.
    #[error("the authorization step of the user agent failed")]
    Authorizer {
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// The client-credentials grant needs a client registered beforehand
    /// with a secret ([`DurableAuth::pre_registered`]) or a signing key
    /// ([`Registration::PreRegisteredKey`]).
    #[error(
        "the client-credentials grant needs a pre-registered client with a secret or a signing key; configure DurableAuth::pre_registered or Registration::PreRegisteredKey"
    )]
    NoClientSecret,
    /// A client registered with a signing key authenticates only in the
    /// client-credentials grant; use
    /// [`DurableAuthClient::authorize_client_credentials`].
    #[error(
        "a client registered with a signing key uses the client-credentials grant; call authorize_client_credentials"
    )]
    KeyClientNeedsClientCredentials,
    /// Building the transport failed.
    #[error("building the durable transport failed")]
    Client {
        /// The builder's error.
        #[source]
        source: ClientError,
    },
}

fn oauth(step: &'static str) -> impl FnOnce(AuthError) -> DurableAuthError {
    move |source| DurableAuthError::OAuth {
        step,
        source: Box::new(source),
    }
}

/// How a client authorizes with one MCP server, and where its credentials
/// live. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct DurableAuth {
    store: CredentialStore,
    resource: String,
    redirect_uri: String,
    registration: Registration,
    scopes: Vec<String>,
    lease_ttl: Duration,
    pending_ttl: Duration,
    allow_private_addresses: bool,
}

impl DurableAuth {
    /// Authorization for the MCP server at `resource`, with credentials in
    /// `store`; dynamic registration as `mcp-persist-client`, redirect to
    /// `http://127.0.0.1/callback` until configured.
    pub fn new(resource: impl Into<String>, store: CredentialStore) -> Self {
        DurableAuth {
            store,
            resource: resource.into(),
            redirect_uri: "http://127.0.0.1/callback".to_owned(),
            registration: Registration::Dynamic {
                client_name: "mcp-persist-client".to_owned(),
            },
            scopes: Vec::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            pending_ttl: DEFAULT_PENDING_TTL,
            allow_private_addresses: false,
        }
    }

    /// The redirect URI registered and sent with authorization requests.
    pub fn redirect_uri(mut self, uri: impl Into<String>) -> Self {
        self.redirect_uri = uri.into();
        self
    }

    /// Registers dynamically under `client_name` with each issuer.
    pub fn dynamic_registration(mut self, client_name: impl Into<String>) -> Self {
        self.registration = Registration::Dynamic {
            client_name: client_name.into(),
        };
        self
    }

    /// Uses a client registered beforehand. With `issuer`, it is presented
    /// to that authorization server only.
    pub fn pre_registered(
        mut self,
        client_id: impl Into<String>,
        client_secret: Option<Secret>,
        issuer: Option<String>,
    ) -> Self {
        self.registration = Registration::PreRegistered {
            client_id: client_id.into(),
            client_secret,
            issuer,
        };
        self
    }

    /// Any [`Registration`].
    pub fn registration(mut self, registration: Registration) -> Self {
        self.registration = registration;
        self
    }

    /// Scopes requested when the server's challenge and metadata name none.
    pub fn scopes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, scopes: I) -> Self {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// How long one process may hold the refresh lease (30 s by default);
    /// others wait at most this long for its result.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a pending authorization is kept (10 minutes by default).
    pub fn pending_ttl(mut self, ttl: Duration) -> Self {
        self.pending_ttl = ttl;
        self
    }

    /// Lets discovered metadata name hosts at private addresses (an
    /// authorization server on a corporate network); see rmcp's
    /// `AuthorizationManager::new_allowing_private_addresses`.
    pub fn allow_private_addresses(mut self, allow: bool) -> Self {
        self.allow_private_addresses = allow;
        self
    }

    /// An authenticated HTTP client over `http` (a `reqwest::Client`, or any
    /// rmcp HTTP client), loaded from the store.
    ///
    /// With stored credentials and metadata this makes no network request:
    /// the stored metadata is installed instead of discovering it again, and
    /// the stored registration (with its secret) configures the client.
    pub async fn connect<C>(&self, http: C) -> Result<DurableAuthClient<C>, DurableAuthError>
    where
        C: StreamableHttpClient + Sync,
    {
        let resource = mcp_persist_core::canonical_url("resource URL", &self.resource)
            .map_err(|source| DurableAuthError::InvalidResource { source })?;
        let issuer = self
            .store
            .current_issuer(&resource)
            .await
            .map_err(|source| DurableAuthError::Store { source })?;
        let shared = Arc::new(Shared::new(
            self.store.clone(),
            resource,
            self.lease_ttl,
            self.pending_ttl,
            issuer.clone(),
        ));
        let mut manager = if self.allow_private_addresses {
            AuthorizationManager::new_allowing_private_addresses(self.resource.as_str()).await
        } else {
            AuthorizationManager::new(self.resource.as_str()).await
        }
        .map_err(oauth("client setup"))?;
        manager.set_credential_store(DurableCredentialStore {
            shared: shared.clone(),
        });
        manager.set_state_store(DurableStateStore {
            shared: shared.clone(),
        });

        if let Some(issuer) = &issuer {
            let key = shared
                .key(issuer)
                .map_err(|source| DurableAuthError::Store { source })?;
            let stored = self
                .store
                .load(&key)
                .await
                .map_err(|source| DurableAuthError::Store { source })?;
            if let Some(stored) = stored {
                let record = stored.record;
                if let Some(metadata) = record.server_metadata.clone() {
                    match serde_json::from_value::<AuthorizationMetadata>(metadata.clone()) {
                        Ok(m) => {
                            manager.set_metadata(m);
                            shared.set_metadata(metadata);
                        }
                        Err(_) => warn!(
                            issuer = %issuer,
                            "stored authorization server metadata does not parse; discovering it again"
                        ),
                    }
                }
                shared.set_registration(record.client.clone());
                if manager
                    .initialize_from_store()
                    .await
                    .map_err(oauth("loading stored credentials"))?
                {
                    configure(&mut manager, &record.client, &self.redirect_uri)?;
                    info!(
                        issuer = %issuer,
                        resource = %self.resource,
                        expired = record.expires_within(Duration::ZERO),
                        "credential loaded from the store"
                    );
                }
            }
        }

        Ok(DurableAuthClient {
            inner: AuthClient::new(http, manager),
            shared,
            config: Arc::new(self.clone()),
            refreshing: Arc::new(tokio::sync::Mutex::new(())),
        })
    }
}

fn configure(
    manager: &mut AuthorizationManager,
    reg: &ClientRegistration,
    redirect_uri: &str,
) -> Result<(), DurableAuthError> {
    let mut config = OAuthClientConfig::new(reg.client_id.clone(), redirect_uri);
    if let Some(secret) = &reg.client_secret {
        config = config.with_client_secret(secret.expose_secret());
    }
    manager
        .configure_client(config)
        .map_err(oauth("client configuration"))
}

/// rmcp's `AuthClient` with durable credential and state stores, and a
/// refresh shared between processes. Use it as the HTTP client of a durable
/// transport ([`DurableAuthBuild::build_with_auth`]); clones share state.
pub struct DurableAuthClient<C> {
    inner: AuthClient<C>,
    shared: Arc<Shared>,
    config: Arc<DurableAuth>,
    refreshing: Arc<tokio::sync::Mutex<()>>,
}

impl<C: Clone> Clone for DurableAuthClient<C> {
    fn clone(&self) -> Self {
        DurableAuthClient {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            config: self.config.clone(),
            refreshing: self.refreshing.clone(),
        }
    }
}

impl<C> std::fmt::Debug for DurableAuthClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableAuthClient")
            .field("resource", &self.shared.resource)
            .field("issuer", &self.shared.issuer())
            .finish()
    }
}

impl<C> DurableAuthClient<C> {
    /// rmcp's `AuthClient` inside (its `auth_manager` is shared).
    pub fn auth_client(&self) -> &AuthClient<C> {
        &self.inner
    }

    /// The issuer whose credentials are in force, if any.
    pub fn issuer(&self) -> Option<String> {
        self.shared.issuer()
    }

    /// Whether usable credentials are stored for the issuer in force: an
    /// unexpired access token, or a refresh token.
    pub async fn is_authorized(&self) -> bool {
        let Some(issuer) = self.shared.issuer() else {
            return false;
        };
        let Ok(key) = self.shared.key(&issuer) else {
            return false;
        };
        match self.shared.store.load(&key).await {
            Ok(Some(c)) => {
                c.record.refresh_token.is_some() || !c.record.expires_within(Duration::ZERO)
            }
            Ok(None) => false,
            Err(e) => {
                warn!(error = %e, "reading stored credentials failed");
                false
            }
        }
    }

    /// Runs the authorization-code flow with the authorization server the
    /// resource names now.
    ///
    /// Discovery runs afresh (from `challenge`, the `WWW-Authenticate` value
    /// of a 401, when given). If the issuer differs from the one in force,
    /// the client switches to it: the previous issuer's credentials stay
    /// stored but are never used here, and the client registers with the new
    /// server (unless a registration for that issuer is stored). `authorize`
    /// gets the authorization URL and returns the redirect URL the user agent
    /// was sent back to (`code`, `state`, `iss`).
    pub async fn authorize<F, Fut>(
        &self,
        challenge: Option<&str>,
        authorize: F,
    ) -> Result<(), DurableAuthError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<String, BoxError>>,
    {
        let url = {
            let mut manager = self.inner.auth_manager.lock().await;
            let (issuer, metadata) = self.discover(&mut manager, challenge).await?;
            let registration = self
                .registration_for(&mut manager, &issuer, &metadata)
                .await?;
            self.shared.set_registration(registration);

            let challenge_scope = challenge.and_then(scope_of_challenge);
            let defaults: Vec<&str> = self.config.scopes.iter().map(String::as_str).collect();
            let scopes = manager.select_scopes(challenge_scope.as_deref(), &defaults);
            let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
            manager
                .get_authorization_url(&scopes)
                .await
                .map_err(oauth("authorization request"))?
        };
        debug!(resource = %self.shared.resource, "authorization URL ready; handing it to the user agent");
        let redirect = authorize(url)
            .await
            .map_err(|source| DurableAuthError::Authorizer { source })?;
        let callback = AuthorizationCallback::from_redirect_url(&redirect)
            .map_err(oauth("authorization response"))?;
        let manager = self.inner.auth_manager.lock().await;
        manager
            .exchange_code_for_token_with_issuer(
                &callback.code,
                &callback.csrf_token,
                callback.issuer.as_deref(),
            )
            .await
            .map_err(oauth("token exchange"))?;
        info!(issuer = ?self.shared.issuer(), resource = %self.shared.resource, "authorized");
        Ok(())
    }

    /// Gets a token with the OAuth client-credentials grant (SEP-1046), for a
    /// client acting on its own behalf: no user agent, no redirect. The
    /// client is the one registered beforehand, with a secret
    /// ([`DurableAuth::pre_registered`]) or a signing key
    /// ([`Registration::PreRegisteredKey`], a `private_key_jwt` assertion);
    /// the scope is the challenge's, else the configured scopes. The token is
    /// stored like any other, so a restarted process uses it without asking
    /// again; the grant issues no refresh token, so once it expires (or a
    /// call fails with a challenge) call this again.
    pub async fn authorize_client_credentials(
        &self,
        challenge: Option<&str>,
    ) -> Result<(), DurableAuthError> {
        let (client_id, expected) = match &self.config.registration {
            Registration::PreRegistered {
                client_id,
                client_secret: Some(_),
                issuer,
            }
            | Registration::PreRegisteredKey {
                client_id, issuer, ..
            } => (client_id, issuer),
            _ => return Err(DurableAuthError::NoClientSecret),
        };
        let mut manager = self.inner.auth_manager.lock().await;
        let (issuer, _) = self.discover(&mut manager, challenge).await?;
        if let Some(expected) = expected
            && *expected != issuer
        {
            return Err(DurableAuthError::IssuerMismatch {
                expected: expected.clone(),
                found: issuer,
            });
        }
        let challenge_scope = challenge.and_then(scope_of_challenge);
        let defaults: Vec<&str> = self.config.scopes.iter().map(String::as_str).collect();
        let scopes = manager.select_scopes(challenge_scope.as_deref(), &defaults);
        let resource = Some(self.shared.resource.clone());
        let grant = match &self.config.registration {
            Registration::PreRegisteredKey {
                signing_key,
                algorithm,
                ..
            } => {
                self.shared.set_registration(ClientRegistration {
                    client_id: client_id.clone(),
                    client_secret: None,
                    metadata_url: None,
                    token_endpoint_auth_method: Some("private_key_jwt".to_owned()),
                });
                ClientCredentialsConfig::PrivateKeyJwt {
                    client_id: client_id.clone(),
                    signing_key: signing_key.expose_secret().as_bytes().to_vec(),
                    signing_algorithm: *algorithm,
                    token_endpoint_audience: None,
                    scopes,
                    resource,
                }
            }
            Registration::PreRegistered {
                client_secret: Some(client_secret),
                ..
            } => {
                self.shared.set_registration(ClientRegistration {
                    client_id: client_id.clone(),
                    client_secret: Some(client_secret.clone()),
                    metadata_url: None,
                    token_endpoint_auth_method: None,
                });
                ClientCredentialsConfig::ClientSecret {
                    client_id: client_id.clone(),
                    client_secret: client_secret.expose_secret().to_owned(),
                    scopes,
                    resource,
                }
            }
            _ => return Err(DurableAuthError::NoClientSecret),
        };
        manager
            .validate_client_credentials_metadata(&grant)
            .map_err(oauth("client-credentials metadata check"))?;
        manager
            .configure_client_credentials(&grant)
            .map_err(oauth("client configuration"))?;
        // Stores the token through the durable credential store.
        manager
            .exchange_client_credentials(&grant)
            .await
            .map_err(oauth("client-credentials token request"))?;
        info!(issuer = %issuer, resource = %self.shared.resource, "authorized with client credentials");
        Ok(())
    }

    /// Discovers the authorization server (through the challenge when there
    /// is one) and makes its issuer the one in force for this resource:
    /// from here on, rmcp sees only that issuer's credentials.
    async fn discover(
        &self,
        manager: &mut AuthorizationManager,
        challenge: Option<&str>,
    ) -> Result<(String, AuthorizationMetadata), DurableAuthError> {
        let resolution = match challenge {
            Some(_) => manager.resolve_metadata_from_challenge(challenge).await,
            None => manager.resolve_metadata().await,
        }
        .map_err(oauth("discovery"))?;
        let metadata = resolution.metadata;
        let issuer = metadata
            .issuer
            .clone()
            .unwrap_or_else(|| UNNAMED_ISSUER.to_owned());
        let metadata_json = serde_json::to_value(&metadata).ok();
        manager.set_metadata(metadata.clone());
        self.shared
            .switch_issuer(&issuer)
            .await
            .map_err(|source| DurableAuthError::Store { source })?;
        if let Some(json) = metadata_json {
            self.shared.set_metadata(json);
        }
        Ok((issuer, metadata))
    }

    async fn registration_for(
        &self,
        manager: &mut AuthorizationManager,
        issuer: &str,
        metadata: &AuthorizationMetadata,
    ) -> Result<ClientRegistration, DurableAuthError> {
        let key = self
            .shared
            .key(issuer)
            .map_err(|source| DurableAuthError::Store { source })?;
        let stored = self
            .shared
            .store
            .load(&key)
            .await
            .map_err(|source| DurableAuthError::Store { source })?
            .map(|s| s.record.client);
        let redirect = self.config.redirect_uri.as_str();
        let reg = match (&self.config.registration, stored) {
            (Registration::PreRegisteredKey { .. }, _) => {
                return Err(DurableAuthError::KeyClientNeedsClientCredentials);
            }
            (
                Registration::PreRegistered {
                    issuer: Some(expected),
                    ..
                },
                _,
            ) if expected != issuer => {
                return Err(DurableAuthError::IssuerMismatch {
                    expected: expected.clone(),
                    found: issuer.to_owned(),
                });
            }
            (
                Registration::PreRegistered {
                    client_id,
                    client_secret,
                    ..
                },
                _,
            ) => ClientRegistration {
                client_id: client_id.clone(),
                client_secret: client_secret.clone(),
                metadata_url: None,
                token_endpoint_auth_method: None,
            },
            (_, Some(stored)) => {
                debug!(issuer, "reusing the stored registration with this issuer");
                stored
            }
            (Registration::MetadataDocument { url, .. }, None)
                if metadata
                    .additional_fields
                    .get("client_id_metadata_document_supported")
                    .and_then(serde_json::Value::as_bool)
                    == Some(true) =>
            {
                ClientRegistration {
                    client_id: url.clone(),
                    client_secret: None,
                    metadata_url: Some(url.clone()),
                    token_endpoint_auth_method: Some("none".to_owned()),
                }
            }
            (
                Registration::Dynamic { client_name }
                | Registration::MetadataDocument { client_name, .. },
                None,
            ) => {
                info!(
                    issuer,
                    "registering the client with this authorization server"
                );
                let scopes: Vec<&str> = self.config.scopes.iter().map(String::as_str).collect();
                let config = manager
                    .register_client(client_name, redirect, &scopes)
                    .await
                    .map_err(oauth("client registration"))?;
                return Ok(ClientRegistration {
                    client_id: config.client_id,
                    client_secret: config.client_secret.map(Secret::new),
                    metadata_url: None,
                    token_endpoint_auth_method: None,
                });
            }
        };
        configure(manager, &reg, redirect)?;
        Ok(reg)
    }

    /// Refreshes an expiring stored token once across every process sharing
    /// the store, before rmcp reads it. Failures are logged and left to
    /// rmcp's own refresh.
    async fn ensure_fresh(&self) {
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
            Err(e) => {
                warn!(issuer = %issuer, error = %e, "shared refresh failed; rmcp will retry on its own")
            }
        }
    }
}

/// The `WWW-Authenticate` challenge behind an rmcp error, when the call
/// failed because the server answered 401 (no or a refused token) or 403
/// (`insufficient_scope`).
///
/// Pass it to [`DurableAuthClient::authorize`] and try again: the client
/// then requests the scope the challenge names (step-up authorization) and
/// discovers the authorization server through the challenge's
/// `resource_metadata`. Walks the error's sources, so an rmcp
/// `ServiceError` or `ClientInitializeError` is found inside an
/// application's own error too; rmcp's `auth_challenge` of each reads the
/// challenge out of the transport error it holds.
///
/// ```no_run
/// # async fn run(
/// #     auth_client: &mcp_persist_transport_http::auth::DurableAuthClient<reqwest::Client>,
/// #     service: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use mcp_persist_transport_http::auth::auth_challenge;
/// use rmcp::model::CallToolRequestParams;
///
/// if let Err(e) = service.call_tool(CallToolRequestParams::new("write")).await {
///     let Some(challenge) = auth_challenge(&e) else { return Err(e.into()) };
///     auth_client
///         .authorize(Some(&challenge), |url: String| async move { Ok(url) })
///         .await?;
///     // Connect again: the new token carries the scope the server asked for.
/// }
/// # Ok(()) }
/// ```
pub fn auth_challenge(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rmcp::{
        service::{ClientInitializeError, ServiceError},
        transport::streamable_http_client::{AuthRequiredError, InsufficientScopeError},
    };
    let mut next = Some(error);
    while let Some(e) = next {
        let challenge = if let Some(e) = e.downcast_ref::<ServiceError>() {
            e.auth_challenge()
        } else if let Some(e) = e.downcast_ref::<ClientInitializeError>() {
            e.auth_challenge()
        } else if let Some(e) = e.downcast_ref::<AuthRequiredError>() {
            Some(e.www_authenticate_header.as_str())
        } else if let Some(e) = e.downcast_ref::<InsufficientScopeError>() {
            Some(e.www_authenticate_header.as_str())
        } else {
            None
        };
        if let Some(challenge) = challenge {
            return Some(challenge.to_owned());
        }
        next = e.source();
    }
    None
}

/// The `scope` parameter of a `WWW-Authenticate: Bearer` challenge, read
/// with rmcp's own parser (quoted or bare values).
fn scope_of_challenge(header: &str) -> Option<String> {
    // The base only resolves a relative `resource_metadata`, unused here.
    let base = reqwest::Url::parse("http://localhost/").ok()?;
    WWWAuthenticateParams::parse(header, &base).scope
}

impl<C> StreamableHttpClient for DurableAuthClient<C>
where
    C: StreamableHttpClient + Send + Sync,
{
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.ensure_fresh().await;
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.ensure_fresh().await;
        self.inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.ensure_fresh().await;
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.ensure_fresh().await;
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        self.ensure_fresh().await;
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        self.ensure_fresh().await;
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// What [`DurableAuthBuild::build_with_auth`] gives: the transport for
/// rmcp's `serve`, the durable client's handle, and the authenticated HTTP
/// client inside the transport (for [`DurableAuthClient::authorize`]).
pub type AuthenticatedTransport = (
    DurableTransport<DurableAuthClient<reqwest::Client>>,
    ClientHandle,
    DurableAuthClient<reqwest::Client>,
);

/// Builds an authenticated, durable transport from a
/// [`DurableClientBuilder`] in one call.
pub trait DurableAuthBuild {
    /// Loads the credentials of `auth` (no network request when they are
    /// stored), wraps rmcp's default HTTP client in a [`DurableAuthClient`]
    /// and builds the durable transport over it.
    fn build_with_auth(
        self,
        auth: &DurableAuth,
    ) -> impl Future<Output = Result<AuthenticatedTransport, DurableAuthError>> + Send;
}

impl DurableAuthBuild for DurableClientBuilder {
    async fn build_with_auth(
        self,
        auth: &DurableAuth,
    ) -> Result<AuthenticatedTransport, DurableAuthError> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| DurableAuthError::Client {
                source: ClientError::Http {
                    source: Box::new(e),
                },
            })?;
        let client = auth.connect(http).await?;
        let (transport, handle) = self
            .build_with_client(client.clone())
            .await
            .map_err(|source| DurableAuthError::Client { source })?;
        Ok((transport, handle, client))
    }
}

#[cfg(test)]
mod tests {
    use mcp_persist_core::Timestamp;
    use rmcp::{
        service::{ClientInitializeError, ServiceError},
        transport::{
            DynamicTransportError,
            streamable_http_client::{AuthRequiredError, InsufficientScopeError},
        },
    };

    use super::{store::to_rmcp, *};

    fn transport_error(e: StreamableHttpError<std::io::Error>) -> DynamicTransportError {
        DynamicTransportError::from_parts("test", std::any::TypeId::of::<()>(), Box::new(e))
    }

    #[test]
    fn challenges_are_found_behind_rmcp_errors() {
        let step_up = r#"Bearer error="insufficient_scope", scope="mcp:basic mcp:write""#;
        let call = ServiceError::TransportSend(transport_error(
            StreamableHttpError::InsufficientScope(InsufficientScopeError::new(
                step_up.to_owned(),
                Some("mcp:basic mcp:write".to_owned()),
            )),
        ));
        assert_eq!(auth_challenge(&call).as_deref(), Some(step_up));
        // Wrapped again, as an application's error type would.
        let wrapped = anyhow::Error::new(call).context("calling the write tool");
        let found = wrapped.chain().find_map(auth_challenge);
        assert_eq!(found.as_deref(), Some(step_up));
        assert_eq!(
            scope_of_challenge(step_up).as_deref(),
            Some("mcp:basic mcp:write")
        );

        let first =
            r#"Bearer resource_metadata="http://127.0.0.1:1/.well-known/oauth-protected-resource""#;
        let init = ClientInitializeError::TransportError {
            error: transport_error(StreamableHttpError::AuthRequired(AuthRequiredError::new(
                first.to_owned(),
            ))),
            context: "send initialize request".into(),
        };
        assert_eq!(auth_challenge(&init).as_deref(), Some(first));

        let other = ServiceError::TransportSend(transport_error(StreamableHttpError::Io(
            std::io::Error::other("connection reset"),
        )));
        assert_eq!(auth_challenge(&other), None);
        assert_eq!(auth_challenge(&ServiceError::TransportClosed), None);
    }

    #[test]
    fn short_lived_tokens_refresh_at_half_their_lifetime() {
        let creds = |lifetime_ms: u64| mcp_persist_core::Credentials {
            key: mcp_persist_core::CredentialKey::new("https://as.example", "https://mcp.example")
                .expect("valid key"),
            access_token: Secret::new("AT"),
            token_type: "Bearer".into(),
            expires_at: Some(Timestamp::from_unix_millis(1_000_000 + lifetime_ms)),
            refresh_token: Some(Secret::new("RT")),
            scopes: Vec::new(),
            client: ClientRegistration {
                client_id: "client-1".into(),
                client_secret: None,
                metadata_url: None,
                token_endpoint_auth_method: None,
            },
            server_metadata: None,
            obtained_at: Timestamp::from_unix_millis(1_000_000),
        };
        assert_eq!(refresh_margin(&creds(3_600_000)), REFRESH_MARGIN);
        assert_eq!(refresh_margin(&creds(20_000)), Duration::from_secs(10));
        assert_eq!(refresh_margin(&creds(0)), Duration::ZERO);
        let mut no_expiry = creds(0);
        no_expiry.expires_at = None;
        assert_eq!(refresh_margin(&no_expiry), REFRESH_MARGIN);
    }

    #[test]
    fn absolute_expiry_round_trips_through_rmcp_shape() {
        let creds = mcp_persist_core::Credentials {
            key: mcp_persist_core::CredentialKey::new(
                "https://as.example",
                "https://mcp.example/mcp",
            )
            .expect("valid key"),
            access_token: Secret::new("AT-secret-1"),
            token_type: "Bearer".into(),
            expires_at: Some(Timestamp::from_unix_millis(1_000_000_000 + 3_600_000)),
            refresh_token: Some(Secret::new("RT-secret-1")),
            scopes: vec!["mcp:basic".into()],
            client: ClientRegistration {
                client_id: "client-1".into(),
                client_secret: Some(Secret::new("CS-secret-1")),
                metadata_url: None,
                token_endpoint_auth_method: None,
            },
            server_metadata: None,
            obtained_at: Timestamp::from_unix_millis(1_000_000_000),
        };
        let rmcp = to_rmcp(&creds).expect("converts");
        assert_eq!(rmcp.token_received_at, Some(1_000_000));
        assert_eq!(rmcp.issuer.as_deref(), Some("https://as.example"));
        let debug = format!("{rmcp:?} {creds:?}");
        assert!(!debug.contains("secret-1"), "{debug}");
        let shared = Shared::new(
            CredentialStore::new(Arc::new(mcp_persist_core::MemoryStore::new())),
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
