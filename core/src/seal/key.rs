//! Sealing keys and the keyring that holds them.

use std::{fmt, str::FromStr, sync::Arc};

use aws_lc_rs::aead::{AES_256_GCM, RandomizedNonceKey};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::{Error, Result, Secret, types::hex};

/// How many bytes a sealing key has (AES-256).
pub const KEY_BYTES: usize = 32;

/// The public name of a [`SealKey`]: the first 8 bytes of a SHA-256 digest
/// of the key, shown as 16 hex digits.
///
/// It is derived from the key, never chosen: two different keys never share
/// an id (short of a 64-bit hash collision), so "which key does this record
/// need" always has one answer, and a record that does not open under the
/// key its id names was altered or moved, not sealed with "another key of
/// the same name". It tells nothing about the key itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 8]);

impl KeyId {
    pub(crate) const LEN: usize = 8;

    pub(crate) fn from_bytes(bytes: [u8; 8]) -> Self {
        KeyId(bytes)
    }

    pub(crate) fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }

    fn of(material: &[u8]) -> Self {
        let digest = Sha256::new()
            .chain_update(b"mcp-persist sealing key id\0")
            .chain_update(material)
            .finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        KeyId(id)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl FromStr for KeyId {
    type Err = Error;

    /// Reads the 16 hex digits that `Display` writes.
    fn from_str(s: &str) -> Result<KeyId> {
        let bad = || Error::invalid("key id", format!("`{s}` is not 16 hex digits"));
        if s.len() != 16 || !s.is_ascii() {
            return Err(bad());
        }
        let mut id = [0u8; 8];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(KeyId(id))
    }
}

/// One AES-256-GCM sealing key.
///
/// The key material lives only inside the cipher (AWS-LC, which zeroes its
/// key schedule when it frees it); the bytes it was made from are zeroed as
/// soon as it is built. `Debug` shows the [`KeyId`] and nothing else.
///
/// ```
/// use mcp_persist_core::seal::SealKey;
/// let (key, text) = SealKey::generate()?;
/// let again = SealKey::from_base64(text.expose_secret())?;
/// assert_eq!(key.id(), again.id());
/// assert_eq!(format!("{key:?}"), format!("SealKey {{ id: {}, material: [redacted] }}", key.id()));
/// # Ok::<_, mcp_persist_core::Error>(())
/// ```
pub struct SealKey {
    id: KeyId,
    cipher: RandomizedNonceKey,
}

impl SealKey {
    /// A key from its 32 bytes. The caller keeps (and should zero) its own
    /// copy of them.
    pub fn from_bytes(material: &[u8]) -> Result<SealKey> {
        if material.len() != KEY_BYTES {
            return Err(Error::invalid(
                "sealing key",
                format!(
                    "a sealing key has {KEY_BYTES} bytes, not {}; make one with `openssl rand -base64 32`",
                    material.len()
                ),
            ));
        }
        let cipher = RandomizedNonceKey::new(&AES_256_GCM, material)
            .map_err(|_| Error::invalid("sealing key", "AES-256-GCM refused the key"))?;
        Ok(SealKey {
            id: KeyId::of(material),
            cipher,
        })
    }

    /// A key from its standard base64 text (44 characters, what
    /// `openssl rand -base64 32` prints). Surrounding spaces are ignored.
    /// An error never repeats the text.
    pub fn from_base64(text: &str) -> Result<SealKey> {
        let text = text.trim();
        let material = Zeroizing::new(STANDARD.decode(text).map_err(|_| {
            Error::invalid(
                "sealing key",
                format!(
                    "a key of {} characters is not standard base64; make one with `openssl rand -base64 32`",
                    text.len()
                ),
            )
        })?);
        SealKey::from_bytes(&material)
    }

    /// A new random key, and its base64 text (to put where operators keep
    /// keys; it is shown nowhere else).
    pub fn generate() -> Result<(SealKey, Secret)> {
        let mut material = Zeroizing::new([0u8; KEY_BYTES]);
        aws_lc_rs::rand::fill(&mut material[..])
            .map_err(|_| Error::backend("os random", "no random bytes for a sealing key"))?;
        let key = SealKey::from_bytes(&material[..])?;
        let text = Secret::new(STANDARD.encode(&material[..]));
        Ok((key, text))
    }

    /// The key's id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    pub(crate) fn cipher(&self) -> &RandomizedNonceKey {
        &self.cipher
    }
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey")
            .field("id", &format_args!("{}", self.id))
            .field("material", &format_args!("[redacted]"))
            .finish()
    }
}

/// The keys a store is sealed with: one **active** key that seals every
/// write, and any number of **old** keys that still open what they sealed.
///
/// Cloning is cheap (the keys are shared). `Debug` shows key ids only.
///
/// # Text form
///
/// [`Keyring::parse`] reads what environment variables, key files and
/// secrets hold: base64 keys separated by newlines, commas or spaces, the
/// **first one active**; `#` starts a comment.
///
/// ```
/// use mcp_persist_core::seal::{Keyring, SealKey};
/// let (new, new_text) = SealKey::generate()?;
/// let (old, old_text) = SealKey::generate()?;
/// let text = format!(
///     "# active first\n{}\n{}  # retired in June\n",
///     new_text.expose_secret(),
///     old_text.expose_secret()
/// );
/// let ring = Keyring::parse(&text, "the example")?;
/// assert_eq!(ring.active(), new.id());
/// assert_eq!(ring.ids(), vec![new.id(), old.id()]);
/// assert!(!format!("{ring:?}").contains(new_text.expose_secret()));
/// # Ok::<_, mcp_persist_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Keyring {
    active: Arc<SealKey>,
    old: Vec<Arc<SealKey>>,
}

