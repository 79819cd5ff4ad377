//! What `server/discover` says: the cached answer a stored verdict gives,
//! the verdict learned from an answer or a re-probe, and the version
//! fallback.

use mcp_persist_core::{DiscoverCache, ProtocolEra, ProtocolVersion, ServerProfile, Timestamp};
use rmcp::model::{
    ClientJsonRpcMessage, DiscoverResult, ErrorCode, ErrorData, NumberOrString,
    ServerJsonRpcMessage, ServerResult,
};
use serde_json::Value;
use tracing::{debug, info};

use super::verdict::Verdict;

/// Pre-release codes for UnsupportedProtocolVersion, recognized as -32022.
const PRE_RELEASE_UNSUPPORTED: [i32; 2] = [-32004, -32001];

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// The version a `server/discover` asks for, from its `_meta`.
pub(crate) fn requested_version(message: &ClientJsonRpcMessage) -> Option<String> {
    let value = serde_json::to_value(message).ok()?;
    value
        .get("params")?
        .get("_meta")?
        .get(META_VERSION)?
        .as_str()
        .map(str::to_owned)
}

/// Answers `server/discover` from the store when the verdict allows: a
/// fresh cached result for a modern server, or a legacy error for a server
/// judged legacy (so rmcp goes straight to `initialize`, itself answered
/// from the stored session when there is one).
pub(crate) fn cached_discover(
    verdict: &Verdict,
    id: &NumberOrString,
) -> Option<ServerJsonRpcMessage> {
    let profile = verdict.profile()?;
    match profile.era {
        ProtocolEra::Modern => {
            let cache = profile.discover.as_ref()?;
            if !cache.is_fresh_at(Timestamp::now()) {
                debug!("cached server/discover expired; asking the server");
                return None;
            }
            let result: DiscoverResult = serde_json::from_value(cache.result.clone()).ok()?;
            info!("server/discover answered from the cache");
            Some(ServerJsonRpcMessage::response(
                ServerResult::DiscoverResult(result),
                id.clone(),
            ))
        }
        ProtocolEra::Legacy => {
            info!(version = %profile.protocol_version,
                "stored verdict: legacy server; skipping the server/discover probe");
            Some(ServerJsonRpcMessage::error(
                ErrorData::new(
                    ErrorCode::METHOD_NOT_FOUND,
                    "server/discover: stored verdict says this server is legacy",
                    None,
                ),
                Some(id.clone()),
            ))
        }
        // A verdict this build does not know: ask the server.
        _ => None,
    }
}

