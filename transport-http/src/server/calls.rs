//! Exactly-once tool calls: a `tools/call` that carries an idempotency key
//! runs at most once per key, on any instance, and every attempt with the
//! same key gets its answer.
//!
//! The 2026-07-28 revision drops stream resumption: "a broken response
//! stream loses the in-flight request; clients MUST re-issue it as a new
//! request", and a plain re-issue runs the tool again. A client that puts a
//! key of its choosing in the request's `_meta` under [`IDEMPOTENCY_KEY`]
//! (and sends the same key with every attempt of that call) gets, from a
//! durable server, the semantics of the [`CallStore`]:
//!
//! * the call is recorded under (principal, key) before the tool runs, so
//!   a second attempt on any instance finds it;
//! * a finished call is answered from the record, without running the tool;
//! * a call still running on a live instance is waited for, up to
//!   [`ExactlyOnce::wait_limit`], then answered [`STILL_RUNNING`];
//! * a call whose instance stopped before it answered runs again only if
//!   its tool was declared safe to re-run ([`ExactlyOnce::rerunnable`]);
//!   otherwise every attempt is answered [`OUTCOME_UNKNOWN`], for good;
//! * a tool that panics is a call cut while it ran, settled at once: the
//!   attempt that ran it gets an internal error, and the next attempt runs
//!   it again if it is declared safe to re-run, or hears
//!   [`OUTCOME_UNKNOWN`];
//! * a keyed call runs to its end even when the client's connection breaks
//!   (a closed stream is not taken as cancellation for it: the client will
//!   ask again), and its answer is kept for [`ExactlyOnce::window`];
//! * another principal's attempt under the same key is a call of its own;
//!   the same key with other arguments is refused (`-32602`).
//!
//! What is on disk when: the record is written before the tool runs, with
//! the store's full durability (on SQLite's default `Durability::Full`,
//! fsynced), so not even a power cut lets a tool not declared safe to
//! re-run run twice. On a legacy server with an event store it is written
//! beside the request stream's first event (its priming event), in the
//! same poll, so that SQLite's writer usually finds both waiting and
//! commits them together: the record then costs no fsync of its own. The
//! writer does not wait for it, though: when it wakes between the two
//! writes (nearly every time in a debug build), the record is a synced
//! commit of its own. `cargo xtask bench client` prints the server's
//! commits per call with exactly-once off and on. A record so written
//! whose request never reaches the tool is released.
//! The answer is kept while it is sent, by a write the
//! store may acknowledge before it syncs it
//! ([`PutOptions::unsynced`](mcp_persist_core::PutOptions#structfield.unsynced)):
//! SQLite holds it up to a millisecond for the write behind it and puts it
//! on disk with that synced commit, on a legacy server normally the
//! response's own event, stored before the client can read it (one commit
//! for both). An instance that stops (or loses power) before the answer is kept
//! leaves later attempts hearing [`OUTCOME_UNKNOWN`], as for a call cut
//! while it ran.
//!
//! Servers advertise it as the capability extension [`EXACTLY_ONCE`] (in the
//! `initialize` result and in `server/discover`), so a client knows when a
//! re-issue is safe. Requests without a key are untouched.
//!
//! An answer whose JSON is over [`ExactlyOnce::max_answer_bytes`] is sent
//! to the attempt that ran the tool and not kept: later attempts are
//! answered [`ANSWER_NOT_KEPT`] (the call completed; its answer is gone).

