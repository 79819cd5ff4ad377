//! Version stamps: what this store keeps in a secret version's id.
//!
//! Secrets Manager lets the writer choose a version's id (the client request
//! token, 32 to 64 characters). This store writes every version with a
//! stamp as its id, so the whole 64 KiB of the secret stays for the value:
//!
//! ```text
//! mp1 <counter: 16 hex> <expiry, ms since the epoch, 0 = none: 12 hex> <kind: v|e|t>
//!     <digest: 20 hex> <predecessor: 12 hex>
//! ```
//!
//! (64 characters, written without the spaces and the line break).
//!
//! * the **counter** is the record's [`Version`](mcp_persist_core::Version):
//!   above the previous one and the clock (microseconds times 1024), plus a
//!   random number below 1024, so that two writers racing from one version
//!   in the same microsecond do not choose the same id (each would take the
//!   other's write for its own);
//! * the **expiry** is the TTL, honoured on every read;
//! * the **kind** says whether the version holds a value, the empty value
//!   (Secrets Manager refuses empty secrets, so a placeholder byte is
//!   stored), or a tombstone left by a delete;
//! * the **digest** is the first 80 bits of a SHA-256 over the key, the
//!   counter, the expiry, the kind and the value. It makes the id
//!   deterministic (a retried call is recognised as the same write), and a
//!   read checks it, so a value that does not belong to its key or stamp is
//!   [`Error::Corrupt`] rather than returned;
//! * the **predecessor** is the first 48 bits of a SHA-256 of the id of the
//!   version this one replaced (zeros for the first). A writer only replaces
//!   a version it read as current, so a version naming ours as predecessor
//!   proves that ours was current once: a write whose answer was lost, and
//!   which others have written over since, is still known to have landed.
//!
//! The leading `mp` and schema digit let a later format be recognised as
//! [`Error::NewerSchema`] instead of being misread.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_persist_core::{Error, Result};
use sha2::{Digest, Sha256};

const MAGIC: &str = "mp";
/// The stamp schema this build writes and reads.
pub(crate) const SCHEMA: u32 = 1;
const LEN: usize = 2 + 1 + 16 + 12 + 1 + 20 + 12;
/// The largest expiry a stamp holds (48 bits of milliseconds, year 10889).
const MAX_EXPIRY_MS: u64 = (1 << 48) - 1;

/// What a version holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A value of at least one byte, stored as it is.
    Value,
    /// The empty value (a placeholder byte is stored).
    Empty,
    /// A delete: the key is absent from this version on.
    Tombstone,
}

impl Kind {
    fn code(self) -> char {
        match self {
            Kind::Value => 'v',
            Kind::Empty => 'e',
            Kind::Tombstone => 't',
        }
    }
}

/// A parsed version stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) counter: u64,
    /// Milliseconds since the epoch after which the record is gone; 0: never.
    pub(crate) expires_ms: u64,
    pub(crate) kind: Kind,
    digest: [u8; 10],
    predecessor: [u8; 6],
}

/// Milliseconds since the Unix epoch, by the kit's clock.
pub(crate) fn now_ms() -> u64 {
    mcp_persist_core::kit::now().as_unix_millis()
}

/// Microseconds since the Unix epoch: the floor of every new counter, so
/// versions keep increasing even after a secret was removed for good.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The expiry of a write made now with `ttl` (0: none).
pub(crate) fn expiry(ttl: Option<Duration>) -> u64 {
    match ttl {
        None => 0,
        // The kit's rule: rounded up, so a record never expires early.
        Some(ttl) => mcp_persist_core::kit::expires_at(ttl)
            .as_unix_millis()
            .clamp(1, MAX_EXPIRY_MS),
    }
}

fn digest(key: &str, counter: u64, expires_ms: u64, kind: Kind, value: &[u8]) -> [u8; 10] {
    let mut hash = Sha256::new();
    hash.update(b"mcp-persist secrets manager stamp v1\0");
    hash.update((key.len() as u64).to_be_bytes());
    hash.update(key.as_bytes());
    hash.update(counter.to_be_bytes());
    hash.update(expires_ms.to_be_bytes());
    hash.update([kind.code() as u8]);
    hash.update(value);
    let full = hash.finalize();
    let mut out = [0u8; 10];
    out.copy_from_slice(&full[..10]);
    out
}

