//! Damage is not a crash: what the store does with files that were changed
//! behind its back (flipped bits, crafted frames, a deleted segment, a
//! read-only file), as opposed to the torn tail a crash leaves.
//!
//! Every case asserts a typed error naming the log or key, or a documented
//! recovery, and that nothing acknowledged is silently dropped: damaged bytes
//! stay where they were, and sequence numbers are never handed out twice.

use mcp_persist_core::conformance::key;
use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::{
        fs::{MetadataExt, PermissionsExt},
        process::CommandExt,
    },
    path::{Path, PathBuf},
    process::Command,
};

use mcp_persist_core::{Backend, Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

const LOG: &str = "journal";
/// Every test record is this long, so frame offsets are known.
const NOTE: usize = 7;
const FRAME: usize = 24;
const DIR_ENV: &str = "MCP_PERSIST_FILE_DAMAGE_DIR";

fn note(i: u64) -> Vec<u8> {
    format!("note {i:02}").into_bytes()
}

/// Opens a store and appends `n` notes one by one (a fresh handle follows
/// in each test, as after a restart).
async fn journal(dir: &Path, n: u64) -> Vec<u64> {
    let store = FileStore::open(dir).await.expect("open");
    let mut seqs = Vec::new();
    for i in 1..=n {
        seqs.extend(
            store
                .append(
                    &mcp_persist_core::conformance::key(LOG),
                    vec![note(i)],
                    None,
                )
                .await
                .expect("append"),
        );
    }
    seqs
}

fn segments(store_dir: &Path) -> Vec<PathBuf> {
    let logs: Vec<PathBuf> = fs::read_dir(store_dir.join("log"))
        .expect("log root")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(logs.len(), 1, "expected one log");
    let mut segs: Vec<PathBuf> = fs::read_dir(&logs[0])
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

fn last_segment(store_dir: &Path) -> PathBuf {
    segments(store_dir).pop().expect("a segment")
}

/// Bytes before the name in a segment header (format 2: header and slot).
const SEGMENT_FIXED: usize = 64;

/// Offset of the frame of the `i`-th note (0-based) in a one-segment journal.
fn frame_at(i: usize) -> usize {
    SEGMENT_FIXED + LOG.len() + i * (FRAME + NOTE)
}

/// A frame as the store writes it, with a good checksum.
fn frame(seq: u64, data: &[u8]) -> Vec<u8> {
    let expires = 0u64;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher.update(&expires.to_le_bytes());
    hasher.update(data);
    let mut out = Vec::new();
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&expires.to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A segment header as the store writes it.
fn segment_header(first: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"MPLG");
    out.extend_from_slice(&[1, 0, 0, 0]);
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&(LOG.len() as u32).to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out);
    hasher.update(LOG.as_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(LOG.as_bytes());
    out
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open segment")
        .write_all(bytes)
        .expect("append bytes");
}

/// What `store` says the journal's next append is numbered (`next_seq`).
async fn said(store: &FileStore) -> Result<u64, Error> {
    store
        .next_seq(&mcp_persist_core::conformance::key(LOG))
        .await
        .map(|next| next.expect("the file store answers next_seq"))
}

fn flip(path: &Path, at: usize, mask: u8) {
    let mut bytes = fs::read(path).expect("read");
    bytes[at] ^= mask;
    fs::write(path, &bytes).expect("write");
}

/// The reason of a `Corrupt` error naming the journal; panics otherwise.
fn corrupt_log(result: Result<impl std::fmt::Debug, Error>, what: &str) -> String {
    match result {
        Err(Error::Corrupt { key, reason, .. }) if key == LOG => reason,
        other => panic!("{what}: expected Corrupt naming {LOG:?}, got {other:?}"),
    }
}

/// Checks the store's answer to a damaged journal: reads, appends, trims
/// and `next_seq` fail with `Corrupt` naming the log and its segment,
/// nothing on disk changes, and `verify` reports one problem.
async fn assert_damage_kept(dir: &Path, what: &str) {
    let segs: Vec<(PathBuf, Vec<u8>)> = segments(dir)
        .into_iter()
        .map(|p| {
            let bytes = fs::read(&p).expect("read segment");
            (p, bytes)
        })
        .collect();
    let store = FileStore::open(dir).await.expect("open");
    let reason = corrupt_log(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        what,
    );
    assert!(
        reason.contains(".seg") && reason.contains("at byte"),
        "{what}: the error does not say where: {reason}"
    );
    // Asked first, then appended: the same damage, named the same way.
    let told = corrupt_log(said(&store).await, what);
    let appended = corrupt_log(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(99)],
                None,
            )
            .await,
        what,
    );
    assert_eq!(told, appended, "{what}");
    corrupt_log(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(99)],
                None,
            )
            .await,
        what,
    );
    corrupt_log(
        store
            .trim(&mcp_persist_core::conformance::key(LOG), u64::MAX)
            .await,
        what,
    );
    // A second handle (another process) sees the same.
    let other = FileStore::open(dir).await.expect("open");
    corrupt_log(
        other
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        what,
    );
    corrupt_log(said(&other).await, what);
    for (path, bytes) in &segs {
        assert_eq!(
            &fs::read(path).expect("read segment"),
            bytes,
            "{what}: a damaged segment was changed"
        );
    }
    let report = store.verify().await.expect("verify");
    assert_eq!(report.problems.len(), 1, "{what}: {:?}", report.problems);
    assert_eq!(report.torn_tail_bytes, 0, "{what}: damage counted as torn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_payload_byte_in_a_middle_frame_is_damage_not_a_torn_tail() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 10).await;
    flip(&last_segment(&dir), frame_at(2) + FRAME + 3, 0x01);
    assert_damage_kept(&dir, "payload of note 3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_header_fields_of_a_middle_frame_are_damage() {
    for (what, field, mask) in [
        ("length, running past the end", 2, 0x01),
        ("length, larger than any record", 3, 0x40),
        ("length, shorter", 0, 0x04),
        ("checksum", 5, 0x10),
        ("sequence number, low bit", 8, 0x01),
        ("sequence number, top bit", 15, 0x80),
        ("expiry", 17, 0x01),
    ] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        journal(&dir, 10).await;
        flip(&last_segment(&dir), frame_at(2) + field, mask);
        assert_damage_kept(&dir, what).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_last_frame_followed_by_more_bytes_is_damage() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 3).await;
    let mut bad = frame(4, &note(4));
    bad[FRAME] ^= 0x01; // its checksum fails...
    bad.extend_from_slice(b"trailing bytes"); // ...and it is not the end
    append_bytes(&last_segment(&dir), &bad);
    assert_damage_kept(&dir, "bad frame, then bytes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_a_good_checksum_but_an_impossible_length_is_damage() {
    // A whole frame, checksum and all, longer than the largest record.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let small = FileStoreOptions::default().max_value_bytes(1024);
    let store = FileStore::open_with(&dir, small.clone())
        .await
        .expect("open");
    for i in 1..=3 {
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(i)],
                None,
            )
            .await
            .expect("append");
    }
    drop(store);
    let seg = last_segment(&dir);
    append_bytes(&seg, &frame(4, &[7u8; 4096]));
    let before = fs::read(&seg).expect("read");
    let store = FileStore::open_with(&dir, small).await.expect("open");
    corrupt_log(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
            .await,
        "oversized frame",
    );
    corrupt_log(said(&store).await, "oversized frame");
    corrupt_log(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(5)],
                None,
            )
            .await,
        "oversized frame",
    );
    assert_eq!(fs::read(&seg).expect("read"), before, "the frame was cut");
    assert_eq!(store.verify().await.expect("verify").problems.len(), 1);

    // A header declaring 100 MiB (the checksum covers what follows).
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 3).await;
    let mut huge = frame(4, &note(4));
    huge[..4].copy_from_slice(&(100u32 << 20).to_le_bytes());
    append_bytes(&last_segment(&dir), &huge);
    assert_damage_kept(&dir, "100 MiB length").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_number_u64_max_is_damage_and_nothing_panics() {
    // As the next frame of a log.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 3).await;
    append_bytes(&last_segment(&dir), &frame(u64::MAX, b"max"));
    assert_damage_kept(&dir, "frame numbered u64::MAX").await;

    // As a whole segment that starts there.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 3).await;
    let seg = last_segment(&dir).with_file_name(format!("{:020}.seg", u64::MAX));
    let mut bytes = segment_header(u64::MAX);
    bytes.extend_from_slice(&frame(u64::MAX, b"max"));
    fs::write(&seg, &bytes).expect("write segment");
    fs::set_permissions(&seg, fs::Permissions::from_mode(0o600)).expect("chmod");
    let store = FileStore::open(&dir).await.expect("open");
    corrupt_log(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
            .await,
        "segment at u64::MAX",
    );
    corrupt_log(said(&store).await, "segment at u64::MAX");
    corrupt_log(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(4)],
                None,
            )
            .await,
        "segment at u64::MAX",
    );
    corrupt_log(
        store
            .trim(&mcp_persist_core::conformance::key(LOG), 2)
            .await,
        "segment at u64::MAX",
    );
    assert_eq!(fs::read(&seg).expect("read"), bytes);
    assert!(!store.verify().await.expect("verify").is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_numbers_that_do_not_follow_are_damage() {
    for (what, seq) in [
        ("repeated", 3),
        ("going back", 1),
        ("skipping ahead", 5),
        ("zero", 0),
    ] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        journal(&dir, 3).await;
        append_bytes(&last_segment(&dir), &frame(seq, &note(4)));
        assert_damage_kept(&dir, what).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_middle_segment_is_damage_and_numbering_goes_on() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let options = FileStoreOptions::default().segment_bytes(128);
    let store = FileStore::open_with(&dir, options.clone())
        .await
        .expect("open");
    let mut seqs = Vec::new();
    for i in 1..=12 {
        seqs.extend(
            store
                .append(
                    &mcp_persist_core::conformance::key(LOG),
                    vec![note(i)],
                    None,
                )
                .await
                .expect("append"),
        );
    }
    drop(store);
    let segs = segments(&dir);
    assert!(segs.len() >= 3, "only {} segments", segs.len());
    fs::remove_file(&segs[1]).expect("delete a middle segment");

    let store = FileStore::open_with(&dir, options).await.expect("open");
    let reason = corrupt_log(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "missing segment",
    );
    assert!(reason.contains("missing"), "{reason}");
    let report = store.verify().await.expect("verify");
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    // Records past the gap are still served, and the last segment is whole:
    // appends go on above every number handed out.
    let last = *seqs.last().expect("seqs");
    assert_eq!(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), last - 1, 10)
            .await
            .expect("read")[0]
            .seq,
        last
    );
    assert_eq!(said(&store).await.expect("next_seq"), last + 1);
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(13)],
            None,
        )
        .await
        .expect("append");
    assert_eq!(next, vec![last + 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_damage_a_sequence_number_is_never_handed_out_twice() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let seqs = journal(&dir, 10).await;
    let seg = last_segment(&dir);
    flip(&seg, frame_at(8) + FRAME, 0x20); // note 9 of 10
    let damaged = fs::read(&seg).expect("read");

    let store = FileStore::open(&dir).await.expect("open");
    // Until the operator acts, appends refuse rather than reuse 9 and 10,
    // and `next_seq` names no number either.
    corrupt_log(said(&store).await, "damaged");
    corrupt_log(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(11)],
                None,
            )
            .await,
        "damaged",
    );
    let kept = store
        .quarantine_log(LOG)
        .await
        .expect("quarantine")
        .expect("the log had segments");
    assert!(kept.starts_with(dir.join("quarantine")), "{kept:?}");
    let kept_seg = kept.join(seg.file_name().expect("name"));
    assert_eq!(
        fs::read(&kept_seg).expect("quarantined segment"),
        damaged,
        "the quarantined bytes are not the damaged ones"
    );

    // The log goes on, empty, above every number it handed out.
    let highest = *seqs.last().expect("seqs");
    assert!(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
    let told = said(&store).await.expect("next_seq after setting aside");
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(11)],
            None,
        )
        .await
        .expect("append")[0];
    assert!(next > highest, "{next} reuses a number up to {highest}");
    assert_eq!(told, next, "next_seq after setting aside");
    assert!(store.verify().await.expect("verify").is_clean());

    // A sweep keeps the numbering, and so does another handle.
    store.sweep_expired().await.expect("sweep");
    let other = FileStore::open(&dir).await.expect("open");
    let read = other
        .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
        .await
        .expect("read");
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![next]);
    assert_eq!(said(&other).await.expect("next_seq"), next + 1);
    let after = other
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(12)],
            None,
        )
        .await
        .expect("append")[0];
    assert_eq!(after, next + 1);

    // Set aside again: numbering still holds, through a sweep too.
    other.quarantine_log(LOG).await.expect("quarantine again");
    store.sweep_expired().await.expect("sweep");
    let told = said(&store)
        .await
        .expect("next_seq after setting aside again");
    let again = other
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(13)],
            None,
        )
        .await
        .expect("append")[0];
    assert!(again > after, "{again} after {after}");
    assert_eq!(told, again, "next_seq after setting aside again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_still_cut_and_numbering_goes_on() {
    for (what, tail) in [
        // The first bytes of a real frame: its length runs past the end.
        ("partial frame", frame(4, &note(4))[..FRAME + 2].to_vec()),
        // A real final frame whose data did not reach the disk.
        ("final frame, bad checksum", {
            let mut f = frame(4, &note(4));
            f[FRAME + 1] ^= 0xff;
            f
        }),
        // A power cut that extended the file without its contents.
        ("zeros", vec![0u8; 200]),
        // A partial frame header.
        ("partial header", frame(4, &note(4))[..10].to_vec()),
    ] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        let seqs = journal(&dir, 3).await;
        let seg = last_segment(&dir);
        let good_len = fs::metadata(&seg).expect("stat").len();
        append_bytes(&seg, &tail);

        let store = FileStore::open(&dir).await.expect("open");
        // Asked before anything cut the torn tail: the number after the
        // last good frame, and the tail is still there (nothing written).
        assert_eq!(said(&store).await.expect("next_seq"), 4, "{what}");
        assert_eq!(
            fs::metadata(&seg).expect("stat").len(),
            good_len + tail.len() as u64,
            "{what}: next_seq cut the torn tail"
        );
        let report = store.verify().await.expect("verify");
        assert!(report.is_clean(), "{what}: {:?}", report.problems);
        assert_eq!(report.torn_tail_bytes, tail.len() as u64, "{what}");
        let read = store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
            .await
            .expect("read");
        assert_eq!(
            read.iter().map(|r| r.seq).collect::<Vec<_>>(),
            seqs,
            "{what}"
        );
        assert_eq!(
            fs::metadata(&seg).expect("stat").len(),
            good_len,
            "{what}: not cut"
        );
        let next = store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(4)],
                None,
            )
            .await
            .expect("append");
        assert_eq!(next, vec![4], "{what}");
        assert_eq!(
            store
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
                .await
                .expect("read")
                .len(),
            4
        );
    }
}

