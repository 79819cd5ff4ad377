//! Workload identity (SEP-1933): the JWT-bearer grant (RFC 7523 section
//! 2.1), with an assertion the platform issues to the workload (a projected
//! service-account token in a file, a metadata-server call).

use std::{fmt, future::Future, path::PathBuf, pin::Pin, sync::Arc};

use mcp_persist_core::{BoxError, ClientRegistration, Credentials, Secret};
use tracing::info;

use super::{
    DurableAuthClient, DurableAuthError, Registration, challenge::scope_of_challenge,
    oauth_http::OAuthHttp, shared::Shared, token::TokenRequest,
};

/// The JWT-bearer grant type (RFC 7523).
pub(crate) const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

type AssertionFuture = Pin<Box<dyn Future<Output = Result<Secret, BoxError>> + Send>>;

/// Where a workload's identity assertion comes from: a JWT its platform
/// issues (a Kubernetes projected service-account token, a cloud metadata
/// server's identity token, a CI job's OIDC token), presented with the
/// JWT-bearer grant.
///
/// It is asked for a fresh assertion before every token request, with the
/// authorization server's issuer as the audience the token is for; the
/// assertion itself is never stored or logged. `Debug` shows only the kind.
#[derive(Clone)]
pub struct AssertionSource(Source);

#[derive(Clone)]
enum Source {
    File(PathBuf),
    Fn(Arc<dyn Fn(String) -> AssertionFuture + Send + Sync>),
}

impl fmt::Debug for AssertionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::File(path) => f.debug_tuple("AssertionSource::File").field(path).finish(),
            Source::Fn(_) => f.write_str("AssertionSource::Fn"),
        }
    }
}

impl AssertionSource {
    /// Reads the assertion from `path` before every token request (the
    /// platform rotates the file), trimming surrounding whitespace.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        AssertionSource(Source::File(path.into()))
    }

    /// Asks `f` for the assertion before every token request, with the
    /// authorization server's issuer (the audience it is for).
    pub fn from_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Secret, BoxError>> + Send + 'static,
    {
        AssertionSource(Source::Fn(Arc::new(move |audience| Box::pin(f(audience)))))
    }

    /// A fresh assertion for `audience`.
    pub(crate) async fn assertion(&self, audience: &str) -> Result<Secret, DurableAuthError> {
        let found = match &self.0 {
            Source::File(path) => tokio::fs::read_to_string(path)
                .await
                .map(|text| Secret::new(text.trim()))
                .map_err(|e| Box::new(e) as BoxError),
            Source::Fn(f) => f(audience.to_owned()).await,
        };
        match found {
            Ok(assertion) if !assertion.expose_secret().is_empty() => Ok(assertion),
            Ok(_) => Err(DurableAuthError::Assertion {
                source: "the assertion source gave an empty assertion".into(),
            }),
            Err(source) => Err(DurableAuthError::Assertion { source }),
        }
    }
}

impl<C> DurableAuthClient<C> {
    /// Gets a token with the JWT-bearer grant for a workload identity
    /// (SEP-1933), configured with [`Registration::WorkloadIdentity`]: no
    /// user agent, no redirect, no refresh token to keep.
    ///
    /// Discovery runs as for [`authorize`](Self::authorize) (from the
    /// `WWW-Authenticate` challenge when given); the scope is the
    /// challenge's, else the configured scopes. The token and its expiry are
    /// stored by issuer and resource like any other; once it nears its
    /// expiry, the next request gets a new one with a fresh assertion, once
    /// across every process sharing the store (the refresh lease). A refused
    /// grant (`invalid_grant`, `invalid_scope`, `unauthorized_client`) is
    /// returned as [`DurableAuthError::TokenRequest`] and not retried.
    pub async fn authorize_workload_identity(
        &self,
        challenge: Option<&str>,
    ) -> Result<(), DurableAuthError> {
        let Registration::WorkloadIdentity {
            client_id,
            assertion,
            issuer: expected,
        } = &self.config.registration
        else {
            return Err(DurableAuthError::NotWorkloadIdentity);
        };
        let (issuer, scopes) = {
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
            (
                issuer,
                manager.select_scopes(challenge_scope.as_deref(), &defaults),
            )
        };
        let credentials = workload_grant(
            &self.oauth_http,
            &self.shared,
            &issuer,
            client_id.as_deref(),
            assertion,
            &scopes,
        )
        .await?;
        self.shared
            .store
            .save(&credentials)
            .await
            .map_err(|source| DurableAuthError::Store { source })?;
        info!(issuer = %issuer, resource = %self.shared.resource, token_type = %credentials.token_type, "authorized with a workload identity");
        Ok(())
    }
}

/// One JWT-bearer token request with a fresh assertion, to the token
/// endpoint of `issuer` (the issuer in force).
pub(super) async fn workload_grant(
    http: &OAuthHttp,
    shared: &Shared,
    issuer: &str,
    client_id: Option<&str>,
    source: &AssertionSource,
    scopes: &[String],
) -> Result<Credentials, DurableAuthError> {
    let assertion = source.assertion(issuer).await?;
    let mut request = TokenRequest::new(JWT_BEARER)
        .secret("assertion", assertion)
        .param("resource", &shared.resource);
    if !scopes.is_empty() {
        request = request.param("scope", &scopes.join(" "));
    }
    if let Some(id) = client_id {
        request = request.param("client_id", id);
    }
    let client = ClientRegistration::new(client_id.unwrap_or_default().to_owned())
        .with_token_endpoint_auth_method("none".to_owned());
    request.send(http, shared, issuer, client, scopes).await
}
