//! The sealing suite on the test Postgres, each test in a schema of its own:
//! no planted secret or key in what the database holds (every key, value and
//! log record of the schema, read raw with SQL), swapped ciphertexts and
//! wrong keys as typed errors, rekey under load and after a SIGKILL, and the
//! key-value and log suites through the seal.

mod common;

use mcp_persist_store_postgres::PostgresStore;

/// Every key, value, log name and log record of the place's schema, as
/// Postgres stores them.
async fn schema_bytes(place: mcp_persist_core::conformance::crash::Place) -> Vec<u8> {
    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("raw connection");
    let task = tokio::spawn(connection);
    let schema = place.name.to_lowercase();
    let mut raw = Vec::new();
    for sql in [
        format!("SELECT convert_to(key, 'UTF8'), value FROM {schema}.kv"),
        format!("SELECT convert_to(name, 'UTF8'), ''::bytea FROM {schema}.logs"),
        format!("SELECT ''::bytea, data FROM {schema}.log_records"),
    ] {
        for row in client.query(&sql, &[]).await.expect("raw read") {
            let key: Vec<u8> = row.get(0);
            let value: Vec<u8> = row.get(1);
            raw.extend(key);
            raw.extend(value);
        }
    }
    drop(client);
    let _ = task.await;
    raw
}

mcp_persist_core::seal_conformance!(
    open: |place| async move {
        PostgresStore::builder(&common::url())
            .schema(place.name.to_lowercase())
            .connect()
            .await
    },
    raw: schema_bytes,
);
