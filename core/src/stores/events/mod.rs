mod replay;
mod token;
mod write;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;

use super::{Stored, read, write};
use crate::retry::retry_cas;
use crate::{
    Key, KvStore, LogStore, PutMode, Result, declare,
    records::{StreamMeta, encode_event},
    types::{EventId, SessionId},
};

/// Work to run alongside an event's write (see
/// [`EventLog::append_opening_beside`]).
type Beside<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// How many streams an instance caches the token of before pruning.
const STREAM_CACHE_LIMIT: usize = 10_000;

/// How long and how much of each SSE stream an [`EventLog`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventLogConfig {
    /// A stream is dropped once this long has passed since its last event.
    pub retention: Duration,
    /// The latest this many events of a stream are kept, and at most about
    /// one and a half times as many: older ones are dropped every half of
    /// this many appends (pipelined streams too), without reading the log
    /// (an instance reads a stream's log once, when it first trims it).
    pub max_events_per_stream: u64,
    /// When an event counts as stored (default [`EventDurability::Synced`]).
    pub durability: EventDurability,
}

/// When an SSE event counts as stored, and so what a crash can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EventDurability {
    /// The event is committed by the backend (synced to disk, for durable
    /// backends) before its id is returned and it is sent. A crash loses
    /// nothing that was sent.
    #[default]
    Synced,
    /// The event is committed before its id is returned and it is sent,
    /// but not synced to disk ([`LogStore::append_unsynced`]): a crash of
    /// the instance loses nothing that was sent; a power cut or an OS crash
    /// of a machine holding a file or SQLite store may take the last events.
    /// On memory and Redis it is the same as `Synced`.
    Written,
    /// The id is assigned at once by the instance writing the stream (it
    /// owns the stream's sequence) and the event is sent at once; appends
    /// are committed in the background, many events per commit, at most
    /// `window` later. Replays and tails on the writing instance first have
    /// that stream's pending appends committed (at once, not at the end of
    /// the window) and wait for them, so a resuming client never sees a
    /// gap. A crash loses at most the last window of events; a
    /// `Last-Event-ID` inside a lost window is refused as lost (HTTP 410),
    /// never answered with a gap or a duplicate.
    Pipelined {
        /// The longest an event waits for its commit.
        window: Duration,
    },
}

impl EventDurability {
    /// [`Pipelined`](EventDurability::Pipelined) with the default 10 ms window.
    pub const PIPELINED: EventDurability = EventDurability::Pipelined {
        window: Duration::from_millis(10),
    };

    /// `synced`, `written` or `pipelined`, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            EventDurability::Synced => "synced",
            EventDurability::Written => "written",
            EventDurability::Pipelined { .. } => "pipelined",
        }
    }
}

impl Default for EventLogConfig {
    fn default() -> Self {
        EventLogConfig {
            retention: Duration::from_secs(60 * 60),
            max_events_per_stream: 10_000,
            durability: EventDurability::Synced,
        }
    }
}

impl EventLogConfig {
    /// A config with the given retention age and length.
    pub fn new(retention: Duration, max_events_per_stream: u64) -> Self {
        EventLogConfig {
            retention,
            max_events_per_stream: max_events_per_stream.max(1),
            durability: EventDurability::Synced,
        }
    }

    /// The same settings with events stored at `durability`.
    pub fn with_durability(mut self, durability: EventDurability) -> Self {
        self.durability = durability;
        self
    }
}

/// An SSE event as stored, with its original id.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredEvent {
    /// The id it was sent with.
    pub id: EventId,
    /// The message (JSON-RPC message, or `null` for a priming event).
    pub payload: serde_json::Value,
}

/// The SSE event log of a server, shared by every instance.
///
/// Each stream gets a random 128-bit token when its first event is stored;
/// every [`EventId`] of the stream carries it, and replay checks it, so ids
/// are unguessable and one stream's id never reads another stream. Replay
/// returns exactly the later events of that one stream, in order, with their
/// original ids.
#[derive(Clone)]
pub struct EventLog {
    kv: Arc<dyn KvStore>,
    log: Arc<dyn LogStore>,
    config: EventLogConfig,
    streams: Arc<Mutex<HashMap<String, StreamCache>>>,
    writer: Option<Arc<str>>,
    pipes: Arc<Mutex<HashMap<String, Pipe>>>,
}

/// The pending appends of one stream written by this instance in
/// [`EventDurability::Pipelined`] mode.
struct Pipe {
    /// The sequence number the next event gets.
    next_seq: u64,
    /// Events with their assigned numbers, not yet handed to the backend.
    pending: Vec<(u64, Payload)>,
    /// Every event up to this number is committed (or known lost).
    committed_through: u64,
    /// A commit is scheduled or running.
    flushing: bool,
    /// Woken after every commit.
    committed: Arc<tokio::sync::Notify>,
    /// Cuts the scheduled commit's window short: someone on this instance
    /// waits to read what was sent (a resume, a replay).
    hurry: Arc<tokio::sync::Notify>,
    /// The metadata of a stream this instance started, written with its
    /// first commit.
    meta: Option<StreamMeta>,
    /// The session owning the stream.
    session: Option<SessionId>,
}

/// An event's record: encoded, or encoded when its write needs the bytes
/// (a pipelined event's, in the commit that writes it).
enum Payload {
    Encoded(Vec<u8>),
    Later(Box<dyn FnOnce() -> Result<Vec<u8>> + Send>),
}

