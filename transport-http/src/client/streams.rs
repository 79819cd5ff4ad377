//! Server-sent event streams: the GET streams rmcp opens (the standalone
//! one resumed after a restart from where the previous process stopped
//! reading, a 404 taken quietly as "the session is gone"), and every
//! stream followed for its cursors, progress and answers.

use std::sync::Arc;

use futures::StreamExt;
use mcp_persist_core::SessionId;
use rmcp::transport::streamable_http_client::{StreamableHttpClient, StreamableHttpError};
use tracing::{info, warn};

use super::{
    delegate::{Get, SseStream},
    inbox::Inbox,
    journal::JournalTx,
    progress::ProgressTokens,
    requests::Requests,
    session::SessionState,
    wire::http_status,
};

/// Where the events of a stream belong.
#[derive(Clone)]
pub(crate) enum StreamOwner {
    /// The response stream of the request that went out as this wire id.
    Request(SessionId, i64),
    /// The standalone GET stream.
    Standalone(SessionId),
    /// A resumed stream, or one without a session.
    Other(Option<SessionId>),
}

impl StreamOwner {
    /// The GET stream of `session`: the standalone one when it starts
    /// afresh (no `Last-Event-ID`), else a resumed one.
    fn of_get(session: Option<SessionId>, fresh: bool) -> Self {
        match session {
            Some(s) if fresh => StreamOwner::Standalone(s),
            other => StreamOwner::Other(other),
        }
    }

    /// The session the stream belongs to.
    fn session(&self) -> Option<&SessionId> {
        match self {
            StreamOwner::Request(s, _) | StreamOwner::Standalone(s) => Some(s),
            StreamOwner::Other(s) => s.as_ref(),
        }
    }
}

/// What following streams needs: the session (for the stored standalone
/// cursor), the requests in flight, the progress tokens, the journal (for
/// the standalone cursor) and the inbox of recovered messages.
#[derive(Debug, Clone)]
pub(crate) struct Streams {
    session: Arc<SessionState>,
    requests: Requests,
    progress: Arc<ProgressTokens>,
    journal: JournalTx,
    inbox: Arc<Inbox>,
}

impl Streams {
    pub(crate) fn new(
        session: Arc<SessionState>,
        requests: Requests,
        progress: Arc<ProgressTokens>,
        journal: JournalTx,
        inbox: Arc<Inbox>,
    ) -> Self {
        Streams {
            session,
            requests,
            progress,
            journal,
            inbox,
        }
    }

    /// Opens the GET stream rmcp asked for (`last_event_id` is rmcp's):
    /// for the first standalone GET of a session resumed after a restart,
    /// from the stored cursor (a fresh stream when the server refuses it),
    /// and [followed](Self::follow). A 404 says the server no longer knows
    /// the session; rmcp is told the server has no stream instead.
    pub(crate) async fn open<C: StreamableHttpClient>(
        &self,
        inner: &C,
        get: Get,
        last_event_id: Option<String>,
    ) -> Result<SseStream, StreamableHttpError<C::Error>> {
        let owner = StreamOwner::of_get(get.session(), last_event_id.is_none());
        if let Some(cursor) = self.standalone_cursor(&owner) {
            match resumed_or_fresh(get.open(inner, Some(cursor)).await) {
                Ok(Some(stream)) => return Ok(self.follow(stream, owner)),
                Ok(None) => {}
                Err(e) => return Err(session_gone_quietly(e, &owner)),
            }
        }
        match get.open(inner, last_event_id).await {
            Ok(stream) => Ok(self.follow(stream, owner)),
            Err(e) => Err(session_gone_quietly(e, &owner)),
        }
    }

    /// Follows a stream: records its cursors, gives progress the
    /// application's token and answers rmcp's ids back, closing their
    /// journal entries. The standalone stream also carries the messages
    /// the handle delivers (recovered notifications).
    pub(crate) fn follow(&self, stream: SseStream, owner: StreamOwner) -> SseStream {
        let standalone = matches!(owner, StreamOwner::Standalone(_));
        let stream = self.observe(stream, owner);
        if standalone {
            self.inbox.merge(stream)
        } else {
            stream
        }
    }

    fn observe(&self, stream: SseStream, owner: StreamOwner) -> SseStream {
        let (requests, progress, journal) = (
            self.requests.clone(),
            self.progress.clone(),
            self.journal.clone(),
        );
        stream
            .map(move |item| {
                let Ok(mut event) = item else { return item };
                if let Some(id) = event.id.as_deref() {
                    match &owner {
                        StreamOwner::Request(s, wire) => requests.cursor(s, *wire, id),
                        StreamOwner::Standalone(s) => journal.standalone_cursor(s, id),
                        StreamOwner::Other(_) => {}
                    }
                }
                if let Some(data) = event.data.as_deref()
                    && data.contains("notifications/progress")
                    && let Some(text) = progress.back(data)
                {
                    event.data = Some(text);
                    return Ok(event);
                }
                if let Some(data) = event.data.as_deref()
                    && (data.contains("\"result\"") || data.contains("\"error\""))
                    && let Some(text) = requests.answered_on_stream(owner.session(), data)
                {
                    event.data = Some(text);
                }
                Ok(event)
            })
            .boxed()
    }

    /// For the first standalone GET of a session resumed after a restart:
    /// where the previous process stopped reading, so that the server
    /// replays what was sent while no process listened.
    fn standalone_cursor(&self, owner: &StreamOwner) -> Option<String> {
        let StreamOwner::Standalone(session) = owner else {
            return None;
        };
        let cursor = self.session.take_standalone_cursor(session)?;
        info!(session = %session.hashed(), "resuming the standalone stream where the previous process stopped");
        Some(cursor)
    }
}

/// The outcome of a GET that carried a stored cursor: the stream, or
/// `None` to open a fresh one when the server would not resume (the
/// events expired, or it keeps none). Authorization failures stay errors.
fn resumed_or_fresh<E: std::error::Error + Send + Sync + 'static>(
    resumed: Result<SseStream, StreamableHttpError<E>>,
) -> Result<Option<SseStream>, StreamableHttpError<E>> {
    match resumed {
        Ok(stream) => Ok(Some(stream)),
        Err(
            e @ (StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_)),
        ) => Err(e),
        // The session is gone, not just its events.
        Err(e) if http_status(&e) == Some(404) => Err(e),
        Err(e) => {
            warn!(error = %e, "the server would not resume the standalone stream; opening a fresh one (messages sent meanwhile are lost)");
            Ok(None)
        }
    }
}

/// A GET refused with 404: the server no longer knows the session (it
/// restarted, or the session expired). rmcp would log that as an error on
/// every start after an expiry, and retry a stream that cannot come back;
/// told the server has no stream instead, it goes on quietly, and its next
/// POST meets the same 404 and re-initializes, which opens the new
/// session's stream.
fn session_gone_quietly<E: std::error::Error + Send + Sync + 'static>(
    error: StreamableHttpError<E>,
    owner: &StreamOwner,
) -> StreamableHttpError<E> {
    if http_status(&error) != Some(404) {
        return error;
    }
    info!(session = ?owner.session().map(SessionId::hashed),
        "GET answered 404: the server no longer knows the session; the next request re-initializes");
    StreamableHttpError::ServerDoesNotSupportSse
}
