//! [`CallStore`]: tool calls a client keyed for exactly-once execution.
//!
//! A client that must not have a tool run twice (a payment, an email, a
//! deployment) gives the call an idempotency key and sends it again, with
//! the same key, when it does not know whether the first attempt ran: after
//! a crash, a broken stream, a lost session. The server records the call
//! under (principal, key) *before* running the tool; every attempt after the
//! first finds the record:
//!
//! * [`CallStatus::Done`]: the stored answer, without running the tool;
//! * [`CallStatus::Running`] on an instance that is alive: wait for it;
//! * [`CallStatus::Running`] on an instance that stopped: the server runs it
//!   again only if the application declared the tool safe to re-run
//!   ([`take_over`](CallStore::take_over)); otherwise the call is
//!   [`CallStatus::Unknown`] for good, and every attempt is told so.
//!
//! Keys belong to a principal: another principal's attempt under the same
//! key is a call of its own, and never reads or changes this one.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::{sync::Arc, time::Duration};
//! use mcp_persist_core::{MemoryStore, stores::{Begin, CallKey, CallStore, CallAnswer}};
//!
//! let calls = CallStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(3600));
//! let key = CallKey::new(Some("alice"), "order-1041-charge")?;
//! let digest = CallStore::digest("charge", &serde_json::json!({"cents": 500}));
//! let Begin::Started(running) = calls.begin(&key, "charge", &digest, "instance-a").await? else {
//!     unreachable!("a new key starts");
//! };
//! // ... the tool runs once, then its answer is kept:
//! calls.finish(&key, &running, CallAnswer::Result(serde_json::json!({"content": []}))).await?;
//! // A second attempt with the same key finds the answer.
//! let Begin::Existing(done) = calls.begin(&key, "charge", &digest, "instance-b").await? else {
//!     unreachable!("the key is taken");
//! };
//! assert!(matches!(done.record.answer()?, Some(CallAnswer::Result(_))));
//! # Ok::<_, mcp_persist_core::Error>(()) }).unwrap();
//! ```

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tracing::debug;

use super::{Stored, read, write};
use crate::{
    Error, Key, KvStore, PutMode, PutOptions, Result, declare,
    records::{Record, encode},
    secret::Secret,
    types::{Timestamp, hex},
};

/// The longest idempotency key accepted, in bytes.
pub const MAX_CALL_KEY_BYTES: usize = 128;

/// Where a keyed call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallStatus {
    /// An instance is running it ([`CallRecord::owner`]).
    Running,
    /// It answered; the answer is kept (unless it was over the size limit).
    Done,
    /// The instance running it stopped before it answered, and the tool may
    /// not run twice: nobody knows whether it ran.
    Unknown,
}

/// The answer to a keyed call, as kept.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CallAnswer {
    /// The JSON-RPC `result` of a `tools/call` that completed.
    Result(serde_json::Value),
    /// The `CreateTaskResult` of a call answered with a task.
    Task(serde_json::Value),
    /// The JSON-RPC `error` it was answered with.
    Error(serde_json::Value),
}

/// A call's answer as it is kept: the JSON text `{"result": …}`,
/// `{"task": …}` or `{"error": …}`, built straight from the answer (no
/// intermediate [`serde_json::Value`]) or from a [`CallAnswer`].
#[derive(Clone, PartialEq, Eq)]
pub struct KeptAnswer {
    text: String,
}

impl std::fmt::Debug for KeptAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptAnswer")
            .field("bytes", &self.text.len())
            .finish_non_exhaustive()
    }
}

impl KeptAnswer {
    /// The `result` of a `tools/call` that completed.
    pub fn result<T: Serialize + ?Sized>(result: &T) -> Result<KeptAnswer> {
        KeptAnswer::of("result", result)
    }

    /// The `CreateTaskResult` of a call answered with a task.
    pub fn task<T: Serialize + ?Sized>(task: &T) -> Result<KeptAnswer> {
        KeptAnswer::of("task", task)
    }

    /// The JSON-RPC `error` a call was answered with.
    pub fn error<T: Serialize + ?Sized>(error: &T) -> Result<KeptAnswer> {
        KeptAnswer::of("error", error)
    }

