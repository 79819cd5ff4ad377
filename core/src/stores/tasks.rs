//! Durable tasks (the 2026-07-28 tasks extension, SEP-2663): one record per
//! task with everything `tasks/get` answers, who may see it and who runs it,
//! plus a per-task inbox log that wakes the instance running the task when
//! another instance changes the record.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::debug;

use super::{Stored, read, write};
use crate::{
    Error, Key, KvStore, LogStore, PutMode, Result, declare,
    records::Record,
    retry::Backoff,
    types::{Timestamp, check_visible_ascii, hex, random_token},
};

/// The longest task id accepted, in bytes.
pub const MAX_TASK_ID_BYTES: usize = 128;

/// A task id: generated ids carry 128 random bits; ids read from requests are
/// 1 to [`MAX_TASK_ID_BYTES`] visible ASCII characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TaskId(String);

impl TaskId {
    /// A fresh id with 128 bits from the operating system's random source.
    pub fn generate() -> Result<Self> {
        Ok(TaskId(hex(&random_token()?)))
    }

    /// Validates an id received from a client.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        check_visible_ascii("task id", &id, MAX_TASK_ID_BYTES)?;
        Ok(TaskId(id))
    }

    /// The id as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        TaskId::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({})", self.0)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a task is in its life (the extension's `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskStatus {
    /// Running.
    Working,
    /// Waiting for the client to answer `input_requests`.
    InputRequired,
    /// Finished with a result (a tool error is a result too).
    Completed,
    /// Ended with a protocol-level error.
    Failed,
    /// Ended because the client cancelled it.
    Cancelled,
}

impl TaskStatus {
    /// `completed`, `failed` or `cancelled`: the record never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The status as the protocol spells it (`working`, `input_required`,
    /// `completed`, `failed`, `cancelled`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The instance running a task, and the generation it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskOwner {
    /// The owner's instance id (see [`InstanceLeases`](super::InstanceLeases)).
    pub instance: String,
    /// Incremented by every takeover; a write by an older generation is fenced.
    pub generation: u64,
    /// When the owner last renewed its instance lease before taking the
    /// task, plus the grace period (informational; liveness is decided by
    /// the instance lease).
    pub lease_expires_at: Timestamp,
}

impl TaskOwner {
    /// Owner `instance` running generation `generation`.
    pub fn new(instance: impl Into<String>, generation: u64, lease_expires_at: Timestamp) -> Self {
        TaskOwner {
            instance: instance.into(),
            generation,
            lease_expires_at,
        }
    }
}

/// An operation the application registered as safe to run again: its name
/// and arguments, so another instance can restart it after the owner died.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResumableOperation {
    /// The name it was registered under.
    pub name: String,
    /// The arguments it was started with.
    pub arguments: serde_json::Value,
}

impl ResumableOperation {
    /// Operation `name` with `arguments`.
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        ResumableOperation {
            name: name.into(),
            arguments,
        }
    }
}

