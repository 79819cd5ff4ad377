//! The records mcp-persist keeps, and how they are encoded.
//!
//! Every record is stored as JSON inside an envelope that names its kind and
//! the schema version it was written with:
//!
//! ```json
//! {"kind":"legacy_session","schema":1,"record":{ ... }}
//! ```
//!
//! Reading a record checks the envelope first: a schema newer than this build
//! knows is [`Error::NewerSchema`], a wrong kind or unparsable bytes are
//! [`Error::Corrupt`] naming the key. Nothing is ever misread or overwritten
//! on the way. A future schema change adds a migration from older versions
//! here, in one place.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    Error, Result, Secret,
    declare::{self, Declaration},
    types::{ProtocolEra, ProtocolVersion, RequestId, SessionId, Timestamp},
};

/// A kind of persisted record, tied to its [declaration](crate::declare).
///
/// An implementation names its [`Declaration`] and nothing else: the kind's
/// name, schema version and key layout are written there, once.
pub trait Record: Serialize + DeserializeOwned {
    /// Where this kind is declared.
    const DECLARATION: &'static Declaration;
    /// The name written into the envelope.
    const KIND: &'static str = Self::DECLARATION.kind;
    /// The schema version this build writes and the newest it reads.
    const SCHEMA: u32 = Self::DECLARATION.schema;
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    kind: &'static str,
    schema: u32,
    record: &'a T,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    kind: String,
    schema: u32,
    record: serde_json::Value,
}

/// Encodes a record in its envelope.
pub fn encode<T: Record>(record: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(&EnvelopeOut {
        kind: T::KIND,
        schema: T::SCHEMA,
        record,
    })
    .map_err(|e| Error::invalid("record", format!("{} does not serialize: {e}", T::KIND)))
}

/// Encodes one SSE event's record straight from its message: the same
/// bytes (up to the order of object keys) as an [`EventRecord`] holding
/// the message as a JSON tree, without building that tree first.
pub(crate) fn encode_event<P: Serialize + ?Sized>(payload: &P) -> Result<Vec<u8>> {
    #[derive(Serialize)]
    struct EventRecordOut<'a, P: ?Sized> {
        payload: &'a P,
    }
    // Most events (progress, a short result) fit in this: `to_vec` starts
    // at 128 bytes and grew the buffer once or twice for each of them.
    let mut bytes = Vec::with_capacity(EVENT_RECORD_CAPACITY);
    serde_json::to_writer(
        &mut bytes,
        &EnvelopeOut {
            kind: EventRecord::KIND,
            schema: EventRecord::SCHEMA,
            record: &EventRecordOut { payload },
        },
    )
    .map_err(|e| {
        Error::invalid(
            "record",
            format!("{} does not serialize: {e}", EventRecord::KIND),
        )
    })?;
    Ok(bytes)
}

/// The buffer an event's record is encoded into starts this large.
const EVENT_RECORD_CAPACITY: usize = 256;

/// Decodes a record read from `key`, checking kind and schema version.
pub fn decode<T: Record>(key: &str, bytes: &[u8]) -> Result<T> {
    let envelope: EnvelopeIn = serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: format!("not a {} record envelope", T::KIND),
        source: Some(Box::new(e)),
    })?;
    if envelope.kind != T::KIND {
        return Err(Error::corrupt(
            key,
            format!(
                "holds a {:?} record where a {} was expected",
                envelope.kind,
                T::KIND
            ),
        ));
    }
    if envelope.schema > T::SCHEMA {
        return Err(Error::NewerSchema {
            key: key.to_owned(),
            found: envelope.schema,
            supported: T::SCHEMA,
        });
    }
    // Schema 1 is the only one so far: older versions would be migrated here.
    serde_json::from_value(envelope.record).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: format!(
            "{} record does not match schema {}",
            T::KIND,
            envelope.schema
        ),
        source: Some(Box::new(e)),
    })
}

// ---------------------------------------------------------------- client side

/// What a client knows about one server: its era and the version in use.
///
/// Kept per [`ServerKey`](crate::ServerKey) so a restarted client neither
/// probes the era again nor fetches `server/discover` while its cache holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServerProfile {
    /// Which era the server was found to speak.
    pub era: ProtocolEra,
    /// The protocol version agreed with it.
    pub protocol_version: ProtocolVersion,
    /// When the era verdict was reached.
    pub verdict_at: Timestamp,
    /// The last `server/discover` result (modern servers), if any.
    pub discover: Option<DiscoverCache>,
}

