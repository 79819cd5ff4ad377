//! `copy` between backends, run as a process: servers and clients of this
//! workspace carry on from the copy; a copy killed with SIGKILL and run
//! again ends complete with nothing duplicated.

use std::{sync::Arc, time::Duration};

use crate::support::*;
use mcp_persist_core::{EventLogConfig, KvStore, LogStore, ServerSession, SessionId, Stores};
use mcp_persist_store_redis::RedisStore;

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("cli-{what}-{}-{nanos}:", std::process::id())
}

async fn redis_stores(url: &str, prefix: &str) -> anyhow::Result<Stores> {
    Ok(Stores::new(
        RedisStore::standalone(url)
            .key_prefix(prefix)
            .connect()
            .await?,
    ))
}

fn redis_url(base: &str, prefix: &str) -> String {
    format!("{}?prefix={prefix}", base.trim_end_matches('/'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_sqlite_to_redis_then_server_and_client_resume() -> anyhow::Result<()> {
    let Some(redis) = service_var(REDIS_VAR) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let server_prefix = unique("server");
    let client_prefix = unique("client");

    let summary = cli_expect(
        &[
            "copy",
            &filled.server_store,
            &redis_url(&redis, &server_prefix),
        ],
        0,
    );
    assert!(summary.contains("verified:"), "{summary}");
    assert!(summary.contains("0 refused"), "{summary}");
    let summary = cli_expect(
        &[
            "copy",
            &filled.client_store,
            &redis_url(&redis, &client_prefix),
        ],
        0,
    );
    assert!(summary.contains("verified:"), "{summary}");

    // A server instance on Redis restores the copied session and replays the
    // copied event log, with the original ids, without a new initialize.
    let server = Server::start_at(
        redis_stores(&redis, &server_prefix).await?,
        &filled.server_addr,
    )
    .await?;
    let (status, body) = raw_resume(
        &server.url,
        "alice",
        &filled.raw_session,
        &filled.raw_events[0],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let replayed: Vec<String> = event_ids(&body).into_iter().filter(|i| i != "0").collect();
    assert_eq!(
        replayed,
        filled.raw_events[1..],
        "every later event, in order, with its original id"
    );
    assert!(
        body.contains("done copied"),
        "the call's result is replayed: {body}"
    );
    let (status, body) = raw_post(
        &reqwest::Client::new(),
        &server.url,
        "alice",
        &filled.raw_session,
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .await?;
    assert_eq!(status, 200, "the copied session serves: {body}");

    // A client on Redis resumes its copied session: no initialize.
    let client_stores = redis_stores(&redis, &client_prefix).await?;
    let run = client_run(&server.url, &client_stores).await?;
    assert!(
        matches!(
            run.start,
            mcp_persist_transport_http::client::StartKind::Resumed { .. }
        ),
        "{:?}",
        run.start
    );
    assert_eq!(
        run.session_id.as_deref(),
        Some(filled.client_session.as_str())
    );
    assert_eq!(
        server.initializes(),
        0,
        "no initialize reached the new server"
    );
    assert!(
        server.restored() >= 1,
        "the sessions were restored from Redis"
    );

    // Running the copy again changes nothing and says so.
    let again = cli_expect(
        &[
            "--json",
            "copy",
            &filled.server_store,
            &redis_url(&redis, &server_prefix),
        ],
        0,
    );
    let again: serde_json::Value = serde_json::from_str(&again)?;
    assert_eq!(again["copied"], 0, "{again}");
    assert_eq!(again["log_records_appended"], 0, "{again}");
    Ok(())
}

/// A source with many sessions and one long event log.
async fn big_source(
    url: &str,
    sessions: usize,
    events: usize,
) -> anyhow::Result<(String, Vec<u64>)> {
    let stores = open_local(url).await?;
    let store = stores.sessions(Duration::from_secs(3600));
    for i in 0..sessions {
        let session = ServerSession::new(
            SessionId::new(format!("session-{i:05}"))?,
            serde_json::json!({"protocolVersion": "2025-11-25", "clientInfo": {"name": "bulk", "version": "1"}}),
            Some(format!("user-{}", i % 7)),
        );
        store.create(&session).await?;
    }
    let log = stores.events(EventLogConfig::default())?;
    let first = log
        .append("bulk-stream", None, &serde_json::json!({"n": 0}))
        .await?;
    drop(log);
    let path = url.strip_prefix("sqlite:").expect("sqlite");
    let raw = mcp_persist_store_sqlite::SqliteStore::open(path).await?;
    let mut seqs = vec![first.seq()];
    for chunk in (1..events).collect::<Vec<_>>().chunks(500) {
        let records = chunk
            .iter()
            .map(|n| {
                format!(r#"{{"kind":"event","schema":1,"record":{{"payload":{{"n":{n}}}}}}}"#)
                    .into_bytes()
            })
            .collect();
        seqs.extend(
            raw.append(
                &k(&events_log("bulk-stream")),
                records,
                Some(Duration::from_secs(3600)),
            )
            .await?,
        );
    }
    Ok((first.to_string(), seqs))
}

async fn killed_copy_resumes(
    dest: &str,
    dest_kv: Arc<dyn KvStore>,
    dest_log: Arc<dyn LogStore>,
) -> anyhow::Result<()> {
    const SESSIONS: usize = 1200;
    const EVENTS: usize = 3000;
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", dir.path().join("big.db").display());
    let (_, source_seqs) = big_source(&source, SESSIONS, EVENTS).await?;
    // An earlier run got a third of the log across before it stopped.
    let src = mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("big.db")).await?;
    let head = src
        .read_after(&k(&events_log("bulk-stream")), 0, EVENTS / 3)
        .await?;
    let seeded = dest_log
        .append(
            &k(&events_log("bulk-stream")),
            head.iter().map(|r| r.data.clone()).collect(),
            Some(Duration::from_secs(3600)),
        )
        .await?;
    assert_eq!(
        seeded,
        source_seqs[..EVENTS / 3],
        "the destination numbers from 1"
    );

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
        .args(["copy", &source, dest])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    // SIGKILL it once some of the sessions are across.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let at_kill = loop {
        let copied = dest_kv
            .list(mcp_persist_core::declare::SERVER_SESSION.prefix)
            .await
            .map(|k| k.len())
            .unwrap_or(0);
        if copied >= SESSIONS / 4 {
            child.start_kill()?;
            child.wait().await?;
            break dest_kv
                .list(mcp_persist_core::declare::SERVER_SESSION.prefix)
                .await?
                .len();
        }
        assert!(
            child.try_wait()?.is_none(),
            "the copy ended before it could be killed ({copied} sessions across)"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy made no progress"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert!(
        at_kill < SESSIONS,
        "killed half-way: {at_kill} of {SESSIONS} sessions"
    );

    let summary: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "copy", &source, dest], 0))?;
    assert_eq!(summary["verified"], true, "{summary}");
    assert!(
        summary["already_there"]
            .as_u64()
            .is_some_and(|n| n >= at_kill as u64),
        "{summary}"
    );
    assert!(
        summary["log_records_already_there"]
            .as_u64()
            .is_some_and(|n| n >= (EVENTS / 3) as u64),
        "{summary}"
    );
    assert_eq!(
        dest_kv
            .list(mcp_persist_core::declare::SERVER_SESSION.prefix)
            .await?
            .len(),
        SESSIONS
    );
    let mut got = Vec::new();
    loop {
        let after = got.last().copied().unwrap_or(0);
        let batch = dest_log
            .read_after(&k(&events_log("bulk-stream")), after, 1000)
            .await?;
        if batch.is_empty() {
            break;
        }
        got.extend(batch.iter().map(|r| r.seq));
    }
    assert_eq!(got, source_seqs, "every event once, with its source number");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_killed_with_sigkill_resumes_into_sqlite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("dest.db");
    // Created first, so the test can watch it while the copy writes.
    let store = Arc::new(mcp_persist_store_sqlite::SqliteStore::open(&path).await?);
    killed_copy_resumes(&format!("sqlite:{}", path.display()), store.clone(), store).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_killed_with_sigkill_resumes_into_redis() -> anyhow::Result<()> {
    let Some(redis) = service_var(REDIS_VAR) else {
        return Ok(());
    };
    let prefix = unique("killed");
    let store = Arc::new(
        RedisStore::standalone(redis.clone())
            .key_prefix(prefix.clone())
            .connect()
            .await?,
    );
    killed_copy_resumes(&redis_url(&redis, &prefix), store.clone(), store).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_refuses_a_diverging_log_and_keeps_newer_records() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", dir.path().join("a.db").display());
    let dest = format!("sqlite:{}", dir.path().join("b.db").display());
    let src = open_local(&source).await?;
    let dst = open_local(&dest).await?;
    let idle = Duration::from_secs(3600);
    let mut session = ServerSession::new(
        SessionId::new("shared")?,
        serde_json::json!({"clientInfo": {"name": "old", "version": "1"}}),
        None,
    );
    src.sessions(idle).save(&session).await?;
    session.last_seen = mcp_persist_core::Timestamp::now().plus(Duration::from_secs(5));
    session.initialize_params =
        serde_json::json!({"clientInfo": {"name": "newer", "version": "2"}});
    dst.sessions(idle).save(&session).await?;
    // The same stream name with other events on each side.
    src.events(EventLogConfig::default())?
        .append("s", None, &serde_json::json!({"side": "a"}))
        .await?;
    dst.events(EventLogConfig::default())?
        .append("s", None, &serde_json::json!({"side": "b"}))
        .await?;

    let out = cli(&["--json", "copy", &source, &dest]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(summary["kept_newer_in_destination"], 1, "{summary}");
    let refused = summary["refused"].to_string();
    assert!(refused.contains(&stream_key("s")), "{refused}");
    let kept = dst
        .sessions(idle)
        .load(&SessionId::new("shared")?)
        .await?
        .expect("kept");
    assert_eq!(kept.initialize_params["clientInfo"]["name"], "newer");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_into_split_secretsmanager_store_never_prints_tokens() -> anyhow::Result<()> {
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let prefix = unique("split").replace(':', "/");
    let split = format!(
        "credentials=secretsmanager://us-east-1?prefix={prefix}&endpoint={moto};rest=sqlite:{}",
        dir.path().join("rest.db").display()
    );
    let out = cli(&["copy", &filled.client_store, &split]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("verified:"), "{}", stdout(&out));
    let listed = cli(&["ls", &split, "credentials"]);
    let text = format!("{}{}", stdout(&listed), stderr(&listed));
    assert_eq!(listed.status.code(), Some(0), "{text}");
    assert!(text.contains("https://auth.example.test"), "{text}");
    for secret in [PLANTED_ACCESS, PLANTED_REFRESH, PLANTED_CLIENT_SECRET] {
        assert!(!text.contains(secret), "{text}");
    }
    // The credentials are in Secrets Manager alone, the client state in SQLite.
    let rest_only = format!("sqlite:{}", dir.path().join("rest.db").display());
    let rest = cli_expect(&["--json", "ls", &rest_only, "credentials"], 0);
    assert_eq!(rest.trim(), "[]", "{rest}");
    let clients = cli_expect(&["ls", &split, "clients"], 0);
    assert!(clients.contains(&filled.client_session), "{clients}");
    cli_expect(&["check", &split], 0);
    Ok(())
}

/// The cluster form: a copy into a Redis Cluster lists and checks the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_into_redis_cluster_lists_the_same_sessions() -> anyhow::Result<()> {
    let Some(urls) = service_var(CLUSTER_VAR) else {
        return Ok(());
    };
    let nodes: Vec<&str> = urls
        .split(',')
        .map(|u| {
            u.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
        })
        .filter(|n| !n.is_empty())
        .collect();
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let cluster = format!(
        "redis+cluster://{}?prefix={}",
        nodes.join(","),
        unique("cluster")
    );
    let summary = cli_expect(&["copy", &filled.server_store, &cluster], 0);
    assert!(summary.contains("verified:"), "{summary}");
    let listed = |store: &str| -> anyhow::Result<Vec<String>> {
        let rows: serde_json::Value =
            serde_json::from_str(&cli_expect(&["--json", "ls", store, "sessions"], 0))?;
        let mut ids: Vec<String> = rows
            .as_array()
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| r["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        Ok(ids)
    };
    let source = listed(&filled.server_store)?;
    assert_eq!(source.len(), 2);
    assert_eq!(listed(&cluster)?, source);
    cli_expect(&["check", &cluster], 0);
    Ok(())
}
