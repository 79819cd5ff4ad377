//! What went wrong, what to do about it, and the exit code that says so.

use std::fmt;

use mcp_persist_core::Error;

/// The exit codes, as documented in `--help`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  `check` found damaged records or logs, or `copy` could not verify everything it copied
  2  usage: a bad argument or store URL
  3  a store is unreachable or missing (server down, wrong host, no such path)
  4  a record or store was written by a newer version of mcp-persist: upgrade this tool
  5  refused: `copy` would overwrite a newer or different record, or a log diverges
  6  any other failure of a store";

/// The class of a failure, which picks the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// 1: damage found.
    Damaged = 1,
    /// 2: bad usage.
    Usage = 2,
    /// 3: unreachable.
    Unreachable = 3,
    /// 4: newer schema.
    NewerSchema = 4,
    /// 5: refused to overwrite.
    Refused = 5,
    /// 6: anything else.
    Other = 6,
}

/// A failure with a message for the operator.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Its class.
    pub(crate) code: Code,
    /// What went wrong and what to do.
    pub(crate) message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A usage failure.
pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: Code::Usage,
        message: message.into(),
    }
}

impl Failure {
    /// A failure of class `code`.
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A store that is not there.
    pub(crate) fn unreachable(message: impl Into<String>) -> Failure {
        Failure::new(Code::Unreachable, message)
    }

    /// A store error from `store`, classified, with advice.
    pub(crate) fn store(store: &str, error: Error) -> Failure {
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
            _ => (Code::Other, "check the store's logs and permissions"),
        };
        Failure::new(code, format!("{store}: {chain}\n  hint: {advice}"))
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::new(Code::Other, format!("writing the output failed: {e}"))
    }
}
