//! Token requests this crate sends itself (the JWT-bearer grant), through
//! the OAuth HTTP client (address policy, DPoP), and their responses as
//! core's credentials.

use mcp_persist_core::{ClientRegistration, Credentials, Secret, Timestamp};
use rmcp::transport::auth::OAuthHttpRedirectPolicy;
use serde_json::Value;

use super::{
    DurableAuthError,
    oauth_http::OAuthHttp,
    shared::{DPOP, Shared},
};

/// A form POST to the token endpoint of the issuer in force.
pub(crate) struct TokenRequest {
    grant: &'static str,
    /// The form's parameters, every value zeroed when dropped.
    params: Vec<(&'static str, Secret)>,
}

impl TokenRequest {
    pub(crate) fn new(grant: &'static str) -> Self {
        TokenRequest {
            grant,
            params: vec![("grant_type", Secret::new(grant))],
        }
    }

    pub(crate) fn param(self, name: &'static str, value: &str) -> Self {
        self.secret(name, Secret::new(value))
    }

    pub(crate) fn secret(mut self, name: &'static str, value: Secret) -> Self {
        self.params.push((name, value));
        self
    }

    /// Sends the request and turns a successful response into credentials
    /// of `client` with `issuer`, for this resource. `requested` scopes
    /// stand for the granted ones when the response names none.
    pub(crate) async fn send(
        self,
        http: &OAuthHttp,
        shared: &Shared,
        issuer: &str,
        client: ClientRegistration,
        requested: &[String],
    ) -> Result<Credentials, DurableAuthError> {
        let grant = self.grant;
        let endpoint = shared
            .token_endpoint()
            .ok_or(DurableAuthError::NoTokenEndpoint)?;
        let body = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            for (name, value) in &self.params {
                form.append_pair(name, value.expose_secret());
            }
            Secret::new(form.finish())
        };
        let request = http::Request::post(endpoint.as_str())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(body.expose_secret().as_bytes().to_vec())
            .map_err(|_| DurableAuthError::NoTokenEndpoint)?;
        let received = Timestamp::now();
        let response = http
            .send(request, OAuthHttpRedirectPolicy::Stop)
            .await
            .map_err(|source| match source.downcast::<DurableAuthError>() {
                Ok(typed) => *typed,
                Err(source) => DurableAuthError::TokenTransport { grant, source },
            })?;
        let json: Value = serde_json::from_slice(response.body()).unwrap_or(Value::Null);
        let text = |field: &str| json.get(field).and_then(Value::as_str).map(str::to_owned);
        if !response.status().is_success() {
            return Err(DurableAuthError::TokenRequest {
                grant,
                status: response.status().as_u16(),
                error: text("error"),
            });
        }
        let (Some(access_token), Some(token_type)) = (text("access_token"), text("token_type"))
        else {
            return Err(DurableAuthError::TokenRequest {
                grant,
                status: response.status().as_u16(),
                error: Some("malformed token response".to_owned()),
            });
        };
        let token_type = if token_type.eq_ignore_ascii_case(DPOP) {
            DPOP.to_owned()
        } else if token_type.eq_ignore_ascii_case("bearer") {
            "Bearer".to_owned()
        } else {
            token_type
        };
        let key = shared
            .key(issuer)
            .map_err(|source| DurableAuthError::Store { source })?;
        let scopes = match text("scope") {
            Some(s) => s
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            None => requested.to_vec(),
        };
        let expires_at = json
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|secs| received.plus(std::time::Duration::from_secs(secs)));
        Ok(Credentials::new(key, Secret::new(access_token), client)
            .with_token_type(token_type)
            .with_expires_at(expires_at)
            .with_refresh_token(text("refresh_token").map(Secret::new))
            .with_scopes(scopes)
            .with_server_metadata(shared.metadata())
            .with_obtained_at(received))
    }
}
