//! `ls`, `show`, `stats`, `check`, `rm` and `gc` run as a process on SQLite
//! and file stores filled by a real demo server and a real durable client.

use crate::support::*;
use anyhow::Context as _;

async fn inspect_scenario(scheme: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), scheme).await?;
    let server = filled.server_store.as_str();
    let client = filled.client_store.as_str();

    // Sessions: both sessions, with principal, client name and version,
    // protocol version, times and the TTL left.
    let table = cli_expect(&["ls", server, "sessions"], 0);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ID"), "{table}");
    assert!(lines[0].contains("TTL LEFT"), "{table}");
    let ours = lines
        .iter()
        .find(|l| l.starts_with(&filled.client_session))
        .unwrap_or_else(|| panic!("the client's session is listed:\n{table}"));
    assert!(
        ours.contains(CLIENT_NAME) && ours.contains(CLIENT_VERSION),
        "{ours}"
    );
    let raw = lines
        .iter()
        .find(|l| l.starts_with(&filled.raw_session))
        .unwrap_or_else(|| panic!("the raw session is listed:\n{table}"));
    assert!(raw.contains("alice") && raw.contains("2025-11-25"), "{raw}");
    assert!(
        raw.contains("29m") || raw.contains("30m"),
        "about 30 minutes left: {raw}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "ls", server, "sessions"], 0))?;
    let rows = json.as_array().expect("an array");
    assert_eq!(rows.len(), 2, "{json}");
    let alice = rows
        .iter()
        .find(|r| r["principal"] == "alice")
        .expect("alice's session");
    assert_eq!(alice["client_name"], "cli-raw-client");
    assert_eq!(alice["client_version"], "9.9");
    assert!(
        alice["ttl_left_secs"]
            .as_u64()
            .is_some_and(|s| s > 1700 && s <= 1800)
    );

    // Event logs: the raw call's stream holds its events, numbered to the
    // last id the server sent.
    let events: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "ls", server, "events"], 0))?;
    let last_raw = filled.raw_events.last().expect("events were sent");
    let last_seq: u64 = last_raw
        .split('-')
        .nth(1)
        .expect("token-seq-stream")
        .parse()?;
    let stream = last_raw.splitn(3, '-').nth(2).expect("stream");
    let row = events
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["stream"] == stream))
        .unwrap_or_else(|| panic!("stream {stream} listed: {events}"));
    assert_eq!(row["last_seq"], last_seq);
    assert_eq!(row["session"], filled.raw_session.as_str());
    assert!(
        row["events"]
            .as_u64()
            .is_some_and(|n| n >= filled.raw_events.len() as u64)
    );

    // Client state: the server, its era, the session.
    let clients = cli_expect(&["ls", client, "clients"], 0);
    assert!(
        clients.contains("SERVER") && clients.contains("IN-FLIGHT"),
        "{clients}"
    );
    assert!(clients.contains(&filled.client_session), "{clients}");
    assert!(clients.contains("legacy"), "{clients}");

    // Credentials: issuer, resource, scopes, expiry, refresh held; no token text.
    for args in [
        vec!["ls", client, "credentials"],
        vec!["--json", "ls", client, "credentials"],
    ] {
        let out = cli(&args);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains("https://auth.example.test"), "{text}");
        assert!(text.contains("mcp:read"), "{text}");
        for secret in [PLANTED_ACCESS, PLANTED_REFRESH, PLANTED_CLIENT_SECRET] {
            assert!(
                !text.contains(secret),
                "token text printed by {args:?}:\n{text}"
            );
        }
    }
    let keys = cli_expect(&["--json", "stats", client], 0);
    assert!(keys.contains("\"credentials\""), "{keys}");
    // `show` of the credential record: decoded, every secret redacted.
    let client_stores = open_local(client).await?;
    let cred_keys = client_stores.credentials().keys().await?;
    let token_key = cred_keys
        .iter()
        .find(|k| k.starts_with(mcp_persist_core::declare::CREDENTIALS.prefix))
        .expect("the planted credentials");
    let shown = cli_expect(&["show", client, token_key], 0);
    assert!(shown.contains("kind:    credentials"), "{shown}");
    assert!(
        shown.contains(mcp_persist_core::stores::inspect::REDACTED),
        "{shown}"
    );
    for secret in [PLANTED_ACCESS, PLANTED_REFRESH, PLANTED_CLIENT_SECRET] {
        assert!(!shown.contains(secret), "show printed a secret:\n{shown}");
    }
    // `show` of a log: the stream's events, decoded.
    let log = cli_expect(&["show", server, &events_log(stream)], 0);
    assert!(log.contains("notifications/progress"), "{log}");

    // Tasks and shared keys, as a server keeps them; key material never shown.
    let server_stores = open_local(server).await?;
    let task = mcp_persist_core::TaskRecord::new(
        mcp_persist_core::TaskId::new("task-cli-1")?,
        Some("alice".into()),
        mcp_persist_core::TaskOwner::new(
            "instance-1",
            1,
            mcp_persist_core::Timestamp::now().plus(std::time::Duration::from_secs(30)),
        ),
    )
    .with_ttl_ms(Some(600_000));
    server_stores.tasks()?.create(&task).await?;
    let tasks = cli_expect(&["ls", server, "tasks"], 0);
    let row = tasks
        .lines()
        .find(|l| l.starts_with("task-cli-1"))
        .unwrap_or_else(|| panic!("the task is listed:\n{tasks}"));
    assert!(
        row.contains("working") && row.contains("alice") && row.contains("instance-1"),
        "{row}"
    );
    let ring = server_stores
        .shared_keys()
        .get_or_create("request-state")
        .await?;
    let key_material = ring.active.secret.expose_secret().to_owned();
    let keys = cli_expect(&["ls", server, "keys"], 0);
    assert!(
        keys.contains("request-state") && keys.contains(&ring.active.id),
        "{keys}"
    );
    let shown = cli_expect(&["--json", "show", server, &key_ring("request-state")], 0);
    assert!(shown.contains("shared_key_ring"), "{shown}");
    for text in [&keys, &shown] {
        assert!(
            !text.contains(&key_material),
            "key material printed:\n{text}"
        );
    }

    // Stats: counts per kind.
    let stats: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "stats", server], 0))?;
    let sessions = stats
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["kind"] == "sessions"))
        .expect("a sessions row");
    assert_eq!(sessions["records"], 2);
    assert!(sessions["oldest"].is_string() && sessions["newest"].is_string());
    assert!(
        stats
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["kind"] == "event logs"))
    );

    // A sound store checks clean; a damaged record is found by key.
    let sound = cli_expect(&["check", server], 0);
    assert!(sound.contains("all sound"), "{sound}");
    plant_damage(server, &session_key("planted-damage")).await?;
    let out = cli(&["check", server]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let report = stdout(&out);
    assert!(report.contains(&session_key("planted-damage")), "{report}");
    assert!(report.contains("1 damaged"), "{report}");
    // The damaged record does not stop `ls`.
    let out = cli(&["ls", server, "sessions"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("mcp-persist check"),
        "{}",
        stderr(&out)
    );

    // rm: dry run deletes nothing, then the record goes, with a count.
    let dry = cli_expect(
        &["rm", server, &session_key("planted-damage"), "--dry-run"],
        0,
    );
    assert!(
        dry.contains(&format!("would delete {}", session_key("planted-damage"))),
        "{dry}"
    );
    assert_eq!(cli(&["check", server]).status.code(), Some(1));
    let gone = cli_expect(&["rm", server, &session_key("planted-damage")], 0);
    assert!(gone.contains("deleted 1 records"), "{gone}");
    cli_expect(&["check", server], 0);

    // gc: orphaned in-flight entries go; the live session's stay.
    let orphan = &mcp_persist_core::declare::IN_FLIGHT_REQUEST
        .key(&["default", "http://gone.example/mcp", "old-session", "n7"])
        .to_string();
    client_stores
        .client_state()
        .record_inflight(
            &mcp_persist_core::ServerKey::new("http://gone.example/mcp", "default")?,
            &mcp_persist_core::SessionId::new("old-session")?,
            &mcp_persist_core::InFlightRequest::new(
                mcp_persist_core::RequestId::Number(7),
                "tools/call",
                None,
            ),
        )
        .await?;
    let dry = cli_expect(&["gc", client, "--dry-run"], 0);
    assert!(dry.contains(orphan), "{dry}");
    let swept = cli_expect(&["gc", client], 0);
    assert!(
        swept.contains("deleted 1 orphaned in-flight entries"),
        "{swept}"
    );
    let shown = cli(&["show", client, orphan]);
    assert_eq!(shown.status.code(), Some(6), "the orphan is gone");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_sqlite_store_filled_by_real_peers() -> anyhow::Result<()> {
    inspect_scenario("sqlite").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_file_store_filled_by_real_peers() -> anyhow::Result<()> {
    inspect_scenario("file").await
}

#[test]
fn usage_errors_say_what_to_write_and_exit_2() {
    let out = cli(&["ls", "nosuch://db/x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no backend for `nosuch:`") && err.contains("sqlite:PATH"),
        "{err}"
    );
}

#[test]
fn missing_store_exits_3_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nothing.db");
    let url = format!("sqlite:{}", path.display());
    let out = cli(&["ls", &url]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("check the path"), "{}", stderr(&out));
    assert!(!path.exists(), "ls created a database");
}

#[test]
fn unreachable_redis_exits_3_with_advice() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let out = cli(&["ls", &url]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("hint:"), "{}", stderr(&out));
}

#[test]
fn help_documents_exit_codes() {
    let help = cli_expect(&["--help"], 0);
    for line in [
        "Exit codes:",
        "1  `check` found damaged",
        "3  a store is unreachable",
        "4  a record or store was written by a newer version",
    ] {
        assert!(help.contains(line), "{line} missing from:\n{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_exits_4() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("s.db").display());
    let stores = open_local(&url).await?;
    drop(stores);
    let kv = mcp_persist_store_sqlite::SqliteStore::open(dir.path().join("s.db")).await?;
    mcp_persist_core::KvStore::put(
        &kv,
        &k(&session_key("from-the-future")),
        br#"{"kind":"server_session","schema":99,"record":{}}"#.to_vec(),
        Default::default(),
    )
    .await?;
    let out = cli(&["check", &url]);
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("upgrade mcp-persist-cli"),
        "{}",
        stdout(&out)
    );
    let out = cli(&["show", &url, &session_key("from-the-future")]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    Ok(())
}

/// A log of a file store damaged in its middle: `check` names it and says
/// how to set it aside; `quarantine` moves it into `quarantine/`, after
/// which the store checks clean and the log's numbering goes on above every
/// number it issued. Other backends are refused with what to do instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_sets_a_damaged_file_log_aside() -> anyhow::Result<()> {
    use mcp_persist_core::LogStore;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("store");
    let url = format!("file:{}", root.display());
    let log = &events_log("damaged-stream");
    {
        let store = mcp_persist_store_file::FileStore::open(&root).await?;
        let seqs = store
            .append(
                &k(log),
                vec![vec![b'a'; 64], vec![b'b'; 64], vec![b'c'; 64]],
                None,
            )
            .await?;
        assert_eq!(seqs, vec![1, 2, 3]);
    }
    // Flip a byte of the first record: a bad checksum with more data after
    // it is damage, not a torn tail.
    let log_dir = std::fs::read_dir(root.join("log"))?
        .next()
        .context("the log's directory")??
        .path();
    let segment = std::fs::read_dir(&log_dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .context("the log's segment")?;
    let mut bytes = std::fs::read(&segment)?;
    let first_a = bytes
        .windows(64)
        .position(|w| w == [b'a'; 64])
        .context("the first record's data")?;
    bytes[first_a] = b'x';
    std::fs::write(&segment, &bytes)?;

    let out = cli(&["check", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let report = stdout(&out);
    assert!(report.contains(log), "{report}");

    let moved = cli_expect(&["quarantine", &url, log], 0);
    assert!(moved.contains(&format!("set aside log {log}")), "{moved}");
    assert!(!segment.exists(), "the damaged segment is still in place");
    let kept = std::fs::read_dir(root.join("quarantine"))?.count();
    assert_eq!(kept, 1, "the damaged files are kept for inspection");

    let clean = cli_expect(&["check", &url], 0);
    assert!(clean.contains("all sound"), "{clean}");
    let store = mcp_persist_store_file::FileStore::open(&root).await?;
    let next = store.append(&k(log), vec![b"d".to_vec()], None).await?;
    assert!(next[0] > 3, "a number was issued again: {next:?}");
    drop(store);

    let out = cli(&["quarantine", &url, &events_log("no-such-stream")]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stdout(&out).contains("no log named"), "{}", stdout(&out));

    let sqlite = format!("sqlite:{}", dir.path().join("s.db").display());
    drop(open_local(&sqlite).await?);
    let out = cli(&["quarantine", &sqlite, log]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("mcp-persist rm"), "{}", stderr(&out));
    Ok(())
}
