//! The HTTP calls the handle makes itself (resuming a response stream,
//! ending the session), through the wrapped client.

use std::{collections::HashMap, sync::Arc};

use futures::{FutureExt, future::BoxFuture, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use mcp_persist_core::BoxError;
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        HttpStatusError, SseError, StreamableHttpClient, StreamableHttpError,
    },
};
use sse_stream::Sse;

use super::health::lock;

/// An SSE resume through the wrapped HTTP client.
pub(crate) type SseResume = BoxStream<'static, Result<Sse, SseError>>;

/// The HTTP calls the handle makes itself, through the wrapped client.
pub(crate) trait Wire: Send + Sync {
    fn resume(
        &self,
        session: Arc<str>,
        last_event_id: String,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<SseResume, WireError>>;
    fn delete(
        &self,
        session: Arc<str>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<(), WireError>>;
    /// Sends one request in `session` and reads its answer (from a JSON
    /// body, or the first answer on an SSE stream).
    fn request(
        &self,
        session: Arc<str>,
        message: ClientJsonRpcMessage,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<ServerJsonRpcMessage, WireError>>;
}

/// Why a call of the handle's own failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The server no longer knows the session.
    SessionGone,
    /// The server refused the resume cursor with 410: the events after it
    /// are gone (lost with a crashed instance, or dropped by retention).
    EventsGone,
    /// Anything else.
    Other(BoxError),
}

impl<E: std::error::Error + Send + Sync + 'static> From<StreamableHttpError<E>> for WireError {
    fn from(e: StreamableHttpError<E>) -> Self {
        match http_status(&e) {
            Some(404) => return WireError::SessionGone,
            Some(410) => return WireError::EventsGone,
            _ => {}
        }
        WireError::Other(Box::new(e))
    }
}

/// The HTTP status behind an error of rmcp's HTTP client, where the error
/// carries one: a POST's 404 (`SessionExpired`), a backend's status
/// metadata, or, for a GET or DELETE, the reqwest error inside `Client`
/// (rmcp's reqwest client turns those statuses into
/// `reqwest::Error::status`). Read from the error's values, never from its
/// text.
pub(crate) fn http_status<E: std::error::Error + Send + Sync + 'static>(
    e: &StreamableHttpError<E>,
) -> Option<u16> {
    match e {
        StreamableHttpError::SessionExpired => Some(404),
        StreamableHttpError::HttpStatus(status) => Some(status.status),
        StreamableHttpError::Client(inner) => status_in_chain(inner),
        _ => None,
    }
}

/// The first HTTP status found walking an error and its sources.
fn status_in_chain(error: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(status) = e
            .downcast_ref::<reqwest::Error>()
            .and_then(reqwest::Error::status)
        {
            return Some(status.as_u16());
        }
        if let Some(status) = e.downcast_ref::<HttpStatusError>() {
            return Some(status.status);
        }
        next = e.source();
    }
    None
}

pub(crate) struct WireClient<C> {
    pub(crate) inner: std::sync::Mutex<C>,
    pub(crate) uri: Arc<str>,
    pub(crate) auth_header: Option<String>,
}

impl<C: StreamableHttpClient> Wire for WireClient<C> {
    fn resume(
        &self,
        session: Arc<str>,
        last_event_id: String,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<SseResume, WireError>> {
        let client = lock(&self.inner).clone();
        let uri = self.uri.clone();
        let auth = self.auth_header.clone();
        async move {
            client
                .get_stream(uri, Some(session), Some(last_event_id), auth, headers)
                .await
                .map_err(WireError::from)
        }
        .boxed()
    }

    fn request(
        &self,
        session: Arc<str>,
        message: ClientJsonRpcMessage,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<ServerJsonRpcMessage, WireError>> {
        let client = lock(&self.inner).clone();
        let uri = self.uri.clone();
        let auth = self.auth_header.clone();
        async move {
            let response = client
                .post_message(uri, message, Some(session), auth, headers)
                .await?;
            let (answer, _) = response.expect_initialized::<C::Error>().await?;
            Ok(answer)
        }
        .boxed()
    }

    fn delete(
        &self,
        session: Arc<str>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> BoxFuture<'static, Result<(), WireError>> {
        let client = lock(&self.inner).clone();
        let uri = self.uri.clone();
        let auth = self.auth_header.clone();
        async move {
            match client.delete_session(uri, session, auth, headers).await {
                Ok(()) | Err(StreamableHttpError::ServerDoesNotSupportDeleteSession) => Ok(()),
                Err(e) => Err(WireError::from(e)),
            }
        }
        .boxed()
    }
}
