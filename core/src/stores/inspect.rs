//! Reading any stored record without knowing its kind in advance: what
//! operator tools (`mcp-persist show`, `check`) need.

use serde::{Deserialize, de::DeserializeOwned};

use crate::{
    Error, Result,
    declare::{self, Declaration, Space},
    records::{
        Credentials, EventRecord, InFlightRequest, LegacySession, PendingAuthorization, Record,
        ServerProfile, ServerSession, StreamMeta,
    },
    stores::{
        bus::BusMessage,
        calls::CallRecord,
        credentials::{DpopKey, LeaseRecord, ResourceIssuer},
        keys::KeyRing,
        liveness::{Heartbeat, InstanceLease},
        tasks::{InboxRecord, TaskRecord},
        tool_lock::ToolLockRecord,
    },
};

/// Renders the bytes of one record kind as JSON with its secrets redacted.
type Decoder = fn(&str, &[u8]) -> Result<serde_json::Value>;

/// The decoder of every declared kind, by its record type. The declarations
/// themselves name no type, so that the record modules can name their
/// declarations without a module cycle; a test checks that every declared
/// kind is here.
fn decoder(declaration: &Declaration) -> Option<Decoder> {
    fn entry<T: Record>() -> (&'static Declaration, Decoder) {
        (T::DECLARATION, redacted::<T>)
    }
    [
        entry::<ServerProfile>(),
        entry::<LegacySession>(),
        entry::<InFlightRequest>(),
        entry::<Credentials>(),
        entry::<LeaseRecord>(),
        entry::<ResourceIssuer>(),
        entry::<DpopKey>(),
        entry::<PendingAuthorization>(),
        entry::<ServerSession>(),
        entry::<EventRecord>(),
        entry::<StreamMeta>(),
        entry::<KeyRing>(),
        entry::<InboxRecord>(),
        entry::<TaskRecord>(),
        entry::<CallRecord>(),
        entry::<BusMessage>(),
        entry::<InstanceLease>(),
        entry::<Heartbeat>(),
        entry::<ToolLockRecord>(),
    ]
    .into_iter()
    .find(|(d, _)| *d == declaration)
    .map(|(_, decode)| decode)
}

/// Decodes as `T` and renders it as JSON with its secrets redacted.
fn redacted<T: Record + DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<serde_json::Value> {
    let record = crate::records::decode::<T>(key, bytes)?;
    crate::secret::redacting(|| serde_json::to_value(&record)).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: format!("{} record does not serialize back", T::KIND),
        source: Some(Box::new(e)),
    })
}

/// What replaces a secret in an [`Inspected`] record.
pub const REDACTED: &str = crate::secret::REDACTED;

/// A record decoded under the current schema of its kind, for tools.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Inspected {
    /// The record kind named in its envelope (`server_session`, `credentials`, ...).
    pub kind: &'static str,
    /// The kind's declaration: its key layout, family and lifetime.
    pub declaration: &'static Declaration,
    /// The schema version it was written with.
    pub schema: u32,
    /// The decoded record as JSON, every secret (every field of type
    /// [`Secret`](crate::Secret): tokens, client secrets, PKCE verifiers, key
    /// material, stream tokens) replaced by [`REDACTED`].
    pub record: serde_json::Value,
}

impl Inspected {
    /// The first time among `pointers` that the record holds.
    fn time(&self, pointers: &[&str]) -> Option<crate::Timestamp> {
        pointers.iter().find_map(|p| {
            self.record
                .pointer(p)
                .and_then(serde_json::Value::as_u64)
                .map(crate::Timestamp::from_unix_millis)
        })
    }

    /// When the record was last written, by its own account.
    pub fn written_at(&self) -> Option<crate::Timestamp> {
        self.time(self.declaration.written_at)
    }

    /// When the record was created, by its own account.
    pub fn created_at(&self) -> Option<crate::Timestamp> {
        self.time(self.declaration.created_at)
            .or_else(|| self.written_at())
    }
}

#[derive(Deserialize)]
struct KindOnly {
    kind: String,
    schema: u32,
}