use std::{
    borrow::Cow,
    collections::BTreeSet,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use mcp_persist_core::{
    CallAnswer, CallKey, CallRecord, CallStatus, CallStore, KeptAnswer, Liveness, Stored, Stores,
    stores::Begin, telemetry::Telemetry,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::*,
    service::{MaybeSendFuture, NotificationContext, RequestContext, SubscriptionContext},
};
use tracing::{Instrument, debug, info, warn};

use super::{binding::PrincipalFn, instance::InstanceLife, spans::ServedRequest};

pub use crate::exactly_once::{
    ANSWER_NOT_KEPT, EXACTLY_ONCE, IDEMPOTENCY_KEY, OUTCOME_UNKNOWN, STILL_RUNNING,
};

/// How a durable server treats keyed calls (on by default).
#[derive(Debug, Clone)]
pub struct ExactlyOnce {
    enabled: bool,
    window: Duration,
    wait_limit: Duration,
    max_answer_bytes: usize,
    rerunnable: BTreeSet<String>,
}

impl Default for ExactlyOnce {
    fn default() -> Self {
        ExactlyOnce {
            enabled: true,
            window: Duration::from_secs(60 * 60),
            wait_limit: Duration::from_secs(60),
            max_answer_bytes: 1024 * 1024,
            rerunnable: BTreeSet::new(),
        }
    }
}

impl ExactlyOnce {
    /// Keyed calls served with the defaults: kept an hour, waited for up to
    /// a minute, answers up to 1 MiB kept, no tool re-run.
    pub fn new() -> Self {
        ExactlyOnce::default()
    }

    /// Keys are ignored and every call runs as sent (the server does not
    /// advertise [`EXACTLY_ONCE`]).
    pub fn disabled() -> Self {
        ExactlyOnce {
            enabled: false,
            ..ExactlyOnce::default()
        }
    }

    /// How long a call and its answer are kept after its last change
    /// (default one hour): an attempt after that runs the tool again.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long an attempt waits for the same call running on a live
    /// instance before it is answered [`STILL_RUNNING`] (default 60 s).
    pub fn wait_limit(mut self, limit: Duration) -> Self {
        self.wait_limit = limit;
        self
    }

    /// The largest answer kept, as JSON bytes (default 1 MiB).
    pub fn max_answer_bytes(mut self, bytes: usize) -> Self {
        self.max_answer_bytes = bytes;
        self
    }

    /// Tools safe to run again when the instance running them stopped
    /// before they answered (reads, idempotent writes). Every other tool's
    /// interrupted call is answered [`OUTCOME_UNKNOWN`] instead.
    pub fn rerunnable<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rerunnable.extend(tools.into_iter().map(Into::into));
        self
    }

    /// Whether keys are honoured.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }
}

/// What serving keyed calls needs, shared by every handler of an instance.
pub(crate) struct Calls {
    store: CallStore,
    life: Arc<InstanceLife>,
    principal: Arc<PrincipalFn>,
    config: ExactlyOnce,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Calls {
    /// `None` when the configuration is disabled.
    pub(crate) fn new(
        stores: &Stores,
        life: Arc<InstanceLife>,
        principal: Arc<PrincipalFn>,
        config: ExactlyOnce,
    ) -> Option<Arc<Calls>> {
        config.enabled.then(|| {
            Arc::new(Calls {
                store: stores.calls(config.window),
                life,
                principal,
                config,
            })
        })
    }
}

impl Calls {
    /// Records the keyed call `message` carries (if it is one) alongside
    /// the first event of its stream: returns the write to run beside that
    /// event, and leaves in the message's extensions where the handler finds
    /// its outcome. Without it the record is a commit of its own after the
    /// stream opened, one more fsync on every keyed call's path on SQLite.
    ///
    /// A record begun here that no handler takes (the request was never
    /// handed to the tool: its stream failed to open, or the service went
    /// away) is released when the message is dropped, so that the next
    /// attempt runs the call rather than wait for a run that never started.
    pub(crate) fn begin_early(
        self: &Arc<Self>,
        message: &mut ClientJsonRpcMessage,
    ) -> Option<futures::future::BoxFuture<'static, ()>> {
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        let meta = request.request.get_meta();
        let ClientRequest::CallToolRequest(call) = &request.request else {
            return None;
        };
        let raw = raw_key(meta, &call.params)?;
        let principal = call
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| (self.principal)(parts));
        // A malformed key is refused by the handler, as without this.
        let key = CallKey::new(principal.as_deref(), &raw).ok()?;
        let tool = call.params.name.to_string();
        let arguments =
            serde_json::Value::Object(call.params.arguments.clone().unwrap_or_default());
        let digest = CallStore::digest(&tool, &arguments);
        let early = EarlyBegin(Arc::new(EarlySlot {
            calls: self.clone(),
            key,
            outcome: std::sync::Mutex::default(),
        }));
        request.request.extensions_mut().insert(early.clone());
        let calls = self.clone();
        Some(Box::pin(async move {
            if calls.life.ensure_started().await.is_err() {
                // The handler tries again, and says why it failed.
                return;
            }
            let slot = &early.0;
            let outcome = calls
                .store
                .begin(&slot.key, &tool, &digest, calls.life.id())
                .await;
            *slot.lock() = Some(outcome);
        }))
    }
}