    fn of<T: Serialize + ?Sized>(kind: &str, value: &T) -> Result<KeptAnswer> {
        let mut text = Vec::with_capacity(256);
        text.extend_from_slice(b"{\"");
        text.extend_from_slice(kind.as_bytes());
        text.extend_from_slice(b"\":");
        serde_json::to_writer(&mut text, value).map_err(|e| {
            Error::invalid("call answer", format!("the {kind} does not serialize: {e}"))
        })?;
        text.push(b'}');
        Ok(KeptAnswer {
            // serde_json writes UTF-8 only.
            text: String::from_utf8(text).expect("serde_json writes UTF-8"),
        })
    }

    /// The size of its JSON text, in bytes.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    /// Whether its text is empty (never, for an answer built here).
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

impl From<CallAnswer> for KeptAnswer {
    fn from(answer: CallAnswer) -> KeptAnswer {
        let (kind, value) = match answer {
            CallAnswer::Result(v) => ("result", v),
            CallAnswer::Task(v) => ("task", v),
            CallAnswer::Error(v) => ("error", v),
        };
        KeptAnswer {
            text: serde_json::json!({ kind: value }).to_string(),
        }
    }
}

/// One keyed tool call.
#[derive(Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CallRecord {
    /// The principal the key belongs to (`None`: anonymous requests).
    pub principal: Option<String>,
    /// The tool called.
    pub tool: String,
    /// SHA-256 of the tool's name and arguments ([`CallStore::digest`]): the
    /// same key sent with another call is refused.
    pub digest: String,
    /// Where it stands.
    pub status: CallStatus,
    /// The instance running it, or that ran it last.
    pub owner: String,
    /// How many times the tool was started for it (more than one only for
    /// a tool declared safe to re-run whose instance stopped).
    pub runs: u32,
    /// The answer as JSON (`{"result": …}`, `{"task": …}` or `{"error": …}`),
    /// kept as a secret: a tool's answer may carry anything.
    answer: Option<Secret>,
    /// The size of an answer that was over the limit and not kept.
    pub answer_not_kept_bytes: Option<u64>,
    /// When the first attempt arrived.
    pub created_at: Timestamp,
    /// When the record last changed.
    pub updated_at: Timestamp,
}

impl std::fmt::Debug for CallRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallRecord")
            .field("tool", &self.tool)
            .field("status", &self.status)
            .field("owner", &self.owner)
            .field("runs", &self.runs)
            .field("answer", &self.answer.as_ref().map(|_| "<kept>"))
            .field("answer_not_kept_bytes", &self.answer_not_kept_bytes)
            .finish_non_exhaustive()
    }
}

impl Record for CallRecord {
    const DECLARATION: &'static declare::Declaration = &declare::CALL_RECORD;
}

impl CallRecord {
    /// The kept answer: `None` while it runs, when its status is unknown,
    /// or when the answer was over the size limit
    /// ([`answer_not_kept_bytes`](Self::answer_not_kept_bytes)).
    pub fn answer(&self) -> Result<Option<CallAnswer>> {
        let Some(answer) = &self.answer else {
            return Ok(None);
        };
        let corrupt = |reason: &str| Error::Corrupt {
            key: format!("call record of {}", self.tool),
            reason: reason.to_owned(),
            source: None,
        };
        let value: serde_json::Value = serde_json::from_str(answer.expose_secret())
            .map_err(|_| corrupt("its answer is not JSON"))?;
        let (kind, inner) = value
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| corrupt("its answer is not an object of one field"))?;
        Ok(Some(match kind.as_str() {
            "result" => CallAnswer::Result(inner.clone()),
            "task" => CallAnswer::Task(inner.clone()),
            "error" => CallAnswer::Error(inner.clone()),
            _ => return Err(corrupt("its answer is of no known kind")),
        }))
    }
}

/// A call's idempotency key, bound to its principal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallKey {
    principal: Option<String>,
    key: String,
}