/// One durable task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskRecord {
    /// The id.
    pub task_id: TaskId,
    /// The principal that created it (`None`: anonymous); only the same
    /// principal may see or change it.
    pub principal: Option<String>,
    /// Current status.
    pub status: TaskStatus,
    /// A message for the user about the current state.
    pub status_message: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub last_updated_at: Timestamp,
    /// Time to live from creation in milliseconds (`None`: unlimited).
    pub ttl_ms: Option<u64>,
    /// Suggested polling interval in milliseconds.
    pub poll_interval_ms: Option<u64>,
    /// Outstanding input requests (key -> the request, as JSON).
    pub input_requests: BTreeMap<String, serde_json::Value>,
    /// Input responses received (key -> the client's result, as JSON). Kept
    /// so that an operation run again after a takeover gets the same answers.
    pub input_responses: BTreeMap<String, serde_json::Value>,
    /// Every input key ever used (keys are unique over a task's life).
    pub used_input_keys: BTreeSet<String>,
    /// The inline result once `completed` (a JSON object).
    pub result: Option<serde_json::Value>,
    /// The inline JSON-RPC error once `failed`.
    pub error: Option<serde_json::Value>,
    /// The client asked to cancel.
    pub cancel_requested: bool,
    /// Who runs it.
    pub owner: TaskOwner,
    /// Set when the application marked the operation safe to run again.
    pub resumable: Option<ResumableOperation>,
    /// How many times the operation was started (1 + takeovers).
    pub runs: u32,
    /// The capabilities the client declared when it created the task (a
    /// `ClientCapabilities` object), so that every instance running the
    /// operation knows what it may ask the client for. `None` on records
    /// written before this field existed: nothing is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_capabilities: Option<serde_json::Value>,
    /// The W3C `traceparent` of the request that created the task, so that
    /// every run of its operation (a takeover on another instance included)
    /// continues that trace. `None` without tracing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl TaskRecord {
    /// A `working` task created now by `principal`, run by `owner`.
    pub fn new(task_id: TaskId, principal: Option<String>, owner: TaskOwner) -> Self {
        let now = Timestamp::now();
        TaskRecord {
            task_id,
            principal,
            status: TaskStatus::Working,
            status_message: None,
            created_at: now,
            last_updated_at: now,
            ttl_ms: None,
            poll_interval_ms: None,
            input_requests: BTreeMap::new(),
            input_responses: BTreeMap::new(),
            used_input_keys: BTreeSet::new(),
            result: None,
            error: None,
            cancel_requested: false,
            owner,
            resumable: None,
            runs: 1,
            client_capabilities: None,
            traceparent: None,
        }
    }

    /// The same task, recording the capabilities its client declared.
    pub fn with_client_capabilities(mut self, capabilities: Option<serde_json::Value>) -> Self {
        self.client_capabilities = capabilities;
        self
    }

    /// The same task, recording the W3C `traceparent` of the request that
    /// created it.
    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        self.traceparent = traceparent;
        self
    }

    /// The same task with a TTL (`None`: unlimited).
    pub fn with_ttl_ms(mut self, ttl_ms: Option<u64>) -> Self {
        self.ttl_ms = ttl_ms;
        self
    }

    /// The same task with a suggested polling interval.
    pub fn with_poll_interval_ms(mut self, poll_interval_ms: Option<u64>) -> Self {
        self.poll_interval_ms = poll_interval_ms;
        self
    }

    /// The same task with a status message.
    pub fn with_status_message(mut self, message: impl Into<Option<String>>) -> Self {
        self.status_message = message.into();
        self
    }

    /// The same task, marked safe to run again as `operation`.
    pub fn with_resumable(mut self, operation: impl Into<Option<ResumableOperation>>) -> Self {
        self.resumable = operation.into();
        self
    }

    /// When the TTL runs out (`None`: never).
    pub fn expires_at(&self) -> Option<Timestamp> {
        self.ttl_ms
            .map(|ms| self.created_at.plus(Duration::from_millis(ms)))
    }

    /// When the record is deleted: one more TTL after it runs out, so that
    /// pollers see the final state (`None`: never).
    pub fn retained_until(&self) -> Option<Timestamp> {
        self.ttl_ms.map(|ms| {
            self.created_at
                .plus(Duration::from_millis(ms.saturating_mul(2)))
        })
    }

    /// Ends the task `completed` with `result` (a JSON object).
    pub fn complete(&mut self, result: serde_json::Value) {
        self.settle(TaskStatus::Completed);
        self.result = Some(result);
    }

    /// Ends the task `failed` with a JSON-RPC `error` object.
    pub fn fail(&mut self, error: serde_json::Value) {
        self.settle(TaskStatus::Failed);
        self.error = Some(error);
    }

    /// Ends the task `cancelled`.
    pub fn cancel(&mut self) {
        self.settle(TaskStatus::Cancelled);
    }

    fn settle(&mut self, status: TaskStatus) {
        self.status = status;
        self.input_requests.clear();
        self.result = None;
        self.error = None;
        self.last_updated_at = Timestamp::now();
    }

    /// Hands the task to `instance` as the next generation (a takeover after
    /// its owner stopped) and counts the run; returns the new generation. A
    /// stored generation that cannot be incremented is damage:
    /// [`Error::Corrupt`] naming the task's key, and the record is left as
    /// it was.
    pub fn take_over(
        &mut self,
        instance: impl Into<String>,
        lease_expires_at: Timestamp,
    ) -> Result<u64> {
        let generation = self.owner.generation.checked_add(1).ok_or_else(|| {
            Error::corrupt(
                TaskStore::key(&self.task_id)
                    .map_or_else(|_| self.task_id.as_str().to_owned(), String::from),
                format!(
                    "the owner generation {} has no successor",
                    self.owner.generation
                ),
            )
        })?;
        self.owner = TaskOwner::new(instance, generation, lease_expires_at);
        self.runs = self.runs.saturating_add(1);
        Ok(generation)
    }

    /// `working` or `input_required`, from the outstanding requests
    /// (terminal statuses are left alone).
    pub fn refresh_status(&mut self) {
        if !self.status.is_terminal() {
            self.status = if self.input_requests.is_empty() {
                TaskStatus::Working
            } else {
                TaskStatus::InputRequired
            };
        }
    }
}

