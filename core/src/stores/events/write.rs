//! Writing events: at once, or pipelined and committed in groups; and the
//! length retention that trims a stream after its appends.

use crate::retry::retry_cas;
use crate::stores::{Stored, read, write};
use crate::{
    Error, PutMode, Result,
    records::StreamMeta,
    types::{EventId, SessionId, random_token},
};
use std::{sync::Arc, task::Poll, time::Duration};
use tracing::{debug, warn};

use super::*;

/// Runs `first` and `beside` together, polling `first` first each time, so
/// that both hand their writes to the backend in the same poll; returns
/// `first`'s output once both are done.
async fn alongside<T>(first: impl Future<Output = T>, mut beside: Option<Beside<'_>>) -> T {
    let mut first = std::pin::pin!(first);
    let mut output = None;
    std::future::poll_fn(|cx| {
        if output.is_none()
            && let Poll::Ready(done) = first.as_mut().poll(cx)
        {
            output = Some(done);
        }
        if let Some(work) = beside.as_mut()
            && work.as_mut().poll(cx).is_ready()
        {
            beside = None;
        }
        match (beside.is_none(), output.take()) {
            (true, Some(done)) => Poll::Ready(done),
            (_, kept) => {
                output = kept;
                Poll::Pending
            }
        }
    })
    .await
}

/// The bytes a pipelined event is committed as: its record, or, when it
/// does not encode or is over the backend's `limit`, an empty event in its
/// place, so that the events committed with it keep the numbers they were
/// sent under and are not lost with it.
fn committable(stream: &str, seq: u64, payload: Payload, limit: usize) -> Vec<u8> {
    let why = match payload.encode() {
        Ok(data) if data.len() <= limit => return data,
        Ok(data) => format!(
            "its record is {} bytes, over the limit of {limit}",
            data.len()
        ),
        Err(e) => e.to_string(),
    };
    tracing::error!(
        stream,
        seq,
        why,
        "a pipelined event cannot be stored; it is stored empty, and a client resuming the stream does not get it again"
    );
    // `()` is `null`, as a priming event's payload: its record always
    // encodes, and the fallback is never taken.
    crate::records::encode_event(&()).unwrap_or_default()
}

impl EventLog {
    /// Stores one event of `stream` at once, given what was `known` of the
    /// stream before (see [`settle`](Self::settle)).
    pub(super) async fn append_now(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
        known: Option<([u8; 16], u64)>,
        data: Vec<u8>,
        beside: &mut Option<Beside<'_>>,
    ) -> Result<EventId> {
        let log = log_name(stream)?;
        let retention = Some(self.config.retention);
        let appending = async {
            if self.config.durability == EventDurability::Written {
                self.log.append_unsynced(&log, vec![data], retention).await
            } else {
                self.log.append(&log, vec![data], retention).await
            }
        };
        let seqs = alongside(appending, beside.take()).await?;
        let seq = *seqs.first().ok_or_else(|| {
            Error::backend(
                self.log.backend_name(),
                "append returned no sequence number",
            )
        })?;
        let token = match known {
            // The way nearly every event goes: the stream is known and the
            // number above its last, so the token stands. Its number and
            // its count towards trimming are noted under one lock.
            Some((token, last)) if seq > last => {
                self.after_append_numbered(stream, &seqs, Some(token)).await;
                token
            }
            _ => {
                let token = self.settle(stream, session, request, known, seq).await?;
                self.after_append(stream, &seqs).await;
                token
            }
        };
        Ok(EventId::new(token, seq, stream))
    }

