//! Discovery of the authorization server the resource names, and the
//! client registration used with it.

use mcp_persist_core::{ClientRegistration, Secret};
use rmcp::transport::{
    AuthorizationManager,
    auth::{AuthorizationMetadata, OAuthClientConfig},
};
use tracing::{debug, info};

use super::{DurableAuthClient, DurableAuthError, Registration, UNNAMED_ISSUER, oauth};

pub(super) fn configure(
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

impl<C> DurableAuthClient<C> {
    /// Discovers the authorization server (through the challenge when there
    /// is one) and makes its issuer the one in force for this resource:
    /// from here on, rmcp sees only that issuer's credentials.
    pub(super) async fn discover(
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

    pub(super) async fn registration_for(
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
            (Registration::WorkloadIdentity { .. }, _) => {
                return Err(DurableAuthError::WorkloadIdentityNeedsJwtBearer);
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
            ) => {
                ClientRegistration::new(client_id.clone()).with_client_secret(client_secret.clone())
            }
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
                ClientRegistration::new(url.clone())
                    .with_metadata_url(url.clone())
                    .with_token_endpoint_auth_method("none".to_owned())
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
                return Ok(ClientRegistration::new(config.client_id)
                    .with_client_secret(config.client_secret.map(Secret::new)));
            }
        };
        configure(manager, &reg, redirect)?;
        Ok(reg)
    }
}
