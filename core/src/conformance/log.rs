//! Conformance tests of the [`LogStore`] contract.

use super::key;
use std::{sync::Arc, time::Duration};

use super::LogFixture;
use crate::LogStore;

async fn append(store: &dyn LogStore, log: &str, records: &[&[u8]]) -> Vec<u64> {
    store
        .append(
            &key(log),
            records.iter().map(|r| r.to_vec()).collect(),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("append to {log:?} failed: {e}"))
}

async fn data_after(store: &dyn LogStore, log: &str, after: u64) -> Vec<Vec<u8>> {
    store
        .read_after(&key(log), after, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("read {log:?} failed: {e}"))
        .into_iter()
        .map(|r| r.data)
        .collect()
}

/// A log never appended to reads as empty.
pub async fn read_empty_log(f: &dyn LogFixture) {
    let store = f.open_log().await;
    assert!(data_after(&*store, "none", 0).await.is_empty());
}

/// Sequence numbers start above zero and increase in append order, within
/// one call and across calls.
pub async fn append_assigns_increasing_seqs(f: &dyn LogFixture) {
    let store = f.open_log().await;
    let first = append(&*store, "l", &[b"a", b"b", b"c"]).await;
    let second = append(&*store, "l", &[b"d"]).await;
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    assert_eq!(all.len(), 4);
    assert!(all[0] > 0, "sequence numbers start above 0");
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "not increasing: {all:?}"
    );
    let read = store.read_after(&key("l"), 0, 100).await.expect("read");
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), all);
    assert_eq!(
        read.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
    );
}

/// `read_after` excludes the given sequence number and honours the limit.
pub async fn read_after_is_exclusive_and_limited(f: &dyn LogFixture) {
    let store = f.open_log().await;
    let seqs = append(&*store, "l", &[b"0", b"1", b"2", b"3", b"4"]).await;
    let after_second = store
        .read_after(&key("l"), seqs[1], 100)
        .await
        .expect("read");
    assert_eq!(
        after_second.iter().map(|r| r.seq).collect::<Vec<_>>(),
        seqs[2..].to_vec(),
        "read_after must exclude the given record"
    );
    let limited = store.read_after(&key("l"), seqs[0], 2).await.expect("read");
    assert_eq!(
        limited.iter().map(|r| r.seq).collect::<Vec<_>>(),
        seqs[1..3].to_vec()
    );
    assert!(
        store
            .read_after(&key("l"), seqs[4], 100)
            .await
            .expect("read")
            .is_empty()
    );
}

/// Under 8 concurrent appenders, every record gets a distinct number, each
/// appender sees its own numbers increase, and the log reads back in number
/// order with every record present.
pub async fn concurrent_appends_strictly_increase(f: &dyn LogFixture) {
    const TASKS: usize = 8;
    const EACH: usize = 25;
    let store = f.open_log().await;
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let store = if t % 2 == 0 {
            Arc::clone(&store)
        } else {
            f.open_log().await
        };
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..EACH {
                let record = format!("{t}:{i}").into_bytes();
                let seqs = store
                    .append(&key("shared"), vec![record], None)
                    .await
                    .expect("append");
                mine.push(seqs[0]);
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        let mine = h.await.expect("task");
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "per-task order broken: {mine:?}"
        );
        all.extend(mine);
    }
    let read = store
        .read_after(&key("shared"), 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(read.len(), TASKS * EACH);
    assert!(
        read.windows(2).all(|w| w[0].seq < w[1].seq),
        "log not in seq order"
    );
    all.sort_unstable();
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), all);
}

/// Records of one log never show up in another.
pub async fn logs_are_independent(f: &dyn LogFixture) {
    let store = f.open_log().await;
    append(&*store, "stream/a", &[b"a1", b"a2"]).await;
    append(&*store, "stream/b", &[b"b1"]).await;
    append(&*store, "stream/a2", &[b"x"]).await;
    assert_eq!(
        data_after(&*store, "stream/a", 0).await,
        vec![b"a1".to_vec(), b"a2".to_vec()]
    );
    assert_eq!(
        data_after(&*store, "stream/b", 0).await,
        vec![b"b1".to_vec()]
    );
}