/// Learns from a `server/discover` answer: stores a modern verdict with the
/// result, or turns a pre-release "unsupported version" into what rmcp
/// understands.
pub(crate) fn after_discover(
    verdict: &Verdict,
    answer: &mut ServerJsonRpcMessage,
    requested: Option<String>,
) {
    match answer {
        ServerJsonRpcMessage::Response(response) => {
            let ServerResult::DiscoverResult(result) = &response.result else {
                return;
            };
            let supported: Vec<&str> = result
                .supported_versions
                .iter()
                .map(|v| v.as_str())
                .collect();
            let version = requested
                .filter(|r| supported.contains(&r.as_str()))
                .or_else(|| supported.iter().max().map(|v| (*v).to_owned()));
            let Some(version) = version.and_then(|v| ProtocolVersion::new(v).ok()) else {
                return;
            };
            let Ok(json) = serde_json::to_value(result) else {
                return;
            };
            info!(%version, ttl_ms = result.ttl_ms, "modern server; verdict stored");
            let scope = json
                .get("cacheScope")
                .and_then(Value::as_str)
                .map(str::to_owned);
            verdict
                .set(ServerProfile::new(version.era(), version).with_discover(
                    DiscoverCache::new(json, result.ttl_ms).with_cache_scope(scope),
                ));
        }
        ServerJsonRpcMessage::Error(error)
            if PRE_RELEASE_UNSUPPORTED.contains(&error.error.code.0) =>
        {
            let supported: Vec<String> = error
                .error
                .data
                .as_ref()
                .and_then(|d| d.get("supported"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let any_modern = supported
                .iter()
                .filter_map(|v| ProtocolVersion::new(v.clone()).ok())
                .any(|v| v.era() == ProtocolEra::Modern);
            if any_modern {
                // A modern server on a draft code: let rmcp pick and retry.
                error.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
            } else {
                // Only handshake versions: a legacy server. rmcp falls back
                // to `initialize`, whose session then stores the verdict.
                info!(
                    ?supported,
                    "server supports legacy versions only; falling back to initialize"
                );
                error.error.code = ErrorCode::METHOD_NOT_FOUND;
            }
        }
        _ => {}
    }
}

/// Whether `code` says "unsupported protocol version" (-32022, or a
/// pre-release code for it).
pub(crate) fn is_unsupported(code: ErrorCode) -> bool {
    code == ErrorCode::UNSUPPORTED_PROTOCOL_VERSION || PRE_RELEASE_UNSUPPORTED.contains(&code.0)
}

/// The `server/discover` that re-probes a server after `refused` was
/// refused: same `_meta` (version, client info, capabilities), its own id.
pub(crate) fn reprobe_request(refused: &ClientJsonRpcMessage) -> Option<ClientJsonRpcMessage> {
    let value = serde_json::to_value(refused).ok()?;
    let mut meta = value.get("params")?.get("_meta")?.as_object()?.clone();
    meta.get(META_VERSION)?;
    // Only the client context goes along, not the request's progress token.
    meta.retain(|k, _| k.starts_with("io.modelcontextprotocol/"));
    let probe = serde_json::json!({
        "jsonrpc": "2.0",
        "id": "mcp-persist/reprobe",
        "method": "server/discover",
        "params": {"_meta": meta},
    });
    serde_json::from_value(probe).ok()
}

/// What a re-probe found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reprobe {
    /// Modern, and the refused request's version is supported after all:
    /// the request may be sent once more.
    Retry,
    /// A new verdict is stored (legacy, or another modern version); the
    /// running rmcp service cannot switch to it, the next start uses it.
    NewVerdict,
    /// Nothing usable came back; nothing is stored.
    Failed,
}

/// Learns from the answer to a re-probe and stores the new verdict.
pub(crate) fn after_reprobe(
    verdict: &Verdict,
    answer: &ServerJsonRpcMessage,
    requested: Option<String>,
) -> Reprobe {
    match answer {
        ServerJsonRpcMessage::Response(response) => {
            let ServerResult::DiscoverResult(result) = &response.result else {
                return Reprobe::Failed;
            };
            let supported = result
                .supported_versions
                .iter()
                .any(|v| Some(v.as_str()) == requested.as_deref());
            let mut answer = answer.clone();
            after_discover(verdict, &mut answer, requested);
            if supported {
                Reprobe::Retry
            } else {
                Reprobe::NewVerdict
            }
        }
        ServerJsonRpcMessage::Error(error) => {
            let supported: Vec<ProtocolVersion> = error
                .error
                .data
                .as_ref()
                .and_then(|d| d.get("supported"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .filter_map(|v| ProtocolVersion::new(v.to_owned()).ok())
                        .collect()
                })
                .unwrap_or_default();
            let modern_rejection = [
                ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                ErrorCode::HEADER_MISMATCH,
            ]
            .contains(&error.error.code);
            if modern_rejection
                || (is_unsupported(error.error.code)
                    && supported.iter().any(|v| v.era() == ProtocolEra::Modern))
            {
                // Modern, but not on the version asked for: nothing to store.
                return Reprobe::Failed;
            }
            // A legacy server: the highest handshake version both sides know.
            let known: Vec<&str> = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .filter(|v| v.has_initialize())
                .map(|v| v.as_str())
                .collect();
            let version = supported
                .into_iter()
                .filter(|v| known.contains(&v.as_str()))
                .max_by(|a, b| a.as_str().cmp(b.as_str()))
                .or_else(|| {
                    known
                        .iter()
                        .max()
                        .and_then(|v| ProtocolVersion::new((*v).to_owned()).ok())
                });
            let Some(version) = version else {
                return Reprobe::Failed;
            };
            info!(%version, "re-probe: the server is legacy now; verdict stored");
            verdict.set(ServerProfile::new(ProtocolEra::Legacy, version));
            Reprobe::NewVerdict
        }
        _ => Reprobe::Failed,
    }
}
