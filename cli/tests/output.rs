//! What the command line prints: errors as JSON under `--json`, a reader
//! that stops early (`| head`) ends it quietly, an empty listing of Redis
//! without `?prefix=` says why, and a damaged SQLite file is named as a
//! file.

mod support;

use std::io::Read;

use mcp_persist_core::KvStore;
use support::*;

/// The one JSON object a failing command prints on standard error.
fn json_error(out: &std::process::Output) -> serde_json::Value {
    let err = stderr(out);
    let value: serde_json::Value = serde_json::from_str(err.trim())
        .unwrap_or_else(|e| panic!("standard error is not one JSON value ({e}):\n{err}"));
    assert!(value["error"]["message"].is_string(), "{value}");
    assert_eq!(
        value["error"]["code"].as_i64(),
        out.status.code().map(i64::from),
        "{value}"
    );
    value
}

#[test]
fn errors_are_json_under_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = format!("sqlite:{}", dir.path().join("missing.db").display());
    for (args, code, kind) in [
        (vec!["--json", "ls", "postgres://db/x"], 2, "usage"),
        (vec!["--json", "ls", missing.as_str()], 3, "unreachable"),
        (vec!["--json", "stats", missing.as_str()], 3, "unreachable"),
        (
            vec!["--json", "ls", missing.as_str(), "no-such-kind"],
            2,
            "usage",
        ),
        (
            vec!["ls", "--json", missing.as_str(), "--no-such-flag"],
            2,
            "usage",
        ),
    ] {
        let out = cli(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
        let error = json_error(&out);
        assert_eq!(error["error"]["kind"], kind, "{args:?}: {error}");
    }
    // Without --json, errors stay text.
    let out = cli(&["ls", &missing]);
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cut_short_by_the_reader_ends_quietly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("s.db").display());
    // One stream long enough to overflow any pipe buffer when shown.
    let stores = open_local(&url).await?;
    let log = stores.events(mcp_persist_core::EventLogConfig::default())?;
    for progress in 0..3000 {
        log.append(
            "long",
            None,
            &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "t", "progress": progress}}),
        )
        .await?;
    }
    drop((log, stores));
    for args in [
        vec!["show", url.as_str(), "server/events/long"],
        vec!["--json", "show", url.as_str(), "server/events/long"],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        // Read one line, as `head -1` does, then close the pipe.
        let mut stdout = child.stdout.take().expect("piped");
        let mut first = [0u8; 64];
        stdout.read_exact(&mut first)?;
        drop(stdout);
        let out = child.wait_with_output()?;
        assert_eq!(
            stderr(&out),
            "",
            "{args:?} complained about the closed pipe"
        );
        assert_eq!(out.status.code(), Some(141), "{args:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_on_redis_without_a_prefix_says_why_it_is_empty() -> anyhow::Result<()> {
    let Some(redis) = service_var(REDIS_VAR) else {
        return Ok(());
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let prefix = format!("cli-noprefix-{}-{nanos}:", std::process::id());
    // A database of its own, so that no other test's keys sit under the
    // default prefix.
    let base = format!("{}/9", redis.trim_end_matches('/'));
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", dir.path().join("s.db").display());
    many_streams(&source, 3, 1).await?;
    cli_expect(&["copy", &source, &format!("{base}?prefix={prefix}")], 0);

    let out = cli(&["ls", &base]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("mcp-persist:"),
        "names the default prefix: {err}"
    );
    assert!(err.contains("?prefix="), "says how to name one: {err}");
    assert!(err.contains(&prefix), "names the prefix in use: {err}");
    // With the right prefix the sessions are there, and nothing is said.
    let out = cli(&["ls", &format!("{base}?prefix={prefix}")]);
    assert_eq!(stdout(&out).lines().count(), 4, "{}", stdout(&out));
    assert_eq!(stderr(&out), "");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_sqlite_file_is_named_as_a_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let store = mcp_persist_store_sqlite::SqliteStore::open(&path).await?;
    for i in 0..50 {
        store
            .put(
                &format!("server/session/s{i}"),
                vec![b'x'; 200],
                Default::default(),
            )
            .await?;
    }
    store.close().await?;
    // Every page but the first (the header and the schema) overwritten.
    let mut bytes = std::fs::read(&path)?;
    assert!(bytes.len() > 4096, "more than one page");
    for b in &mut bytes[4096..] {
        *b = 0xa5;
    }
    std::fs::write(&path, &bytes)?;
    let url = format!("sqlite:{}", path.display());
    for command in ["check", "ls", "stats"] {
        let out = cli(&[command, &url]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{command}: {err}");
        assert!(err.contains("database file"), "{command}: {err}");
        assert!(!err.contains("record under key"), "{command}: {err}");
        assert!(!err.contains("mcp-persist check"), "{command}: {err}");
    }
    Ok(())
}
