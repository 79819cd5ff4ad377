//! The errors this backend puts under [`mcp_persist_core::Error`].
//!
//! AWS SDK errors are converted here, keeping the service's error code and
//! message and the transport error as `source`, never a raw response: a
//! response may echo an item, and an item may hold a secret.

use std::fmt;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use mcp_persist_core::Error;

use crate::BACKEND;

/// DynamoDB kept answering a call with a throttling error until the retries
/// (with backoff) ran out. Nothing was written by the throttled call.
///
/// It reaches callers as the `source` of [`Error::Backend`]; find it with
/// [`Throttled::find`]. Send fewer requests, raise the table's capacity (or
/// switch it to on-demand), or allow more attempts with
/// [`DynamoStoreBuilder::retry`](crate::DynamoStoreBuilder::retry).
#[derive(Debug, Clone)]
pub struct Throttled {
    operation: &'static str,
    code: String,
}

impl Throttled {
    /// The DynamoDB operation that was throttled (`"UpdateItem"`, ...).
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The service's error code (`"ThrottlingException"`,
    /// `"ProvisionedThroughputExceededException"`, ...).
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
            "DynamoDB throttled {} ({}) through every retry, and it wrote nothing: send fewer \
             requests, raise the table's capacity or switch it to on-demand, or allow more \
             attempts (DynamoStoreBuilder::retry)",
            self.operation, self.code
        )
    }
}

impl std::error::Error for Throttled {}

/// A DynamoDB call failed: the operation, the service's error code and
/// message when it answered, the transport error when it did not.
#[derive(Debug)]
pub struct ServiceError {
    operation: &'static str,
    code: Option<String>,
    message: Option<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ServiceError {
    pub(crate) fn new(operation: &'static str, message: impl Into<String>) -> Self {
        ServiceError {
            operation,
            code: None,
            message: Some(message.into()),
            source: None,
        }
    }

    /// The DynamoDB operation that failed.
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

/// Error codes DynamoDB uses for throttling.
pub(crate) fn is_throttling(code: &str) -> bool {
    matches!(
        code,
        "ThrottlingException"
            | "Throttling"
            | "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded"
            | "ThrottlingError"
            | "ProvisionedThroughputExceeded"
    )
}

/// The service error code of a failed call, if the service answered.
pub(crate) fn code_of<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(_) => err.code(),
        _ => None,
    }
}

/// What a missing table means to the caller, with what to do about it.
pub(crate) fn table_missing(table: &str, region: &str) -> Error {
    Error::NotFound {
        what: "DynamoDB table",
        detail: Some(format!(
            "no table `{table}` in region {region}: check the table name and the region (and the \
             endpoint, if one is set), or create it once with DynamoStore::create_table \
             (`dynamodb://{table}?create=1` through a store URL)"
        )),
    }
}

/// Converts a failed call into the store's error, without the raw response.
/// A missing table becomes [`Error::NotFound`] naming `table` and `region`.
pub(crate) fn from_sdk<E, R>(
    operation: &'static str,
    table: &str,
    region: &str,
    err: SdkError<E, R>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(_) => {
            let code = err.code().map(str::to_owned);
            if code.as_deref() == Some("ResourceNotFoundException") {
                return table_missing(table, region);
            }
            if let Some(code) = code.as_deref().filter(|c| is_throttling(c)) {
                tracing::warn!(
                    operation,
                    code,
                    "DynamoDB throttled the call through every retry"
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
                "could not reach DynamoDB (check the region and the endpoint)"
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
        // A response that could not be read may hold an item: keep nothing of it.
        SdkError::ResponseError(_) => Error::backend(
            BACKEND,
            ServiceError::new(operation, "the response could not be read"),
        ),
        _ => Error::backend(
            BACKEND,
            ServiceError::new(operation, "the request could not be built or sent"),
        ),
    }
}

/// A request that the SDK refused to build (a bug of this crate, never the
/// caller's input).
pub(crate) fn build_error(operation: &'static str, err: impl fmt::Display) -> Error {
    Error::backend(
        BACKEND,
        ServiceError::new(operation, format!("the request could not be built: {err}")),
    )
}
