//! What the store does with its files: damaged records, modes, keys that
//! try to escape, torn log tails, sweeps.

use mcp_persist_core::conformance::key;
use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use mcp_persist_core::{Backend, Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

async fn open(dir: &Path) -> FileStore {
    FileStore::open(dir).await.expect("open")
}

/// Every regular file and directory under `root`, recursively.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

/// The record file holding `key` (found by content: names are hashes).
fn record_file(store_dir: &Path, key: &str) -> PathBuf {
    fs::read_dir(store_dir.join("kv"))
        .expect("kv dir")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            let bytes = fs::read(p).expect("read record");
            bytes.len() >= 40 + key.len() && &bytes[40..40 + key.len()] == key.as_bytes()
        })
        .unwrap_or_else(|| panic!("no record file holds {key:?}"))
}

fn segments(log_dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = fs::read_dir(log_dir)
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// The directory of the only log in the store.
fn only_log_dir(store_dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = fs::read_dir(store_dir.join("log"))
        .expect("log root")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(dirs.len(), 1, "expected one log");
    dirs[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_or_garbage_record_is_corrupt_naming_its_key() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    store
        .put(
            &key("victim"),
            b"precious value".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    store
        .put(
            &key("bystander"),
            b"fine".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    let file = record_file(&dir, "victim");
    let whole = fs::read(&file).expect("read");

    let damages: [(&str, Vec<u8>); 3] = [
        ("truncated", whole[..whole.len() - 5].to_vec()),
        ("header only", whole[..20].to_vec()),
        (
            "garbage",
            (0..whole.len()).map(|i| (i * 31 % 256) as u8).collect(),
        ),
    ];
    for (what, bytes) in damages {
        fs::write(&file, &bytes).expect("damage the record");
        let store = open(&dir).await;
        let err = store.get(&key("victim")).await.expect_err(what);
        assert!(
            matches!(&err, Error::Corrupt { key, .. } if key == "victim"),
            "{what}: want Corrupt naming the key, got {err:?}"
        );
        assert!(
            err.to_string().contains("victim"),
            "{what}: message names the key: {err}"
        );
        // Other keys still read, list still works, and a write that needs the
        // old version refuses rather than guessing.
        assert_eq!(
            store
                .get(&key("bystander"))
                .await
                .expect("get")
                .expect("present")
                .value,
            b"fine"
        );
        assert!(
            store
                .list("")
                .await
                .expect("list")
                .contains(&mcp_persist_core::conformance::key("bystander"))
        );
        let err = store
            .put(
                &key("victim"),
                b"x".to_vec(),
                PutOptions::new(PutMode::Create),
            )
            .await
            .expect_err("create over damage");
        assert!(matches!(err, Error::Corrupt { .. }), "{what}: got {err:?}");
        assert_eq!(
            fs::read(&file).expect("read"),
            bytes,
            "{what}: the damaged file was touched"
        );
        let report = store.verify().await.expect("verify");
        assert_eq!(report.problems.len(), 1, "{what}: {:?}", report.problems);
        assert_eq!(report.live_records, 1);
    }

    // An overwrite replaces the damaged record, keeping the damaged file aside.
    let store = open(&dir).await;
    let v = store
        .put(
            &key("victim"),
            b"fresh".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect("overwrite a damaged record");
    let entry = store
        .get(&key("victim"))
        .await
        .expect("get")
        .expect("present");
    assert_eq!((entry.value.as_slice(), entry.version), (&b"fresh"[..], v));
    let kept: Vec<PathBuf> = walk(&dir.join("quarantine"));
    assert_eq!(kept.len(), 1, "the damaged file is kept in quarantine");
    assert!(store.verify().await.expect("verify").is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_stores_of_a_newer_format_are_refused_untouched() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    store
        .put(
            &key("future"),
            b"v".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    let file = record_file(&dir, "future");
    let mut bytes = fs::read(&file).expect("read");
    bytes[4] = 9; // record format 9
    fs::write(&file, &bytes).expect("write");

    let err = store.get(&key("future")).await.expect_err("newer record");
    assert!(
        matches!(err, Error::NewerSchema { ref key, found: 9, supported: 1 } if key == "future"),
        "got {err:?}"
    );
    let err = store
        .put(
            &key("future"),
            b"w".to_vec(),
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect_err("overwrite of a newer record");
    assert!(matches!(err, Error::NewerSchema { .. }), "got {err:?}");
    assert_eq!(
        fs::read(&file).expect("read"),
        bytes,
        "newer record was changed"
    );
    // Deleting it deliberately works, and keeps the file aside.
    assert!(store.delete(&key("future"), None).await.expect("delete"));
    assert_eq!(store.get(&key("future")).await.expect("get"), None);
    assert_eq!(walk(&dir.join("quarantine")).len(), 1);

    // A store laid out by a newer version does not open.
    fs::write(dir.join("store.json"), br#"{"format":2,"version_floor":0}"#).expect("write meta");
    let err = FileStore::open(&dir).await.expect_err("newer store");
    assert!(
        matches!(err, Error::NewerSchema { found: 2, .. }),
        "got {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_are_0700_and_files_0600() {
    let tmp = tempfile::tempdir().expect("temp dir");
    // Missing parents are created private too.
    let dir = tmp.path().join("parent").join("store");
    let store = FileStore::open_with(&dir, FileStoreOptions::default().segment_bytes(64))
        .await
        .expect("open");
    for i in 0..5 {
        store
            .put(
                &key(format!("k{i}")),
                vec![i; 10],
                PutOptions::new(PutMode::Overwrite),
            )
            .await
            .expect("put");
        store
            .append(&key("log"), vec![vec![i; 100]], None)
            .await
            .expect("append");
    }
    store.delete(&key("k0"), None).await.expect("delete");
    store.trim(&key("log"), 3).await.expect("trim");
    let mut checked = 0;
    for path in std::iter::once(dir.clone())
        .chain(std::iter::once(tmp.path().join("parent")))
        .chain(walk(&dir))
    {
        let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{} has mode {mode:o}", path.display());
        checked += 1;
    }
    assert!(checked > 15, "only {checked} paths checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_look_like_paths_stay_inside_the_directory() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    let long = "../".repeat(341); // 1023 bytes
    let keys = [
        "../../etc/passwd",
        "../escape",
        "/etc/passwd",
        "a/../../b",
        "..",
        ".",
        "./.tmp-1-1",
        "kv/../lock/kv-00",
        "C:\\Windows\\system32",
        "name\u{202e}gpj.exe",
        long.as_str(),
    ];
    for (i, key) in keys.iter().enumerate() {
        store
            .put(
                &mcp_persist_core::conformance::key(key),
                vec![i as u8],
                PutOptions::new(PutMode::Create),
            )
            .await
            .expect("put");
        store
            .append(
                &mcp_persist_core::conformance::key(key),
                vec![vec![i as u8]],
                None,
            )
            .await
            .expect("append");
    }
    // Keys with NUL or over the length limit never reach the store: they
    // are refused when made.
    assert!(matches!(
        mcp_persist_core::Key::new("nul\0../../x"),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        mcp_persist_core::Key::new("../".repeat(400)),
        Err(Error::TooLarge { .. })
    ));

    // Nothing was created outside the store directory.
    let outside: Vec<PathBuf> = fs::read_dir(tmp.path())
        .expect("read")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(outside, vec![dir.clone()]);
    // Every key is its own record, under a hashed name, and reads back.
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            store
                .get(&mcp_persist_core::conformance::key(key))
                .await
                .expect("get")
                .expect("present")
                .value,
            vec![i as u8]
        );
        assert_eq!(
            store
                .read_after(&mcp_persist_core::conformance::key(key), 0, 10)
                .await
                .expect("read")[0]
                .data,
            vec![i as u8]
        );
    }
    let mut sorted: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    sorted.sort();
    assert_eq!(store.list("").await.expect("list"), sorted);
    for path in walk(&dir) {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(name.len() <= 64 + 20, "file name {name:?} is long");
        assert!(
            !name.contains("passwd") && !name.contains(".."),
            "file name {name:?} leaks a key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_log_tail_is_cut_when_the_log_is_opened() {
    for tail in [
        &b"\x10\x00\x00"[..], // a partial frame header
        &[0u8; 300][..],      // zeros, as a power cut leaves them
        // A whole last frame whose checksum fails, nothing after it.
        &b"\x05\x00\x00\x00crc-seq-expiry-bytesfive!"[..],
        // A last frame whose declared length runs past the end of the file.
        &b"\x00\x01\x00\x00crc-seq-expiry-bytes-partial data"[..],
    ] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        let seqs = {
            let store = open(&dir).await;
            store
                .append(
                    &key("events"),
                    vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
                    None,
                )
                .await
                .expect("append")
        };
        let log_dir = only_log_dir(&dir);
        let seg = segments(&log_dir).pop().expect("a segment");
        let good_len = fs::metadata(&seg).expect("stat").len();
        OpenOptions::new()
            .append(true)
            .open(&seg)
            .expect("open segment")
            .write_all(tail)
            .expect("tear the tail");

        let store = open(&dir).await;
        let before = store.verify().await.expect("verify");
        assert!(before.is_clean(), "{:?}", before.problems);
        assert_eq!(before.torn_tail_bytes, tail.len() as u64);
        let read = store
            .read_after(&key("events"), 0, 100)
            .await
            .expect("read");
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
        assert_eq!(
            fs::metadata(&seg).expect("stat").len(),
            good_len,
            "torn tail not cut"
        );
        let next = store
            .append(&key("events"), vec![b"d".to_vec()], None)
            .await
            .expect("append");
        assert_eq!(next, vec![seqs[2] + 1]);
        let read = store
            .read_after(&key("events"), 0, 100)
            .await
            .expect("read");
        assert_eq!(
            read.into_iter().map(|r| r.data).collect::<Vec<_>>(),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        let after = store.verify().await.expect("verify");
        assert_eq!((after.torn_tail_bytes, after.log_records), (0, 4));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_inside_a_log_is_corrupt_naming_the_log() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, FileStoreOptions::default().segment_bytes(256))
        .await
        .expect("open");
    for i in 0..20u8 {
        store
            .append(&key("stream"), vec![vec![i; 64]], None)
            .await
            .expect("append");
    }
    store
        .append(&key("other"), vec![b"fine".to_vec()], None)
        .await
        .expect("append");
    let log_dir = fs::read_dir(dir.join("log"))
        .expect("log root")
        .map(|e| e.expect("entry").path())
        .find(|d| segments(d).len() > 2)
        .expect("the segmented log");
    let first = &segments(&log_dir)[0];
    let mut bytes = fs::read(first).expect("read");
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff; // flip a byte in a record of a full segment
    fs::write(first, &bytes).expect("write");

    let store = open(&dir).await;
    let err = store
        .read_after(&key("stream"), 0, 100)
        .await
        .expect_err("damaged log");
    assert!(
        matches!(&err, Error::Corrupt { key, .. } if key == "stream"),
        "got {err:?}"
    );
    assert_eq!(
        store.read_after(&key("other"), 0, 10).await.expect("read")[0].data,
        b"fine"
    );
    assert_eq!(store.verify().await.expect("verify").problems.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_deletes_whole_segments_and_keeps_numbering() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, FileStoreOptions::default().segment_bytes(512))
        .await
        .expect("open");
    let mut seqs = Vec::new();
    for i in 0..100u32 {
        seqs.extend(
            store
                .append(&key("l"), vec![i.to_be_bytes().repeat(8)], None)
                .await
                .expect("append"),
        );
    }
    let log_dir = only_log_dir(&dir);
    let before = segments(&log_dir).len();
    assert!(before > 5, "only {before} segments");
    assert_eq!(store.trim(&key("l"), seqs[80]).await.expect("trim"), 80);
    assert!(
        segments(&log_dir).len() <= 4,
        "whole segments were not deleted"
    );
    let left = store
        .read_after(&key("l"), 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(
        left.iter().map(|r| r.seq).collect::<Vec<_>>(),
        seqs[80..].to_vec()
    );
    // Trimming past the end drops only what exists.
    assert_eq!(store.trim(&key("l"), u64::MAX).await.expect("trim"), 20);
    assert!(
        store
            .read_after(&key("l"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
    let next = store
        .append(&key("l"), vec![b"more".to_vec()], None)
        .await
        .expect("append");
    assert!(next[0] > seqs[99]);
    let reopened = open(&dir).await;
    assert_eq!(
        reopened.read_after(&key("l"), 0, 10).await.expect("read")[0].data,
        b"more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_reclaim_expired_state_and_versions_never_repeat() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    // No margin: the sweep may delete what expired a moment ago.
    let store = FileStore::open_with(
        &dir,
        FileStoreOptions::default().sweep_margin(Duration::ZERO),
    )
    .await
    .expect("open");
    let short = Some(Duration::from_millis(50));
    let v_deleted = store
        .put(
            &key("deleted"),
            b"1".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    store.delete(&key("deleted"), None).await.expect("delete");
    let v_expired = store
        .put(
            &key("expiring"),
            b"1".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(short),
        )
        .await
        .expect("put");
    store
        .put(
            &key("kept"),
            b"1".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    store
        .append(&key("old-log"), vec![b"x".to_vec()], short)
        .await
        .expect("append");
    store
        .append(&key("live-log"), vec![b"y".to_vec()], None)
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(150)).await;

    // One sweep for both: two expired records and one expired log.
    assert_eq!(store.sweep_expired().await.expect("sweep"), 3);
    assert_eq!(fs::read_dir(dir.join("kv")).expect("kv").count(), 1);
    assert_eq!(fs::read_dir(dir.join("log")).expect("log").count(), 1);
    assert_eq!(
        store
            .read_after(&key("live-log"), 0, 10)
            .await
            .expect("read")[0]
            .data,
        b"y"
    );

    // The reclaimed keys' next versions are above every version they had,
    // even from a fresh handle.
    let store = open(&dir).await;
    let v = store
        .put(
            &key("deleted"),
            b"2".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    assert!(v > v_deleted, "{v} after {v_deleted}");
    let v = store
        .put(
            &key("expiring"),
            b"2".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("put");
    assert!(v > v_expired, "{v} after {v_expired}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_log_restarts_empty_on_append() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    let first = store
        .append(
            &key("l"),
            vec![b"old".to_vec()],
            Some(Duration::from_millis(50)),
        )
        .await
        .expect("append");
    // An append without a TTL keeps the log's expiry.
    store
        .append(&key("l"), vec![b"old too".to_vec()], None)
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        store
            .read_after(&key("l"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
    let next = store
        .append(&key("l"), vec![b"new".to_vec()], None)
        .await
        .expect("append");
    assert!(next[0] > first[0]);
    let read = store.read_after(&key("l"), 0, 10).await.expect("read");
    assert_eq!(
        read.into_iter().map(|r| r.data).collect::<Vec<_>>(),
        vec![b"new".to_vec()]
    );
    assert_eq!(
        segments(&only_log_dir(&dir)).len(),
        1,
        "expired segments were kept"
    );
}

/// Sets a record's expiry on disk (Unix ms), keeping its header checksum good.
fn set_expiry(file: &Path, expires_ms: u64) {
    let mut bytes = fs::read(file).expect("read record");
    bytes[16..24].copy_from_slice(&expires_ms.to_le_bytes());
    let key_len = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")) as usize;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..36]);
    hasher.update(&bytes[40..40 + key_len]);
    let crc = hasher.finalize().to_le_bytes();
    bytes[36..40].copy_from_slice(&crc);
    fs::write(file, &bytes).expect("write record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_leaves_what_expired_within_the_margin() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = open(&dir).await;
    let short = Some(Duration::from_millis(50));
    for key in ["recent", "long-gone"] {
        store
            .put(
                &mcp_persist_core::conformance::key(key),
                b"1".to_vec(),
                PutOptions::new(PutMode::Create).with_ttl(short),
            )
            .await
            .expect("put");
    }
    store
        .append(&key("recent-log"), vec![b"x".to_vec()], short)
        .await
        .expect("append");
    // One record expired long before the margin (a day after the epoch).
    set_expiry(&record_file(&dir, "long-gone"), 86_400_000);
    tokio::time::sleep(Duration::from_millis(150)).await;

    // Reads honour the TTL at once...
    assert_eq!(store.get(&key("recent")).await.expect("get"), None);
    assert!(
        store
            .read_after(&key("recent-log"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
    // ...but the sweep deletes only what expired more than the margin ago,
    // so a clock stepped forward for a moment destroys nothing.
    assert_eq!(store.sweep_expired().await.expect("sweep"), 1);
    assert!(record_file(&dir, "recent").is_file());
    assert_eq!(fs::read_dir(dir.join("log")).expect("log").count(), 1);

    // Past the margin (here: with none), they go.
    let store = FileStore::open_with(
        &dir,
        FileStoreOptions::default().sweep_margin(Duration::ZERO),
    )
    .await
    .expect("open");
    assert_eq!(store.sweep_expired().await.expect("sweep"), 2);
    assert_eq!(fs::read_dir(dir.join("kv")).expect("kv").count(), 0);
    assert_eq!(fs::read_dir(dir.join("log")).expect("log").count(), 0);
}

/// A handle keeps its lock stripes' files open. One removed by hand while
/// the store is open is created again by the handle's next write, so that
/// it locks the same file as a handle opened since; the writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_removed_while_open_is_created_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path()).await;
    let log = key("events");
    store
        .append(&log, vec![b"one".to_vec()], None)
        .await
        .expect("append");
    let lock_dir = dir.path().join("lock");
    let stripes = |dir: &Path| -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .expect("lock dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.file_name().is_some_and(|n| n != "meta"))
            .collect();
        files.sort();
        files
    };
    let before = stripes(&lock_dir);
    assert!(!before.is_empty(), "an append takes a lock stripe");
    for file in &before {
        fs::remove_file(file).expect("remove lock file");
    }

    store
        .append(&log, vec![b"two".to_vec()], None)
        .await
        .expect("append after the lock file went");
    assert_eq!(
        stripes(&lock_dir),
        before,
        "the stripe's file is created again"
    );
    let other = open(dir.path()).await;
    let read: Vec<Vec<u8>> = other
        .read_after(&log, 0, 10)
        .await
        .expect("read")
        .into_iter()
        .map(|r| r.data)
        .collect();
    assert_eq!(read, vec![b"one".to_vec(), b"two".to_vec()]);
}
