//! The whole core conformance suite, on a standalone Redis and on a
//! three-node Redis Cluster.

mod common;

mod standalone {
    use super::common::{Topology, fixture};

    mcp_persist_core::kv_conformance!(fixture(Topology::Standalone));
    mcp_persist_core::log_conformance!(fixture(Topology::Standalone));
}

mod cluster {
    use super::common::{Topology, fixture};

    mcp_persist_core::kv_conformance!(fixture(Topology::Cluster));
    mcp_persist_core::log_conformance!(fixture(Topology::Cluster));
}
