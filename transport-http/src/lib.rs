//! rmcp integration for mcp-persist: durable Streamable HTTP servers and
//! clients over any backend.
//!
//! # Server
//!
//! [`server::DurableServer`] makes an rmcp Streamable HTTP server whose
//! sessions and SSE streams outlive the instance that created them:
//!
//! * **Sessions restore on any instance.** The client's `initialize` params
//!   are stored; a request reaching an instance that does not hold the
//!   session replays them into a fresh handler (rmcp's restore hook), so the
//!   handler sees the client's capabilities without a new `initialize`.
//!   A session that expires (idle TTL) or is ended with a DELETE is gone on
//!   every instance at once (404, and rmcp clients re-initialize).
//! * **Streams resume on any instance.** Every SSE event is committed to a
//!   shared log before it is sent. Event ids carry the stream, a sequence and
//!   128 unguessable bits; a `Last-Event-ID` replays exactly the later events
//!   of that stream with their original ids, then tails the stream live while
//!   another instance is still writing it, until the final response.
//! * **Sessions are bound to principals.** A session id presented under
//!   another principal gets 404 on every instance, exactly as an unknown one.
//! * **Bad resumption input gets a clear answer**: `400` for a malformed
//!   `Last-Event-ID`, `410` for an expired stream or expired events, never an
//!   empty `200` stream; another session's stream gets exactly the `410` of
//!   a stream that never existed.
//! * **A killed instance's calls end**: instances heartbeat through the
//!   store, and a stream whose writer went silent for the liveness grace
//!   (1.5 s by default) ends with an error telling the client to re-issue.
//!
//! See [`server`] for an example.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `server` | yes | [`server`]: session and event stores for rmcp, the binding layer, the builder |
//! | `client` | yes | [`client`]: the durable client decorator, its builder and recovery handle |
//! | `auth` | no | [`auth`]: OAuth credentials that survive restarts, keyed by issuer and resource, shared safely between processes |
//! | `otel` | no | OpenTelemetry metrics, and traces continued across restarts (see [`telemetry`]; the spans themselves need no feature) |
//! | `rustls` | yes | HTTPS for the client (and `auth`'s OAuth requests) through rustls |
//! | `native-tls` | no | HTTPS for the client through the platform's TLS library (OpenSSL on Linux) |
//! | `client-rustls` | no | the former name of `rustls`; also turns `client` on |

#![cfg_attr(not(feature = "server"), doc = "\n\n[`server`]: crate#features")]
#![cfg_attr(not(feature = "client"), doc = "\n\n[`client`]: crate#features")]
#![cfg_attr(not(feature = "auth"), doc = "\n\n[`auth`]: crate#features")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;

#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client;

#[cfg(any(feature = "server", feature = "client"))]
pub mod exactly_once;

#[cfg(any(feature = "server", feature = "client"))]
pub mod telemetry;

#[cfg(feature = "auth")]
#[cfg_attr(docsrs, doc(cfg(feature = "auth")))]
pub mod auth;

/// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