/// A log past its TTL reads as empty; another log is untouched.
pub async fn expired_log_reads_empty(f: &dyn LogFixture) {
    let ttl = Duration::from_millis(300);
    let store = f.open_log().await;
    let written = tokio::time::Instant::now();
    store
        .append(&key("short"), vec![b"x".to_vec()], Some(ttl))
        .await
        .expect("append");
    store
        .append(
            &key("long"),
            vec![b"y".to_vec()],
            Some(Duration::from_secs(600)),
        )
        .await
        .expect("append");
    let live = data_after(&*store, "short", 0).await;
    if written.elapsed() < ttl {
        assert_eq!(live.len(), 1, "a log within its TTL lost its record");
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        data_after(&*store, "short", 0).await.is_empty(),
        "expired log returned records"
    );
    assert_eq!(data_after(&*store, "long", 0).await, vec![b"y".to_vec()]);
    store.sweep_expired().await.expect("sweep");
    assert_eq!(data_after(&*store, "long", 0).await, vec![b"y".to_vec()]);
}

/// `trim` drops exactly the records below the bound; later appends still
/// get greater numbers.
pub async fn trim_drops_older_records(f: &dyn LogFixture) {
    let store = f.open_log().await;
    let seqs = append(&*store, "l", &[b"0", b"1", b"2", b"3"]).await;
    store.trim(&key("l"), seqs[2]).await.expect("trim");
    let left = store.read_after(&key("l"), 0, 100).await.expect("read");
    assert_eq!(
        left.iter().map(|r| r.seq).collect::<Vec<_>>(),
        seqs[2..].to_vec()
    );
    let next = append(&*store, "l", &[b"4"]).await;
    assert!(next[0] > seqs[3]);
    store
        .trim(&key("absent"), 10)
        .await
        .expect("trim of an absent log");
}

/// A deleted log reads as empty; deleting an absent log is fine.
pub async fn delete_log(f: &dyn LogFixture) {
    let store = f.open_log().await;
    append(&*store, "gone", &[b"a"]).await;
    append(&*store, "kept", &[b"b"]).await;
    store.delete_log(&key("gone")).await.expect("delete");
    store
        .delete_log(&key("never"))
        .await
        .expect("delete absent");
    assert!(data_after(&*store, "gone", 0).await.is_empty());
    assert_eq!(data_after(&*store, "kept", 0).await, vec![b"b".to_vec()]);
}

