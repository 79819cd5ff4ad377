//! Enterprise-managed authorization (SEP-990, ID-JAG): the user's identity
//! assertion at the enterprise identity provider is exchanged (RFC 8693)
//! for an identity assertion grant, which the MCP server's authorization
//! server redeems (RFC 7523 JWT-bearer grant) for an access token. Both
//! exchanges are rmcp's (`auth-enterprise-managed`); discovery and storage
//! are this crate's.

use std::fmt;

use mcp_persist_core::{ClientRegistration, Credentials, Secret, Timestamp};
use oauth2::{ClientSecret, RefreshToken};
use rmcp::transport::auth::enterprise::{
    EmaAuthorizationServer, EmaClientAuthentication, EmaExchangeRequest,
};
use tracing::info;

use super::{DurableAuthClient, DurableAuthError, Registration, challenge::scope_of_challenge};

/// What the user brings from the enterprise identity provider.
#[derive(Clone)]
enum Subject {
    IdToken(Secret),
    RefreshToken(Secret),
}

/// The enterprise identity provider (IdP) and the user's assertion there,
/// for [`DurableAuthClient::authorize_enterprise`]. The IdP is trusted and
/// configured by the application (its issuer and token endpoint as
/// approved); it is never discovered from the MCP server. `Debug` shows no
/// secret.
#[derive(Clone)]
pub struct EnterpriseIdentity {
    issuer: String,
    token_endpoint: String,
    client_id: String,
    client_secret: Option<Secret>,
    subject: Subject,
}

impl fmt::Debug for EnterpriseIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnterpriseIdentity")
            .field("issuer", &self.issuer)
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl EnterpriseIdentity {
    /// The IdP at `issuer` (token endpoint `token_endpoint`), where this
    /// application is the client `client_id`, and the user's OpenID Connect
    /// ID token from it. The application owns the ID token's freshness.
    pub fn with_id_token(
        issuer: impl Into<String>,
        token_endpoint: impl Into<String>,
        client_id: impl Into<String>,
        id_token: Secret,
    ) -> Self {
        EnterpriseIdentity {
            issuer: issuer.into(),
            token_endpoint: token_endpoint.into(),
            client_id: client_id.into(),
            client_secret: None,
            subject: Subject::IdToken(id_token),
        }
    }

    /// The same with the user's refresh token at the IdP instead of an ID
    /// token.
    pub fn with_refresh_token(
        issuer: impl Into<String>,
        token_endpoint: impl Into<String>,
        client_id: impl Into<String>,
        refresh_token: Secret,
    ) -> Self {
        EnterpriseIdentity {
            subject: Subject::RefreshToken(refresh_token),
            ..Self::with_id_token(issuer, token_endpoint, client_id, Secret::new(""))
        }
    }

    /// The application's client secret at the IdP (`client_secret_basic`);
    /// a public client without.
    pub fn client_secret(mut self, secret: Secret) -> Self {
        self.client_secret = Some(secret);
        self
    }
}

impl<C> DurableAuthClient<C> {
    /// Enterprise-managed authorization (SEP-990): exchanges `identity`'s
    /// assertion at the enterprise IdP for an ID-JAG bound to this resource
    /// and to the authorization server the resource names, then redeems it
    /// there with the JWT-bearer grant. No user agent, no redirect.
    ///
    /// The client at the resource's authorization server is the one
    /// registered beforehand ([`DurableAuth::pre_registered`](crate::auth::DurableAuth::pre_registered));
    /// with a secret it authenticates with `client_secret_basic` (or
    /// `client_secret_post` where that is all the server accepts). The access
    /// token and its expiry are stored by issuer and resource like any other,
    /// so a restart uses them without a new exchange; once it expires (the
    /// grant issues no refresh token), call this again with a fresh
    /// assertion.
    pub async fn authorize_enterprise(
        &self,
        challenge: Option<&str>,
        identity: &EnterpriseIdentity,
    ) -> Result<(), DurableAuthError> {
        let Registration::PreRegistered {
            client_id,
            client_secret,
            issuer: expected,
        } = &self.config.registration
        else {
            return Err(DurableAuthError::EnterpriseNeedsPreRegisteredClient);
        };
        let (issuer, metadata, scopes) = {
            let mut manager = self.inner.auth_manager.lock().await;
            let (issuer, metadata) = self.discover(&mut manager, challenge).await?;
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
            (issuer, metadata, scopes)
        };
        let methods: Vec<String> = self
            .shared
            .metadata()
            .and_then(|m| m.get("token_endpoint_auth_methods_supported").cloned())
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let resource_auth = match client_secret {
            None => EmaClientAuthentication::None,
            Some(secret)
                if methods.iter().any(|m| m == "client_secret_post")
                    && !methods.iter().any(|m| m == "client_secret_basic") =>
            {
                EmaClientAuthentication::ClientSecretPost(ClientSecret::new(
                    secret.expose_secret().to_owned(),
                ))
            }
            Some(secret) => EmaClientAuthentication::ClientSecretBasic(ClientSecret::new(
                secret.expose_secret().to_owned(),
            )),
        };
        let resource_as =
            EmaAuthorizationServer::new(issuer.clone(), metadata.token_endpoint.clone(), client_id)
                .with_client_authentication(resource_auth);
        let idp = EmaAuthorizationServer::new(
            identity.issuer.clone(),
            identity.token_endpoint.clone(),
            identity.client_id.clone(),
        )
        .with_client_authentication(match &identity.client_secret {
            Some(secret) => EmaClientAuthentication::ClientSecretBasic(ClientSecret::new(
                secret.expose_secret().to_owned(),
            )),
            None => EmaClientAuthentication::None,
        });
        let resource = self.shared.resource.clone();
        let received = Timestamp::now();
        let refresh;
        let request = match &identity.subject {
            Subject::IdToken(token) => EmaExchangeRequest::new_with_id_token(
                idp,
                resource_as,
                &resource,
                token.expose_secret(),
            ),
            Subject::RefreshToken(token) => {
                refresh = RefreshToken::new(token.expose_secret().to_owned());
                EmaExchangeRequest::new(idp, resource_as, &resource, &refresh)
            }
        };
        let token = request
            .with_scopes(scopes.clone())
            .exchange(&*self.oauth_http_plain, &*self.oauth_http_plain)
            .await
            .map_err(|source| DurableAuthError::Enterprise { source })?;
        let mut granted: Vec<String> = token.scopes.iter().cloned().collect();
        granted.sort();
        let registration =
            ClientRegistration::new(client_id.clone()).with_client_secret(client_secret.clone());
        let key = self
            .shared
            .key(&issuer)
            .map_err(|source| DurableAuthError::Store { source })?;
        let credentials = Credentials::new(
            key,
            Secret::new(token.access_token.secret().to_owned()),
            registration.clone(),
        )
        .with_expires_at(token.expires_in.map(|d| received.plus(d)))
        .with_scopes(granted)
        .with_server_metadata(self.shared.metadata())
        .with_obtained_at(received);
        self.shared.set_registration(registration);
        self.shared
            .store
            .save(&credentials)
            .await
            .map_err(|source| DurableAuthError::Store { source })?;
        info!(issuer = %issuer, resource = %self.shared.resource, idp = %identity.issuer, "authorized through the enterprise identity provider");
        Ok(())
    }
}
