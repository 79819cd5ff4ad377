//! The one table: its explicit, idempotent creation and the check that a
//! table opened is one of ours.

use std::time::Duration;

use aws_sdk_dynamodb::{
    Client,
    types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        TableDescription, TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
    },
};
use mcp_persist_core::{Error, Result};

use crate::{
    Counters, Inner,
    error::{code_of, from_sdk},
    item::{PK, SK, TTL},
};

/// How long [`create`] waits for a new table to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(120);

/// DynamoDB's table names: 3 to 255 of `A-Z a-z 0-9 _ - .`.
pub(crate) fn check_name(table: &str) -> Result<()> {
    let ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "DynamoDB table name",
            format!("`{table}`: a table name is 3 to 255 characters of A-Z a-z 0-9 _ - ."),
        ))
    }
}

fn region_of(client: &Client) -> String {
    client
        .config()
        .region()
        .map_or_else(|| "(none)".to_owned(), |r| r.as_ref().to_owned())
}

/// Whether `description` has this backend's key schema: `pk` (string) as
/// partition key and `sk` (number) as sort key. Otherwise the error says
/// what the table has and what to do.
fn check_schema(table: &str, description: &TableDescription) -> Result<()> {
    let keys: Vec<(String, String)> = description
        .key_schema()
        .iter()
        .map(|k| {
            (
                k.attribute_name().to_owned(),
                k.key_type().as_str().to_owned(),
            )
        })
        .collect();
    let type_of = |name: &str| {
        description
            .attribute_definitions()
            .iter()
            .find(|a| a.attribute_name() == name)
            .map(|a| a.attribute_type().as_str().to_owned())
    };
    let expected = [
        (PK.to_owned(), "HASH".to_owned()),
        (SK.to_owned(), "RANGE".to_owned()),
    ];
    let ours = keys.len() == 2
        && expected.iter().all(|e| keys.contains(e))
        && type_of(PK).as_deref() == Some("S")
        && type_of(SK).as_deref() == Some("N");
    if ours {
        return Ok(());
    }
    let found: Vec<String> = keys
        .iter()
        .map(|(name, kind)| {
            format!(
                "{name} {kind} {}",
                type_of(name).unwrap_or_else(|| "?".into())
            )
        })
        .collect();
    Err(Error::invalid(
        "DynamoDB table",
        format!(
            "table `{table}` has the key schema ({}), but mcp-persist needs (pk HASH S, sk RANGE N): \
             give mcp-persist a table of its own (DynamoStore::create_table makes one); nothing \
             was written",
            found.join(", ")
        ),
    ))
}

/// Checks, with one `DescribeTable`, that the store's table exists and is
/// one of ours. Writes nothing.
pub(crate) async fn verify(inner: &Inner) -> Result<()> {
    Counters::bump(&inner.counters.table);
    let out = inner
        .client
        .describe_table()
        .table_name(&inner.table)
        .send()
        .await
        .map_err(|e| inner.sdk_error("DescribeTable", e))?;
    let description = out.table().ok_or_else(|| {
        Error::backend(
            crate::BACKEND,
            crate::ServiceError::new("DescribeTable", "the answer describes no table"),
        )
    })?;
    check_schema(&inner.table, description)
}

/// Creates `table` if it does not exist, waits until it is active, checks
/// its key schema and turns its TTL on. Safe to call again and from many
/// processes at once. `counters`, when given, counts the requests.
pub(crate) async fn create(
    client: &Client,
    table: &str,
    counters: Option<&Counters>,
) -> Result<()> {
    check_name(table)?;
    let region = region_of(client);
    let count = || {
        if let Some(c) = counters {
            Counters::bump(&c.table);
        }
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(|e| crate::error::build_error("CreateTable", e))
    };
    let attribute = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(|e| crate::error::build_error("CreateTable", e))
    };
    count();
    let created = client
        .create_table()
        .table_name(table)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        .attribute_definitions(attribute(PK, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(SK, ScalarAttributeType::N)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => tracing::info!(table, region, "created the DynamoDB table"),
        // Made by someone else (or an earlier call): check it below.
        Err(e) if code_of(&e) == Some("ResourceInUseException") => {
            tracing::debug!(table, "the DynamoDB table exists already");
        }
        Err(e) => return Err(from_sdk("CreateTable", table, &region, e)),
    }
    let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
    loop {
        count();
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| from_sdk("DescribeTable", table, &region, e))?;
        let description = out.table().ok_or_else(|| {
            Error::backend(
                crate::BACKEND,
                crate::ServiceError::new("DescribeTable", "the answer describes no table"),
            )
        })?;
        check_schema(table, description)?;
        if description.table_status() == Some(&TableStatus::Active) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                operation: "waiting for the new DynamoDB table to become active",
                after: ACTIVE_WITHIN,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    enable_ttl(client, table, &region, &count).await
}

/// Turns DynamoDB's TTL on for the `ttl` attribute, unless it is on already
/// (or being turned on by a concurrent call).
async fn enable_ttl(
    client: &Client,
    table: &str,
    region: &str,
    count: &(dyn Fn() + Sync),
) -> Result<()> {
    for _ in 0..10 {
        count();
        let described = client
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .map_err(|e| from_sdk("DescribeTimeToLive", table, region, e))?;
        if let Some(ttl) = described.time_to_live_description() {
            let on = matches!(
                ttl.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            );
            match ttl.attribute_name() {
                Some(name) if on && name == TTL => return Ok(()),
                Some(name) if on => {
                    return Err(Error::invalid(
                        "DynamoDB table",
                        format!(
                            "table `{table}` has TTL on the attribute `{name}`, but mcp-persist \
                             writes expiry to `{TTL}`: give mcp-persist a table of its own"
                        ),
                    ));
                }
                _ => {}
            }
        }
        count();
        let spec = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(TTL)
            .build()
            .map_err(|e| crate::error::build_error("UpdateTimeToLive", e))?;
        match client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(spec)
            .send()
            .await
        {
            Ok(_) => {
                tracing::info!(table, "turned DynamoDB's TTL on for attribute `ttl`");
                return Ok(());
            }
            // Another process changed it at the same moment: look again.
            Err(e) if code_of(&e) == Some("ValidationException") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(from_sdk("UpdateTimeToLive", table, region, e)),
        }
    }
    Err(Error::Timeout {
        operation: "turning DynamoDB's TTL on",
        after: Duration::from_secs(2),
    })
}
