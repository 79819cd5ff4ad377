#![cfg_attr(docsrs, feature(doc_cfg))]
// The README's examples use the client, the server with rmcp's macros, and
// SQLite: with those features on (as on docs.rs) it is the crate's
// documentation and its examples are compiled as doctests. The
// `mcp-persist-readme` crate of the workspace builds them as programs and
// runs them.
#![cfg_attr(
    all(feature = "sqlite", feature = "client", feature = "macros"),
    doc = include_str!("../README.md")
)]
#![cfg_attr(
    not(all(feature = "sqlite", feature = "client", feature = "macros")),
    doc = "Durable state for MCP clients and servers built on rmcp, on the storage \
           backend the application picks. The README (shown here when the `sqlite`, \
           `client` and `macros` features are on) has the examples."
)]
//!
//! # Crate features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | [`sqlite`]: the embedded SQLite backend |
//! | `file` | no | [`file`]: the crash-safe directory backend, no server needed |
//! | `redis` | no | [`redis`]: Redis and Redis Cluster, for fleets of instances |
//! | `vault` | no | [`vault`]: AWS Secrets Manager, for credentials |
//! | `postgres` | no | [`postgres`]: Postgres, for fleets of instances (TLS through rustls) |
//! | `dynamodb` | no | [`dynamodb`]: Amazon DynamoDB, for serverless servers (AWS Lambda) |
//! | `client` | no | [`client`]: the durable rmcp Streamable HTTP client, and [`rmcp`] |
//! | `server` | no | [`server`]: the durable rmcp Streamable HTTP server, and [`rmcp`] |
//! | `macros` | no | rmcp's `#[tool]`, `#[tool_router]`, `#[tool_handler]` at [`rmcp`], with the `serde`, `serde_json` and `schemars` they use (turns `server` on) |
//! | `auth` | no | [`auth`]: OAuth credentials that survive restarts (turns `client` on) |
//! | `otel` | no | OpenTelemetry metrics, and traces kept across restarts (see [`telemetry`]) |
//! | `rustls` | yes | HTTPS for the client through rustls |
//! | `native-tls` | no | HTTPS for the client through the platform's TLS library |
//!
//! The root re-exports `mcp-persist-core`: records, typed stores, the backend
//! traits and the in-memory backend, whatever the features.
//!
//! This crate holds no code of its own: each module re-exports one crate of
//! the family, all pinned to this crate's version, so one dependency line
//! gives a matching set.
#![cfg_attr(not(feature = "sqlite"), doc = "\n\n[`sqlite`]: crate#crate-features")]
#![cfg_attr(not(feature = "file"), doc = "\n\n[`file`]: crate#crate-features")]
// `file` alone would also name the `file!` macro.
#![cfg_attr(feature = "file", doc = "\n\n[`file`]: mod@file")]
#![cfg_attr(not(feature = "redis"), doc = "\n\n[`redis`]: crate#crate-features")]
#![cfg_attr(not(feature = "vault"), doc = "\n\n[`vault`]: crate#crate-features")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "\n\n[`postgres`]: crate#crate-features"
)]
#![cfg_attr(
    not(feature = "dynamodb"),
    doc = "\n\n[`dynamodb`]: crate#crate-features"
)]
#![cfg_attr(not(feature = "client"), doc = "\n\n[`client`]: crate#crate-features")]
#![cfg_attr(not(feature = "server"), doc = "\n\n[`server`]: crate#crate-features")]
#![cfg_attr(not(feature = "auth"), doc = "\n\n[`auth`]: crate#crate-features")]
#![cfg_attr(
    not(any(feature = "client", feature = "server")),
    doc = "\n\n[`rmcp`]: crate#crate-features"
)]

#[doc(inline)]
pub use mcp_persist_core::*;

use mcp_persist_core::registry::{OpenOptions, Registry};

/// Every backend this build has, by URL scheme: `memory:` always, and one
/// opener per backend feature (`sqlite:PATH`, `file:DIR`, `redis://…`,
/// `secretsmanager://…`). The command line opens stores through it; a new
/// backend is one line here.
///
/// ```
/// let schemes = mcp_persist::backends().schemes();
/// assert!(schemes.contains(&"memory"));
/// # #[cfg(feature = "sqlite")]
/// assert!(schemes.contains(&"sqlite"));
/// ```
pub fn backends() -> Registry {
    let registry = Registry::new().with(mcp_persist_core::memory::MemoryOpener);
    #[cfg(feature = "sqlite")]
    let registry = registry.with(mcp_persist_store_sqlite::SqliteOpener);
    #[cfg(feature = "file")]
    let registry = registry.with(mcp_persist_store_file::FileOpener);
    #[cfg(feature = "redis")]
    let registry = registry.with(mcp_persist_store_redis::RedisOpener);
    #[cfg(feature = "vault")]
    let registry = registry.with(mcp_persist_store_vault::SecretsManagerOpener);
    #[cfg(feature = "postgres")]
    let registry = registry.with(mcp_persist_store_postgres::PostgresOpener);
    #[cfg(feature = "dynamodb")]
    let registry = registry.with(mcp_persist_store_dynamodb::DynamoOpener);
    registry
}

