//! OAuth for durable clients: credentials that survive restarts, keyed by the
//! authorization server's issuer, shared safely between processes.
//!
//! [`DurableAuth`] describes how a client authorizes with the MCP server at
//! one URL (the resource) and where its credentials live: a core
//! [`AuthStore`] on any backend. [`DurableAuth::connect`] gives a
//! [`DurableAuthClient`], rmcp's `AuthClient` with durable stores inside, and
//! [`DurableAuthBuild::build_with_auth`] turns a
//! [`DurableClientBuilder`](crate::client::DurableClientBuilder) into an authenticated, durable transport in one
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
//! * **Secrets never print.** Tokens, client secrets, PKCE verifiers, DPoP
//!   private keys and proofs, and identity assertions are core [`Secret`]s
//!   or never leave the request they are made for; no `Debug`, log line or
//!   error of this module carries their text.
//!
//! # DPoP (RFC 9449)
//!
//! Where the authorization server advertises `ES256` in
//! `dpop_signing_alg_values_supported` (and [`DurableAuth::dpop`] is not
//! turned off), token requests carry a DPoP proof, and the DPoP-bound token
//! they return is presented with `Authorization: DPoP` and a fresh proof
//! (`htm`, `htu`, `iat`, `jti`, `ath`) on every MCP request. A public
//! client's refresh token is bound to the same key, so the key is as durable
//! as the token: one ES256 key pair per issuer and resource, created once
//! (compare-and-swap: every process sharing the store signs with the first
//! one stored) and kept in the credential store, sealed at rest when the
//! store encrypts. A stored key that cannot be read is
//! [`DurableAuthError::DpopKey`], never a silent new key that would orphan
//! the refresh token. A server's `DPoP-Nonce` is kept per origin (in
//! memory), and a `use_dpop_nonce` refusal is retried once with it. The
//! shared refresh works as for bearer tokens, the proof signed with the
//! stored key.
//!
//! # Grants without a user
//!
//! * [`DurableAuthClient::authorize_client_credentials`] lets the client act
//!   on its own behalf (SEP-1046).
//! * [`DurableAuthClient::authorize_workload_identity`] lets a workload present
//!   the JWT its platform issued ([`AssertionSource`], a file or a callback)
//!   with the JWT-bearer grant (SEP-1933); the token is renewed with a fresh
//!   assertion when it nears expiry, once across processes.
//! * [`DurableAuthClient::authorize_enterprise`] runs enterprise-managed
//!   authorization (SEP-990): the user's assertion at the enterprise identity
//!   provider is exchanged for an ID-JAG and redeemed at the MCP server's
//!   authorization server ([`EnterpriseIdentity`]).
//!
//! Every grant's tokens and their expiry are stored by issuer and resource
//! alike, so a restarted process uses them without asking again.
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
//! core's [`AuthStore::refresh`] (which returns the winner's token to
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

mod address;
mod challenge;
mod client_credentials;
mod code_flow;
mod connect;
mod discovery;
mod dpop;
mod dpop_http;
mod enterprise;
mod http;
mod lease;
mod oauth_http;
mod refresh;
mod shared;
mod store;
mod token;
mod workload;

use std::{future::Future, sync::Arc, time::Duration};

use mcp_persist_core::{AuthStore, BoxError, Error as StoreError, Secret};
use rmcp::transport::{AuthClient, AuthError, JwtSigningAlgorithm};
use tracing::warn;

use self::shared::Shared;
pub use self::{
    challenge::auth_challenge,
    dpop::DpopKeyProblem,
    enterprise::EnterpriseIdentity,
    shared::UNNAMED_ISSUER,
    store::{DurableCredentialStore, DurableStateStore},
    workload::AssertionSource,
};
use crate::client::{ClientError, ClientHandle, DurableTransport};

