//! Collecting the answers to requests a previous process left in flight:
//! each is classified as a [`Recovery`], then resumed through its response
//! stream ([`resume`]) or collected through its task ([`task`]).

mod reissue;
mod resume;
mod task;

use std::{sync::Arc, time::Duration};

use mcp_persist_core::{BoxError, InFlightRequest, SessionId};
use rmcp::model::{ErrorData, ServerResult};
use tracing::Span;

pub use self::{
    reissue::ReissuedCall,
    resume::{RecoveredMessage, ResumedRequest},
    task::{RecoveredTask, TaskOutcome},
};
use super::{
    era::Verdict,
    health::lock,
    ids::WireIds,
    inbox::Inbox,
    journal::{JournalScope, JournalTx},
    keys,
    session::Lifecycle,
    wire::Wire,
};

/// The interrupted requests and the journal each is in.
pub(crate) type Listed = Arc<std::sync::Mutex<Vec<(JournalScope, InFlightRequest)>>>;

/// How long and how often a resumed request is polled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryConfig {
    pub(crate) timeout: Duration,
    pub(crate) poll_interval: Duration,
}

/// What collecting an interrupted request needs of the client: the session
/// (in use, and its version), the journal, the wire ids (a `tasks/get` in
/// the session), the inbox of the running rmcp client, the wire to resume
/// through, the timing, and the client's span.
#[derive(Clone)]
pub(crate) struct Recoverer {
    pub(crate) session: Lifecycle,
    pub(crate) journal: JournalTx,
    pub(crate) ids: Arc<WireIds>,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) wire: Arc<dyn Wire>,
    pub(crate) config: RecoveryConfig,
    /// The handle's list of interrupted requests: a collected one leaves it.
    pub(crate) listed: Listed,
    /// Entered around collecting: what it logs carries the server.
    pub(crate) span: Span,
    /// The era verdict, with the server's `server/discover` result.
    pub(crate) verdict: Arc<Verdict>,
}

impl Recoverer {
    /// The server answered 404 for `session`: if it is the one in use, it
    /// is forgotten as after a 404 on any request (the next request, or
    /// rmcp's `initialize` if the client is not serving yet, starts a new
    /// session).
    fn session_gone(&self, session: &SessionId) {
        self.session.expired(session);
    }

    /// Whether the server promised to serve keyed calls exactly once, as
    /// this client last learned it: in its `server/discover` result, or in
    /// the `initialize` result of the session in use.
    fn exactly_once(&self) -> bool {
        let discovered = self
            .verdict
            .profile()
            .and_then(|p| p.discover)
            .is_some_and(|d| crate::exactly_once::advertised(&d.result["capabilities"]));
        let initialized = self.session.state().current().is_some_and(|(_, result)| {
            serde_json::to_value(&result.capabilities)
                .is_ok_and(|c| crate::exactly_once::advertised(&c))
        });
        discovered || initialized
    }

    /// The answer to `request` was collected: it leaves the journal and the
    /// handle's list.
    fn collected(&self, scope: &JournalScope, request: &InFlightRequest) {
        self.journal.complete(scope.clone(), request.id.clone());
        lock(&self.listed).retain(|(s, r)| !(r.id == request.id && s == scope));
    }
}

/// The span of recovering `request` (`mcp_persist.recover {method}`): in
/// logs under the client's span `parent`; in its trace a child of the
/// request's original span, whose `traceparent` the journal kept.
pub(crate) fn recovery_span(parent: &Span, request: &InFlightRequest, how: &'static str) -> Span {
    let span = tracing::info_span!(
        parent: parent,
        "mcp_persist.recover",
        otel.name = %format!("mcp_persist.recover {}", request.method),
        mcp.method.name = %request.method,
        jsonrpc.request.id = %request.id,
        mcp_persist.recovery = how,
    );
    crate::telemetry::continue_trace(&span, request.traceparent.as_deref());
    span
}

/// How the answer to one interrupted request can be had.
#[derive(Debug)]
#[non_exhaustive]
pub enum Recovery {
    /// The request's response stream had an event id: its missed
    /// notifications and its final answer are collected with `GET` and
    /// `Last-Event-ID` (see [`ResumedRequest::next`]).
    Resumable(ResumedRequest),
    /// The server answered the request with a task (`CreateTaskResult`),
    /// whose id was journaled: its result is collected by polling
    /// `tasks/get` (see [`RecoveredTask::collect`]).
    Task(RecoveredTask),
    /// A `tools/call` with no stream to resume (a server without sessions,
    /// a session gone, no cursor yet), to a server that serves keyed calls
    /// exactly once: sending it again with its idempotency key gets its one
    /// answer, and the tool does not run twice (see
    /// [`ReissuedCall::send_with`]).
    Reissue(ReissuedCall),
    /// Its answer cannot be collected; `reason` says why. The server may
    /// or may not have run it. Its method and params are here for the
    /// application to decide whether to send it again; it stays listed,
    /// across restarts, until the application calls
    /// [`ClientHandle::dismiss`](super::handle::ClientHandle::dismiss).
    #[non_exhaustive]
    Lost {
        /// The request as journaled.
        request: InFlightRequest,
        /// Why its answer cannot be had.
        reason: LostReason,
    },
}

