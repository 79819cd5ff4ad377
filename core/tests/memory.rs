//! The memory backend passes the whole conformance suite.

use mcp_persist_core::conformance::MemoryFixture;

async fn fixture() -> MemoryFixture {
    MemoryFixture::default()
}

mcp_persist_core::kv_conformance!(fixture());
mcp_persist_core::log_conformance!(fixture());
