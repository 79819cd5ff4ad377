//! rmcp's `EventStore` over core's [`EventLog`](mcp_persist_core::EventLog),
//! with replay that keeps tailing a stream another instance is still writing.

use std::{
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use mcp_persist_core::{EventId, SessionId, StoredEvent, telemetry::Telemetry};
use rmcp::{
    model::ServerJsonRpcMessage,
    transport::streamable_http_server::session::{
        EventStore as RmcpEventStore, EventStoreError, EventStream, ServerSseMessage,
    },
};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, field::Empty, warn};

use super::instance::InstanceLife;

/// Suffix rmcp gives the standalone (GET) stream of a session.
const COMMON_STREAM_SUFFIX: &str = ":common";

/// How long one wait for new events lasts before the replay task checks
/// again whether its client is still there.
const TAIL_SLICE: Duration = Duration::from_secs(5);

/// The SSE event log of an rmcp Streamable HTTP server, shared by every
/// instance.
///
/// * Every event rmcp sends on a stream is committed before its id is sent.
///   Ids are `<128-bit random stream token>-<sequence>-<stream id>`: they name
///   the stream and the position, and cannot be guessed.
/// * Replay after a `Last-Event-ID` yields the later events of that one
///   stream, in order, with their original ids, then keeps **tailing** the
///   stream: events appended meanwhile, by this instance or any other, are
///   delivered as they are committed. A request's stream ends once its final
///   response (or error) has been delivered; a session's standalone stream
///   ends when the client goes away. A tail that sees nothing new for the
///   configured idle limit ends too, and the client resumes again.
/// * Every resumed stream that may still carry events starts with a
///   **priming event**: the resumed-from id and empty data (with the SSE
///   `retry` hint when one is configured), as rmcp starts a fresh POST
///   stream. A client that keeps the last id it saw on the stream it is
///   reading (the TypeScript SDK does) thus keeps its place when a resumed
///   stream ends before any new event, and resumes from the same id again
///   instead of losing the rest of the call.
/// * When the store is owned by one session (the server's session manager
///   hands each session its own), streams are recorded as that session's, and
///   a `Last-Event-ID` of another session's stream is refused.
#[derive(Clone)]
pub struct DurableEventStore {
    events: mcp_persist_core::EventLog,
    session: Arc<OnceLock<SessionId>>,
    tail_idle: Duration,
    life: Option<Arc<InstanceLife>>,
    retry: Option<Duration>,
    telemetry: Telemetry,
    opening: Arc<Opening>,
}

/// The request whose stream a session is opening: rmcp stores a POST
/// stream's first event (its priming event) before it hands the request to
/// the handler, under a stream id of its own making, so the session manager
/// names the request here first and the first event of a stream new here
/// records it with the stream's metadata (see
/// [`EventLog::append_opening`](mcp_persist_core::EventLog::append_opening)).
#[derive(Default)]
struct Opening {
    /// One stream opens at a time per session.
    turn: tokio::sync::Mutex<()>,
    request: std::sync::Mutex<Option<serde_json::Value>>,
    /// A write to run alongside the stream's first event (a keyed call's
    /// record, see [`Calls::begin_early`](super::calls::Calls::begin_early)).
    beside: std::sync::Mutex<Option<BoxFuture<'static, ()>>>,
}

impl std::fmt::Debug for DurableEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableEventStore")
            .field("events", &self.events)
            .field("session", &self.session.get())
            .field("tail_idle", &self.tail_idle)
            .field("retry", &self.retry)
            .finish()
    }
}

impl DurableEventStore {
    /// A store over core's event store, not owned by any session (the server
    /// has no sessions, or the caller checks ownership itself). A replay
    /// tails for at most `tail_idle` without a new event.
    pub fn new(events: mcp_persist_core::EventLog, tail_idle: Duration) -> Self {
        DurableEventStore {
            events,
            session: Arc::new(OnceLock::new()),
            tail_idle,
            life: None,
            retry: None,
            telemetry: Telemetry::disabled(),
            opening: Arc::default(),
        }
    }

