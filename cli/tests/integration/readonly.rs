//! The commands that only read (`ls`, `show`, `stats`, `check`) never
//! write: on a real store of every backend the folder tree (names, sizes,
//! modes, modification times) or the keys are the same after each of them,
//! and on anything that is not a store (a folder of other files, an empty
//! or foreign file, a missing path, the wrong scheme) they refuse and leave
//! it exactly as it was.

use std::{collections::BTreeMap, path::Path};

use crate::support::*;
use mcp_persist_core::KvStore;

/// Every read-only command on `store`, with a record `key` and a `log` to
/// show, in table and JSON form.
fn read_only_commands(store: &str, key: &str, log: &str) -> Vec<Vec<String>> {
    let mut runs: Vec<Vec<&str>> = Vec::new();
    for kind in [
        "sessions",
        "events",
        "clients",
        "credentials",
        "tasks",
        "keys",
    ] {
        runs.push(vec!["ls", store, kind]);
        runs.push(vec!["--json", "ls", store, kind]);
    }
    let missing = session_key("no-such-session");
    runs.extend([
        vec!["stats", store],
        vec!["--json", "stats", store],
        vec!["check", store],
        vec!["--json", "check", store],
        vec!["show", store, key],
        vec!["--json", "show", store, log],
        vec!["show", store, &missing],
    ]);
    runs.into_iter()
        .map(|r| r.into_iter().map(str::to_owned).collect())
        .collect()
}

fn run(args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cli(&args)
}

/// How a test takes a snapshot of a folder tree.
type Snapshot = fn(&Path) -> BTreeMap<String, TreeEntry>;

/// A snapshot of the folder `root` holding SQLite databases. SQLite opens
/// a `-wal` and a `-shm` file beside a database for every reader, read-only
/// connections included, and removes them when the last connection closes:
/// the folder's own modification time moves with that, and is left out.
/// Every file in it, and its mode, must be as it was.
fn sqlite_tree(root: &Path) -> BTreeMap<String, TreeEntry> {
    let mut snapshot = tree(root);
    if let Some(folder) = snapshot.get_mut("") {
        folder.modified = std::time::SystemTime::UNIX_EPOCH;
    }
    snapshot
}

/// Runs every read-only command on `store` and asserts that the tree under
/// `root` is the same after each.
fn assert_reads_leave_tree_alone(
    root: &Path,
    snapshot: Snapshot,
    store: &str,
    key: &str,
    log: &str,
) {
    let before = snapshot(root);
    for args in read_only_commands(store, key, log) {
        let out = run(&args);
        assert!(
            matches!(out.status.code(), Some(0 | 6)),
            "{args:?}: {:?}\n{}{}",
            out.status.code(),
            stdout(&out),
            stderr(&out)
        );
        let diff = tree_diff(&before, &snapshot(root));
        assert!(
            diff.is_empty(),
            "`mcp-persist {}` wrote to the store:\n{}",
            args.join(" "),
            diff.join("\n")
        );
    }
}

