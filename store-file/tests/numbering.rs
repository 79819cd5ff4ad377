//! No sequence number is handed out twice, whatever happened to a log's
//! files: truncated (at a frame boundary or to nothing), segments deleted
//! (first, middle, last, all), the whole directory deleted, set aside.
//!
//! Losing acknowledged records is damage ([`Error::Corrupt`]) until the
//! operator sets the log aside, after which it goes on above every number it
//! handed out. Records missing from the end that cannot be told from an
//! append cut short by a power cut (those of the last append only) are
//! skipped: their numbers are never handed out again.

use std::{
    fs::{self, OpenOptions},
    path::{Path, PathBuf},
};

use mcp_persist_core::{Error, LogStore};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

const LOG: &str = "journal";
/// Every test record is this long, so frame offsets are known.
const NOTE: usize = 7;
const FRAME: usize = 24;
/// Bytes of a segment header before the log name (format 2; 24 in format 1).
const SEGMENT_FIXED: usize = 64;

fn note(i: u64) -> Vec<u8> {
    format!("note {i:02}").into_bytes()
}

/// Small segments: three or four notes each.
fn small() -> FileStoreOptions {
    FileStoreOptions::default().segment_bytes(128)
}

/// Appends notes `from..=to` one by one; returns their numbers.
async fn append_notes(store: &FileStore, from: u64, to: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    for i in from..=to {
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

fn log_dir(store_dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = fs::read_dir(store_dir.join("log"))
        .expect("log root")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(logs.len(), 1, "expected one log");
    logs[0].clone()
}

fn segments(store_dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = fs::read_dir(log_dir(store_dir))
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Cuts a one-segment journal of notes to its first `keep` frames: exactly
/// at a frame boundary, as a deliberate truncation would.
fn keep_frames(store_dir: &Path, keep: usize) {
    let segs = segments(store_dir);
    assert_eq!(segs.len(), 1);
    let format = fs::read(&segs[0]).expect("read")[4];
    let fixed = if format >= 2 { SEGMENT_FIXED } else { 24 };
    let len = fixed + LOG.len() + keep * (FRAME + NOTE);
    OpenOptions::new()
        .write(true)
        .open(&segs[0])
        .expect("open segment")
        .set_len(len as u64)
        .expect("truncate");
}

/// What `store` says the journal's next append is numbered (`next_seq`).
async fn said(store: &FileStore) -> Result<u64, Error> {
    store
        .next_seq(&mcp_persist_core::conformance::key(LOG))
        .await
        .map(|next| next.expect("the file store answers next_seq"))
}

fn seqs_of(records: &[mcp_persist_core::LogRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

/// Asserts a `Corrupt` naming the journal; returns its reason.
fn corrupt(result: Result<impl std::fmt::Debug, Error>, what: &str) -> String {
    match result {
        Err(Error::Corrupt { key, reason, .. }) if key == LOG => reason,
        other => panic!("{what}: expected Corrupt naming {LOG:?}, got {other:?}"),
    }
}

/// Reads, appends, trims and `next_seq` all refuse with `Corrupt`, on this
/// handle and on a fresh one; `verify` reports exactly one problem.
async fn assert_refused(dir: &Path, options: &FileStoreOptions, store: &FileStore, what: &str) {
    let other = FileStore::open_with(dir, options.clone())
        .await
        .expect("open");
    for handle in [store, &other] {
        corrupt(
            handle
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
                .await,
            what,
        );
        corrupt(said(handle).await, what);
        corrupt(
            handle
                .append(
                    &mcp_persist_core::conformance::key(LOG),
                    vec![note(99)],
                    None,
                )
                .await,
            what,
        );
        corrupt(
            handle
                .trim(&mcp_persist_core::conformance::key(LOG), 2)
                .await,
            what,
        );
    }
    let report = other.verify().await.expect("verify");
    assert_eq!(report.problems.len(), 1, "{what}: {:?}", report.problems);
}

/// Sets the journal aside and checks that it goes on above `highest`, from
/// this handle and from another.
async fn assert_goes_on_above(dir: &Path, store: &FileStore, highest: u64, what: &str) {
    store
        .quarantine_log(LOG)
        .await
        .expect("quarantine")
        .unwrap_or_else(|| panic!("{what}: nothing was set aside"));
    assert!(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
            .await
            .expect("read")
            .is_empty(),
        "{what}"
    );
    let told = said(store).await.expect("next_seq after setting aside");
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(11)],
            None,
        )
        .await
        .expect("append")[0];
    assert!(
        next > highest,
        "{what}: {next} reuses a number up to {highest}"
    );
    assert_eq!(told, next, "{what}: next_seq after setting aside");
    let other = FileStore::open(dir).await.expect("open");
    assert_eq!(said(&other).await.expect("next_seq"), next + 1, "{what}");
    let again = other
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(12)],
            None,
        )
        .await
        .expect("append")[0];
    assert_eq!(again, next + 1, "{what}");
    let report = other.verify().await.expect("verify");
    assert!(report.is_clean(), "{what}: {:?}", report.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_segment_truncated_to_nothing_then_set_aside_never_reissues() {
    // The issue's reproduction.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    let seqs = append_notes(&store, 1, 10).await;
    let seg = segments(&dir).remove(0);
    assert!(seg.ends_with("00000000000000000001.seg"));
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open")
        .set_len(0)
        .expect("truncate");
    assert_refused(&dir, &FileStoreOptions::default(), &store, "truncated to 0").await;
    assert_goes_on_above(&dir, &store, seqs[9], "truncated to 0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_cut_at_a_frame_boundary_are_damage() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    let seqs = append_notes(&store, 1, 10).await;
    keep_frames(&dir, 5);
    let before = fs::read(&segments(&dir)[0]).expect("read");
    // The handle that appended them notices too (its cached end is gone).
    let reason = corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "cut to 5",
    );
    assert!(reason.contains("records 6 to 9"), "{reason}");
    assert_refused(&dir, &FileStoreOptions::default(), &store, "cut to 5").await;
    assert_eq!(
        fs::read(&segments(&dir)[0]).expect("read"),
        before,
        "a damaged segment was changed"
    );
    assert_goes_on_above(&dir, &store, seqs[9], "cut to 5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_last_append_cut_away_are_skipped_not_reissued() {
    // One by one: only the tenth goes.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    append_notes(&store, 1, 10).await;
    keep_frames(&dir, 9);
    for handle in [&store, &FileStore::open(&dir).await.expect("open")] {
        let read = handle
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await
            .expect("read");
        assert_eq!(seqs_of(&read), (1..=9).collect::<Vec<_>>());
    }
    let report = store.verify().await.expect("verify");
    assert!(report.is_clean(), "{:?}", report.problems);
    // The commit slot says 10 was handed out, though its frame is gone.
    for handle in [&store, &FileStore::open(&dir).await.expect("open")] {
        assert_eq!(said(handle).await.expect("next_seq"), 11);
    }
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(11)],
            None,
        )
        .await
        .expect("append");
    assert_eq!(next, vec![11], "number 10 was handed out already");
    let read = store
        .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
        .await
        .expect("read");
    assert_eq!(
        seqs_of(&read),
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 11],
        "the skipped number is a gap"
    );
    assert_eq!(
        seqs_of(
            &store
                .read_after(&mcp_persist_core::conformance::key(LOG), 9, 10)
                .await
                .expect("read")
        ),
        vec![11]
    );
    assert!(store.verify().await.expect("verify").is_clean());

    // A batch of ten written in place: any part of it may go.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    append_notes(&store, 1, 1).await;
    let batch: Vec<Vec<u8>> = (2..=11).map(note).collect();
    store
        .append(&mcp_persist_core::conformance::key(LOG), batch, None)
        .await
        .expect("append");
    keep_frames(&dir, 5);
    let other = FileStore::open(&dir).await.expect("open");
    assert_eq!(
        seqs_of(
            &other
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
                .await
                .expect("read")
        ),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(said(&other).await.expect("next_seq"), 12);
    let next = other
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(12)],
            None,
        )
        .await
        .expect("append");
    assert_eq!(next, vec![12]);
    // Still so after a restart, and the gap is not taken for damage.
    let reopened = FileStore::open(&dir).await.expect("open");
    assert_eq!(
        seqs_of(
            &reopened
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
                .await
                .expect("read")
        ),
        vec![1, 2, 3, 4, 5, 12]
    );
    assert!(reopened.verify().await.expect("verify").is_clean());

    // A segment is created whole and synced with its first batch: none of
    // that batch can be missing after a crash, so losing any is damage.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    let batch: Vec<Vec<u8>> = (1..=10).map(note).collect();
    store
        .append(&mcp_persist_core::conformance::key(LOG), batch, None)
        .await
        .expect("append");
    keep_frames(&dir, 9);
    corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "first batch cut",
    );
    corrupt(said(&store).await, "first batch cut");
    corrupt(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(11)],
                None,
            )
            .await,
        "first batch cut",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_last_segment_is_damage() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let seqs = append_notes(&store, 1, 12).await;
    let segs = segments(&dir);
    assert!(segs.len() >= 3, "only {} segments", segs.len());
    fs::remove_file(segs.last().expect("a segment")).expect("delete the last segment");
    let reason = corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "last deleted",
    );
    assert!(reason.contains("missing"), "{reason}");
    assert_refused(&dir, &small(), &store, "last deleted").await;
    assert_goes_on_above(&dir, &store, seqs[11], "last deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_with_every_segment_deleted_is_damage() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let seqs = append_notes(&store, 1, 12).await;
    for seg in segments(&dir) {
        fs::remove_file(seg).expect("delete a segment");
    }
    let reason = corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "all deleted",
    );
    assert!(reason.contains("every segment"), "{reason}");
    assert_refused(&dir, &small(), &store, "all deleted").await;
    // A sweep leaves it for the operator.
    mcp_persist_core::Backend::sweep_expired(&store)
        .await
        .expect("sweep");
    corrupt(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(1)],
                None,
            )
            .await,
        "after a sweep",
    );
    assert_goes_on_above(&dir, &store, seqs[11], "all deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_log_directory_is_damage_while_its_mark_remains() {
    // As when an event stream's metadata still names the log.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let seqs = append_notes(&store, 1, 12).await;
    fs::remove_dir_all(log_dir(&dir)).expect("delete the log directory");
    let reason = corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "directory deleted",
    );
    assert!(reason.contains("directory is missing"), "{reason}");
    assert_refused(&dir, &small(), &store, "directory deleted").await;
    let report = store.verify().await.expect("verify");
    assert!(
        report.problems[0].contains(LOG),
        "the problem does not name the log: {:?}",
        report.problems
    );
    assert_goes_on_above(&dir, &store, seqs[11], "directory deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_first_segment_is_damage_for_reads_that_cross_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let seqs = append_notes(&store, 1, 12).await;
    let segs = segments(&dir);
    assert!(segs.len() >= 3, "only {} segments", segs.len());
    fs::remove_file(&segs[0]).expect("delete the first segment");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let reason = corrupt(
        store
            .read_after(&mcp_persist_core::conformance::key(LOG), 0, 100)
            .await,
        "first deleted",
    );
    assert!(reason.contains("records 1 to"), "{reason}");
    assert_eq!(
        store.verify().await.expect("verify").problems.len(),
        1,
        "first deleted"
    );
    // Past the gap, reads and appends go on.
    let last = seqs[11];
    assert_eq!(
        seqs_of(
            &store
                .read_after(&mcp_persist_core::conformance::key(LOG), last - 1, 10)
                .await
                .expect("read")
        ),
        vec![last]
    );
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
async fn delete_log_lets_numbering_start_again() {
    // The contract allows it, and nothing is left behind: a deleted log
    // keeps no mark.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open(&dir).await.expect("open");
    append_notes(&store, 1, 3).await;
    assert_eq!(fs::read_dir(dir.join("mark")).expect("marks").count(), 1);
    store
        .delete_log(&mcp_persist_core::conformance::key(LOG))
        .await
        .expect("delete");
    assert_eq!(fs::read_dir(dir.join("mark")).expect("marks").count(), 0);
    assert_eq!(fs::read_dir(dir.join("log")).expect("logs").count(), 0);
    assert_eq!(said(&store).await.expect("next_seq"), 1);
    assert_eq!(
        fs::read_dir(dir.join("log")).expect("logs").count(),
        0,
        "next_seq created the log"
    );
    assert_eq!(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(1)],
                None
            )
            .await
            .expect("append"),
        vec![1]
    );
    // Deleting is also a way out of a log whose directory went missing.
    fs::remove_dir_all(log_dir(&dir)).expect("delete the log directory");
    corrupt(said(&store).await, "directory deleted");
    corrupt(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(2)],
                None,
            )
            .await,
        "directory deleted",
    );
    store
        .delete_log(&mcp_persist_core::conformance::key(LOG))
        .await
        .expect("delete");
    assert_eq!(said(&store).await.expect("next_seq"), 1);
    assert!(store.verify().await.expect("verify").is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_that_does_not_parse_is_damage_until_set_aside() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let store = FileStore::open_with(&dir, small()).await.expect("open");
    let seqs = append_notes(&store, 1, 12).await;
    let mark = fs::read_dir(dir.join("mark"))
        .expect("marks")
        .next()
        .expect("a mark")
        .expect("entry")
        .path();
    fs::write(&mark, b"garbage").expect("write");
    // A handle that never read the mark needs it for its first append, and
    // so for `next_seq`, which writes nothing.
    let segs: Vec<Vec<u8>> = segments(&dir)
        .iter()
        .map(|p| fs::read(p).expect("read"))
        .collect();
    let fresh = FileStore::open_with(&dir, small()).await.expect("open");
    corrupt(said(&fresh).await, "a fresh handle, damaged mark");
    assert_eq!(
        segments(&dir)
            .iter()
            .map(|p| fs::read(p).expect("read"))
            .collect::<Vec<_>>(),
        segs,
        "next_seq wrote to the log"
    );
    // Appends need the mark once they pass it; reads do not. `next_seq`
    // says each time what the append then does.
    let mut refused = false;
    for i in 13..=200 {
        let told = said(&store).await;
        match store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(i)],
                None,
            )
            .await
        {
            Ok(seqs) => assert_eq!(told.ok(), Some(seqs[0]), "note {i}"),
            Err(Error::Corrupt { key, .. }) if key == LOG => {
                corrupt(told, "next_seq once appends need the damaged mark");
                refused = true;
                break;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(refused, "a damaged mark was overwritten");
    corrupt(said(&store).await, "after the refused append");
    assert_eq!(fs::read(&mark).expect("read"), b"garbage");
    assert!(!store.verify().await.expect("verify").is_clean());
    let highest = store
        .read_after(&mcp_persist_core::conformance::key(LOG), 0, usize::MAX)
        .await
        .expect("read")
        .last()
        .expect("records")
        .seq;
    assert!(highest >= seqs[11]);
    let kept = store
        .quarantine_log(LOG)
        .await
        .expect("quarantine")
        .expect("set aside");
    assert_eq!(fs::read(kept.join("mark")).expect("kept mark"), b"garbage");
    let told = said(&store).await.expect("next_seq after setting aside");
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(1)],
            None,
        )
        .await
        .expect("append")[0];
    assert!(next > highest, "{next} after {highest}");
    assert_eq!(told, next);
    assert!(store.verify().await.expect("verify").is_clean());
}

