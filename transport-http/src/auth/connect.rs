//! Loading an authenticated client from the store, and building a durable
//! transport over it.

use std::{any::Any, sync::Arc, time::Duration};

use rmcp::transport::{
    AuthClient, AuthorizationManager, auth::AuthorizationMetadata,
    streamable_http_client::StreamableHttpClient,
};
use tracing::{info, warn};

use super::{
    AuthenticatedTransport, DurableAuth, DurableAuthBuild, DurableAuthClient, DurableAuthError,
    discovery::configure,
    oauth,
    oauth_http::OAuthHttp,
    shared::{Shared, is_dpop},
    store::{DurableCredentialStore, DurableStateStore},
};
use crate::client::{ClientError, DurableClientBuilder};

impl DurableAuth {
    /// An authenticated HTTP client over `http` (a `reqwest::Client`, or any
    /// rmcp HTTP client), loaded from the store.
    ///
    /// With stored credentials and metadata this makes no network request:
    /// the stored metadata is installed instead of discovering it again, and
    /// the stored registration (with its secret) configures the client.
    ///
    /// MCP requests with a DPoP-bound token go through `http` itself when it
    /// is a `reqwest::Client`, else through a default one (a nonce arrives
    /// in a response header that rmcp's client trait does not pass on).
    /// Stored DPoP-bound credentials whose key cannot be read fail here, with
    /// [`DurableAuthError::DpopKey`].
    pub async fn connect<C>(&self, http: C) -> Result<DurableAuthClient<C>, DurableAuthError>
    where
        C: StreamableHttpClient + Sync + 'static,
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
        let resource_url =
            reqwest::Url::parse(&self.resource).map_err(|e| DurableAuthError::InvalidResource {
                source: mcp_persist_core::Error::invalid("resource URL", e.to_string()),
            })?;
        let http_error = |e: reqwest::Error| DurableAuthError::Client {
            source: ClientError::Http {
                source: Box::new(e),
            },
        };
        let oauth_http = Arc::new(
            OAuthHttp::new(
                &resource_url,
                self.allow_private_addresses,
                shared.clone(),
                self.dpop,
            )
            .map_err(http_error)?,
        );
        let oauth_http_plain = Arc::new(
            OAuthHttp::new(
                &resource_url,
                self.allow_private_addresses,
                shared.clone(),
                false,
            )
            .map_err(http_error)?,
        );
        let dpop_http = match (&http as &dyn Any).downcast_ref::<reqwest::Client>() {
            Some(client) => client.clone(),
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(http_error)?,
        };
        // rmcp's OAuth requests go through this crate's client: the same
        // address policy as rmcp's own, plus DPoP proofs on token requests.
        let mut manager = AuthorizationManager::new_with_oauth_http_client(
            self.resource.as_str(),
            oauth_http.clone(),
        )
        .await
        .map_err(oauth("client setup"))?;
        if !self.refresh_scopes.is_empty() {
            manager.set_refresh_scopes(self.refresh_scopes.iter().cloned());
        }
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
                if is_dpop(&record) {
                    // Bound tokens need their key: a key that cannot be
                    // read fails now, not at the first request.
                    shared.dpop_signer(issuer, false).await?;
                }
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
            oauth_http,
            oauth_http_plain,
            dpop_http,
        })
    }
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
