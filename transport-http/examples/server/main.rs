#![allow(deprecated)] // Sampling is deprecated by SEP-2577 but still part of 2025-11-25, which this demo serves.
//! A durable rmcp Streamable HTTP server: run several of these on one store
//! and any of them serves any session.
//!
//! ```text
//! cargo run -p mcp-persist-transport-http --example server -- \
//!     --store sqlite:./state.db --port 8080
//! ```
//!
//! `--help` lists the flags. The server names itself
//! `mcp-persist-example-server` with this crate's version in `serverInfo`.
//!
//! Tools: `slow_progress` (answers after `count` steps `delay_ms` apart,
//! sending a progress notification carrying `tag` at each step when the
//! client asked for progress with a progress token), `ask_sampling` (asks
//! the client to sample: a client that did not declare sampling gets a tool
//! error at once), `charge` and `refresh` (note `<tool> <tag>` in the runs
//! file, wait `delay_ms`, and answer which run they were: under one
//! idempotency key `charge` runs once, and `refresh`, declared safe to
//! re-run, runs again if its instance stops mid-call), `stats` (how many
//! `initialize` requests this process
//! answered, and how many sessions it restored from the store) and `whoami`
//! (the name, version and capabilities of the client of this very request:
//! its `_meta` on 2026-07-28, the session's `initialize` before; and the
//! `Mcp-Session-Id` the handler was given, if any). The principal is read
//! from the `x-demo-user` header (a stand-in for real authentication).
//!
//! Task tools (2026-07-28 tasks extension, for clients that declare it):
//! `long_job` (`steps` steps of `step_ms`, resumable: if this instance dies,
//! another one runs it again), `fragile_job` (the same, not resumable: it
//! fails when its instance dies) and `ask_name` (asks the client for a name
//! through `tasks/update`, then greets; a client without the tasks extension
//! is asked directly, in a legacy session; a client that did not declare
//! elicitation gets an error at once), and `touch_tools` (announces a
//! tool list change on the fleet bus: every instance's `subscriptions/listen`
//! streams and legacy sessions hear it), and `touch_resource` (`uri`:
//! announces that resource changed; listen streams whose filter names it and
//! legacy sessions that `resources/subscribe`d to it hear it). With `--runs-file PATH` every start
//! and end of a task operation is appended to PATH as a line
//! `start|done <task id> <generation>`.
//!
//! It prints `LISTENING <address>` once it accepts connections.

mod handler;
mod jobs;
mod options;
mod serve;

// The tests, benchmarks and load driver include this file as a module, and
// each uses a few of these.
#[allow(unused_imports)]
pub use handler::{Counters, DemoHandler, server_info};
#[allow(unused_imports)]
pub use jobs::register_tasks;
pub use options::{Command, Options, USAGE};
#[allow(unused_imports)]
pub use serve::{
    durable_router, durable_router_with_tasks, durable_server, open_stores, rmcp_default_router,
    run,
};

/// `--help` prints the flags; a bad command line or a failure to serve is
/// one line on stderr (exit status 2 and 1), never a backtrace.
#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = match Command::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Ok(Command::Serve(options)) => *options,
        Err(e) => {
            eprintln!("server: {e:#}\nRun `server --help` for the flags.");
            return std::process::ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(options).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
