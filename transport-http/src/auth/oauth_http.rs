//! The HTTP client of every OAuth request: rmcp's (discovery, registration,
//! code exchange, refresh, client credentials) and this crate's own
//! (workload identity, enterprise-managed authorization).
//!
//! It applies rmcp's address policy ([`super::address`]) and, on token
//! requests, DPoP: a proof signed with the key pair of the issuer in force
//! when the authorization server advertises `ES256` in
//! `dpop_signing_alg_values_supported` (and DPoP is on), and always when a
//! DPoP-bound refresh token is spent. A `use_dpop_nonce` error with a
//! `DPoP-Nonce` is answered by one retry with that nonce.

use std::{sync::Arc, time::Duration};

use http::{HeaderValue, header};
use mcp_persist_core::BoxError;
use rmcp::transport::auth::{
    OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRedirectPolicy, OAuthHttpRequest,
};
use tracing::{debug, warn};

use super::{
    address::{AddressPolicy, PolicyResolver},
    shared::Shared,
};

/// What rmcp allows a response body of an OAuth request to be.
const MAX_BODY: usize = 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_REDIRECTS: usize = 10;

/// See the [module docs](self).
pub(crate) struct OAuthHttp {
    follow: reqwest::Client,
    stop: reqwest::Client,
    policy: Arc<AddressPolicy>,
    shared: Arc<Shared>,
    dpop: bool,
}

#[derive(Debug, thiserror::Error)]
enum OAuthHttpError {
    #[error("OAuth request to `{0}` refused: address not allowed for this resource")]
    Address(String),
    #[error("OAuth response body exceeds {MAX_BODY} bytes")]
    TooLarge,
    #[error("the OAuth request is not a valid URL request")]
    BadRequest,
}

/// The `grant_type` of a token request (a form POST), if `request` is one.
fn grant_type(request: &http::Request<Vec<u8>>) -> Option<String> {
    let form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if request.method() != http::Method::POST || !form {
        return None;
    }
    url::form_urlencoded::parse(request.body())
        .find(|(k, _)| k == "grant_type")
        .map(|(_, v)| v.into_owned())
}

impl OAuthHttp {
    pub(crate) fn new(
        resource: &reqwest::Url,
        allow_private: bool,
        shared: Arc<Shared>,
        dpop: bool,
    ) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(AddressPolicy::new(resource, allow_private));
        let resolver = Arc::new(PolicyResolver(policy.clone()));
        let check = policy.clone();
        let follow = reqwest::redirect::Policy::custom(move |attempt| {
            if !check.allows_url(attempt.url()) {
                let url = attempt.url().to_string();
                attempt.error(OAuthHttpError::Address(url))
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        let build = |redirect| {
            reqwest::Client::builder()
                .timeout(TIMEOUT)
                .redirect(redirect)
                .dns_resolver(resolver.clone())
                .build()
        };
        Ok(OAuthHttp {
            follow: build(follow)?,
            stop: build(reqwest::redirect::Policy::none())?,
            policy,
            shared,
            dpop,
        })
    }

    /// Sends `request`, with a DPoP proof when it is a token request that
    /// needs one, retrying once with the nonce of a `use_dpop_nonce` error.
    pub(crate) async fn send(
        &self,
        request: http::Request<Vec<u8>>,
        redirect: OAuthHttpRedirectPolicy,
    ) -> Result<http::Response<Vec<u8>>, BoxError> {
        let url = reqwest::Url::parse(&request.uri().to_string())
            .map_err(|_| OAuthHttpError::BadRequest)?;
        if !self.policy.allows_url(&url) {
            warn!(url = %url, "OAuth request refused by the address policy");
            return Err(OAuthHttpError::Address(url.to_string()).into());
        }
        let signer = match grant_type(&request) {
            Some(grant) => self.shared.token_request_signer(&grant, self.dpop).await?,
            None => None,
        };
        let client = match redirect {
            OAuthHttpRedirectPolicy::Stop => &self.stop,
            _ => &self.follow,
        };
        let (parts, body) = request.into_parts();
        let mut retried = false;
        loop {
            let mut builder = client
                .request(parts.method.clone(), url.clone())
                .headers(parts.headers.clone())
                .body(body.clone());
            if let Some(signer) = &signer {
                let nonce = self.shared.nonces.get(&url);
                let proof = signer.proof(parts.method.as_str(), &url, None, nonce.as_deref())?;
                let mut value = HeaderValue::from_str(proof.expose_secret())?;
                value.set_sensitive(true);
                builder = builder.header("DPoP", value);
            }
            let response = builder.send().await?;
            let fresh_nonce = self.shared.nonces.remember(&url, response.headers());
            let response = buffer(response).await?;
            if signer.is_some()
                && !retried
                && fresh_nonce
                && response.status() == http::StatusCode::BAD_REQUEST
                && oauth_error(response.body()).as_deref() == Some("use_dpop_nonce")
            {
                debug!(origin = %super::dpop::origin(&url), "the authorization server asked for a DPoP nonce; retrying once with it");
                retried = true;
                continue;
            }
            return Ok(response);
        }
    }
}

/// The `error` of an OAuth error response body.
fn oauth_error(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("error")?
        .as_str()
        .map(str::to_owned)
}

async fn buffer(response: reqwest::Response) -> Result<http::Response<Vec<u8>>, BoxError> {
    use futures::StreamExt;
    let mut builder = http::Response::builder()
        .status(response.status())
        .version(response.version());
    for (name, value) in response.headers() {
        builder = builder.header(name, value);
    }
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if chunk.len() > MAX_BODY - body.len() {
            return Err(OAuthHttpError::TooLarge.into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(builder.body(body)?)
}

impl OAuthHttpClient for OAuthHttp {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        let OAuthHttpRequest {
            request,
            redirect_policy,
            ..
        } = request;
        Box::pin(self.send(request, redirect_policy))
    }
}
