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