/// Why the answer to an interrupted request cannot be collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// No stream cursor or task id was journaled for it: the process
    /// stopped before the server's first event on its stream reached the
    /// store, so there is nothing to resume from.
    NoCursor,
    /// The session it was sent in is gone: the server no longer knows it
    /// (it answered 404, here or in an earlier process), or the application
    /// ended it. Whatever the server kept for it is gone with it.
    SessionGone,
    /// A call to a server without sessions (2026-07-28, or a legacy server
    /// that keeps none), which has no stream to resume, and the server does
    /// not promise to run a call sent again only once: it may or may not
    /// have run, and sending it again may run it twice.
    OutcomeUnknown,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::NoCursor => "nothing to resume it from",
            LostReason::SessionGone => "the session it was sent in is gone",
            LostReason::OutcomeUnknown => {
                "the server does not promise to run a call sent again only once; it may or may not have run"
            }
        })
    }
}

impl Recovery {
    pub(crate) fn new(context: Recoverer, scope: JournalScope, request: InFlightRequest) -> Self {
        if let Some(task_id) = request.task_id.clone()
            && !matches!(&scope, JournalScope::Session(s) if !Self::in_use(&context, s))
        {
            return Recovery::Task(RecoveredTask::new(context, scope, request, task_id));
        }
        // Only the session in use can be resumed in; a server without
        // sessions has no stream to resume.
        let resumable = match (&scope, &request.last_event_id) {
            (JournalScope::Session(session), Some(_)) => Self::in_use(&context, session),
            _ => false,
        };
        if resumable
            && let (JournalScope::Session(session), Some(cursor)) =
                (scope.clone(), request.last_event_id.clone())
        {
            return Recovery::Resumable(ResumedRequest::new(context, session, request, cursor));
        }
        // No stream to resume: a keyed call to a server that runs it once
        // however often it is sent can be sent again.
        if let Some(key) = keys::key_in(request.params.as_ref()).map(str::to_owned)
            && context.exactly_once()
        {
            return Recovery::Reissue(ReissuedCall::new(context, scope, request, key));
        }
        let reason = match &scope {
            JournalScope::Session(session) if !Self::in_use(&context, session) => {
                LostReason::SessionGone
            }
            JournalScope::Session(_) => LostReason::NoCursor,
            JournalScope::Sessionless => LostReason::OutcomeUnknown,
        };
        Recovery::Lost { request, reason }
    }

    /// Whether `session` is the session the client uses.
    fn in_use(context: &Recoverer, session: &SessionId) -> bool {
        context
            .session
            .state()
            .current()
            .is_some_and(|(current, _)| current == *session)
    }

    /// The request this is about.
    pub fn request(&self) -> &InFlightRequest {
        match self {
            Recovery::Resumable(r) => r.request(),
            Recovery::Task(t) => t.request(),
            Recovery::Reissue(r) => r.request(),
            Recovery::Lost { request, .. } => request,
        }
    }
}

/// The final answer to a resumed request, as rmcp's own client would have
/// read it: the result (match on its variant, e.g.
/// `ServerResult::CallToolResult`), or the JSON-RPC error.
pub type RecoveredAnswer = Result<ServerResult, ErrorData>;

/// Why collecting a resumed request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// The server no longer knows the session: the answer is gone.
    #[error("the server no longer knows the session; the answer cannot be collected")]
    SessionGone,
    /// No final answer within the recovery timeout.
    #[error("no final answer within {after:?}")]
    Timeout {
        /// How long it waited.
        after: Duration,
    },
    /// The server no longer knows the task the request was answered with
    /// (it expired, or the server lost it): its result cannot be had. The
    /// request is not sent again; it stays listed for the application to
    /// decide (send it anew, or dismiss it).
    #[error("the server no longer knows task {task_id}")]
    TaskLost {
        /// The task.
        task_id: String,
        /// What the server answered to `tasks/get`.
        error: ErrorData,
    },
    /// A task of a server without sessions is polled through the running
    /// rmcp client: use [`RecoveredTask::collect_with`].
    #[error("this task is collected through the running client (collect_with)")]
    NeedsClient,
    /// The server instance running the request stopped before it answered
    /// (a durable mcp-persist server ends such a stream with an error
    /// saying so). The request is lost: it is not sent again and stays
    /// listed, for the application to re-issue or dismiss.
    #[error("the server instance running the request stopped before it answered; re-issue it")]
    Orphaned {
        /// The instance that stopped, when the server said.
        instance: Option<String>,
        /// What the server answered.
        error: ErrorData,
    },
    /// The server no longer has the events after the stored cursor (410):
    /// the instance that sent them stopped before committing them (a
    /// `Pipelined` server's lost window), or retention dropped them. The
    /// request's answer cannot be had: it is not sent again and stays
    /// listed, for the application to re-issue or dismiss.
    #[error("the server lost the response stream after the stored cursor; re-issue the request")]
    EventsGone,
    /// The server refused `tasks/get` for another reason than an unknown
    /// task.
    #[error("the server refused tasks/get: {error}")]
    Refused {
        /// What the server answered.
        error: ErrorData,
    },
    /// The server's answer was not what the request asks for.
    #[error("unexpected answer from the server: {reason}")]
    UnexpectedAnswer {
        /// What was wrong with it.
        reason: String,
    },
    /// The resume request failed.
    #[error("resuming the response stream failed")]
    Transport {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
}
