//! `copy` run as a process: a dry run creates nothing, missing folders are
//! created only when asked, copies started at the same time into one
//! destination leave it as one clean copy would, `check` finds duplicated
//! or out-of-order log records, and Ctrl-C says where the copy stopped and
//! that running it again continues.

use std::time::Duration;

use crate::support::*;
use mcp_persist_core::{KvStore, LogStore};

fn at(dir: &std::path::Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_creates_nothing_and_missing_folders_need_create_dirs() -> anyhow::Result<()> {
    let src_dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", at(src_dir.path(), "src.db"));
    many_streams(&source, 5, 3).await?;
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let before = tree(root);

    // A dry run into destinations that do not exist yet: it says what it
    // would do and creates nothing, not even the destination.
    for (dest, flags) in [
        (format!("sqlite:{}", at(root, "new.db")), vec![]),
        (format!("file:{}", at(root, "new-store")), vec![]),
        (
            format!("sqlite:{}", at(root, "missing/deeper/new.db")),
            vec!["--create-dirs"],
        ),
        (
            format!("file:{}", at(root, "missing/deeper/store")),
            vec!["--create-dirs"],
        ),
    ] {
        let mut args = vec!["copy", "--dry-run"];
        args.extend(flags);
        args.extend([source.as_str(), dest.as_str()]);
        let out = cli_expect(&args, 0);
        assert!(out.contains("dry run: 8 records"), "{out}");
        assert!(out.contains("would be created"), "{out}");
        let diff = tree_diff(&before, &tree(root));
        assert!(
            diff.is_empty(),
            "a dry run into {dest} wrote:\n{}",
            diff.join("\n")
        );
    }

    // Without --create-dirs, a destination whose folder is missing is
    // refused, dry run or not, and nothing is created.
    for dest in [
        format!("sqlite:{}", at(root, "missing/deeper/new.db")),
        format!("file:{}", at(root, "missing/deeper/store")),
    ] {
        for args in [
            vec!["copy", source.as_str(), dest.as_str()],
            vec!["copy", "--dry-run", source.as_str(), dest.as_str()],
        ] {
            let out = cli(&args);
            assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains("--create-dirs"), "{}", stderr(&out));
            let diff = tree_diff(&before, &tree(root));
            assert!(diff.is_empty(), "{args:?} wrote:\n{}", diff.join("\n"));
        }
    }
    assert!(!root.join("missing").exists());

    // A new store in an existing folder needs no flag; a missing folder is
    // created when asked.
    for dest in [
        format!("sqlite:{}", at(root, "new.db")),
        format!("file:{}", at(root, "new-store")),
    ] {
        let out = cli_expect(&["copy", &source, &dest], 0);
        assert!(out.contains("verified:"), "{out}");
    }
    for dest in [
        format!("sqlite:{}", at(root, "missing/deeper/new.db")),
        format!("file:{}", at(root, "missing/deeper/store")),
    ] {
        let out = cli_expect(&["copy", "--create-dirs", &source, &dest], 0);
        assert!(out.contains("verified:"), "{out}");
    }
    assert!(root.join("missing/deeper/new.db").is_file());
    assert!(root.join("missing/deeper/store/store.json").is_file());

    // A dry run into an existing store reads it and writes nothing.
    sqlite_at_rest(root).await;
    let before = tree(root);
    for dest in [
        format!("sqlite:{}", at(root, "new.db")),
        format!("file:{}", at(root, "new-store")),
    ] {
        let out = cli_expect(&["--json", "copy", "--dry-run", &source, &dest], 0);
        let summary: serde_json::Value = serde_json::from_str(&out)?;
        assert_eq!(summary["dry_run"], true, "{summary}");
        let diff = tree_diff(&before, &tree(root));
        assert!(
            diff.is_empty(),
            "a dry run into {dest} wrote:\n{}",
            diff.join("\n")
        );
    }
    Ok(())
}