impl CallKey {
    /// `key` of `principal`: 1 to [`MAX_CALL_KEY_BYTES`] characters of
    /// `A-Z a-z 0-9 . _ : -` (a UUID fits); anything else is
    /// [`Error::InvalidInput`].
    pub fn new(principal: Option<&str>, key: &str) -> Result<CallKey> {
        if key.is_empty()
            || key.len() > MAX_CALL_KEY_BYTES
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
        {
            return Err(Error::invalid(
                "idempotency key",
                format!(
                    "1 to {MAX_CALL_KEY_BYTES} characters of A-Z a-z 0-9 . _ : - (a UUID fits)"
                ),
            ));
        }
        Ok(CallKey {
            principal: principal.map(str::to_owned),
            key: key.to_owned(),
        })
    }

    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The principal it belongs to.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// Where it is kept: under a hash of the principal, so that key
    /// listings name no principal and every principal has a key space of
    /// its own.
    fn store_key(&self) -> Result<Key> {
        let owner = match &self.principal {
            Some(p) => hex(&Sha256::digest(format!("p:{p}").as_bytes())[..16]),
            None => "anonymous".to_owned(),
        };
        declare::CALL_RECORD.try_key(&[&owner, &self.key])
    }
}

/// What [`CallStore::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// The key was free: the call is recorded as running on this instance,
    /// and the tool is to run now.
    Started(Stored<CallRecord>),
    /// The key was taken: the record as found (running, done or unknown).
    Existing(Stored<CallRecord>),
}

/// Keyed tool calls, on any backend. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct CallStore {
    kv: Arc<dyn KvStore>,
    window: Duration,
}

impl CallStore {
    /// Calls kept in `kv` for `window` after their last change.
    pub fn new(kv: Arc<dyn KvStore>, window: Duration) -> Self {
        CallStore { kv, window }
    }

