//! The CLI's integration tests, as one test binary: one link instead of one
//! per file, and the shared helpers compiled once. Each file is a module; run
//! one with `cargo test --test integration <module>::`.

#[path = "../support/mod.rs"]
mod support;

mod copy;
mod copy_safety;
mod inspect;
mod output;
mod readonly;
mod registry_backends;
mod sealing;
mod secrets;
mod shared_account;
