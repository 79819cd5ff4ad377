//! A handle keeps the last segment of each log it appends to open between
//! appends. These tests change the log behind that handle's back, from a
//! second handle on the same folder or from another process, and check that
//! the next append through the first handle lands where the log really
//! ends: numbers follow on (or start again after a delete), nothing is
//! written into a segment that was deleted, set aside or followed by
//! another, and the store verifies clean.

use std::{
    fs,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use mcp_persist_core::{Backend, LogStore, conformance::key};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

const LOG: &str = "shared";
const ROLE_ENV: &str = "MCP_PERSIST_FILE_KEPT_ROLE";
const DIR_ENV: &str = "MCP_PERSIST_FILE_KEPT_DIR";
const COUNT_ENV: &str = "MCP_PERSIST_FILE_KEPT_COUNT";

/// Segments small enough that a few appends start a new one.
fn small() -> FileStoreOptions {
    FileStoreOptions::default().segment_bytes(256)
}

async fn open(dir: &Path, options: FileStoreOptions) -> FileStore {
    FileStore::open_with(dir, options).await.expect("open")
}

/// Appends one record, unsynced when its text is of odd length (so the
/// tests mix both, the same way every run): an unsynced append to a kept
/// segment is written by the calling task (no blocking thread, a lock
/// stripe only if free), a lone synced one on the blocking pool, and both
/// must find what the other handle did.
async fn append(store: &FileStore, data: &str) -> u64 {
    let record = vec![data.as_bytes().to_vec()];
    let seqs = if data.len().is_multiple_of(2) {
        store.append(&key(LOG), record, None).await
    } else {
        store.append_unsynced(&key(LOG), record, None).await
    }
    .expect("append");
    assert_eq!(seqs.len(), 1);
    seqs[0]
}

/// What `store` says the log's next append is numbered (its `next_seq`).
async fn said(store: &FileStore) -> u64 {
    store
        .next_seq(&key(LOG))
        .await
        .expect("next_seq")
        .expect("the file store answers next_seq")
}

/// Every record of the log, as (number, text).
async fn records(store: &FileStore) -> Vec<(u64, String)> {
    store
        .read_after(&key(LOG), 0, 100_000)
        .await
        .expect("read")
        .into_iter()
        .map(|r| (r.seq, String::from_utf8(r.data).expect("utf8")))
        .collect()
}

async fn assert_clean(store: &FileStore) {
    let report = store.verify().await.expect("verify");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// The segment files of the only log, sorted.
fn segments(store_dir: &Path) -> Vec<PathBuf> {
    let mut segs = Vec::new();
    for log in fs::read_dir(store_dir.join("log")).expect("log root") {
        for entry in fs::read_dir(log.expect("entry").path()).expect("log dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "seg") {
                segs.push(path);
            }
        }
    }
    segs.sort();
    segs
}

/// Every file under `dir` with its length.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            let len = fs::metadata(&path).expect("metadata").len();
            out.push((path, len));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_taking_turns_number_one_log_without_gaps() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (a, b) = (open(&dir, small()).await, open(&dir, small()).await);
    let mut want = Vec::new();
    // Runs of different lengths, so each handle finds the other's appends
    // in its kept segment, and segments started by the other after it.
    for round in 0..12u64 {
        // Each handle's next number, asked of both before the append,
        // is the one it gets: whichever handle wrote last, and across a
        // segment the other started.
        for i in 0..round % 4 + 1 {
            let text = format!("a{round}.{i}");
            let (by_a, by_b) = (said(&a).await, said(&b).await);
            let seq = append(&a, &text).await;
            assert_eq!((by_a, by_b), (seq, seq), "{text}");
            want.push((seq, text));
        }
        for i in 0..(round + 2) % 3 + 1 {
            let text = format!("b{round}.{i}");
            let (by_a, by_b) = (said(&a).await, said(&b).await);
            let seq = append(&b, &text).await;
            assert_eq!((by_a, by_b), (seq, seq), "{text}");
            want.push((seq, text));
        }
    }
    let numbers: Vec<u64> = want.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(numbers, (1..=want.len() as u64).collect::<Vec<_>>());
    assert!(segments(&dir).len() > 3, "the test rolls segments");
    assert_eq!(records(&a).await, want);
    assert_eq!(records(&b).await, want);
    assert_clean(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_after_another_handle_deleted_the_log_starts_it_again() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (a, b) = (open(&dir, small()).await, open(&dir, small()).await);
    for i in 1..=3 {
        assert_eq!(append(&a, &format!("old {i}")).await, i);
    }
    b.delete_log(&key(LOG)).await.expect("delete");
    // Numbering starts again after a delete, in a new segment 1: the kept
    // descriptor of the deleted one must not be taken for it.
    assert_eq!(said(&a).await, 1);
    assert_eq!(append(&a, "new 1").await, 1);
    assert_eq!(append(&a, "new 2").await, 2);
    let want = vec![(1, "new 1".to_owned()), (2, "new 2".to_owned())];
    assert_eq!(records(&b).await, want);
    assert_eq!(records(&a).await, want);
    assert_clean(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_recreated_after_a_delete_cut_short_is_not_mistaken_for_the_old_one() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (a, b) = (open(&dir, small()).await, open(&dir, small()).await);
    for i in 1..=2 {
        append(&a, &format!("old {i}")).await;
    }
    // What a delete leaves when its process dies between moving the log
    // into the trash and removing it: the mark gone, the old segment still
    // linked, in the trash.
    let log_dir = segments(&dir)[0].parent().expect("log dir").to_owned();
    let hashed = log_dir.file_name().expect("name").to_owned();
    fs::remove_file(dir.join("mark").join(&hashed)).expect("remove mark");
    let trashed = dir.join("trash").join(&hashed);
    fs::rename(&log_dir, &trashed).expect("move into the trash");
    let old = files_under(&trashed);
    // The other handle starts the log again: a new segment 1 at the same path.
    assert_eq!(append(&b, "new 1").await, 1);
    assert_eq!(append(&a, "new 2").await, 2);
    assert_eq!(
        files_under(&trashed),
        old,
        "the old segment was not written"
    );
    assert_eq!(
        records(&b).await,
        vec![(1, "new 1".to_owned()), (2, "new 2".to_owned())]
    );
    assert_clean(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_after_another_handle_set_the_log_aside_goes_on_above_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (a, b) = (open(&dir, small()).await, open(&dir, small()).await);
    for i in 1..=3 {
        append(&a, &format!("old {i}")).await;
    }
    let kept = b
        .quarantine_log(LOG)
        .await
        .expect("quarantine")
        .expect("there was a log");
    let set_aside = files_under(&kept);
    assert!(!set_aside.is_empty());
    let next = said(&a).await;
    let seq = append(&a, "after").await;
    assert!(seq > 3, "numbered above the set-aside records: {seq}");
    assert_eq!(next, seq, "next_seq after another handle set the log aside");
    assert_eq!(
        files_under(&kept),
        set_aside,
        "nothing was written into the set-aside files"
    );
    assert_eq!(records(&b).await, vec![(seq, "after".to_owned())]);
    assert_clean(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_after_another_handle_swept_the_expired_log_starts_it_again() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let options = small().sweep_margin(Duration::ZERO);
    let (a, b) = (open(&dir, options.clone()).await, open(&dir, options).await);
    a.append(
        &key(LOG),
        vec![b"short-lived".to_vec()],
        Some(Duration::from_millis(1)),
    )
    .await
    .expect("append");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Expired but not swept, the log keeps its numbering.
    assert_eq!((said(&a).await, said(&b).await), (2, 2));
    assert_eq!(b.sweep_expired().await.expect("sweep"), 1);
    assert!(segments(&dir).is_empty(), "the sweep removed the log");
    assert_eq!(said(&a).await, 1);
    assert_eq!(append(&a, "fresh").await, 1);
    assert_eq!(records(&b).await, vec![(1, "fresh".to_owned())]);
    assert_clean(&b).await;
}

/// What an append that started a segment leaves when its process dies
/// before sealing the one before: the new segment exists, the old one's
/// slot names no next segment, and its roll notice is set.
fn unseal_with_notice(segment: &Path) {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment)
        .expect("open");
    let mut slot = [0u8; 32];
    file.read_exact_at(&mut slot, 32).expect("read slot");
    assert_ne!(slot[16..24], [0; 8], "the segment was sealed");
    slot[16..24].copy_from_slice(&0u64.to_le_bytes());
    let crc = crc32fast::hash(&slot[..24]);
    slot[24..28].copy_from_slice(&crc.to_le_bytes());
    slot[28..32].copy_from_slice(&1u32.to_le_bytes());
    file.write_all_at(&slot, 32).expect("write slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_started_by_a_handle_that_died_before_sealing_is_not_appended_over() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let (a, b) = (open(&dir, small()).await, open(&dir, small()).await);
    let mut want = Vec::new();
    // This handle fills the first segment, keeping it open...
    let first = loop {
        let text = format!("a{}", want.len());
        want.push((append(&a, &text).await, text));
        let segs = segments(&dir);
        assert_eq!(segs.len(), 1);
        if fs::metadata(&segs[0]).expect("segment").len() >= 256 {
            break segs[0].clone();
        }
    };
    // ...the other starts the next one with its first append...
    let text = "b".to_owned();
    want.push((append(&b, &text).await, text));
    assert_eq!(segments(&dir).len(), 2);
    // ...and "dies" before sealing the first.
    unseal_with_notice(&first);
    let text = "a after".to_owned();
    let next = said(&a).await;
    let seq = append(&a, &text).await;
    assert_eq!(
        next, seq,
        "next_seq of the handle that kept the unsealed segment"
    );
    want.push((seq, text));
    assert_eq!(seq, want.len() as u64, "numbered after the new segment");
    assert_eq!(records(&b).await, want);
    assert_clean(&b).await;
}

/// Not a test of its own: the body of the child processes the next test
/// starts. Without the role variable it returns at once.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let dir = std::env::var(DIR_ENV).expect("store directory");
    let count: u64 = std::env::var(COUNT_ENV)
        .expect("count")
        .parse()
        .expect("number");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime")
        .block_on(async move {
            let store = open(Path::new(&dir), small()).await;
            match role.as_str() {
                "append" => {
                    for i in 0..count {
                        let seq = append(&store, &format!("child {i}")).await;
                        println!("ACK {seq} child {i}");
                    }
                }
                "delete" => store.delete_log(&key(LOG)).await.expect("delete"),
                "quarantine" => {
                    store.quarantine_log(LOG).await.expect("quarantine");
                }
                other => panic!("unknown role {other}"),
            }
        });
}

/// Runs the child `role` on `dir` to its end; returns what it acknowledged.
fn run_child(role: &str, dir: &Path, count: u64) -> Vec<(u64, String)> {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .env(COUNT_ENV, count.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .expect("run child");
    assert!(out.status.success(), "child {role}: {:?}", out.status);
    String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .filter_map(|line| line.find("ACK ").map(|at| &line[at + 4..]))
        .map(|ack| {
            let (seq, text) = ack.split_once(' ').expect("ack");
            (seq.parse().expect("seq"), text.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_appending_deleting_and_setting_aside_is_seen() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let a = open(&dir, small()).await;
    let mut want = Vec::new();
    for round in 0..4 {
        let text = format!("parent {round}");
        want.push((append(&a, &text).await, text));
        // Enough to fill the kept segment and start others.
        want.extend(run_child("append", &dir, 5 + round));
    }
    let numbers: Vec<u64> = want.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(numbers, (1..=want.len() as u64).collect::<Vec<_>>());
    assert_eq!(records(&a).await, want);

    run_child("delete", &dir, 0);
    assert_eq!(append(&a, "after the delete").await, 1);
    assert_eq!(records(&a).await, vec![(1, "after the delete".to_owned())]);

    run_child("quarantine", &dir, 0);
    let quarantined = files_under(&dir.join("quarantine"));
    let seq = append(&a, "after quarantine").await;
    assert!(seq > 1, "numbered above the set-aside record: {seq}");
    assert_eq!(files_under(&dir.join("quarantine")), quarantined);
    assert_eq!(
        records(&a).await,
        vec![(seq, "after quarantine".to_owned())]
    );
    assert_clean(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_and_a_child_appending_at_once_hand_out_each_number_once() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let a = open(&dir, small()).await;
    append(&a, "first").await;
    let child_dir = dir.clone();
    let child = tokio::task::spawn_blocking(move || run_child("append", &child_dir, 60));
    let mut mine = Vec::new();
    for i in 0..60 {
        let text = format!("parent {i}");
        mine.push((append(&a, &text).await, text));
    }
    let theirs = child.await.expect("child");
    let mut all = vec![(1, "first".to_owned())];
    all.extend(mine);
    all.extend(theirs);
    all.sort();
    let numbers: Vec<u64> = all.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(numbers, (1..=121).collect::<Vec<_>>());
    assert_eq!(records(&a).await, all);
    assert_clean(&a).await;
}
