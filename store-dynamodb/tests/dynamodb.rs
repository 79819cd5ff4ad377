//! What is particular to DynamoDB, against `moto_server`: the table's
//! explicit setup, DynamoDB's TTL attribute next to filtering on read, and
//! bad input (a missing table, a wrong region or endpoint, a throttling
//! storm, an item over 400 KB, a table with another key schema), each a
//! typed error that says what to do and changes nothing.

mod common;

use std::time::Duration;

use common::{Proxy, builder, client, client_in, fresh_store, moto_url, unique_table};
use mcp_persist_core::{
    Backend, Error, Key, KvStore, LogStore, PutMode, PutOptions,
    registry::{OpenOptions, Registry},
};
use mcp_persist_store_dynamodb::{
    DynamoOpener, DynamoStore, MAX_VALUE_BYTES, Throttled,
    aws_sdk_dynamodb::types::{
        AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
        ScalarAttributeType, TimeToLiveStatus,
    },
};

fn key(text: &str) -> Key {
    Key::new(text).expect("valid key")
}

/// The raw item of a key-value record, as DynamoDB holds it.
async fn raw_item(
    store: &DynamoStore,
    pk: &str,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(pk.to_owned()))
        .key("sk", AttributeValue::N("0".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("raw get")
        .item
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    }
}

#[tokio::test]
async fn create_table_is_idempotent_and_turns_ttl_on() {
    let Some(url) = moto_url() else { return };
    let table = unique_table("setup");
    let client = client(&url);
    // Opening never creates: before the setup call the table is missing.
    let err = builder(&url, &table)
        .build()
        .await
        .expect_err("no table yet");
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    // Eight callers at once, then one more: one table, all succeed.
    let mut calls = Vec::new();
    for _ in 0..8 {
        let client = client.clone();
        let table = table.clone();
        calls.push(tokio::spawn(async move {
            DynamoStore::create_table(&client, &table).await
        }));
    }
    for call in calls {
        call.await.expect("task").expect("create_table");
    }
    DynamoStore::create_table(&client, &table)
        .await
        .expect("again");
    let ttl = client
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .expect("describe ttl");
    let ttl = ttl.time_to_live_description().expect("ttl description");
    assert_eq!(ttl.attribute_name(), Some("ttl"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
    let store = builder(&url, &table).build().await.expect("open");
    store
        .put(&key("a"), b"1".to_vec(), PutOptions::default())
        .await
        .expect("put");
}

#[tokio::test]
async fn missing_table_is_not_found_and_says_how_to_create_it() {
    let Some(url) = moto_url() else { return };
    let table = unique_table("missing");
    let err = builder(&url, &table)
        .build()
        .await
        .expect_err("missing table");
    let text = err.to_string();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert!(
        text.contains(&table) && text.contains("create_table") && text.contains("us-east-1"),
        "{text}"
    );
    // A bad name is refused before any request.
    let err = builder(&url, "no spaces allowed")
        .build()
        .await
        .expect_err("bad name");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
}

#[tokio::test]
async fn wrong_region_or_endpoint_is_a_typed_error() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "region").await;
    // moto keeps tables per region, as AWS does.
    let err = DynamoStore::builder(store.table())
        .client(client_in(&url, "eu-west-3"))
        .build()
        .await
        .expect_err("another region");
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("eu-west-3"), "{err}");
    // Nothing listens there: unreachable, and the message says what to check.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let err = DynamoStore::builder(store.table())
        .client(client(&format!("http://{closed}")))
        .retry(1, Duration::from_millis(1))
        .build()
        .await
        .expect_err("closed port");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let chain = std::error::Error::source(&err)
        .map(|s| s.to_string())
        .unwrap_or_default();
    assert!(chain.contains("region and the endpoint"), "{chain}");
}

#[tokio::test]
async fn a_table_with_another_key_schema_is_refused_and_left_alone() {
    let Some(url) = moto_url() else { return };
    let table = unique_table("foreign");
    let client = client(&url);
    client
        .create_table()
        .table_name(&table)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .expect("key"),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute"),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create a foreign table");
    let err = builder(&url, &table)
        .build()
        .await
        .expect_err("foreign schema");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("id HASH S") && text.contains("pk HASH S, sk RANGE N"),
        "{text}"
    );
    let err = DynamoStore::create_table(&client, &table)
        .await
        .expect_err("setup on a foreign table");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    let items = client.scan().table_name(&table).send().await.expect("scan");
    assert_eq!(items.count(), 0, "nothing was written to the foreign table");
}