impl Payload {
    fn later<P: Serialize + Send + 'static>(payload: P) -> Self {
        Self::Later(Box::new(move || encode_event(&payload)))
    }

    fn encode(self) -> Result<Vec<u8>> {
        match self {
            Self::Encoded(data) => Ok(data),
            Self::Later(encode) => encode(),
        }
    }
}

/// How a pipelined append goes on.
enum PipelinedStart {
    /// Numbered by this instance, under this token; with the metadata of a
    /// stream it starts, written with the first commit.
    Numbered([u8; 16], Option<StreamMeta>),
    /// Stored at once, so that its number is the backend's: the first event
    /// of a stream new to this instance on a backend that cannot tell its
    /// next number without writing (`None`), or of a log that started again
    /// under an existing stream (its token and the last number known under
    /// it).
    AtOnce(Option<([u8; 16], u64)>),
}

/// Who writes a stream and what it answers, as recorded by its writer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StreamOrigin {
    /// The instance writing it (see [`InstanceLeases`](super::InstanceLeases)).
    pub writer: Option<String>,
    /// The JSON-RPC id of the request it answers.
    pub request: Option<serde_json::Value>,
}

#[derive(Clone, Copy)]
struct StreamCache {
    token: [u8; 16],
    meta_refreshed: tokio::time::Instant,
    /// When the stream is next trimmed, and down to what (under `token`).
    trimming: Trimming,
    /// The highest sequence number this instance knows the log reached
    /// under `token`: an append given a number not above it found the log
    /// started again (it expired, or was deleted, meanwhile).
    last_seq: u64,
}

/// The length bound of one stream, kept without reading the log: every
/// half [`max_events_per_stream`](EventLogConfig::max_events_per_stream)
/// appends (a period) the highest number this instance knows is marked, and
/// the log is trimmed through the mark made as many periods ago as hold
/// `max_events_per_stream` appends. What is dropped is always followed by
/// at least that many events; a stream holds at most one period more. An
/// instance new to a stream reads its log once, at its first period's end,
/// to place the marks its predecessors would have made.
#[derive(Clone, Copy, Default)]
struct Trimming {
    appends: u64,
    /// Whether the marks were placed (from the log, or counted since).
    placed: bool,
    /// The marks, newest first; 0 for none.
    marks: [u64; 4],
}

/// What the end of a period calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrimDue {
    /// Drop the events numbered up to this.
    Through(u64),
    /// Read the log once to place the marks, and trim by what it holds.
    Read,
}

impl Trimming {
    fn period(config: &EventLogConfig) -> u64 {
        (config.max_events_per_stream.max(1) / 2).max(1)
    }

    /// How many periods hold `max_events_per_stream` appends (at most 3:
    /// a period is at least a third of the maximum).
    fn periods(config: &EventLogConfig) -> usize {
        let max = config.max_events_per_stream.max(1);
        usize::try_from(max.div_ceil(Self::period(config))).unwrap_or(usize::MAX)
    }

    /// Counts the appends numbered `seqs` (in order); at the end of a
    /// period, what is due.
    fn counted(&mut self, seqs: &[u64], config: &EventLogConfig) -> Option<TrimDue> {
        let period = Self::period(config);
        let mut due = None;
        for &seq in seqs {
            self.appends += 1;
            if self.appends < period {
                continue;
            }
            self.appends = 0;
            if !self.placed {
                due = Some(TrimDue::Read);
                continue;
            }
            self.marks.rotate_right(1);
            self.marks[0] = seq;
            if let Some(mark) = self.marks.get(Self::periods(config)).filter(|&&m| m > 0) {
                due = Some(TrimDue::Through(*mark));
            }
        }
        due
    }

    /// Places the marks from `seqs`, every number the log holds (in
    /// order), as if this instance had counted every append.
    fn place(&mut self, seqs: &[u64], config: &EventLogConfig) {
        let period = usize::try_from(Self::period(config)).unwrap_or(usize::MAX);
        for (n, mark) in self.marks.iter_mut().enumerate() {
            *mark = n
                .checked_mul(period)
                .and_then(|back| seqs.len().checked_sub(back + 1))
                .map_or(0, |at| seqs[at]);
        }
        self.placed = true;
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("kv", &self.kv.backend_name())
            .field("log", &self.log.backend_name())
            .field("config", &self.config)
            .finish()
    }
}

fn meta_key(stream: &str) -> Result<Key> {
    declare::EVENT_STREAM.try_key(&[stream])
}

fn log_name(stream: &str) -> Result<Key> {
    declare::EVENT.try_key(&[stream])
}

impl EventLog {
    /// An event store keeping stream metadata in `kv` and events in `log`.
    pub fn new(kv: Arc<dyn KvStore>, log: Arc<dyn LogStore>, config: EventLogConfig) -> Self {
        EventLog {
            kv,
            log,
            config,
            streams: Arc::default(),
            writer: None,
            pipes: Arc::default(),
        }
    }

    /// The same event log, recording `instance` as the writer of the
    /// streams it creates, so that a replaying instance can tell when the
    /// writer stopped.
    pub fn with_writer(mut self, instance: impl Into<String>) -> Self {
        self.writer = Some(Arc::from(instance.into()));
        self
    }

