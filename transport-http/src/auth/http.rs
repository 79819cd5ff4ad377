//! The authenticated client as rmcp's HTTP client: every call first
//! refreshes an expiring token once across processes, then goes through
//! rmcp's `AuthClient`.

use std::{collections::HashMap, sync::Arc};

use http::{HeaderName, HeaderValue};
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::streamable_http_client::{
        StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};

use super::{DurableAuthClient, shared::is_dpop};

/// rmcp's default bound of one SSE event.
const DEFAULT_MAX_SSE_EVENT_SIZE: usize = 16 * 1024 * 1024;

impl<C> StreamableHttpClient for DurableAuthClient<C>
where
    C: StreamableHttpClient + Send + Sync,
{
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            let limits = StreamableHttpResponseLimits::default();
            return self
                .dpop_post(
                    &credentials,
                    uri,
                    message,
                    session_id,
                    custom_headers,
                    limits,
                )
                .await;
        }
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            let mut limits = StreamableHttpResponseLimits::default();
            limits.max_sse_event_size = max_sse_event_size;
            return self
                .dpop_post(
                    &credentials,
                    uri,
                    message,
                    session_id,
                    custom_headers,
                    limits,
                )
                .await;
        }
        self.inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            return self
                .dpop_post(
                    &credentials,
                    uri,
                    message,
                    session_id,
                    custom_headers,
                    limits,
                )
                .await;
        }
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            return self
                .dpop_delete(&credentials, uri, session_id, custom_headers)
                .await;
        }
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            return self
                .dpop_get(
                    &credentials,
                    uri,
                    session_id,
                    last_event_id,
                    custom_headers,
                    DEFAULT_MAX_SSE_EVENT_SIZE,
                )
                .await;
        }
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
        if let Some(credentials) = self.ensure_fresh().await.filter(is_dpop) {
            return self
                .dpop_get(
                    &credentials,
                    uri,
                    session_id,
                    last_event_id,
                    custom_headers,
                    max_sse_event_size,
                )
                .await;
        }
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