#[tokio::test]
async fn values_over_the_item_limit_are_too_large_and_write_nothing() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "large").await;
    // The default limit is under DynamoDB's 400 KB per item, key included.
    let default = DynamoStore::builder(store.table())
        .client(client(&url))
        .build()
        .await
        .expect("open");
    assert_eq!(default.max_value_bytes(), MAX_VALUE_BYTES);
    const { assert!(MAX_VALUE_BYTES + 1024 + 100 <= 400 * 1024) };
    let over = vec![7u8; 400 * 1024 + 1];
    store
        .put(&key("k"), b"small".to_vec(), PutOptions::default())
        .await
        .expect("put");
    for s in [&store, &default] {
        let err = s
            .put(&key("k"), over.clone(), PutOptions::default())
            .await
            .expect_err("over 400 KB");
        assert!(
            matches!(err, Error::TooLarge { size, .. } if size == over.len()),
            "{err:?}"
        );
        let err = s
            .append(&key("log"), vec![b"ok".to_vec(), over.clone()], None)
            .await
            .expect_err("record over 400 KB");
        assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");
    }
    assert_eq!(
        store.get(&key("k")).await.expect("get").map(|e| e.value),
        Some(b"small".to_vec())
    );
    assert!(
        store
            .read_after(&key("log"), 0, 10)
            .await
            .expect("read")
            .is_empty(),
        "a refused append wrote nothing, not even its small record"
    );
}