impl Keyring {
    /// A ring whose only key, `active`, seals and opens.
    pub fn new(active: SealKey) -> Keyring {
        Keyring {
            active: Arc::new(active),
            old: Vec::new(),
        }
    }

    /// The same ring, also opening what `old` sealed. A key already in the
    /// ring is not added twice.
    pub fn with_old(mut self, old: SealKey) -> Keyring {
        if !self.holds(old.id()) {
            self.old.push(Arc::new(old));
        }
        self
    }

    /// The ring after a rotation: `active` seals from now on, and the key
    /// that was active is kept as an old one.
    pub fn rotated(self, active: SealKey) -> Keyring {
        let mut old = vec![self.active];
        old.extend(self.old);
        old.retain(|k| k.id() != active.id());
        Keyring {
            active: Arc::new(active),
            old,
        }
    }

    /// The same ring without the old key `id` (retired once `check` finds
    /// nothing sealed with it). The active key is never removed.
    pub fn without(mut self, id: KeyId) -> Keyring {
        self.old.retain(|k| k.id() != id);
        self
    }

    /// Reads the [text form](Keyring#text-form). `origin` says where the
    /// text came from (`"environment variable MCP_PERSIST_KEYS"`), for
    /// errors, which never repeat key text.
    pub fn parse(text: &str, origin: &str) -> Result<Keyring> {
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default();
            for word in line.split(|c: char| c == ',' || c.is_whitespace()) {
                if word.is_empty() {
                    continue;
                }
                let n = keys.len() + 1;
                let key = SealKey::from_base64(word).map_err(|e| match e {
                    Error::InvalidInput { reason, .. } => Error::invalid(
                        "keyring",
                        format!("key {n} of {origin} is unusable: {reason}"),
                    ),
                    other => other,
                })?;
                keys.push(key);
            }
        }
        let mut keys = keys.into_iter();
        let Some(active) = keys.next() else {
            return Err(Error::invalid(
                "keyring",
                format!(
                    "{origin} holds no key; put base64 keys there, the active one first (make one with `openssl rand -base64 32`)"
                ),
            ));
        };
        Ok(keys.fold(Keyring::new(active), Keyring::with_old))
    }

    /// The id of the active key.
    pub fn active(&self) -> KeyId {
        self.active.id()
    }

    /// Every key id, the active one first.
    pub fn ids(&self) -> Vec<KeyId> {
        std::iter::once(self.active.id())
            .chain(self.old.iter().map(|k| k.id()))
            .collect()
    }

    /// Whether the ring holds key `id`.
    pub fn holds(&self, id: KeyId) -> bool {
        self.key(id).is_some()
    }

    pub(crate) fn active_key(&self) -> &SealKey {
        &self.active
    }

    pub(crate) fn key(&self, id: KeyId) -> Option<&SealKey> {
        std::iter::once(&self.active)
            .chain(&self.old)
            .find(|k| k.id() == id)
            .map(|k| &**k)
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("active", &format_args!("{}", self.active.id()))
            .field(
                "old",
                &self
                    .old
                    .iter()
                    .map(|k| k.id().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_errors_never_repeat_the_text() {
        let secret_ish = "c2VjcmV0LWJ1dC1ub3QtMzItYnl0ZXM=";
        let err = SealKey::from_base64(secret_ish).unwrap_err().to_string();
        assert!(!err.contains(secret_ish), "{err}");
        assert!(err.contains("32 bytes"), "{err}");
        let err = Keyring::parse(&format!("!!{secret_ish}"), "the test")
            .unwrap_err()
            .to_string();
        assert!(!err.contains(secret_ish), "{err}");
        assert!(err.contains("key 1 of the test"), "{err}");
        assert!(matches!(
            Keyring::parse("# nothing\n\n", "file k"),
            Err(Error::InvalidInput { .. })
        ));
    }

    #[test]
    fn ids_are_derived_stable_and_parse_back() {
        let material = [7u8; KEY_BYTES];
        let a = SealKey::from_bytes(&material).unwrap();
        let b = SealKey::from_bytes(&material).unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), SealKey::from_bytes(&[8u8; KEY_BYTES]).unwrap().id());
        assert_eq!(a.id().to_string().parse::<KeyId>().unwrap(), a.id());
        assert!("xyz".parse::<KeyId>().is_err());
        assert!("zz00000000000000".parse::<KeyId>().is_err());
    }

    #[test]
    fn rotation_keeps_the_former_active_key_and_without_retires_it() {
        let (k1, _) = SealKey::generate().unwrap();
        let (k2, _) = SealKey::generate().unwrap();
        let (id1, id2) = (k1.id(), k2.id());
        let ring = Keyring::new(k1).rotated(k2);
        assert_eq!(ring.ids(), vec![id2, id1]);
        let ring = ring.without(id1);
        assert_eq!(ring.ids(), vec![id2]);
        assert_eq!(ring.clone().without(id2).ids(), vec![id2], "active stays");
    }
}
