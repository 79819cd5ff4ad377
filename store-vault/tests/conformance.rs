//! The key-value part of the core conformance suite (the typed stores that
//! need only a key-value store and the crash suite included) against
//! `moto_server`.

mod common;

// moto answers a compare-and-swap in several calls: fewer kills than the
// default keep the run short; `MCP_PERSIST_KILLS` asks for more.
mcp_persist_core::backend_conformance!(kv_only, open: common::open_at, kills: 20);