#[tokio::test]
async fn throttling_is_retried_then_a_typed_error_that_changed_nothing() {
    let Some(url) = moto_url() else { return };
    let table = fresh_store(&url, "throttle").await.table().to_owned();
    let proxy = Proxy::start(&url).await;
    let store = DynamoStore::builder(&table)
        .client(client(&proxy.url))
        .retry(3, Duration::from_millis(1))
        .build()
        .await
        .expect("open through the proxy");
    store
        .put(&key("k"), b"before".to_vec(), PutOptions::default())
        .await
        .expect("put");
    // A short burst: retried with backoff, and the write lands.
    proxy.throttle("UpdateItem", 2);
    store
        .put(&key("k"), b"after burst".to_vec(), PutOptions::default())
        .await
        .expect("retried through a short burst");
    assert_eq!(proxy.throttled(), 2);
    // A storm: every attempt throttled, then a typed error saying what to do.
    proxy.throttle("UpdateItem", 1000);
    let err = store
        .put(&key("k"), b"lost".to_vec(), PutOptions::default())
        .await
        .expect_err("storm");
    assert_eq!(proxy.throttled(), 3, "three attempts in all");
    let throttled = Throttled::find(&err).unwrap_or_else(|| panic!("not throttled: {err:?}"));
    assert_eq!(throttled.operation(), "UpdateItem");
    assert_eq!(throttled.code(), "ThrottlingException");
    assert!(err.to_string().contains("on-demand"), "{err}");
    proxy.throttle("TransactWriteItems", 1000);
    let err = store
        .append(&key("log"), vec![b"x".to_vec()], None)
        .await
        .expect_err("append in a storm");
    assert!(Throttled::find(&err).is_some(), "{err:?}");
    proxy.throttle("", 0);
    let direct = builder(&url, &table).build().await.expect("open directly");
    assert_eq!(
        direct.get(&key("k")).await.expect("get").map(|e| e.value),
        Some(b"after burst".to_vec()),
        "the throttled write changed nothing"
    );
    assert!(
        direct
            .read_after(&key("log"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test]
async fn ttl_goes_to_dynamodbs_attribute_and_reads_filter_it() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "ttl").await;
    let before = mcp_persist_core::kit::now();
    store
        .put(
            &key("short"),
            b"v".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Duration::from_millis(300)),
        )
        .await
        .expect("put");
    let item = raw_item(&store, "kshort").await.expect("item");
    let ttl = number(&item, "ttl").expect("DynamoDB's TTL attribute");
    let expires = number(&item, "x").expect("expiry in ms");
    assert!(expires >= before.as_unix_millis() + 300);
    // Seconds, rounded up, plus the sweep margin for a writer's clock behind AWS's.
    assert_eq!(ttl, expires.div_ceil(1000) + 60);
    // A write without a TTL removes both.
    store
        .put(&key("kept"), b"v".to_vec(), PutOptions::default())
        .await
        .expect("put");
    assert!(number(&raw_item(&store, "kkept").await.expect("item"), "ttl").is_none());
    tokio::time::sleep(Duration::from_millis(400)).await;
    // moto never deletes expired items (DynamoDB does so lazily): the item is
    // still there, and reads filter it.
    assert!(raw_item(&store, "kshort").await.is_some());
    assert_eq!(store.get(&key("short")).await.expect("get"), None);
    assert!(
        store
            .list("")
            .await
            .expect("list")
            .iter()
            .all(|k| k.as_str() != "short")
    );
    // Deleted: a tombstone keeps the version for a day, then DynamoDB's TTL
    // removes it.
    let v1 = store
        .put(&key("gone"), b"v".to_vec(), PutOptions::default())
        .await
        .expect("put");
    assert!(store.delete(&key("gone"), Some(v1)).await.expect("delete"));
    let tombstone = raw_item(&store, "kgone").await.expect("tombstone");
    assert!(!tombstone.contains_key("d"));
    assert_eq!(number(&tombstone, "v"), Some(v1.get()));
    let v2 = store
        .put(
            &key("gone"),
            b"again".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("recreate");
    assert!(v2 > v1);
}

#[tokio::test]
async fn appends_are_group_committed_and_big_ones_split_within_limits() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "group").await;
    let log = key("events");
    // 40 appends at once from one store: far fewer transactions.
    let before = store.requests();
    let mut calls = Vec::new();
    for i in 0..40u32 {
        let store = store.clone();
        let log = log.clone();
        calls.push(tokio::spawn(async move {
            store
                .append(&log, vec![i.to_be_bytes().to_vec()], None)
                .await
        }));
    }
    let mut seqs = Vec::new();
    for call in calls {
        seqs.extend(call.await.expect("task").expect("append"));
    }
    let spent = store.requests().since(&before);
    assert!(
        spent.transact_write_items < 40,
        "40 concurrent appends took {} transactions",
        spent.transact_write_items
    );
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    // One append of 250 records: over one transaction's 100 items, so three
    // consecutive transactions, contiguous.
    let before = store.requests();
    let big: Vec<Vec<u8>> = (0..250u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let seqs = store.append(&log, big.clone(), None).await.expect("append");
    assert_eq!(seqs, (41..=290).collect::<Vec<_>>());
    assert_eq!(store.requests().since(&before).transact_write_items, 3);
    let read = store.read_after(&log, 40, 1000).await.expect("read");
    assert_eq!(read.into_iter().map(|r| r.data).collect::<Vec<_>>(), big);
}

/// `dynamodb://` through the registry, in a child process whose environment
/// holds the (fake) AWS credentials: the default credential chain reads
/// them, as a Lambda function's does.
#[test]
fn store_urls_open_through_the_registry() {
    const CHILD: &str = "MCP_PERSIST_DYNAMODB_OPENER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let url = std::env::var(common::URL_VAR).expect("moto");
        let table = std::env::var(CHILD).expect("table");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(opener_child(&url, &table));
        return;
    }
    let Some(url) = moto_url() else { return };
    let status = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "store_urls_open_through_the_registry",
            "--nocapture",
        ])
        .env(CHILD, unique_table("url"))
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_PROFILE")
        .env(common::URL_VAR, &url)
        .status()
        .expect("run the child");
    assert!(status.success(), "the child failed: {status}");
}

