//! [`Key`]: a key or log name, validated once.

use std::{borrow::Borrow, fmt, ops::Deref, sync::Arc};

use crate::{Error, Result};

/// The longest key (and log name) in bytes that every backend must accept.
pub const MAX_KEY_BYTES: usize = 1024;

/// A key of a [`KvStore`](crate::KvStore) record or the name of a
/// [`LogStore`](crate::LogStore) log: a non-empty UTF-8 string of at most
/// [`MAX_KEY_BYTES`] bytes without a NUL character.
///
/// A `Key` is checked when it is made and never again: backends receive keys
/// that are already valid, so none of them repeats the rules. Any other
/// character (`/`, `..`, spaces, non-ASCII text) is allowed and must
/// round-trip exactly through [`KvStore::list`](crate::KvStore::list).
///
/// The typed stores build their keys from the [record
/// declarations](crate::declare); tools build one from text with
/// [`Key::new`] or `parse`.
///
/// ```
/// use mcp_persist_core::{Error, Key};
/// let key = Key::new("app/session/abc")?;
/// assert_eq!(key.as_str(), "app/session/abc");
/// assert!(key.starts_with("app/")); // a `Key` reads as a `str`
/// assert!(matches!(Key::new(""), Err(Error::InvalidInput { .. })));
/// assert!(matches!(Key::new("a\0b"), Err(Error::InvalidInput { .. })));
/// assert!(matches!(Key::new("k".repeat(1025)), Err(Error::TooLarge { .. })));
/// # Ok::<_, Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// Checks `key` against the rules above.
    pub fn new(key: impl AsRef<str> + Into<Arc<str>>) -> Result<Key> {
        check(key.as_ref())?;
        Ok(Key(key.into()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn check(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key", "must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::TooLarge {
            what: "key",
            size: key.len(),
            limit: MAX_KEY_BYTES,
        });
    }
    if key.contains('\0') {
        return Err(Error::invalid("key", "must not contain NUL"));
    }
    Ok(())
}

impl Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", &*self.0)
    }
}

impl std::str::FromStr for Key {
    type Err = Error;

    fn from_str(s: &str) -> Result<Key> {
        Key::new(s)
    }
}

impl TryFrom<&str> for Key {
    type Error = Error;

    fn try_from(s: &str) -> Result<Key> {
        Key::new(s)
    }
}

impl TryFrom<String> for Key {
    type Error = Error;

    fn try_from(s: String) -> Result<Key> {
        Key::new(s)
    }
}

impl From<Key> for String {
    fn from(key: Key) -> String {
        key.0.to_string()
    }
}

impl PartialEq<str> for Key {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Key {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Key {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}
