//! What the command line prints: errors as JSON under `--json`, a reader
//! that stops early (`| head`) ends it quietly, an empty listing of Redis
//! without `?prefix=` says why, and a damaged SQLite file is named as a
//! file.

use std::io::Read;

use crate::support::*;
use mcp_persist_core::KvStore;

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
        vec!["show", url.as_str(), &events_log("long")],
        vec!["--json", "show", url.as_str(), &events_log("long")],
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
                &k(&session_key(&format!("s{i}"))),
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

/// The fields the README's "JSON output" table documents for each command.
fn documented_json_fields() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>>
{
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## JSON output")
        .nth(1)
        .expect("the README documents --json")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, t)| t.to_owned())
            .collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let command = ticked(cells[0]).remove(0);
            (command, ticked(cells[1]).into_iter().collect())
        })
        .collect()
}

/// The keys of a JSON object, or of the first object of an array.
fn fields(value: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let object = match value {
        serde_json::Value::Array(rows) => {
            rows.first().unwrap_or_else(|| panic!("no rows: {value}"))
        }
        other => other,
    };
    object
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_has_the_documented_fields() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let (server, client) = (filled.server_store.as_str(), filled.client_store.as_str());
    let server_stores = open_local(server).await?;
    let task = mcp_persist_core::TaskRecord::new(
        mcp_persist_core::TaskId::new("task-json")?,
        Some("alice".into()),
        mcp_persist_core::TaskOwner::new(
            "instance-1",
            1,
            mcp_persist_core::Timestamp::now().plus(std::time::Duration::from_secs(30)),
        ),
    );
    server_stores.tasks()?.create(&task).await?;
    server_stores
        .shared_keys()
        .get_or_create("request-state")
        .await?;
    let (session, log) = filled.session_and_log();
    let none_log = events_log("none");
    let copy_dest = format!("sqlite:{}", dir.path().join("copy.db").display());
    // A keyring file for `rekey` (owner-only, as the tool requires).
    let (_, key_text) = mcp_persist_core::seal::SealKey::generate()?;
    let keys = dir.path().join("ring.keys");
    std::fs::write(&keys, key_text.expose_secret())?;
    std::fs::set_permissions(
        &keys,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )?;
    let keyring = format!("file:{}", keys.display());
    let file_store = format!("file:{}", dir.path().join("files").display());
    cli_expect(&["copy", server, &file_store], 0);

    let runs: Vec<(&str, Vec<&str>, i32)> = vec![
        ("ls sessions", vec!["ls", server, "sessions"], 0),
        ("ls events", vec!["ls", server, "events"], 0),
        ("ls clients", vec!["ls", client, "clients"], 0),
        ("ls credentials", vec!["ls", client, "credentials"], 0),
        ("ls tasks", vec!["ls", server, "tasks"], 0),
        ("ls keys", vec!["ls", server, "keys"], 0),
        ("show KEY", vec!["show", server, &session], 0),
        ("show LOG", vec!["show", server, &log], 0),
        ("stats", vec!["stats", server], 0),
        ("check", vec!["check", server], 0),
        ("rm --dry-run", vec!["rm", server, &session, "--dry-run"], 0),
        ("gc --dry-run", vec!["gc", client, "--dry-run"], 0),
        ("copy", vec!["copy", "--dry-run", server, &copy_dest], 0),
        ("copy", vec!["copy", server, &copy_dest], 0),
        ("rekey", vec!["--keyring", &keyring, "rekey", &copy_dest], 0),
        ("quarantine", vec!["quarantine", &file_store, &none_log], 6),
        ("rm", vec!["rm", server, &session], 0),
        ("gc", vec!["gc", client], 0),
    ];
    let documented = documented_json_fields();
    let mut seen = std::collections::BTreeSet::new();
    for (command, args, code) in runs {
        let mut with_json = vec!["--json"];
        with_json.extend(args);
        let out = cli(&with_json);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{with_json:?}: {}",
            stderr(&out)
        );
        let value: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{with_json:?} printed no JSON ({e}): {}", stdout(&out)));
        let want = documented
            .get(command)
            .unwrap_or_else(|| panic!("the README documents no JSON for `{command}`"));
        assert_eq!(&fields(&value), want, "{with_json:?}: {value}");
        seen.insert(command.to_owned());
    }
    let undocumented: Vec<&String> = documented.keys().filter(|c| !seen.contains(*c)).collect();
    assert!(undocumented.is_empty(), "not exercised: {undocumented:?}");
    Ok(())
}

/// A key over the size limit is refused as bad usage, named by its head and
/// its size, not echoed whole (it was repeated in full: 5,000 bytes of one
/// error line).
#[test]
fn an_oversized_key_is_named_by_its_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite:{}", dir.path().join("state.db").display());
    cli_expect(&["copy", "memory:", &db], 0);
    let long = "k".repeat(5000);
    for command in ["show", "rm"] {
        let out = cli(&[command, &db, &long]);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{command}: {said}");
        assert!(said.contains("5000 bytes"), "{command}: {said}");
        assert!(
            said.contains(&format!("`{}…`", &long[..80])),
            "{command}: {said}"
        );
        assert!(said.len() < 400, "{command}: {} bytes: {said}", said.len());
    }
}
