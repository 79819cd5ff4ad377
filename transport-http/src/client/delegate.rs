//! Passing a call on to the wrapped client: a POST or a GET as rmcp asked
//! for it (where, with which session, credentials, headers and limits),
//! sent through the same method of the inner client.

use std::{collections::HashMap, sync::Arc};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use mcp_persist_core::SessionId;
use rmcp::{
    model::{ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use serde_json::Value;
use sse_stream::Sse;

/// A stream of server-sent events, as rmcp reads it.
pub(crate) type SseStream = BoxStream<'static, Result<Sse, SseError>>;

/// What a POST gives rmcp back.
pub(crate) type PostResult<E> = Result<StreamableHttpPostResponse, StreamableHttpError<E>>;

/// Which of the inner client's POST methods rmcp called, so that the same
/// one (with the same response limits) carries the message on.
#[derive(Clone, Copy)]
pub(crate) enum Limits {
    /// `post_message`: the inner client's defaults.
    Default,
    /// `post_message_with_max_sse_event_size`.
    SseEvent(usize),
    /// `post_message_with_response_limits`.
    Response(StreamableHttpResponseLimits),
}

/// One POST as rmcp asked for it, apart from the message: where it goes,
/// with which session, credentials, headers and limits.
#[derive(Clone)]
pub(crate) struct Post {
    pub(crate) uri: Arc<str>,
    pub(crate) session_id: Option<Arc<str>>,
    pub(crate) auth_header: Option<String>,
    pub(crate) custom_headers: HashMap<HeaderName, HeaderValue>,
    pub(crate) limits: Limits,
}

impl Post {
    /// The same POST without a session id.
    pub(crate) fn without_session(self) -> Self {
        Post {
            session_id: None,
            ..self
        }
    }

    /// The session named by the POST, if it is one a store can hold.
    pub(crate) fn session(&self) -> Option<SessionId> {
        stored_session(self.session_id.as_deref())
    }

    /// Sends `message` through `client` with the POST method rmcp chose.
    pub(crate) async fn send<C: StreamableHttpClient>(
        self,
        client: &C,
        message: ClientJsonRpcMessage,
    ) -> PostResult<C::Error> {
        let Post {
            uri,
            session_id,
            auth_header,
            custom_headers,
            limits,
        } = self;
        match limits {
            Limits::Response(limits) => {
                client
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
            Limits::SseEvent(max) => {
                client
                    .post_message_with_max_sse_event_size(
                        uri,
                        message,
                        session_id,
                        auth_header,
                        custom_headers,
                        max,
                    )
                    .await
            }
            Limits::Default => {
                client
                    .post_message(uri, message, session_id, auth_header, custom_headers)
                    .await
            }
        }
    }
}

/// One GET as rmcp asked for it, apart from the `Last-Event-ID`: it can
/// be opened more than once (from a stored cursor, then afresh).
pub(crate) struct Get {
    pub(crate) uri: Arc<str>,
    pub(crate) session_id: Option<Arc<str>>,
    pub(crate) auth_header: Option<String>,
    pub(crate) custom_headers: HashMap<HeaderName, HeaderValue>,
    /// Set when rmcp called `get_stream_with_max_sse_event_size`.
    pub(crate) max_sse_event_size: Option<usize>,
}

impl Get {
    /// The session named by the GET, if it is one a store can hold.
    pub(crate) fn session(&self) -> Option<SessionId> {
        stored_session(self.session_id.as_deref())
    }

    /// Opens the stream through `client` with the GET method rmcp chose,
    /// sending `last_event_id`.
    pub(crate) async fn open<C: StreamableHttpClient>(
        &self,
        client: &C,
        last_event_id: Option<String>,
    ) -> Result<SseStream, StreamableHttpError<C::Error>> {
        let (uri, session_id, auth_header, custom_headers) = (
            self.uri.clone(),
            self.session_id.clone(),
            self.auth_header.clone(),
            self.custom_headers.clone(),
        );
        match self.max_sse_event_size {
            Some(max) => {
                client
                    .get_stream_with_max_sse_event_size(
                        uri,
                        session_id,
                        last_event_id,
                        auth_header,
                        custom_headers,
                        max,
                    )
                    .await
            }
            None => {
                client
                    .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
                    .await
            }
        }
    }
}

fn stored_session(session_id: Option<&str>) -> Option<SessionId> {
    session_id.and_then(|s| SessionId::new(s.to_owned()).ok())
}

/// The method and params of a request, as the journal keeps them.
pub(crate) fn method_and_params(request: &ClientRequest) -> (String, Option<Value>) {
    match serde_json::to_value(request) {
        Ok(mut v) => {
            let method = v
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let params = v.get_mut("params").map(Value::take);
            (method, params)
        }
        Err(_) => (String::new(), None),
    }
}

/// The first answer of a response, from a JSON body or the first answer on
/// an SSE stream (what rmcp's worker reads from either), with the session
/// id the server gave.
pub(crate) async fn first_answer<E>(
    response: StreamableHttpPostResponse,
) -> Result<(ServerJsonRpcMessage, Option<String>), StreamableHttpError<E>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    response.expect_initialized::<E>().await
}
