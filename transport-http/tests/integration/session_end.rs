//! A session that ends is gone on every instance at once, with the default
//! settings: ended by a `DELETE` on one instance while another holds it in
//! memory, or by its idle TTL. Two server processes on one SQLite file
//! (restarted, to check that nothing brings the session back), and two
//! in-process servers on one memory store. The opt-out
//! (`strict_sessions(false)`) keeps the documented window.

use std::time::Duration;

use crate::support::{Instance, raw_initialize, raw_post};
use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, SessionId, Stores};

fn list() -> serde_json::Value {
    serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
}

/// Two instances on one store, and a way to look at the store.
struct Fleet {
    a: Instance,
    b: Instance,
    stores: Stores,
    /// For processes: the arguments to start them again.
    args: Option<Vec<String>>,
    _dir: Option<tempfile::TempDir>,
}

impl Fleet {
    async fn memory(args: &[&str]) -> anyhow::Result<Fleet> {
        let stores = Stores::new(MemoryStore::new());
        Ok(Fleet {
            a: Instance::in_process(stores.clone(), args).await?,
            b: Instance::in_process(stores.clone(), args).await?,
            stores,
            args: None,
            _dir: None,
        })
    }

    async fn sqlite(args: &[&str]) -> anyhow::Result<Fleet> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("state.db");
        let mut all: Vec<String> = vec![
            "--backend".into(),
            "sqlite".into(),
            "--store".into(),
            db.display().to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        Ok(Fleet {
            a: Instance::process(&refs).await?,
            b: Instance::process(&refs).await?,
            stores: Stores::new(mcp_persist_store_sqlite::SqliteStore::open(&db).await?),
            args: Some(all),
            _dir: Some(dir),
        })
    }

    /// Kills both processes with SIGKILL and starts them again (memory
    /// instances would lose the store: they are left as they are).
    async fn restart(&mut self) -> anyhow::Result<()> {
        let Some(args) = &self.args else {
            return Ok(());
        };
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.a.kill().await?;
        self.b.kill().await?;
        self.a = Instance::process(&refs).await?;
        self.b = Instance::process(&refs).await?;
        Ok(())
    }

    /// Whether the store still holds `session` (read without touching it).
    async fn stored(&self, session: &str) -> anyhow::Result<bool> {
        Ok(self
            .stores
            .sessions(Duration::from_secs(3600))
            .load(&SessionId::new(session)?)
            .await?
            .is_some())
    }
}

async fn delete(http: &reqwest::Client, url: &str, session: &str) -> anyhow::Result<u16> {
    Ok(http
        .delete(url)
        .header("x-demo-user", "alice")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await?
        .status()
        .as_u16())
}

/// Initializes on A and makes B hold the session: B restores it, and a
/// second request there has touched it, so B would not write it again for a
/// tenth of the idle TTL.
async fn held_on_both(http: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<String> {
    let session = raw_initialize(http, &fleet.a.url(), "alice").await?;
    for url in [fleet.b.url(), fleet.b.url(), fleet.a.url()] {
        let (status, body) = raw_post(http, &url, "alice", &session, list()).await?;
        anyhow::ensure!(status == 200, "{url}: {status} {body}");
    }
    Ok(session)
}

/// Every request naming the session gets 404 on both instances.
async fn gone_everywhere(
    http: &reqwest::Client,
    fleet: &Fleet,
    session: &str,
    what: &str,
) -> anyhow::Result<()> {
    for (name, url) in [("B", fleet.b.url()), ("A", fleet.a.url())] {
        let (status, body) = raw_post(http, &url, "alice", session, list()).await?;
        assert_eq!(
            status, 404,
            "{what}: {name} still serves the session: {body}"
        );
    }
    Ok(())
}

async fn deleted_scenario(mut fleet: Fleet) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let session = held_on_both(&http, &fleet).await?;
    assert_eq!(delete(&http, &fleet.a.url(), &session).await?, 204);
    gone_everywhere(&http, &fleet, &session, "after DELETE on A").await?;
    assert_eq!(
        delete(&http, &fleet.b.url(), &session).await?,
        404,
        "nothing left to end on B"
    );
    assert!(!fleet.stored(&session).await?);
    // The second run: nothing brings the session back.
    fleet.restart().await?;
    gone_everywhere(&http, &fleet, &session, "after DELETE, restarted").await?;
    fleet.restart().await?;
    gone_everywhere(&http, &fleet, &session, "after DELETE, restarted twice").await
}

async fn idle_scenario(mut fleet: Fleet) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let session = held_on_both(&http, &fleet).await?;
    // Nobody uses it: wait until the store lets it expire.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while fleet.stored(&session).await? {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the session never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gone_everywhere(&http, &fleet, &session, "after the idle TTL").await?;
    fleet.restart().await?;
    gone_everywhere(&http, &fleet, &session, "after the idle TTL, restarted").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_deleted_session_is_gone_on_every_instance_at_once() -> anyhow::Result<()> {
    deleted_scenario(Fleet::sqlite(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_deleted_session_is_gone_on_every_instance_at_once() -> anyhow::Result<()> {
    deleted_scenario(Fleet::memory(&[]).await?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_idle_session_is_gone_on_every_instance() -> anyhow::Result<()> {
    idle_scenario(Fleet::sqlite(&["--idle-ttl-ms", "1500"]).await?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_idle_session_is_gone_on_every_instance() -> anyhow::Result<()> {
    idle_scenario(Fleet::memory(&["--idle-ttl-ms", "1500"]).await?).await
}

/// With the opt-out, an instance that touched the session recently serves
/// it until its next coalesced touch: the window the option accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_sessions_keep_the_documented_window() -> anyhow::Result<()> {
    let fleet = Fleet::memory(&["--coalesced-sessions"]).await?;
    let http = reqwest::Client::new();
    let session = held_on_both(&http, &fleet).await?;
    assert_eq!(delete(&http, &fleet.a.url(), &session).await?, 204);
    let (status, body) = raw_post(&http, &fleet.b.url(), "alice", &session, list()).await?;
    assert_eq!(
        status, 200,
        "B serves the session until its next coalesced touch: {body}"
    );
    let (status, _) = raw_post(&http, &fleet.a.url(), "alice", &session, list())
        .await
        .context("A")?;
    assert_eq!(status, 404, "the instance that ended it knows at once");
    Ok(())
}
