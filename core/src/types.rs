//! Identifiers and small value types shared by the records.

use std::{
    fmt,
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A point in wall-clock time, as milliseconds since the Unix epoch.
///
/// Stored records use wall-clock time because they outlive the process (an
/// [`Instant`](std::time::Instant) means nothing after a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// Now, by the system clock.
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }

    /// From milliseconds since the Unix epoch.
    pub const fn from_unix_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_unix_millis(self) -> u64 {
        self.0
    }

    /// This time plus `d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// Whether this time is now or earlier.
    pub fn is_past(self) -> bool {
        self <= Timestamp::now()
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
    }
}

/// The longest session id accepted, in bytes. Real servers use UUIDs (36) or
/// similar; anything much longer is far more likely garbage than an id.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// An `Mcp-Session-Id`: 1 to [`MAX_SESSION_ID_BYTES`] visible ASCII characters
/// (0x21 to 0x7E), as the 2025-11-25 transport requires.
///
/// ```
/// use mcp_persist_core::{Error, SessionId};
/// assert!(SessionId::new("3f2a-9c").is_ok());
/// assert!(matches!(SessionId::new("has space"), Err(Error::InvalidInput { .. })));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    /// Validates and wraps a session id.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        check_visible_ascii("session id", &id, MAX_SESSION_ID_BYTES)?;
        Ok(SessionId(id))
    }

    /// The id as sent in the header.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as log lines name it: the first 16 hex digits of its SHA-256
    /// ([`hash_session_id`](crate::telemetry::hash_session_id)), as spans
    /// do by default. Enough to follow one session through the logs, and
    /// useless to present to a server: a session id lets whoever holds it
    /// act in the session, and log lines reach wherever spans are exported.
    pub fn hashed(&self) -> String {
        crate::telemetry::hash_session_id(&self.0)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        SessionId::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({})", self.0)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub(crate) fn check_visible_ascii(what: &'static str, s: &str, max: usize) -> Result<()> {
    if s.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if s.len() > max {
        return Err(Error::invalid(
            what,
            format!("is {} bytes, over the limit of {max}", s.len()),
        ));
    }
    if let Some(bad) = s.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
        return Err(Error::invalid(
            what,
            format!("byte {bad} is not visible ASCII (0x21 to 0x7E)"),
        ));
    }
    Ok(())
}

/// A JSON-RPC request id: a number or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    /// A numeric id (what rmcp sends).
    Number(i64),
    /// A string id.
    String(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// Which shape of Streamable HTTP a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProtocolEra {
    /// 2025-03-26 to 2025-11-25: `initialize`, `Mcp-Session-Id`, resumable SSE.
    Legacy,
    /// 2026-07-28 and later: no handshake, no session, `_meta` on every request.
    Modern,
}

/// An MCP protocol revision, such as `2025-11-25`.
///
/// Revisions are dates, so they order as their text does.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ProtocolVersion(String);

impl ProtocolVersion {
    /// The last revision with sessions and resumable streams.
    pub const LATEST_LEGACY: &'static str = "2025-11-25";
    /// The first revision without sessions.
    pub const FIRST_MODERN: &'static str = "2026-07-28";

    /// Validates a revision string (`YYYY-MM-DD`).
    pub fn new(version: impl Into<String>) -> Result<Self> {
        let v = version.into();
        let b = v.as_bytes();
        let shape_ok = b.len() == 10
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                _ => c.is_ascii_digit(),
            });
        if !shape_ok {
            return Err(Error::invalid(
                "protocol version",
                format!("{v:?} is not a YYYY-MM-DD revision"),
            ));
        }
        Ok(ProtocolVersion(v))
    }

    /// The revision text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The era this revision belongs to.
    pub fn era(&self) -> ProtocolEra {
        if self.0.as_str() >= Self::FIRST_MODERN {
            ProtocolEra::Modern
        } else {
            ProtocolEra::Legacy
        }
    }
}

impl<'de> Deserialize<'de> for ProtocolVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ProtocolVersion::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtocolVersion({})", self.0)
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest profile name, in bytes.
pub const MAX_PROFILE_BYTES: usize = 64;

/// Which server, and as whom: the key of all client-side state.
///
/// The endpoint is canonicalized so that spellings of one URL share state:
/// scheme and host are lower-cased, a default port is dropped, a trailing
/// slash of the path is dropped, and a fragment is dropped. The query is kept.
/// URLs with user info are refused, because a password must not become a key.
/// The profile separates identities that talk to one server from one store
/// (`default` when there is just one); it is 1 to 64 characters of
/// `[A-Za-z0-9._-]`.
///
/// ```
/// use mcp_persist_core::ServerKey;
/// let a = ServerKey::new("HTTPS://Example.COM:443/mcp/", "default")?;
/// let b = ServerKey::new("https://example.com/mcp", "default")?;
/// assert_eq!(a, b);
/// assert_eq!(a.endpoint(), "https://example.com/mcp");
/// # Ok::<_, mcp_persist_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerKey {
    endpoint: String,
    profile: String,
}

