//! The HTTP calls the handle makes itself (resuming a response stream,
//! ending the session), through the wrapped client.

use std::{collections::HashMap, sync::Arc};

use futures::{FutureExt, future::BoxFuture, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use mcp_persist_core::BoxError;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError,
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
}

/// Why a call of the handle's own failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The server no longer knows the session.
    SessionGone,
    /// Anything else.
    Other(BoxError),
}

impl<E: std::error::Error + Send + Sync + 'static> From<StreamableHttpError<E>> for WireError {
    fn from(e: StreamableHttpError<E>) -> Self {
        match e {
            StreamableHttpError::SessionExpired => WireError::SessionGone,
            // rmcp maps a 404 to `SessionExpired` on POST only; a GET's 404
            // comes back as an unexpected response.
            StreamableHttpError::UnexpectedServerResponse(ref m) if m.contains("404") => {
                WireError::SessionGone
            }
            other => WireError::Other(Box::new(other)),
        }
    }
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
