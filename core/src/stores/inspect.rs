//! Reading any stored record without knowing its kind in advance: what
//! operator tools (`mcp-persist show`, `check`) need.

use serde::Deserialize;

use super::{
    BusMessage, Heartbeat, InstanceLease, KeyRing, TaskRecord, credentials::LeaseRecord,
    credentials::ResourceIssuer, tasks::InboxRecord,
};
use crate::{
    Error, Result,
    records::{
        Credentials, EventRecord, InFlightRequest, LegacySession, PendingAuthorization, Record,
        ServerProfile, ServerSession, StreamMeta, decode,
    },
};

/// What replaces a secret in an [`Inspected`] record.
pub const REDACTED: &str = "[redacted]";

/// A record decoded under the current schema of its kind, for tools.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Inspected {
    /// The record kind named in its envelope (`server_session`, `credentials`, ...).
    pub kind: &'static str,
    /// The schema version it was written with.
    pub schema: u32,
    /// The decoded record as JSON, every secret (tokens, client secrets,
    /// PKCE verifiers, key material, stream tokens) replaced by
    /// [`REDACTED`].
    pub record: serde_json::Value,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: String,
    schema: u32,
}

fn typed<T: Record>(key: &str, bytes: &[u8], secrets: &[&str]) -> Result<Inspected> {
    let record = decode::<T>(key, bytes)?;
    let mut json = serde_json::to_value(&record).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: format!("{} record does not serialize back", T::KIND),
        source: Some(Box::new(e)),
    })?;
    for pointer in secrets {
        if let Some(v) = json.pointer_mut(pointer)
            && !v.is_null()
        {
            *v = serde_json::Value::String(REDACTED.to_owned());
        }
    }
    Ok(Inspected {
        kind: T::KIND,
        schema: T::SCHEMA,
        record: json,
    })
}

/// Decodes `bytes` read from `key` (a key-value record, or a log record
/// named `<log>#<seq>`) under the current schema of the kind its envelope
/// names, with the same checks as the typed stores: unparsable bytes, an
/// unknown kind or a record that does not match its schema are
/// [`Error::Corrupt`] naming `key`; a schema newer than this build knows is
/// [`Error::NewerSchema`]. Reads nothing else and writes nothing.
///
/// ```
/// use mcp_persist_core::{records::encode, stores::inspect, *};
/// let creds = Credentials::new(
///     CredentialKey::new("https://as.example", "https://mcp.example/mcp")?,
///     Secret::new("token-text"),
///     ClientRegistration::new("client-1"),
/// );
/// let shown = inspect::inspect("cred/token/x", &encode(&creds)?)?;
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
    match head.kind.as_str() {
        ServerProfile::KIND => typed::<ServerProfile>(key, bytes, &[]),
        LegacySession::KIND => typed::<LegacySession>(key, bytes, &[]),
        InFlightRequest::KIND => typed::<InFlightRequest>(key, bytes, &[]),
        Credentials::KIND => typed::<Credentials>(
            key,
            bytes,
            &["/access_token", "/refresh_token", "/client/client_secret"],
        ),
        PendingAuthorization::KIND => {
            typed::<PendingAuthorization>(key, bytes, &["/pkce_verifier", "/state"])
        }
        ServerSession::KIND => typed::<ServerSession>(key, bytes, &[]),
        StreamMeta::KIND => typed::<StreamMeta>(key, bytes, &["/token"]),
        EventRecord::KIND => typed::<EventRecord>(key, bytes, &[]),
        KeyRing::KIND => typed::<KeyRing>(key, bytes, &["/active/secret", "/previous/secret"]),
        TaskRecord::KIND => typed::<TaskRecord>(key, bytes, &[]),
        InboxRecord::KIND => typed::<InboxRecord>(key, bytes, &[]),
        InstanceLease::KIND => typed::<InstanceLease>(key, bytes, &[]),
        Heartbeat::KIND => typed::<Heartbeat>(key, bytes, &[]),
        BusMessage::KIND => typed::<BusMessage>(key, bytes, &[]),
        LeaseRecord::KIND => typed::<LeaseRecord>(key, bytes, &[]),
        ResourceIssuer::KIND => typed::<ResourceIssuer>(key, bytes, &[]),
        other => Err(Error::corrupt(
            key,
            format!(
                "holds an unknown record kind {other:?} (schema {})",
                head.schema
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientRegistration, CredentialKey, Secret, SessionId, Timestamp, records::encode};

    #[test]
    fn secrets_are_redacted_and_damage_is_typed() {
        let creds = Credentials::new(
            CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap(),
            Secret::new("ACCESS-1"),
            ClientRegistration::new("c").with_client_secret(Secret::new("CLIENT-1")),
        )
        .with_refresh_token(Secret::new("REFRESH-1"));
        let shown = inspect("k", &encode(&creds).unwrap()).unwrap();
        let text = shown.record.to_string();
        for secret in ["ACCESS-1", "CLIENT-1", "REFRESH-1"] {
            assert!(!text.contains(secret), "{secret} shown");
        }
        let meta = StreamMeta {
            session: Some(SessionId::new("s").unwrap()),
            token: "00112233445566778899aabbccddeeff".into(),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: None,
            request: None,
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
