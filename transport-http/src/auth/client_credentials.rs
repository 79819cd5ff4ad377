//! The client-credentials grant (SEP-1046), for a client acting on its
//! own behalf.

use mcp_persist_core::ClientRegistration;
use rmcp::transport::auth::ClientCredentialsConfig;
use tracing::info;

use super::{
    DurableAuthClient, DurableAuthError, Registration, challenge::scope_of_challenge, oauth,
};

impl<C> DurableAuthClient<C> {
    /// Gets a token with the OAuth client-credentials grant (SEP-1046), for a
    /// client acting on its own behalf: no user agent, no redirect. The
    /// client is the one registered beforehand, with a secret
    /// ([`DurableAuth::pre_registered`](crate::auth::DurableAuth::pre_registered)) or a signing key
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
                self.shared.set_registration(
                    ClientRegistration::new(client_id.clone())
                        .with_token_endpoint_auth_method("private_key_jwt".to_owned()),
                );
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
                self.shared.set_registration(
                    ClientRegistration::new(client_id.clone())
                        .with_client_secret(client_secret.clone()),
                );
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
}
