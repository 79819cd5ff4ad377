//! From Redis errors to [`mcp_persist_core::Error`].

use std::{fmt, time::Duration};

use mcp_persist_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// The reason of the [`Error::Corrupt`] for a key holding a value of another
/// Redis type than the store writes there.
pub(crate) const WRONG_TYPE: &str = "the Redis key holds a value of another type";

/// Maps a Redis error met while working on `key` (a store key or log name).
///
/// Anything that says the server cannot be reached or cannot serve right now
/// (refused, dropped, timed out, loading its data, cluster down) becomes
/// [`Error::Unavailable`]; a key holding another Redis type becomes
/// [`Error::Corrupt`] naming the key; everything else is [`Error::Backend`].
/// The Redis error is kept as the `source` in every case.
pub(crate) fn map(err: RedisError, key: &str) -> Error {
    if unreachable(&err) {
        tracing::warn!(key, error = %err, "redis unreachable");
        return Error::Unavailable {
            backend: BACKEND,
            source: Box::new(err),
        };
    }
    if err.code() == Some("WRONGTYPE") {
        return Error::Corrupt {
            key: key.to_owned(),
            reason: WRONG_TYPE.to_owned(),
            source: Some(Box::new(err)),
        };
    }
    if err.detail().is_some_and(is_below_foreign_top) {
        return Error::Corrupt {
            key: key.to_owned(),
            reason: FOREIGN_TOP.to_owned(),
            source: Some(Box::new(err)),
        };
    }
    Error::backend(BACKEND, err)
}

/// The reason of the [`Error::Corrupt`] for an append to a stream whose
/// last id is not one this store writes (`0-<n>`): Redis refuses every
/// `0-*` id at or below it, so nothing is appended.
pub(crate) const FOREIGN_TOP: &str = "the stream's last entry id was not written by this store \
     (Redis refuses the next `0-<n>` id at or below it; nothing was appended)";

/// Whether a Redis error text is `XADD`'s refusal of an id at or below the
/// stream's last one: for the store's `0-*`, a last id it never writes.
pub(crate) fn is_below_foreign_top(text: &str) -> bool {
    text.contains("equal or smaller than the target stream top item")
}

fn unreachable(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_timeout()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ReadOnly
                )
        )
}

/// The server did not answer within the operation timeout.
#[derive(Debug)]
pub(crate) struct NoReply {
    pub(crate) operation: &'static str,
    pub(crate) after: Duration,
}

impl fmt::Display for NoReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no reply from Redis to {} within {:?} (a write may or may not have been applied)",
            self.operation, self.after
        )
    }
}

impl std::error::Error for NoReply {}

pub(crate) fn no_reply(operation: &'static str, after: Duration) -> Error {
    tracing::warn!(operation, ?after, "redis did not reply in time");
    Error::Unavailable {
        backend: BACKEND,
        source: Box::new(NoReply { operation, after }),
    }
}

/// A reply that does not have the shape the store wrote.
pub(crate) fn corrupt(key: &str, reason: impl Into<String>) -> Error {
    Error::corrupt(key, reason)
}
