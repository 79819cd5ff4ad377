//! `conformance-client`: the client the conformance suite's client scenarios
//! run, as `conformance-client <server-url>` with the scenario in
//! `MCP_CONFORMANCE_SCENARIO`.
//!
//! Exits 0 when the scenario ran to its end, 1 with the reason on stderr
//! otherwise (the suite judges the outcome from what its mock server saw).

use anyhow::{Context, Result};
use mcp_persist_conformance::{
    client::{SCENARIO_DEADLINE, Scenario},
    init_tracing,
};

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let url = std::env::args()
        .skip(1)
        .last()
        .context("usage: conformance-client <server-url> (the conformance suite appends it)")?;
    let scenario = Scenario::from_env()?;
    tokio::time::timeout(SCENARIO_DEADLINE, scenario.run(&url))
        .await
        .with_context(|| {
            format!(
                "scenario {} did not finish within {}s",
                scenario.name,
                SCENARIO_DEADLINE.as_secs()
            )
        })?
}