/// Decodes `bytes` read from `key` (a key-value record, or a log record
/// named `<log>#<seq>`) under the current schema of the kind its envelope
/// names, with the same checks as the typed stores: unparsable bytes, an
/// unknown kind or a record that does not match its schema are
/// [`Error::Corrupt`] naming `key`; a schema newer than this build knows is
/// [`Error::NewerSchema`]. A record whose kind is not the one declared for
/// its key (a session record under a credential key, say) is
/// [`Error::Corrupt`] too. Reads nothing else and writes nothing.
///
/// ```
/// use mcp_persist_core::{declare, records::encode, stores::inspect, *};
/// let creds = Credentials::new(
///     CredentialKey::new("https://as.example", "https://mcp.example/mcp")?,
///     Secret::new("token-text"),
///     ClientRegistration::new("client-1"),
/// );
/// let key = declare::CREDENTIALS.key(&["https://as.example", "https://mcp.example/mcp"]);
/// let shown = inspect::inspect(&key, &encode(&creds)?)?;
/// assert_eq!(shown.kind, "credentials");
/// assert_eq!(shown.record["access_token"], inspect::REDACTED);
/// assert!(!shown.record.to_string().contains("token-text"));
/// # Ok::<_, Error>(())
/// ```
pub fn inspect(key: &str, bytes: &[u8]) -> Result<Inspected> {
    let head: KindOnly = serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: "not a record envelope".into(),
        source: Some(Box::new(e)),
    })?;
    let Some(declaration) = declare::of_kind(&head.kind) else {
        return Err(Error::corrupt(
            key,
            format!(
                "holds an unknown record kind {:?} (schema {})",
                head.kind, head.schema
            ),
        ));
    };
    // A log record is named `<log>#<seq>`; its kind is checked against the log.
    let (space, name) = match key.rsplit_once('#') {
        Some((log, seq)) if seq.bytes().all(|b| b.is_ascii_digit()) && !seq.is_empty() => {
            (Space::Log, log)
        }
        _ => (Space::Kv, key),
    };
    if let Some(expected) = declare::of_key_in(space, name)
        && expected != declaration
    {
        return Err(Error::corrupt(
            key,
            format!(
                "holds a {:?} record where a {} was expected",
                declaration.kind, expected.kind
            ),
        ));
    }
    let Some(decode) = decoder(declaration) else {
        return Err(Error::corrupt(
            key,
            format!(
                "holds a {:?} record, which tools cannot read",
                declaration.kind
            ),
        ));
    };
    Ok(Inspected {
        kind: declaration.kind,
        declaration,
        schema: head.schema,
        record: decode(key, bytes)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_kind_has_a_decoder() {
        for d in declare::ALL {
            assert!(decoder(d).is_some(), "{} has no decoder in inspect", d.kind);
        }
    }
    use crate::records::{Credentials, StreamMeta};
    use crate::{ClientRegistration, CredentialKey, Secret, SessionId, Timestamp, records::encode};

    #[test]
    fn secrets_are_redacted_and_damage_is_typed() {
        let creds = Credentials::new(
            CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap(),
            Secret::new("ACCESS-1"),
            ClientRegistration::new("c").with_client_secret(Secret::new("CLIENT-1")),
        )
        .with_refresh_token(Secret::new("REFRESH-1"));
        let shown = inspect(
            &crate::declare::CREDENTIALS.key(&["https://as.example", "https://mcp.example/mcp"]),
            &encode(&creds).unwrap(),
        )
        .unwrap();
        let text = shown.record.to_string();
        for secret in ["ACCESS-1", "CLIENT-1", "REFRESH-1"] {
            assert!(!text.contains(secret), "{secret} shown");
        }
        let meta = StreamMeta {
            session: Some(SessionId::new("s").unwrap()),
            token: Secret::new("00112233445566778899aabbccddeeff"),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: None,
            request: None,
            last_seq: 0,
        };
        let shown = inspect("m", &encode(&meta).unwrap()).unwrap();
        assert_eq!(shown.kind, "event_stream");
        assert_eq!(shown.record["token"], REDACTED);

        assert!(
            matches!(inspect("bad", b"{\"kind\":"), Err(Error::Corrupt { ref key, .. }) if key == "bad")
        );
        assert!(matches!(
            inspect("odd", br#"{"kind":"nope","schema":1,"record":{}}"#),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            inspect(
                "new",
                br#"{"kind":"server_session","schema":9,"record":{}}"#
            ),
            Err(Error::NewerSchema { found: 9, .. })
        ));
    }
}