/// Where the handler of a keyed call finds the record
/// [`Calls::begin_early`] wrote for it.
#[derive(Clone)]
struct EarlyBegin(Arc<EarlySlot>);

struct EarlySlot {
    calls: Arc<Calls>,
    key: CallKey,
    outcome: std::sync::Mutex<Option<mcp_persist_core::Result<Begin>>>,
}

impl EarlySlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mcp_persist_core::Result<Begin>>> {
        self.outcome.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl EarlyBegin {
    /// The outcome of recording the call under `key`, once; `None` when it
    /// was not recorded early (or not under this key).
    fn take(&self, key: &CallKey) -> Option<Begin> {
        if &self.0.key != key {
            return None;
        }
        match self.0.lock().take()? {
            Ok(begun) => Some(begun),
            Err(e) => {
                debug!(error = %e, "recording a keyed call as its stream opened failed; trying again");
                None
            }
        }
    }
}

impl Drop for EarlySlot {
    fn drop(&mut self) {
        let Some(Ok(Begin::Started(running))) = self.lock().take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(tool = %running.record.tool, "a keyed call recorded as its stream opened never reached its tool, and no runtime is left to release it; later attempts hear that its outcome is unknown");
            return;
        };
        let calls = self.calls.clone();
        let key = self.key.clone();
        info!(tool = %running.record.tool, "a keyed call recorded as its stream opened never reached its tool; releasing it, so that the next attempt runs it");
        runtime.spawn(async move {
            if let Err(e) = calls.store.release(&key, &running).await {
                warn!(error = %e, "could not release a keyed call that never reached its tool; a later attempt waits for it, then hears it is still running");
            }
        });
    }
}

/// An rmcp service that serves keyed `tools/call` requests exactly once and
/// passes everything else to the handler it wraps, each request in its
/// span (see [`telemetry`](crate::telemetry));
/// [`DurableServer::service`](super::DurableServer::service) wraps every
/// handler in one.
pub struct KeyedCalls<H> {
    inner: Arc<H>,
    calls: Option<Arc<Calls>>,
    telemetry: Telemetry,
}

impl<H> KeyedCalls<H> {
    pub(crate) fn new(inner: H, calls: Option<Arc<Calls>>, telemetry: Telemetry) -> Self {
        KeyedCalls {
            inner: Arc::new(inner),
            calls,
            telemetry,
        }
    }

    /// The span of a request to serve (see [`ServedRequest`]).
    fn served(
        &self,
        method: &'static str,
        tool: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> ServedRequest {
        ServedRequest::new(&self.telemetry, method.to_owned(), tool, context)
    }
}

impl<H> std::fmt::Debug for KeyedCalls<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedCalls")
            .field("enabled", &self.calls.is_some())
            .finish_non_exhaustive()
    }
}