    /// How long a call is kept after its last change.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The digest of a call to `tool` with `arguments`, independent of the
    /// order of object fields.
    pub fn digest(tool: &str, arguments: &serde_json::Value) -> String {
        fn canonical(value: &serde_json::Value, out: &mut String) {
            match value {
                serde_json::Value::Object(map) => {
                    let mut fields: Vec<_> = map.iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(b.0));
                    out.push('{');
                    for (i, (k, v)) in fields.into_iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::Value::String(k.clone()).to_string());
                        out.push(':');
                        canonical(v, out);
                    }
                    out.push('}');
                }
                serde_json::Value::Array(items) => {
                    out.push('[');
                    for (i, v) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        canonical(v, out);
                    }
                    out.push(']');
                }
                other => out.push_str(&other.to_string()),
            }
        }
        let mut text = serde_json::Value::String(tool.to_owned()).to_string();
        text.push(' ');
        canonical(arguments, &mut text);
        hex(&Sha256::digest(text.as_bytes()))
    }

    /// Records the call as running on `owner` if its key is free
    /// ([`Begin::Started`]), or returns what the key holds
    /// ([`Begin::Existing`]). The record is committed before this returns,
    /// so the tool runs only after every other instance would find it.
    pub async fn begin(
        &self,
        key: &CallKey,
        tool: &str,
        digest: &str,
        owner: &str,
    ) -> Result<Begin> {
        let store_key = key.store_key()?;
        loop {
            // A first attempt (the common case) creates the record at once;
            // only a key already taken costs a read.
            let now = Timestamp::now();
            let record = CallRecord {
                principal: key.principal.clone(),
                tool: tool.to_owned(),
                digest: digest.to_owned(),
                status: CallStatus::Running,
                owner: owner.to_owned(),
                runs: 1,
                answer: None,
                answer_not_kept_bytes: None,
                created_at: now,
                updated_at: now,
            };
            match write(
                &*self.kv,
                &store_key,
                &record,
                PutMode::Create,
                Some(self.window),
            )
            .await
            {
                Ok(version) => {
                    debug!(tool, owner, "keyed call recorded; running it");
                    return Ok(Begin::Started(Stored { record, version }));
                }
                // Another attempt recorded it first: what it wrote, unless
                // it expired in between (then try again).
                Err(Error::AlreadyExists { .. }) => {
                    if let Some(found) = read::<CallRecord>(&*self.kv, &store_key).await? {
                        return Ok(Begin::Existing(found));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The call under `key`, if any.
    pub async fn load(&self, key: &CallKey) -> Result<Option<Stored<CallRecord>>> {
        read(&*self.kv, &key.store_key()?).await
    }

    /// Keeps `answer` for the call `running` (as [`begin`](Self::begin) or
    /// [`take_over`](Self::take_over) returned it). `Ok(false)` when the
    /// record changed meanwhile (another instance took it over): the answer
    /// is not kept, and the caller still has it to send.
    pub async fn finish(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        answer: impl Into<KeptAnswer>,
    ) -> Result<bool> {
        self.finish_within(key, running, answer, usize::MAX).await
    }

    /// [`finish`](Self::finish), keeping the answer only if its JSON is at
    /// most `limit` bytes; a larger one is recorded as done with its size
    /// ([`CallRecord::answer_not_kept_bytes`]).
    pub async fn finish_within(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        answer: impl Into<KeptAnswer>,
        limit: usize,
    ) -> Result<bool> {
        let text = answer.into().text;
        let mut record = running.record.clone();
        record.status = CallStatus::Done;
        record.updated_at = Timestamp::now();
        if text.len() <= limit {
            record.answer = Some(Secret::new(text));
        } else {
            record.answer_not_kept_bytes = Some(text.len() as u64);
        }
        self.replace(key, running, &record).await
    }

    /// Marks the call `running`, whose owner stopped, as
    /// [`CallStatus::Unknown`] for good. `Ok(None)` when the record changed
    /// meanwhile (read it again).
    pub async fn mark_unknown(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
    ) -> Result<Option<Stored<CallRecord>>> {
        let mut record = running.record.clone();
        record.status = CallStatus::Unknown;
        record.updated_at = Timestamp::now();
        self.replace_returning(key, running, record).await
    }

    /// Takes over the call `running`, whose owner stopped, to run its tool
    /// again on `owner` (for tools declared safe to re-run). `Ok(None)`
    /// when another instance changed it first (read it again).
    pub async fn take_over(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        owner: &str,
    ) -> Result<Option<Stored<CallRecord>>> {
        let mut record = running.record.clone();
        record.owner = owner.to_owned();
        record.runs = record.runs.saturating_add(1);
        record.updated_at = Timestamp::now();
        self.replace_returning(key, running, record).await
    }

    /// Forgets the call `running` (its tool asked the client for input and
    /// will be called again with the answers, under the same key).
    pub async fn release(&self, key: &CallKey, running: &Stored<CallRecord>) -> Result<()> {
        match self
            .kv
            .delete(&key.store_key()?, Some(running.version))
            .await
        {
            Ok(_) | Err(Error::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn replace(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        record: &CallRecord,
    ) -> Result<bool> {
        // Unsynced: the answer goes out while it is kept, so nothing waits
        // for this write to reach the disk; a store that commits in order
        // makes it durable with the next synced commit (on a legacy server,
        // normally the response's own event, stored before the client can
        // read it). The
        // record begun before the tool ran stays synced: that is what keeps
        // a tool from running twice.
        let options = PutOptions::new(PutMode::Update(running.version))
            .with_ttl(Some(self.window))
            .unsynced();
        match self
            .kv
            .put(&key.store_key()?, encode(record)?, options)
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::Conflict { .. } | Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn replace_returning(
        &self,
        key: &CallKey,
        running: &Stored<CallRecord>,
        record: CallRecord,
    ) -> Result<Option<Stored<CallRecord>>> {
        match write(
            &*self.kv,
            &key.store_key()?,
            &record,
            PutMode::Update(running.version),
            Some(self.window),
        )
        .await
        {
            Ok(version) => Ok(Some(Stored { record, version })),
            Err(Error::Conflict { .. } | Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn store() -> CallStore {
        CallStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(60))
    }

    #[test]
    fn digests_ignore_field_order_and_see_every_value() {
        let a = CallStore::digest(
            "t",
            &serde_json::json!({"a": 1, "b": [1, {"x": 2, "y": 3}]}),
        );
        let b = CallStore::digest(
            "t",
            &serde_json::json!({"b": [1, {"y": 3, "x": 2}], "a": 1}),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            CallStore::digest(
                "u",
                &serde_json::json!({"a": 1, "b": [1, {"x": 2, "y": 3}]})
            )
        );
        assert_ne!(
            a,
            CallStore::digest(
                "t",
                &serde_json::json!({"a": 2, "b": [1, {"x": 2, "y": 3}]})
            )
        );
        assert_ne!(
            a,
            CallStore::digest(
                "t",
                &serde_json::json!({"a": 1, "b": [{"x": 2, "y": 3}, 1]})
            )
        );
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in ["", "a b", "a/b", "ü", &"k".repeat(MAX_CALL_KEY_BYTES + 1)] {
            assert!(
                matches!(CallKey::new(None, bad), Err(Error::InvalidInput { .. })),
                "{bad:?}"
            );
        }
        assert!(CallKey::new(Some("a"), "0f8e-11:x.y_z").is_ok());
    }

    #[tokio::test]
    async fn one_attempt_starts_and_every_other_finds_it() -> Result<()> {
        let calls = store();
        let key = CallKey::new(Some("alice"), "k1")?;
        let d = CallStore::digest("t", &serde_json::json!({}));
        let Begin::Started(running) = calls.begin(&key, "t", &d, "i-1").await? else {
            panic!("a free key starts");
        };
        let Begin::Existing(found) = calls.begin(&key, "t", &d, "i-2").await? else {
            panic!("a taken key does not start again");
        };
        assert_eq!(found.record.status, CallStatus::Running);
        assert_eq!(found.record.owner, "i-1");
        // Another principal's key of the same text is a call of its own.
        let bob = CallKey::new(Some("bob"), "k1")?;
        assert!(matches!(
            calls.begin(&bob, "t", &d, "i-2").await?,
            Begin::Started(_)
        ));
        let anonymous = CallKey::new(None, "k1")?;
        assert!(matches!(
            calls.begin(&anonymous, "t", &d, "i-2").await?,
            Begin::Started(_)
        ));

        assert!(
            calls
                .finish(
                    &key,
                    &running,
                    CallAnswer::Result(serde_json::json!({"n": 1}))
                )
                .await?
        );
        let done = calls.load(&key).await?.expect("kept");
        assert_eq!(done.record.status, CallStatus::Done);
        assert_eq!(
            done.record.answer()?,
            Some(CallAnswer::Result(serde_json::json!({"n": 1})))
        );
        // A stale owner's finish after someone else's change keeps nothing.
        assert!(
            !calls
                .finish(
                    &key,
                    &running,
                    CallAnswer::Result(serde_json::json!({"n": 2}))
                )
                .await?
        );
        assert_eq!(
            calls.load(&key).await?.expect("kept").record.answer()?,
            Some(CallAnswer::Result(serde_json::json!({"n": 1})))
        );
        Ok(())
    }

    /// The record begun before the tool runs is written synced (it is what
    /// keeps the tool from running twice after a power cut); the answer,
    /// sent while it is kept, may skip the sync; so may nothing else.
    #[tokio::test]
    async fn only_the_kept_answer_may_skip_the_sync() -> Result<()> {
        use std::sync::Mutex;

        use async_trait::async_trait;

        use crate::{Backend, KvEntry, Version};

        #[derive(Default)]
        struct Noting {
            store: MemoryStore,
            unsynced: Mutex<Vec<bool>>,
        }
        impl Backend for Noting {
            fn backend_name(&self) -> &'static str {
                "noting"
            }
        }
        #[async_trait]
        impl KvStore for Noting {
            async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
                self.store.get(key).await
            }
            async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
                self.unsynced
                    .lock()
                    .expect("not poisoned")
                    .push(options.unsynced);
                self.store.put(key, value, options).await
            }
            async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
                self.store.delete(key, if_version).await
            }
            async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
                self.store.list(prefix).await
            }
        }

        let noting = Arc::new(Noting::default());
        let calls = CallStore::new(noting.clone(), Duration::from_secs(60));
        let writes = || std::mem::take(&mut *noting.unsynced.lock().expect("not poisoned"));
        let d = CallStore::digest("t", &serde_json::json!({}));
        let key = CallKey::new(Some("alice"), "k1")?;
        let Begin::Started(running) = calls.begin(&key, "t", &d, "i-1").await? else {
            panic!("a free key starts");
        };
        assert_eq!(writes(), [false], "the record is begun synced");
        assert!(
            calls
                .finish(&key, &running, CallAnswer::Result(serde_json::json!(1)))
                .await?
        );
        assert_eq!(writes(), [true], "the answer may skip the sync");

        let other = CallKey::new(Some("alice"), "k2")?;
        let Begin::Started(running) = calls.begin(&other, "t", &d, "i-1").await? else {
            panic!("a free key starts");
        };
        calls.mark_unknown(&other, &running).await?.expect("marked");
        let third = CallKey::new(Some("alice"), "k3")?;
        let Begin::Started(running) = calls.begin(&third, "t", &d, "i-1").await? else {
            panic!("a free key starts");
        };
        calls
            .take_over(&third, &running, "i-2")
            .await?
            .expect("taken");
        assert_eq!(
            writes(),
            [false; 4],
            "begins, outcomes and takeovers are synced"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_stopped_owner_is_taken_over_once_or_marked_unknown() -> Result<()> {
        let calls = store();
        let key = CallKey::new(Some("alice"), "k2")?;
        let d = CallStore::digest("t", &serde_json::json!({}));
        let Begin::Started(running) = calls.begin(&key, "t", &d, "dead").await? else {
            panic!("starts");
        };
        let taken = calls
            .take_over(&key, &running, "i-2")
            .await?
            .expect("taken");
        assert_eq!((taken.record.owner.as_str(), taken.record.runs), ("i-2", 2));
        // The second taker, with the record it read before, loses.
        assert!(calls.take_over(&key, &running, "i-3").await?.is_none());
        assert!(calls.mark_unknown(&key, &running).await?.is_none());
        let unknown = calls.mark_unknown(&key, &taken).await?.expect("marked");
        assert_eq!(unknown.record.status, CallStatus::Unknown);
        assert_eq!(unknown.record.answer()?, None);
        Ok(())
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_done_but_not_kept() -> Result<()> {
        let calls = store();
        let key = CallKey::new(None, "k3")?;
        let d = CallStore::digest("t", &serde_json::json!({}));
        let Begin::Started(running) = calls.begin(&key, "t", &d, "i-1").await? else {
            panic!("starts");
        };
        let big = serde_json::json!({"text": "x".repeat(100)});
        assert!(
            calls
                .finish_within(&key, &running, CallAnswer::Result(big), 50)
                .await?
        );
        let done = calls.load(&key).await?.expect("kept").record;
        assert_eq!(done.status, CallStatus::Done);
        assert_eq!(done.answer()?, None);
        assert!(done.answer_not_kept_bytes.is_some_and(|n| n > 100));
        Ok(())
    }

    #[test]
    fn an_answer_encoded_directly_is_kept_as_one_from_a_json_tree() -> Result<()> {
        #[derive(Serialize)]
        struct Answer<'a> {
            content: Vec<&'a str>,
            #[serde(rename = "isError")]
            is_error: bool,
        }
        let direct = Answer {
            content: vec!["a \"quoted\" line\n", "ünïcode"],
            is_error: false,
        };
        let tree = serde_json::to_value(&direct).expect("serializes");
        for (encoded, answer) in [
            (
                KeptAnswer::result(&direct)?,
                CallAnswer::Result(tree.clone()),
            ),
            (KeptAnswer::task(&direct)?, CallAnswer::Task(tree.clone())),
            (KeptAnswer::error(&direct)?, CallAnswer::Error(tree.clone())),
        ] {
            // The same bytes as before, so records of either build read alike.
            assert_eq!(encoded, KeptAnswer::from(answer.clone()));
            let record = CallRecord {
                principal: None,
                tool: "t".into(),
                digest: "d".into(),
                status: CallStatus::Done,
                owner: "i".into(),
                runs: 1,
                answer: Some(Secret::new(encoded.text.clone())),
                answer_not_kept_bytes: None,
                created_at: Timestamp::now(),
                updated_at: Timestamp::now(),
            };
            assert_eq!(record.answer()?, Some(answer));
        }
        // A value that cannot be JSON is a typed error, not a panic.
        let mut not_json = std::collections::HashMap::new();
        not_json.insert((1, 2), "tuple keys");
        assert!(matches!(
            KeptAnswer::result(&not_json),
            Err(Error::InvalidInput { .. })
        ));
        Ok(())
    }
}