impl ServerProfile {
    /// A verdict reached now: the server speaks `era`, at `protocol_version`,
    /// with no `server/discover` result cached yet.
    pub fn new(era: ProtocolEra, protocol_version: ProtocolVersion) -> Self {
        ServerProfile {
            era,
            protocol_version,
            verdict_at: Timestamp::now(),
            discover: None,
        }
    }

    /// The same verdict with `discover` as its cached `server/discover` result.
    pub fn with_discover(mut self, discover: impl Into<Option<DiscoverCache>>) -> Self {
        self.discover = discover.into();
        self
    }
}

impl Record for ServerProfile {
    const DECLARATION: &'static Declaration = &declare::SERVER_PROFILE;
}

/// A cached `server/discover` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DiscoverCache {
    /// The result as the server sent it (`supportedVersions`, `capabilities`, ...).
    pub result: serde_json::Value,
    /// When it was fetched.
    pub fetched_at: Timestamp,
    /// The server's `ttlMs`: how long the result may be reused.
    pub ttl_ms: u64,
    /// The server's `cacheScope`, if it gave one.
    pub cache_scope: Option<String>,
}

impl DiscoverCache {
    /// A `server/discover` result fetched now, reusable for `ttl_ms`.
    pub fn new(result: serde_json::Value, ttl_ms: u64) -> Self {
        DiscoverCache {
            result,
            fetched_at: Timestamp::now(),
            ttl_ms,
            cache_scope: None,
        }
    }

    /// The same result with the server's `cacheScope`.
    pub fn with_cache_scope(mut self, scope: impl Into<Option<String>>) -> Self {
        self.cache_scope = scope.into();
        self
    }

    /// Whether the result may still be used at `now`.
    pub fn is_fresh_at(&self, now: Timestamp) -> bool {
        now < self.fetched_at.plus(Duration::from_millis(self.ttl_ms))
    }
}

/// A legacy (2025-11-25 and earlier) session a client holds with a server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LegacySession {
    /// The `Mcp-Session-Id` the server assigned.
    pub session_id: SessionId,
    /// The negotiated protocol version (also in `initialize_result`).
    pub protocol_version: ProtocolVersion,
    /// The server's whole `InitializeResult` as JSON: capabilities, server
    /// info and instructions, readable before any network call.
    pub initialize_result: serde_json::Value,
    /// Request ids below this number may have been used in this session; a
    /// resumed client starts numbering here so no id is ever sent twice.
    pub request_id_high_water: i64,
    /// The last SSE event id seen per stream still open: the key is the
    /// request id of a POST stream, or `"standalone"` for the GET stream.
    pub last_event_ids: BTreeMap<String, String>,
    /// When the session was initialized.
    pub created_at: Timestamp,
    /// When the record was last written.
    pub updated_at: Timestamp,
}

impl LegacySession {
    /// A session just initialized: request numbering starts at 0 and no
    /// stream is open.
    pub fn new(
        session_id: SessionId,
        protocol_version: ProtocolVersion,
        initialize_result: serde_json::Value,
    ) -> Self {
        let now = Timestamp::now();
        LegacySession {
            session_id,
            protocol_version,
            initialize_result,
            request_id_high_water: 0,
            last_event_ids: BTreeMap::new(),
            created_at: now,
            updated_at: now,
        }
    }

    /// The same session with request numbering continuing at `high_water`.
    pub fn with_request_id_high_water(mut self, high_water: i64) -> Self {
        self.request_id_high_water = high_water;
        self
    }
}

impl Record for LegacySession {
    const DECLARATION: &'static Declaration = &declare::LEGACY_SESSION;
}

