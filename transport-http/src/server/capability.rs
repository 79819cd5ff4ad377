//! What a server may ask its client for: sampling, elicitation and roots
//! requests only go to a client that declared the capability.
//!
//! A client that never declared, say, elicitation has no way to answer an
//! `elicitation/create`: before this check such a request simply hung the
//! call until the client gave up. The durable server refuses it at once
//! instead, on every instance and in both protocol revisions:
//!
//! * a handler's request in a legacy session (`context.peer.create_message`,
//!   `create_elicitation`, `list_roots`) is answered locally with the error
//!   [`MissingClientCapability::to_error_data`] builds, without reaching the
//!   client; the capabilities are those of the session's `initialize`,
//!   which a restored session replays from the store;
//! * a task's [`request_input`](super::TaskContext::request_input) returns
//!   that error as [`TaskExit::Error`](rmcp::task_manager::TaskExit), so an
//!   operation that passes it on with `?` ends the task `failed` with its
//!   message; the capabilities are those the client declared on the request
//!   that created the task, kept in the task record for every instance;
//! * on 2026-07-28 rmcp itself refuses every server-to-client request of a
//!   handler (that revision has input requests instead).
//!
//! A handler turns the refusal into a tool error with
//! [`MissingClientCapability::from_service_error`] and
//! [`tool_error`](MissingClientCapability::tool_error).

use rmcp::{
    ErrorData, ServiceError,
    model::{
        CallToolResult, ClientCapabilities, ContentBlock, ElicitRequestParams,
        ElicitationCapability, ErrorCode, InputRequest, RootsCapabilities, SamplingCapability,
        ServerRequest, UrlElicitationCapability,
    },
    task_manager::TaskExit,
};

/// One thing a server may ask a client for, and the capability it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientFeature {
    /// `sampling/createMessage` (capability `sampling`).
    Sampling,
    /// `sampling/createMessage` with tools (capability `sampling.tools`).
    SamplingTools,
    /// `elicitation/create` in form mode (capability `elicitation`, with
    /// `form` or neither mode named).
    Elicitation,
    /// `elicitation/create` in URL mode (capability `elicitation.url`).
    UrlElicitation,
    /// `roots/list` (capability `roots`).
    Roots,
}

impl ClientFeature {
    /// The request method.
    pub fn method(self) -> &'static str {
        match self {
            Self::Sampling | Self::SamplingTools => "sampling/createMessage",
            Self::Elicitation | Self::UrlElicitation => "elicitation/create",
            Self::Roots => "roots/list",
        }
    }

    /// The capability, as a dotted path in the client's capabilities.
    pub fn capability(self) -> &'static str {
        match self {
            Self::Sampling => "sampling",
            Self::SamplingTools => "sampling.tools",
            Self::Elicitation => "elicitation",
            Self::UrlElicitation => "elicitation.url",
            Self::Roots => "roots",
        }
    }

    /// Whether `declared` covers this feature.
    pub fn declared_in(self, declared: &ClientCapabilities) -> bool {
        match self {
            Self::Sampling => declared.sampling.is_some(),
            Self::SamplingTools => declared
                .sampling
                .as_ref()
                .is_some_and(|s| s.tools.is_some()),
            // A bare `elicitation: {}` means form mode (2025-06-18 clients).
            Self::Elicitation => declared
                .elicitation
                .as_ref()
                .is_some_and(|e| e.form.is_some() || e.url.is_none()),
            Self::UrlElicitation => declared
                .elicitation
                .as_ref()
                .is_some_and(|e| e.url.is_some()),
            Self::Roots => declared.roots.is_some(),
        }
    }

    /// The capabilities a client must declare for this feature.
    pub fn required(self) -> ClientCapabilities {
        let mut caps = ClientCapabilities::default();
        match self {
            Self::Sampling => caps.sampling = Some(SamplingCapability::default()),
            Self::SamplingTools => {
                let mut sampling = SamplingCapability::default();
                sampling.tools = Some(Default::default());
                caps.sampling = Some(sampling);
            }
            Self::Elicitation => caps.elicitation = Some(ElicitationCapability::default()),
            Self::UrlElicitation => {
                caps.elicitation = Some(
                    ElicitationCapability::new().with_url(UrlElicitationCapability::default()),
                );
            }
            Self::Roots => caps.roots = Some(RootsCapabilities::default()),
        }
        caps
    }

    fn from_capability(name: &str) -> Option<Self> {
        [
            Self::Sampling,
            Self::SamplingTools,
            Self::Elicitation,
            Self::UrlElicitation,
            Self::Roots,
        ]
        .into_iter()
        .find(|f| f.capability() == name)
    }

    /// The feature a server-to-client request needs (`None`: any client may
    /// be sent it, as `ping`).
    pub fn of_request(request: &ServerRequest) -> Option<Self> {
        match request {
            ServerRequest::CreateMessageRequest(r) => Some(sampling(&r.params)),
            ServerRequest::ElicitRequest(r) => Some(elicitation(&r.params)),
            ServerRequest::ListRootsRequest(_) => Some(Self::Roots),
            _ => None,
        }
    }

    /// The feature a task's input request needs.
    pub fn of_input_request(request: &InputRequest) -> Option<Self> {
        match request {
            InputRequest::CreateMessage(r) => Some(sampling(&r.params)),
            InputRequest::Elicitation(r) => Some(elicitation(&r.params)),
            InputRequest::ListRoots(_) => Some(Self::Roots),
            #[allow(unreachable_patterns)] // `InputRequest` is non-exhaustive
            _ => None,
        }
    }
}

