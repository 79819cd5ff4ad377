//! `cargo xtask bench dynamodb`: the DynamoDB backend against `moto_server`.
//!
//! * **put** and **append** against the raw SDK sending the same requests
//!   (one `UpdateItem`; one `TransactWriteItems` moving the head and putting
//!   the record) in the same run, interleaved in rounds so both see the same
//!   load: the ratio is our rate over the raw one (aim: at least 80 %).
//! * **group commit**: how many transactions 64 concurrent appends to one
//!   log take.
//! * **requests per MCP operation**: each operation sent to the Lambda
//!   example's function in-process, every invocation a fresh server
//!   instance (as on Lambda), counting the DynamoDB requests it made: what a
//!   deployment pays for.
//!
//! moto answers from one Python process, one request at a time, so the
//! absolute rates say little about DynamoDB; the ratios and the counts do.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use mcp_persist_core::{Key, KvStore, LogStore, PutOptions, Stores, kit};
use mcp_persist_lambda_example::{Function, Settings};
use mcp_persist_store_dynamodb::{
    DynamoStore,
    aws_sdk_dynamodb::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
        types::{AttributeValue, Put, ReturnValue, TransactWriteItem, Update},
    },
};
use serde_json::{Value, json};

const ROUNDS: usize = 10;
const PER_ROUND: usize = 30;

fn client(endpoint: &str) -> Client {
    Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
            .endpoint_url(endpoint)
            .build(),
    )
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The raw `UpdateItem` a `put` (overwrite, no TTL) sends.
async fn raw_put(
    client: &Client,
    table: &str,
    key: &str,
    value: &[u8],
    token: u64,
) -> anyhow::Result<()> {
    client
        .update_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("kraw/{key}")))
        .key("sk", n(0))
        .update_expression("SET d = :d, v = if_not_exists(v, :floor) + :one, w = :w REMOVE x, #t")
        .expression_attribute_names("#t", "ttl")
        .expression_attribute_values(":d", AttributeValue::B(value.to_vec().into()))
        .expression_attribute_values(":floor", n(kit::now().as_unix_millis() * 1000))
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":w", n(token))
        .return_values(ReturnValue::AllNew)
        .send()
        .await?;
    Ok(())
}

/// The raw `TransactWriteItems` an `append` of one record sends.
async fn raw_append(client: &Client, table: &str, base: u64, record: &[u8]) -> anyhow::Result<()> {
    let pk = AttributeValue::S("lraw-log".into());
    let mut head = Update::builder()
        .table_name(table)
        .key("pk", pk.clone())
        .key("sk", n(0))
        .update_expression("SET s = :s, w = :w")
        .expression_attribute_values(":s", n(base + 1))
        .expression_attribute_values(":w", n(base + 7));
    head = if base == 0 {
        head.condition_expression("attribute_not_exists(s)")
    } else {
        head.condition_expression("s = :base AND (attribute_not_exists(x) OR x > :now)")
            .expression_attribute_values(":base", n(base))
            .expression_attribute_values(":now", n(kit::now().as_unix_millis()))
    };
    let put = Put::builder()
        .table_name(table)
        .item("pk", pk)
        .item("sk", n(base + 1))
        .item("d", AttributeValue::B(record.to_vec().into()))
        .item("l", n(1))
        .build()?;
    client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().update(head.build()?).build())
        .transact_items(TransactWriteItem::builder().put(put).build())
        .send()
        .await?;
    Ok(())
}

fn rate(ops: usize, spent: Duration) -> f64 {
    ops as f64 / spent.as_secs_f64().max(1e-9)
}

async fn ratios(store: &DynamoStore, client: &Client) -> anyhow::Result<()> {
    let value = vec![42u8; 256];
    let (mut ours_put, mut raw_put_t, mut ours_append, mut raw_append_t) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    let log = Key::new("bench-log")?;
    let mut raw_base = 0;
    for round in 0..ROUNDS {
        let started = Instant::now();
        for i in 0..PER_ROUND {
            let key = Key::new(format!("bench/{}", i % 8))?;
            store
                .put(&key, value.clone(), PutOptions::default())
                .await?;
        }
        ours_put += started.elapsed();
        let started = Instant::now();
        for i in 0..PER_ROUND {
            raw_put(
                client,
                store.table(),
                &format!("{}", i % 8),
                &value,
                (round * PER_ROUND + i) as u64 + 1,
            )
            .await?;
        }
        raw_put_t += started.elapsed();
        let started = Instant::now();
        for _ in 0..PER_ROUND {
            store.append(&log, vec![value.clone()], None).await?;
        }
        ours_append += started.elapsed();
        let started = Instant::now();
        for _ in 0..PER_ROUND {
            raw_append(client, store.table(), raw_base, &value).await?;
            raw_base += 1;
        }
        raw_append_t += started.elapsed();
    }
    let ops = ROUNDS * PER_ROUND;
    println!("operation           ours/s    raw SDK/s   ratio (same requests, {ops} each)");
    for (what, ours, raw) in [
        ("put (UpdateItem)", ours_put, raw_put_t),
        ("append (1 record)", ours_append, raw_append_t),
    ] {
        let (o, r) = (rate(ops, ours), rate(ops, raw));
        println!(
            "{what:<18} {o:>8.0}   {r:>8.0}     {:>5.1} %",
            100.0 * o / r
        );
    }
    Ok(())
}

