//! Reading back: checking a `Last-Event-ID`, replaying after it, tailing a
//! stream that another instance writes.

use super::{Stored, read};
use crate::{
    Error, Result,
    records::{EventRecord, StreamMeta, decode},
    types::{EventId, SessionId},
};
use std::time::Duration;
use tracing::{debug, warn};

use super::token::parse_token;
use super::*;

impl EventLog {
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

    pub(super) async fn read_after(&self, id: &EventId, limit: usize) -> Result<Vec<StoredEvent>> {
        let name = log_name(id.stream())?;
        let records = self.log.read_after(&name, id.seq(), limit).await?;
        self.to_events(id, &name, records)
    }

    pub(super) fn to_events(
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
}
