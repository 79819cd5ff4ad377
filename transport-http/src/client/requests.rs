//! Requests in a session: each goes out with a wire id unique within the
//! session across restarts (rmcp numbers from 0 in every process), is
//! journaled while in flight, and its answer, as JSON or on its SSE
//! stream, gets rmcp's id back and closes its journal entry.

use std::sync::Arc;

use mcp_persist_core::{RequestId, SessionId};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, NumberOrString, ServerJsonRpcMessage};

use super::{
    answer::StreamAnswer,
    health::Health,
    ids::WireIds,
    journal::{JournalScope, JournalTx, Unwritten},
    keys,
    progress::{self, ProgressTokens},
    tasks::{self, TaskWatch},
};

/// What requests in a session need: the wire ids, the progress tokens,
/// the journal and the task watch, and whether the store is still written.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    ids: Arc<WireIds>,
    progress: Arc<ProgressTokens>,
    tasks: TaskWatch,
    journal: JournalTx,
    health: Arc<Health>,
}

impl Requests {
    pub(crate) fn new(
        ids: Arc<WireIds>,
        progress: Arc<ProgressTokens>,
        tasks: TaskWatch,
        journal: JournalTx,
        health: Arc<Health>,
    ) -> Self {
        Requests {
            ids,
            progress,
            tasks,
            journal,
            health,
        }
    }

    /// Readies a request in `session` for the wire: renumbered, its wire
    /// id as progress token when rmcp asked for progress, and journaled
    /// (with the method and the params as the application wrote them)
    /// while the store is written. Returns the wire id; `None`, and the
    /// message untouched, for anything but a request.
    pub(crate) async fn prepare(
        &self,
        session: &SessionId,
        message: &mut ClientJsonRpcMessage,
    ) -> Option<i64> {
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        let local = request.id.clone();
        let wire = self.ids.next(session).await;
        request.id = NumberOrString::Number(wire);
        self.ids.map(local, wire);
        let rmcp_token = progress::take_rmcp_token(request);
        // A key, journaled with the call, lets it be sent again safely
        // once the session is gone (to a server that runs keyed calls once).
        keys::ensure_key(message);
        // Still the request matched above; `ensure_key` needed the message.
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        // Journaled as the application wrote it (with its key, without
        // rmcp's progress token), before the wire token goes in.
        if self.health.persisting() {
            self.journal.record(
                JournalScope::Session(session.clone()),
                Unwritten::new(RequestId::Number(wire), request.request.clone()),
            );
        }
        if let Some(rmcp_token) = rmcp_token {
            self.progress.send_as_wire(request, wire, rmcp_token);
        }
        // The request's span (current here) names it by its wire id.
        tracing::Span::current().record("jsonrpc.request.id", wire);
        Some(wire)
    }

    /// The request sent as `wire` in `session` failed to send: it is
    /// forgotten, journal entry and all.
    pub(crate) fn not_sent(&self, session: &SessionId, wire: i64) {
        self.release(wire);
        self.journal.complete(
            JournalScope::Session(session.clone()),
            RequestId::Number(wire),
        );
    }

    /// A JSON answer in `session`: an answer to `tasks/get` reporting a
    /// task ended closes that task's entry; an answer to a request in
    /// flight gets rmcp's id back and closes its entry (or, answered with
    /// a task, keeps the task id in it).
    pub(crate) fn answered(&self, session: &SessionId, answer: &mut ServerJsonRpcMessage) {
        if let Some(task) = tasks::ended_task(answer) {
            self.tasks
                .ended(JournalScope::Session(session.clone()), task);
        }
        let id = match answer {
            ServerJsonRpcMessage::Response(r) => Some(&mut r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_mut(),
            _ => None,
        };
        let Some(id) = id else { return };
        let NumberOrString::Number(wire) = *id else {
            return;
        };
        if let Some(local) = self.release(wire) {
            *id = local;
            self.close(session, wire, tasks::created_task(answer));
        }
    }

    /// An answer read from an SSE event's `data`: if it answers a request
    /// in flight, the data with rmcp's id in place of the wire id, and, in
    /// a session, the request's entry closed as [`answered`](Self::answered)
    /// does. `None` when it answers no request in flight (the event is
    /// left as it is).
    pub(crate) fn answered_on_stream(
        &self,
        session: Option<&SessionId>,
        data: &str,
    ) -> Option<String> {
        let answer = StreamAnswer::read(data)?;
        let wire = answer.wire_id()?;
        let local = self.release(wire)?;
        if let Some(session) = session {
            let task = answer.task();
            if let Some(ended) = task.ended() {
                self.tasks
                    .ended(JournalScope::Session(session.clone()), ended);
            }
            self.close(session, wire, task.created());
        }
        Some(answer.with_id(&local))
    }

    /// The SSE event id `event` arrived on the response stream of the
    /// request sent as `wire` in `session`: a restarted process resumes
    /// from it.
    pub(crate) fn cursor(&self, session: &SessionId, wire: i64, event: &str) {
        self.journal.cursor(
            JournalScope::Session(session.clone()),
            RequestId::Number(wire),
            event,
        );
    }

    /// A cancellation names the request it cancels by rmcp's id: it goes
    /// out with the wire id that request went out as.
    pub(crate) fn renumber_cancellation(&self, message: &mut ClientJsonRpcMessage) {
        if let ClientJsonRpcMessage::Notification(n) = message
            && let ClientNotification::CancelledNotification(c) = &mut n.notification
            && let Some(local) = &c.params.request_id
            && let Some(wire) = self.ids.wire_of(local)
        {
            c.params.request_id = Some(NumberOrString::Number(wire));
        }
    }

    /// The request sent as `wire` is no longer in flight: rmcp's id for
    /// it, if it was.
    fn release(&self, wire: i64) -> Option<NumberOrString> {
        self.progress.forget(wire);
        self.ids.take_local(wire)
    }

    /// Closes the journal entry of the request sent as `wire`, or keeps
    /// the task it was answered with.
    fn close(&self, session: &SessionId, wire: i64, task: Option<String>) {
        let scope = JournalScope::Session(session.clone());
        match task {
            Some(task) => self.tasks.created(scope, wire, task),
            None => self.journal.complete(scope, RequestId::Number(wire)),
        }
    }
}