async fn opener_child(moto: &str, table: &str) {
    let registry = Registry::new().with(DynamoOpener);
    let base = format!("dynamodb://{table}?region=us-east-1&endpoint={moto}");
    // Only reading: missing is NotFound("store"), and `create=1` creates
    // nothing, asked twice in both modes that need a store.
    for options in [
        OpenOptions::existing(),
        OpenOptions::read_only(),
        OpenOptions::existing(),
        OpenOptions::read_only(),
    ] {
        let err = registry
            .open(&format!("{base}&create=1"), options)
            .await
            .expect_err("missing");
        assert!(
            matches!(err, Error::NotFound { what: "store", .. }),
            "{options:?}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("not a store") && text.contains(table),
            "{options:?}: {text}"
        );
    }
    let err = registry
        .open(&base, OpenOptions::default())
        .await
        .expect_err("missing");
    assert!(err.to_string().contains("create=1"), "{err}");
    let opened = registry
        .open(
            &format!("{base}&create=1&poll_ms=10"),
            OpenOptions::default(),
        )
        .await
        .expect("create and open");
    assert_eq!(opened.kv.backend_name(), "dynamodb");
    opened
        .kv
        .put(&key("a"), b"1".to_vec(), PutOptions::default())
        .await
        .expect("put");
    let again = registry
        .open(&base, OpenOptions::existing())
        .await
        .expect("reopen");
    assert_eq!(
        again.kv.get(&key("a")).await.expect("get").map(|e| e.value),
        Some(b"1".to_vec())
    );
    let log = again.log.expect("a log half");
    log.append(&key("l"), vec![b"x".to_vec()], None)
        .await
        .expect("append");
    // The modes every backend's opener keeps, on a table of their own:
    // only `create=1` under `Create` makes one.
    let other = format!("dynamodb://{table}-modes?region=us-east-1&endpoint={moto}");
    mcp_persist_core::conformance::opener::open_modes(
        DynamoOpener,
        &other,
        &format!("{other}&create=1"),
        mcp_persist_core::conformance::opener::Absent::NotAStore,
    )
    .await;
}

