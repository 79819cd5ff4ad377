//! The whole core conformance suite (key-value, log, typed, crash) on the
//! test Postgres, each test in a schema of its own (the place's name): the
//! crash suite's "eight processes open a new store at once" so migrates one
//! new schema from eight processes at the same instant.

mod common;

use mcp_persist_store_postgres::PostgresStore;

mcp_persist_core::backend_conformance!(open: |place| async move {
    PostgresStore::builder(&common::url())
        .schema(place.name.to_lowercase())
        .connect()
        .await
});

/// Opened by URL: a schema that does not exist is not a store to
/// `ReadOnly` and `Existing`, twice over, and only `Create` makes one.
#[tokio::test]
async fn open_modes() {
    use mcp_persist_core::conformance::opener::{Absent, open_modes};
    let mut url = url::Url::parse(&common::url()).expect("the test Postgres URL");
    url.query_pairs_mut()
        .append_pair("schema", &common::unique_schema("open_modes"));
    let url = url.to_string();
    open_modes(
        mcp_persist_store_postgres::PostgresOpener,
        &url,
        &url,
        Absent::NotAStore,
    )
    .await;
}
