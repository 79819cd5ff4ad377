//! The whole core conformance suite (key-value, log, typed, crash), on a
//! standalone Redis and on a three-node Redis Cluster.

mod common;

mod standalone {
    use super::common::{Topology, open_at};

    mcp_persist_core::backend_conformance!(open: |place| open_at(Topology::Standalone, place));
}

mod cluster {
    use super::common::{Topology, open_at};

    mcp_persist_core::backend_conformance!(open: |place| open_at(Topology::Cluster, place));
}

/// Opened by URL: a key prefix nothing was written under is an empty store
/// in every mode (Redis keeps no mark of a store), opening it writes
/// nothing, and what `Create` wrote is read back by the others.
#[tokio::test]
async fn open_modes() {
    use mcp_persist_core::conformance::opener::{Absent, open_modes};
    let Some(base) = common::service_var(common::URL_VAR) else {
        return;
    };
    let url = format!(
        "{}/?prefix={}",
        base.trim_end_matches('/'),
        common::unique_prefix("open-modes")
    );
    open_modes(
        mcp_persist_store_redis::RedisOpener,
        &url,
        &url,
        Absent::Empty,
    )
    .await;
}
