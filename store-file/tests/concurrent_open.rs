//! Many processes opening one new store directory at the same instant all
//! succeed: creating the directory, its format file and its subfolders is
//! safe to race. The children are this test binary run again with
//! `MCP_PERSIST_FILE_OPEN_DIR` set.

use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use mcp_persist_core::{KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::FileStore;

const DIR_ENV: &str = "MCP_PERSIST_FILE_OPEN_DIR";
const GO_ENV: &str = "MCP_PERSIST_FILE_OPEN_GO";
const TEST: &str = "eight_processes_open_one_new_store_at_once";

/// The child: waits for the start file, opens the store, writes its own key
/// and appends to a shared log. Prints `OPENED` on success; anything else
/// fails the process.
fn open_child(dir: &str) {
    let go = std::env::var(GO_ENV).expect("start file path");
    println!("READY");
    let waiting = Instant::now();
    while !Path::new(&go).exists() {
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "no start signal"
        );
        thread::sleep(Duration::from_micros(500));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let store = match FileStore::open(dir).await {
            Ok(store) => store,
            Err(e) => {
                println!("FAILED open: {e}");
                std::process::exit(2);
            }
        };
        let key = format!("opened/{}", std::process::id());
        if let Err(e) = store
            .put(&key, b"1".to_vec(), PutOptions::new(PutMode::Create))
            .await
        {
            println!("FAILED put: {e}");
            std::process::exit(3);
        }
        if let Err(e) = store.append("shared", vec![b"x".to_vec()], None).await {
            println!("FAILED append: {e}");
            std::process::exit(4);
        }
    });
    println!("OPENED");
}

#[test]
fn eight_processes_open_one_new_store_at_once() {
    const PROCESSES: usize = 8;
    const ROUNDS: usize = 50;
    if let Ok(dir) = std::env::var(DIR_ENV) {
        open_child(&dir);
        return;
    }
    let root = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let dir = root.path().join(format!("round-{round}"));
        let go = root.path().join(format!("go-{round}"));
        let mut children: Vec<Child> = (0..PROCESSES)
            .map(|_| {
                Command::new(std::env::current_exe().expect("path of the test binary"))
                    .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                    .env(DIR_ENV, &dir)
                    .env(GO_ENV, &go)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn the child process")
            })
            .collect();
        let mut outputs: Vec<BufReader<std::process::ChildStdout>> = children
            .iter_mut()
            .map(|child| BufReader::new(child.stdout.take().expect("piped stdout")))
            .collect();
        // Every child is waiting before the start file appears.
        for out in &mut outputs {
            let mut line = String::new();
            while !line.contains("READY") {
                line.clear();
                let n = out.read_line(&mut line).expect("child output");
                assert!(n > 0, "a child ended before it was ready");
            }
        }
        std::fs::write(&go, b"").expect("start file");
        for (child, out) in children.iter_mut().zip(&mut outputs) {
            let mut rest = String::new();
            out.read_to_string(&mut rest).expect("child output");
            let status = child.wait().expect("reap the child");
            if !status.success() || !rest.contains("OPENED") {
                let said = rest
                    .lines()
                    .find(|l| l.contains("FAILED"))
                    .unwrap_or("no output")
                    .to_owned();
                failures.push(format!("round {round}: {status}: {said}"));
            }
        }
        if failures.is_empty() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let (keys, records) = runtime.block_on(async {
                let store = FileStore::open(&dir).await.expect("reopen");
                let keys = store.list("opened/").await.expect("list").len();
                let records = store
                    .read_after("shared", 0, usize::MAX)
                    .await
                    .expect("read")
                    .len();
                (keys, records)
            });
            assert_eq!(
                (keys, records),
                (PROCESSES, PROCESSES),
                "round {round}: every child wrote its key and its record"
            );
        }
    }
    eprintln!(
        "{ROUNDS} rounds of {PROCESSES} processes opening one new file store in {:?}",
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} opens failed:\n{}",
        failures.len(),
        PROCESSES * ROUNDS,
        failures.join("\n")
    );
}
