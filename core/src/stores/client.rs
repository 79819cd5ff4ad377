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
        let key = &Self::session_key(server)?;
        let change = &std::sync::Mutex::new(change);
        retry_cas(key, CAS_ATTEMPTS, move || async move {
            let Some(Stored {
                mut record,
                version,
            }) = self.session(server).await?
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
        let mut reserved = None;
        let mut impossible = None;
        let updated = self
            .update_session(server, |s| {
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