/// A `tracing` filter directive that keeps rmcp's OAuth module at `info`.
///
/// rmcp 3.11 logs the authorization code at `debug` (`start exchange code
/// for token: "<code>"`, in `rmcp::transport::auth`), and a code in a log
/// lets its reader finish the flow while the code is fresh. Every other
/// secret of a flow (tokens, client secrets, PKCE verifiers, `state`) stays
/// out of logs at every level. Add this directive whenever the application
/// logs at `debug` or below, after its own directives so it wins:
///
/// ```
/// # use mcp_persist_transport_http::auth::RMCP_AUTH_LOG_DIRECTIVE;
/// // tracing_subscriber::EnvFilter::new(format!("debug,{RMCP_AUTH_LOG_DIRECTIVE}"))
/// assert_eq!(RMCP_AUTH_LOG_DIRECTIVE, "rmcp::transport::auth=info");
/// ```
///
/// [`DurableAuthClient::authorize`] warns once when the directive is
/// missing and rmcp's debug output would reach a subscriber. Upstream, rmcp
/// should not format the code into that message (log that an exchange
/// started, without the code).
pub const RMCP_AUTH_LOG_DIRECTIVE: &str = "rmcp::transport::auth=info";

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
    /// A workload that proves its identity with a JWT its platform issues
    /// (SEP-1933): the JWT-bearer grant
    /// ([`DurableAuthClient::authorize_workload_identity`]).
    WorkloadIdentity {
        /// The client id sent with the grant, where the authorization server
        /// knows the workload by one.
        client_id: Option<String>,
        /// Where each fresh assertion comes from.
        assertion: AssertionSource,
        /// The issuer the workload is trusted by; when set, no other
        /// authorization server gets its assertions.
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
    /// The stored DPoP key pair of an issuer and resource cannot be used.
    /// Tokens bound to it (a public client's refresh token too) are useless
    /// without it, so no new key is made in its place: restore the record
    /// (or the sealing key that opens it), or delete both the credentials
    /// and the key record (`mcp-persist check` names a damaged one,
    /// `mcp-persist rm` deletes it) and authorize again.
    #[error("the DPoP key for issuer {issuer} and resource {resource} {problem}")]
    DpopKey {
        /// The issuer.
        issuer: String,
        /// The resource.
        resource: String,
        /// What is wrong with it.
        problem: DpopKeyProblem,
        /// The store's error, when reading failed.
        #[source]
        source: Option<BoxError>,
    },
    /// The workload's assertion source failed or gave nothing.
    #[error("the workload identity assertion could not be obtained")]
    Assertion {
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// [`DurableAuthClient::authorize_workload_identity`] needs
    /// [`Registration::WorkloadIdentity`].
    #[error(
        "the JWT-bearer grant needs a workload identity; configure Registration::WorkloadIdentity"
    )]
    NotWorkloadIdentity,
    /// A workload identity authorizes only with the JWT-bearer grant; use
    /// [`DurableAuthClient::authorize_workload_identity`].
    #[error("a workload identity uses the JWT-bearer grant; call authorize_workload_identity")]
    WorkloadIdentityNeedsJwtBearer,
    /// The authorization server refused a token request of this crate's own
    /// grants (it is not retried).
    #[error("the {grant} token request was refused with HTTP {status}{}", error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default())]
    TokenRequest {
        /// The grant type.
        grant: &'static str,
        /// The HTTP status.
        status: u16,
        /// The OAuth error code, when the response had one.
        error: Option<String>,
    },
    /// A token request of this crate's own grants did not get an answer.
    #[error("the {grant} token request failed")]
    TokenTransport {
        /// The grant type.
        grant: &'static str,
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
    /// The authorization server's metadata names no token endpoint.
    #[error("the authorization server's metadata names no usable token endpoint")]
    NoTokenEndpoint,
    /// Enterprise-managed authorization needs a client registered beforehand
    /// with the resource's authorization server
    /// ([`DurableAuth::pre_registered`]).
    #[error(
        "enterprise-managed authorization needs a pre-registered client; configure DurableAuth::pre_registered"
    )]
    EnterpriseNeedsPreRegisteredClient,
    /// An exchange of enterprise-managed authorization failed (rmcp's
    /// sanitized error: no token or response body in it).
    #[error("enterprise-managed authorization failed")]
    Enterprise {
        /// rmcp's error.
        #[source]
        source: rmcp::transport::auth::enterprise::EmaError,
    },
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
    store: AuthStore,
    resource: String,
    redirect_uri: String,
    registration: Registration,
    scopes: Vec<String>,
    refresh_scopes: Vec<String>,
    lease_ttl: Duration,
    pending_ttl: Duration,
    allow_private_addresses: bool,
    dpop: bool,
    telemetry: mcp_persist_core::telemetry::Telemetry,
}

impl DurableAuth {
    /// Authorization for the MCP server at `resource`, with credentials in
    /// `store`; dynamic registration as `mcp-persist-client`, redirect to
    /// `http://127.0.0.1/callback` until configured.
    pub fn new(resource: impl Into<String>, store: AuthStore) -> Self {
        DurableAuth {
            store,
            resource: resource.into(),
            redirect_uri: "http://127.0.0.1/callback".to_owned(),
            registration: Registration::Dynamic {
                client_name: "mcp-persist-client".to_owned(),
            },
            scopes: Vec::new(),
            refresh_scopes: Vec::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            pending_ttl: DEFAULT_PENDING_TTL,
            allow_private_addresses: false,
            dpop: true,
            telemetry: mcp_persist_core::telemetry::Telemetry::disabled(),
        }
    }

