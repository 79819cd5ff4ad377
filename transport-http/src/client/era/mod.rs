//! The era verdict: whether the server speaks the 2026-07-28 revision (no
//! sessions, no GET streams) or a handshake revision, stored per server.
//! `server/discover` is answered from it when it allows; a verdict that
//! stops working (the server refuses the protocol version) is forgotten
//! and re-probed, once per process.

mod discover;
mod verdict;

use std::sync::Arc;

use http::HeaderValue;
use mcp_persist_core::{ProtocolEra, ServerProfile};
use rmcp::{
    model::{ClientJsonRpcMessage, ErrorCode, ServerJsonRpcMessage},
    transport::{
        common::http_header::HEADER_MCP_METHOD,
        streamable_http_client::{StreamableHttpClient, StreamableHttpPostResponse},
    },
};
use tracing::{info, warn};

use self::discover::Reprobe;
pub(crate) use self::verdict::Verdict;
use super::{
    delegate::{Post, PostResult, first_answer},
    headers::{header_name, is_routing_header},
    health::Health,
    report::ClientNotice,
};

/// What the era concern needs: the verdict, and the notices (a stale
/// verdict is reported).
#[derive(Debug, Clone)]
pub(crate) struct Era {
    verdict: Arc<Verdict>,
    health: Arc<Health>,
}

impl Era {
    pub(crate) fn new(verdict: Arc<Verdict>, health: Arc<Health>) -> Self {
        Era { verdict, health }
    }

    /// Whether the server is judged modern: no sessions, no GET streams,
    /// no `Last-Event-ID`.
    pub(crate) fn is_modern(&self) -> bool {
        self.verdict.is_modern()
    }

    /// A POST to a server judged modern goes without a session id.
    pub(crate) fn without_session(post: Post) -> Post {
        if post.session_id.is_some() {
            warn!("not sending a session id to a server judged modern");
        }
        post.without_session()
    }

    /// `server/discover`: answered from the stored verdict when it allows,
    /// else sent without a session and learned from.
    pub(crate) async fn discover<C: StreamableHttpClient>(
        &self,
        inner: &C,
        message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        let id = match &message {
            ClientJsonRpcMessage::Request(request) => request.id.clone(),
            _ => return post.send(inner, message).await,
        };
        if let Some(answer) = discover::cached_discover(&self.verdict, &id) {
            return Ok(StreamableHttpPostResponse::Json(answer, None));
        }
        let requested = discover::requested_version(&message);
        // Never a session or cursor towards a server probed as modern.
        let response = post.without_session().send(inner, message).await?;
        let (mut answer, sid) = first_answer::<C::Error>(response).await?;
        discover::after_discover(&self.verdict, &mut answer, requested);
        Ok(StreamableHttpPostResponse::Json(answer, sid))
    }

    /// A request to a server judged modern: sent without a session; a
    /// refusal of its protocol version means the verdict is stale. It is
    /// forgotten, the server is probed again once (per process), the
    /// outcome stored, and the request sent once more if the probe says
    /// its version is supported after all; otherwise the refusal is the
    /// answer.
    pub(crate) async fn modern_request<C: StreamableHttpClient>(
        &self,
        inner: &C,
        message: ClientJsonRpcMessage,
        post: Post,
    ) -> PostResult<C::Error> {
        let post = Self::without_session(post);
        let original = message.clone();
        let mut response = post.clone().send(inner, message).await;
        let reason = match &mut response {
            Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _))
                if discover::is_unsupported(e.error.code) =>
            {
                let reason = format!("{} ({})", e.error.code.0, e.error.message);
                e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
                reason
            }
            _ => return response,
        };
        if !self.verdict.claim_reprobe() {
            warn!(%reason,
                "protocol version refused again; already re-probed once in this process, giving up");
            return response;
        }
        let Some(stale) = self.verdict.forget() else {
            return response;
        };
        let stale = verdict_text(&stale);
        warn!(%stale, %reason,
            "the stored era verdict stopped working; forgetting it and probing the server again, once");
        let outcome = match discover::reprobe_request(&original) {
            Some(probe) => self.reprobe(inner, probe, &post).await,
            None => Reprobe::Failed,
        };
        let new_verdict = self.verdict.profile().as_ref().map(verdict_text);
        self.health.notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: new_verdict.clone(),
        });
        match outcome {
            Reprobe::Retry => {
                info!("re-probe: the version is supported; sending the request once more");
                let mut retried = post.send(inner, original).await;
                if let Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _)) =
                    &mut retried
                    && discover::is_unsupported(e.error.code)
                {
                    warn!("refused again after the re-probe; giving up");
                    e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
                }
                retried
            }
            Reprobe::NewVerdict => {
                warn!(new_verdict = ?new_verdict,
                    "re-probe stored a new verdict; this connection fails, the next start uses it");
                response
            }
            Reprobe::Failed => {
                warn!("re-probe found no usable verdict; the next start probes again");
                response
            }
        }
    }

    /// Sends the re-probing `server/discover` on the refused request's
    /// terms and stores what it finds.
    async fn reprobe<C: StreamableHttpClient>(
        &self,
        inner: &C,
        probe: ClientJsonRpcMessage,
        post: &Post,
    ) -> Reprobe {
        let requested = discover::requested_version(&probe);
        // The request's own routing headers (`Mcp-Method`, `Mcp-Name`,
        // `Mcp-Param-*`) would contradict the probe's body.
        let mut post = post.clone();
        post.custom_headers
            .retain(|name, _| !is_routing_header(name));
        post.custom_headers.insert(
            header_name(HEADER_MCP_METHOD),
            HeaderValue::from_static("server/discover"),
        );
        let answer = match post.send(inner, probe).await {
            Ok(r) => first_answer::<C::Error>(r).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((answer, _)) => discover::after_reprobe(&self.verdict, &answer, requested),
            Err(e) => {
                warn!(error = %e, "re-probe failed");
                Reprobe::Failed
            }
        }
    }

    /// An answer in a legacy session: a refusal of the protocol version
    /// makes the stored verdict stale. The verdict is forgotten (once per
    /// process), `forget_session` is called, so the next start probes the
    /// server (once, through rmcp's `server/discover`) instead of resuming
    /// a session the server no longer speaks, and the application is told.
    pub(crate) fn legacy_answer(
        &self,
        answer: &mut ServerJsonRpcMessage,
        forget_session: impl FnOnce(),
    ) {
        let ServerJsonRpcMessage::Error(e) = answer else {
            return;
        };
        if !discover::is_unsupported(e.error.code) {
            return;
        }
        let reason = format!("{} ({})", e.error.code.0, e.error.message);
        e.error.code = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION;
        if !self.verdict.claim_reprobe() {
            return;
        }
        let Some(stale) = self.verdict.forget() else {
            return;
        };
        let stale = verdict_text(&stale);
        warn!(%stale, %reason,
            "the stored legacy verdict stopped working; forgetting it and the session, the next start probes again");
        forget_session();
        self.health.notify(ClientNotice::StaleVerdict {
            stale,
            reason,
            new_verdict: None,
        });
    }
}

/// A verdict as the application reads it: `modern 2026-07-28`.
fn verdict_text(profile: &ServerProfile) -> String {
    let era = match profile.era {
        ProtocolEra::Modern => "modern",
        ProtocolEra::Legacy => "legacy",
        _ => "unknown",
    };
    format!("{era} {}", profile.protocol_version)
}