/// A conditional write whose answer is lost, retried by the SDK, finds its
/// own write there: a success, never a `Conflict` or `AlreadyExists`, and
/// never applied twice.
#[tokio::test]
async fn a_write_whose_answer_was_lost_is_recognised_not_repeated() {
    let Some(url) = moto_url() else { return };
    let table = fresh_store(&url, "lost").await.table().to_owned();
    let proxy = Proxy::start(&url).await;
    let store = DynamoStore::builder(&table)
        .client(client(&proxy.url))
        .retry(3, Duration::from_millis(1))
        .build()
        .await
        .expect("open through the proxy");
    proxy.lose_answers("UpdateItem", 1);
    let created = store
        .put(&key("k"), b"1".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("a create whose first answer was lost");
    assert_eq!(proxy.count("UpdateItem"), 2, "the SDK tried again");
    proxy.lose_answers("UpdateItem", 1);
    let updated = store
        .put(
            &key("k"),
            b"2".to_vec(),
            PutOptions::new(PutMode::Update(created)),
        )
        .await
        .expect("a compare-and-swap whose first answer was lost");
    assert!(updated > created);
    let entry = store.get(&key("k")).await.expect("get").expect("there");
    assert_eq!((entry.value, entry.version), (b"2".to_vec(), updated));
    proxy.lose_answers("TransactWriteItems", 1);
    let seqs = store
        .append(&key("log"), vec![b"once".to_vec()], None)
        .await
        .expect("an append whose first answer was lost");
    assert_eq!(seqs, vec![1]);
    let next = store
        .append(&key("log"), vec![b"next".to_vec()], None)
        .await
        .expect("append");
    assert_eq!(next, vec![2]);
    let read = store.read_after(&key("log"), 0, 10).await.expect("read");
    assert_eq!(
        read.into_iter().map(|r| r.data).collect::<Vec<_>>(),
        vec![b"once".to_vec(), b"next".to_vec()],
        "the retried append is stored once"
    );
}

/// The sweep removes what expired longer ago than its margin (key-value
/// records and whole logs, records included) and keeps everything live.
#[tokio::test]
async fn sweep_removes_expired_records_and_logs_and_keeps_live_ones() {
    let Some(url) = moto_url() else { return };
    let table = fresh_store(&url, "sweep").await.table().to_owned();
    let store = builder(&url, &table)
        .sweep_margin(Duration::ZERO)
        .build()
        .await
        .expect("open");
    let short = Some(Duration::from_millis(200));
    store
        .put(
            &key("old"),
            b"x".to_vec(),
            PutOptions::default().with_ttl(short),
        )
        .await
        .expect("put");
    store
        .put(&key("live"), b"y".to_vec(), PutOptions::default())
        .await
        .expect("put");
    store
        .append(&key("old-log"), vec![b"a".to_vec(), b"b".to_vec()], short)
        .await
        .expect("append");
    store
        .append(
            &key("live-log"),
            vec![b"c".to_vec()],
            Some(Duration::from_secs(600)),
        )
        .await
        .expect("append");
    let seqs = store
        .append(
            &key("trimmed"),
            vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()],
            None,
        )
        .await
        .expect("append");
    assert_eq!(store.trim(&key("trimmed"), seqs[2]).await.expect("trim"), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let items = |store: &DynamoStore| {
        let client = store.client().clone();
        let table = store.table().to_owned();
        async move {
            client
                .scan()
                .table_name(table)
                .consistent_read(true)
                .send()
                .await
                .expect("scan")
                .count()
        }
    };
    // old, live; old-log's head and 2 records; live-log's head and record;
    // trimmed's head and the 1 record left.
    assert_eq!(items(&store).await, 9);
    // The old record and the old log's head and two records.
    assert_eq!(store.sweep_expired().await.expect("sweep"), 4);
    assert_eq!(items(&store).await, 5);
    assert_eq!(
        store.get(&key("live")).await.expect("get").map(|e| e.value),
        Some(b"y".to_vec())
    );
    assert_eq!(
        store
            .read_after(&key("live-log"), 0, 10)
            .await
            .expect("read")
            .len(),
        1
    );
    assert_eq!(
        store
            .read_after(&key("trimmed"), 0, 10)
            .await
            .expect("read")[0]
            .data,
        b"3".to_vec()
    );
    // A margin keeps what expired more recently than it.
    let careful = builder(&url, &table).build().await.expect("open");
    careful
        .put(
            &key("recent"),
            b"z".to_vec(),
            PutOptions::default().with_ttl(Duration::from_millis(1)),
        )
        .await
        .expect("put");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(careful.sweep_expired().await.expect("sweep"), 0);
}

fn assert_corrupt(err: &Error, name: &str) {
    assert!(
        matches!(err, Error::Corrupt { key, .. } if key == name),
        "want Corrupt naming {name:?}, got {err:?}"
    );
}

/// Sets attribute `name` of the head item of log `log` behind the store's
/// back.
async fn plant_head(store: &DynamoStore, log: &str, name: &str, value: AttributeValue) {
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(format!("l{log}")))
        .key("sk", AttributeValue::N("0".into()))
        .update_expression("SET #a = :v")
        .expression_attribute_names("#a", name)
        .expression_attribute_values(":v", value)
        .send()
        .await
        .expect("plant");
}

