//! The server stopped with `pg_ctl stop -m immediate` (a crash: no
//! checkpoint, the WAL is replayed at the next start) while 64 appenders
//! and a compare-and-swap writer run, then started again. Every
//! acknowledged write is there afterwards, the clients got typed errors
//! meanwhile, and the same store works again once the server is back: no
//! reopening, no restart of the process.

mod common;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use mcp_persist_core::{Error, Key, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_postgres::PostgresStore;

/// Per log: the acknowledged (sequence number, record) pairs.
type Acked = BTreeMap<u64, Vec<(u64, Vec<u8>)>>;

const APPENDERS: u64 = 64;
const LOGS: u64 = 8;

fn key(text: &str) -> Key {
    Key::new(text).expect("valid key")
}

/// Only the transient kinds are acceptable while the server is down.
fn assert_typed(e: &Error) {
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Timeout { .. }),
        "not a typed unavailability: {e:?}"
    );
}

fn acked_total(acked: &Mutex<Acked>) -> usize {
    acked.lock().expect("lock").values().map(Vec::len).sum()
}

/// Polls `done` until it holds; fails after a minute, naming `what`.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "waited a minute for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn immediate_stop_loses_no_acknowledged_write() {
    let server = common::OwnServer::start();
    let store = PostgresStore::builder(&server.url())
        .schema("outage")
        .operation_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");

    // A tailing reader, to see the listener come back too.
    let quiet = store
        .append(&key("tail"), vec![b"0".to_vec()], None)
        .await
        .expect("append");
    let _ = store
        .wait_after(&key("tail"), quiet[0], 10, Duration::from_millis(10))
        .await
        .expect("wait");

    let acked: Arc<Mutex<Acked>> = Arc::default();
    let errors = Arc::new(AtomicU64::new(0));
    let restarted = Arc::new(AtomicBool::new(false));
    let recovered = Arc::new(AtomicU64::new(0));
    // Appenders that have seen the server down: the outage lasts until
    // every one of them has, so each meets it, however the machine is loaded.
    let saw_down = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..APPENDERS {
        let (store, acked, errors, restarted, recovered, saw_down, stop) = (
            store.clone(),
            acked.clone(),
            errors.clone(),
            restarted.clone(),
            recovered.clone(),
            saw_down.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let log = key(&format!("log-{}", t % LOGS));
            let mut n = 0u64;
            let mut counted = false;
            let mut down = false;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let data = format!("{t}:{n}").into_bytes();
                let result = if n.is_multiple_of(2) {
                    store.append(&log, vec![data.clone()], None).await
                } else {
                    store.append_unsynced(&log, vec![data.clone()], None).await
                };
                match result {
                    Ok(seqs) => {
                        // An unsynced append is kept through a crash of the
                        // writer, not of the server: only synced ones count.
                        if n.is_multiple_of(2) {
                            acked
                                .lock()
                                .expect("lock")
                                .entry(t % LOGS)
                                .or_default()
                                .push((seqs[0], data));
                        }
                        if restarted.load(Ordering::Relaxed) && !counted {
                            counted = true;
                            recovered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        assert_typed(&e);
                        errors.fetch_add(1, Ordering::Relaxed);
                        if !down {
                            down = true;
                            saw_down.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }));
    }
    // A compare-and-swap writer beside them.
    let counter = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let k = key("counter");
            let mut acked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let current = match store.get(&k).await {
                    Ok(c) => c,
                    Err(e) => {
                        assert_typed(&e);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let (n, mode) = match &current {
                    Some(e) => (
                        std::str::from_utf8(&e.value)
                            .expect("utf8")
                            .parse::<u64>()
                            .expect("n"),
                        PutMode::Update(e.version),
                    ),
                    None => (0, PutMode::Create),
                };
                match store
                    .put(&k, (n + 1).to_string().into_bytes(), PutOptions::new(mode))
                    .await
                {
                    Ok(_) => acked = n + 1,
                    // An in-doubt write (the reply lost in the crash) may
                    // have landed: the next compare-and-swap sees it.
                    Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => {}
                    Err(e) => {
                        assert_typed(&e);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            acked
        })
    };

    // Writes acknowledged before the stop.
    wait_for("writes before the stop", || {
        acked_total(&acked) >= 2 * APPENDERS as usize
    })
    .await;
    server.crash();
    wait_for("every appender to see the server down", || {
        saw_down.load(Ordering::Relaxed) == APPENDERS
    })
    .await;
    server.up();
    restarted.store(true, Ordering::Relaxed);
    let started = Instant::now();
    while recovered.load(Ordering::Relaxed) < APPENDERS {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "only {} of {APPENDERS} appenders recovered within a minute",
            recovered.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few more writes each after the recovery, then stop.
    let so_far = acked_total(&acked);
    wait_for("writes after the recovery", || {
        acked_total(&acked) >= so_far + APPENDERS as usize
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("appender");
    }
    let counter_acked = counter.await.expect("counter");
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "no appender saw the server down"
    );

    // Every acknowledged record, by the same store.
    let acked = acked.lock().expect("lock").clone();
    let mut total = 0;
    for (l, records) in &acked {
        let stored: BTreeMap<u64, Vec<u8>> = store
            .read_after(&key(&format!("log-{l}")), 0, usize::MAX)
            .await
            .expect("read")
            .into_iter()
            .map(|r| (r.seq, r.data))
            .collect();
        for (seq, data) in records {
            assert_eq!(
                stored.get(seq),
                Some(data),
                "acknowledged record {} at seq {seq} of log-{l} is missing",
                String::from_utf8_lossy(data)
            );
            total += 1;
        }
    }
    let counter = store.get(&key("counter")).await.expect("get").map(|e| {
        std::str::from_utf8(&e.value)
            .expect("utf8")
            .parse::<u64>()
            .expect("n")
    });
    assert!(counter.unwrap_or(0) >= counter_acked, "counter went back");

    // The listener came back: a wait is woken by an append, well before
    // its timeout.
    let waited = Instant::now();
    while !store.is_listening() {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the listener did not come back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = store.read_after(&key("tail"), 0, 100).await.expect("read");
    let after = last.last().map_or(0, |r| r.seq);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_after(&key("tail"), after, 10, Duration::from_secs(30))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let woke = Instant::now();
    store
        .append(&key("tail"), vec![b"1".to_vec()], None)
        .await
        .expect("append");
    let got = waiting.await.expect("task").expect("wait");
    assert_eq!(got.len(), 1);
    assert!(woke.elapsed() < Duration::from_secs(5));
    eprintln!(
        "{total} acknowledged synced appends all present, {} errors during the outage, \
         counter at {counter:?} (acknowledged {counter_acked}), group commit {:?}",
        errors.load(Ordering::Relaxed),
        store.write_stats()
    );
}
