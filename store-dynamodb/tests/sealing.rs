//! The sealing suite on DynamoDB in `moto_server`, each test in a table of
//! its own: no planted secret or key in what the table holds (every
//! attribute of every item, read raw with `Scan`), swapped ciphertexts and
//! wrong keys as typed errors, rekey, and the key-value and log suites
//! through the seal. The suite's multi-process tests (rekey under load and
//! after SIGKILL) run on the local backends; moto answers one request at a
//! time.

mod common;

use mcp_persist_store_dynamodb::aws_sdk_dynamodb::types::AttributeValue;

/// An attribute's bytes, as DynamoDB stores them.
fn attribute_bytes(value: &AttributeValue, raw: &mut Vec<u8>) {
    match value {
        AttributeValue::B(b) => raw.extend_from_slice(b.as_ref()),
        AttributeValue::S(s) | AttributeValue::N(s) => raw.extend_from_slice(s.as_bytes()),
        AttributeValue::L(items) => items.iter().for_each(|v| attribute_bytes(v, raw)),
        AttributeValue::M(map) => map.iter().for_each(|(k, v)| {
            raw.extend_from_slice(k.as_bytes());
            attribute_bytes(v, raw);
        }),
        AttributeValue::Bs(list) => list.iter().for_each(|b| raw.extend_from_slice(b.as_ref())),
        AttributeValue::Ss(list) | AttributeValue::Ns(list) => list
            .iter()
            .for_each(|s| raw.extend_from_slice(s.as_bytes())),
        _ => {}
    }
}

/// Every attribute of every item of the place's table.
async fn table_bytes(place: mcp_persist_core::conformance::crash::Place) -> Vec<u8> {
    let url = std::env::var(common::URL_VAR).expect("the store was opened, so the URL is set");
    let client = common::client(url.trim());
    let table = format!("mcp-{}", place.name);
    let mut raw = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(&table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("Scan");
        for item in page.items() {
            for (name, value) in item {
                raw.extend_from_slice(name.as_bytes());
                attribute_bytes(value, &mut raw);
            }
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => break,
        }
    }
    raw
}

mcp_persist_core::seal_conformance!(in_process, open: common::open_at, raw: table_bytes);
