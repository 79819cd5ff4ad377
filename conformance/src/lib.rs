//! The peers that `cargo xtask conformance` runs the official MCP
//! conformance suite against. **Not built yet.**
//!
//! This package will hold two programs: a conformance server (an rmcp server
//! exposing the suite's fixture tools, resources and prompts, with sessions
//! and events in mcp-persist stores) and a conformance client (an rmcp client
//! through mcp-persist's durable transport, persistence on). It is not
//! published.