/// A log head changed outside the store (a number no append can go on
/// from, a number of the wrong type or sign, a floor above the last
/// number) is `Corrupt` naming the log, for `next_seq` and for an append
/// alike; asking changes nothing, and other logs go on.
#[tokio::test]
async fn a_damaged_log_head_is_corrupt_for_next_seq_and_append_alike() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "head").await;
    let damage = [
        ("full", "s", AttributeValue::N(u64::MAX.to_string())),
        ("negative", "s", AttributeValue::N("-5".into())),
        ("fraction", "s", AttributeValue::N("2.5".into())),
        ("text", "s", AttributeValue::S("3".into())),
        ("floor", "f", AttributeValue::N("10".into())),
    ];
    for (log, _, _) in &damage {
        store
            .append(&key(log), vec![b"a".to_vec()], None)
            .await
            .expect("append");
    }
    store
        .append(&key("other"), vec![b"a".to_vec()], None)
        .await
        .expect("append");
    for (log, name, value) in &damage {
        plant_head(&store, log, name, value.clone()).await;
    }
    // A changed last number or floor fails the append of a store that
    // remembers the head from before: its transaction finds the head moved,
    // and reads the damage in the head it gives back.
    for (log, _, _) in &damage {
        let planted = raw_item(&store, &format!("l{log}")).await;
        let err = store
            .append(&key(log), vec![b"b".to_vec()], None)
            .await
            .expect_err("damaged head");
        assert_corrupt(&err, log);
        assert_eq!(
            raw_item(&store, &format!("l{log}")).await,
            planted,
            "{log}: the head changed"
        );
    }
    // A store that never saw the heads, then the one that did.
    let fresh = builder(&url, store.table()).build().await.expect("open");
    for (log, _, _) in &damage {
        let planted = raw_item(&store, &format!("l{log}")).await;
        for s in [&fresh, &store] {
            for _ in 0..2 {
                let err = s.next_seq(&key(log)).await.expect_err("damaged head");
                assert_corrupt(&err, log);
            }
            let err = s
                .append(&key(log), vec![b"b".to_vec()], None)
                .await
                .expect_err("damaged head");
            assert_corrupt(&err, log);
        }
        assert_eq!(
            raw_item(&store, &format!("l{log}")).await,
            planted,
            "{log}: the head changed"
        );
    }
    assert_eq!(
        store.next_seq(&key("other")).await.expect("next_seq"),
        Some(2)
    );
    assert_eq!(
        fresh
            .append(&key("other"), vec![b"b".to_vec()], None)
            .await
            .expect("an undamaged log appends"),
        vec![2]
    );
}

/// A floor moved by another process's trim (a legitimate change the
/// store's remembered head does not know) fails the next append's
/// transaction once; the append goes on from the head DynamoDB gives back,
/// with the next number, and keeps the trim's floor.
#[tokio::test]
async fn an_append_over_a_remembered_head_goes_on_after_a_foreign_trim() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "trimmed").await;
    let other = builder(&url, store.table()).build().await.expect("open");
    for record in [b"a", b"b", b"c"] {
        store
            .append(&key("log"), vec![record.to_vec()], None)
            .await
            .expect("append");
    }
    // Another process trims below 3: the floor moves to 2.
    assert_eq!(other.trim(&key("log"), 3).await.expect("trim"), 2);
    for expected in [4, 5] {
        assert_eq!(
            store
                .append(&key("log"), vec![b"d".to_vec()], None)
                .await
                .expect("append after the trim"),
            vec![expected]
        );
    }
    let read = other.read_after(&key("log"), 0, 10).await.expect("read");
    assert_eq!(
        read.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
}

/// `next_seq` reads the head item itself, not what the store remembers of
/// it: another writer's appends move it, and a head removed (as DynamoDB's
/// TTL removes a deleted log's head a day later) makes it 1 again, as the
/// next append then is. Asking writes no item.
#[tokio::test]
async fn next_seq_reads_the_head_not_what_the_store_remembers() {
    let Some(url) = moto_url() else { return };
    let store = fresh_store(&url, "nextseq").await;
    let elsewhere = builder(&url, store.table()).build().await.expect("open");
    let log = key("l");
    assert_eq!(store.next_seq(&log).await.expect("next_seq"), Some(1));
    assert_eq!(raw_item(&store, "ll").await, None, "asking wrote a head");
    assert_eq!(
        store
            .append(&log, vec![b"a".to_vec(), b"b".to_vec()], None)
            .await
            .expect("append"),
        vec![1, 2]
    );
    elsewhere
        .append(&log, vec![b"c".to_vec()], None)
        .await
        .expect("append");
    assert_eq!(store.next_seq(&log).await.expect("next_seq"), Some(4));
    store.delete_log(&log).await.expect("delete");
    assert_eq!(elsewhere.next_seq(&log).await.expect("next_seq"), Some(4));
    // `elsewhere` remembers the deleted head; the head goes.
    store
        .client()
        .delete_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S("ll".into()))
        .key("sk", AttributeValue::N("0".into()))
        .send()
        .await
        .expect("remove the head");
    assert_eq!(store.next_seq(&log).await.expect("next_seq"), Some(1));
    assert_eq!(
        elsewhere
            .append(&log, vec![b"d".to_vec()], None)
            .await
            .expect("append"),
        vec![1]
    );
}