    /// The same store, counting events appended and replayed in
    /// `telemetry` (see [`telemetry`](crate::telemetry)).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// The same store, sending `retry` (the SSE reconnection hint) in the
    /// priming event that starts every resumed stream. Without it the
    /// priming event carries the id alone.
    pub fn with_retry(mut self, retry: Option<Duration>) -> Self {
        self.retry = retry;
        self
    }

    /// The same store, ending a replayed stream whose writing instance
    /// stopped (its lease lapsed) with an error for the request it answers.
    pub(crate) fn with_liveness(mut self, life: Arc<InstanceLife>) -> Self {
        self.life = Some(life);
        self
    }

    /// This instance's liveness, when the server keeps one.
    pub(crate) fn life(&self) -> Option<&Arc<InstanceLife>> {
        self.life.as_ref()
    }

    /// The same store, to be owned by one session once
    /// [`bind`](Self::bind) names it.
    pub(crate) fn for_session(&self) -> Self {
        DurableEventStore {
            events: self.events.clone(),
            session: Arc::new(OnceLock::new()),
            tail_idle: self.tail_idle,
            life: self.life.clone(),
            retry: self.retry,
            telemetry: self.telemetry.clone(),
            opening: Arc::default(),
        }
    }

    /// Runs `open` (rmcp opening the stream of `request`, the JSON-RPC id of
    /// a client request) with that id waiting for the stream's first event,
    /// which records it with the stream's metadata; also says whether a
    /// first event took it (when none did, rmcp sends no priming event and
    /// the caller records the request once the stream's first event names
    /// it). Openings in one session take turns; rmcp's session worker stores
    /// their first events one at a time anyway.
    ///
    /// `beside`, when given, is written alongside that first event (in one
    /// commit, on a store that groups the writes waiting together; after
    /// it, on its own, when the event is pipelined and committed later); it
    /// is dropped unstarted when no first event took the request.
    pub(crate) async fn opening<T>(
        &self,
        request: serde_json::Value,
        beside: Option<BoxFuture<'static, ()>>,
        open: impl Future<Output = T>,
    ) -> (T, bool) {
        let _turn = self.opening.turn.lock().await;
        *self.opening_request() = Some(request);
        *self.opening_beside() = beside;
        let opened = open.await;
        let taken = self.opening_request().take().is_none();
        self.opening_beside().take();
        (opened, taken)
    }

    fn opening_beside(&self) -> std::sync::MutexGuard<'_, Option<BoxFuture<'static, ()>>> {
        self.opening
            .beside
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn opening_request(&self) -> std::sync::MutexGuard<'_, Option<serde_json::Value>> {
        self.opening
            .request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Names the session owning this store's streams. Later calls are ignored.
    pub(crate) fn bind(&self, session: SessionId) {
        let _ = self.session.set(session);
    }

    /// The underlying typed store.
    pub fn inner(&self) -> &mcp_persist_core::EventLog {
        &self.events
    }
}

#[async_trait::async_trait]
impl RmcpEventStore for DurableEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<String, EventStoreError> {
        // Encoded straight from the message (a priming event has none and
        // is stored as `null`), not through a JSON tree.
        let payload = event.message.as_deref();
        // The priming event of a request stream this instance has not seen:
        // the one being opened (the events of streams that exist leave the
        // request for the stream it belongs to).
        let opening = if event.message.is_some()
            || stream_id.ends_with(COMMON_STREAM_SUFFIX)
            || self.events.knows(stream_id)
        {
            None
        } else {
            self.opening_request().take()
        };
        let beside = opening.as_ref().and_then(|_| self.opening_beside().take());
        let id = match &opening {
            Some(request) => match beside {
                Some(beside) => {
                    self.events
                        .append_opening_beside(
                            stream_id,
                            self.session.get(),
                            &payload,
                            request,
                            beside,
                        )
                        .await?
                }
                None => {
                    self.events
                        .append_opening(stream_id, self.session.get(), &payload, request)
                        .await?
                }
            },
            // On a pipelined stream the message is encoded by the commit,
            // off the session's path: rmcp waits for this call before it
            // sends the event.
            None => {
                self.events
                    .append_owned(
                        stream_id,
                        self.session.get(),
                        OwnedMessage(event.message.clone()),
                    )
                    .await?
            }
        };
        self.telemetry
            .events_appended(1, self.events.config().durability.name());
        // Sized at once (token, two dashes, the number and the stream):
        // `to_string` grew it three times, for every event sent.
        let mut text = String::with_capacity(54 + stream_id.len());
        let _ = std::fmt::Write::write_fmt(&mut text, format_args!("{id}"));
        Ok(text)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let after = self.events.check(last_event_id, self.session.get()).await?;
        debug!(
            stream = after.stream(),
            after = after.seq(),
            "replaying events, then tailing"
        );
        let (tx, rx) = mpsc::channel(64);
        let span = tracing::info_span!(
            "mcp_persist.replay",
            otel.name = "mcp_persist.replay",
            mcp.session.id = self
                .session
                .get()
                .and_then(|s| self.telemetry.session_attribute(s.as_str())),
            mcp_persist.events.count = Empty,
        );
        crate::telemetry::continue_trace(&span, None);
        let telemetry = self.telemetry.clone();
        let replay = pump(
            self.events.clone(),
            after,
            tx,
            self.tail_idle,
            self.life.clone(),
            self.retry,
        );
        tokio::spawn(
            async move {
                let delivered = replay.await;
                tracing::Span::current().record("mcp_persist.events.count", delivered);
                telemetry.events_replayed(delivered);
            }
            .instrument(span),
        );
        Ok(Box::pin(ReceiverStream(rx)))
    }
}

