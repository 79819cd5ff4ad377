//! Durable tasks (the 2026-07-28 tasks extension, SEP-2663) for rmcp
//! servers: where a handler would use rmcp's in-memory `TaskManager`, it
//! delegates to [`DurableTasks`], and every instance of the fleet answers
//! `tasks/get`, `tasks/update` and `tasks/cancel` from the shared store.
//!
//! * A task is committed before its `CreateTaskResult` is returned.
//! * Input responses and cancellation are written to the task record by
//!   whichever instance receives them, and the instance running the
//!   operation is woken through the task's inbox log.
//! * Each instance holds a liveness lease
//!   ([`InstanceLeases`](mcp_persist_core::InstanceLeases)). When the
//!   instance running a task stops, the task ends `failed` with a message
//!   saying so, or, for an operation registered as resumable, one other
//!   instance takes it over (compare-and-swap on the record's generation)
//!   and runs it again.
//! * A task is bound to the principal that created it; anyone else gets
//!   exactly the answer an unknown id gets.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_persist_core::{MemoryStore, Stores};
//! use mcp_persist_transport_http::server::DurableServer;
//! use rmcp::{model::CallToolResult, task_manager::TaskOptions};
//!
//! let server = DurableServer::builder(Stores::new(MemoryStore::new())).build()?;
//! let tasks = server
//!     .tasks()
//!     // Safe to run again: another instance restarts it if this one dies.
//!     .resumable("render", |_cx, args| {
//!         Box::pin(async move { Ok(CallToolResult::success(vec![])) })
//!     })
//!     .start()
//!     .await?;
//! // In `ServerHandler::call_tool`, when `client_accepts_tasks(&cx)`:
//! //     let created = tasks.spawn_resumable(&cx, TaskOptions::default(), "render", args).await?;
//! //     return Ok(CallToolResponse::Task(created));
//! // and `get_task`, `update_task`, `cancel_task` delegate to `tasks`.
//! # let _ = tasks; Ok(()) }
//! ```

mod context;
mod wire;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

pub use context::TaskContext;
use mcp_persist_core::{
    Liveness, ResumableOperation, Stored, Stores, TaskId, TaskOwner, TaskRecord, TaskStatus,
    TaskStore, TaskUpdate, Timestamp, telemetry::Telemetry,
};
use rmcp::{
    ErrorData, RoleServer,
    model::{CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, UpdateTaskParams},
    service::RequestContext,
    task_manager::{TaskExit, TaskFuture, TaskOptions},
};
use serde_json::Value;
use tokio::sync::{Notify, oneshot, watch};
use tracing::{Instrument, Span, debug, info, warn};
use wire::{store_error, unknown_task};

use super::{binding::PrincipalFn, instance::InstanceLife};

/// An operation registered as safe to run again: it gets the task's
/// context and the arguments it was started with.
pub type ResumableFn = Arc<dyn Fn(TaskContext, Value) -> TaskFuture + Send + Sync>;

/// Whether the client of this request declared the tasks extension (on the
/// request, or for a legacy session at `initialize`): only then may a
/// `tools/call` be answered with a task.
pub fn client_accepts_tasks(cx: &RequestContext<RoleServer>) -> bool {
    cx.client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
}

/// Builds a [`DurableTasks`] runtime; see [`DurableServer::tasks`](super::DurableServer::tasks).
#[derive(Clone)]
pub struct DurableTasksBuilder {
    stores: Stores,
    principal: Arc<PrincipalFn>,
    life: Arc<InstanceLife>,
    inbox_poll: Duration,
    resumables: HashMap<String, ResumableFn>,
}