    /// Where refreshes are counted (`mcp_persist.credentials.refreshes`);
    /// see [`telemetry`](crate::telemetry). Nowhere by default.
    pub fn telemetry(mut self, telemetry: mcp_persist_core::telemetry::Telemetry) -> Self {
        self.telemetry = telemetry;
        self
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

    /// Scopes sent with refresh-token requests. None by default: a refresh
    /// then keeps the original grant (RFC 6749 section 6), and providers
    /// that refuse a `scope` on refresh accept it. Providers that require
    /// one (Azure AD v2, for one) need it set. Only scopes of the original
    /// grant are sent; a list sharing none with it fails the refresh rather
    /// than widen it. See rmcp's `AuthorizationManager::set_refresh_scopes`.
    pub fn refresh_scopes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, scopes: I) -> Self {
        self.refresh_scopes = scopes.into_iter().map(Into::into).collect();
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

    /// Whether token requests carry DPoP proofs (RFC 9449) where the
    /// authorization server advertises DPoP with `ES256` (on by default).
    /// Off, the client asks for bearer tokens; a DPoP-bound credential
    /// already stored is still presented and refreshed with its stored key.
    pub fn dpop(mut self, enabled: bool) -> Self {
        self.dpop = enabled;
        self
    }

    /// Lets discovered metadata name hosts that resolve to private addresses
    /// (an authorization server on a corporate network, such as `sso.corp`
    /// at `10.0.0.9`); loopback still needs a loopback resource URL, and
    /// link-local and reserved addresses stay refused. The OAuth requests go
    /// through this crate's client (it signs DPoP proofs), and rmcp 3.11
    /// offers no way to pass this choice to its discovery's host check with
    /// such a client: an authorization server named by a private IP literal
    /// (`https://10.0.0.9/`) is refused even so; name it by a host name.
    pub fn allow_private_addresses(mut self, allow: bool) -> Self {
        self.allow_private_addresses = allow;
        self
    }
}

/// rmcp's `AuthClient` with durable credential and state stores, and a
/// refresh shared between processes. Use it as the HTTP client of a durable
/// transport ([`DurableAuthBuild::build_with_auth`]); clones share state.
pub struct DurableAuthClient<C> {
    inner: AuthClient<C>,
    shared: Arc<Shared>,
    config: Arc<DurableAuth>,
    refreshing: Arc<tokio::sync::Mutex<()>>,
    /// OAuth requests: rmcp's and this crate's (DPoP as configured).
    oauth_http: Arc<oauth_http::OAuthHttp>,
    /// OAuth requests that must not carry DPoP proofs (rmcp's
    /// enterprise-managed exchanges expect bearer tokens).
    oauth_http_plain: Arc<oauth_http::OAuthHttp>,
    /// MCP requests with a DPoP-bound token (they need the response
    /// headers that rmcp's clients do not pass on).
    dpop_http: reqwest::Client,
}

impl<C: Clone> Clone for DurableAuthClient<C> {
    fn clone(&self) -> Self {
        DurableAuthClient {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            config: self.config.clone(),
            refreshing: self.refreshing.clone(),
            oauth_http: self.oauth_http.clone(),
            oauth_http_plain: self.oauth_http_plain.clone(),
            dpop_http: self.dpop_http.clone(),
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

    /// The RFC 7638 thumbprint (the `jkt` bound tokens carry) of the DPoP
    /// key pair stored for the issuer in force, if one is.
    pub async fn dpop_thumbprint(&self) -> Result<Option<String>, DurableAuthError> {
        let Some(issuer) = self.shared.issuer() else {
            return Ok(None);
        };
        match self.shared.dpop_signer(&issuer, false).await {
            Ok(signer) => Ok(Some(signer.thumbprint().to_owned())),
            Err(DurableAuthError::DpopKey {
                problem: DpopKeyProblem::Missing,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
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
/// [`DurableClientBuilder`](crate::client::DurableClientBuilder) in one call.
pub trait DurableAuthBuild {
    /// Loads the credentials of `auth` (no network request when they are
    /// stored), wraps rmcp's default HTTP client in a [`DurableAuthClient`]
    /// and builds the durable transport over it.
    fn build_with_auth(
        self,
        auth: &DurableAuth,
    ) -> impl Future<Output = Result<AuthenticatedTransport, DurableAuthError>> + Send;
}