    /// Records that `stream` answers the request with JSON-RPC id
    /// `request`. A stream that does not exist (yet) is left alone.
    pub async fn describe_request(&self, stream: &str, request: serde_json::Value) -> Result<()> {
        // A pipelined stream's metadata is written with its first commit.
        self.flushed(stream).await;
        let key = &meta_key(stream)?;
        let request = &request;
        retry_cas(key, 8, move || async move {
            let Some(Stored {
                mut record,
                version,
            }) = read::<StreamMeta>(&*self.kv, key).await?
            else {
                return Ok(());
            };
            if record.request.as_ref() == Some(request) {
                return Ok(());
            }
            record.request = Some(request.clone());
            write(
                &*self.kv,
                key,
                &record,
                PutMode::Update(version),
                Some(self.meta_ttl()),
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Who writes `stream` and which request it answers, when recorded;
    /// `None` for an unknown stream.
    pub async fn origin(&self, stream: &str) -> Result<Option<StreamOrigin>> {
        // On the writing instance, a new pipelined stream's metadata is
        // committed before it is read.
        self.flushed(stream).await;
        Ok(read::<StreamMeta>(&*self.kv, &meta_key(stream)?)
            .await?
            .map(|s| StreamOrigin {
                writer: s.record.writer,
                request: s.record.request,
            }))
    }

    /// The retention settings.
    pub fn config(&self) -> EventLogConfig {
        self.config
    }

    /// Stores one event of `stream` (owned by `session`, when the server has
    /// sessions) and returns its id. Committed before it returns.
    ///
    /// `payload` is the event's JSON-RPC message (or `null`, for a priming
    /// event), encoded straight from its own type: a message need not be
    /// turned into a [`serde_json::Value`] first. Replay returns it as one.
    pub async fn append<P: Serialize + ?Sized + Sync>(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        payload: &P,
    ) -> Result<EventId> {
        let data = encode_event(payload)?;
        self.append_with(stream, session, Payload::Encoded(data), None, &mut None)
            .await
    }

    /// [`append`](Self::append), taking the payload by value so that it can
    /// be encoded when its write needs the bytes: at once on a stream
    /// written synchronously, and in the commit that writes it on a
    /// [`Pipelined`](EventDurability::Pipelined) one, off the path of the
    /// caller that sends the event. A pipelined payload that fails to encode
    /// or is over the backend's size limit is stored as an empty event (a
    /// resuming client gets its id without a message) and logged as lost;
    /// the events committed with it are kept.
    pub async fn append_owned<P: Serialize + Send + 'static>(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        payload: P,
    ) -> Result<EventId> {
        let payload = if matches!(self.config.durability, EventDurability::Pipelined { .. }) {
            Payload::later(payload)
        } else {
            Payload::Encoded(encode_event(&payload)?)
        };
        self.append_with(stream, session, payload, None, &mut None)
            .await
    }

    /// Stores the first event of a request's stream, like
    /// [`append`](Self::append), and records `request` (the JSON-RPC id the
    /// stream answers) in the stream's metadata in the same write that
    /// creates it. An instance resuming the stream after its writer stopped
    /// can then answer that request, however soon the writer stopped; there
    /// is no moment in which the stream exists but its request is unknown.
    /// (A `Pipelined` stream numbered here is created by its first commit,
    /// its request with it: a writer that stops before that commit leaves
    /// no stream, and a client resuming it is told it is unknown.)
    /// On a stream that already exists it is `append`, and `request` is not
    /// recorded (see [`describe_request`](Self::describe_request)).
    pub async fn append_opening<P: Serialize + ?Sized + Sync>(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        payload: &P,
        request: &serde_json::Value,
    ) -> Result<EventId> {
        self.append_opening_beside(stream, session, payload, request, std::future::ready(()))
            .await
    }

    /// [`append_opening`](Self::append_opening), running `beside` alongside
    /// the event's own write: both start in the same poll, so a backend
    /// that commits the writes waiting together (SQLite's group commit)
    /// puts the event and whatever `beside` writes first on disk with one
    /// commit. `beside` runs to its end exactly once, whatever becomes of
    /// the event: with its write, or after the append when the append wrote
    /// nothing at once (a pipelined stream's events, numbered here and
    /// committed within the window) or failed.
    pub async fn append_opening_beside<P: Serialize + ?Sized + Sync>(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        payload: &P,
        request: &serde_json::Value,
        beside: impl Future<Output = ()> + Send,
    ) -> Result<EventId> {
        let mut beside: Option<Beside<'_>> = Some(Box::pin(beside));
        let appended = match encode_event(payload) {
            Ok(data) => {
                self.append_with(
                    stream,
                    session,
                    Payload::Encoded(data),
                    Some(request),
                    &mut beside,
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Some(rest) = beside.take() {
            rest.await;
        }
        appended
    }

    /// Whether this instance has `stream` in its cache of streams it wrote
    /// or read recently (a stream it does not know may still exist).
    pub fn knows(&self, stream: &str) -> bool {
        self.cached(stream).is_some()
    }

    async fn append_with(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        data: Payload,
        request: Option<&serde_json::Value>,
        beside: &mut Option<Beside<'_>>,
    ) -> Result<EventId> {
        crate::types::check_visible_ascii("stream id", stream, crate::types::MAX_STREAM_ID_BYTES)?;
        if let EventDurability::Pipelined { window } = self.config.durability {
            match self.pipelined_token(stream, session, request).await? {
                PipelinedStart::Numbered(token, new_meta) => {
                    let seq = self
                        .pipeline(stream, data, session, window, new_meta)
                        .await?;
                    return Ok(EventId::new(token, seq, stream));
                }
                // The first event of a stream new here (on a backend that
                // cannot tell its next number), or of a log that started
                // again, is stored at once, as a synchronous one is:
                // its number is the backend's, which may start again or go
                // on above the numbers of an earlier log of the same name,
                // and the stream's next events are numbered on from it.
                PipelinedStart::AtOnce(known) => {
                    return self
                        .append_now(stream, session, request, known, data.encode()?, beside)
                        .await;
                }
            }
        }
        let known = self.stream_token(stream).await?;
        self.append_now(stream, session, request, known, data.encode()?, beside)
            .await
    }

    /// Deletes a stream and its events.
    ///
    /// The metadata goes first: interrupted after it, the stream is
    /// unreachable (its events expire with their log), and its next append
    /// starts it again under a new token. The other way round, a token whose
    /// log had gone would outlive it, and its ids would name the events of
    /// a log numbered afresh.
    pub async fn delete_stream(&self, stream: &str) -> Result<()> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(stream);
        self.kv.delete(&meta_key(stream)?, None).await?;
        self.log.delete_log(&log_name(stream)?).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use crate::{
        Error, Secret,
        types::{Timestamp, hex, random_token},
    };

    use async_trait::async_trait;

    use super::*;
    use crate::stores::testkit::CountingKv;
    use crate::{
        Backend, LogRecord, MemoryStore, PutOptions,
        records::{EventRecord, encode},
    };

    /// A memory log that counts the reads of it and notes, when a log is
    /// deleted, whether the stream's metadata was still there.
    struct Watching {
        store: MemoryStore,
        read: std::sync::atomic::AtomicUsize,
        meta_left_at_log_deletion: Mutex<Vec<bool>>,
    }

    impl Watching {
        /// A memory store, and its log watched.
        fn new() -> (MemoryStore, Arc<Watching>) {
            let store = MemoryStore::new();
            let log = Arc::new(Watching {
                store: store.clone(),
                read: Default::default(),
                meta_left_at_log_deletion: Mutex::default(),
            });
            (store, log)
        }
    }

    impl Backend for Watching {
        fn backend_name(&self) -> &'static str {
            "watching"
        }
    }

    #[async_trait]
    impl LogStore for Watching {
        async fn append(
            &self,
            log: &Key,
            records: Vec<Vec<u8>>,
            ttl: Option<Duration>,
        ) -> Result<Vec<u64>> {
            self.store.append(log, records, ttl).await
        }

        async fn read_after(&self, log: &Key, after: u64, limit: usize) -> Result<Vec<LogRecord>> {
            self.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.store.read_after(log, after, limit).await
        }

        async fn trim(&self, log: &Key, before: u64) -> Result<u64> {
            self.store.trim(log, before).await
        }

        async fn delete_log(&self, log: &Key) -> Result<()> {
            let stream = declare::EVENT.parse(log).expect("an event log")[0].clone();
            let left = self.store.get(&meta_key(&stream)?).await?.is_some();
            self.meta_left_at_log_deletion
                .lock()
                .expect("not poisoned")
                .push(left);
            self.store.delete_log(log).await
        }
    }

    /// A memory key-value store that counts its reads.
    /// A pipelined stream new to this instance reads its metadata and its
    /// log's next number at the same time, not one after the other: on a
    /// network store that is one round trip on every request's path.
    #[tokio::test]
    async fn a_new_pipelined_stream_reads_its_metadata_and_next_number_at_once() {
        let meeting = Arc::new(CountingKv {
            barrier: Some(tokio::sync::Barrier::new(2)),
            ..CountingKv::default()
        });
        let config = EventLogConfig::default().with_durability(EventDurability::PIPELINED);
        let events = EventLog::new(meeting.clone(), meeting, config);
        let id = tokio::time::timeout(
            Duration::from_secs(10),
            events.append("met", None, &serde_json::json!("first")),
        )
        .await
        .expect("the two reads were made one after the other")
        .expect("append");
        assert_eq!(id.seq(), 1);
    }

    /// A stream's first event reads its metadata once (to find it has
    /// none) and creates it without reading it again: one read fewer on
    /// every request's stream. A writer that created it in between still
    /// has its token kept, and the event is numbered under it.
    #[tokio::test]
    async fn a_new_streams_metadata_is_created_without_a_second_read() {
        let store = MemoryStore::new();
        let kv = Arc::new(CountingKv {
            store: store.clone(),
            ..CountingKv::default()
        });
        let events = EventLog::new(
            kv.clone(),
            Arc::new(store.clone()),
            EventLogConfig::default(),
        );
        let request = serde_json::json!(7);
        let id = events
            .append_opening("new-stream", None, &serde_json::json!({"n": 1}), &request)
            .await
            .expect("append");
        assert_eq!(
            kv.gets.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "one read of the metadata for a new stream"
        );
        assert_eq!(
            events
                .origin("new-stream")
                .await
                .expect("origin")
                .and_then(|o| o.request),
            Some(request.clone()),
            "the request is recorded with the stream"
        );
        assert_eq!(
            events
                .replay_after(&id.to_string(), None)
                .await
                .expect("a known id")
                .len(),
            0
        );

        // Another writer creates the stream between this one's numbering
        // and its metadata: its token stands, and this writer's event is
        // found under it.
        let other = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store.clone()),
            EventLogConfig::default(),
        );
        let known = events.stream_token("raced").await.expect("no metadata");
        assert_eq!(known, None);
        let first = other
            .append("raced", None, &serde_json::json!({"n": 1}))
            .await
            .expect("the other writer's event");
        let seqs = store
            .append(
                &log_name("raced").expect("a log"),
                vec![b"x".to_vec()],
                None,
            )
            .await
            .expect("this writer's event");
        let token = events
            .settle("raced", None, None, known, seqs[0])
            .await
            .expect("settled");
        assert_eq!(&token, first.token(), "the first writer's token is kept");
    }

    /// A server starting more streams than the cache holds, all of them
    /// recent: the cache stays bounded (it grew without bound, and scanned
    /// itself whole on every new stream, before), and a stream it forgot
    /// goes on with its own token and numbering.
    #[tokio::test]
    async fn the_stream_cache_stays_bounded_when_every_stream_is_recent() {
        let store = MemoryStore::new();
        let events = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store),
            EventLogConfig::default(),
        );
        let payload = serde_json::json!({"n": 1});
        let first = events
            .append("stream-0", None, &payload)
            .await
            .expect("append");
        for i in 1..(STREAM_CACHE_LIMIT * 2 + 10) {
            events
                .append(&format!("stream-{i}"), None, &payload)
                .await
                .expect("append");
            let cached = events.streams.lock().expect("lock").len();
            assert!(
                cached <= STREAM_CACHE_LIMIT,
                "{cached} streams cached after {i}"
            );
        }
        assert!(
            events.cached("stream-0").is_none(),
            "the oldest was forgotten"
        );
        let second = events
            .append("stream-0", None, &payload)
            .await
            .expect("append");
        assert_eq!(second.seq(), first.seq() + 1);
        assert_eq!(
            second.to_string().split_once('-').map(|p| p.0),
            first.to_string().split_once('-').map(|p| p.0),
            "the same token"
        );
    }

    #[tokio::test]
    async fn deleting_a_stream_drops_its_metadata_before_its_log() {
        let (store, log) = Watching::new();
        let events = EventLog::new(
            Arc::new(store.clone()),
            log.clone(),
            EventLogConfig::default(),
        );
        let first = events
            .append("s", None, &serde_json::json!(1))
            .await
            .expect("append");
        events.delete_stream("s").await.expect("delete");
        assert_eq!(
            *log.meta_left_at_log_deletion.lock().expect("not poisoned"),
            vec![false],
            "the log was deleted while the stream's token was still stored"
        );
        // Started again, the stream has another token: the old id names nothing.
        let again = events
            .append("s", None, &serde_json::json!(2))
            .await
            .expect("append");
        assert_ne!(again.token(), first.token());
        assert!(matches!(
            events.replay_after(&first.to_string(), None).await,
            Err(Error::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn the_last_dropped_event_still_resumes() {
        let store = MemoryStore::new();
        let events = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store),
            EventLogConfig::new(Duration::from_secs(600), 2),
        );
        let mut ids = Vec::new();
        for n in 1..=6 {
            ids.push(
                events
                    .append("s", None, &serde_json::json!(n))
                    .await
                    .expect("append"),
            );
        }
        // Events 1 to 4 were dropped; what follows the 4th is complete.
        let replayed = events
            .replay_after(&ids[3].to_string(), None)
            .await
            .expect("replay after the last dropped event");
        assert_eq!(
            replayed
                .iter()
                .map(|e| e.payload.clone())
                .collect::<Vec<_>>(),
            vec![serde_json::json!(5), serde_json::json!(6)]
        );
        assert!(matches!(
            events.replay_after(&ids[2].to_string(), None).await,
            Err(Error::NotFound { .. })
        ));
    }

    /// A long stream is kept to its length with its log read once per
    /// instance writing it (at the end of its first half-length of appends),
    /// not once every half-length: however many events were dropped, the
    /// last `max_events_per_stream` always resume, the stream never holds
    /// more than about one and a half times as many, and the next instance
    /// to write it (whose count starts again) trims it as the first did.
    #[tokio::test]
    async fn a_long_stream_is_trimmed_reading_its_log_once_per_instance() {
        let (store, log) = Watching::new();
        let reads = || log.read.load(std::sync::atomic::Ordering::Relaxed);
        for max in [1u64, 2, 5, 10] {
            let config = EventLogConfig::new(Duration::from_secs(600), max);
            let stream = format!("long-{max}");
            let newest = usize::try_from(max).expect("small");
            let period = (newest / 2).max(1);
            let mut ids = Vec::new();
            for instance in 0..2 {
                let events = EventLog::new(Arc::new(store.clone()), log.clone(), config);
                let mut read_appending = 0;
                for n in 0..40 {
                    let before = reads();
                    ids.push(
                        events
                            .append(&stream, None, &serde_json::json!([instance, n]))
                            .await
                            .expect("append"),
                    );
                    read_appending += reads() - before;
                    let held = store
                        .read_after(&log_name(&stream).expect("a name"), 0, usize::MAX)
                        .await
                        .expect("read the log")
                        .len();
                    assert!(
                        held < newest + 2 * period,
                        "max {max}, instance {instance}, event {n}: the stream holds {held}"
                    );
                    // The last `max` events (after the one before them,
                    // whose id they follow) still resume, complete.
                    let from = ids.len().saturating_sub(newest + 1);
                    let replayed = events
                        .replay_after(&ids[from].to_string(), None)
                        .await
                        .unwrap_or_else(|e| panic!("max {max}, event {n}: {e}"));
                    assert_eq!(replayed.len(), ids.len() - from - 1, "max {max}, event {n}");
                }
                assert_eq!(
                    read_appending, 1,
                    "max {max}, instance {instance}: reads of the log while appending"
                );
            }
            // The first events are gone, and replaying from them says so.
            let events = EventLog::new(Arc::new(store.clone()), log.clone(), config);
            assert!(
                matches!(
                    events.replay_after(&ids[0].to_string(), None).await,
                    Err(Error::NotFound { .. })
                ),
                "max {max}"
            );
        }
    }

    /// A pipelined stream is kept to its length too (its commits count
    /// its events, and trim it once the events waiting for them are told).
    #[tokio::test]
    async fn a_long_pipelined_stream_is_trimmed_too() {
        let (store, log) = Watching::new();
        let config = EventLogConfig::new(Duration::from_secs(600), 10)
            .with_durability(EventDurability::PIPELINED);
        let events = EventLog::new(Arc::new(store.clone()), log.clone(), config);
        let mut ids = Vec::new();
        let reads = || log.read.load(std::sync::atomic::Ordering::Relaxed);
        let mut reads_at_100 = 0;
        for n in 0..200 {
            if n == 100 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                reads_at_100 = reads();
            }
            ids.push(
                events
                    .append("piped", None, &serde_json::json!(n))
                    .await
                    .expect("append"),
            );
            if n % 7 == 0 {
                // Commits of several sizes.
                tokio::time::sleep(Duration::from_millis(12)).await;
            }
        }
        let name = log_name("piped").expect("a name");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let held = loop {
            let held = store
                .read_after(&name, 0, usize::MAX)
                .await
                .expect("read the log")
                .len();
            if held < 20 || tokio::time::Instant::now() >= deadline {
                break held;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(held < 20, "the stream holds {held} events");
        assert_eq!(
            reads(),
            reads_at_100,
            "the second hundred events read the log no more"
        );
        let replayed = events
            .replay_after(&ids[189].to_string(), None)
            .await
            .expect("the last 10 events resume");
        assert_eq!(replayed.len(), 10);
        assert!(matches!(
            events.replay_after(&ids[0].to_string(), None).await,
            Err(Error::NotFound { .. })
        ));
    }

    /// A message appended as its own type is stored as the record its JSON
    /// tree made before, and replays as that tree; a priming event (no
    /// message) is `null`.
    #[tokio::test]
    async fn an_event_encoded_from_its_type_replays_as_its_json_tree() {
        #[derive(Serialize)]
        struct Progress<'a> {
            jsonrpc: &'a str,
            method: &'a str,
            params: (f64, Option<u8>, &'a str),
        }
        let store = MemoryStore::new();
        let events = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store.clone()),
            EventLogConfig::default(),
        );
        let typed = Progress {
            jsonrpc: "2.0",
            method: "notifications/progress",
            params: (0.5, None, "h\u{e9}llo \"w\"\n"),
        };
        let tree = serde_json::to_value(&typed).expect("a JSON tree");
        let first = events
            .append("s", None, &None::<&Progress<'_>>)
            .await
            .expect("priming");
        events.append("s", None, &typed).await.expect("typed");
        events.append("s", None, &tree).await.expect("tree");
        let replayed = events
            .replay_after(&first.to_string(), None)
            .await
            .expect("replay");
        assert_eq!(replayed.len(), 2);
        assert_eq!(replayed[0].payload, tree);
        assert_eq!(replayed[1].payload, tree);
        // The record itself decodes as the record a tree made.
        let stored = store
            .read_after(&log_name("s").expect("name"), 0, 10)
            .await
            .expect("read");
        let records: Vec<EventRecord> = stored
            .iter()
            .map(|r| {
                crate::records::decode(&log_name("s").expect("name"), &r.data).expect("decode")
            })
            .collect();
        assert_eq!(records[0].payload, serde_json::Value::Null);
        assert_eq!(
            records[1],
            EventRecord {
                payload: tree.clone()
            }
        );
        assert_eq!(records[1], records[2]);
    }

    /// Plants a stream as 0.1 wrote it (metadata without `last_seq`) with
    /// `events` events in its log; returns its token.
    async fn plant_v01_stream(store: &MemoryStore, stream: &str, events: u64) -> [u8; 16] {
        let token = random_token().expect("token");
        let meta = StreamMeta {
            session: None,
            token: Secret::new(hex(&token)),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: None,
            request: None,
            last_seq: 0,
        };
        let bytes = encode(&meta).expect("encode");
        assert!(
            !String::from_utf8_lossy(&bytes).contains("last_seq"),
            "not the 0.1 form"
        );
        store
            .put(
                &meta_key(stream).expect("key"),
                bytes,
                PutOptions::default(),
            )
            .await
            .expect("put");
        for n in 1..=events {
            let data = encode(&EventRecord {
                payload: serde_json::json!(n),
            })
            .expect("encode");
            store
                .append(&log_name(stream).expect("name"), vec![data], None)
                .await
                .expect("append");
        }
        token
    }

    #[tokio::test]
    async fn a_stream_written_by_0_1_carries_on_under_its_token() {
        let store = MemoryStore::new();
        let token = plant_v01_stream(&store, "s", 3).await;
        let events = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store),
            EventLogConfig::default(),
        );
        let next = events
            .append("s", None, &serde_json::json!(4))
            .await
            .expect("append");
        assert_eq!((*next.token(), next.seq()), (token, 4));
        let old = EventId::new(token, 2, "s");
        let replayed = events
            .replay_after(&old.to_string(), None)
            .await
            .expect("an id sent by 0.1 resumes");
        assert_eq!(
            replayed
                .iter()
                .map(|e| e.payload.clone())
                .collect::<Vec<_>>(),
            vec![serde_json::json!(3), serde_json::json!(4)]
        );
    }

    #[tokio::test]
    async fn a_stream_written_by_0_1_whose_log_expired_gets_a_new_token() {
        let store = MemoryStore::new();
        let token = plant_v01_stream(&store, "s", 0).await;
        let events = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store),
            EventLogConfig::default(),
        );
        let next = events
            .append("s", None, &serde_json::json!(1))
            .await
            .expect("append");
        assert_ne!(*next.token(), token);
        assert!(matches!(
            events
                .replay_after(&EventId::new(token, 1, "s").to_string(), None)
                .await,
            Err(Error::NotFound { .. })
        ));
    }

    /// A pipelined event that cannot be stored (over the backend's size
    /// limit, or a payload that does not encode when its commit encodes it)
    /// is stored empty under its number; the events committed with it keep
    /// theirs and resume. Written synchronously, the same events are refused
    /// to their caller and nothing is stored.
    #[tokio::test]
    async fn a_pipelined_event_that_cannot_be_stored_loses_itself_only() {
        use crate::backend::DEFAULT_MAX_VALUE_BYTES;
        let oversized = "x".repeat(DEFAULT_MAX_VALUE_BYTES);
        // serde_json refuses map keys that are not strings or numbers.
        let unencodable = || std::collections::BTreeMap::from([(vec![1u8], 1u8)]);
        let store = MemoryStore::new();
        let config = EventLogConfig::new(Duration::from_secs(600), 100).with_durability(
            EventDurability::Pipelined {
                window: Duration::from_millis(50),
            },
        );
        let events = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
        let first = events
            .append("piped", None, &serde_json::json!("first"))
            .await
            .expect("append");
        // One commit: the window has not passed between these.
        let mut sent = vec![
            events
                .append_owned("piped", None, serde_json::json!("a"))
                .await
                .expect("append"),
        ];
        sent.push(
            events
                .append("piped", None, &serde_json::json!(oversized))
                .await
                .expect("sent before it is committed"),
        );
        sent.push(
            events
                .append_owned("piped", None, unencodable())
                .await
                .expect("encoded by the commit"),
        );
        sent.push(
            events
                .append_owned("piped", None, serde_json::json!("b"))
                .await
                .expect("append"),
        );
        let replayed = events
            .replay_after(&first.to_string(), None)
            .await
            .expect("the stream resumes");
        let ids: Vec<EventId> = replayed.iter().map(|e| e.id.clone()).collect();
        assert_eq!(ids, sent, "every event keeps the id it was sent with");
        let payloads: Vec<&serde_json::Value> = replayed.iter().map(|e| &e.payload).collect();
        assert_eq!(
            payloads,
            [
                &serde_json::json!("a"),
                &serde_json::Value::Null,
                &serde_json::Value::Null,
                &serde_json::json!("b")
            ]
        );

        let synced = EventLog::new(
            Arc::new(store.clone()),
            Arc::new(store.clone()),
            EventLogConfig::default(),
        );
        let first = synced
            .append("synced", None, &serde_json::json!("first"))
            .await
            .expect("append");
        assert!(
            synced
                .append("synced", None, &serde_json::json!(oversized))
                .await
                .is_err()
        );
        assert!(matches!(
            synced.append_owned("synced", None, unencodable()).await,
            Err(Error::InvalidInput { .. })
        ));
        assert!(
            synced
                .replay_after(&first.to_string(), None)
                .await
                .expect("the stream resumes")
                .is_empty(),
            "nothing was stored"
        );
    }

    /// A pipelined stream new to this instance is numbered from what the
    /// backend says its log's next append gets, with no write before its
    /// first commit: neither its first event nor its metadata is stored
    /// until then (another instance does not know the stream yet), and then
    /// every event is stored under the number it was sent with, above those
    /// of a log of the same name left behind, with the stream's request.
    #[tokio::test(start_paused = true)]
    async fn a_new_pipelined_stream_writes_nothing_before_its_first_commit() {
        let store = MemoryStore::new();
        let name = log_name("left").expect("a log");
        // What a stream deleted halfway leaves: its log, not its metadata.
        let old = crate::records::encode_event(&serde_json::json!("old")).expect("encoded");
        store
            .append(&name, vec![old; 3], None)
            .await
            .expect("old records");
        let config = EventLogConfig::new(Duration::from_secs(600), 100).with_durability(
            EventDurability::Pipelined {
                window: Duration::from_secs(1),
            },
        );
        let events = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
        let request = serde_json::json!(9);
        let first = events
            .append_opening("left", None, &serde_json::Value::Null, &request)
            .await
            .expect("opening event");
        let second = events
            .append("left", None, &serde_json::json!("answer"))
            .await
            .expect("answer");
        assert_eq!((first.seq(), second.seq()), (4, 5));
        assert!(
            store
                .read_after(&name, 3, 10)
                .await
                .expect("read")
                .is_empty(),
            "the first event was written before the window"
        );
        assert!(
            store
                .get(&meta_key("left").expect("a key"))
                .await
                .expect("read")
                .is_none(),
            "the metadata was written before the window"
        );
        let other = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
        assert!(
            matches!(
                other.check(&first.to_string(), None).await,
                Err(Error::NotFound {
                    what: "event stream",
                    ..
                })
            ),
            "another instance knows the stream before its first commit"
        );
        // The writer's replay waits for the commit.
        let replayed = events
            .replay_after(&first.to_string(), None)
            .await
            .expect("replay on the writer");
        assert_eq!(
            replayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
            vec![second.clone()]
        );
        let seen = other
            .replay_after(&first.to_string(), None)
            .await
            .expect("replay elsewhere once committed");
        assert_eq!(
            seen.iter()
                .map(|e| (e.id.clone(), e.payload.clone()))
                .collect::<Vec<_>>(),
            vec![(second, serde_json::json!("answer"))]
        );
        assert_eq!(
            other
                .origin("left")
                .await
                .expect("origin")
                .and_then(|o| o.request),
            Some(request)
        );
    }

    /// A replay on the writing instance does not wait out the commit
    /// window: it has the stream's pending events committed at once and
    /// answers with them (it used to wait at most 5 s, whatever the window,
    /// and then answered as if the stream did not exist). Another instance
    /// sees them from then on; later events wait for the window again.
    #[tokio::test(start_paused = true)]
    async fn a_replay_on_the_writer_commits_at_once() {
        let store = MemoryStore::new();
        let window = Duration::from_secs(8);
        let config = EventLogConfig::new(Duration::from_secs(600), 100)
            .with_durability(EventDurability::Pipelined { window });
        let events = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
        let first = events
            .append_opening(
                "long",
                None,
                &serde_json::Value::Null,
                &serde_json::json!(3),
            )
            .await
            .expect("opening event");
        let second = events
            .append("long", None, &serde_json::json!("answer"))
            .await
            .expect("answer");
        let started = tokio::time::Instant::now();
        let replayed = events
            .replay_after(&first.to_string(), None)
            .await
            .expect("replay on the writer");
        assert_eq!(
            replayed.into_iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![second.clone()]
        );
        // Paused time moves only when every task waits on a timer: a
        // replay that waited for the window would have moved it 8 s.
        assert!(
            started.elapsed() < window,
            "the replay waited for the window"
        );
        let other = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
        assert_eq!(
            other
                .replay_after(&first.to_string(), None)
                .await
                .expect("committed for everyone")
                .len(),
            1
        );
        // The next event is committed a window later, as before.
        let third = events
            .append("long", None, &serde_json::json!("more"))
            .await
            .expect("more");
        tokio::time::sleep(window / 2).await;
        assert!(
            other
                .replay_after(&second.to_string(), None)
                .await
                .expect("replay")
                .is_empty(),
            "a later event was committed before its window"
        );
        tokio::time::sleep(window).await;
        assert_eq!(
            other
                .replay_after(&second.to_string(), None)
                .await
                .expect("replay")
                .into_iter()
                .map(|e| e.id)
                .collect::<Vec<_>>(),
            vec![third]
        );
    }

    /// What runs beside an opening event runs once, whatever becomes of the
    /// event: with its write, when it is refused (a bad stream id), and on
    /// a pipelined stream, whose first event is numbered here and committed
    /// later.
    #[tokio::test]
    async fn work_beside_an_opening_event_runs_once_whatever_becomes_of_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let store = MemoryStore::new();
        for durability in [
            EventDurability::Synced,
            EventDurability::Pipelined {
                window: Duration::from_millis(5),
            },
        ] {
            let config = EventLogConfig {
                durability,
                ..EventLogConfig::default()
            };
            let events = EventLog::new(Arc::new(store.clone()), Arc::new(store.clone()), config);
            let ran = Arc::new(AtomicUsize::new(0));
            let request = serde_json::json!(1);
            let beside = |ran: &Arc<AtomicUsize>| {
                let ran = ran.clone();
                let kv = store.clone();
                async move {
                    kv.put(
                        &Key::new("beside").expect("a key"),
                        b"x".to_vec(),
                        PutOptions::default(),
                    )
                    .await
                    .expect("put");
                    ran.fetch_add(1, Ordering::SeqCst);
                }
            };
            let stream =
                format!("opened-{durability:?}").replace(|c: char| !c.is_ascii_alphanumeric(), "-");
            let id = events
                .append_opening_beside(
                    &stream,
                    None,
                    &serde_json::Value::Null,
                    &request,
                    beside(&ran),
                )
                .await
                .expect("append");
            assert_eq!(ran.load(Ordering::SeqCst), 1, "{durability:?}");
            assert_eq!(
                events
                    .origin(&stream)
                    .await
                    .expect("origin")
                    .and_then(|o| o.request),
                Some(request.clone()),
                "the request is recorded with the stream"
            );
            let replayed = events.replay_after(&id.to_string(), None).await;
            assert!(replayed.is_ok(), "{durability:?}: {replayed:?}");

            let refused = events
                .append_opening_beside(
                    "bad stream id",
                    None,
                    &serde_json::Value::Null,
                    &request,
                    beside(&ran),
                )
                .await;
            assert!(refused.is_err(), "a stream id with spaces is refused");
            assert_eq!(ran.load(Ordering::SeqCst), 2, "it ran even so");
        }
    }
}