/// The idempotency key of a call, if it carries one: rmcp hands the
/// request's `_meta` to the handler in its context (the params' own `_meta`
/// is read too). A non-string value is kept as its JSON text, which the key
/// check then refuses.
fn key_of(request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> Option<String> {
    raw_key(&context.meta, request)
}

/// The idempotency key in `meta` (a request's `_meta`, as rmcp keeps it
/// apart) or in the params' own `_meta`.
fn raw_key(meta: &RequestMetaObject, request: &CallToolRequestParams) -> Option<String> {
    let value = meta.get(IDEMPOTENCY_KEY).or_else(|| {
        request
            .meta
            .as_ref()
            .and_then(|meta| meta.get(IDEMPOTENCY_KEY))
    })?;
    Some(match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Adds the extension to `capabilities`.
fn advertise(capabilities: &mut ServerCapabilities) {
    capabilities
        .extensions
        .get_or_insert_with(Default::default)
        .insert(EXACTLY_ONCE.to_owned(), JsonObject::new());
}

fn store_error(doing: &str, e: &mcp_persist_core::Error) -> ErrorData {
    warn!(error = %e, "{doing}");
    ErrorData::internal_error(format!("{doing}: the store failed ({e}); try again"), None)
}

fn outcome_unknown(key: &CallKey, tool: &str) -> ErrorData {
    ErrorData::new(
        OUTCOME_UNKNOWN,
        "the server instance running this call stopped before it answered, and the tool is not \
         declared safe to run again: whether it ran is unknown",
        Some(serde_json::json!({ "idempotencyKey": key.as_str(), "tool": tool })),
    )
}

/// Delegates every method to the wrapped handler, but for `tools/call`
/// with a key, and adds [`EXACTLY_ONCE`] to what the server advertises.
impl<H: ServerHandler> ServerHandler for KeyedCalls<H> {
    fn ping(
        &self,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("ping", None, &context);
        served.serve(self.inner.ping(context))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let served = self.served("initialize", None, &context);
        let mut result = served
            .serve(self.inner.initialize(request, context))
            .await?;
        if self.calls.is_some() {
            advertise(&mut result.capabilities);
        }
        Ok(result)
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, ErrorData> {
        let mut result = self.inner.negotiate_initialize(request)?;
        if self.calls.is_some() {
            advertise(&mut result.capabilities);
        }
        Ok(result)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let served = self.served("server/discover", None, &context);
        let mut result = served.serve(self.inner.discover(context)).await?;
        if self.calls.is_some() {
            advertise(&mut result.capabilities);
        }
        Ok(result)
    }

    fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CompleteResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("completion/complete", None, &context);
        served.serve(self.inner.complete(request, context))
    }

    #[allow(deprecated)]
    fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("logging/setLevel", None, &context);
        served.serve(self.inner.set_level(request, context))
    }

    fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetPromptResponse, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("prompts/get", None, &context);
        served.serve(self.inner.get_prompt(request, context))
    }

    fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListPromptsResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("prompts/list", None, &context);
        served.serve(self.inner.list_prompts(request, context))
    }

    fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListResourcesResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("resources/list", None, &context);
        served.serve(self.inner.list_resources(request, context))
    }

    fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListResourceTemplatesResult, ErrorData>> + MaybeSendFuture + '_
    {
        let served = self.served("resources/templates/list", None, &context);
        served.serve(self.inner.list_resource_templates(request, context))
    }

    fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ReadResourceResponse, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("resources/read", None, &context);
        served.serve(self.inner.read_resource(request, context))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.inner.accepted_subscription_filter(requested)
    }

    fn listen(
        &self,
        context: SubscriptionContext,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.listen(context)
    }

    #[allow(deprecated)]
    fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("resources/subscribe", None, &context);
        served.serve(self.inner.subscribe(request, context))
    }

    #[allow(deprecated)]
    fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("resources/unsubscribe", None, &context);
        served.serve(self.inner.unsubscribe(request, context))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let served = self.served("tools/call", Some(&request.name), &context);
        match (&self.calls, key_of(&request, &context)) {
            (Some(calls), Some(key)) => {
                served
                    .serve(calls.serve(self.inner.clone(), request, key, context))
                    .await
            }
            _ => served.serve(self.inner.call_tool(request, context)).await,
        }
    }

    fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListToolsResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("tools/list", None, &context);
        served.serve(self.inner.list_tools(request, context))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.get_tool(name)
    }

    fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CustomResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = ServedRequest::new(&self.telemetry, request.method.clone(), None, &context);
        served.serve(self.inner.on_custom_request(request, context))
    }

    fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_cancelled(notification, context)
    }

    fn on_progress(
        &self,
        notification: ProgressNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_progress(notification, context)
    }

    fn on_initialized(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_initialized(context)
    }

    fn on_roots_list_changed(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_roots_list_changed(context)
    }

    fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_custom_notification(notification, context)
    }

    fn get_info(&self) -> ServerConfig {
        let mut info = self.inner.get_info();
        if self.calls.is_some() {
            advertise(&mut info.capabilities);
        }
        info
    }

    fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetTaskResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("tasks/get", None, &context);
        served.serve(self.inner.get_task(request, context))
    }

    fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("tasks/update", None, &context);
        served.serve(self.inner.update_task(request, context))
    }

    fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("tasks/cancel", None, &context);
        served.serve(self.inner.cancel_task(request, context))
    }

    fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListSkillsResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("skills/list", None, &context);
        served.serve(self.inner.list_skills(request, context))
    }

    fn get_skill(
        &self,
        request: GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetSkillResult, ErrorData>> + MaybeSendFuture + '_ {
        let served = self.served("skills/get", None, &context);
        served.serve(self.inner.get_skill(request, context))
    }

    fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ReadResourceDirectoryResult, ErrorData>> + MaybeSendFuture + '_
    {
        let served = self.served("resources/directory/read", None, &context);
        served.serve(self.inner.read_resource_directory(request, context))
    }
}