/// An event's message (none for a priming event, stored as `null`), held
/// for as long as its encoding waits.
struct OwnedMessage(Option<Arc<ServerJsonRpcMessage>>);

impl serde::Serialize for OwnedMessage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use rmcp::model::{JsonRpcMessage, ServerNotification};
        // rmcp writes a notification's params to a JSON tree and then the
        // tree, to merge `_meta` kept in its extensions with the params'
        // own: about half of what storing a progress event cost. Without
        // metadata in the extensions there is nothing to merge, and a
        // progress notification's params are written as they are: the same
        // object, up to the order of its keys (pinned by a test).
        if let Some(JsonRpcMessage::Notification(note)) = self.0.as_deref()
            && let ServerNotification::ProgressNotification(n) = &note.notification
            && no_meta(&n.extensions)
        {
            return PlainNotification {
                jsonrpc: &note.jsonrpc,
                method: &n.method,
                params: &n.params,
            }
            .serialize(serializer);
        }
        self.0.as_deref().serialize(serializer)
    }
}

/// A notification whose extensions hold no `_meta`, as rmcp writes it.
#[derive(serde::Serialize)]
struct PlainNotification<'a, M, P> {
    jsonrpc: &'a rmcp::model::JsonRpcVersion2_0,
    method: &'a M,
    params: &'a P,
}

/// Whether a notification's extensions hold no metadata for rmcp to merge
/// into its params (the typed kind or the older untyped one).
fn no_meta(extensions: &rmcp::model::Extensions) -> bool {
    extensions
        .get::<rmcp::model::NotificationMetaObject>()
        .is_none()
        && extensions.get::<rmcp::model::MetaObject>().is_none()
}