/// A request sent and not yet answered, journaled so that after a restart
/// the application can collect its answer instead of running the work again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InFlightRequest {
    /// The JSON-RPC id it went out with.
    pub id: RequestId,
    /// Its method (`tools/call`, ...).
    pub method: String,
    /// Its params, as sent.
    pub params: Option<serde_json::Value>,
    /// The last SSE event id received on its response stream, if any: the
    /// cursor to resume it with `GET` and `Last-Event-ID`.
    pub last_event_id: Option<String>,
    /// The task id, when the request was task-augmented (poll `tasks/get`).
    pub task_id: Option<String>,
    /// When it was sent.
    pub sent_at: Timestamp,
    /// The W3C `traceparent` of the request's span, so that collecting it
    /// after a restart continues its trace. `None` without tracing (and on
    /// records written before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl InFlightRequest {
    /// A request sent now, with no stream cursor and no task yet.
    pub fn new(
        id: RequestId,
        method: impl Into<String>,
        params: Option<serde_json::Value>,
    ) -> Self {
        InFlightRequest {
            id,
            method: method.into(),
            params,
            last_event_id: None,
            task_id: None,
            sent_at: Timestamp::now(),
            traceparent: None,
        }
    }
}

impl Record for InFlightRequest {
    const DECLARATION: &'static Declaration = &declare::IN_FLIGHT_REQUEST;
}

// ---------------------------------------------------------------- credentials

/// Where to find a credential: the authorization server's `issuer` and the
/// protected resource (the MCP server) it was issued for.
///
/// Credentials are never shared between issuers: a client that meets a new
/// authorization server for the same resource starts from nothing there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CredentialKey {
    /// The authorization server's `issuer`, compared as an exact string
    /// (RFC 8414).
    pub issuer: String,
    /// The canonical resource URL (RFC 8707).
    pub resource: String,
}

impl CredentialKey {
    /// A key for `issuer` and `resource`; the resource URL is canonicalized
    /// like a [`ServerKey`](crate::ServerKey) endpoint.
    pub fn new(issuer: &str, resource: &str) -> Result<Self> {
        crate::types::check_visible_ascii("issuer", issuer, 2048)?;
        Ok(CredentialKey {
            issuer: issuer.to_owned(),
            resource: crate::types::canonical_url("resource URL", resource)?,
        })
    }
}

/// OAuth credentials for one issuer and resource.
///
/// `Debug` shows no token text: every secret is a [`Secret`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Credentials {
    /// Whose credentials these are.
    pub key: CredentialKey,
    /// The access token.
    pub access_token: Secret,
    /// The token type (`Bearer`).
    pub token_type: String,
    /// When the access token expires, as an absolute time (a relative
    /// `expires_in` means nothing after a restart).
    pub expires_at: Option<Timestamp>,
    /// The refresh token; replaced by the rotated one after every refresh.
    pub refresh_token: Option<Secret>,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// How this client is registered with the issuer.
    pub client: ClientRegistration,
    /// Authorization server metadata as discovered, when kept for reuse.
    pub server_metadata: Option<serde_json::Value>,
    /// When these tokens were obtained.
    pub obtained_at: Timestamp,
}

impl Credentials {
    /// Credentials obtained now: a `Bearer` access token for `key`, of the
    /// client `client`, with no expiry, refresh token, scopes or metadata
    /// (set those fields as the token response says).
    pub fn new(key: CredentialKey, access_token: Secret, client: ClientRegistration) -> Self {
        Credentials {
            key,
            access_token,
            token_type: "Bearer".to_owned(),
            expires_at: None,
            refresh_token: None,
            scopes: Vec::new(),
            client,
            server_metadata: None,
            obtained_at: Timestamp::now(),
        }
    }

    /// The same credentials with the token type as issued (`Bearer`, `DPoP`...).
    pub fn with_token_type(mut self, token_type: impl Into<String>) -> Self {
        self.token_type = token_type.into();
        self
    }

    /// The same credentials expiring at `at` (`None`: no known expiry).
    pub fn with_expires_at(mut self, at: impl Into<Option<Timestamp>>) -> Self {
        self.expires_at = at.into();
        self
    }

    /// The same credentials with a refresh token.
    pub fn with_refresh_token(mut self, token: impl Into<Option<Secret>>) -> Self {
        self.refresh_token = token.into();
        self
    }

    /// The same credentials with the scopes granted.
    pub fn with_scopes(mut self, scopes: Vec<String>) -> Self {
        self.scopes = scopes;
        self
    }

    /// The same credentials with the authorization server's metadata kept.
    pub fn with_server_metadata(mut self, metadata: impl Into<Option<serde_json::Value>>) -> Self {
        self.server_metadata = metadata.into();
        self
    }

    /// The same credentials, obtained at `at` rather than now.
    pub fn with_obtained_at(mut self, at: Timestamp) -> Self {
        self.obtained_at = at;
        self
    }