/// A format 1 segment header, as version 0.1 wrote them.
fn v1_header(first: u64) -> Vec<u8> {
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

/// A frame as the store writes it.
fn frame(seq: u64, data: &[u8]) -> Vec<u8> {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher.update(&0u64.to_le_bytes());
    hasher.update(data);
    let mut out = Vec::new();
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(data);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_by_the_old_format_goes_on_in_the_new_one() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    // Lay out a log as version 0.1 left it: a format 1 segment, no mark.
    let store = FileStore::open(&dir).await.expect("open");
    append_notes(&store, 1, 1).await;
    drop(store);
    let seg = segments(&dir).remove(0);
    let mut bytes = v1_header(1);
    for i in 1..=3 {
        bytes.extend_from_slice(&frame(i, &note(i)));
    }
    fs::write(&seg, &bytes).expect("write segment");
    for mark in fs::read_dir(dir.join("mark")).expect("marks") {
        fs::remove_file(mark.expect("entry").path()).expect("remove mark");
    }

    let store = FileStore::open(&dir).await.expect("open");
    assert_eq!(
        seqs_of(
            &store
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
                .await
                .expect("read")
        ),
        vec![1, 2, 3]
    );
    assert!(store.verify().await.expect("verify").is_clean());
    assert_eq!(said(&store).await.expect("next_seq"), 4);
    // The first append starts a segment of the new format, with a mark.
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(4)],
            None,
        )
        .await
        .expect("append");
    assert_eq!(next, vec![4]);
    assert_eq!(
        fs::read(&seg).expect("read"),
        bytes,
        "the old segment changed"
    );
    assert_eq!(segments(&dir).len(), 2);
    assert_eq!(
        seqs_of(
            &store
                .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
                .await
                .expect("read")
        ),
        vec![1, 2, 3, 4]
    );
    assert!(store.verify().await.expect("verify").is_clean());
    // Now losing the new segment is noticed.
    fs::remove_file(segments(&dir).pop().expect("new segment")).expect("delete");
    corrupt(
        store
            .append(
                &mcp_persist_core::conformance::key(LOG),
                vec![note(5)],
                None,
            )
            .await,
        "new segment deleted",
    );
    store.quarantine_log(LOG).await.expect("quarantine");
    let next = store
        .append(
            &mcp_persist_core::conformance::key(LOG),
            vec![note(5)],
            None,
        )
        .await
        .expect("append")[0];
    assert!(next > 4, "{next}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbering_planted_at_the_end_of_the_range_runs_out_and_never_wraps() {
    // The trim file of a log set aside says where its numbering goes on;
    // planted near u64::MAX, `next_seq` and the append agree up to the
    // last number there is, then both refuse with `Corrupt`.
    for (planted, last) in [(u64::MAX - 1, Some(u64::MAX - 1)), (u64::MAX, None)] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("store");
        let store = FileStore::open(&dir).await.expect("open");
        append_notes(&store, 1, 3).await;
        store
            .quarantine_log(LOG)
            .await
            .expect("quarantine")
            .expect("set aside");
        fs::write(
            log_dir(&dir).join("trim.json"),
            format!(r#"{{"trim_before":{planted},"next_seq":{planted}}}"#),
        )
        .expect("plant");
        let store = FileStore::open(&dir).await.expect("open");
        let what = format!("planted {planted}");
        if let Some(last) = last {
            assert_eq!(said(&store).await.expect("next_seq"), last, "{what}");
            assert_eq!(append_notes(&store, 4, 4).await, vec![last], "{what}");
        }
        for _ in 0..2 {
            corrupt(said(&store).await, &what);
            let reason = corrupt(
                store
                    .append(
                        &mcp_persist_core::conformance::key(LOG),
                        vec![note(5)],
                        None,
                    )
                    .await,
                &what,
            );
            assert!(reason.contains("exhausted"), "{what}: {reason}");
        }
        assert_eq!(
            seqs_of(
                &store
                    .read_after(&mcp_persist_core::conformance::key(LOG), 0, 10)
                    .await
                    .expect("read")
            ),
            last.into_iter().collect::<Vec<_>>(),
            "{what}"
        );
    }
}