impl std::fmt::Debug for DurableTasksBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTasksBuilder")
            .field("instance", &self.life)
            .field("inbox_poll", &self.inbox_poll)
            .field("resumables", &self.resumables.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl DurableTasksBuilder {
    pub(super) fn new(
        stores: Stores,
        principal: Arc<PrincipalFn>,
        life: Arc<InstanceLife>,
    ) -> Self {
        DurableTasksBuilder {
            stores,
            principal,
            life,
            inbox_poll: Duration::from_millis(500),
            resumables: HashMap::new(),
        }
    }

    /// The longest a running operation waits to see an input response or a
    /// cancellation written by another instance, on backends that cannot
    /// wake it at once (Redis and the memory store can). Default 500 ms.
    pub fn inbox_poll(mut self, every: Duration) -> Self {
        self.inbox_poll = every.max(Duration::from_millis(1));
        self
    }

    /// Registers operation `name` as safe to run again. Tasks started with
    /// [`DurableTasks::spawn_resumable`] under this name are restarted by
    /// another instance (each registers the same names) when the instance
    /// running them stops; the operation should be idempotent.
    pub fn resumable<F>(mut self, name: impl Into<String>, operation: F) -> Self
    where
        F: Fn(TaskContext, Value) -> TaskFuture + Send + Sync + 'static,
    {
        self.resumables.insert(name.into(), Arc::new(operation));
        self
    }

    /// Registers this instance's liveness lease (shared with the server's
    /// streams; see [`DurableServerBuilder::liveness_grace`](super::DurableServerBuilder::liveness_grace))
    /// if that has not happened yet, and starts watching other instances'
    /// tasks in the background.
    pub async fn start(self) -> mcp_persist_core::Result<DurableTasks> {
        let store = self.stores.tasks()?;
        self.life.ensure_started().await?;
        let (stop, stopped) = watch::channel(false);
        let grace = self.life.grace();
        let runtime = Arc::new(Runtime {
            telemetry: self.stores.telemetry().clone(),
            store,
            instance: self.life.id().to_owned(),
            life: self.life,
            principal: self.principal,
            grace,
            inbox_poll: self.inbox_poll,
            resumables: self.resumables,
            local: Mutex::default(),
            stop,
        });
        tokio::spawn(background(Arc::downgrade(&runtime), stopped));
        Ok(DurableTasks { runtime })
    }
}

/// The durable task runtime: create tasks, and answer the task methods from
/// the shared store. Cheap to clone.
#[derive(Clone)]
pub struct DurableTasks {
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for DurableTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTasks")
            .field("instance", &self.runtime.instance)
            .field("store", &self.runtime.store)
            .finish_non_exhaustive()
    }
}

/// A task running on this instance.
struct Local {
    generation: u64,
    waiters: HashMap<String, oneshot::Sender<Value>>,
    cancel: watch::Sender<bool>,
    poke: Arc<Notify>,
    abort: Option<tokio::task::AbortHandle>,
}

pub(super) struct Runtime {
    /// Counts statuses, takeovers and lost leases.
    telemetry: Telemetry,
    store: TaskStore,
    instance: String,
    life: Arc<InstanceLife>,
    principal: Arc<PrincipalFn>,
    grace: Duration,
    inbox_poll: Duration,
    resumables: HashMap<String, ResumableFn>,
    local: Mutex<HashMap<TaskId, Local>>,
    stop: watch::Sender<bool>,
}

impl DurableTasks {
    /// This instance's id in the liveness leases.
    pub fn instance_id(&self) -> &str {
        &self.runtime.instance
    }

    /// How many tasks run on this instance now.
    pub fn running_here(&self) -> usize {
        self.runtime.lock_local().len()
    }

    /// Starts `operation` as a task for the principal of `cx` and returns
    /// the `CreateTaskResult`, once the task is committed to the store.
    pub async fn spawn<F>(
        &self,
        cx: &RequestContext<RoleServer>,
        options: TaskOptions,
        operation: F,
    ) -> Result<CreateTaskResult, ErrorData>
    where
        F: FnOnce(TaskContext) -> TaskFuture,
    {
        self.create(cx, options, None, |ctx| operation(ctx)).await
    }

    /// Starts the operation registered as `name` (see
    /// [`DurableTasksBuilder::resumable`]) with `arguments`, as a task that
    /// another instance runs again if this one stops.
    pub async fn spawn_resumable(
        &self,
        cx: &RequestContext<RoleServer>,
        options: TaskOptions,
        name: &str,
        arguments: Value,
    ) -> Result<CreateTaskResult, ErrorData> {
        let Some(operation) = self.runtime.resumables.get(name).cloned() else {
            return Err(ErrorData::internal_error(
                format!("no resumable operation is registered as {name:?}"),
                None,
            ));
        };
        let args = arguments.clone();
        self.create(
            cx,
            options,
            Some(ResumableOperation::new(name, arguments)),
            move |ctx| operation(ctx, args),
        )
        .await
    }