    /// Whether the access token is expired, or will be within `margin`.
    pub fn expires_within(&self, margin: Duration) -> bool {
        self.expires_at
            .is_some_and(|at| at <= Timestamp::now().plus(margin))
    }
}

impl Record for Credentials {
    const DECLARATION: &'static Declaration = &declare::CREDENTIALS;
}

/// A client's registration with an authorization server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ClientRegistration {
    /// The client id (for a metadata-document client, the document's URL).
    pub client_id: String,
    /// The client secret of a confidential client.
    pub client_secret: Option<Secret>,
    /// The URL of the client's metadata document, when it registered that way.
    pub metadata_url: Option<String>,
    /// How the client authenticates at the token endpoint
    /// (`client_secret_basic`, `client_secret_post`, `none`, ...).
    pub token_endpoint_auth_method: Option<String>,
}

impl ClientRegistration {
    /// A public client known by `client_id` (set `client_secret`,
    /// `metadata_url` or `token_endpoint_auth_method` as registered).
    pub fn new(client_id: impl Into<String>) -> Self {
        ClientRegistration {
            client_id: client_id.into(),
            client_secret: None,
            metadata_url: None,
            token_endpoint_auth_method: None,
        }
    }

    /// The same registration with a client secret (a confidential client).
    pub fn with_client_secret(mut self, secret: impl Into<Option<Secret>>) -> Self {
        self.client_secret = secret.into();
        self
    }

    /// The same registration, made through a client metadata document at `url`.
    pub fn with_metadata_url(mut self, url: impl Into<Option<String>>) -> Self {
        self.metadata_url = url.into();
        self
    }

    /// The same registration authenticating at the token endpoint with `method`.
    pub fn with_token_endpoint_auth_method(mut self, method: impl Into<Option<String>>) -> Self {
        self.token_endpoint_auth_method = method.into();
        self
    }
}

/// An authorization the user has not completed yet, kept for a short TTL and
/// removed once used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PendingAuthorization {
    /// The PKCE code verifier.
    pub pkce_verifier: Secret,
    /// The `state` value sent, to match the redirect against.
    pub state: Secret,
    /// The issuer the redirect must come from.
    pub expected_issuer: String,
    /// The resource being authorized.
    pub resource: String,
    /// The redirect URI used.
    pub redirect_uri: Option<String>,
    /// Anything else the caller's OAuth library needs to finish the flow.
    pub extra: Option<serde_json::Value>,
    /// When the authorization started.
    pub created_at: Timestamp,
}

impl PendingAuthorization {
    /// An authorization started now for `resource`, expecting the redirect
    /// from `expected_issuer`.
    pub fn new(
        pkce_verifier: Secret,
        state: Secret,
        expected_issuer: impl Into<String>,
        resource: impl Into<String>,
    ) -> Self {
        PendingAuthorization {
            pkce_verifier,
            state,
            expected_issuer: expected_issuer.into(),
            resource: resource.into(),
            redirect_uri: None,
            extra: None,
            created_at: Timestamp::now(),
        }
    }

    /// The same authorization with the redirect URI it used.
    pub fn with_redirect_uri(mut self, uri: impl Into<Option<String>>) -> Self {
        self.redirect_uri = uri.into();
        self
    }

    /// The same authorization with what the caller's OAuth library needs to
    /// finish it.
    pub fn with_extra(mut self, extra: impl Into<Option<serde_json::Value>>) -> Self {
        self.extra = extra.into();
        self
    }
}

impl Record for PendingAuthorization {
    const DECLARATION: &'static Declaration = &declare::PENDING_AUTHORIZATION;
}

// ---------------------------------------------------------------- server side

/// A server's record of one legacy session, enough to restore it on any
/// instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServerSession {
    /// The session id handed to the client.
    pub session_id: SessionId,
    /// The client's `initialize` params (version, capabilities, client info),
    /// replayed into a fresh handler on restore.
    pub initialize_params: serde_json::Value,
    /// The authenticated principal the session is bound to, if any. A request
    /// presenting the session under another principal is answered 404.
    pub principal: Option<String>,
    /// When the session was created.
    pub created_at: Timestamp,
    /// When the session was last used (updated coalesced, see
    /// [`ServerSessionStore`](crate::ServerSessionStore)).
    pub last_seen: Timestamp,
}

