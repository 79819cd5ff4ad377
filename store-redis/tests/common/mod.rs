//! What the integration tests share: where the Redis servers are, and the
//! conformance fixture.
//!
//! `cargo xtask test` starts a standalone server and a three-node cluster and
//! passes their addresses in `MCP_PERSIST_REDIS_URL` and
//! `MCP_PERSIST_REDIS_CLUSTER_URLS`. Without them, a test fails under CI and
//! otherwise prints a notice and skips.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use mcp_persist_store_redis::RedisStore;

pub const URL_VAR: &str = "MCP_PERSIST_REDIS_URL";
pub const CLUSTER_VAR: &str = "MCP_PERSIST_REDIS_CLUSTER_URLS";

/// Whether we run under CI, where a missing service is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Reads a service variable; `None` (after a notice) when it is not set
/// outside CI. Under CI a missing variable fails the test.
pub fn service_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            assert!(
                !under_ci(),
                "{name} is not set; under CI the Redis tests must run (start them with `cargo xtask test`)"
            );
            eprintln!(
                "notice: {name} is not set; skipping (run `cargo xtask test` to start Redis)"
            );
            None
        }
    }
}

/// Which of the test servers a store connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Standalone,
    Cluster,
}

/// The connection settings of one topology, or `None` when it is not available.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Standalone(String),
    Cluster(Vec<String>),
}

impl Endpoint {
    pub fn of(topology: Topology) -> Option<Endpoint> {
        match topology {
            Topology::Standalone => service_var(URL_VAR).map(Endpoint::Standalone),
            Topology::Cluster => service_var(CLUSTER_VAR).map(|urls| {
                Endpoint::Cluster(
                    urls.split(',')
                        .map(str::trim)
                        .filter(|u| !u.is_empty())
                        .map(str::to_owned)
                        .collect(),
                )
            }),
        }
    }

    /// Opens a new store (a new connection) under `prefix`.
    pub async fn open(&self, prefix: &str) -> RedisStore {
        let builder = match self {
            Endpoint::Standalone(url) => RedisStore::standalone(url.clone()),
            Endpoint::Cluster(urls) => RedisStore::cluster(urls.clone()),
        };
        builder
            .key_prefix(prefix)
            .operation_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connecting to the test Redis failed: {e}"))
    }
}

/// A prefix no other test uses.
pub fn unique_prefix(what: &str) -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS has randomness");
    let hex = mcp_persist_core::kit::hex(&bytes);
    format!("test:{what}:{hex}:")
}

/// Opens a fresh store of the conformance suite: the topology's server
/// under the place's own prefix. A missing server is a failure that says how
/// to start one.
pub async fn open_at(
    topology: Topology,
    place: mcp_persist_core::conformance::crash::Place,
) -> Result<RedisStore, mcp_persist_core::Error> {
    let var = match topology {
        Topology::Standalone => URL_VAR,
        Topology::Cluster => CLUSTER_VAR,
    };
    assert!(
        std::env::var(var).is_ok_and(|v| !v.trim().is_empty()),
        "{var} is not set: start Redis with `cargo xtask services` (or run `cargo xtask test`)"
    );
    let endpoint = Endpoint::of(topology).expect("checked above");
    Ok(endpoint.open(&format!("test:{}:", place.name)).await)
}