/// Not a test of its own: the body of the unprivileged child that
/// `a_read_only_last_segment_can_still_be_read` starts when it runs as root
/// (whom file modes do not stop). Without the variable it returns at once.
#[test]
fn read_only_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(read_only_checks(Path::new(&dir)));
}

/// Reads a journal of three notes whose last segment cannot be written (and
/// carries a torn tail that therefore cannot be cut), then tries to append.
async fn read_only_checks(dir: &Path) {
    let seg = last_segment(dir);
    let len = fs::metadata(&seg).expect("stat").len();
    let store = FileStore::open(dir).await.expect("open");
    let read = store
        .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
        .await
        .expect("read");
    assert_eq!(
        read.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
        vec![note(1), note(2), note(3)]
    );
    assert_eq!(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 2, 10)
            .await
            .expect("read again")
            .len(),
        1
    );
    assert_eq!(fs::metadata(&seg).expect("stat").len(), len);
    let err = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(4)],
            None,
        )
        .await
        .expect_err("append to a read-only segment");
    assert!(
        err.to_string().contains("open for appending") || err.to_string().contains("ermission"),
        "unclear error: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_last_segment_can_still_be_read() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    journal(&dir, 3).await;
    let seg = last_segment(&dir);
    append_bytes(&seg, &frame(4, &note(4))[..FRAME + 2]); // a torn tail
    fs::set_permissions(&seg, fs::Permissions::from_mode(0o400)).expect("chmod");
    if fs::metadata("/proc/self").expect("own process").uid() != 0 {
        read_only_checks(&dir).await;
        return;
    }
    // Root ignores file modes: run the checks as an unprivileged user.
    const NOBODY: u32 = 65534;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut stack = vec![dir.clone()];
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).expect("chown");
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "read_only_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, &dir)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .expect("start the unprivileged child");
    assert!(status.success(), "the read-only checks failed: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_a_record_are_corrupt_naming_its_key() {
    for (what, at) in [
        ("value", 40 + 7 + 2),
        ("version", 9),
        ("expiry", 18),
        ("value length", 28),
        ("key", 41),
        ("kind", 5),
    ] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        let store = FileStore::open(&dir).await.expect("open");
        for key in ["damaged", "fine"] {
            store
                .put(
                    &mcp_persist_core::conformance::key(key),
                    b"a value".to_vec(),
                    PutOptions::new(PutMode::Create),
                )
                .await
                .expect("put");
        }
        // Find the record file holding the damaged key, by content.
        let file = fs::read_dir(dir.join("kv"))
            .expect("kv")
            .map(|e| e.expect("entry").path())
            .find(|p| fs::read(p).expect("read")[40..].starts_with(b"damaged"))
            .expect("the record file");
        flip(&file, at, 0x01);
        let bytes = fs::read(&file).expect("read");

        let store = FileStore::open(&dir).await.expect("open");
        let err = store.get(&key("damaged")).await.expect_err(what);
        assert!(
            matches!(&err, Error::Corrupt { key, .. } if key == "damaged"),
            "{what}: got {err:?}"
        );
        assert_eq!(
            store
                .get(&key("fine"))
                .await
                .expect("get")
                .expect("present")
                .value,
            b"a value"
        );
        assert!(
            store
                .list("")
                .await
                .expect("list")
                .contains(&mcp_persist_core::conformance::key("fine"))
        );
        // A conditional write cannot be judged against it, and leaves it.
        assert!(
            store
                .put(
                    &key("damaged"),
                    b"new".to_vec(),
                    PutOptions::new(PutMode::Create)
                )
                .await
                .is_err(),
            "{what}"
        );
        assert_eq!(fs::read(&file).expect("read"), bytes, "{what}: changed");
        assert_eq!(
            store.verify().await.expect("verify").problems.len(),
            1,
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_at_version_u64_max_is_corrupt_not_a_repeated_version() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    store
        .put(&key("max"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    let file = fs::read_dir(dir.join("kv"))
        .expect("kv")
        .map(|e| e.expect("entry").path())
        .next()
        .expect("the record file");
    // Version u64::MAX, with a good header checksum.
    let mut bytes = fs::read(&file).expect("read");
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..36]);
    hasher.update(&bytes[40..43]);
    let crc = hasher.finalize().to_le_bytes();
    bytes[36..40].copy_from_slice(&crc);
    fs::write(&file, &bytes).expect("write");

    let entry = store.get(&key("max")).await.expect("get").expect("present");
    assert_eq!(entry.version.get(), u64::MAX);
    for result in [
        store
            .put(
                &key("max"),
                b"w".to_vec(),
                PutOptions::new(PutMode::Update(entry.version)),
            )
            .await,
        store
            .put(
                &key("max"),
                b"w".to_vec(),
                PutOptions::new(PutMode::Overwrite),
            )
            .await,
    ] {
        assert!(
            matches!(&result, Err(Error::Corrupt { key, .. }) if key == "max"),
            "got {result:?}"
        );
    }
    assert!(matches!(
        store.delete(&key("max"), None).await,
        Err(Error::Corrupt { .. })
    ));
    assert_eq!(
        fs::read(&file).expect("read"),
        bytes,
        "the record was changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_file_that_does_not_parse_fails_the_first_append_over_the_expired_log() {
    // An append reads the trim file only to rewrite it over an expired
    // log; `next_seq` reads it there too, and only there.
    let ttl = Some(std::time::Duration::from_secs(1));
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    let first = store
        .append(&key(LOG), vec![note(1), note(2)], ttl)
        .await
        .expect("append");
    assert_eq!(first, vec![1, 2]);
    let trim = last_segment(&dir).with_file_name("trim.json");
    fs::write(&trim, b"garbage").expect("damage the trim file");
    assert_eq!(said(&store).await.expect("next_seq of the live log"), 3);
    assert_eq!(
        store
            .append(&key(LOG), vec![note(3)], ttl)
            .await
            .expect("append to the live log"),
        vec![3]
    );
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let told = corrupt_log(said(&store).await, "expired, trim file damaged");
    let appended = corrupt_log(
        store.append(&key(LOG), vec![note(4)], ttl).await,
        "expired, trim file damaged",
    );
    assert_eq!(told, appended);
    assert!(told.contains("trim point"), "{told}");
    assert_eq!(fs::read(&trim).expect("trim file"), b"garbage");
}