    /// The token of `stream` for a pipelined append. A stream new to this
    /// instance is numbered from the number the backend says its log's
    /// next append gets, under a new token whose metadata (recording
    /// `request`) goes with the first commit; on a backend that cannot say
    /// without writing, its first event is stored at once (one synchronous
    /// write per stream), so that every number it sends is the one stored.
    /// A stream whose metadata went while this instance writes it gets a
    /// new token here and its metadata with the next commit (returned for
    /// [`pipeline`](Self::pipeline) to schedule).
    pub(super) async fn pipelined_token(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
    ) -> Result<PipelinedStart> {
        let now = tokio::time::Instant::now();
        let (known, next) = match self.cached(stream) {
            Some(c) if self.is_fresh(&c, now) => (Some((c.token, c.last_seq)), None),
            Some(_) => (self.read_stream_token(stream, now).await?, None),
            // A stream this instance does not know: its metadata and its
            // log's next number are read at once, the number to serve
            // should there be no metadata (every request's new stream).
            None => {
                let name = log_name(stream)?;
                let (known, next) = tokio::join!(
                    self.read_stream_token(stream, now),
                    self.log.next_seq(&name)
                );
                (known?, Some(next))
            }
        };
        if let Some((token, last)) = known {
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
                return Ok(PipelinedStart::AtOnce(Some((token, last))));
            }
            return Ok(PipelinedStart::Numbered(token, None));
        }
        let piped = self
            .pipes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(stream);
        if !piped {
            // A stream new to this instance. Numbering it from 1 would be
            // wrong on a backend that goes on above the numbers of an
            // expired log of the same name (Postgres, the file store,
            // SQLite until it sweeps), so it is numbered from what the
            // backend says its next append gets; the commit finds a log
            // that moved meanwhile, as for any pipelined event.
            let next = match next {
                Some(read) => read?,
                None => self.log.next_seq(&log_name(stream)?).await?,
            };
            if let Some(first) = next
                && let Some(last) = first.checked_sub(1)
            {
                debug!(
                    stream,
                    first,
                    "new pipelined event stream: numbered here from the backend's next number"
                );
                return self.numbered_afresh(stream, session, request, last);
            }
            // The backend cannot tell without writing: the first event is
            // stored at once and numbered by the backend.
            debug!(
                stream,
                "new pipelined event stream: first event stored at once"
            );
            return Ok(PipelinedStart::AtOnce(None));
        }
        // The stream's metadata went (it expired, or was deleted) while this
        // instance kept writing it: a new token, written with the next commit.
        debug!(
            stream,
            "stream metadata gone while this instance writes it: a new token"
        );
        self.numbered_afresh(stream, session, None, 0)
    }

    /// A new token for `stream`, cached, valid above `last`, numbered by
    /// this instance; its metadata (with `request`) goes with the next
    /// commit.
    fn numbered_afresh(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
        last: u64,
    ) -> Result<PipelinedStart> {
        let token = random_token()?;
        let meta = self.new_meta(session, request, &token, last);
        self.cache(
            stream,
            StreamCache {
                token,
                meta_refreshed: tokio::time::Instant::now(),
                trimming: Trimming::default(),
                last_seq: last,
            },
        );
        Ok(PipelinedStart::Numbered(token, Some(meta)))
    }

    /// Assigns the next number of `stream` to `data` and schedules its
    /// commit within `window`.
    pub(super) async fn pipeline(
        &self,
        stream: &str,
        data: Payload,
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
            // First event of this stream here: continue after what is stored,
            // or, for a stream that starts now, after the number its new
            // metadata starts from.
            let last = match &new_meta {
                Some(meta) => meta.last_seq,
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
                    hurry: Arc::default(),
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
            let schedule = (!pipe.flushing).then(|| pipe.hurry.clone());
            pipe.flushing = true;
            (seq, schedule)
        };
        if let Some(hurry) = schedule {
            let log = self.clone();
            let stream = stream.to_owned();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(window) => {}
                    () = hurry.notified() => {}
                }
                log.commit_pending(&stream).await;
            });
        }
        Ok(seq)
    }

    /// The number of the last event stored for `stream` (0 when none).
    pub(super) async fn last_stored_seq(&self, stream: &str) -> Result<u64> {
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
    pub(super) async fn commit_pending(&self, stream: &str) {
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
            let limit = self.log.max_record_bytes();
            let data: Vec<Vec<u8>> = batch
                .into_iter()
                .map(|(seq, payload)| committable(stream, seq, payload, limit))
                .collect();
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
                    .renew(
                        stream,
                        session.as_ref(),
                        None,
                        Some(cached.token),
                        stored_last,
                    )
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
            let stored_seqs = outcome.as_ref().ok().cloned();
            {
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
            // Kept to its length like a synchronous stream, once the events
            // that waited for this commit have been told.
            if let Some(seqs) = stored_seqs {
                self.after_append(stream, &seqs).await;
            }
        }
    }

    /// Waits until every event this instance sent for `stream` up to now is
    /// committed (no-op unless pipelined), cutting the scheduled commit's
    /// window short; should the commit not come, at most the window and 5 s
    /// more.
    pub(super) async fn flushed(&self, stream: &str) {
        let EventDurability::Pipelined { window } = self.config.durability else {
            return;
        };
        // A commit is due a window after the first event waiting for it; a
        // wait shorter than the window (it was 5 s whatever the window) gave
        // up on commits that were on time, and answered a resume on the
        // writing instance as if its events had never been sent.
        let patience = window.saturating_add(Duration::from_secs(5));
        loop {
            let notify = {
                let pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
                let Some(pipe) = pipes.get(stream) else {
                    return;
                };
                if pipe.committed_through >= pipe.next_seq.saturating_sub(1) {
                    return;
                }
                // The commit is scheduled (or running): it need not wait
                // out its window for a reader waiting here. A permit left
                // for a commit that had already started only cuts the next
                // one's window short.
                pipe.hurry.notify_one();
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
            if tokio::time::timeout(patience, waiting).await.is_err() {
                warn!(
                    stream,
                    waited_ms = patience.as_millis() as u64,
                    "pipelined events still uncommitted after their window and 5 s; reading what is stored"
                );
                return;
            }
        }
    }

    /// Counts the events just stored in `stream` under `seqs`, and trims
    /// the stream when that is due.
    pub(super) async fn after_append(&self, stream: &str, seqs: &[u64]) {
        self.after_append_numbered(stream, seqs, None).await;
    }

    /// [`after_append`](Self::after_append) for events numbered under
    /// `token`, when that token stands (see [`settle`](Self::settle)): the
    /// stream's last number known goes up to theirs in the same lock.
    async fn after_append_numbered(&self, stream: &str, seqs: &[u64], token: Option<[u8; 16]>) {
        let due = {
            let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            let Some(c) = streams.get_mut(stream) else {
                return;
            };
            if let (Some(token), Some(&last)) = (token, seqs.last())
                && c.token == token
            {
                c.last_seq = c.last_seq.max(last);
            }
            c.trimming
                .counted(seqs, &self.config)
                .map(|due| (due, c.token))
        };
        if let Some((due, token)) = due
            && let Err(e) = self.enforce_length(stream, token, due).await
        {
            warn!(stream, error = %e, "could not trim event stream to its retention length");
        }
    }

    /// Drops the oldest events of `stream` (under `token`) as `due` says
    /// (see `Trimming`): the log is read only to place the marks.
    async fn enforce_length(&self, stream: &str, token: [u8; 16], due: TrimDue) -> Result<()> {
        let name = log_name(stream)?;
        let through = match due {
            TrimDue::Through(through) => through,
            TrimDue::Read => {
                let seqs: Vec<u64> = self
                    .log
                    .read_after(&name, 0, usize::MAX)
                    .await?
                    .iter()
                    .map(|r| r.seq)
                    .collect();
                {
                    let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(c) = streams.get_mut(stream)
                        && c.token == token
                    {
                        c.trimming.place(&seqs, &self.config);
                    }
                }
                let max =
                    usize::try_from(self.config.max_events_per_stream.max(1)).unwrap_or(usize::MAX);
                match seqs.len().checked_sub(max.saturating_add(1)) {
                    Some(last_dropped) => seqs[last_dropped],
                    None => return Ok(()),
                }
            }
        };
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
            if record.dropped_through >= through {
                return Ok(true);
            }
            record.dropped_through = through;
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
        let dropped = self.log.trim(&name, through.saturating_add(1)).await?;
        debug!(stream, dropped, "trimmed event stream");
        Ok(())
    }
}
