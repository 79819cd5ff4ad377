//! What went wrong, what to do about it, and the exit code that says so.

use std::{fmt, path::Path};

use mcp_persist::Error;
use serde_json::json;

/// The exit codes, as documented in `--help`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
    0  success
    1  `check` found damaged records or logs, a store's file is damaged, `copy` could not
       verify everything it copied, or `rekey` left records it could not re-seal
    2  usage: a bad argument or store URL
    3  a store is unreachable or missing (server down, wrong host, no such path, not a store)
    4  a record or store was written by a newer version of mcp-persist: upgrade this tool
    5  refused: `copy` would overwrite a newer or different record, or a log diverges
    6  any other failure of a store
  130  interrupted (Ctrl-C); `copy` says where it stopped: run the same command again
  141  the output was closed early (as `| head` does); nothing more is printed";

/// The class of a failure, which picks the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// 1: damage found.
    Damaged = 1,
    /// 2: bad usage.
    Usage = 2,
    /// 3: unreachable, missing, or not a store.
    Unreachable = 3,
    /// 4: newer schema.
    NewerSchema = 4,
    /// 5: refused to overwrite.
    Refused = 5,
    /// 6: anything else.
    Other = 6,
    /// 130: stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
    Interrupted = 130,
    /// 141: standard output closed by its reader (128 + SIGPIPE, as a
    /// shell reports a command that a closed pipe ended).
    PipeClosed = 141,
}

impl Code {
    /// The name `--json` errors give the class.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Code::Damaged => "damaged",
            Code::Usage => "usage",
            Code::Unreachable => "unreachable",
            Code::NewerSchema => "newer_schema",
            Code::Refused => "refused",
            Code::Other => "other",
            Code::Interrupted => "interrupted",
            Code::PipeClosed => "pipe_closed",
        }
    }
}

/// A failure with a message for the operator.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Its class.
    pub(crate) code: Code,
    /// What went wrong.
    pub(crate) message: String,
    /// What to do about it, when there is something to say.
    pub(crate) hint: Option<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// A usage failure.
pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure::new(Code::Usage, message)
}

impl Failure {
    /// A failure of class `code`.
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            hint: None,
        }
    }

    /// The same failure with advice.
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// The failure as the one JSON object `--json` prints on standard
    /// error: `{"error": {"code", "kind", "message", "hint"}}`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({"error": {
            "code": self.code as u8,
            "kind": self.code.kind(),
            "message": self.message,
            "hint": self.hint,
        }})
    }

    /// A store error from the store labelled `store`, classified, with
    /// advice. `db_file` is the database file of a SQLite store: damage
    /// reported against it is damage of the file, not of one record.
    pub(crate) fn store(store: &str, db_file: Option<&Path>, error: Error) -> Failure {
        if let Error::Corrupt { key, .. } = &error
            && let Some(file) = db_file.filter(|f| f.display().to_string() == *key)
        {
            let detail = std::error::Error::source(&error)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            return Failure::new(
                Code::Damaged,
                format!(
                    "{store}: the database file {} is damaged or is not a SQLite database{detail}",
                    file.display()
                ),
            )
            .with_hint(format!(
                "SQLite cannot read this file, so no record in it can be listed or checked: \
                 restore it from a backup (`sqlite3 {} .recover` may save what is still readable)",
                file.display()
            ));
        }
        if let Error::NotFound {
            what: "store",
            detail: Some(detail),
        } = &error
        {
            // What the opener found, said as it found it.
            return Failure::new(Code::Unreachable, detail.clone());
        }
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(s) = source {
            let text = s.to_string();
            if !chain.contains(&text) {
                chain.push_str(": ");
                chain.push_str(&text);
            }
            source = s.source();
        }
        let (code, advice) = match &error {
            Error::Unavailable { .. } => (
                Code::Unreachable,
                "check that the server is running and the URL's host and port are right",
            ),
            Error::NewerSchema { .. } => (
                Code::NewerSchema,
                "this store was written by a newer version of mcp-persist; install a matching `mcp-persist-cli`",
            ),
            Error::Corrupt { .. } => (
                Code::Damaged,
                "run `mcp-persist check` on this store to list every damaged record",
            ),
            Error::AlreadyExists { .. } | Error::Conflict { .. } => (
                Code::Refused,
                "another process changed it meanwhile; run the command again",
            ),
            Error::InvalidInput { .. } => (Code::Usage, "check the argument"),
            Error::Unsupported { .. } => (
                Code::Other,
                "let a command that writes bring the store up to date (`mcp-persist gc`), \
                 or start the application on it",
            ),
            _ => (Code::Other, "check the store's logs and permissions"),
        };
        Failure::new(code, format!("{store}: {chain}")).with_hint(advice)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader has all it wanted (`| head`): end quietly.
            return Failure::new(Code::PipeClosed, "");
        }
        Failure::new(Code::Other, format!("writing the output failed: {e}"))
    }
}
