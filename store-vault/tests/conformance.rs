//! The key-value part of the core conformance suite (and the typed stores
//! that need only a key-value store) against `moto_server`, the
//! compare-and-swap race included.

mod common;

use common::fixture;

mcp_persist_core::kv_conformance!(fixture());
