//! The one error type every store and backend returns.

use std::time::Duration;

/// A boxed error kept as the `source` of [`Error::Backend`] and friends.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a store operation.
///
/// Variants are semantic: callers match on them to decide what to do (retry a
/// compare-and-swap on [`Conflict`](Error::Conflict), start a fresh session on
/// [`Corrupt`](Error::Corrupt) or [`NewerSchema`](Error::NewerSchema), degrade to
/// memory on [`Unavailable`](Error::Unavailable)). Backends keep their own rich
/// error internally and convert into this one, keeping the cause as `source()`.
///
/// No variant ever carries a secret: keys are built from public identifiers
/// (URLs, session ids, hashes of OAuth `state` values), never from token text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`PutMode::Create`](crate::PutMode::Create) found a live record under the key.
    #[error("a record already exists under key `{key}`")]
    AlreadyExists {
        /// The key that was already taken.
        key: String,
    },

    /// A compare-and-swap precondition failed: the record under the key is not
    /// at the expected version (it changed, expired, or never existed). Read it
    /// again and retry, or give up.
    #[error("key `{key}` is not at the expected version (changed concurrently, or gone)")]
    Conflict {
        /// The key whose precondition failed.
        key: String,
    },

    /// A record exists but cannot be read back: truncated, garbage, or not the
    /// shape its kind requires. The record is left as it is; other keys still work.
    #[error("record under key `{key}` is corrupt: {reason}")]
    Corrupt {
        /// The key of the unreadable record.
        key: String,
        /// What was wrong with it, for a human.
        reason: String,
        /// The parse error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A record was written by a newer version of mcp-persist whose schema this
    /// version does not know. Nothing is misread and nothing is overwritten;
    /// upgrade the crates, or delete the record deliberately.
    #[error(
        "record under key `{key}` has schema version {found}, newer than {supported} which this version understands; upgrade mcp-persist"
    )]
    NewerSchema {
        /// The key of the record.
        key: String,
        /// The schema version found in the record.
        found: u32,
        /// The newest schema version this build understands.
        supported: u32,
    },

    /// A value or key is larger than the backend accepts.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What was too large (`"value"`, `"key"`, ...).
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },

    /// The backend cannot do this at all (Secrets Manager holds no logs, say).
    #[error("backend `{backend}` does not support {operation}")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
        /// The backend's name.
        backend: &'static str,
    },

    /// The caller passed something malformed: an empty key, a session id with a
    /// space in it, an event id that does not parse.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was invalid (`"session id"`, `"event id"`, `"key"`, ...).
        what: &'static str,
        /// Why, for a human. Never contains a secret.
        reason: String,
    },

    /// Something that must exist does not, or no longer does (an expired event
    /// stream, an unknown session).
    #[error("{what} not found{}", .detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    NotFound {
        /// What was looked for (`"event stream"`, ...).
        what: &'static str,
        /// More context, when there is some to give.
        detail: Option<String>,
    },

    /// The backend could not be reached (connection refused, timed out). The
    /// operation may be retried later; the store itself is still usable.
    #[error("backend `{backend}` is unreachable; is the server running and reachable?")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// The transport error.
        #[source]
        source: BoxError,
    },

    /// Any other backend failure (I/O error, database error, throttling that
    /// outlasted the retries).
    #[error("backend `{backend}` failed: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The cause.
        #[source]
        source: BoxError,
    },

    /// A sealed record cannot be opened: the keyring lacks its key, it was
    /// altered or moved from another record, or it is plain text where plain
    /// text is refused ([`seal`](crate::seal)). Nothing was changed.
    #[error("record `{key}` {problem}")]
    Sealing {
        /// The record: its key, or `<log>#<seq>` for a log record.
        key: String,
        /// What is wrong, and what to do about it.
        problem: crate::seal::SealProblem,
    },

    /// The caller's OAuth refresh failed (the authorization server refused or
    /// was unreachable). The stored credential is unchanged.
    #[error("refreshing the credential failed: {source}")]
    Refresh {
        /// The refresh error. Never contains token text, as long as the
        /// caller's error does not.
        #[source]
        source: BoxError,
    },

    /// The operation did not finish within its time limit.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        operation: &'static str,
        /// How long it waited.
        after: Duration,
    },
}

impl Error {
    /// A [`Error::Backend`] from any error.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// A [`Error::Corrupt`] with a reason and no source.
    pub fn corrupt(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            key: key.into(),
            reason: reason.into(),
            source: None,
        }
    }

    /// A [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }

    /// True for errors worth retrying later as they are: the backend was
    /// unreachable or slow. A [`Conflict`](Error::Conflict) is not one of them:
    /// it needs a fresh read first.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }
}

/// The result type of every store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
