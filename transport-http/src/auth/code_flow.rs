//! The authorization-code flow (with PKCE), for a client acting for a
//! user.

use std::future::Future;

use mcp_persist_core::BoxError;
use rmcp::transport::auth::AuthorizationCallback;
use tracing::{debug, info};

use super::{DurableAuthClient, DurableAuthError, challenge::scope_of_challenge, oauth};

impl<C> DurableAuthClient<C> {
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
        warn_if_rmcp_logs_the_code();
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
}

/// rmcp logs the authorization code at `debug` under its auth target; say
/// so once when that level is enabled there.
fn warn_if_rmcp_logs_the_code() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if tracing::enabled!(target: "rmcp::transport::auth", tracing::Level::DEBUG) {
        WARNED.call_once(|| {
            tracing::warn!(
                directive = super::RMCP_AUTH_LOG_DIRECTIVE,
                "rmcp logs OAuth authorization codes at debug level; add this filter directive to keep them out of the logs"
            );
        });
    }
}
