//! What the client tells the application: how it started, what happened to
//! its session, and its errors.

use mcp_persist_core::{BoxError, Error as StoreError, SessionId};

/// How a client process started.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartKind {
    /// On the stored session: no `initialize` is sent.
    Resumed {
        /// The session continued.
        session_id: SessionId,
    },
    /// A stored session was resumed, but the server no longer knew it (it
    /// answered 404): a real `initialize` replaced it, and the old
    /// session's server-side state is gone.
    Replaced {
        /// The stored session the server no longer knew.
        expired: SessionId,
        /// The session that replaced it (`None` until the new `initialize`
        /// has been answered).
        session_id: Option<SessionId>,
    },
    /// Nothing was stored for this server and profile.
    Fresh,
    /// Stored state was unusable and was not used; the reason says why.
    FreshAfterBadState {
        /// What was wrong with it.
        reason: String,
    },
    /// The store could not be read; the client runs on in-memory state.
    InMemory {
        /// What went wrong.
        reason: String,
    },
}

/// Something the application should know about its session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientNotice {
    /// A real `initialize` created a session (also after a 404).
    NewSession {
        /// The new session id.
        session_id: SessionId,
        /// The session it replaces, if any.
        replaced: Option<SessionId>,
    },
    /// The server answered 404 for the session: its server-side state
    /// (subscriptions, in-flight work, anything the server kept) is gone.
    /// rmcp re-initializes; a [`NewSession`](Self::NewSession) follows.
    SessionExpired {
        /// The session that is gone.
        session_id: SessionId,
    },
    /// Stored state was unusable and a fresh session is used instead.
    BadStoredState {
        /// What was wrong with it.
        reason: String,
    },
    /// A request sent under the stored era verdict was refused as an
    /// unsupported protocol version: the verdict was forgotten and the
    /// server probed again, once. `new_verdict` is what that probe stored
    /// (`None`: the probe failed and the next start probes again).
    StaleVerdict {
        /// The verdict that stopped working, e.g. `modern 2026-07-28`.
        stale: String,
        /// What the server answered.
        reason: String,
        /// The verdict the re-probe stored, if any.
        new_verdict: Option<String>,
    },
    /// The store failed; the client goes on with in-memory state only, and
    /// this process's session will not survive a restart.
    StoreDegraded {
        /// What failed.
        reason: String,
    },
}

/// Errors of the builder and the handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The endpoint URL or the profile name is not valid.
    #[error("invalid endpoint or profile")]
    InvalidTarget {
        /// The validation error.
        #[source]
        source: StoreError,
    },
    /// The default HTTP client could not be built.
    #[error("building the HTTP client failed")]
    Http {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
    /// The server refused to end the session.
    #[error("ending the session failed")]
    EndSession {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
}
