use std::{ops::Range, sync::Arc};

use tracing::debug;

use super::{Stored, read, write};
use crate::retry::retry_cas;
use crate::{
    Error, Key, KvStore, PutMode, Result, ServerKey, Version, declare,
    records::{InFlightRequest, LegacySession, ServerProfile},
    types::{RequestId, SessionId, Timestamp},
};

/// How many times a compare-and-swap loop retries before giving up with
/// `Conflict`. Contention on client state is one process or a few.
const CAS_ATTEMPTS: usize = 64;

/// Client-side state per server: the server profile, the legacy session and
/// the in-flight journal.
///
/// All state is keyed by [`ServerKey`] (endpoint URL and profile), so state
/// recorded for one server is never used for another.
#[derive(Clone, Debug)]
pub struct ClientStateStore {
    kv: Arc<dyn KvStore>,
}

/// The largest request id the client store hands out: 2^53 - 1, the
/// largest integer a JSON number carries exactly to every peer (JavaScript
/// reads larger ones rounded).
pub const MAX_REQUEST_ID: i64 = (1 << 53) - 1;

impl ClientStateStore {
    /// A store over `kv`.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        ClientStateStore { kv }
    }

    fn profile_key(server: &ServerKey) -> Result<Key> {
        declare::SERVER_PROFILE.try_key(&[server.profile(), server.endpoint()])
    }

    fn session_key(server: &ServerKey) -> Result<Key> {
        declare::LEGACY_SESSION.try_key(&[server.profile(), server.endpoint()])
    }

    fn inflight_prefix(server: &ServerKey, session: &SessionId) -> String {
        declare::IN_FLIGHT_REQUEST.prefix_of(&[
            server.profile(),
            server.endpoint(),
            session.as_str(),
        ])
    }

    fn inflight_key(server: &ServerKey, session: &SessionId, id: &RequestId) -> Result<Key> {
        let id = match id {
            RequestId::Number(n) => format!("n{n}"),
            RequestId::String(s) => format!("s{s}"),
        };
        declare::IN_FLIGHT_REQUEST.try_key(&[
            server.profile(),
            server.endpoint(),
            session.as_str(),
            &id,
        ])
    }

    /// The stored profile of `server`.
    pub async fn profile(&self, server: &ServerKey) -> Result<Option<ServerProfile>> {
        Ok(read(&*self.kv, &Self::profile_key(server)?)
            .await?
            .map(|s: Stored<ServerProfile>| s.record))
    }

    /// Stores the profile of `server`, replacing any earlier one.
    pub async fn save_profile(&self, server: &ServerKey, profile: &ServerProfile) -> Result<()> {
        write(
            &*self.kv,
            &Self::profile_key(server)?,
            profile,
            PutMode::Overwrite,
            None,
        )
        .await?;
        debug!(server = %server, era = ?profile.era, version = %profile.protocol_version, "stored server profile");
        Ok(())
    }

    /// Forgets the profile of `server` (its era will be probed again).
    pub async fn forget_profile(&self, server: &ServerKey) -> Result<()> {
        self.kv.delete(&Self::profile_key(server)?, None).await?;
        Ok(())
    }

    /// The stored legacy session with `server`, with its version.
    pub async fn session(&self, server: &ServerKey) -> Result<Option<Stored<LegacySession>>> {
        read(&*self.kv, &Self::session_key(server)?).await
    }

    /// Stores a session: `PutMode::Create` for a new one (fails if another
    /// process stored one first), `Update(version)` to change a read one.
    pub async fn save_session(
        &self,
        server: &ServerKey,
        session: &LegacySession,
        mode: PutMode,
    ) -> Result<Version> {
        write(&*self.kv, &Self::session_key(server)?, session, mode, None).await
    }

    /// Applies `change` to the stored session with compare-and-swap, retrying
    /// on concurrent changes. Returns the session as written, or `None` when
    /// no session is stored.
    pub async fn update_session(
        &self,
        server: &ServerKey,
        change: impl FnMut(&mut LegacySession) + Send,
    ) -> Result<Option<LegacySession>> {
        self.update_read_session(server, None, change).await
    }

    /// [`update_session`](Self::update_session), its first attempt made on
    /// `read` (the session as the caller just read it) instead of reading
    /// it again; a session changed since is read again, as on any conflict.
    async fn update_read_session(
        &self,
        server: &ServerKey,
        read: Option<Stored<LegacySession>>,
        change: impl FnMut(&mut LegacySession) + Send,
    ) -> Result<Option<LegacySession>> {
        let key = &Self::session_key(server)?;
        let change = &std::sync::Mutex::new(change);
        let read = &std::sync::Mutex::new(read);
        retry_cas(key, CAS_ATTEMPTS, move || async move {
            let known = read.lock().unwrap_or_else(|p| p.into_inner()).take();
            let current = match known {
                Some(known) => Some(known),
                None => self.session(server).await?,
            };
            let Some(Stored {
                mut record,
                version,
            }) = current
            else {
                return Ok(None);
            };
            (change.lock().unwrap_or_else(|p| p.into_inner()))(&mut record);
            record.updated_at = Timestamp::now();
            write(&*self.kv, key, &record, PutMode::Update(version), None).await?;
            Ok(Some(record))
        })
        .await
    }

    /// Reserves `count` request ids in the session with `server` and returns
    /// them. Ids are reserved in blocks so that a client writes once per
    /// block, not once per request; a restarted client continues above every
    /// id ever reserved, so no id repeats within the session.
    ///
    /// Ids stay within `0..=`[`MAX_REQUEST_ID`], the integers every JSON
    /// peer reads exactly. A stored mark outside that range (negative, or
    /// too close to the top to hand out `count` more) cannot have been
    /// written by this crate: it is [`Error::Corrupt`] naming the session's
    /// key, and the mark is left as it is.
    pub async fn reserve_request_ids(&self, server: &ServerKey, count: u32) -> Result<Range<i64>> {
        self.reserve_ids(server, None, count).await
    }

    /// [`reserve_request_ids`](Self::reserve_request_ids) in the session as
    /// the caller just read it (with [`session`](Self::session)): one write
    /// and no second read, unless the session changed since, when it is
    /// read again. A client starting up reads its session anyway; on a
    /// network store this saves a round trip before its first request.
    pub async fn reserve_request_ids_after(
        &self,
        server: &ServerKey,
        read: Stored<LegacySession>,
        count: u32,
    ) -> Result<Range<i64>> {
        self.reserve_ids(server, Some(read), count).await
    }

    async fn reserve_ids(
        &self,
        server: &ServerKey,
        read: Option<Stored<LegacySession>>,
        count: u32,
    ) -> Result<Range<i64>> {
        let mut reserved = None;
        let mut impossible = None;
        let updated = self
            .update_read_session(server, read, |s| {
                let start = s.request_id_high_water;
                match start
                    .checked_add(i64::from(count))
                    .filter(|end| start >= 0 && *end <= MAX_REQUEST_ID)
                {
                    Some(end) => {
                        s.request_id_high_water = end;
                        reserved = Some(start..end);
                    }
                    None => impossible = Some(start),
                }
            })
            .await;
        if let Some(mark) = impossible {
            return Err(Error::Corrupt {
                key: Self::session_key(server)?.to_string(),
                reason: format!(
                    "the request-id high-water mark {mark} cannot hand out {count} more ids \
                     (ids stay within 0..={MAX_REQUEST_ID}); forget the session to start a new one"
                ),
                source: None,
            });
        }
        match (updated?, reserved) {
            (Some(_), Some(range)) => Ok(range),
            _ => Err(Error::NotFound {
                what: "client session",
                detail: Some(format!("no session stored for {server}")),
            }),
        }
    }

    /// Forgets the session with `server` (after a 404, or when the
    /// application ends the session).
    ///
    /// Its in-flight journal stays: each entry is listed by
    /// [`journal`](Self::journal) until it is
    /// [completed](Self::complete_inflight), so that a request whose answer
    /// the application never saw is not erased with the session that carried
    /// it.
    pub async fn forget_session(&self, server: &ServerKey) -> Result<()> {
        self.kv.delete(&Self::session_key(server)?, None).await?;
        debug!(server = %server, "forgot client session (its journal stays)");
        Ok(())
    }

    /// Journals a request sent in `session` (or updates its stream cursor).
    pub async fn record_inflight(
        &self,
        server: &ServerKey,
        session: &SessionId,
        request: &InFlightRequest,
    ) -> Result<()> {
        let key = Self::inflight_key(server, session, &request.id)?;
        write(&*self.kv, &key, request, PutMode::Overwrite, None).await?;
        Ok(())
    }

    /// Removes an answered request from the journal.
    pub async fn complete_inflight(
        &self,
        server: &ServerKey,
        session: &SessionId,
        id: &RequestId,
    ) -> Result<()> {
        self.kv
            .delete(&Self::inflight_key(server, session, id)?, None)
            .await?;
        Ok(())
    }

    /// Every journaled request of `server`, whatever session it was sent
    /// in (the stored one, sessions forgotten since, pseudo sessions such as
    /// the journal of a server without sessions), each with that session,
    /// oldest first.
    pub async fn journal(&self, server: &ServerKey) -> Result<Vec<(SessionId, InFlightRequest)>> {
        let prefix = declare::IN_FLIGHT_REQUEST.prefix_of(&[server.profile(), server.endpoint()]);
        let mut out = Vec::new();
        for key in self.kv.list(&prefix).await? {
            // The entry's components: profile, endpoint, session, request.
            let Some([_, _, session, _]) = declare::IN_FLIGHT_REQUEST
                .parse(&key)
                .and_then(|parts| <[String; 4]>::try_from(parts).ok())
            else {
                continue;
            };
            let session = SessionId::new(session).map_err(|e| Error::Corrupt {
                key: key.to_string(),
                reason: format!("the journal key names no valid session id: {e}"),
                source: None,
            })?;
            if let Some(stored) = read::<InFlightRequest>(&*self.kv, &key).await? {
                out.push((session, stored.record));
            }
        }
        out.sort_by(|(sa, a), (sb, b)| {
            a.sent_at
                .cmp(&b.sent_at)
                .then_with(|| sa.as_str().cmp(sb.as_str()))
                .then_with(|| a.id.cmp(&b.id))
        });
        Ok(out)
    }

    /// The journaled requests of `session`, oldest first.
    pub async fn inflight(
        &self,
        server: &ServerKey,
        session: &SessionId,
    ) -> Result<Vec<InFlightRequest>> {
        let mut out = Vec::new();
        for key in self
            .kv
            .list(&Self::inflight_prefix(server, session))
            .await?
        {
            if let Some(stored) = read::<InFlightRequest>(&*self.kv, &key).await? {
                out.push(stored.record);
            }
        }
        out.sort_by(|a, b| a.sent_at.cmp(&b.sent_at).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, atomic::Ordering};

    use super::*;
    use crate::{stores::testkit::CountingKv, types::SessionId};

    fn session() -> LegacySession {
        LegacySession::new(
            SessionId::new("sess-read").expect("id"),
            crate::ProtocolVersion::new("2025-11-25").expect("version"),
            serde_json::json!({}),
        )
    }

    /// Reserving ids in a session as read makes no second read: a start
    /// reads its session anyway, so on a network store this is a round
    /// trip fewer before the first request. A session changed since is
    /// read again, and the ids go on above what was reserved meanwhile.
    #[tokio::test]
    async fn ids_reserved_in_a_session_as_read_take_no_second_read() {
        let kv = Arc::new(CountingKv::default());
        let store = ClientStateStore::new(kv.clone());
        let server = ServerKey::new("https://mcp.example.com/read", "default").expect("key");
        store
            .save_session(&server, &session(), PutMode::Create)
            .await
            .expect("save");
        let read = store.session(&server).await.expect("read").expect("stored");
        let before = kv.gets.load(Ordering::Relaxed);
        assert_eq!(
            store
                .reserve_request_ids_after(&server, read.clone(), 10)
                .await
                .expect("reserve"),
            0..10
        );
        assert_eq!(
            kv.gets.load(Ordering::Relaxed),
            before,
            "read the session again"
        );
        // The same read once more is stale: the session is read again.
        assert_eq!(
            store
                .reserve_request_ids_after(&server, read, 10)
                .await
                .expect("reserve"),
            10..20
        );
        assert_eq!(kv.gets.load(Ordering::Relaxed), before + 1);
    }
}