impl Calls {
    fn principal_of(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| (self.principal)(parts))
    }

    /// Serves one keyed call: runs it, waits for it, or answers from its
    /// record.
    async fn serve<H: ServerHandler>(
        self: &Arc<Self>,
        inner: Arc<H>,
        call: CallToolRequestParams,
        raw: String,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let key = CallKey::new(self.principal_of(&context).as_deref(), &raw)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let tool = call.name.to_string();
        let arguments = serde_json::Value::Object(call.arguments.clone().unwrap_or_default());
        let digest = CallStore::digest(&tool, &arguments);
        self.life
            .ensure_started()
            .await
            .map_err(|e| store_error("registering this instance", &e))?;
        let deadline = Instant::now() + self.config.wait_limit;
        let early = context
            .extensions
            .get::<EarlyBegin>()
            .and_then(|early| early.take(&key));
        let mut begun = match early {
            Some(begun) => begun,
            None => self
                .store
                .begin(&key, &tool, &digest, self.life.id())
                .await
                .map_err(|e| store_error("recording the call", &e))?,
        };
        loop {
            let stored = match begun {
                Begin::Started(running) => {
                    return self.run(inner, call, context, key, running).await;
                }
                Begin::Existing(stored) => stored,
            };
            if stored.record.digest != digest {
                return Err(ErrorData::invalid_params(
                    format!(
                        "the idempotency key {:?} was already used for another call (another \
                         tool or other arguments); use a new key for a new call",
                        key.as_str()
                    ),
                    None,
                ));
            }
            match stored.record.status {
                CallStatus::Done => {
                    debug!(tool, "keyed call already answered; sending its kept answer");
                    return answer_of(&stored.record, &key);
                }
                CallStatus::Unknown => return Err(outcome_unknown(&key, &tool)),
                _ => {}
            }
            let owner = stored.record.owner.clone();
            let alive = self
                .life
                .observe(&owner)
                .await
                .map_err(|e| store_error("checking the instance running the call", &e))?;
            if alive == Liveness::Dead {
                if self.config.rerunnable.contains(&tool) {
                    if let Some(taken) = self
                        .store
                        .take_over(&key, &stored, self.life.id())
                        .await
                        .map_err(|e| store_error("taking the call over", &e))?
                    {
                        info!(tool, stopped = %owner, runs = taken.record.runs, "the instance running a keyed call stopped; running it again (declared safe to re-run)");
                        return self.run(inner, call, context, key, taken).await;
                    }
                } else if self
                    .store
                    .mark_unknown(&key, &stored)
                    .await
                    .map_err(|e| store_error("recording the call's outcome", &e))?
                    .is_some()
                {
                    warn!(tool, stopped = %owner, "the instance running a keyed call stopped before it answered; its outcome is unknown");
                    return Err(outcome_unknown(&key, &tool));
                }
            } else if Instant::now() >= deadline {
                return Err(ErrorData::new(
                    STILL_RUNNING,
                    format!(
                        "the call is still running on another instance after {} s; send it \
                         again with the same key later",
                        self.config.wait_limit.as_secs()
                    ),
                    Some(serde_json::json!({ "idempotencyKey": key.as_str(), "tool": tool })),
                ));
            } else {
                tokio::time::sleep(self.life.check_every().min(Duration::from_millis(100))).await;
            }
            begun = match self
                .store
                .load(&key)
                .await
                .map_err(|e| store_error("reading the call", &e))?
            {
                Some(found) => Begin::Existing(found),
                // Expired meanwhile: this attempt records it afresh.
                None => self
                    .store
                    .begin(&key, &tool, &digest, self.life.id())
                    .await
                    .map_err(|e| store_error("recording the call", &e))?,
            };
        }
    }

    /// Runs the call to its end, keeps its answer, and returns it.
    ///
    /// It runs in the task rmcp gave this request, which nothing aborts: a
    /// broken connection does not stop it (the client will ask again), and
    /// its cancellation token is replaced by one nobody cancels. A tool that
    /// panics is answered with an internal error, and its call is settled at
    /// once (see [`panicked`](Self::panicked)): a later attempt never waits
    /// for an answer that will not come.
    async fn run<H: ServerHandler>(
        self: &Arc<Self>,
        inner: Arc<H>,
        call: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
        key: CallKey,
        running: Stored<CallRecord>,
    ) -> Result<CallToolResponse, ErrorData> {
        context.ct = tokio_util::sync::CancellationToken::new();
        let Ok(outcome) = std::panic::AssertUnwindSafe(inner.call_tool(call, context))
            .catch_unwind()
            .await
        else {
            return Err(self.panicked(&key, &running).await);
        };
        // The answer goes out while it is being kept: its store write
        // overlaps the response's own (on SQLite it waits for the
        // response's event and shares its synced commit; starting it only
        // as the response is stored was measured to save no time).
        // Until it lands another attempt finds the call running here and
        // waits for it; only if this instance dies in between does a later
        // attempt (of a client that lost this answer) hear "outcome
        // unknown", as for a call cut while it ran. The answer is encoded
        // here, once, so the response is neither cloned nor turned into a
        // JSON tree to be kept.
        let kept = kept_answer(&outcome);
        let calls = self.clone();
        let keeping = async move { calls.keep(&key, &running, kept).await }.in_current_span();
        start_or_spawn(keeping);
        outcome
    }

    /// Settles a call whose tool panicked here. Whatever the tool did
    /// before it panicked is done, so a tool not declared safe to re-run has
    /// an unknown outcome, and every later attempt hears
    /// [`OUTCOME_UNKNOWN`] at once (left running, each attempt would wait
    /// [`ExactlyOnce::wait_limit`] and hear [`STILL_RUNNING`], for as long
    /// as this instance lives). A tool declared safe to re-run is released:
    /// the next attempt runs it again. The attempt that ran it gets an
    /// internal error saying it panicked.
    async fn panicked(&self, key: &CallKey, running: &Stored<CallRecord>) -> ErrorData {
        let tool = &running.record.tool;
        let settled = if self.config.rerunnable.contains(tool) {
            warn!(tool = %tool, "a keyed call's tool panicked; released, so that the next attempt runs it again (declared safe to re-run)");
            self.store.release(key, running).await
        } else {
            warn!(tool = %tool, "a keyed call's tool panicked; its outcome is unknown, and every later attempt is told so");
            self.store.mark_unknown(key, running).await.map(|_| ())
        };
        if let Err(e) = settled {
            warn!(error = %e, "could not record how a panicked keyed call ended; a later attempt waits for it, then hears it is still running");
        }
        ErrorData::internal_error(
            "the tool call stopped without an answer: it panicked",
            Some(serde_json::json!({ "idempotencyKey": key.as_str(), "tool": tool })),
        )
    }

    /// Keeps the answer of a call that ran here (`None`: it asked for
    /// input, and is released to be called again under the same key).
    async fn keep(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        answer: Option<mcp_persist_core::Result<KeptAnswer>>,
    ) {
        let answer = match answer {
            Some(Ok(answer)) => answer,
            Some(Err(e)) => {
                warn!(error = %e, "a keyed call's answer does not serialize; not kept");
                return;
            }
            None => {
                if let Err(e) = self.store.release(key, running).await {
                    warn!(error = %e, "could not release a keyed call that asked for input");
                }
                return;
            }
        };
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=5 {
            match self
                .store
                .finish_within(key, running, answer.clone(), self.config.max_answer_bytes)
                .await
            {
                Ok(true) => return,
                Ok(false) => {
                    warn!(tool = %running.record.tool, "a keyed call was taken over while it ran here; its answer here is sent but not kept");
                    return;
                }
                Err(e) if attempt < 5 => {
                    debug!(error = %e, attempt, "keeping a keyed call's answer failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    warn!(error = %e, "could not keep a keyed call's answer; a later attempt waits for it, then hears it is still running");
                }
            }
        }
    }
}