    async fn create<F>(
        &self,
        cx: &RequestContext<RoleServer>,
        options: TaskOptions,
        resumable: Option<ResumableOperation>,
        operation: F,
    ) -> Result<CreateTaskResult, ErrorData>
    where
        F: FnOnce(TaskContext) -> TaskFuture,
    {
        let rt = &self.runtime;
        let id = TaskId::generate().map_err(|e| store_error("generating a task id", &e))?;
        let record = TaskRecord::new(
            id.clone(),
            rt.principal_of(cx),
            TaskOwner::new(rt.instance.clone(), 1, Timestamp::now().plus(rt.grace)),
        )
        .with_ttl_ms(options.ttl_ms)
        .with_poll_interval_ms(options.poll_interval_ms)
        .with_status_message(options.status_message.clone())
        .with_resumable(resumable)
        .with_client_capabilities(
            serde_json::to_value(cx.client_capabilities().unwrap_or_default()).ok(),
        )
        // The request's span (current here): every run of the operation
        // continues its trace.
        .with_traceparent(crate::telemetry::traceparent_of(&tracing::Span::current()));
        // Registered before the record exists, so no reader on this
        // instance ever sees the task without its operation.
        let ctx = rt.register_local(&id, 1);
        if let Err(e) = rt.store.create(&record).await {
            rt.lock_local().remove(&id);
            return Err(store_error("creating the task", &e));
        }
        info!(task = %id, instance = %rt.instance, "task created");
        rt.telemetry.task_status(TaskStatus::Working.name());
        let span = run_span("mcp_persist.task.run", &record, 1);
        rt.clone().run(id, 1, operation(ctx), span);
        Ok(CreateTaskResult::new(wire::task(&record)))
    }

    /// Answers `tasks/get`.
    pub async fn get_task(
        &self,
        params: GetTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let stored = self.runtime.visible(&params.task_id, cx).await?;
        let record = self.runtime.clone().check_owner(stored).await?;
        Ok(GetTaskResult::new(wire::detailed(&record)?))
    }

    /// Answers `tasks/update`: records the responses to outstanding input
    /// requests (unknown or already answered keys are ignored) and wakes the
    /// instance running the task.
    pub async fn update_task(
        &self,
        params: UpdateTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let rt = &self.runtime;
        let stored = rt.visible(&params.task_id, cx).await?;
        let id = stored.record.task_id.clone();
        for (key, value) in &params.input_responses {
            if !value.is_object() {
                return Err(ErrorData::invalid_params(
                    format!("inputResponses[{key:?}] must be an object (the client's result)"),
                    None,
                ));
            }
        }
        let outcome = rt
            .store
            .update(&id, |task| {
                let mut changed = false;
                for (key, value) in &params.input_responses {
                    if task.input_requests.remove(key).is_some() {
                        task.input_responses.insert(key.clone(), value.clone());
                        changed = true;
                    }
                }
                Ok(changed)
            })
            .await
            .map_err(|e| store_error("recording input responses", &e))?;
        if let TaskUpdate::Updated(_) = outcome {
            debug!(task = %id, keys = params.input_responses.len(), "input responses recorded");
            rt.wake(&id).await;
        }
        Ok(())
    }

    /// Answers `tasks/cancel`: records the request and wakes the instance
    /// running the task; the operation decides how it ends. Cancelling an
    /// ended task is acknowledged and changes nothing.
    pub async fn cancel_task(
        &self,
        params: CancelTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let rt = &self.runtime;
        let stored = rt.visible(&params.task_id, cx).await?;
        let id = stored.record.task_id.clone();
        let outcome = rt
            .store
            .update(&id, |task| {
                if task.cancel_requested {
                    return Ok(false);
                }
                task.cancel_requested = true;
                // Outstanding questions are moot; the task reports working
                // until the operation settles.
                task.input_requests.clear();
                Ok(true)
            })
            .await
            .map_err(|e| store_error("recording the cancellation", &e))?;
        if let TaskUpdate::Updated(_) = outcome {
            info!(task = %id, "task cancellation requested");
            rt.wake(&id).await;
        }
        Ok(())
    }

