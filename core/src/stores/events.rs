use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tracing::{debug, warn};

use super::{Stored, read, write};
use crate::retry::retry_cas;
use crate::{
    Error, Key, KvStore, LogStore, PutMode, Result, Secret, declare,
    records::{EventRecord, StreamMeta, decode, encode},
    types::{EventId, SessionId, Timestamp, hex, random_token},
};

/// How many streams an instance caches the token of before pruning.
const STREAM_CACHE_LIMIT: usize = 10_000;

/// How long and how much of each SSE stream an [`EventLog`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventLogConfig {
    /// A stream is dropped once this long has passed since its last event.
    pub retention: Duration,
    /// At most about this many events are kept per stream; older ones are
    /// dropped (checked every half of this many appends).
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
    /// `window` later. Replays and tails on the writing instance first wait
    /// for that stream's pending appends, so a resuming client never sees a
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
    pending: Vec<(u64, Vec<u8>)>,
    /// Every event up to this number is committed (or known lost).
    committed_through: u64,
    /// A commit is scheduled or running.
    flushing: bool,
    /// Woken after every commit.
    committed: Arc<tokio::sync::Notify>,
    /// The metadata of a stream this instance started, written with its
    /// first commit.
    meta: Option<StreamMeta>,
    /// The session owning the stream.
    session: Option<SessionId>,
}

/// How a pipelined append goes on.
enum PipelinedStart {
    /// Numbered by this instance, under this token; with the metadata of a
    /// stream it starts, written with the first commit.
    Numbered([u8; 16], Option<StreamMeta>),
    /// Stored at once (the log started again under an existing stream),
    /// given the stream's token and the last number known under it.
    Restarted(([u8; 16], u64)),
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
    appends_since_trim: u64,
    /// The highest sequence number this instance knows the log reached
    /// under `token`: an append given a number not above it found the log
    /// started again (it expired, or was deleted, meanwhile).
    last_seq: u64,
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

    fn meta_ttl(&self) -> Duration {
        // Outlive the log a little: the log's TTL is refreshed by every
        // append, the metadata's only every quarter of the retention.
        self.config.retention + self.config.retention / 2
    }

