//! Postgres and DynamoDB, backends the command line has no code for: it opens
//! them through the facade's registry of store URLs and reads them through
//! core's declarations, like every other store. A real demo server and a
//! durable client fill each store; `ls`, `show`, `stats` and `check` read it
//! and `copy` moves it into SQLite, twice.

use crate::support::*;
use anyhow::Context as _;
use serde_json::Value;

async fn scenario(url: &str, stores: mcp_persist::Stores) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(stores).await?;
    let client_url = format!("sqlite:{}", dir.path().join("client.db").display());
    let run = client_run(&server.url, &open_local(&client_url).await?).await?;
    let session = run.session_id.context("the client holds a session")?;
    drop(server);

    let rows: Vec<Value> = serde_json::from_str(&cli_expect(&["--json", "ls", url], 0))?;
    assert!(
        rows.iter().any(|r| r["id"] == session.as_str()
            && r["client_name"] == CLIENT_NAME
            && r["client_version"] == CLIENT_VERSION),
        "ls lists the client's session {session}: {rows:?}"
    );
    let streams: Vec<Value> =
        serde_json::from_str(&cli_expect(&["--json", "ls", url, "events"], 0))?;
    assert!(
        streams
            .iter()
            .any(|s| s["session"] == session.as_str() && s["events"].as_u64() > Some(0)),
        "ls events lists the progress stream of the call: {streams:?}"
    );
    let shown: Value = serde_json::from_str(&cli_expect(
        &["--json", "show", url, &session_key(&session)],
        0,
    ))?;
    assert_eq!(shown["kind"], "server_session");
    let stats: Vec<Value> = serde_json::from_str(&cli_expect(&["--json", "stats", url], 0))?;
    for kind in ["sessions", "events", "event logs"] {
        assert!(
            stats
                .iter()
                .any(|k| k["kind"] == kind && k["records"].as_u64() > Some(0)),
            "stats counts {kind}: {stats:?}"
        );
    }
    let checked: Value = serde_json::from_str(&cli_expect(&["--json", "check", url], 0))?;
    assert_eq!(checked["damaged"], serde_json::json!([]), "{checked}");

    // Out of the backend into SQLite; the second run copies nothing again.
    let dest = format!("sqlite:{}", dir.path().join("copy.db").display());
    let first: Value = serde_json::from_str(&cli_expect(&["--json", "copy", url, &dest], 0))?;
    assert!(first["copied"].as_u64() > Some(0), "{first}");
    assert_eq!(first["verified"], true, "{first}");
    let second: Value = serde_json::from_str(&cli_expect(&["--json", "copy", url, &dest], 0))?;
    assert_eq!(
        second["copied"], 0,
        "the second copy copies nothing: {second}"
    );
    assert_eq!(second["log_records_appended"], 0, "{second}");
    let copied: Vec<Value> = serde_json::from_str(&cli_expect(&["--json", "ls", &dest], 0))?;
    assert!(
        copied.iter().any(|r| r["id"] == session.as_str()),
        "the copy holds the session: {copied:?}"
    );
    Ok(())
}

/// A name no other run uses, for a schema or a table.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_read_through_the_registry() -> anyhow::Result<()> {
    let Some(base) = service_var("MCP_PERSIST_POSTGRES_URL") else {
        return Ok(());
    };
    let mut url = url::Url::parse(&base)?;
    url.query_pairs_mut()
        .append_pair("schema", &unique("cli_registry"));
    let stores = mcp_persist::open(url.as_str()).await?;
    scenario(url.as_str(), stores).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_store_read_through_the_registry() -> anyhow::Result<()> {
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    use mcp_persist::dynamodb::DynamoStore;
    // The server in this process writes the table with a client of its own;
    // the binary finds it by URL, with the credentials `cli` gives it.
    let table = unique("cli-registry").replace('_', "-");
    let client = dynamodb_client(&moto);
    DynamoStore::create_table(&client, &table).await?;
    let store = DynamoStore::builder(&table).client(client).build().await?;
    scenario(
        &format!("dynamodb://{table}?region=us-east-1&endpoint={moto}"),
        mcp_persist::Stores::new(store),
    )
    .await
}