/// The answer to keep for `outcome`; `None` for a call that asked the
/// client for input (a multi round-trip call: the tool is called again
/// with the answers, under the same key).
fn kept_answer(
    outcome: &Result<CallToolResponse, ErrorData>,
) -> Option<mcp_persist_core::Result<KeptAnswer>> {
    match outcome {
        Ok(CallToolResponse::Complete(r)) => Some(KeptAnswer::result(r)),
        Ok(CallToolResponse::Task(t)) => Some(KeptAnswer::task(t)),
        Err(e) => Some(KeptAnswer::error(e)),
        Ok(_) => None,
    }
}

/// Runs `work` on this task as far as it goes without waiting, and spawns
/// the rest only if it has to wait. A store that answers at once (memory)
/// costs no task and no wake-up of another worker; on one that waits
/// (SQLite, Redis) the write is already handed to the store when the
/// response goes out.
fn start_or_spawn(work: impl Future<Output = ()> + Send + 'static) {
    let mut work = Box::pin(work);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if work.as_mut().poll(&mut cx).is_pending() {
        // Polled again at once by the runtime, which registers its own
        // waker with whatever the first poll waits on.
        tokio::spawn(work);
    }
}

/// The kept answer of a finished call, as its first attempt got it.
fn answer_of(record: &CallRecord, key: &CallKey) -> Result<CallToolResponse, ErrorData> {
    let corrupt = |e: &dyn std::fmt::Display| {
        ErrorData::internal_error(
            format!("the kept answer of this call is unreadable: {e}"),
            None,
        )
    };
    match record.answer().map_err(|e| corrupt(&e))? {
        Some(CallAnswer::Result(v)) => serde_json::from_value::<CallToolResult>(v)
            .map(CallToolResponse::Complete)
            .map_err(|e| corrupt(&e)),
        Some(CallAnswer::Task(v)) => serde_json::from_value::<CreateTaskResult>(v)
            .map(CallToolResponse::Task)
            .map_err(|e| corrupt(&e)),
        Some(CallAnswer::Error(v)) => {
            Err(serde_json::from_value::<ErrorData>(v).map_err(|e| corrupt(&e))?)
        }
        Some(_) => Err(corrupt(&"an answer of an unknown kind")),
        None => Err(ErrorData::new(
            ANSWER_NOT_KEPT,
            format!(
                "the call completed, but its answer ({} bytes) was over the size this server \
                 keeps",
                record.answer_not_kept_bytes.unwrap_or_default()
            ),
            Some(serde_json::json!({ "idempotencyKey": key.as_str(), "tool": record.tool })),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_persist_core::MemoryStore;

    /// A keyed `tools/call` of `echo` under `key`, as rmcp hands it to the
    /// session manager.
    fn keyed_call(key: &str) -> ClientJsonRpcMessage {
        serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"n": 1}, "_meta": {IDEMPOTENCY_KEY: key}}
        }))
        .expect("a tools/call message")
    }

    fn calls(stores: &Stores) -> Arc<Calls> {
        let life = InstanceLife::new(stores, Duration::from_secs(5)).expect("an instance");
        let principal: Arc<PrincipalFn> = Arc::new(|_: &http::request::Parts| None);
        Calls::new(stores, life, principal, ExactlyOnce::new()).expect("enabled")
    }

    fn early_of(message: &ClientJsonRpcMessage) -> EarlyBegin {
        let ClientJsonRpcMessage::Request(request) = message else {
            panic!("a request");
        };
        request
            .request
            .extensions()
            .get::<EarlyBegin>()
            .cloned()
            .expect("the early record's slot")
    }

    /// Recorded alongside the stream's first event, a call is begun once,
    /// and its handler takes that record instead of writing another; a
    /// request that never reached its tool (its message dropped) has its
    /// record released, so that the next attempt runs the call instead of
    /// waiting for a run that never started, then hearing it is unknown.
    #[tokio::test]
    async fn an_early_record_is_taken_by_its_handler_or_released_when_none_comes() {
        let stores = Stores::new(MemoryStore::new());
        let calls = calls(&stores);
        let key = CallKey::new(None, "k-taken").expect("a key");

        let mut message = keyed_call("k-taken");
        let begin = calls.begin_early(&mut message).expect("a keyed call");
        begin.await;
        let early = early_of(&message);
        assert!(
            early
                .take(&CallKey::new(None, "another").expect("a key"))
                .is_none(),
            "another key's handler does not take it"
        );
        match early.take(&key) {
            Some(Begin::Started(running)) => assert_eq!(running.record.tool, "echo"),
            other => panic!("expected a started call, got {other:?}"),
        }
        assert!(early.take(&key).is_none(), "taken once");
        drop((early, message));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let kept = calls.store.load(&key).await.expect("load");
        assert_eq!(
            kept.map(|k| k.record.status),
            Some(CallStatus::Running),
            "a taken record stays the handler's"
        );

        let key = CallKey::new(None, "k-dropped").expect("a key");
        let mut message = keyed_call("k-dropped");
        calls.begin_early(&mut message).expect("a keyed call").await;
        assert!(calls.store.load(&key).await.expect("load").is_some());
        drop(message);
        let deadline = Instant::now() + Duration::from_secs(5);
        while calls.store.load(&key).await.expect("load").is_some() {
            assert!(
                Instant::now() < deadline,
                "the untaken record was not released"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match calls
            .store
            .begin(
                &key,
                "echo",
                &CallStore::digest("echo", &serde_json::json!({"n": 1})),
                "next",
            )
            .await
            .expect("begin")
        {
            Begin::Started(_) => {}
            other => panic!("the next attempt should run the call, got {other:?}"),
        }

        // Not a keyed call: nothing is begun.
        let mut plain: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "echo"}
        }))
        .expect("a tools/call message");
        assert!(calls.begin_early(&mut plain).is_none());
    }
}