impl Record for TaskRecord {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::TASK;
}

/// What [`TaskStore::update`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TaskUpdate {
    /// The change was committed; the record as written.
    Updated(Stored<TaskRecord>),
    /// The closure asked for no write; the record as read.
    Unchanged(Stored<TaskRecord>),
    /// The task had already ended; it is never changed again.
    Terminal(Stored<TaskRecord>),
    /// No such task (never created, expired or deleted).
    Missing,
}

/// One inbox entry: something changed in the record that the running
/// operation must look at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct InboxRecord {
    reason: String,
}

impl Record for InboxRecord {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::TASK_INBOX;
}

/// Durable tasks over a key-value store (records) and a log store (inboxes).
///
/// | key | what |
/// |---|---|
/// | `server/task/<task id>` (KV) | [`TaskRecord`] |
/// | `server/task-inbox/<task id>` (log) | wake-ups for the running operation |
///
/// Every change is a compare-and-swap on the record; a record that reached
/// a terminal status is never written again. With a TTL, a task still
/// running when its TTL runs out is settled `failed` at the next read, and
/// the record is deleted one more TTL later.
#[derive(Clone)]
pub struct TaskStore {
    kv: Arc<dyn KvStore>,
    log: Arc<dyn LogStore>,
}

impl fmt::Debug for TaskStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskStore")
            .field("kv", &self.kv.backend_name())
            .field("log", &self.log.backend_name())
            .finish()
    }
}

/// How many times a change is retried against concurrent writers.
const CAS_ATTEMPTS: usize = 32;

impl TaskStore {
    /// Tasks in `kv`, inboxes in `log`.
    pub fn new(kv: Arc<dyn KvStore>, log: Arc<dyn LogStore>) -> Self {
        TaskStore { kv, log }
    }

    fn key(id: &TaskId) -> Result<Key> {
        declare::TASK.try_key(&[id.as_str()])
    }

    fn inbox(id: &TaskId) -> Result<Key> {
        declare::TASK_INBOX.try_key(&[id.as_str()])
    }

    fn ttl_of(record: &TaskRecord) -> Option<Duration> {
        record
            .retained_until()
            .map(|until| until.since(Timestamp::now()).max(Duration::from_millis(1)))
    }

    /// Stores a new task. When this returns, a [`load`](TaskStore::load) on
    /// any instance finds it; [`Error::AlreadyExists`] if the id is taken.
    pub async fn create(&self, record: &TaskRecord) -> Result<Stored<TaskRecord>> {
        let version = write(
            &*self.kv,
            &Self::key(&record.task_id)?,
            record,
            PutMode::Create,
            Self::ttl_of(record),
        )
        .await?;
        debug!(task = %record.task_id, "task created");
        Ok(Stored {
            record: record.clone(),
            version,
        })
    }

    /// The task `id`, or `None` when unknown. A task whose TTL ran out while
    /// it was not finished is settled `failed` first.
    pub async fn load(&self, id: &TaskId) -> Result<Option<Stored<TaskRecord>>> {
        let Some(stored) = read::<TaskRecord>(&*self.kv, &Self::key(id)?).await? else {
            return Ok(None);
        };
        let expired = !stored.record.status.is_terminal()
            && stored
                .record
                .expires_at()
                .is_some_and(|at| at <= Timestamp::now());
        if !expired {
            return Ok(Some(stored));
        }
        match self
            .update(id, |task| {
                if task.expires_at().is_some_and(|at| at <= Timestamp::now()) {
                    let ttl = task.ttl_ms.unwrap_or_default();
                    task.fail(serde_json::json!({
                        "code": -32603,
                        "message": format!("task expired: its TTL of {ttl} ms ran out before it finished"),
                    }));
                    return Ok(true);
                }
                Ok(false)
            })
            .await?
        {
            TaskUpdate::Updated(s) | TaskUpdate::Unchanged(s) | TaskUpdate::Terminal(s) => {
                debug!(task = %id, status = ?s.record.status, "expired task settled");
                self.ring(id, "expired").await?;
                Ok(Some(s))
            }
            TaskUpdate::Missing => Ok(None),
        }
    }