/// The link to a predecessor version id.
fn link(id: &str) -> [u8; 6] {
    let full = Sha256::digest(id.as_bytes());
    let mut out = [0u8; 6];
    out.copy_from_slice(&full[..6]);
    out
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Stamp {
    /// The stamp of a new version, replacing the version `predecessor`
    /// (`None` for the first version of a secret).
    pub(crate) fn new(
        key: &str,
        counter: u64,
        expires_ms: u64,
        kind: Kind,
        value: &[u8],
        predecessor: Option<&str>,
    ) -> Self {
        Stamp {
            counter,
            expires_ms,
            kind,
            digest: digest(key, counter, expires_ms, kind, value),
            predecessor: predecessor.map_or([0; 6], link),
        }
    }

    /// Whether this version replaced the version with id `id`.
    pub(crate) fn follows(&self, id: &str) -> bool {
        self.predecessor == link(id)
    }

    /// The version id to write.
    pub(crate) fn id(&self) -> String {
        let mut id = format!(
            "{MAGIC}{SCHEMA}{:016x}{:012x}{}",
            self.counter,
            self.expires_ms,
            self.kind.code()
        );
        id.push_str(&mcp_persist_core::kit::hex(&self.digest));
        id.push_str(&mcp_persist_core::kit::hex(&self.predecessor));
        id
    }

    /// Parses a version id; `key` names the record in errors.
    pub(crate) fn parse(key: &str, id: &str) -> Result<Self> {
        let not_ours = || {
            Error::corrupt(
                key,
                "the secret's current version was not written by mcp-persist",
            )
        };
        let rest = id.strip_prefix(MAGIC).ok_or_else(not_ours)?;
        let schema = rest
            .chars()
            .next()
            .and_then(|c| c.to_digit(10))
            .ok_or_else(not_ours)?;
        if schema > SCHEMA {
            return Err(Error::NewerSchema {
                key: key.into(),
                found: schema,
                supported: SCHEMA,
            });
        }
        if schema != SCHEMA || id.len() != LEN || !id.is_ascii() {
            return Err(not_ours());
        }
        let hex = |range: std::ops::Range<usize>| {
            u64::from_str_radix(&id[range], 16).map_err(|_| not_ours())
        };
        let counter = hex(3..19)?;
        let expires_ms = hex(19..31)?;
        let kind = match &id[31..32] {
            "v" => Kind::Value,
            "e" => Kind::Empty,
            "t" => Kind::Tombstone,
            _ => return Err(not_ours()),
        };
        let digest = hex_bytes(&id[32..52]).ok_or_else(not_ours)?;
        let predecessor = hex_bytes(&id[52..64]).ok_or_else(not_ours)?;
        Ok(Stamp {
            counter,
            expires_ms,
            kind,
            digest,
            predecessor,
        })
    }

    /// Whether the record is there at `now_ms`: not a tombstone, not expired.
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        self.kind != Kind::Tombstone && (self.expires_ms == 0 || self.expires_ms > now_ms)
    }

    /// Whether a sweep at `now_ms` may remove the secret for good: a
    /// deletion marker, or a record that expired at least `margin_ms` ago.
    /// A record expired more recently is absent to reads but kept, so a
    /// wall clock stepped forward for a moment cannot destroy it.
    pub(crate) fn sweepable(&self, now_ms: u64, margin_ms: u64) -> bool {
        self.kind == Kind::Tombstone
            || (self.expires_ms != 0 && self.expires_ms <= now_ms.saturating_sub(margin_ms))
    }

    /// Whether `value` is what this stamp was written with, for `key`.
    pub(crate) fn matches(&self, key: &str, value: &[u8]) -> bool {
        digest(key, self.counter, self.expires_ms, self.kind, value) == self.digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_keep_what_expired_within_the_margin() {
        let margin = 60_000;
        let now = 10 * margin;
        let at = |expires_ms, kind| Stamp::new("k", 1, expires_ms, kind, b"v", None);
        // Expired a moment ago (or a clock stepped forward): absent, kept.
        let recent = at(now - 1_000, Kind::Value);
        assert!(!recent.is_live(now) && !recent.sweepable(now, margin));
        // Expired longer ago than the margin: removed.
        assert!(at(now - margin, Kind::Value).sweepable(now, margin));
        // No TTL, or not expired: never swept.
        assert!(!at(0, Kind::Value).sweepable(now, margin));
        assert!(!at(now + 1, Kind::Value).sweepable(now, margin));
        // A deletion marker goes at once.
        assert!(at(0, Kind::Tombstone).sweepable(now, margin));
    }

    #[test]
    fn stamps_round_trip_within_the_token_limits() {
        for (kind, value) in [
            (Kind::Value, &b"hello"[..]),
            (Kind::Empty, &b""[..]),
            (Kind::Tombstone, &b""[..]),
        ] {
            let stamp = Stamp::new("k", u64::MAX, MAX_EXPIRY_MS, kind, value, Some("before"));
            let id = stamp.id();
            assert!((32..=64).contains(&id.len()), "{}", id.len());
            assert!(stamp.follows("before") && !stamp.follows("other"));
            let first = Stamp::new("k", 1, 0, kind, value, None);
            assert!(!first.follows("before"));
            let parsed = Stamp::parse("k", &id).expect("parses");
            assert_eq!(parsed, stamp);
            assert!(parsed.matches("k", value));
            assert!(!parsed.matches("other", value));
            assert!(!parsed.matches("k", b"changed"));
        }
    }

    #[test]
    fn liveness_follows_kind_and_expiry() {
        let now = now_ms();
        assert!(Stamp::new("k", 1, 0, Kind::Value, b"x", None).is_live(now));
        assert!(Stamp::new("k", 1, now + 1000, Kind::Value, b"x", None).is_live(now));
        assert!(!Stamp::new("k", 1, now, Kind::Value, b"x", None).is_live(now));
        assert!(!Stamp::new("k", 1, 0, Kind::Tombstone, b"", None).is_live(now));
    }

    #[test]
    fn foreign_and_newer_ids_are_typed_errors() {
        let uuid = "EXAMPLE1-90ab-cdef-fedc-ba987EXAMPLE";
        assert!(matches!(
            Stamp::parse("k", uuid),
            Err(Error::Corrupt { ref key, .. }) if key == "k"
        ));
        let newer = Stamp::new("k", 1, 0, Kind::Value, b"x", None)
            .id()
            .replacen("mp1", "mp2", 1);
        assert!(matches!(
            Stamp::parse("k", &newer),
            Err(Error::NewerSchema {
                found: 2,
                supported: 1,
                ..
            })
        ));
        let mut bad = Stamp::new("k", 1, 0, Kind::Value, b"x", None).id();
        bad.replace_range(31..32, "z");
        assert!(matches!(
            Stamp::parse("k", &bad),
            Err(Error::Corrupt { .. })
        ));
    }
}