/// Three copies of one source started at the same moment into one
/// destination: every one succeeds, the destination holds every record and
/// every event exactly once (as one clean copy into an empty store does),
/// `check` finds it sound, and a fourth copy has nothing left to do.
/// A split destination whose other part cannot be opened (a malformed URL,
/// a server that does not answer) is refused before its new part is made:
/// `copy` left the SQLite file of `rest=` behind, an empty store, when the
/// `credentials=` part failed. Each is asked twice; the second run finds
/// what the first left, which is nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_destination_that_fails_makes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let closed = closed_port()?;
    let rest = dir.path().join("rest.db");
    let folder = dir.path().join("rest-folder");
    for (credentials, code) in [
        (format!("redis://127.0.0.1:{closed}/0"), 3),
        (format!("redis://127.0.0.1:{closed}/0?db=2"), 2),
        (
            format!("postgres://u:p@127.0.0.1:{closed}/db?schema=Not-A-Name"),
            2,
        ),
    ] {
        for rest_url in [
            format!("sqlite:{}", rest.display()),
            format!("file:{}", folder.display()),
        ] {
            let split = format!("credentials={credentials};rest={rest_url}");
            for run in 1..=2 {
                let out = cli(&["copy", &filled.client_store, &split]);
                assert_eq!(
                    out.status.code(),
                    Some(code),
                    "run {run}, {split}: {}",
                    stderr(&out)
                );
                assert!(
                    !rest.exists() && !folder.exists(),
                    "run {run}, {split}: the rest= store was made"
                );
            }
        }
    }
    Ok(())
}

/// A port on this machine that nothing listens on.
fn closed_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A name no other run uses: lowercase letters, digits and `_`.
fn fresh(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{what}_{}_{nanos}", std::process::id())
}

