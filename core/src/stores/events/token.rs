//! A stream's token and metadata: what makes its event ids its own, and
//! how a writer tells that its log started again.

use crate::retry::retry_cas;
use crate::stores::{Stored, read, write};
use crate::{
    Error, PutMode, Result, Secret,
    records::StreamMeta,
    types::{EventId, SessionId, Timestamp, hex, random_token},
};
use std::time::Duration;
use tracing::{debug, warn};

use super::*;

impl EventLog {
    pub(super) fn meta_ttl(&self) -> Duration {
        // Outlive the log a little: the log's TTL is refreshed by every
        // append, the metadata's only every quarter of the retention.
        self.config.retention + self.config.retention / 2
    }

    pub(super) fn cached(&self, stream: &str) -> Option<StreamCache> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .copied()
    }

    pub(super) fn cache(&self, stream: &str, entry: StreamCache) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.len() >= STREAM_CACHE_LIMIT && !streams.contains_key(stream) {
            // Streams quiet for a quarter of the retention are re-read on
            // their next append; nothing is lost by forgetting them.
            let fresh = self.config.retention / 4;
            let now = tokio::time::Instant::now();
            streams.retain(|_, c| now.duration_since(c.meta_refreshed) < fresh);
            // More streams than the limit were busy within that time (a
            // server starting hundreds of streams a second): forget the
            // least recently refreshed, down to half the limit, so the
            // cache stays bounded and this sweep runs once per half-limit
            // new streams, not on every one. A forgotten stream re-reads
            // its metadata at its next append.
            if streams.len() > STREAM_CACHE_LIMIT / 2 {
                let mut refreshed: Vec<tokio::time::Instant> =
                    streams.values().map(|c| c.meta_refreshed).collect();
                refreshed.sort_unstable();
                let keep_from = refreshed[refreshed.len() - STREAM_CACHE_LIMIT / 2];
                streams.retain(|_, c| c.meta_refreshed > keep_from);
            }
        }
        streams.insert(stream.to_owned(), entry);
    }

    /// The token of an existing `stream` and the highest sequence number
    /// known under it, from the cache or the stream's metadata (whose TTL
    /// this refreshes, with the number); `None` for a stream without
    /// metadata, whose first append creates it.
    pub(super) async fn stream_token(&self, stream: &str) -> Result<Option<([u8; 16], u64)>> {
        let now = tokio::time::Instant::now();
        if let Some(c) = self.cached(stream)
            && self.is_fresh(&c, now)
        {
            return Ok(Some((c.token, c.last_seq)));
        }
        self.read_stream_token(stream, now).await
    }

    /// Whether a cached token is recent enough to be used without reading
    /// (and refreshing) the stream's metadata.
    pub(super) fn is_fresh(&self, cached: &StreamCache, now: tokio::time::Instant) -> bool {
        now.duration_since(cached.meta_refreshed) < self.config.retention / 4
    }

    /// [`stream_token`](Self::stream_token) from the stream's metadata,
    /// whatever the cache holds.
    pub(super) async fn read_stream_token(
        &self,
        stream: &str,
        now: tokio::time::Instant,
    ) -> Result<Option<([u8; 16], u64)>> {
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
                    trimming: cached.map_or_else(Default::default, |c| c.trimming),
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
    pub(super) async fn settle(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
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
                self.renew(stream, session, None, Some(token), seq).await
            }
            None => self.renew(stream, session, request, None, seq).await,
        }
    }

    /// Creates the metadata of `stream` (at `key`) under a new token valid
    /// from `seq` on, and returns the token; `AlreadyExists` when another
    /// writer created it first.
    async fn create_meta(
        &self,
        key: &Key,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
        seq: u64,
    ) -> Result<[u8; 16]> {
        let token = random_token()?;
        let meta = self.new_meta(session, request, &token, seq);
        write(
            &*self.kv,
            key,
            &meta,
            PutMode::Create,
            Some(self.meta_ttl()),
        )
        .await?;
        debug!(stream, "new event stream");
        Ok(token)
    }

    /// Gives `stream` a new token valid from `seq` on, unless another writer
    /// already did (its metadata no longer holds `stale`, or exists although
    /// `stale` is `None`): then that writer's token, which covers `seq` too.
    pub(super) async fn renew(
        &self,
        stream: &str,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
        stale: Option<[u8; 16]>,
        seq: u64,
    ) -> Result<[u8; 16]> {
        let key = &meta_key(stream)?;
        let now = tokio::time::Instant::now();
        let token = retry_cas(key, 8, move || async move {
            // A stream that had no metadata when its first event was
            // numbered (every request's stream) is created without reading
            // it again; another writer that created it meanwhile is read
            // below.
            if stale.is_none() {
                match self.create_meta(key, stream, session, request, seq).await {
                    Ok(token) => return Ok((token, seq)),
                    Err(Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
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
                // Losing the race to create it: the next attempt reads the
                // winner's token.
                None => Ok((
                    self.create_meta(key, stream, session, request, seq).await?,
                    seq,
                )),
            }
        })
        .await?;
        // Marks made under another token name numbers of a log that started
        // again: they are dropped with it.
        let trimming = self
            .cached(stream)
            .filter(|c| c.token == token.0)
            .map_or_else(Default::default, |c| c.trimming);
        self.cache(
            stream,
            StreamCache {
                token: token.0,
                meta_refreshed: now,
                trimming,
                last_seq: token.1,
            },
        );
        Ok(token.0)
    }

    pub(super) fn new_meta(
        &self,
        session: Option<&SessionId>,
        request: Option<&serde_json::Value>,
        token: &[u8; 16],
        last_seq: u64,
    ) -> StreamMeta {
        StreamMeta {
            session: session.cloned(),
            token: Secret::new(hex(token)),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: self.writer.as_deref().map(str::to_owned),
            request: request.cloned(),
            last_seq,
        }
    }
}

pub(super) fn parse_token(key: &str, token: &str) -> Result<[u8; 16]> {
    let id = format!("{token}-0-x");
    id.parse::<EventId>()
        .map(|id| *id.token())
        .map_err(|_| Error::corrupt(key, "stream token is not 32 hex digits"))
}