impl ServerSession {
    /// A session created now from the client's `initialize` params, bound to
    /// `principal` (`None`: the anonymous principal).
    pub fn new(
        session_id: SessionId,
        initialize_params: serde_json::Value,
        principal: Option<String>,
    ) -> Self {
        let now = Timestamp::now();
        ServerSession {
            session_id,
            initialize_params,
            principal,
            created_at: now,
            last_seen: now,
        }
    }
}

impl Record for ServerSession {
    const DECLARATION: &'static Declaration = &declare::SERVER_SESSION;
}

/// Metadata of one SSE event stream: its owner and its unguessable token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StreamMeta {
    pub(crate) session: Option<SessionId>,
    pub(crate) token: Secret,
    pub(crate) created_at: Timestamp,
    /// The sequence number of the last record dropped by retention (0: none).
    pub(crate) dropped_through: u64,
    /// The server instance writing the stream, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) writer: Option<String>,
    /// The JSON-RPC id of the request the stream answers, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) request: Option<serde_json::Value>,
    /// The highest sequence number of the stream's log its writers had
    /// seen under `token` when this record was last written (0: none, as in
    /// records written before it was kept). An append that gets a number
    /// not above it found the log started again, and the token changes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) last_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Record for StreamMeta {
    const DECLARATION: &'static Declaration = &declare::EVENT_STREAM;
}

/// One stored SSE event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EventRecord {
    pub(crate) payload: serde_json::Value,
}

impl Record for EventRecord {
    const DECLARATION: &'static Declaration = &declare::EVENT;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> LegacySession {
        LegacySession {
            session_id: SessionId::new("s-1").unwrap(),
            protocol_version: ProtocolVersion::new("2025-11-25").unwrap(),
            initialize_result: serde_json::json!({"serverInfo": {"name": "x"}}),
            request_id_high_water: 3,
            last_event_ids: BTreeMap::new(),
            created_at: Timestamp::from_unix_millis(1),
            updated_at: Timestamp::from_unix_millis(2),
        }
    }

    #[test]
    fn roundtrip() {
        let bytes = encode(&session()).unwrap();
        assert_eq!(decode::<LegacySession>("k", &bytes).unwrap(), session());
    }

    #[test]
    fn newer_schema_is_typed() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&encode(&session()).unwrap()).unwrap();
        v["schema"] = 2.into();
        let err = decode::<LegacySession>("k", &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NewerSchema {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn garbage_and_wrong_kind_are_corrupt() {
        for bytes in [
            &b"\x00\xffgarbage"[..],
            b"{\"kind\":\"legacy_session\"",
            b"",
        ] {
            let err = decode::<LegacySession>("the/key", bytes).unwrap_err();
            assert!(
                matches!(err, Error::Corrupt { ref key, .. } if key == "the/key"),
                "{err:?}"
            );
        }
        let profile_bytes = encode(&StreamMeta {
            session: None,
            token: Secret::new("t"),
            created_at: Timestamp::now(),
            dropped_through: 0,
            writer: None,
            request: None,
            last_seq: 0,
        })
        .unwrap();
        assert!(matches!(
            decode::<LegacySession>("k", &profile_bytes),
            Err(Error::Corrupt { .. })
        ));
        // A stored session id that is no longer valid ASCII is corrupt, not a value.
        let mut v: serde_json::Value =
            serde_json::from_slice(&encode(&session()).unwrap()).unwrap();
        v["record"]["session_id"] = "bad id\u{e9}".into();
        let err = decode::<LegacySession>("k", &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    }

    #[test]
    fn credentials_debug_has_no_token_text() {
        let creds = Credentials {
            key: CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap(),
            access_token: Secret::new("ACCESS-abc123"),
            token_type: "Bearer".into(),
            expires_at: None,
            refresh_token: Some(Secret::new("REFRESH-xyz789")),
            scopes: vec!["mcp".into()],
            client: ClientRegistration {
                client_id: "client-1".into(),
                client_secret: Some(Secret::new("CLIENTSECRET-q")),
                metadata_url: None,
                token_endpoint_auth_method: None,
            },
            server_metadata: None,
            obtained_at: Timestamp::now(),
        };
        let debug = format!("{creds:?} {creds:#?}");
        for secret in ["ACCESS-abc123", "REFRESH-xyz789", "CLIENTSECRET-q"] {
            assert!(!debug.contains(secret), "{secret} leaked into Debug");
        }
        assert!(debug.contains("client-1"));
    }
}
