//! [`Secret`]: a string that never prints.

use std::{cell::Cell, fmt};

use serde::{Deserialize, Serialize, Serializer};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// A token, client secret or PKCE verifier.
///
/// `Debug` and `Display` print `[redacted]`; the text is reachable only through
/// [`expose_secret`](Secret::expose_secret), so it cannot slip into a log line
/// or an error message by accident. The memory is zeroed when the value drops.
/// It serializes as the plain string, because stores must keep it (sealed
/// first when the store encrypts), except while a tool renders a record for
/// people ([`inspect`](crate::stores::inspect)), where every `Secret` field
/// serializes as `[redacted]` whatever its name: a new secret field cannot
/// reach `mcp-persist show` by being forgotten in a list.
///
/// ```
/// use mcp_persist_core::Secret;
/// let token = Secret::new("eyJhbGciOi...");
/// assert_eq!(format!("{token:?} {token}"), "[redacted] [redacted]");
/// assert_eq!(token.expose_secret(), "eyJhbGciOi...");
/// ```
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

/// What a [`Secret`] serializes as while [`redacting`].
pub(crate) const REDACTED: &str = "[redacted]";

thread_local! {
    static REDACTING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every [`Secret`] serialized on this thread as
/// [`REDACTED`].
pub(crate) fn redacting<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            REDACTING.with(|r| r.set(self.0));
        }
    }
    let _reset = Reset(REDACTING.with(|r| r.replace(true)));
    f()
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if REDACTING.with(Cell::get) {
            serializer.serialize_str(REDACTED)
        } else {
            serializer.serialize_str(&self.0)
        }
    }
}

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret text. Call it only where the value goes on the wire or into
    /// a store, never to log it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}