async fn group_commit(store: &DynamoStore) -> anyhow::Result<()> {
    let log = Key::new("bench-group")?;
    let before = store.requests();
    let started = Instant::now();
    let mut calls = Vec::new();
    for i in 0..64u32 {
        let store = store.clone();
        let log = log.clone();
        calls.push(tokio::spawn(async move {
            store
                .append(&log, vec![i.to_be_bytes().to_vec()], None)
                .await
        }));
    }
    for call in calls {
        call.await??;
    }
    let spent = store.requests().since(&before);
    println!(
        "\ngroup commit: 64 concurrent appends to one log took {} transactions and {} other requests in {:.0} ms",
        spent.transact_write_items,
        spent.total() - spent.transact_write_items,
        started.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

/// One invocation of the function, in-process; its answer body.
async fn invoke(
    function: &Function,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> anyhow::Result<(http::response::Parts, String)> {
    let mut request = http::Request::builder()
        .method(method)
        .uri("http://localhost/mcp")
        .header("host", "localhost");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let response = function.invoke(request.body(body)?).await?;
    let (parts, body) = response.into_parts();
    Ok((parts, String::from_utf8_lossy(&body).into_owned()))
}

async fn per_operation(store: &DynamoStore) -> anyhow::Result<()> {
    let settings = Settings {
        store_url: String::new(),
        allowed_hosts: vec!["localhost".into()],
        stream_window: Duration::from_secs(2),
        task_budget: Duration::from_secs(10),
        liveness_grace: Duration::from_secs(1),
    };
    let function = Function::with_stores(settings, Stores::new(store.clone()));
    let json = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    println!("\nDynamoDB requests per MCP operation (each a Lambda invocation, a fresh instance):");
    println!(
        "operation                                   requests  (get/update/transact/query/scan)"
    );
    let report = |what: &str, before: mcp_persist_store_dynamodb::Requests| {
        let r = store.requests().since(&before);
        println!(
            "{what:<44}{:>4}      ({}/{}/{}/{}/{})",
            r.total(),
            r.get_item,
            r.update_item,
            r.transact_write_items,
            r.query,
            r.scan
        );
    };
    let before = store.requests();
    let (parts, _) = invoke(
        &function,
        "POST",
        &json,
        Some(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}}),
        ),
    )
    .await?;
    report("initialize (legacy session created)", before);
    let session = parts
        .headers
        .get("mcp-session-id")
        .context("no session id")?
        .to_str()?
        .to_owned();
    let legacy = [
        json[0],
        json[1],
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let before = store.requests();
    invoke(
        &function,
        "POST",
        &legacy,
        Some(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    )
    .await?;
    report("notifications/initialized (restored)", before);
    let before = store.requests();
    invoke(
        &function,
        "POST",
        &legacy,
        Some(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "whoami", "arguments": {}}})),
    )
    .await?;
    report("tools/call, no events (session restored)", before);
    let before = store.requests();
    let (_, body) = invoke(
        &function,
        "POST",
        &legacy,
        Some(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "slow_progress", "arguments": {"count": 5, "delay_ms": 1},
                       "_meta": {"progressToken": "p"}}})),
    )
    .await?;
    report("tools/call with 5 progress events", before);
    let first = body
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .map(str::trim)
        .nth(1)
        .context("no event ids")?
        .to_owned();
    let before = store.requests();
    let replay = [
        ("accept", "text/event-stream"),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
        ("last-event-id", first.as_str()),
    ];
    invoke(&function, "GET", &replay, None).await?;
    report("GET with Last-Event-ID (replay, ended)", before);
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "bench", "version": "2" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} } }
    });
    let modern = |method: &'static str, name: &'static str| {
        [
            json[0],
            json[1],
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
            ("mcp-name", name),
        ]
    };
    let before = store.requests();
    invoke(
        &function,
        "POST",
        &modern("tools/call", "whoami"),
        Some(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "whoami", "arguments": {}, "_meta": meta}})),
    )
    .await?;
    report("2026-07-28 tools/call (no session)", before);
    let before = store.requests();
    let (_, body) = invoke(
        &function,
        "POST",
        &modern("tools/call", "long_job"),
        Some(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "long_job", "arguments": {"steps": 2, "step_ms": 1}, "_meta": meta}})),
    )
    .await?;
    report("2026-07-28 tools/call creating a task", before);
    let task = body
        .split("\"taskId\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .context("no task id")?
        .to_owned();
    let task: &'static str = Box::leak(task.into_boxed_str());
    for what in [
        "tasks/get (takes the task over, runs it)",
        "tasks/get (collects the result)",
    ] {
        let before = store.requests();
        let (_, body) = invoke(
            &function,
            "POST",
            &modern("tasks/get", task),
            Some(json!({"jsonrpc": "2.0", "id": 6, "method": "tasks/get",
                "params": {"taskId": task, "_meta": meta}})),
        )
        .await?;
        report(what, before);
        if what.contains("collects") && !body.contains("completed") {
            bail!("the task did not complete: {body}");
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Ok(endpoint) = std::env::var("MCP_PERSIST_MOTO_URL") else {
        bail!(
            "MCP_PERSIST_MOTO_URL is not set: run `cargo xtask bench dynamodb`, which starts moto"
        );
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = client(&endpoint);
        let table = format!("bench-{}", std::process::id());
        DynamoStore::create_table(&client, &table).await?;
        let store = DynamoStore::builder(&table)
            .client(client.clone())
            .build()
            .await?;
        println!("DynamoDB backend on moto ({endpoint}), table {table}\n");
        ratios(&store, &client).await?;
        group_commit(&store).await?;
        per_operation(&store).await?;
        client.delete_table().table_name(&table).send().await?;
        Ok(())
    })
}