/// Replays, then tails, one stream into `tx` until its final response is
/// sent, the client goes away, or nothing new comes for `idle`; returns how
/// many events it sent (the priming event not counted).
async fn pump(
    events: mcp_persist_core::EventLog,
    mut after: EventId,
    tx: mpsc::Sender<ServerSseMessage>,
    idle: Duration,
    life: Option<Arc<InstanceLife>>,
    retry: Option<Duration>,
) -> u64 {
    let request_stream = !after.stream().ends_with(COMMON_STREAM_SUFFIX);
    if request_stream && already_complete(&events, &after).await {
        debug!(
            stream = after.stream(),
            "resumed after the final response; nothing more to send"
        );
        return 0;
    }
    if tx.send(priming(&after, retry)).await.is_err() {
        return 0;
    }
    let mut quiet = Duration::ZERO;
    let mut delivered = 0u64;
    // A request stream written by another instance: check that instance's
    // lease whenever the stream is quiet, every half grace period.
    let watch = match (&life, request_stream) {
        (Some(life), true) => match events.origin(after.stream()).await {
            Ok(Some(origin)) => origin
                .writer
                .filter(|w| w != life.id())
                .map(|writer| (life.clone(), writer, origin.request)),
            _ => None,
        },
        _ => None,
    };
    let slice_limit = match &watch {
        Some((life, _, _)) => TAIL_SLICE.min(life.check_every()),
        None => TAIL_SLICE,
    };
    loop {
        let slice = slice_limit
            .min(idle.saturating_sub(quiet))
            .max(Duration::from_millis(1));
        let batch = tokio::select! {
            batch = events.tail(&after, slice) => batch,
            () = tx.closed() => return delivered,
        };
        let batch: Vec<StoredEvent> = match batch {
            Ok(batch) => batch,
            Err(e) => {
                warn!(stream = after.stream(), error = %e, "event replay stopped: the store failed");
                return delivered;
            }
        };
        if batch.is_empty() {
            if let Some((life, writer, request)) = &watch
                && orphaned(life, writer).await
            {
                let request = match request {
                    Some(id) => id.clone(),
                    // Recorded just after the stream began; read it again.
                    None => events
                        .origin(after.stream())
                        .await
                        .ok()
                        .flatten()
                        .and_then(|o| o.request)
                        .unwrap_or(serde_json::Value::Null),
                };
                warn!(stream = after.stream(), %writer, "the instance writing this stream stopped; ending it with an error");
                if let Some(message) = orphan_error(request, writer) {
                    let _ = tx.send(message).await;
                }
                return delivered;
            }
            quiet += slice;
            if quiet >= idle {
                debug!(
                    stream = after.stream(),
                    delivered, "no new events within the tail limit; ending the stream"
                );
                return delivered;
            }
            continue;
        }
        quiet = Duration::ZERO;
        for event in batch {
            after = event.id.clone();
            if event.payload.is_null() {
                // A priming event: it carries no message.
                continue;
            }
            let message: ServerJsonRpcMessage = match serde_json::from_value(event.payload) {
                Ok(message) => message,
                Err(e) => {
                    warn!(stream = after.stream(), seq = after.seq(), error = %e, "stored event is not a JSON-RPC message; ending the replay");
                    return delivered;
                }
            };
            let last = request_stream
                && matches!(
                    message,
                    ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
                );
            if tx
                .send(ServerSseMessage::new(event.id.to_string(), message))
                .await
                .is_err()
            {
                return delivered;
            }
            delivered += 1;
            if last {
                debug!(
                    stream = after.stream(),
                    delivered, "final response delivered; replay complete"
                );
                return delivered;
            }
        }
    }
}

/// The event that starts a resumed stream: the resumed-from id, no message,
/// and the reconnection hint. A client that sees no other event before the
/// stream ends resumes from this id again.
fn priming(after: &EventId, retry: Option<Duration>) -> ServerSseMessage {
    let id = after.to_string();
    match retry {
        Some(retry) => ServerSseMessage::priming(id, retry),
        None => {
            let mut message = ServerSseMessage::default();
            message.event_id = Some(id);
            message
        }
    }
}

/// Whether the instance `writer` stopped, as `life` observes it.
async fn orphaned(life: &InstanceLife, writer: &str) -> bool {
    matches!(
        life.observe(writer).await,
        Ok(mcp_persist_core::Liveness::Dead)
    )
}

/// The JSON-RPC error that ends an orphaned request stream: it answers the
/// request the stream was for, so the client stops waiting and re-issues it.
fn orphan_error(request: serde_json::Value, writer: &str) -> Option<ServerSseMessage> {
    let message: ServerJsonRpcMessage = serde_json::from_value(serde_json::json!({
        "jsonrpc": "2.0",
        "id": request,
        "error": {
            "code": -32603,
            "message": "the server instance running this request stopped before it answered; re-issue the request",
            "data": { "reason": "orphaned", "instance": writer }
        }
    }))
    .ok()?;
    Some(ServerSseMessage::from_message(message))
}