    /// Changes task `id` by compare-and-swap: `change` gets the current
    /// record and returns whether to write it. It is called again on a
    /// conflict with the newer record, and never for a terminal record.
    pub async fn update<F>(&self, id: &TaskId, mut change: F) -> Result<TaskUpdate>
    where
        F: FnMut(&mut TaskRecord) -> Result<bool> + Send,
    {
        let key = Self::key(id)?;
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = read::<TaskRecord>(&*self.kv, &key).await? else {
                return Ok(TaskUpdate::Missing);
            };
            if stored.record.status.is_terminal() {
                return Ok(TaskUpdate::Terminal(stored));
            }
            let mut record = stored.record.clone();
            if !change(&mut record)? {
                return Ok(TaskUpdate::Unchanged(stored));
            }
            record.refresh_status();
            record.last_updated_at = Timestamp::now();
            match write(
                &*self.kv,
                &key,
                &record,
                PutMode::Update(stored.version),
                Self::ttl_of(&record),
            )
            .await
            {
                Ok(version) => return Ok(TaskUpdate::Updated(Stored { record, version })),
                Err(Error::Conflict { .. }) => {
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Conflict {
            key: key.to_string(),
        })
    }

    /// Wakes whoever waits on task `id`'s inbox (the instance running it),
    /// after a change it must look at. Returns the inbox position.
    pub async fn ring(&self, id: &TaskId, reason: &str) -> Result<u64> {
        let ttl = match read::<TaskRecord>(&*self.kv, &Self::key(id)?).await? {
            Some(stored) => Self::ttl_of(&stored.record),
            None => Some(Duration::from_secs(60)),
        };
        let bytes = crate::records::encode(&InboxRecord {
            reason: reason.to_owned(),
        })?;
        let seqs = self.log.append(&Self::inbox(id)?, vec![bytes], ttl).await?;
        Ok(seqs.last().copied().unwrap_or_default())
    }

    /// Waits up to `timeout` for a ring on task `id` after inbox position
    /// `after`; returns the newest position seen (`after` if none came).
    pub async fn wait_ring(&self, id: &TaskId, after: u64, timeout: Duration) -> Result<u64> {
        let records = self
            .log
            .wait_after(&Self::inbox(id)?, after, 64, timeout)
            .await?;
        Ok(records.last().map_or(after, |r| r.seq))
    }

    /// The current inbox position of task `id` (to wait after).
    pub async fn inbox_position(&self, id: &TaskId) -> Result<u64> {
        let mut after = 0;
        loop {
            let records = self.log.read_after(&Self::inbox(id)?, after, 256).await?;
            match records.last() {
                Some(last) => after = last.seq,
                None => return Ok(after),
            }
        }
    }

    /// Deletes task `id` and its inbox.
    pub async fn delete(&self, id: &TaskId) -> Result<()> {
        self.kv.delete(&Self::key(id)?, None).await?;
        self.log.delete_log(&Self::inbox(id)?).await?;
        Ok(())
    }

    /// The ids of every stored task.
    pub async fn list(&self) -> Result<Vec<TaskId>> {
        let keys = self.kv.list(declare::TASK.prefix).await?;
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            match read::<TaskRecord>(&*self.kv, &key).await {
                Ok(Some(stored)) => ids.push(stored.record.task_id),
                Ok(None) => {}
                // One damaged record must not hide every other task.
                Err(e @ (Error::Corrupt { .. } | Error::NewerSchema { .. })) => {
                    tracing::warn!(%key, error = %e, "skipping a task record that cannot be read");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_takeover_past_the_last_generation_is_corrupt_and_changes_nothing() {
        let id = TaskId::new("at/the-limit").expect("id");
        let owner = TaskOwner::new("gone", u64::MAX, Timestamp::now());
        let mut record = TaskRecord::new(id, None, owner);
        let before = record.clone();
        match record.take_over("me", Timestamp::now()) {
            Err(Error::Corrupt { key, .. }) => {
                assert_eq!(key, crate::declare::TASK.key(&["at/the-limit"]).to_string())
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(record, before);

        let mut record = TaskRecord::new(
            TaskId::new("ordinary").expect("id"),
            None,
            TaskOwner::new("gone", 7, Timestamp::now()),
        );
        assert_eq!(record.take_over("me", Timestamp::now()).expect("next"), 8);
        assert_eq!((record.owner.instance.as_str(), record.runs), ("me", 2));
    }
}
