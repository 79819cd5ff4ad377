//! Reading `WWW-Authenticate` challenges: behind an rmcp error, and the
//! scope a challenge asks for.

use rmcp::transport::WWWAuthenticateParams;

/// The `WWW-Authenticate` challenge behind an rmcp error, when the call
/// failed because the server answered 401 (no or a refused token) or 403
/// (`insufficient_scope`).
///
/// Pass it to [`DurableAuthClient::authorize`](crate::auth::DurableAuthClient::authorize) and try again: the client
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
        let challenge = e
            .downcast_ref::<ServiceError>()
            .and_then(ServiceError::auth_challenge)
            .or_else(|| {
                e.downcast_ref::<ClientInitializeError>()
                    .and_then(ClientInitializeError::auth_challenge)
            })
            .or_else(|| {
                e.downcast_ref::<AuthRequiredError>()
                    .map(|e| e.www_authenticate_header.as_str())
            })
            .or_else(|| {
                e.downcast_ref::<InsufficientScopeError>()
                    .map(|e| e.www_authenticate_header.as_str())
            });
        if let Some(challenge) = challenge {
            return Some(challenge.to_owned());
        }
        next = e.source();
    }
    None
}

/// The `scope` parameter of a `WWW-Authenticate: Bearer` challenge, read
/// with rmcp's own parser (quoted or bare values).
pub(super) fn scope_of_challenge(header: &str) -> Option<String> {
    // The base only resolves a relative `resource_metadata`, unused here.
    let base = reqwest::Url::parse("http://localhost/").ok()?;
    WWWAuthenticateParams::parse(header, &base).scope
}

#[cfg(test)]
mod tests {
    use rmcp::{
        service::{ClientInitializeError, ServiceError},
        transport::{
            DynamicTransportError,
            streamable_http_client::{
                AuthRequiredError, InsufficientScopeError, StreamableHttpError,
            },
        },
    };

    use super::*;

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
}
