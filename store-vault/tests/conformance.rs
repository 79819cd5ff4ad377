//! The key-value part of the core conformance suite (the typed stores that
//! need only a key-value store and the crash suite included) against
//! `moto_server`.

mod common;

// moto answers a compare-and-swap in several calls: fewer kills than the
// default keep the run short; `MCP_PERSIST_KILLS` asks for more.
mcp_persist_core::backend_conformance!(kv_only, open: common::open_at, kills: 20);

/// Opened by URL, in a child process whose environment holds the (fake)
/// credentials an `endpoint=` URL needs: a prefix nothing was written under
/// is an empty store in every mode (Secrets Manager keeps no mark of a
/// store), opening it writes nothing, and what `Create` wrote is read back.
#[test]
fn open_modes() {
    const CHILD: &str = "MCP_PERSIST_VAULT_OPEN_MODES_CHILD";
    if let Ok(prefix) = std::env::var(CHILD) {
        let moto = std::env::var(common::URL_VAR).expect("moto");
        let url = format!("secretsmanager://us-east-1?prefix={prefix}&endpoint={moto}");
        tokio::runtime::Runtime::new().expect("a runtime").block_on(
            mcp_persist_core::conformance::opener::open_modes(
                mcp_persist_store_vault::SecretsManagerOpener,
                &url,
                &url,
                mcp_persist_core::conformance::opener::Absent::Empty,
            ),
        );
        return;
    }
    let Some(moto) = common::moto_url() else {
        return;
    };
    let status = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "open_modes", "--nocapture"])
        .env(CHILD, common::unique_prefix("open-modes"))
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env(common::URL_VAR, &moto)
        .status()
        .expect("run the child");
    assert!(status.success(), "the child failed: {status}");
}