    /// Stops this instance's background work and releases its lease: other
    /// instances see its unfinished tasks (and the streams it was writing)
    /// as orphaned at once.
    pub async fn shutdown(&self) {
        let _ = self.runtime.stop.send(true);
        self.runtime.life.stop();
        for (_, local) in self.runtime.lock_local().drain() {
            if let Some(abort) = local.abort {
                abort.abort();
            }
        }
    }
}

impl Runtime {
    fn lock_local(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Local>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn principal_of(&self, cx: &RequestContext<RoleServer>) -> Option<String> {
        cx.extensions
            .get::<http::request::Parts>()
            .and_then(|parts| (self.principal)(parts))
    }

    /// The task `raw_id` if the principal of `cx` may see it; otherwise the
    /// unknown-task error, whatever the reason.
    async fn visible(
        &self,
        raw_id: &str,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Stored<TaskRecord>, ErrorData> {
        let id = TaskId::new(raw_id).map_err(|_| unknown_task(raw_id))?;
        let stored = self
            .store
            .load(&id)
            .await
            .map_err(|e| store_error("reading the task", &e))?
            .ok_or_else(|| unknown_task(raw_id))?;
        if stored.record.principal != self.principal_of(cx) {
            debug!(task = %id, "task requested by another principal; answering as unknown");
            return Err(unknown_task(raw_id));
        }
        Ok(stored)
    }

    fn register_local(self: &Arc<Self>, id: &TaskId, generation: u64) -> TaskContext {
        let (entry, ctx) = self.local_entry(id, generation);
        self.lock_local().insert(id.clone(), entry);
        ctx
    }

    /// The bookkeeping of generation `generation` of `id` running here, and
    /// the context its operation runs with.
    fn local_entry(self: &Arc<Self>, id: &TaskId, generation: u64) -> (Local, TaskContext) {
        let (cancel, cancel_rx) = watch::channel(false);
        let entry = Local {
            generation,
            waiters: HashMap::new(),
            cancel,
            poke: Arc::new(Notify::new()),
            abort: None,
        };
        let ctx = TaskContext {
            id: id.clone(),
            generation,
            runtime: self.clone(),
            cancel: cancel_rx,
        };
        (entry, ctx)
    }

    /// Registers generation `generation` of `id` as about to run here,
    /// unless this instance already holds that generation or a newer one
    /// (another reader is taking the task over): then `None`. An older
    /// generation still running here was fenced by a takeover since: it is
    /// stopped, as its watcher would stop it (the run counts its lost lease
    /// as it ends).
    fn claim_local(self: &Arc<Self>, id: &TaskId, generation: u64) -> Option<TaskContext> {
        let mut local = self.lock_local();
        if local.get(id).is_some_and(|l| l.generation >= generation) {
            return None;
        }
        let (entry, ctx) = self.local_entry(id, generation);
        if let Some(fenced) = local.insert(id.clone(), entry) {
            debug!(task = %id, generation = fenced.generation, "stopping a run here that a takeover fenced");
            if let Some(abort) = fenced.abort {
                abort.abort();
            }
        }
        Some(ctx)
    }

    /// Gives back a claim whose takeover did not happen.
    fn unclaim_local(&self, id: &TaskId, generation: u64) {
        let mut local = self.lock_local();
        if local.get(id).is_some_and(|l| l.generation == generation) {
            local.remove(id);
        }
    }

    pub(super) fn add_waiter(&self, id: &TaskId, key: &str, tx: oneshot::Sender<Value>) {
        if let Some(local) = self.lock_local().get_mut(id) {
            local.waiters.insert(key.to_owned(), tx);
        }
    }

    pub(super) fn remove_waiter(&self, id: &TaskId, key: &str) {
        if let Some(local) = self.lock_local().get_mut(id) {
            local.waiters.remove(key);
        }
    }

    pub(super) fn poke(&self, id: &TaskId) {
        if let Some(local) = self.lock_local().get(id) {
            local.poke.notify_one();
        }
    }

    /// Wakes the instance running `id`: at once if it is this one, through
    /// the task's inbox otherwise.
    async fn wake(&self, id: &TaskId) {
        self.poke(id);
        if let Err(e) = self.store.ring(id, "changed").await {
            warn!(task = %id, error = %e, "could not ring the task inbox; the owner notices at its next poll");
        }
    }

    /// Runs `future` as generation `generation` of task `id` on this
    /// instance, and settles the task with its outcome.
    fn run(self: Arc<Self>, id: TaskId, generation: u64, future: TaskFuture, span: Span) {
        let operation = tokio::spawn(future.instrument(span));
        let poke = {
            let mut local = self.lock_local();
            let Some(entry) = local.get_mut(&id) else {
                operation.abort();
                return;
            };
            entry.abort = Some(operation.abort_handle());
            entry.poke.clone()
        };
        let rt = self;
        tokio::spawn(async move {
            let watcher = tokio::spawn(rt.clone().watch(id.clone(), generation, poke));
            let outcome = match operation.await {
                Ok(outcome) => Some(outcome),
                Err(e) if e.is_panic() => {
                    warn!(task = %id, "task operation panicked");
                    Some(Err(TaskExit::Error(ErrorData::internal_error(
                        "the operation failed unexpectedly (it panicked)",
                        None,
                    ))))
                }
                // Aborted: fenced, expired or shut down; the record says why.
                Err(_) => None,
            };
            watcher.abort();
            // However the run found out (its watcher, a takeover on this
            // instance, or the operation's own write refused), a run whose
            // record moved to another generation lost its lease: counted
            // here, once per run.
            let fenced = match outcome {
                Some(outcome) => rt.settle(&id, generation, outcome).await,
                None => rt.moved_on(&id, generation).await,
            };
            if fenced {
                rt.telemetry.lease_lost();
            }
            let mut local = rt.lock_local();
            if local.get(&id).is_some_and(|l| l.generation == generation) {
                local.remove(&id);
            }
        });
    }

    /// Whether the record of `id` names a generation other than
    /// `generation` by now (a store error reads as no).
    async fn moved_on(&self, id: &TaskId, generation: u64) -> bool {
        match self.store.load(id).await {
            Ok(Some(stored)) => stored.record.owner.generation != generation,
            Ok(None) => false,
            Err(e) => {
                debug!(task = %id, error = %e, "reading a stopped run's task failed");
                false
            }
        }
    }

    /// Writes the operation's outcome, unless another generation owns the
    /// task by now: then `true` (the outcome is dropped). Store errors are
    /// retried: an outcome is not dropped while the store is briefly
    /// unreachable.
    async fn settle(
        &self,
        id: &TaskId,
        generation: u64,
        outcome: Result<rmcp::model::CallToolResult, TaskExit>,
    ) -> bool {
        let result = match &outcome {
            Ok(result) => Some(serde_json::to_value(result).unwrap_or_else(|e| {
                serde_json::json!({
                    "content": [{ "type": "text", "text": format!("the result did not serialize: {e}") }],
                    "isError": true
                })
            })),
            Err(_) => None,
        };
        let mut pause = Duration::from_millis(50);
        for attempt in 0..20 {
            let mut fenced = false;
            let written =
                self.store
                    .update(id, |task| {
                        fenced = task.owner.generation != generation;
                        if fenced {
                            return Ok(false);
                        }
                        match (&outcome, &result) {
                            (Ok(_), Some(result)) => task.complete(result.clone()),
                            (Err(TaskExit::Cancelled), _) => task.cancel(),
                            (Err(TaskExit::Error(e)), _) => task.fail(wire::error_object(e)),
                            (Ok(_), None) => task
                                .fail(serde_json::json!({"code": -32603, "message": "no result"})),
                        }
                        Ok(true)
                    })
                    .await;
            match written {
                Ok(TaskUpdate::Updated(s)) => {
                    info!(task = %id, status = ?s.record.status, generation, "task settled");
                    self.telemetry.task_status(s.record.status.name());
                    return false;
                }
                Ok(_) if fenced => {
                    info!(task = %id, generation, "task outcome dropped: another instance runs a newer generation");
                    return true;
                }
                Ok(_) => {
                    debug!(task = %id, "task had already ended or is gone; outcome not written");
                    return false;
                }
                Err(e) => {
                    warn!(task = %id, attempt, error = %e, "writing the task outcome failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
        warn!(task = %id, "gave up writing the task outcome; the task will be reported as orphaned");
        false
    }

    /// Follows the record of a task running here: delivers input responses,
    /// passes on cancellation, and stops the operation when the task ended
    /// otherwise (TTL) or another generation took it over.
    async fn watch(self: Arc<Self>, id: TaskId, generation: u64, poke: Arc<Notify>) {
        let mut position = self.store.inbox_position(&id).await.unwrap_or(0);
        loop {
            let stored = match self.store.load(&id).await {
                Ok(stored) => stored,
                Err(e) => {
                    warn!(task = %id, error = %e, "reading the task record failed");
                    tokio::time::sleep(self.inbox_poll).await;
                    continue;
                }
            };
            let stop = match &stored {
                None => Some("deleted"),
                Some(s) if s.record.owner.generation != generation => Some("taken over"),
                Some(s) if s.record.status.is_terminal() => Some("ended"),
                Some(_) => None,
            };
            if let Some(why) = stop {
                info!(task = %id, generation, why, "stopping the task's operation");
                // Only this generation's own entry: a newer one this
                // instance took over since is not this watcher's to stop
                // (that takeover stopped this run).
                let mine = {
                    let mut local = self.lock_local();
                    match local.get(&id) {
                        Some(l) if l.generation == generation => local.remove(&id),
                        _ => None,
                    }
                };
                if let Some(abort) = mine.and_then(|l| l.abort) {
                    abort.abort();
                }
                return;
            }
            if let Some(stored) = stored {
                let mut local = self.lock_local();
                if let Some(entry) = local.get_mut(&id) {
                    let answered: Vec<String> = entry
                        .waiters
                        .keys()
                        .filter(|k| stored.record.input_responses.contains_key(*k))
                        .cloned()
                        .collect();
                    for key in answered {
                        if let (Some(tx), Some(value)) = (
                            entry.waiters.remove(&key),
                            stored.record.input_responses.get(&key),
                        ) {
                            let _ = tx.send(value.clone());
                        }
                    }
                    if stored.record.cancel_requested && !*entry.cancel.borrow() {
                        let _ = entry.cancel.send(true);
                        entry.waiters.clear();
                    }
                }
            }
            tokio::select! {
                seen = self.store.wait_ring(&id, position, self.inbox_poll) => match seen {
                    Ok(seen) => position = seen,
                    Err(e) => {
                        warn!(task = %id, error = %e, "waiting on the task inbox failed");
                        tokio::time::sleep(self.inbox_poll).await;
                    }
                },
                _ = poke.notified() => {}
            }
        }
    }

    /// For an unfinished task: if the instance running it stopped, end it
    /// `failed`, or take a resumable one over. Returns the record to answer
    /// with.
    async fn check_owner(
        self: Arc<Self>,
        stored: Stored<TaskRecord>,
    ) -> Result<TaskRecord, ErrorData> {
        let record = stored.record;
        if record.status.is_terminal() {
            return Ok(record);
        }
        let running_here = self
            .lock_local()
            .get(&record.task_id)
            .is_some_and(|l| l.generation == record.owner.generation);
        if running_here {
            return Ok(record);
        }
        let dead = if record.owner.instance == self.instance {
            // Ours, but not running: this instance lost it (a takeover race
            // or a failed write). Nobody else will settle it.
            true
        } else {
            self.life
                .observe(&record.owner.instance)
                .await
                .map_err(|e| store_error("reading the instance lease", &e))?
                == Liveness::Dead
        };
        if !dead {
            return Ok(record);
        }
        self.orphaned(record).await
    }

    async fn orphaned(self: Arc<Self>, record: TaskRecord) -> Result<TaskRecord, ErrorData> {
        let id = record.task_id.clone();
        let old = record.owner.clone();
        let operation = record
            .resumable
            .as_ref()
            .and_then(|op| Some((self.resumables.get(&op.name)?.clone(), op.arguments.clone())));
        let me = self.instance.clone();
        let lease_expires_at = Timestamp::now().plus(self.grace);
        let takeover = operation.is_some();
        // A takeover claims the next generation here before the record names
        // this instance: a reader of the record on this instance between the
        // write and the run would otherwise find it "ours, but not running"
        // and take it over again, running the operation twice. A claim
        // another reader already holds means that reader is taking it over.
        let claimed = match (&operation, old.generation.checked_add(1)) {
            (Some(_), Some(next)) => match self.claim_local(&id, next) {
                Some(ctx) => Some(ctx),
                None => {
                    debug!(task = %id, generation = next, "another reader on this instance is taking the task over");
                    return Ok(record);
                }
            },
            _ => None,
        };
        let outcome = self
            .store
            .update(&id, |task| {
                if task.owner != old {
                    return Ok(false);
                }
                if takeover {
                    task.take_over(me.clone(), lease_expires_at)?;
                } else {
                    task.fail(serde_json::json!({
                        "code": -32603,
                        "message": format!(
                            "the server instance running this task stopped before it finished (instance {}); re-issue the request",
                            old.instance
                        ),
                    }));
                }
                Ok(true)
            })
            .await;
        let outcome = match outcome {
            Ok(TaskUpdate::Updated(stored)) => Ok(TaskUpdate::Updated(stored)),
            other => {
                // Not ours after all: the claim is given back.
                if let Some(ctx) = &claimed {
                    self.unclaim_local(&id, ctx.generation);
                }
                other
            }
        }
        .map_err(|e| store_error("ending an orphaned task", &e))?;
        match outcome {
            TaskUpdate::Updated(stored) => {
                if let (Some((operation, arguments)), Some(ctx)) = (operation, claimed) {
                    let generation = stored.record.owner.generation;
                    debug_assert_eq!(generation, ctx.generation, "the claimed generation");
                    info!(task = %id, dead = %old.instance, generation, "took over a resumable task whose instance stopped");
                    self.telemetry.task_takeover();
                    let span = run_span("mcp_persist.task.takeover", &stored.record, generation);
                    self.clone()
                        .run(id, generation, operation(ctx, arguments), span);
                } else {
                    info!(task = %id, dead = %old.instance, "task failed: the instance running it stopped");
                    self.telemetry.task_status(TaskStatus::Failed.name());
                }
                Ok(stored.record)
            }
            TaskUpdate::Unchanged(s) | TaskUpdate::Terminal(s) => Ok(s.record),
            _ => Err(unknown_task(id.as_str())),
        }
    }

    /// Checks every unfinished task of another instance (or lost by this
    /// one) once.
    async fn sweep(self: &Arc<Self>) -> mcp_persist_core::Result<()> {
        for id in self.store.list().await? {
            let Some(stored) = self.store.load(&id).await? else {
                continue;
            };
            if stored.record.status.is_terminal() {
                continue;
            }
            if let Err(e) = self.clone().check_owner(stored).await {
                debug!(task = %id, error = %e.message, "checking an unfinished task failed");
            }
        }
        Ok(())
    }
}

/// The span of one run of a task's operation (`name` is
/// `mcp_persist.task.run`, or `mcp_persist.task.takeover` for a run taken
/// over from a stopped instance): a child of the request that created the
/// task, whose `traceparent` the record keeps.
fn run_span(name: &'static str, record: &TaskRecord, generation: u64) -> Span {
    let span = tracing::info_span!(
        "mcp_persist.task",
        otel.name = name,
        mcp_persist.task.generation = generation,
    );
    crate::telemetry::continue_trace(&span, record.traceparent.as_deref());
    span
}

/// Sweeps for orphaned tasks every half grace period, until the runtime is
/// dropped or shut down (the instance lease is renewed by the server).
async fn background(runtime: Weak<Runtime>, mut stopped: watch::Receiver<bool>) {
    loop {
        let Some(every) = runtime.upgrade().map(|rt| rt.grace / 2) else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => return,
        }
        let Some(rt) = runtime.upgrade() else {
            return;
        };
        if let Err(e) = rt.sweep().await {
            warn!(error = %e, "sweeping for orphaned tasks failed");
        }
    }
}
