//! MCP requests with a DPoP-bound access token: `Authorization: DPoP`, a
//! fresh proof per request (`htm`, `htu`, `iat`, `jti`, `ath`, and the
//! server's nonce), and one retry when the server answers
//! `use_dpop_nonce` with a `DPoP-Nonce` (RFC 9449 section 9).
//!
//! rmcp's HTTP clients hide response headers from their callers, and a
//! nonce arrives in one, so these requests are sent here, over reqwest,
//! and their responses read the way rmcp's reqwest client reads them
//! (challenges, sessions, JSON, SSE, legacy `server/discover` refusals).

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use mcp_persist_core::Credentials;
use rmcp::{
    model::{ClientJsonRpcMessage, ClientRequest, ErrorData, JsonRpcMessage, ServerJsonRpcMessage},
    transport::{
        AuthError,
        streamable_http_client::{
            AuthRequiredError, HttpStatusError, InsufficientScopeError, StreamableHttpError,
            StreamableHttpPostResponse, StreamableHttpResponseLimits,
        },
    },
};
use sse_stream::{Sse, SseStream};
use tracing::debug;

use super::{DurableAuthClient, challenge::scope_of_challenge};

const SESSION_ID: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
/// How many bytes of a Retry-After value are kept.
const MAX_RETRY_AFTER: usize = 64;

type Error<C> = StreamableHttpError<C>;
type SseBox = BoxStream<'static, Result<Sse, sse_stream::Error>>;

fn io<E: std::error::Error + Send + Sync + 'static>(
    e: impl std::error::Error + Send + Sync + 'static,
) -> Error<E> {
    StreamableHttpError::Io(std::io::Error::other(e))
}

fn media_type_is(value: &str, expected: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(expected))
}

fn content_type(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn status_error(status: StatusCode, headers: &http::HeaderMap) -> HttpStatusError {
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .filter(|v| v.as_bytes().len() <= MAX_RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    HttpStatusError::new(status.as_u16(), retry_after)
}

/// A 401 or 403 with a challenge, as rmcp's client reports it.
fn challenge<E: std::error::Error + Send + Sync + 'static>(
    response: &reqwest::Response,
) -> Option<Error<E>> {
    let header = response
        .headers()
        .get(header::WWW_AUTHENTICATE)?
        .to_str()
        .ok()?
        .to_owned();
    match response.status() {
        StatusCode::UNAUTHORIZED => Some(StreamableHttpError::AuthRequired(
            AuthRequiredError::new(header),
        )),
        StatusCode::FORBIDDEN => {
            let scope = scope_of_challenge(&header);
            Some(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(header, scope),
            ))
        }
        _ => None,
    }
}

/// Reads at most `limit` bytes of a body; `None` when it is longer.
async fn read_bounded(
    response: reqwest::Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if chunk.len() > limit.saturating_sub(body.len()) {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// An SSE body whose events may not grow past `max_event` bytes.
fn sse(response: reqwest::Response, max_event: usize) -> SseBox {
    let mut since_blank_line = 0usize;
    let mut newline = false;
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        for b in chunk.iter() {
            match b {
                b'\n' if newline => since_blank_line = 0,
                b'\n' => newline = true,
                b'\r' => {}
                _ => newline = false,
            }
            since_blank_line += 1;
            if since_blank_line > max_event {
                return Err(std::io::Error::other(format!(
                    "an SSE event exceeds {max_event} bytes"
                )));
            }
        }
        Ok(chunk)
    });
    SseStream::from_bytes_stream(bytes).boxed()
}