impl ServerKey {
    /// Canonicalizes `endpoint` and validates `profile`.
    pub fn new(endpoint: &str, profile: &str) -> Result<Self> {
        Ok(ServerKey {
            endpoint: canonical_url("endpoint URL", endpoint)?,
            profile: validate_profile(profile)?,
        })
    }

    /// The canonical endpoint URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The profile name.
    pub fn profile(&self) -> &str {
        &self.profile
    }
}

impl fmt::Display for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (profile {})", self.endpoint, self.profile)
    }
}

fn validate_profile(profile: &str) -> Result<String> {
    if profile.is_empty() || profile.len() > MAX_PROFILE_BYTES {
        return Err(Error::invalid(
            "profile name",
            format!("must be 1 to {MAX_PROFILE_BYTES} bytes"),
        ));
    }
    if !profile
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(Error::invalid(
            "profile name",
            format!("{profile:?} may only hold A-Z, a-z, 0-9, '.', '_' and '-'"),
        ));
    }
    Ok(profile.to_owned())
}

/// Canonicalizes an http(s) URL the way [`ServerKey`] documents.
pub fn canonical_url(what: &'static str, input: &str) -> Result<String> {
    let mut url = url::Url::parse(input.trim())
        .map_err(|e| Error::invalid(what, format!("{input:?} does not parse: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::invalid(
            what,
            format!("scheme {:?} is not http or https", url.scheme()),
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid(
            what,
            "must not contain user info; pass credentials through the auth support",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::invalid(what, "has no host"));
    }
    url.set_fragment(None);
    let path = url.path().to_owned();
    if path.len() > 1 && path.ends_with('/') {
        url.set_path(path.trim_end_matches('/'));
    }
    let mut s = String::from(url);
    // The root path is rendered as a lone trailing slash; drop it too.
    if url_has_root_path_only(&s) {
        s.pop();
    }
    Ok(s)
}

fn url_has_root_path_only(s: &str) -> bool {
    // "scheme://host[:port]/" with nothing after the slash.
    s.ends_with('/') && s.matches('/').count() == 3
}

/// The longest stream id, in bytes.
pub const MAX_STREAM_ID_BYTES: usize = 512;

/// The id of one SSE event: which stream it belongs to, its place in that
/// stream, and the stream's unguessable 128-bit token.
///
/// Written as `<32 hex digits>-<sequence>-<stream>`. The token is drawn once
/// per stream and checked on replay, so a client that knows one stream's id
/// cannot forge an id that reads another stream. Parsing refuses anything
/// that is not exactly that shape, so `format(parse(s)) == s`.
///
/// ```
/// use mcp_persist_core::EventId;
/// let id: EventId = "00112233445566778899aabbccddeeff-42-stream-a".parse()?;
/// assert_eq!((id.stream(), id.seq()), ("stream-a", 42));
/// assert_eq!(id.to_string(), "00112233445566778899aabbccddeeff-42-stream-a");
/// assert!("0011-42-x".parse::<EventId>().is_err());
/// # Ok::<_, mcp_persist_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EventId {
    token: [u8; 16],
    seq: u64,
    stream: String,
}

impl EventId {
    pub(crate) fn new(token: [u8; 16], seq: u64, stream: &str) -> Self {
        EventId {
            token,
            seq,
            stream: stream.to_owned(),
        }
    }

    /// The stream this event belongs to.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The event's sequence number within its stream.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn token(&self) -> &[u8; 16] {
        &self.token
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Sent with every event: the token's digits are written from the
        // stack rather than from a string of their own.
        let mut token = [0u8; 32];
        f.write_str(hex_into(&self.token, &mut token))?;
        write!(f, "-{}-", self.seq)?;
        f.write_str(&self.stream)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is what makes the id unguessable: keep it out of logs.
        write!(f, "EventId({}#{})", self.stream, self.seq)
    }
}

impl FromStr for EventId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid("event id", why.to_owned());
        let (token_hex, rest) = s.split_once('-').ok_or_else(|| bad("missing '-'"))?;
        let (seq, stream) = rest
            .split_once('-')
            .ok_or_else(|| bad("missing sequence"))?;
        let token =
            unhex16(token_hex).ok_or_else(|| bad("token is not 32 lowercase hex digits"))?;
        let canonical_number = !seq.is_empty()
            && seq.bytes().all(|b| b.is_ascii_digit())
            && (seq == "0" || !seq.starts_with('0'));
        if !canonical_number {
            return Err(bad("sequence is not a decimal number"));
        }
        let seq: u64 = seq.parse().map_err(|_| bad("sequence is out of range"))?;
        check_visible_ascii("event id", stream, MAX_STREAM_ID_BYTES)?;
        Ok(EventId::new(token, seq, stream))
    }
}