// Sampling is deprecated by SEP-2577, still part of 2025-11-25.
#[allow(deprecated)]
fn sampling(params: &rmcp::model::CreateMessageRequestParams) -> ClientFeature {
    if params.tools.is_some() || params.tool_choice.is_some() {
        ClientFeature::SamplingTools
    } else {
        ClientFeature::Sampling
    }
}

fn elicitation(params: &ElicitRequestParams) -> ClientFeature {
    if matches!(params, ElicitRequestParams::UrlElicitationParams { .. }) {
        ClientFeature::UrlElicitation
    } else {
        ClientFeature::Elicitation
    }
}

/// A request to the client for something it did not declare it can do;
/// refused before it reached the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the client did not declare the `{}` capability, so the server cannot ask it for {}",
    feature.capability(),
    feature.method()
)]
pub struct MissingClientCapability {
    feature: ClientFeature,
}

impl MissingClientCapability {
    /// The refusal of a request needing `feature`.
    pub fn new(feature: ClientFeature) -> Self {
        MissingClientCapability { feature }
    }

    /// `Err` when `request` needs a capability `declared` lacks.
    pub fn check(
        declared: &ClientCapabilities,
        feature: Option<ClientFeature>,
    ) -> Result<(), Self> {
        match feature {
            Some(feature) if !feature.declared_in(declared) => Err(Self::new(feature)),
            _ => Ok(()),
        }
    }

    /// What was asked for.
    pub fn feature(&self) -> ClientFeature {
        self.feature
    }

    /// The JSON-RPC error the request is answered with: code `-32021`
    /// (MissingRequiredClientCapability), this error's message, and
    /// `data: { requiredCapabilities, method }`.
    pub fn to_error_data(&self) -> ErrorData {
        ErrorData::new(
            ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
            self.to_string(),
            Some(serde_json::json!({
                "requiredCapabilities": self.feature.required(),
                "method": self.feature.method(),
                "capability": self.feature.capability(),
            })),
        )
    }

    /// The refusal carried by `error`, if it is one.
    pub fn from_error_data(error: &ErrorData) -> Option<Self> {
        if error.code != ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY {
            return None;
        }
        let name = error.data.as_ref()?.get("capability")?.as_str()?;
        ClientFeature::from_capability(name).map(Self::new)
    }

    /// The refusal carried by the error of a peer request, if it is one.
    pub fn from_service_error(error: &ServiceError) -> Option<Self> {
        match error {
            ServiceError::McpError(error) => Self::from_error_data(error),
            _ => None,
        }
    }

    /// A tool result reporting the refusal (`isError: true`), for a tool
    /// that cannot do its work without the client's help.
    pub fn tool_error(&self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(self.to_string())])
    }
}

impl From<MissingClientCapability> for ErrorData {
    fn from(missing: MissingClientCapability) -> Self {
        missing.to_error_data()
    }
}

impl From<MissingClientCapability> for TaskExit {
    fn from(missing: MissingClientCapability) -> Self {
        TaskExit::Error(missing.to_error_data())
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientCapabilities, ErrorData};

    use super::{ClientFeature, MissingClientCapability};

    fn caps(json: serde_json::Value) -> ClientCapabilities {
        serde_json::from_value(json).expect("capabilities")
    }

    #[test]
    fn declared_capabilities_decide() {
        let none = caps(serde_json::json!({}));
        let bare = caps(serde_json::json!({"elicitation": {}, "sampling": {}, "roots": {}}));
        let url_only = caps(serde_json::json!({"elicitation": {"url": {}}}));
        for feature in [
            ClientFeature::Sampling,
            ClientFeature::Elicitation,
            ClientFeature::Roots,
        ] {
            assert!(!feature.declared_in(&none), "{feature:?}");
            assert!(feature.declared_in(&bare), "{feature:?}");
            assert!(feature.declared_in(&feature.required()), "{feature:?}");
        }
        assert!(!ClientFeature::SamplingTools.declared_in(&bare));
        assert!(!ClientFeature::UrlElicitation.declared_in(&bare));
        assert!(ClientFeature::UrlElicitation.declared_in(&url_only));
        assert!(!ClientFeature::Elicitation.declared_in(&url_only));
        assert!(
            ClientFeature::UrlElicitation.declared_in(&ClientFeature::UrlElicitation.required())
        );
        assert!(ClientFeature::SamplingTools.declared_in(&ClientFeature::SamplingTools.required()));
    }

    #[test]
    fn the_refusal_survives_the_wire() {
        let missing = MissingClientCapability::new(ClientFeature::Elicitation);
        let wire: ErrorData =
            serde_json::from_value(serde_json::to_value(missing.to_error_data()).expect("json"))
                .expect("error");
        assert_eq!(wire.code.0, -32021);
        assert!(wire.message.contains("elicitation"), "{}", wire.message);
        assert_eq!(
            MissingClientCapability::from_error_data(&wire),
            Some(missing)
        );
        assert_eq!(
            MissingClientCapability::from_error_data(&ErrorData::internal_error("x", None)),
            None
        );
        assert_eq!(missing.tool_error().is_error, Some(true));
    }
}
