use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tracing::debug;

use super::{read, write};
use crate::retry::retry_cas;
use crate::{
    Error, Key, KvStore, PutMode, Result, declare,
    records::ServerSession,
    types::{SessionId, Timestamp},
};

/// How many sessions' last touch an instance remembers before pruning.
const TOUCH_CACHE_LIMIT: usize = 10_000;

/// Server-side sessions, restorable on any instance, expiring after an idle
/// TTL.
///
/// Every write refreshes the TTL. [`touch`](ServerSessionStore::touch) is
/// coalesced: it writes at most once per `touch_interval` per session and
/// instance, so a busy session costs no write per request. By default it
/// still reads the session every time, so a session ended anywhere (a
/// `DELETE` on another instance, or the idle TTL) is gone everywhere at once;
/// see [`with_strict_liveness`](ServerSessionStore::with_strict_liveness).
#[derive(Clone)]
pub struct ServerSessionStore {
    kv: Arc<dyn KvStore>,
    idle_ttl: Duration,
    touch_interval: Duration,
    /// Check the session exists on every touch, not once per interval.
    strict: bool,
    last_touch: Arc<Mutex<HashMap<SessionId, tokio::time::Instant>>>,
}

impl std::fmt::Debug for ServerSessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSessionStore")
            .field("backend", &self.kv.backend_name())
            .field("idle_ttl", &self.idle_ttl)
            .finish()
    }
}

impl ServerSessionStore {
    /// A store over `kv` whose sessions expire after `idle_ttl` without use.
    /// Touches are coalesced to one write per tenth of the TTL; each still
    /// reads the session (strict liveness, the default).
    pub fn new(kv: Arc<dyn KvStore>, idle_ttl: Duration) -> Self {
        ServerSessionStore {
            kv,
            idle_ttl,
            touch_interval: idle_ttl / 10,
            strict: true,
            last_touch: Arc::default(),
        }
    }

    /// With `strict` (the default), every [`touch`](ServerSessionStore::touch)
    /// reads the session (one store read per use), so a session deleted by
    /// another instance is gone here at once; the write that extends the TTL
    /// stays coalesced. With `false`, a touch within the coalescing interval
    /// reads nothing: an instance that holds a session notices a delete
    /// elsewhere only at its next coalesced write, up to a tenth of the idle
    /// TTL later.
    pub fn with_strict_liveness(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The idle TTL.
    pub fn idle_ttl(&self) -> Duration {
        self.idle_ttl
    }

    fn key(id: &SessionId) -> Result<Key> {
        declare::SERVER_SESSION.try_key(&[id.as_str()])
    }

    /// Stores a new session; [`Error::AlreadyExists`] if the id is taken.
    pub async fn create(&self, session: &ServerSession) -> Result<()> {
        write(
            &*self.kv,
            &Self::key(&session.session_id)?,
            session,
            PutMode::Create,
            Some(self.idle_ttl),
        )
        .await?;
        debug!(session = %session.session_id.hashed(), "stored new server session");
        Ok(())
    }

    /// Stores `session`, replacing any earlier record of it.
    pub async fn save(&self, session: &ServerSession) -> Result<()> {
        write(
            &*self.kv,
            &Self::key(&session.session_id)?,
            session,
            PutMode::Overwrite,
            Some(self.idle_ttl),
        )
        .await?;
        Ok(())
    }

    /// The live session `id`, or `None` when unknown or idle too long.
    pub async fn load(&self, id: &SessionId) -> Result<Option<ServerSession>> {
        Ok(read(&*self.kv, &Self::key(id)?).await?.map(|s| s.record))
    }

    /// Marks the session used now, extending its TTL. Writes at most once per
    /// touch interval per session from this instance. Returns `false` when
    /// the session no longer exists.
    pub async fn touch(&self, id: &SessionId) -> Result<bool> {
        let now = tokio::time::Instant::now();
        let recent = {
            let mut last = self.last_touch.lock().unwrap_or_else(|p| p.into_inner());
            let recent = last
                .get(id)
                .is_some_and(|t| now.duration_since(*t) < self.touch_interval);
            if !recent {
                if last.len() >= TOUCH_CACHE_LIMIT {
                    // Entries older than the interval no longer suppress a write.
                    let interval = self.touch_interval;
                    last.retain(|_, t| now.duration_since(*t) < interval);
                }
                last.insert(id.clone(), now);
            }
            recent
        };
        if recent {
            if !self.strict {
                return Ok(true);
            }
            let live = self.kv.get(&Self::key(id)?).await?.is_some();
            if !live {
                self.forget_touch(id);
            }
            return Ok(live);
        }

        let key = &Self::key(id)?;
        let touched = retry_cas(key, 8, move || async move {
            let Some(stored) = read::<ServerSession>(&*self.kv, key).await? else {
                self.forget_touch(id);
                return Ok(false);
            };
            let mut session = stored.record;
            session.last_seen = Timestamp::now();
            write(
                &*self.kv,
                key,
                &session,
                PutMode::Update(stored.version),
                Some(self.idle_ttl),
            )
            .await?;
            Ok(true)
        })
        .await;
        match touched {
            // Others kept touching it meanwhile: it is alive.
            Err(Error::Conflict { .. }) => Ok(true),
            other => other,
        }
    }

    fn forget_touch(&self, id: &SessionId) {
        self.last_touch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Deletes session `id` (the client sent DELETE, or the server ended it).
    /// Returns whether a live session was there to end: `false` for an
    /// unknown id, one that expired, or one another request ended first.
    pub async fn delete(&self, id: &SessionId) -> Result<bool> {
        self.forget_touch(id);
        self.kv.delete(&Self::key(id)?, None).await
    }
}