async fn real_store_scenario(scheme: &str) -> anyhow::Result<()> {
    let filled_dir = tempfile::tempdir()?;
    let mut filled = fill(filled_dir.path(), scheme).await?;
    // The stores at rest, as an operator finds them: the SQLite databases
    // the peers filled are still open in this process, so they are copied
    // (by `copy`, which closes what it writes) into a folder of their own.
    let dir = tempfile::tempdir()?;
    let (snapshot, stores): (Snapshot, _) = match scheme {
        "sqlite" => {
            let server = format!("sqlite:{}", dir.path().join("server.db").display());
            let client = format!("sqlite:{}", dir.path().join("client.db").display());
            cli_expect(&["copy", &filled.server_store, &server], 0);
            cli_expect(&["copy", &filled.client_store, &client], 0);
            (sqlite_tree, (server, client))
        }
        _ => {
            let server = format!("file:{}", dir.path().join("server").display());
            let client = format!("file:{}", dir.path().join("client").display());
            for (from, to) in [
                (filled_dir.path().join("server"), dir.path().join("server")),
                (filled_dir.path().join("client"), dir.path().join("client")),
            ] {
                let copied = std::process::Command::new("cp")
                    .arg("-a")
                    .arg(&from)
                    .arg(&to)
                    .status()?;
                assert!(copied.success());
            }
            (tree, (server, client))
        }
    };
    (filled.server_store, filled.client_store) = stores;
    sqlite_at_rest(dir.path()).await;
    let (key, log) = filled.session_and_log();
    for store in [&filled.server_store, &filled.client_store] {
        assert_reads_leave_tree_alone(dir.path(), snapshot, store, &key, &log);
    }
    // The other scheme on the same path: refused, nothing changed.
    let before = tree(dir.path());
    for store in [&filled.server_store, &filled.client_store] {
        let path = store.split_once(':').expect("scheme:path").1;
        let other = match scheme {
            "sqlite" => format!("file:{path}"),
            _ => format!("sqlite:{path}"),
        };
        for args in read_only_commands(&other, &key, &log) {
            let out = run(&args);
            assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("not a store"),
                "{args:?}: {}",
                stderr(&out)
            );
        }
        let diff = tree_diff(&before, &tree(dir.path()));
        assert!(diff.is_empty(), "{other} was written:\n{}", diff.join("\n"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_leave_a_file_store_as_it_was() -> anyhow::Result<()> {
    real_store_scenario("file").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_leave_a_sqlite_store_as_it_was() -> anyhow::Result<()> {
    real_store_scenario("sqlite").await
}

/// A SQLite database of another application: a valid header with an
/// `application_id` that is not mcp-persist's, one page long.
fn foreign_sqlite(path: &Path) {
    let mut page = vec![0u8; 4096];
    page[..16].copy_from_slice(b"SQLite format 3\0");
    page[16..18].copy_from_slice(&4096u16.to_be_bytes());
    page[18] = 1;
    page[19] = 1;
    page[21] = 64;
    page[22] = 32;
    page[23] = 32;
    page[28..32].copy_from_slice(&1u32.to_be_bytes());
    page[44..48].copy_from_slice(&4u32.to_be_bytes());
    page[68..72].copy_from_slice(&0x4750_4b47u32.to_be_bytes());
    page[100] = 0x0d;
    page[105..107].copy_from_slice(&4096u16.to_be_bytes());
    std::fs::write(path, page).expect("written");
}

#[test]
fn read_only_commands_refuse_what_is_not_a_store_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir(root.join("notes")).expect("mkdir");
    std::fs::write(root.join("notes/todo.txt"), "buy milk\n").expect("write");
    std::fs::create_dir(root.join("empty-dir")).expect("mkdir");
    std::fs::write(root.join("plain.txt"), "hello\n").expect("write");
    std::fs::write(root.join("empty.db"), "").expect("write");
    foreign_sqlite(&root.join("foreign.db"));
    let at = |p: &str| root.join(p).display().to_string();

    // (store URL, exit code, what the message must say)
    let cases = [
        (format!("file:{}", at("notes")), 3, "not a store"),
        (format!("file:{}", at("empty-dir")), 3, "not a store"),
        (format!("file:{}", at("plain.txt")), 3, "not a store"),
        (format!("file:{}", at("empty.db")), 3, "not a store"),
        (format!("file:{}", at("missing")), 3, "nothing was created"),
        (
            format!("file:{}", at("missing/deeper")),
            3,
            "nothing was created",
        ),
        (format!("sqlite:{}", at("empty.db")), 3, "not a store"),
        (format!("sqlite:{}", at("plain.txt")), 3, "not a store"),
        (format!("sqlite:{}", at("foreign.db")), 3, "not a store"),
        (format!("sqlite:{}", at("notes")), 3, "not a store"),
        (
            format!("sqlite:{}", at("missing.db")),
            3,
            "nothing was created",
        ),
        (
            format!("sqlite:{}", at("missing/deeper.db")),
            3,
            "nothing was created",
        ),
        (
            format!("nosuch://{}", at("notes")),
            2,
            "no backend for `nosuch:`",
        ),
        (at("notes"), 2, "not a store URL"),
    ];
    let before = tree(root);
    for (store, code, says) in &cases {
        for args in read_only_commands(store, &session_key("x"), &events_log("x")) {
            let out = run(&args);
            assert_eq!(
                out.status.code(),
                Some(*code),
                "{args:?}\n{}{}",
                stdout(&out),
                stderr(&out)
            );
            assert!(
                stderr(&out).contains(says),
                "{args:?} should say {says:?}: {}",
                stderr(&out)
            );
            let diff = tree_diff(&before, &tree(root));
            assert!(
                diff.is_empty(),
                "`mcp-persist {}` changed the folder:\n{}",
                args.join(" "),
                diff.join("\n")
            );
        }
    }
}

/// Every key under `pattern` with its serialized value (`DUMP`).
async fn redis_keys(url: &str, pattern: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut con)
        .await?;
    let mut out = BTreeMap::new();
    for key in keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query_async(&mut con).await?;
        out.insert(key, dump);
    }
    Ok(out)
}

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("cli-{what}-{}-{nanos}:", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_write_no_redis_key() -> anyhow::Result<()> {
    let Some(redis) = service_var(REDIS_VAR) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let prefix = unique("readonly");
    let url = format!("{}?prefix={prefix}", redis.trim_end_matches('/'));
    cli_expect(&["copy", &filled.server_store, &url], 0);
    let (key, log) = filled.session_and_log();
    let empty_prefix = unique("readonly-empty");
    let empty = format!("{}?prefix={empty_prefix}", redis.trim_end_matches('/'));
    for (store, prefix) in [(&url, &prefix), (&empty, &empty_prefix)] {
        let pattern = format!("{prefix}*");
        let before = redis_keys(&redis, &pattern).await?;
        each_leaves_alone(store, &key, &log, &before, || redis_keys(&redis, &pattern)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_write_no_secret() -> anyhow::Result<()> {
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let prefix = unique("readonly").replace(':', "/");
    let rest = dir.path().join("rest");
    std::fs::create_dir(&rest)?;
    let split = format!(
        "credentials=secretsmanager://us-east-1?prefix={prefix}&endpoint={moto};rest=sqlite:{}",
        rest.join("rest.db").display()
    );
    cli_expect(&["copy", &filled.client_store, &split], 0);
    sqlite_at_rest(&rest).await;
    let secrets = mcp_persist_store_vault::SecretsManagerStore::builder(prefix.clone())
        .client(secrets_client(&moto))
        .build()
        .await?;
    let snapshot = || async {
        let mut out = BTreeMap::new();
        for key in secrets.list("").await? {
            let entry = secrets.get(&key).await?;
            out.insert(key, entry.map(|e| (e.version.get(), e.value)));
        }
        anyhow::Ok(out)
    };
    let before = snapshot().await?;
    assert!(!before.is_empty(), "the credentials were copied");
    let tree_before = sqlite_tree(&rest);
    for args in read_only_commands(
        &split,
        mcp_persist_core::declare::CREDENTIALS
            .key(&["x", "y"])
            .as_ref(),
        &events_log("x"),
    ) {
        let out = run(&args);
        assert!(
            matches!(out.status.code(), Some(0 | 6)),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(before, snapshot().await?, "{args:?} wrote a secret");
        let diff = tree_diff(&tree_before, &sqlite_tree(&rest));
        assert!(diff.is_empty(), "{args:?}:\n{}", diff.join("\n"));
    }
    Ok(())
}

/// A schema name no other run uses, starting with `what` (a valid Postgres
/// schema name), and the store URL `base` with it.
fn postgres_schema_url(base: &str, what: &str) -> anyhow::Result<(String, String)> {
    let digits: String = unique("pg")
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(char::from)
        .collect();
    let schema = format!("{what}_{digits}");
    let mut url = url::Url::parse(base)?;
    url.query_pairs_mut().append_pair("schema", &schema);
    Ok((schema, url.to_string()))
}

/// Every row of the store in Postgres schema `schema` (each table's rows as
/// text, sorted) and its sequences' positions.
async fn postgres_rows(url: &str, schema: &str) -> anyhow::Result<Vec<String>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    let mut out = Vec::new();
    for table in ["meta", "kv", "logs", "log_records"] {
        for row in client
            .query(
                &format!("SELECT t::text FROM \"{schema}\".{table} t ORDER BY 1"),
                &[],
            )
            .await?
        {
            out.push(format!("{table}: {}", row.get::<_, String>(0)));
        }
    }
    for sequence in ["kv_version", "log_id"] {
        let row = client
            .query_one(
                &format!("SELECT last_value::text FROM \"{schema}\".{sequence}"),
                &[],
            )
            .await?;
        out.push(format!("{sequence}: {}", row.get::<_, String>(0)));
    }
    drop(client);
    task.abort();
    Ok(out)
}

/// A filled Postgres store: every read-only command (those that find
/// nothing to show included) leaves every row and sequence as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_write_no_postgres_row() -> anyhow::Result<()> {
    let Some(base) = service_var("MCP_PERSIST_POSTGRES_URL") else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let (schema, store) = postgres_schema_url(&base, "readonly_rows")?;
    cli_expect(&["copy", &filled.server_store, &store], 0);
    let (key, log) = filled.session_and_log();
    let before = postgres_rows(&base, &schema).await?;
    assert!(
        before.iter().any(|r| r.starts_with("log_records: ")),
        "the copy put events in the store"
    );
    each_leaves_alone(&store, &key, &log, &before, || {
        postgres_rows(&base, &schema)
    })
    .await?;
    Ok(())
}

/// Every read-only command on `store`, which holds the record `key` and the
/// log `log`: each succeeds or finds nothing (exit 0 or 6), and `snapshot`
/// of the store's raw contents is `before` after each. A failing command is
/// printed without the URL, which may hold a password.
async fn each_leaves_alone<T, F, Fut>(
    store: &str,
    key: &str,
    log: &str,
    before: &T,
    snapshot: F,
) -> anyhow::Result<()>
where
    T: PartialEq + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    for args in read_only_commands(store, key, log) {
        let out = run(&args);
        let command: Vec<&String> = args.iter().filter(|a| *a != store).collect();
        assert!(
            matches!(out.status.code(), Some(0 | 6)),
            "{command:?}: {}",
            stderr(&out)
        );
        assert_eq!(before, &snapshot().await?, "{command:?} changed the store");
    }
    Ok(())
}

/// Every read-only command on `store`, a URL where no store is, twice
/// over: refused as not a store (exit 3). A failing command is printed
/// without the URL, which may hold a password.
fn each_refused_as_not_a_store(store: &str) {
    for _ in 0..2 {
        for args in read_only_commands(store, &session_key("x"), &events_log("x")) {
            let out = run(&args);
            let command: Vec<&String> = args.iter().filter(|a| *a != store).collect();
            assert_eq!(
                out.status.code(),
                Some(3),
                "{command:?}\n{}{}",
                stdout(&out),
                stderr(&out)
            );
            assert!(
                stderr(&out).contains("not a store"),
                "{command:?}: {}",
                stderr(&out)
            );
        }
    }
}

/// A Postgres URL whose schema holds no store: every read-only command is
/// refused as not a store (exit 3), twice over, and creates nothing (the
/// schema of a mistyped name used to be created, tables and all, and
/// listed as an empty store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_create_no_postgres_schema() -> anyhow::Result<()> {
    use mcp_persist_core::registry::OpenMode;
    use mcp_persist_store_postgres::PostgresStore;
    let Some(base) = service_var("MCP_PERSIST_POSTGRES_URL") else {
        return Ok(());
    };
    let (schema, store) = postgres_schema_url(&base, "readonly")?;
    each_refused_as_not_a_store(&store);
    // No store was made: one that exists would open here.
    let err = PostgresStore::builder(&base)
        .schema(&schema)
        .open_mode(OpenMode::Existing)
        .connect()
        .await
        .expect_err("a read-only command created the store");
    assert!(
        matches!(err, mcp_persist_core::Error::NotFound { .. }),
        "{err:?}"
    );
    Ok(())
}

/// Every item of `table`, each attribute with its value, sorted.
async fn dynamodb_items(
    client: &mcp_persist::dynamodb::aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<Vec<BTreeMap<String, String>>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await?;
        for item in page.items() {
            items.push(
                item.iter()
                    .map(|(name, value)| (name.clone(), format!("{value:?}")))
                    .collect(),
            );
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    items.sort();
    Ok(items)
}

/// A filled DynamoDB table: every read-only command leaves every item as
/// it was; a table that does not exist is refused as not a store (exit 3)
/// and is not created, twice over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_write_no_dynamodb_item() -> anyhow::Result<()> {
    use mcp_persist::dynamodb::DynamoStore;
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    let client = dynamodb_client(&moto);
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let table = unique("readonly").replace([':', '_'], "-");
    DynamoStore::create_table(&client, &table).await?;
    let store = format!("dynamodb://{table}?region=us-east-1&endpoint={moto}");
    cli_expect(&["copy", &filled.server_store, &store], 0);
    let (key, log) = filled.session_and_log();
    let before = dynamodb_items(&client, &table).await?;
    assert!(before.len() > 2, "the copy put records in the table");
    each_leaves_alone(&store, &key, &log, &before, || {
        dynamodb_items(&client, &table)
    })
    .await?;

    let missing = unique("readonly-missing").replace([':', '_'], "-");
    let tables = || async {
        let listed = client.list_tables().send().await?;
        anyhow::Ok(listed.table_names().to_vec())
    };
    let tables_before = tables().await?;
    each_refused_as_not_a_store(&format!(
        "dynamodb://{missing}?region=us-east-1&endpoint={moto}"
    ));
    assert_eq!(tables_before, tables().await?, "a table was created");
    assert!(!tables().await?.contains(&missing));
    Ok(())
}
