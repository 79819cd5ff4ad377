//! `conformance-client`: the client the conformance suite's client scenarios
//! run, as `conformance-client [--transport durable|stock] <server-url>`
//! with the scenario in `MCP_CONFORMANCE_SCENARIO`. The durable transport
//! (state on SQLite, persistence on) is the default; `stock` is rmcp's own.
//!
//! Exits 0 when the scenario ran to its end, 1 with the reason on stderr
//! otherwise (the suite judges the outcome from what its mock server saw).

use anyhow::{Context, Result};
use mcp_persist_conformance::{
    client::{ClientTransport, SCENARIO_DEADLINE, Scenario},
    init_tracing,
};

#[tokio::main]
async fn main() -> Result<()> {
    init_tracing();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: conformance-client [--transport durable|stock] <server-url> \
                 (the conformance suite appends the URL)";
    let url = args.last().context(usage)?.clone();
    let transport = match args.iter().position(|a| a == "--transport") {
        None => ClientTransport::Durable,
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("durable") => ClientTransport::Durable,
            Some("stock") => ClientTransport::Stock,
            _ => anyhow::bail!("{usage}"),
        },
    };
    let scenario = Scenario::from_env()?;
    tokio::time::timeout(SCENARIO_DEADLINE, scenario.run(&url, transport))
        .await
        .with_context(|| {
            format!(
                "scenario {} did not finish within {}s",
                scenario.name,
                SCENARIO_DEADLINE.as_secs()
            )
        })?
}
