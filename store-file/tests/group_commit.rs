//! Group commit: synced appends to many logs at once, from many tasks, share
//! syncs and still lose nothing acknowledged, in one process and when the
//! process is killed with SIGKILL mid-round.

use mcp_persist_core::conformance::key;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::process::ExitStatusExt,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use mcp_persist_core::LogStore;
use mcp_persist_store_file::{FileStore, FileStoreOptions};

const ROLE_ENV: &str = "MCP_PERSIST_FILE_GROUP_ROLE";
const DIR_ENV: &str = "MCP_PERSIST_FILE_GROUP_DIR";
const TAG_ENV: &str = "MCP_PERSIST_FILE_GROUP_TAG";

/// Logs appended to at once.
const LOGS: usize = 12;
/// Kills in the crash test.
const KILLS: u64 = 25;

fn options(group_commit: bool) -> FileStoreOptions {
    // Small segments, so rounds also meet segment changes.
    FileStoreOptions::default()
        .segment_bytes(2048)
        .group_commit(group_commit)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Appends `rounds` single records to each of `LOGS` logs, every log from
/// its own task, and checks each log reads back whole and in order.
async fn many_logs_at_once(store: &FileStore, rounds: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for log in 0..LOGS {
        let store = store.clone();
        tasks.spawn(async move {
            let mut seqs = Vec::new();
            for k in 0..rounds {
                let data = format!("{log}:{k}").into_bytes();
                seqs.extend(
                    store
                        .append(&key(format!("log-{log}")), vec![data], None)
                        .await?,
                );
            }
            anyhow::Ok((log, seqs))
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (log, seqs) = done.expect("task").expect("appends");
        let expected: Vec<u64> = (1..=rounds as u64).collect();
        assert_eq!(seqs, expected, "log {log}: numbers handed out");
        let read = store
            .read_after(&key(format!("log-{log}")), 0, usize::MAX)
            .await
            .expect("read");
        let data: Vec<String> = read
            .iter()
            .map(|r| String::from_utf8(r.data.clone()).expect("utf8"))
            .collect();
        let wanted: Vec<String> = (0..rounds).map(|k| format!("{log}:{k}")).collect();
        assert_eq!(data, wanted, "log {log}: records read back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_synced_appends_to_many_logs_all_land() {
    for group_commit in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open_with(dir.path(), options(group_commit))
            .await
            .expect("open");
        many_logs_at_once(&store, 60).await;
        if let Some(stats) = store.group_commit_stats() {
            // Every append after each log's first (which starts a segment,
            // synced whole) was synced by a round, whether its frames were
            // written on the blocking pool or by its own task.
            assert_eq!(stats.appends, (LOGS * 59) as u64, "{stats:?}");
        }
        let report = store.verify().await.expect("verify");
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.log_records, (LOGS * 60) as u64);
    }
}

/// Not a test of its own: the body of the child the crash test starts.
/// Appends to every log at once, each from its own task, printing every
/// acknowledged record, until killed (or 30 s).
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    assert_eq!(role, "append");
    let dir = std::env::var(DIR_ENV).expect("store directory");
    let tag = std::env::var(TAG_ENV).expect("tag");
    runtime().block_on(async move {
        let store = FileStore::open_with(&dir, options(true))
            .await
            .expect("open");
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for log in 0..LOGS {
            let (store, tag) = (store.clone(), tag.clone());
            tasks.spawn(async move {
                for k in 0u64.. {
                    if started.elapsed() > Duration::from_secs(30) {
                        return;
                    }
                    let data = format!("{tag}:{k}");
                    let seqs = store
                        .append(
                            &key(format!("log-{log}")),
                            vec![data.clone().into_bytes()],
                            None,
                        )
                        .await
                        .expect("append");
                    println!("ACK {log} {} {data}", seqs[0]);
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    });
}

#[test]
fn sigkill_mid_round_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    // Each log as read after the last kill.
    let mut logs: BTreeMap<usize, Vec<(u64, String)>> = BTreeMap::new();
    for kill in 0..KILLS {
        let tag = format!("c{kill}");
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "child_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, "append")
            .env(DIR_ENV, dir.path())
            .env(TAG_ENV, &tag)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start child");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("ACK ") {
                    let _ = tx.send(line[at + 4..].to_owned());
                }
            }
        });
        // Kill after a varying number of acknowledgements: mid-round, with
        // the other logs' appends written and waiting for their sync.
        let wanted = 5 + (kill * 37) % 120;
        let mut acks = Vec::new();
        while acks.len() < wanted as usize {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => acks.push(line),
                Err(_) => panic!("kill {kill}: the child stopped acknowledging"),
            }
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        assert_eq!(status.signal(), Some(9), "kill {kill}: {status:?}");
        reader.join().expect("reader");
        // Acknowledgements printed before the kill but not yet read.
        acks.extend(rx.try_iter());

        let mut acked: BTreeMap<usize, Vec<(u64, String)>> = BTreeMap::new();
        for line in acks {
            let mut parts = line.splitn(3, ' ');
            let log: usize = parts.next().and_then(|p| p.parse().ok()).expect("log");
            let seq: u64 = parts.next().and_then(|p| p.parse().ok()).expect("seq");
            let data = parts.next().expect("data").to_owned();
            acked.entry(log).or_default().push((seq, data));
        }
        rt.block_on(async {
            let store = FileStore::open_with(dir.path(), options(true))
                .await
                .expect("open after the kill");
            for log in 0..LOGS {
                let read: Vec<(u64, String)> = store
                    .read_after(&key(format!("log-{log}")), 0, usize::MAX)
                    .await
                    .expect("read")
                    .into_iter()
                    .map(|r| (r.seq, String::from_utf8(r.data).expect("utf8")))
                    .collect();
                let before = logs.entry(log).or_default();
                assert!(
                    read.windows(2).all(|w| w[1].0 == w[0].0 + 1),
                    "kill {kill}, log {log}: numbers not contiguous"
                );
                assert!(
                    read.len() >= before.len() && read[..before.len()] == before[..],
                    "kill {kill}, log {log}: earlier records changed or vanished"
                );
                let new = &read[before.len()..];
                let mine = acked.remove(&log).unwrap_or_default();
                assert!(
                    new.len() >= mine.len() && new[..mine.len()] == mine[..],
                    "kill {kill}, log {log}: acknowledged {mine:?}, found {new:?}"
                );
                // At most the one append in flight when killed follows.
                assert!(
                    new.len() <= mine.len() + 1,
                    "kill {kill}, log {log}: {} unacknowledged records",
                    new.len() - mine.len()
                );
                for (k, (_, data)) in new.iter().enumerate() {
                    assert_eq!(data, &format!("{tag}:{k}"), "kill {kill}, log {log}");
                }
                *before = read;
            }
            let report = store.verify().await.expect("verify");
            assert!(report.is_clean(), "kill {kill}: {:?}", report.problems);
        });
    }
    let total: usize = logs.values().map(Vec::len).sum();
    eprintln!("{KILLS} kills, {total} records over {LOGS} logs, every acknowledged one kept");
}

/// An append waiting for its sync holds no blocking thread, so appends to
/// many logs share rounds even when the blocking pool is small: with two
/// blocking threads, a round whose every member held one (as each waiting
/// append once did) could never cover more than two appends.
#[test]
fn waiting_appends_hold_no_blocking_thread() {
    const APPENDERS: usize = 16;
    const EACH: usize = 10;
    // On the build's disk, not a tmpfs: a real sync takes long enough for
    // appends to queue behind it.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let store = FileStore::open_with(dir.path(), options(true))
            .await
            .expect("open");
        if store.group_commit_stats().is_none() {
            eprintln!("group commit is not trusted on this system; nothing to check");
            return;
        }
        let mut tasks = tokio::task::JoinSet::new();
        for log in 0..APPENDERS {
            let store = store.clone();
            tasks.spawn(async move {
                for k in 0..EACH {
                    store
                        .append(&key(format!("log-{log}")), vec![vec![k as u8; 64]], None)
                        .await
                        .expect("append");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("appender");
        }
        let stats = store.group_commit_stats().expect("group commit on");
        assert!(stats.rounds > 0, "{stats:?}");
        let per_round = stats.appends as f64 / stats.rounds as f64;
        assert!(
            per_round > 2.0,
            "rounds should gather more appends than there are blocking threads: {stats:?}"
        );
        let report = store.verify().await.expect("verify");
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.log_records, (APPENDERS * EACH) as u64);
    });
}