/// `dest` names a server store that does not exist and that opening for
/// a copy makes (a Postgres schema, a `create=1` DynamoDB table). A dry run
/// says it would be created and makes nothing (a dry run opened it
/// writable, and a Postgres schema was made); a copy into a split store
/// whose other part's server does not answer makes nothing; each twice.
/// Then a copy that runs makes it. `made` says whether it is there.
/// Messages never repeat `dest`, which may hold a password.
async fn made_only_by_a_copy_that_runs<F, Fut>(
    source: &str,
    dest: &str,
    made: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let split = format!(
        "credentials=redis://127.0.0.1:{}/0;rest={dest}",
        closed_port()?
    );
    for run in 1..=2 {
        let dry = cli(&["copy", "--dry-run", source, dest]);
        assert_eq!(dry.status.code(), Some(0), "run {run}: {}", stderr(&dry));
        assert!(
            stdout(&dry).contains("would be created"),
            "run {run}: {}",
            stdout(&dry)
        );
        assert!(!made().await?, "run {run}: the dry run made the store");
        let failed = cli(&["copy", source, &split]);
        assert_eq!(
            failed.status.code(),
            Some(3),
            "run {run}: {}",
            stderr(&failed)
        );
        assert!(
            !made().await?,
            "run {run}: a split copy whose other part's server is down made the store"
        );
    }
    let copied = cli(&["copy", source, dest]);
    assert_eq!(copied.status.code(), Some(0), "{}", stderr(&copied));
    assert!(made().await?, "the copy that ran made the store");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_postgres_schema_is_made_only_by_a_copy_that_runs() -> anyhow::Result<()> {
    let Some(base) = service_var("MCP_PERSIST_POSTGRES_URL") else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let schema = fresh("dry_copy");
    let mut dest = url::Url::parse(&base)?;
    dest.query_pairs_mut().append_pair("schema", &schema);
    let made = || async {
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await?;
        let task = tokio::spawn(connection);
        let row = client
            .query_one(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
                &[&schema],
            )
            .await?;
        task.abort();
        anyhow::Ok(row.get::<_, i64>(0) > 0)
    };
    made_only_by_a_copy_that_runs(&filled.client_store, dest.as_str(), made).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_dynamodb_table_is_made_only_by_a_copy_that_runs() -> anyhow::Result<()> {
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let table = fresh("dry-copy").replace('_', "-");
    let dest = format!("dynamodb://{table}?region=us-east-1&endpoint={moto}&create=1");
    let client = dynamodb_client(&moto);
    let made = || async {
        match client.describe_table().table_name(&table).send().await {
            Ok(_) => anyhow::Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    };
    made_only_by_a_copy_that_runs(&filled.client_store, &dest, made).await
}

async fn overlapping_copies(dest: &str, clean_dest: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", at(dir.path(), "src.db"));
    let streams = many_streams(&source, 200, 60).await?;
    // Long logs take several appends each, so the copies overlap inside them.
    for name in ["long-a", "long-b"] {
        long_stream(&source, name, 1500).await?;
    }

    let runs: Vec<_> = (0..4)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
                .args(["--json", "copy", &source, dest])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for run in runs {
        let out = run.wait_with_output().await?;
        assert_eq!(
            out.status.code(),
            Some(0),
            "an overlapping copy failed:\n{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(summary["verified"], true, "{summary}");
    }
    let sound = cli_expect(&["check", dest], 0);
    assert!(sound.contains("all sound"), "{sound}");

    let again: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "copy", &source, dest], 0))?;
    assert_eq!(again["copied"], 0, "{again}");
    assert_eq!(again["log_records_appended"], 0, "{again}");

    cli_expect(&["copy", &source, clean_dest], 0);
    let overlapped = local_contents(dest).await?;
    let clean = local_contents(clean_dest).await?;
    assert_eq!(overlapped.logs.len(), streams.len() + 2);
    for name in &streams {
        let records = &overlapped.logs[&events_log(name)];
        assert_eq!(records.len(), 2, "{name} holds {records:?}");
    }
    assert_eq!(
        overlapped, clean,
        "the overlapped copies differ from one clean copy"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_copies_into_sqlite_never_duplicate() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    overlapping_copies(
        &format!("sqlite:{}", at(dir.path(), "dest.db")),
        &format!("sqlite:{}", at(dir.path(), "clean.db")),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_copies_into_a_file_store_never_duplicate() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    overlapping_copies(
        &format!("file:{}", at(dir.path(), "dest")),
        &format!("file:{}", at(dir.path(), "clean")),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_copies_into_redis_never_duplicate() -> anyhow::Result<()> {
    let Some(redis) = service_var(REDIS_VAR) else {
        return Ok(());
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let prefix = format!("cli-overlap-{}-{nanos}:", std::process::id());
    let url = format!("{}?prefix={prefix}", redis.trim_end_matches('/'));
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", at(dir.path(), "src.db"));
    let streams = many_streams(&source, 100, 40).await?;
    long_stream(&source, "long", 1500).await?;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
                .args(["--json", "copy", &source, &url])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for run in runs {
        let out = run.wait_with_output().await?;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            stdout(&out),
            stderr(&out)
        );
    }
    cli_expect(&["check", &url], 0);
    let store = mcp_persist_store_redis::RedisStore::standalone(redis.clone())
        .key_prefix(prefix)
        .connect()
        .await?;
    let got = contents(&store, &store).await?;
    let want = local_contents(&source).await?;
    assert_eq!(got.logs.len(), streams.len() + 1);
    assert_eq!(got.logs, want.logs, "every event once, with its number");
    Ok(())
}

/// `check` names duplicated and out-of-order records of an event log in
/// words an operator reads, and exits 1.
async fn check_finds_duplicates(url: &str) -> anyhow::Result<()> {
    many_streams(url, 1, 2).await?;
    let (kv, log): (std::sync::Arc<dyn KvStore>, std::sync::Arc<dyn LogStore>) =
        if let Some(path) = url.strip_prefix("sqlite:") {
            let s = std::sync::Arc::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?);
            (s.clone(), s)
        } else {
            let path = url.strip_prefix("file:").expect("file:");
            let s = std::sync::Arc::new(mcp_persist_store_file::FileStore::open(path).await?);
            (s.clone(), s)
        };
    assert!(kv.get(&k(&stream_key("stream-0000"))).await?.is_some());
    // The records of stream-0000 appended a second time, as two copies
    // racing into one destination used to leave them.
    let twice = log
        .read_after(&k(&events_log("stream-0000")), 0, 10)
        .await?;
    assert_eq!(twice.len(), 2);
    log.append(
        &k(&events_log("stream-0000")),
        twice.iter().map(|r| r.data.clone()).collect(),
        None,
    )
    .await?;
    // A progress notification that goes back: records out of order.
    let back = log.read_after(&k(&events_log("stream-0001")), 0, 1).await?;
    let mut earlier: serde_json::Value = serde_json::from_slice(&back[0].data)?;
    earlier["record"]["payload"]["params"]["progress"] = 0.into();
    log.append(
        &k(&events_log("stream-0001")),
        vec![serde_json::to_vec(&earlier)?],
        None,
    )
    .await?;
    drop((kv, log));

    let out = cli(&["check", url]);
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{report}{}", stderr(&out));
    assert!(
        report.contains(&format!("{}#3", events_log("stream-0000")))
            && report.contains("duplicate"),
        "{report}"
    );
    assert!(
        report.contains(&format!("{}#3", events_log("stream-0001")))
            && report.contains("out of order"),
        "{report}"
    );
    assert!(!report.contains("all sound"), "{report}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&cli(&["--json", "check", url])))?;
    assert_eq!(json["damaged"].as_array().map(Vec::len), Some(3), "{json}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_duplicated_records_in_sqlite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    check_finds_duplicates(&format!("sqlite:{}", at(dir.path(), "s.db"))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_duplicated_records_in_a_file_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    check_finds_duplicates(&format!("file:{}", at(dir.path(), "s"))).await
}

/// Ctrl-C (SIGINT) during a copy: it stops at a record boundary, says how
/// far it got and that running the same command again continues; the run
/// after it completes the copy with nothing duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_says_where_the_copy_stopped_and_the_next_run_continues() -> anyhow::Result<()> {
    const SESSIONS: usize = 1500;
    const STREAMS: usize = 20;
    let dir = tempfile::tempdir()?;
    let source = format!("sqlite:{}", at(dir.path(), "src.db"));
    many_streams(&source, SESSIONS, STREAMS).await?;
    let dest_path = dir.path().join("dest.db");
    let dest = format!("sqlite:{}", dest_path.display());
    // Created first, so the test can watch the copy's progress.
    let watch = mcp_persist_store_sqlite::SqliteStore::open(&dest_path).await?;

    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
        .args(["copy", &source, &dest])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().expect("running");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let across = watch
            .list(mcp_persist_core::declare::SERVER_SESSION.prefix)
            .await?
            .len();
        if across >= SESSIONS / 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy made no progress"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    assert!(sent.success());
    let out = child.wait_with_output().await?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{}\n{err}", stdout(&out));
    assert!(err.contains("interrupted"), "{err}");
    assert!(err.contains("stopped at"), "{err}");
    assert!(
        err.contains("run the same command again") && err.contains(&dest),
        "{err}"
    );
    let across = watch
        .list(mcp_persist_core::declare::SERVER_SESSION.prefix)
        .await?
        .len();
    assert!(across < SESSIONS, "stopped early: {across} of {SESSIONS}");
    watch.close().await?;

    let summary: serde_json::Value =
        serde_json::from_str(&cli_expect(&["--json", "copy", &source, &dest], 0))?;
    assert_eq!(summary["verified"], true, "{summary}");
    assert!(
        summary["already_there"]
            .as_u64()
            .is_some_and(|n| n >= across as u64),
        "{summary}"
    );
    let got = local_contents(&dest).await?;
    let want = local_contents(&source).await?;
    assert_eq!(got.logs, want.logs, "every event once, with its number");
    assert_eq!(
        got.records.keys().collect::<Vec<_>>(),
        want.records.keys().collect::<Vec<_>>()
    );
    Ok(())
}
