//! From Postgres and pool failures to [`mcp_persist_core::Error`].
//!
//! Every error names what to do. None carries the password: the server is
//! named by [`Target`] (user, host, port, database), built from the parsed
//! configuration, never from the URL text.

use std::{fmt, sync::Arc, time::Duration};

use mcp_persist_core::Error;
use tokio_postgres::error::SqlState;

/// The backend name in errors and traces.
pub(crate) const NAME: &str = "postgres";

/// Where the store connects, for messages: never the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) user: String,
    pub(crate) hosts: String,
    pub(crate) dbname: String,
    pub(crate) schema: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "database `{}` on {} as user `{}`, schema `{}`",
            self.dbname, self.hosts, self.user, self.schema
        )
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A Postgres failure with the store it happened on, kept as `source`.
#[derive(Debug)]
pub(crate) struct PgFailure {
    pub(crate) what: String,
    pub(crate) cause: Arc<tokio_postgres::Error>,
}

impl fmt::Display for PgFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The driver's text, plus the server's message when there is one
        // (the driver's Display of a server error is only "db error").
        match self.cause.as_db_error() {
            Some(db) => write!(f, "{}: {} ({})", self.what, db.message(), db.code().code()),
            None => write!(f, "{}: {}", self.what, self.cause),
        }
    }
}

impl std::error::Error for PgFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// A failure of ours, with its explanation.
#[derive(Debug)]
pub(crate) struct Explained(pub(crate) String);

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Explained {}

/// Whether a driver error means the server cannot be reached or cannot
/// serve right now (retry later, the store itself is fine).
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            // 08: connection exception; 57P01..57P05: the server shuts down,
            // crashed, is starting, or refused for idleness; 53300: too many
            // connections; 40001/40P01 never reach here as unavailability.
            c.starts_with("08")
                || c.starts_with("57P")
                || *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::CANNOT_CONNECT_NOW
        }
        // No SQLSTATE: the driver's own kinds, told apart by their text
        // (the kind itself is private): an I/O error, a refused or dropped
        // connection, a connect timeout.
        None => {
            let text = e.to_string();
            [
                "error communicating with the server",
                "connection closed",
                "error connecting to server",
                "timeout waiting for server",
            ]
            .iter()
            .any(|prefix| text.starts_with(prefix))
        }
    }
}

/// Maps a driver error met while working on `key` (a store key, a log name
/// or `"(connection)"`) on `target`.
pub(crate) fn map(e: tokio_postgres::Error, target: &Target, key: &str) -> Error {
    map_shared(&Arc::new(e), target, key)
}

/// [`map`] for an error shared by several callers (a group commit).
pub(crate) fn map_shared(e: &Arc<tokio_postgres::Error>, target: &Target, key: &str) -> Error {
    let failure = |what: String| PgFailure {
        what,
        cause: Arc::clone(e),
    };
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return Error::invalid(
                "Postgres login",
                format!(
                    "the server refused user `{}` on {} ({}: {}); check the user name and \
                     password in the store URL, and the server's pg_hba.conf",
                    target.user,
                    target.hosts,
                    code.code(),
                    db.message()
                ),
            );
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            return Error::NotFound {
                what: "Postgres database",
                detail: Some(format!(
                    "database `{}` does not exist on {}; create it (createdb {}) or fix the \
                     database name in the store URL",
                    target.dbname, target.hosts, target.dbname
                )),
            };
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return Error::backend(
                NAME,
                Explained(format!(
                    "user `{user}` lacks a right this store needs in {target} ({msg}); \
                     grant it, e.g. `GRANT CREATE ON DATABASE {db} TO {user}` to let the store \
                     create its schema, or `GRANT ALL ON SCHEMA {schema} TO {user}` and \
                     `GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {user}` once it exists; \
                     nothing was written",
                    user = target.user,
                    db = target.dbname,
                    schema = target.schema,
                    msg = db.message(),
                )),
            );
        }
        if *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_FUNCTION
            || *code == SqlState::UNDEFINED_OBJECT
            || *code == SqlState::INVALID_SCHEMA_NAME
            || *code == SqlState::UNDEFINED_COLUMN
        {
            tracing::error!(%target, error = db.message(), "a table or function of the store is missing");
            return Error::Corrupt {
                key: format!("schema {}", target.schema),
                reason: format!(
                    "part of the store is missing ({}): it was dropped or changed outside \
                     mcp-persist. Restore the schema `{}` from a backup, or drop it \
                     (DROP SCHEMA {} CASCADE, which loses its state) so that the next open \
                     creates it afresh; nothing was written",
                    db.message(),
                    target.schema,
                    target.schema
                ),
                source: Some(Box::new(failure(format!("on {target}")))),
            };
        }
    }
    if e.as_db_error().is_none() && e.to_string().starts_with("authentication error") {
        return Error::invalid(
            "Postgres login",
            format!(
                "user `{}` could not log in to {} ({e}); put the password in the store URL \
                 (postgres://USER:PASSWORD@HOST/DB) or check the server's pg_hba.conf",
                target.user, target.hosts
            ),
        );
    }
    if e.as_db_error().is_none() && e.to_string().starts_with("error performing TLS handshake") {
        return Error::backend(
            NAME,
            failure(format!(
                "TLS with {} failed (is the server's certificate signed by a root this machine \
                 trusts? give a rustls ClientConfig with your CA to the builder)",
                target.hosts
            )),
        );
    }
    if is_unavailable(e) {
        tracing::warn!(%target, key, error = %e, "postgres unavailable");
        return Error::Unavailable {
            backend: NAME,
            source: Box::new(failure(format!("cannot reach Postgres ({target})"))),
        };
    }
    Error::backend(NAME, failure(format!("on {target}, key `{key}`")))
}

/// Maps a pool failure (no connection could be had).
pub(crate) fn map_pool(e: deadpool_postgres::PoolError, target: &Target, after: Duration) -> Error {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => map(e, target, "(connection)"),
        PoolError::Timeout(_) => no_reply("getting a connection", after, target),
        PoolError::Closed => {
            Error::backend(NAME, Explained("the connection pool is closed".into()))
        }
        other => Error::Unavailable {
            backend: NAME,
            source: Box::new(Explained(format!(
                "no connection to Postgres ({target}): {other}"
            ))),
        },
    }
}

/// The server did not answer within the operation timeout.
pub(crate) fn no_reply(operation: &str, after: Duration, target: &Target) -> Error {
    tracing::warn!(operation, ?after, %target, "postgres did not reply in time");
    Error::Unavailable {
        backend: NAME,
        source: Box::new(Explained(format!(
            "no reply from Postgres ({target}) to {operation} within {after:?} \
             (a write may or may not have been applied); is the server running and reachable?"
        ))),
    }
}

/// A row that does not have the shape this store writes.
pub(crate) fn bad_row(key: &str, what: impl Into<String>) -> Error {
    Error::corrupt(key, what)
}

/// A log whose header leaves no room for the next record's number: only a
/// header changed outside this store gets there.
pub(crate) fn no_next_seq(log: &str) -> Error {
    Error::corrupt(
        log,
        format!(
            "the log's last sequence number leaves no room for the next one: numbers end \
             at {}, the largest a bigint holds (its header in table `logs` was changed \
             outside mcp-persist)",
            i64::MAX
        ),
    )
}
