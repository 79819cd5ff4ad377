//! The transport's integration tests, as one test binary: one link instead
//! of one per file, and the shared helpers compiled once. Each file is a
//! module; run one with `cargo test --test integration <module>::`.
//!
//! Files that install a global `tracing` subscriber or are not libtest
//! programs (`auth_logs`, `client_logs`, `otel`, `otel_secrets`,
//! `client_restart`, and `https`, which needs `rustls`) stay binaries of
//! their own beside this folder.
//!
//! Tests that run a child process re-execute this binary with `--exact` and
//! the child's libtest name: [`support::test_path`] gives it.

#[cfg(feature = "auth")]
#[path = "../auth_support/mod.rs"]
mod auth_support;
#[path = "../client_support/mod.rs"]
mod client_support;
#[path = "../slow_store/mod.rs"]
mod slow_store;
#[path = "../support/mod.rs"]
mod support;

mod auth_dpop;
mod auth_flow;
mod auth_processes;
mod binding_matrix;
mod bus;
mod client_modern;
mod client_recovery;
mod client_reprobe;
mod client_session_gone;
mod client_tasks;
mod exactly_once;
mod exactly_once_client;
mod exactly_once_kills;
mod failover;
mod generic_client;
mod liveness;
mod resume_priming;
mod sealing_flows;
mod server;
mod session_end;
mod stored_numbers;
mod tasks;

/// The demo server, when [`support::Instance::process`] started this binary
/// as one (`--exact demo_server_process`); otherwise it returns at once.
#[test]
fn demo_server_process() {
    support::run_demo_server_if_asked();
}
