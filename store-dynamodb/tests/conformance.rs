//! The whole core conformance suite (key-value, logs, every typed store,
//! and the crash suite with writers killed by SIGKILL) against DynamoDB in
//! `moto_server`, each test in a table of its own, reopened as a restarted
//! process would.

mod common;

// moto answers each call in a few milliseconds: fewer kills than the
// default keep the run short; `MCP_PERSIST_KILLS` asks for more.
mcp_persist_core::backend_conformance!(open: common::open_at, kills: 20);
