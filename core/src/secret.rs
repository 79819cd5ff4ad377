//! [`Secret`]: a string that never prints.

use std::fmt;

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// A token, client secret or PKCE verifier.
///
/// `Debug` and `Display` print `[redacted]`; the text is reachable only through
/// [`expose_secret`](Secret::expose_secret), so it cannot slip into a log line
/// or an error message by accident. The memory is zeroed when the value drops.
/// It serializes as the plain string, because stores must keep it; files that
/// hold it are created 0600 by the file and SQLite backends.
///
/// ```
/// use mcp_persist_core::Secret;
/// let token = Secret::new("eyJhbGciOi...");
/// assert_eq!(format!("{token:?} {token}"), "[redacted] [redacted]");
/// assert_eq!(token.expose_secret(), "eyJhbGciOi...");
/// ```
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

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