/// `wait_after` returns a record appended by another handle while it waits.
pub async fn wait_after_sees_later_append(f: &dyn LogFixture) {
    let reader = f.open_log().await;
    let writer = f.open_log().await;
    let first = append(&*writer, "tail", &[b"before"]).await;
    let waiting = tokio::spawn(async move {
        reader
            .wait_after(&key("tail"), first[0], 10, Duration::from_secs(10))
            .await
            .expect("wait")
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    append(&*writer, "tail", &[b"after"]).await;
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("wait_after did not return after an append")
        .expect("task");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, b"after");
}

/// `wait_after` with nothing new returns empty after its timeout.
pub async fn wait_after_times_out_empty(f: &dyn LogFixture) {
    let store = f.open_log().await;
    let seqs = append(&*store, "quiet", &[b"only"]).await;
    let got = store
        .wait_after(&key("quiet"), seqs[0], 10, Duration::from_millis(200))
        .await
        .expect("wait");
    assert!(got.is_empty());
}

/// Records of 1 MiB (or the backend's limit) round-trip byte for byte.
pub async fn large_records(f: &dyn LogFixture) {
    let store = f.open_log().await;
    let size = store.max_record_bytes().min(1024 * 1024);
    let record: Vec<u8> = (0..size).map(|i| (i * 13 % 251) as u8).collect();
    store
        .append(&key("big"), vec![record.clone(), b"small".to_vec()], None)
        .await
        .expect("append");
    assert_eq!(
        data_after(&*store, "big", 0).await,
        vec![record, b"small".to_vec()]
    );
}

/// Every acknowledged append is there, in order, after a reopen, and new
/// appends continue above the old numbers.
pub async fn reopen_keeps_acknowledged_appends(f: &dyn LogFixture) {
    let mut seqs = Vec::new();
    {
        let store = f.open_log().await;
        for i in 0..30u32 {
            seqs.extend(append(&*store, "durable", &[&i.to_be_bytes()]).await);
        }
    }
    let store = f.open_log().await;
    let read = store
        .read_after(&key("durable"), 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
    for (i, r) in read.iter().enumerate() {
        assert_eq!(r.data, (i as u32).to_be_bytes());
    }
    let next = append(&*store, "durable", &[b"more"]).await;
    assert!(next[0] > *seqs.last().expect("non-empty"));
}

/// Unsynced appends are committed like synced ones: numbered in one
/// sequence with them, readable through another handle at once, and kept
/// after a reopen (what a crash of the process leaves).
pub async fn unsynced_appends_are_committed(f: &dyn LogFixture) {
    let mut seqs = Vec::new();
    {
        let store = f.open_log().await;
        let other = f.open_log().await;
        for i in 0..20u32 {
            let data = vec![i.to_be_bytes().to_vec()];
            let got = if i % 3 == 0 {
                store.append(&key("written"), data, None).await
            } else {
                store.append_unsynced(&key("written"), data, None).await
            };
            seqs.extend(got.expect("append"));
            let seen = other
                .read_after(&key("written"), 0, usize::MAX)
                .await
                .expect("read");
            assert_eq!(seen.len(), seqs.len(), "not visible to another handle");
        }
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    let store = f.open_log().await;
    let read = store
        .read_after(&key("written"), 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
    for (i, r) in read.iter().enumerate() {
        assert_eq!(r.data, (i as u32).to_be_bytes());
    }
}

/// `next_seq`, on a backend that answers it, is the number the next append
/// gives: on a log never written, after appends, after a trim of every
/// record, after an expiry (swept or not) and after a delete. Asking writes
/// nothing. A backend that does not answer (`None`) never does.
pub async fn next_seq_is_the_next_appends_number(f: &dyn LogFixture) {
    async fn said_then_appended(store: &dyn LogStore, log: &str, ttl: Option<Duration>) {
        let said = store
            .next_seq(&key(log))
            .await
            .unwrap_or_else(|e| panic!("next_seq of {log:?} failed: {e}"))
            .unwrap_or_else(|| panic!("next_seq of {log:?} answered once, not again"));
        let again = store.next_seq(&key(log)).await.expect("next_seq");
        assert_eq!(again, Some(said), "asking moved the answer");
        let got = store
            .append(&key(log), vec![b"x".to_vec()], ttl)
            .await
            .expect("append");
        assert_eq!(got, vec![said], "{log}: said {said}, appended as {got:?}");
    }
    let store = f.open_log().await;
    if store
        .next_seq(&key("fresh"))
        .await
        .expect("next_seq")
        .is_none()
    {
        assert_eq!(store.next_seq(&key("other")).await.expect("next_seq"), None);
        return;
    }
    assert!(
        data_after(&*store, "fresh", 0).await.is_empty(),
        "asking wrote to the log"
    );
    said_then_appended(&*store, "fresh", None).await;
    append(&*store, "fresh", &[b"a", b"b", b"c"]).await;
    said_then_appended(&*store, "fresh", None).await;
    let last = append(&*store, "fresh", &[b"d"]).await[0];
    store.trim(&key("fresh"), last + 1).await.expect("trim");
    said_then_appended(&*store, "fresh", None).await;
    store.delete_log(&key("fresh")).await.expect("delete");
    said_then_appended(&*store, "fresh", None).await;

    let ttl = Some(Duration::from_millis(200));
    append(&*store, "short", &[b"a", b"b"]).await;
    said_then_appended(&*store, "short", ttl).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    said_then_appended(&*store, "short", ttl).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.sweep_expired().await.expect("sweep");
    said_then_appended(&*store, "short", None).await;
}
