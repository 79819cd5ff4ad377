//! A `get` of a small record is tried on the calling thread first (with
//! calls that fail rather than wait). These tests check that such a get is
//! never stale: it sees every put, overwrite and delete that returned before
//! it started, made by another handle on the same folder or by another
//! process, and that damage and large records read as before.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use mcp_persist_core::{Error, KvStore, PutMode, PutOptions, conformance::key};
use mcp_persist_store_file::FileStore;

const ROLE_ENV: &str = "MCP_PERSIST_FILE_FRESH_ROLE";
const DIR_ENV: &str = "MCP_PERSIST_FILE_FRESH_DIR";
const KEY: &str = "fresh";
const ROUNDS: u64 = 200;

async fn open(dir: &Path) -> FileStore {
    FileStore::open(dir).await.expect("open")
}

async fn put(store: &FileStore, value: Vec<u8>) {
    store
        .put(&key(KEY), value, PutOptions::new(PutMode::Overwrite))
        .await
        .expect("put");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_sees_what_another_handle_wrote_before_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (reader, writer) = (open(&dir).await, open(&dir).await);
    assert_eq!(reader.get(&key(KEY)).await.expect("get"), None);
    let mut last_version = None;
    for round in 0..ROUNDS {
        // Small values (read on the calling thread), one over 64 KiB now
        // and then (read on the blocking pool), and deletes.
        let value = match round % 10 {
            7 => vec![(round % 251) as u8; 100 * 1024],
            _ => format!("value {round}").into_bytes(),
        };
        put(&writer, value.clone()).await;
        let entry = reader.get(&key(KEY)).await.expect("get").expect("present");
        assert_eq!(entry.value, value, "round {round}");
        assert!(Some(entry.version) > last_version, "versions increase");
        last_version = Some(entry.version);
        if round % 10 == 3 {
            assert!(writer.delete(&key(KEY), None).await.expect("delete"));
            assert_eq!(reader.get(&key(KEY)).await.expect("get"), None);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_read_at_once_is_corrupt_naming_its_key() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    put(&store, b"intact".to_vec()).await;
    assert!(store.get(&key(KEY)).await.expect("get").is_some());
    let files: Vec<_> = fs::read_dir(dir.join("kv"))
        .expect("kv dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1);
    let mut bytes = fs::read(&files[0]).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(&files[0], &bytes).expect("write");
    match store.get(&key(KEY)).await {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, KEY),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    bytes.truncate(10);
    fs::write(&files[0], &bytes).expect("write");
    match store.get(&key(KEY)).await {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, KEY),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Not a test of its own: the body of the child process the next test
/// starts. Without the role variable it returns at once.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    assert_eq!(role, "writer");
    let dir = std::env::var(DIR_ENV).expect("store directory");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime")
        .block_on(async move {
            let store = open(Path::new(&dir)).await;
            for round in 0..ROUNDS {
                put(&store, round.to_string().into_bytes()).await;
                println!("PUT {round}");
            }
        });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_sees_a_put_another_process_finished_before_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let reader = open(&dir).await;
    put(&reader, b"0".to_vec()).await;
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, "writer")
        .env(DIR_ENV, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start child");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut acked = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("line");
        let Some(at) = line.find("PUT ") else {
            continue;
        };
        let done: u64 = line[at + 4..].parse().expect("number");
        // The put of `done` returned before this get starts: it may see a
        // later one, never an earlier one.
        let entry = reader.get(&key(KEY)).await.expect("get").expect("present");
        let seen: u64 = std::str::from_utf8(&entry.value)
            .expect("utf8")
            .parse()
            .expect("number");
        assert!(seen >= done, "read {seen} after put {done} returned");
        acked += 1;
    }
    assert!(child.wait().expect("child").success());
    assert_eq!(acked, ROUNDS);
}
