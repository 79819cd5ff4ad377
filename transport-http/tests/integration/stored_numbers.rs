//! Numbers read from storage are checked before arithmetic: a task record
//! whose owner generation is the largest number (damage, or a crafted
//! record) is never taken over by a wrapped or panicking increment. The
//! server answers with a typed error, changes nothing, and keeps serving.
//! On SQLite and on Redis, through server processes.

use std::time::Duration;

use crate::support::{Instance, rpc_as_alice};
use anyhow::Context as _;
use mcp_persist_core::{
    ResumableOperation, Stores, TaskId, TaskOwner, TaskRecord, TaskStatus, Timestamp,
};
use serde_json::json;

/// A running resumable task of alice's, owned by an instance that never
/// existed, at the last generation there is.
fn crafted_task() -> anyhow::Result<TaskRecord> {
    Ok(TaskRecord::new(
        TaskId::new("crafted-generation")?,
        Some("alice".into()),
        TaskOwner::new("0".repeat(32), u64::MAX, Timestamp::now()),
    )
    .with_resumable(ResumableOperation::new(
        "long_job",
        json!({ "steps": 1, "step_ms": 1, "tag": "crafted" }),
    )))
}

async fn generation_at_the_limit(stores: Stores, server_args: &[&str]) -> anyhow::Result<()> {
    let tasks = stores.tasks()?;
    let record = crafted_task()?;
    let id = record.task_id.clone();
    tasks.create(&record).await?;
    let server = Instance::process(server_args).await?;
    // A server that panics while answering never answers: fail, not hang.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    // The instance decides its owner is gone once it has heartbeats a grace
    // period old; until then the task reads as running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let error = loop {
        let answer = rpc_as_alice(
            &http,
            &server.url(),
            "numbers-test",
            "tasks/get",
            json!({ "taskId": id.as_str() }),
        )
        .await?;
        if let Some(error) = answer.get("error") {
            break error.clone();
        }
        assert_eq!(answer["result"]["status"], "working", "{answer}");
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the orphaned task was never looked at: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("damaged"), "{error}");
    // Nothing changed: same owner, same generation, one run, still working.
    let stored = tasks.load(&id).await?.context("kept")?.record;
    assert_eq!(stored.owner.generation, u64::MAX);
    assert_eq!(stored.owner.instance, "0".repeat(32));
    assert_eq!(stored.runs, 1);
    assert_eq!(stored.status, TaskStatus::Working);
    // The same answer again, and the server still serves other tasks.
    let again = rpc_as_alice(
        &http,
        &server.url(),
        "numbers-test",
        "tasks/get",
        json!({ "taskId": id.as_str() }),
    )
    .await?;
    assert_eq!(again["error"], error);
    let created = rpc_as_alice(
        &http,
        &server.url(),
        "numbers-test",
        "tools/call",
        json!({ "name": "long_job", "arguments": { "steps": 1, "step_ms": 1, "tag": "ok" } }),
    )
    .await?;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_task_generation_at_the_limit_is_corrupt() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    let stores = Stores::new(mcp_persist_store_sqlite::SqliteStore::open(&db).await?);
    let db = db.display().to_string();
    generation_at_the_limit(stores, &["--backend", "sqlite", "--store", &db]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_task_generation_at_the_limit_is_corrupt() -> anyhow::Result<()> {
    let Ok(url) = std::env::var("MCP_PERSIST_REDIS_URL") else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        anyhow::ensure!(
            !ci,
            "MCP_PERSIST_REDIS_URL is not set: run the tests through `cargo xtask test`"
        );
        eprintln!("skipped: MCP_PERSIST_REDIS_URL is not set (`cargo xtask test` starts Redis)");
        return Ok(());
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let prefix = format!("numbers-test-{}-{nanos}:", std::process::id());
    let store = mcp_persist_store_redis::RedisStore::standalone(url.clone())
        .key_prefix(prefix.clone())
        .connect()
        .await?;
    generation_at_the_limit(
        Stores::new(store),
        &[
            "--backend",
            "redis",
            "--store",
            &url,
            "--redis-prefix",
            &prefix,
        ],
    )
    .await
}
