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