/// Opens the store a URL names (any scheme of [`backends`]), creating it
/// when it does not exist yet, as the typed stores over it.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let stores = mcp_persist::open("memory:").await?;
/// let events = stores.events(mcp_persist::EventLogConfig::default())?;
/// # let _ = events;
/// # Ok::<_, mcp_persist::Error>(()) }).unwrap();
/// ```
pub async fn open(url: &str) -> Result<Stores> {
    Ok(backends().open(url, OpenOptions::default()).await?.stores())
}

/// The rmcp the transports are built on: use it for handlers, models and
/// `serve`, so its version always matches.
#[cfg_attr(
    feature = "macros",
    doc = r#"
With the `macros` feature it has rmcp's tool and prompt macros, and
`rmcp::serde`, `rmcp::serde_json` and `rmcp::schemars`. The macros expand to
paths starting with `rmcp::`: bring the name into scope (`use
mcp_persist::rmcp::{self, ..}`) and a tool needs no dependency of its own. A
parameter struct derives through the same re-exports, told where they are:

```
use mcp_persist::rmcp::{
    self, ServerHandler, handler::server::wrapper::Parameters, schemars, serde, tool,
    tool_handler, tool_router,
};

#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(crate = "rmcp::serde")]
#[schemars(crate = "rmcp::schemars")]
struct Sum {
    a: i64,
    b: i64,
}

#[derive(Clone)]
struct Calculator;

#[tool_router]
impl Calculator {
    /// Adds two integers.
    #[tool]
    fn sum(&self, Parameters(Sum { a, b }): Parameters<Sum>) -> String {
        (a + b).to_string()
    }
}

#[tool_handler]
impl ServerHandler for Calculator {}

let tools = Calculator.get_info();
assert!(tools.capabilities.tools.is_some());
```
"#
)]
#[cfg(any(feature = "client", feature = "server"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "client", feature = "server"))))]
pub use rmcp;

/// The SQLite backend (`mcp-persist-store-sqlite`).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite {
    #[doc(inline)]
    pub use mcp_persist_store_sqlite::*;
}

/// The crash-safe directory backend (`mcp-persist-store-file`).
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file {
    #[doc(inline)]
    pub use mcp_persist_store_file::*;
}

/// The Redis and Redis Cluster backend (`mcp-persist-store-redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    #[doc(inline)]
    pub use mcp_persist_store_redis::*;
}

/// The AWS Secrets Manager backend for credentials (`mcp-persist-store-vault`).
#[cfg(feature = "vault")]
#[cfg_attr(docsrs, doc(cfg(feature = "vault")))]
pub mod vault {
    #[doc(inline)]
    pub use mcp_persist_store_vault::*;
}

/// The Postgres backend, with a LISTEN/NOTIFY bus (`mcp-persist-store-postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    #[doc(inline)]
    pub use mcp_persist_store_postgres::*;
}

/// The Amazon DynamoDB backend (`mcp-persist-store-dynamodb`).
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb {
    #[doc(inline)]
    pub use mcp_persist_store_dynamodb::*;
}

/// The durable rmcp Streamable HTTP client (`mcp-persist-transport-http`'s
/// `client`).
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client {
    #[doc(inline)]
    pub use mcp_persist_transport_http::client::*;
}

/// The durable rmcp Streamable HTTP server (`mcp-persist-transport-http`'s
/// `server`).
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server {
    #[doc(inline)]
    pub use mcp_persist_transport_http::server::*;
}

/// Spans and metrics: core's [`Telemetry`](telemetry::Telemetry) (where
/// metrics go, how session ids appear) and, with `client` or `server`, the
/// transport's trace helpers. With the `otel` feature metrics are recorded
/// through the OpenTelemetry API and traces continue across restarts.
pub mod telemetry {
    #[doc(inline)]
    pub use mcp_persist_core::telemetry::*;
    #[cfg(any(feature = "client", feature = "server"))]
    #[doc(inline)]
    pub use mcp_persist_transport_http::telemetry::*;
}

/// OAuth storage for durable clients (`mcp-persist-transport-http`'s `auth`).
#[cfg(feature = "auth")]
#[cfg_attr(docsrs, doc(cfg(feature = "auth")))]
pub mod auth {
    #[doc(inline)]
    pub use mcp_persist_transport_http::auth::*;
}