/// What a legacy server's refusal of `server/discover` means to rmcp's
/// lifecycle (as rmcp's own client answers it): a JSON-RPC error for the
/// request, so that it falls back to `initialize`.
fn legacy_discover(
    message: &ClientJsonRpcMessage,
    session_attached: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if session_attached
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(JsonRpcMessage::Error(error)) => error.error,
        _ => {
            ErrorData::invalid_request(format!("server/discover rejected with HTTP {status}"), None)
        }
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

impl<C> DurableAuthClient<C> {
    /// Sends one MCP request with `credentials`' DPoP-bound token and a
    /// fresh proof, retrying once with the nonce of a `use_dpop_nonce`
    /// challenge.
    async fn send_dpop<E, F>(
        &self,
        credentials: &Credentials,
        method: Method,
        uri: &str,
        build: F,
    ) -> Result<reqwest::Response, Error<E>>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    {
        let signer = self
            .shared
            .dpop_signer(&credentials.key.issuer, false)
            .await
            .map_err(|e| StreamableHttpError::Auth(AuthError::InternalError(e.to_string())))?;
        let url = reqwest::Url::parse(uri).map_err(io)?;
        let token = credentials.access_token.expose_secret();
        let mut authorization = HeaderValue::from_str(&format!("DPoP {token}")).map_err(io)?;
        authorization.set_sensitive(true);
        let mut retried = false;
        loop {
            let nonce = self.shared.nonces.get(&url);
            let proof = signer
                .proof(method.as_str(), &url, Some(token), nonce.as_deref())
                .map_err(io)?;
            let mut proof = HeaderValue::from_str(proof.expose_secret()).map_err(io)?;
            proof.set_sensitive(true);
            let request = build(self.dpop_http.request(method.clone(), url.clone()))
                .header(header::AUTHORIZATION, authorization.clone())
                .header("DPoP", proof);
            let response = request.send().await.map_err(io)?;
            let fresh_nonce = self.shared.nonces.remember(&url, response.headers());
            let asks_nonce = response.status() == StatusCode::UNAUTHORIZED
                && response
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("use_dpop_nonce"));
            if asks_nonce && fresh_nonce && !retried {
                debug!(origin = %super::dpop::origin(&url), "the MCP server asked for a DPoP nonce; retrying once with it");
                retried = true;
                continue;
            }
            return Ok(response);
        }
    }

    /// rmcp's `post_message` with a DPoP-bound token.
    pub(super) async fn dpop_post<E: std::error::Error + Send + Sync + 'static>(
        &self,
        credentials: &Credentials,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error<E>> {
        let body = serde_json::to_vec(&message)?;
        let session_attached = session_id.is_some();
        let response = self
            .send_dpop(credentials, Method::POST, &uri, |mut request| {
                request = request
                    .header(header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"))
                    .header(header::CONTENT_TYPE, JSON)
                    .body(body.clone());
                for (name, value) in &custom_headers {
                    request = request.header(name, value);
                }
                if let Some(session) = &session_id {
                    request = request.header(SESSION_ID, session.as_ref());
                }
                request
            })
            .await?;
        if let Some(challenge) = challenge(&response) {
            return Err(challenge);
        }
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_attached {
            return Err(StreamableHttpError::SessionExpired);
        }
        let content_type = content_type(&response);
        let is_json = content_type
            .as_deref()
            .is_some_and(|c| media_type_is(c, JSON));
        let failed = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
        if failed && (!is_json || status == StatusCode::TOO_MANY_REQUESTS) {
            return Err(status_error(status, response.headers()).into());
        }
        let http_error = failed.then(|| status_error(status, response.headers()));
        let session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let awaits_no_response = !matches!(message, JsonRpcMessage::Request(_));
        if status.is_success() && response.content_length() == Some(0) && awaits_no_response {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if !status.is_success() {
            let limit =
                if is_json && !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                    limits.max_json_response_size
                } else {
                    limits.max_error_response_size
                };
            let body = read_bounded(response, limit)
                .await
                .map_err(io)?
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&body).into_owned();
            if is_json
                && let Ok(error @ JsonRpcMessage::Error(_)) =
                    serde_json::from_str::<ServerJsonRpcMessage>(&text)
            {
                if let Some(response) = legacy_discover(&message, session_attached, status, &text) {
                    return Ok(response);
                }
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            if let Some(response) = legacy_discover(&message, session_attached, status, &text) {
                return Ok(response);
            }
            if let Some(error) = http_error {
                return Err(error.into());
            }
            let preview: String = text.chars().take(limits.max_error_response_size).collect();
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {preview}"),
            )));
        }
        match content_type.as_deref() {
            Some(ct) if media_type_is(ct, EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
                sse(response, limits.max_sse_event_size),
                session,
            )),
            Some(ct) if media_type_is(ct, JSON) => {
                let body = read_bounded(response, limits.max_json_response_size)
                    .await
                    .map_err(io)?
                    .ok_or(StreamableHttpError::ResponseBodyTooLarge {
                        max_size: limits.max_json_response_size,
                    })?;
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, session)),
                    Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
                    Err(e) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                        format!("the JSON response is not a JSON-RPC message: {e}"),
                    ))),
                }
            }
            _ if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            _ => Err(StreamableHttpError::UnexpectedContentType(content_type)),
        }
    }

    /// rmcp's `get_stream` with a DPoP-bound token.
    pub(super) async fn dpop_get<E: std::error::Error + Send + Sync + 'static>(
        &self,
        credentials: &Credentials,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseBox, Error<E>> {
        let response = self
            .send_dpop(credentials, Method::GET, &uri, |mut request| {
                request = request.header(header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
                for (name, value) in &custom_headers {
                    request = request.header(name, value);
                }
                if let Some(session) = &session_id {
                    request = request.header(SESSION_ID, session.as_ref());
                }
                if let Some(last) = &last_event_id {
                    request = request.header(LAST_EVENT_ID, last.as_str());
                }
                request
            })
            .await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if let Some(challenge) = challenge(&response) {
            return Err(challenge);
        }
        if !response.status().is_success() {
            return Err(status_error(response.status(), response.headers()).into());
        }
        match content_type(&response) {
            Some(ct) if media_type_is(&ct, EVENT_STREAM) || media_type_is(&ct, JSON) => {
                Ok(sse(response, max_sse_event_size))
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }

    /// rmcp's `delete_session` with a DPoP-bound token.
    pub(super) async fn dpop_delete<E: std::error::Error + Send + Sync + 'static>(
        &self,
        credentials: &Credentials,
        uri: Arc<str>,
        session_id: Arc<str>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error<E>> {
        let response = self
            .send_dpop(credentials, Method::DELETE, &uri, |mut request| {
                request = request.header(SESSION_ID, session_id.as_ref());
                for (name, value) in &custom_headers {
                    request = request.header(name, value);
                }
                request
            })
            .await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            debug!("this server does not support deleting sessions");
            return Ok(());
        }
        if let Some(challenge) = challenge(&response) {
            return Err(challenge);
        }
        if !response.status().is_success() {
            return Err(status_error(response.status(), response.headers()).into());
        }
        Ok(())
    }
}
