//! Turning SQLite failures into the one [`Error`] of mcp-persist.

use std::{fmt, sync::Arc, time::Duration};

use mcp_persist_core::Error;
use rusqlite::ErrorCode;

/// The backend name in errors and traces.
pub(crate) const NAME: &str = "sqlite";

/// What went wrong outside SQLite itself, kept as the `source` of an [`Error`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// `PRAGMA journal_mode=WAL` did not take.
    #[error(
        "the SQLite database at {path} stayed in journal mode `{mode}` instead of `wal`; \
         WAL needs shared memory beside the file, which some network file systems lack"
    )]
    NoWal { path: String, mode: String },
    /// The thread that owns the write connection is gone.
    #[error("the SQLite writer thread has stopped")]
    WriterGone,
    /// An operation on the writer thread panicked (a bug); it was rolled
    /// back alone and the thread goes on.
    #[error(
        "a SQLite write panicked and was rolled back ({message}); \
         the store keeps working, please report this"
    )]
    Panicked { message: String },
    /// Preparing the file or its folder failed.
    #[error("preparing the SQLite database file {path} failed")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A lock that opening a database waits for, named in its timeout.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lock {
    /// The exclusive lock that switches a database to WAL.
    JournalMode,
    /// The write lock under which the schema is checked and migrated.
    SchemaSetup,
}

impl Lock {
    /// What was waited for and, as far as SQLite can tell, who holds it.
    fn operation(self) -> &'static str {
        match self {
            Lock::JournalMode => {
                "waiting for the SQLite lock that switches the database to WAL \
                 (another process has the database open in rollback-journal mode \
                 and is reading or writing it)"
            }
            Lock::SchemaSetup => {
                "waiting for the SQLite schema setup lock (another process is writing \
                 the database, or setting up or migrating its schema)"
            }
        }
    }
}

/// Where an error happened, so that it can name the database or the key.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The database, as shown to people (its path or `:memory:`).
    pub(crate) db: &'a str,
    /// How long a lock was waited for before `SQLITE_BUSY`.
    pub(crate) busy_timeout: Duration,
}

impl Ctx<'_> {
    /// Maps a SQLite error: a lock held too long is a [`Error::Timeout`], a
    /// damaged file [`Error::Corrupt`] naming the database, anything else
    /// [`Error::Backend`]. The cause is kept as `source` where the variant has one.
    pub(crate) fn sql(self, e: rusqlite::Error) -> Error {
        self.map(e.sqlite_error_code(), Box::new(e))
    }

    fn map(self, code: Option<ErrorCode>, source: mcp_persist_core::BoxError) -> Error {
        match code {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                tracing::warn!(db = self.db, error = %source, "SQLite lock not granted in time");
                Error::Timeout {
                    operation: "waiting for the SQLite database lock",
                    after: self.busy_timeout,
                }
            }
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => Error::Corrupt {
                key: self.db.to_owned(),
                reason: "the SQLite database file is damaged or is not a database".to_owned(),
                source: Some(source),
            },
            _ => Error::backend(NAME, source),
        }
    }

    /// A lock of [`Lock`] still refused at the deadline: a
    /// [`Error::Timeout`] saying which lock and who holds it; the warning
    /// names the file.
    pub(crate) fn lock_timeout(self, lock: Lock, cause: &rusqlite::Error) -> Error {
        let operation = lock.operation();
        tracing::warn!(db = self.db, error = %cause, "{operation}: timed out");
        Error::Timeout {
            operation,
            after: self.busy_timeout,
        }
    }

    /// A commit failure shared by every operation of a batch.
    pub(crate) fn shared(self, e: &SharedError) -> Error {
        self.map(e.0.sqlite_error_code(), Box::new(e.clone()))
    }
}

/// A stored value that does not have the shape this schema gives it.
pub(crate) fn bad_row(key: &str, what: &str, source: Option<rusqlite::Error>) -> Error {
    Error::Corrupt {
        key: key.to_owned(),
        reason: format!("the SQLite row holds {what}"),
        source: source.map(|e| Box::new(e) as mcp_persist_core::BoxError),
    }
}

/// One SQLite error reported to every operation of a failed transaction.
#[derive(Clone)]
pub(crate) struct SharedError(pub(crate) Arc<rusqlite::Error>);

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the shared transaction failed: {}", self.0)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The error every operation gets once the writer thread is gone.
pub(crate) fn writer_gone() -> Error {
    Error::backend(NAME, SetupError::WriterGone)
}