/// Whether the event `id` itself was its request stream's final response,
/// so a resume after it has nothing to wait for.
async fn already_complete(events: &mcp_persist_core::EventLog, id: &EventId) -> bool {
    let Some(before) = id.seq().checked_sub(1) else {
        return false;
    };
    let text = id.to_string();
    let Some((token, _)) = text.split_once('-') else {
        return false;
    };
    let Ok(previous) = format!("{token}-{before}-{}", id.stream()).parse::<EventId>() else {
        return false;
    };
    match events.tail(&previous, Duration::ZERO).await {
        Ok(batch) => batch
            .first()
            .is_some_and(|e| e.id == *id && is_final(&e.payload)),
        Err(_) => false,
    }
}

fn is_final(payload: &serde_json::Value) -> bool {
    payload.get("id").is_some()
        && (payload.get("result").is_some() || payload.get("error").is_some())
}

/// A `Send + Sync` stream over a channel (rmcp requires `Sync` streams).
struct ReceiverStream(mpsc::Receiver<ServerSseMessage>);

impl futures::Stream for ReceiverStream {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{
        JsonObject, MetaObject, NotificationMetaObject, NumberOrString, ProgressNotification,
        ProgressNotificationParam, ProgressToken, ResourceUpdatedNotification,
        ResourceUpdatedNotificationParam, ServerJsonRpcMessage, ServerNotification,
    };

    use super::*;

    fn object(key: &str, value: serde_json::Value) -> JsonObject {
        let mut object = JsonObject::new();
        object.insert(key.into(), value);
        object
    }

    fn progress(param: ProgressNotificationParam) -> ProgressNotification {
        ProgressNotification::new(param)
    }

    /// Every progress notification is stored as the object rmcp sends, and
    /// reads back as the message it was: the params written without rmcp's
    /// detour through a JSON tree when its extensions hold no metadata, and
    /// through rmcp's own writing when they do.
    #[test]
    fn a_stored_notification_is_the_object_rmcp_sends() {
        let token = |n: i64| ProgressToken(NumberOrString::Number(n));
        let mut typed = progress(ProgressNotificationParam::new(token(3), 1.0));
        typed
            .extensions
            .insert(NotificationMetaObject(MetaObject(object(
                "trace",
                "typed".into(),
            ))));
        let with_meta = |mut param: ProgressNotificationParam, meta: JsonObject| {
            param.meta = Some(NotificationMetaObject(MetaObject(meta)));
            param
        };
        let mut legacy = progress(with_meta(
            ProgressNotificationParam::new(token(4), 2.0),
            object("from", "params".into()),
        ));
        legacy
            .extensions
            .insert(MetaObject(object("trace", "legacy".into())));
        let notes = [
            progress(
                ProgressNotificationParam::new(token(1), 5.0)
                    .with_total(2000.0)
                    .with_message("half \"way\"\n"),
            ),
            progress(ProgressNotificationParam::new(
                ProgressToken(NumberOrString::String("tok-é".into())),
                0.25,
            )),
            progress(ProgressNotificationParam::new(token(-7), f64::NAN)),
            progress(with_meta(
                ProgressNotificationParam::new(token(2), 3.0),
                object("io.example/step", serde_json::json!({"n": 3})),
            )),
            typed,
            legacy,
        ];
        let mut messages: Vec<ServerJsonRpcMessage> = notes
            .into_iter()
            .map(|n| {
                ServerJsonRpcMessage::notification(ServerNotification::ProgressNotification(n))
            })
            .collect();
        messages.push(ServerJsonRpcMessage::notification(
            ServerNotification::ResourceUpdatedNotification(ResourceUpdatedNotification::new(
                ResourceUpdatedNotificationParam::new("file:///a"),
            )),
        ));
        for message in messages {
            let message = Arc::new(message);
            let sent: serde_json::Value =
                serde_json::from_slice(&serde_json::to_vec(&*message).unwrap()).unwrap();
            let stored = serde_json::to_vec(&OwnedMessage(Some(message.clone()))).unwrap();
            let stored_value: serde_json::Value = serde_json::from_slice(&stored).unwrap();
            assert_eq!(stored_value, sent, "{message:?}");
            let back: ServerJsonRpcMessage = serde_json::from_slice(&stored).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), sent, "{message:?}");
        }
        assert_eq!(serde_json::to_vec(&OwnedMessage(None)).unwrap(), b"null");
    }
}