pub(crate) use crate::kit::hex;
use crate::kit::hex_into;

fn unhex16(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 32 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 16];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// 16 bytes from the operating system's random source.
pub(crate) fn random_token() -> Result<[u8; 16]> {
    let mut token = [0u8; 16];
    getrandom::fill(&mut token).map_err(|e| Error::backend("os random", e.to_string()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_key_canonicalization() {
        let canon = |u: &str| ServerKey::new(u, "default").map(|k| k.endpoint().to_owned());
        assert_eq!(
            canon("HTTP://LocalHost:80/MCP").unwrap(),
            "http://localhost/MCP"
        );
        assert_eq!(
            canon("https://a.example:443/mcp/").unwrap(),
            "https://a.example/mcp"
        );
        assert_eq!(
            canon("https://a.example:8443/mcp").unwrap(),
            "https://a.example:8443/mcp"
        );
        assert_eq!(canon("https://a.example/").unwrap(), "https://a.example");
        assert_eq!(canon("https://a.example").unwrap(), "https://a.example");
        assert_eq!(
            canon("https://a.example/mcp?x=1#frag").unwrap(),
            "https://a.example/mcp?x=1"
        );
        assert_eq!(
            canon(" https://a.example/mcp// ").unwrap(),
            "https://a.example/mcp"
        );
        for bad in [
            "ftp://a.example/",
            "not a url",
            "https://user:pw@a.example/mcp",
            "file:///etc",
        ] {
            assert!(
                matches!(canon(bad), Err(Error::InvalidInput { .. })),
                "{bad}"
            );
        }
        // Different paths, ports and profiles are different keys.
        assert_ne!(
            ServerKey::new("https://a.example/a", "p").unwrap(),
            ServerKey::new("https://a.example/b", "p").unwrap()
        );
        assert_ne!(
            ServerKey::new("https://a.example/a", "p").unwrap(),
            ServerKey::new("https://a.example/a", "q").unwrap()
        );
        for bad in ["", "a/b", "white space", &"x".repeat(65)] {
            assert!(
                ServerKey::new("https://a.example", bad).is_err(),
                "profile {bad:?}"
            );
        }
    }

    #[test]
    fn session_id_validation() {
        assert!(SessionId::new("abc-DEF_123~!").is_ok());
        assert!(SessionId::new("x".repeat(MAX_SESSION_ID_BYTES)).is_ok());
        for bad in ["", "a b", "tab\there", "nul\0", "é", "line\n"] {
            assert!(
                matches!(SessionId::new(bad), Err(Error::InvalidInput { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            SessionId::new("x".repeat(MAX_SESSION_ID_BYTES + 1)),
            Err(Error::InvalidInput { .. })
        ));
        // Deserializing validates too: a stored id that went bad is an error, not a value.
        assert!(serde_json::from_str::<SessionId>("\"bad id\"").is_err());
    }

    #[test]
    fn protocol_versions() {
        let legacy = ProtocolVersion::new("2025-11-25").unwrap();
        let modern = ProtocolVersion::new("2026-07-28").unwrap();
        assert_eq!(legacy.era(), ProtocolEra::Legacy);
        assert_eq!(modern.era(), ProtocolEra::Modern);
        assert!(legacy < modern);
        for bad in ["2025-1-25", "latest", "2025/11/25", ""] {
            assert!(ProtocolVersion::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn event_id_roundtrip_and_rejects() {
        let id = EventId::new([0xab; 16], 7, "sess:common");
        let text = id.to_string();
        let back: EventId = text.parse().unwrap();
        assert_eq!(back, id);
        assert_eq!(back.to_string(), text);
        let token = "ab".repeat(16);
        for bad in [
            String::new(),
            token.clone(),
            format!("{token}-1"),
            format!("{token}-1-"),
            format!("{token}--s"),
            format!("{token}-01-s"),
            format!("{token}-+1-s"),
            format!("{token}-18446744073709551616-s"),
            format!("{}-1-s", "AB".repeat(16)),
            format!("{}-1-s", "ab".repeat(15)),
            format!("{token}-1-has space"),
            format!("{token}-1-{}", "s".repeat(MAX_STREAM_ID_BYTES + 1)),
        ] {
            assert!(
                matches!(bad.parse::<EventId>(), Err(Error::InvalidInput { .. })),
                "{bad:?}"
            );
        }
        // The token never shows in Debug.
        assert!(!format!("{id:?}").contains("abab"));
    }
}
