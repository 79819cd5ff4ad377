//! The errors this backend puts under [`mcp_persist_core::Error`].
//!
//! AWS SDK errors are converted here, keeping the service's error code and
//! message, and the transport error as `source`, but never a raw response:
//! a response body may hold a secret value, and no secret reaches an error.

use std::fmt;

use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use mcp_persist_core::Error;

use crate::BACKEND;

/// Secrets Manager kept answering a call with a throttling error until the
/// SDK's retries (with backoff) ran out.
///
/// It reaches callers as the `source` of [`Error::Backend`]; find it with
/// [`Throttled::find`]. Slow down (fewer writes per second, see
/// [`SecretsManagerStoreBuilder::max_writes_per_second`](crate::SecretsManagerStoreBuilder::max_writes_per_second))
/// or retry later.
#[derive(Debug, Clone)]
pub struct Throttled {
    operation: &'static str,
    code: String,
}

impl Throttled {
    /// The Secrets Manager operation that was throttled (`"PutSecretValue"`, ...).
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The service's error code (`"ThrottlingException"`, ...).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The `Throttled` cause of a store error, if it is one.
    pub fn find(error: &Error) -> Option<&Throttled> {
        match error {
            Error::Backend { source, .. } => source.downcast_ref::<Throttled>(),
            _ => None,
        }
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secrets Manager throttled {} ({}) through every retry",
            self.operation, self.code
        )
    }
}

impl std::error::Error for Throttled {}

/// A Secrets Manager call failed: the operation, the service's error code
/// and message when it answered, the transport error when it did not.
#[derive(Debug)]
pub struct ServiceError {
    operation: &'static str,
    code: Option<String>,
    message: Option<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ServiceError {
    /// The Secrets Manager operation that failed.
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The service's error code, when it answered with one.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.operation)?;
        if let Some(code) = &self.code {
            write!(f, " with {code}")?;
        }
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServiceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Error codes Secrets Manager (and AWS in general) uses for throttling.
fn is_throttling(code: &str) -> bool {
    matches!(
        code,
        "ThrottlingException"
            | "Throttling"
            | "TooManyRequestsException"
            | "RequestLimitExceeded"
            | "RequestThrottled"
            | "RequestThrottledException"
    )
}

/// The service error code of a failed call, if the service answered.
pub(crate) fn code_of<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(_) => err.code(),
        _ => None,
    }
}

/// Converts a failed call into the store's error, without the raw response.
pub(crate) fn from_sdk<E, R>(operation: &'static str, err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(_) => {
            let code = err.code().map(str::to_owned);
            if let Some(code) = code.as_deref().filter(|c| is_throttling(c)) {
                tracing::warn!(
                    operation,
                    code,
                    "Secrets Manager throttled the call through every retry"
                );
                return Error::backend(
                    BACKEND,
                    Throttled {
                        operation,
                        code: code.to_owned(),
                    },
                );
            }
            Error::backend(
                BACKEND,
                ServiceError {
                    operation,
                    code,
                    message: err.message().map(str::to_owned),
                    source: None,
                },
            )
        }
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            let message = if matches!(err, SdkError::TimeoutError(_)) {
                "timed out"
            } else {
                "could not reach the service"
            };
            // The source of a dispatch or timeout failure is the connector's
            // error: no request or response content in it.
            let source = err.into_source().ok();
            Error::Unavailable {
                backend: BACKEND,
                source: Box::new(ServiceError {
                    operation,
                    code: None,
                    message: Some(message.into()),
                    source,
                }),
            }
        }
        // A response that could not be read may hold a secret: keep nothing of it.
        SdkError::ResponseError(_) => Error::backend(
            BACKEND,
            ServiceError {
                operation,
                code: None,
                message: Some("the response could not be read".into()),
                source: None,
            },
        ),
        _ => Error::backend(
            BACKEND,
            ServiceError {
                operation,
                code: None,
                message: Some("the request could not be built".into()),
                source: None,
            },
        ),
    }
}