    fn cached(&self, stream: &str) -> Option<StreamCache> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .copied()
    }

    fn cache(&self, stream: &str, entry: StreamCache) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.len() >= STREAM_CACHE_LIMIT {
            // Streams quiet for a quarter of the retention are re-read on
            // their next append; nothing is lost by forgetting them.
            let fresh = self.config.retention / 4;
            let now = tokio::time::Instant::now();
            streams.retain(|_, c| now.duration_since(c.meta_refreshed) < fresh);
        }
        streams.insert(stream.to_owned(), entry);
    }

    /// The token of an existing `stream` and the highest sequence number
    /// known under it, from the cache or the stream's metadata (whose TTL
    /// this refreshes, with the number); `None` for a stream without
    /// metadata, whose first append creates it.
    async fn stream_token(&self, stream: &str) -> Result<Option<([u8; 16], u64)>> {
        let now = tokio::time::Instant::now();
        if let Some(c) = self.cached(stream)
            && now.duration_since(c.meta_refreshed) < self.config.retention / 4
        {
            return Ok(Some((c.token, c.last_seq)));
        }
        let key = &meta_key(stream)?;
        retry_cas(key, 8, move || async move {
            let Some(Stored {
                mut record,
                version,
            }) = read::<StreamMeta>(&*self.kv, key).await?
            else {
                return Ok(None);
            };
            let token = parse_token(key, record.token.expose_secret())?;
            let cached = self.cached(stream).filter(|c| c.token == token);
            let mut last_seq = record.last_seq.max(cached.map_or(0, |c| c.last_seq));
            if last_seq == 0 {
                // A record written before the number was kept: the log's
                // first event bounds it; an empty log has expired (or never
                // held anything), so the next append takes a new token.
                last_seq = match self.log.read_after(&log_name(stream)?, 0, 1).await?.first() {
                    Some(first) => first.seq,
                    None => u64::MAX,
                };
            }
            if last_seq != u64::MAX {
                record.last_seq = last_seq;
            }
            // Refresh the metadata's TTL along with the log's; if another
            // writer refreshed it meanwhile, theirs does.
            match write(
                &*self.kv,
                key,
                &record,
                PutMode::Update(version),
                Some(self.meta_ttl()),
            )
            .await
            {
                Ok(_) | Err(Error::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
            self.cache(
                stream,
                StreamCache {
                    token,
                    meta_refreshed: now,
                    appends_since_trim: cached.map_or(0, |c| c.appends_since_trim),
                    last_seq,
                },
            );
            Ok(Some((token, last_seq)))
        })
        .await
    }

    /// The token `seq` (just appended to `stream`) is sent under, given what
    /// was `known` of the stream before the append:
    ///
    /// * a number above the last known: the known token;
    /// * a number not above it: the log started again (it expired or was
    ///   deleted while its metadata lived on), so the stream gets a new
    ///   token and no id sent before names an event of the new log;
    /// * no metadata before: it is created now, after the first append, with
    ///   the number, so that a later writer can tell a restarted log.
    async fn settle(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        known: Option<([u8; 16], u64)>,
        seq: u64,
    ) -> Result<[u8; 16]> {
        match known {
            Some((token, last)) if seq > last => {
                let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = streams.get_mut(stream)
                    && c.token == token
                {
                    c.last_seq = c.last_seq.max(seq);
                }
                Ok(token)
            }
            Some((token, last)) => {
                warn!(
                    stream,
                    seq, last, "the event log started again; the stream gets a new token"
                );
                self.renew(stream, session, Some(token), seq).await
            }
            None => self.renew(stream, session, None, seq).await,
        }
    }

    /// Gives `stream` a new token valid from `seq` on, unless another writer
    /// already did (its metadata no longer holds `stale`, or exists although
    /// `stale` is `None`): then that writer's token, which covers `seq` too.
    async fn renew(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        stale: Option<[u8; 16]>,
        seq: u64,
    ) -> Result<[u8; 16]> {
        let key = &meta_key(stream)?;
        let now = tokio::time::Instant::now();
        let token = retry_cas(key, 8, move || async move {
            match read::<StreamMeta>(&*self.kv, key).await? {
                Some(Stored { record, .. })
                    if stale.is_none_or(|s| {
                        parse_token(key, record.token.expose_secret()).is_ok_and(|t| t != s)
                    }) =>
                {
                    // Another writer started (or restarted) the stream since:
                    // this append went to the same log after it.
                    let token = parse_token(key, record.token.expose_secret())?;
                    Ok((token, record.last_seq.max(seq)))
                }
                Some(Stored {
                    mut record,
                    version,
                }) => {
                    let token = random_token()?;
                    record.token = Secret::new(hex(&token));
                    record.last_seq = seq;
                    record.dropped_through = 0;
                    record.created_at = Timestamp::now();
                    write(
                        &*self.kv,
                        key,
                        &record,
                        PutMode::Update(version),
                        Some(self.meta_ttl()),
                    )
                    .await?;
                    Ok((token, seq))
                }
                None => {
                    let token = random_token()?;
                    let meta = self.new_meta(session, &token, seq);
                    // Losing the race to create it: the next attempt reads
                    // the winner's token.
                    write(
                        &*self.kv,
                        key,
                        &meta,
                        PutMode::Create,
                        Some(self.meta_ttl()),
                    )
                    .await?;
                    debug!(stream, "new event stream");
                    Ok((token, seq))
                }
            }
        })
        .await?;
        let appends = self.cached(stream).map_or(0, |c| c.appends_since_trim);
        self.cache(
            stream,
            StreamCache {
                token: token.0,
                meta_refreshed: now,
                appends_since_trim: appends,
                last_seq: token.1,
            },
        );
        Ok(token.0)
    }

    fn new_meta(&self, session: Option<&SessionId>, token: &[u8; 16], last_seq: u64) -> StreamMeta {
        StreamMeta {
            session: session.cloned(),
            token: Secret::new(hex(token)),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: self.writer.as_deref().map(str::to_owned),
            request: None,
            last_seq,
        }
    }

    /// Stores one event of `stream` (owned by `session`, when the server has
    /// sessions) and returns its id. Committed before it returns.
    pub async fn append(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        payload: &serde_json::Value,
    ) -> Result<EventId> {
        crate::types::check_visible_ascii("stream id", stream, crate::types::MAX_STREAM_ID_BYTES)?;
        let data = encode(&EventRecord {
            payload: payload.clone(),
        })?;
        if let EventDurability::Pipelined { window } = self.config.durability {
            match self.pipelined_token(stream, session).await? {
                PipelinedStart::Numbered(token, new_meta) => {
                    let seq = self
                        .pipeline(stream, data, session, window, new_meta)
                        .await?;
                    return Ok(EventId::new(token, seq, stream));
                }
                // The first event of a log that started again is stored at
                // once, as a synchronous one is: its number is the
                // backend's, which may start again or go on above the old
                // ones, and the stream's next events are numbered on from it.
                PipelinedStart::Restarted(known) => {
                    return self.append_now(stream, session, Some(known), data).await;
                }
            }
        }
        let known = self.stream_token(stream).await?;
        self.append_now(stream, session, known, data).await
    }

    /// Stores one event of `stream` at once, given what was `known` of the
    /// stream before (see [`settle`](Self::settle)).
    async fn append_now(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        known: Option<([u8; 16], u64)>,
        data: Vec<u8>,
    ) -> Result<EventId> {
        let log = log_name(stream)?;
        let retention = Some(self.config.retention);
        let seqs = if self.config.durability == EventDurability::Written {
            self.log
                .append_unsynced(&log, vec![data], retention)
                .await?
        } else {
            self.log.append(&log, vec![data], retention).await?
        };
        let seq = *seqs.first().ok_or_else(|| {
            Error::backend(
                self.log.backend_name(),
                "append returned no sequence number",
            )
        })?;
        let token = self.settle(stream, session, known, seq).await?;
        self.after_append(stream).await;
        Ok(EventId::new(token, seq, stream))
    }

    /// The token of `stream` for a pipelined append. A stream new to the
    /// store gets its token here and its metadata with its first commit
    /// (returned for [`pipeline`](Self::pipeline) to schedule), so starting
    /// a stream costs no synchronous write either.
    async fn pipelined_token(
        &self,
        stream: &str,
        session: Option<&SessionId>,
    ) -> Result<PipelinedStart> {
        if let Some((token, last)) = self.stream_token(stream).await? {
            let piped = self
                .pipes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(stream);
            if piped {
                // This instance numbers the stream; a log that started again
                // under it is found by the commit (stored under lower
                // numbers than sent).
                return Ok(PipelinedStart::Numbered(token, None));
            }
            // This instance continues a stream another one (or an earlier
            // run) wrote, numbering on from what is stored: a log holding
            // less than the token is known to have reached expired or was
            // deleted while the metadata lived on, and numbering on from
            // what it holds would hand the old token's numbers to new
            // events.
            let stored = self.last_stored_seq(stream).await?;
            if stored < last {
                return Ok(PipelinedStart::Restarted((token, last)));
            }
            return Ok(PipelinedStart::Numbered(token, None));
        }
        let token = random_token()?;
        let meta = self.new_meta(session, &token, 0);
        self.cache(
            stream,
            StreamCache {
                token,
                meta_refreshed: tokio::time::Instant::now(),
                appends_since_trim: 0,
                last_seq: 0,
            },
        );
        debug!(stream, "new pipelined event stream");
        Ok(PipelinedStart::Numbered(token, Some(meta)))
    }

    /// Assigns the next number of `stream` to `data` and schedules its
    /// commit within `window`.
    async fn pipeline(
        &self,
        stream: &str,
        data: Vec<u8>,
        session: Option<&SessionId>,
        window: Duration,
        mut new_meta: Option<StreamMeta>,
    ) -> Result<u64> {
        let known = self
            .pipes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(stream);
        if !known {
            // First event of this stream here: continue after what is stored
            // (nothing, for a stream that starts now).
            let last = match &new_meta {
                Some(_) => 0,
                None => self.last_stored_seq(stream).await?,
            };
            // A stored number at the end of the range is damage (a crafted
            // or corrupted log), never a reason to wrap or panic.
            let next_seq = last.checked_add(1).ok_or_else(|| {
                warn!(
                    stream,
                    "the stored event log ends at the largest sequence number"
                );
                Error::corrupt(
                    log_name(stream).map_or_else(|_| stream.to_owned(), String::from),
                    format!("the last stored sequence number {last} has no successor"),
                )
            })?;
            self.pipes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(stream.to_owned())
                .or_insert_with(|| Pipe {
                    next_seq,
                    pending: Vec::new(),
                    committed_through: last,
                    flushing: false,
                    committed: Arc::default(),
                    meta: new_meta.take(),
                    session: session.cloned(),
                });
        }
        let (seq, schedule) = {
            let mut pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
            let pipe = pipes.get_mut(stream).ok_or_else(|| {
                Error::backend(self.log.backend_name(), "pipeline state vanished")
            })?;
            if known && let Some(meta) = new_meta {
                // The stream's metadata went (it expired or was deleted)
                // while this instance kept writing: the next commit writes
                // the new token's.
                pipe.meta = Some(meta);
            }
            let seq = pipe.next_seq;
            pipe.next_seq = seq
                .checked_add(1)
                .ok_or_else(|| Error::corrupt(stream, "the stream's sequence number overflowed"))?;
            pipe.pending.push((seq, data));
            let schedule = !pipe.flushing;
            pipe.flushing = true;
            (seq, schedule)
        };
        if schedule {
            let log = self.clone();
            let stream = stream.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                log.commit_pending(&stream).await;
            });
        }
        Ok(seq)
    }

    /// The number of the last event stored for `stream` (0 when none).
    async fn last_stored_seq(&self, stream: &str) -> Result<u64> {
        let name = log_name(stream)?;
        let mut after = 0;
        loop {
            let records = self.log.read_after(&name, after, 1024).await?;
            match records.last() {
                Some(last) => after = last.seq,
                None => return Ok(after),
            }
        }
    }

    /// Commits every pending event of `stream` in one append, then again
    /// while more came meanwhile.
    async fn commit_pending(&self, stream: &str) {
        loop {
            let batch = {
                let mut pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
                let Some(pipe) = pipes.get_mut(stream) else {
                    return;
                };
                if pipe.pending.is_empty() {
                    pipe.flushing = false;
                    pipe.committed.notify_waiters();
                    return;
                }
                (
                    std::mem::take(&mut pipe.pending),
                    pipe.meta.take(),
                    pipe.session.clone(),
                )
            };
            let (batch, meta, session) = batch;
            let expected: Vec<u64> = batch.iter().map(|(seq, _)| *seq).collect();
            let last = expected.last().copied().unwrap_or_default();
            let data: Vec<Vec<u8>> = batch.into_iter().map(|(_, d)| d).collect();
            let outcome = match log_name(stream) {
                Ok(name) => {
                    self.log
                        .append(&name, data, Some(self.config.retention))
                        .await
                }
                Err(e) => Err(e),
            };
            let stored = outcome
                .as_ref()
                .ok()
                .and_then(|seqs| Some((*seqs.first()?, *seqs.last()?)));
            // A new stream's metadata follows its first events, carrying the
            // last number, as a synchronous append's does.
            if let Some(mut meta) = meta
                && let Some((_, stored_last)) = stored
                && let Ok(key) = meta_key(stream)
            {
                meta.last_seq = stored_last;
                if let Err(e) = write(
                    &*self.kv,
                    &key,
                    &meta,
                    PutMode::Create,
                    Some(self.meta_ttl()),
                )
                .await
                {
                    warn!(stream, error = %e, "writing a pipelined stream's metadata failed; its events cannot be resumed");
                }
            }
            // Numbers below those sent: the log started again (it expired
            // or was deleted meanwhile). The ids sent name events that were
            // never stored under those numbers; a new token keeps them from
            // naming the new log's, so they are refused as lost.
            if let Some((first, stored_last)) = stored
                && expected.first().is_some_and(|sent| first < *sent)
                && let Some(cached) = self.cached(stream)
                && let Err(e) = self
                    .renew(stream, session.as_ref(), Some(cached.token), stored_last)
                    .await
            {
                warn!(stream, error = %e, "could not give a restarted event log a new token");
            }
            // What the log reached, for the metadata's next refresh to keep:
            // a writer that finds the log below it knows it started again.
            if let Some((_, stored_last)) = stored
                && let Some(c) = self
                    .streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(stream)
            {
                c.last_seq = c.last_seq.max(stored_last);
            }
            let mut pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
            let Some(pipe) = pipes.get_mut(stream) else {
                return;
            };
            match outcome {
                Ok(seqs) if seqs == expected => {}
                Ok(seqs) => {
                    // Another writer appended to this stream: the numbers
                    // sent no longer match the stored ones. Continue after
                    // what the backend assigned; replays refuse the gap.
                    warn!(
                        stream,
                        ?expected,
                        ?seqs,
                        "pipelined events were stored under other numbers than sent"
                    );
                    if let Some(stored_last) = seqs.last() {
                        pipe.next_seq = if seqs.first() < expected.first() {
                            stored_last.saturating_add(1)
                        } else {
                            pipe.next_seq.max(stored_last.saturating_add(1))
                        };
                    }
                    pipe.committed_through = pipe.next_seq.saturating_sub(1);
                }
                Err(e) => {
                    warn!(stream, error = %e, events = expected.len(), "committing pipelined events failed; they are lost")
                }
            }
            pipe.committed_through = pipe.committed_through.max(last);
            pipe.committed.notify_waiters();
        }
    }

    /// Waits until every event this instance sent for `stream` up to now is
    /// committed (no-op unless pipelined).
    async fn flushed(&self, stream: &str) {
        if !matches!(self.config.durability, EventDurability::Pipelined { .. }) {
            return;
        }
        loop {
            let notify = {
                let pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
                let Some(pipe) = pipes.get(stream) else {
                    return;
                };
                if pipe.committed_through >= pipe.next_seq.saturating_sub(1) {
                    return;
                }
                pipe.committed.clone()
            };
            let waiting = notify.notified();
            // Re-check after registering, so a commit in between is not missed.
            {
                let pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
                if pipes
                    .get(stream)
                    .is_none_or(|p| p.committed_through >= p.next_seq.saturating_sub(1))
                {
                    return;
                }
            }
            if tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .is_err()
            {
                warn!(
                    stream,
                    "pipelined events still uncommitted after 5 s; reading what is stored"
                );
                return;
            }
        }
    }

    async fn after_append(&self, stream: &str) {
        let due = {
            let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            let Some(c) = streams.get_mut(stream) else {
                return;
            };
            c.appends_since_trim += 1;
            if c.appends_since_trim >= (self.config.max_events_per_stream / 2).max(1) {
                c.appends_since_trim = 0;
                true
            } else {
                false
            }
        };
        if due && let Err(e) = self.enforce_length(stream).await {
            warn!(stream, error = %e, "could not trim event stream to its retention length");
        }
    }

    async fn enforce_length(&self, stream: &str) -> Result<()> {
        let name = log_name(stream)?;
        let records = self.log.read_after(&name, 0, usize::MAX).await?;
        let max = usize::try_from(self.config.max_events_per_stream).unwrap_or(usize::MAX);
        if records.len() <= max {
            return Ok(());
        }
        let first_kept = records[records.len() - max].seq;
        let last_dropped = records[records.len() - max - 1].seq;
        // Record the bound before dropping, so a replay never silently skips.
        let key = &meta_key(stream)?;
        let recorded = retry_cas(key, 8, move || async move {
            let Some(Stored {
                mut record,
                version,
            }) = read::<StreamMeta>(&*self.kv, key).await?
            else {
                return Ok(false);
            };
            record.dropped_through = record.dropped_through.max(last_dropped);
            write(
                &*self.kv,
                key,
                &record,
                PutMode::Update(version),
                Some(self.meta_ttl()),
            )
            .await?;
            Ok(true)
        })
        .await?;
        if !recorded {
            // The stream has expired meanwhile: nothing to trim.
            return Ok(());
        }
        let dropped = self.log.trim(&name, first_kept).await?;
        debug!(stream, dropped, "trimmed event stream");
        Ok(())
    }

    /// Checks a `Last-Event-ID` sent by a client of `session` (None on a
    /// server without sessions) and returns it parsed.
    ///
    /// * malformed: [`Error::InvalidInput`];
    /// * unknown stream, expired stream, or a forged token:
    ///   [`Error::NotFound`] (the three are not told apart, so ids cannot be
    ///   probed);
    /// * a stream of another session, a session's stream asked for without a
    ///   session, or a sessionless stream asked for within a session:
    ///   [`Error::InvalidInput`];
    /// * events after the id already dropped by retention: [`Error::NotFound`]
    ///   with `what: "events"`.
    pub async fn check(&self, last_event_id: &str, session: Option<&SessionId>) -> Result<EventId> {
        let id: EventId = last_event_id.parse()?;
        // On the writing instance, pipelined events (and a new stream's
        // metadata) are committed before they are looked at.
        self.flushed(id.stream()).await;
        let key = meta_key(id.stream())?;
        let unknown = || Error::NotFound {
            what: "event stream",
            detail: Some("the stream has expired or never existed".into()),
        };
        let Some(Stored { record: meta, .. }) = read::<StreamMeta>(&*self.kv, &key).await? else {
            return Err(unknown());
        };
        if parse_token(&key, meta.token.expose_secret())? != *id.token() {
            warn!(
                stream = id.stream(),
                "event id with a wrong token: forged or from an expired stream"
            );
            return Err(unknown());
        }
        // Ownership is exact: a session's stream is resumable only in that
        // session, and a stream recorded without a session only by a request
        // naming none. A request without a session never reaches a session's
        // events, and a session never reaches sessionless ones.
        if meta.session.as_ref() != session {
            warn!(
                stream = id.stream(),
                "event id of a stream owned by another session (or by none)"
            );
            return Err(Error::invalid(
                "event id",
                "it names a stream of another session",
            ));
        }
        if id.seq() < meta.dropped_through {
            return Err(Error::NotFound {
                what: "events",
                detail: Some("events after this id were dropped by retention".into()),
            });
        }
        // The id's own event must still be stored: if it is not, the log
        // expired (or was deleted) while the metadata lived on, and what
        // follows the id is gone; with pipelined events, it may also have
        // been sent and lost with the instance that wrote it. Either way the
        // later events cannot be told complete, so the id is refused rather
        // than answered with a gap.
        // (The last event dropped by retention need not be: what follows it
        // is known complete.)
        if id.seq() > meta.dropped_through {
            let name = log_name(id.stream())?;
            let found = self.log.read_after(&name, id.seq() - 1, 1).await?;
            if found.first().is_none_or(|r| r.seq != id.seq()) {
                let detail = if matches!(self.config.durability, EventDurability::Pipelined { .. })
                {
                    "events up to this id were lost: the instance writing them stopped before committing them; re-issue the request"
                } else {
                    "the events of this stream up to this id have expired"
                };
                return Err(Error::NotFound {
                    what: "events",
                    detail: Some(detail.into()),
                });
            }
        }
        Ok(id)
    }

    /// Every stored event of the id's stream after `last_event_id`, in order,
    /// with original ids, after the same checks as [`check`](EventLog::check).
    pub async fn replay_after(
        &self,
        last_event_id: &str,
        session: Option<&SessionId>,
    ) -> Result<Vec<StoredEvent>> {
        let id = self.check(last_event_id, session).await?;
        let events = self.read_after(&id, usize::MAX).await?;
        debug!(
            stream = id.stream(),
            after = id.seq(),
            replayed = events.len(),
            "replayed events"
        );
        Ok(events)
    }

    async fn read_after(&self, id: &EventId, limit: usize) -> Result<Vec<StoredEvent>> {
        let name = log_name(id.stream())?;
        let records = self.log.read_after(&name, id.seq(), limit).await?;
        self.to_events(id, &name, records)
    }

    fn to_events(
        &self,
        id: &EventId,
        name: &str,
        records: Vec<crate::LogRecord>,
    ) -> Result<Vec<StoredEvent>> {
        records
            .into_iter()
            .map(|r| {
                let event: EventRecord = decode(&format!("{name}#{}", r.seq), &r.data)?;
                Ok(StoredEvent {
                    id: EventId::new(*id.token(), r.seq, id.stream()),
                    payload: event.payload,
                })
            })
            .collect()
    }

    /// Waits up to `timeout` for events of the stream after `after` (an id
    /// returned by [`check`](EventLog::check), a replay, or an earlier
    /// tail), including events another instance appends meanwhile. Empty if
    /// none came.
    pub async fn tail(&self, after: &EventId, timeout: Duration) -> Result<Vec<StoredEvent>> {
        self.flushed(after.stream()).await;
        let name = log_name(after.stream())?;
        let records = self
            .log
            .wait_after(&name, after.seq(), 1024, timeout)
            .await?;
        self.to_events(after, &name, records)
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

fn parse_token(key: &str, token: &str) -> Result<[u8; 16]> {
    let id = format!("{token}-0-x");
    id.parse::<EventId>()
        .map(|id| *id.token())
        .map_err(|_| Error::corrupt(key, "stream token is not 32 hex digits"))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::{Backend, LogRecord, MemoryStore, PutOptions};

    /// A memory log that notes, when a log is deleted, whether the stream's
    /// metadata was still there.
    struct Watching {
        store: MemoryStore,
        meta_left_at_log_deletion: Mutex<Vec<bool>>,
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

    #[tokio::test]
    async fn deleting_a_stream_drops_its_metadata_before_its_log() {
        let store = MemoryStore::new();
        let log = Arc::new(Watching {
            store: store.clone(),
            meta_left_at_log_deletion: Mutex::default(),
        });
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
}
