//! A durable Redis (`appendonly yes`, `appendfsync always`) is killed with
//! SIGKILL while writers are busy, then started again on the same folder:
//! while it is down every operation fails with `Unavailable` (and returns),
//! afterwards the same store works without being rebuilt, and no write that
//! was acknowledged is lost.

mod common;

use mcp_persist_core::conformance::key;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_redis::RedisStore;

const WRITERS: usize = 4;
/// Each writer stops after this many attempts, whatever happens.
const MAX_ATTEMPTS: usize = 20_000;
/// Acknowledged writes to wait for before the kill.
const ACKED_BEFORE_KILL: usize = 400;
/// Operations tried while the server is down.
const PROBES_WHILE_DOWN: usize = 20;
/// A generous bound on any one operation: a hang is a failure, not a slow pass.
const NO_HANG: Duration = Duration::from_secs(60);

/// The `redis-server` binary: `MCP_PERSIST_REDIS_SERVER_BIN`, else `PATH`.
fn server_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("MCP_PERSIST_REDIS_SERVER_BIN") {
        return Some(PathBuf::from(bin));
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            !common::under_ci(),
            "redis-server is not installed and MCP_PERSIST_REDIS_SERVER_BIN is not set; \
             under CI this test must run (start it with `cargo xtask test`)"
        );
        eprintln!("notice: redis-server not found; skipping (run `cargo xtask test`)");
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A durable `redis-server` child process.
struct DurableRedis {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl DurableRedis {
    fn start(bin: &Path, dir: &Path, port: u16) -> DurableRedis {
        let mut server = DurableRedis {
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            port,
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits (bounded) until the server answers PING with PONG, which it
    /// does only once its append-only file is loaded.
    fn wait_ready(&mut self) {
        for _ in 0..1500 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server exited with {status}:\n{log}");
            }
            let pong = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                s.write_all(b"PING\r\n")?;
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line)?;
                Ok(line)
            });
            if pong.is_ok_and(|line| line.starts_with("+PONG")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} never answered PING", self.port);
    }

    /// Sends a signal by name (`STOP`, `CONT`) to the running server.
    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("the server runs").id();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid} failed");
    }

    /// SIGKILL: no shutdown, no final fsync.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("reap redis-server");
        }
    }
}

impl Drop for DurableRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Default)]
struct Acked {
    /// Key → value of every acknowledged `put`.
    kv: BTreeMap<String, Vec<u8>>,
    /// Sequence number → record of every acknowledged append.
    log: BTreeMap<u64, Vec<u8>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_writes_loses_no_acknowledged_write() {
    let Some(bin) = server_bin() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let mut server = DurableRedis::start(&bin, dir.path(), port);

    let store = RedisStore::standalone(format!("redis://127.0.0.1:{port}/"))
        .operation_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the durable server");

    let acked = Arc::new(Mutex::new(Acked::default()));
    let acked_count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let unexpected = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, acked, acked_count, stop, unexpected) = (
            store.clone(),
            Arc::clone(&acked),
            Arc::clone(&acked_count),
            Arc::clone(&stop),
            Arc::clone(&unexpected),
        );
        writers.push(tokio::spawn(async move {
            for i in 0..MAX_ATTEMPTS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let key = format!("w{w}/{i}");
                let value = format!("value {w}/{i}").into_bytes();
                // Every attempt writes a new key and a new record, so an
                // attempt whose outcome was unknown never collides later.
                let outcome = if i % 2 == 0 {
                    tokio::time::timeout(
                        NO_HANG,
                        store.put(
                            &mcp_persist_core::conformance::key(&key),
                            value.clone(),
                            PutOptions::new(PutMode::Create),
                        ),
                    )
                    .await
                    .map(|r| {
                        r.map(|_| acked.lock().expect("lock").kv.insert(key, value))
                            .map(drop)
                    })
                } else {
                    tokio::time::timeout(
                        NO_HANG,
                        store.append(
                            &mcp_persist_core::conformance::key("events"),
                            vec![value.clone()],
                            Some(Duration::from_secs(3600)),
                        ),
                    )
                    .await
                    .map(|r| {
                        r.map(|seqs| {
                            acked.lock().expect("lock").log.insert(seqs[0], value);
                        })
                    })
                };
                match outcome {
                    Ok(Ok(())) => {
                        acked_count.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(Error::Unavailable { .. })) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Ok(Err(e)) => unexpected.lock().expect("lock").push(format!("{e:?}")),
                    Err(_) => unexpected
                        .lock()
                        .expect("lock")
                        .push("an operation hung".to_owned()),
                }
            }
        }));
    }

    // A tail leaves an idle dedicated connection behind, which the kill
    // will break.
    let quiet = store
        .wait_after(&key("quiet"), 0, 10, Duration::from_millis(50))
        .await
        .expect("tail before the kill");
    assert!(quiet.is_empty());

    // Kill the server in the middle of the write loop.
    for _ in 0..6000 {
        if acked_count.load(Ordering::Relaxed) >= ACKED_BEFORE_KILL {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        acked_count.load(Ordering::Relaxed) >= ACKED_BEFORE_KILL,
        "the writers made no progress before the kill"
    );
    server.kill();

    // While it is down, every operation fails, typed, and returns.
    for i in 0..PROBES_WHILE_DOWN {
        let got = tokio::time::timeout(NO_HANG, store.get(&key(format!("w0/{i}"))))
            .await
            .expect("an operation on a dead server must return, not hang");
        assert!(
            matches!(got, Err(Error::Unavailable { .. })),
            "a dead server must give Unavailable, got {got:?}"
        );
        let appended = tokio::time::timeout(
            NO_HANG,
            store.append(&key("probe"), vec![b"x".to_vec()], None),
        )
        .await
        .expect("an append on a dead server must return, not hang");
        assert!(
            matches!(appended, Err(Error::Unavailable { .. })),
            "a dead server must give Unavailable, got {appended:?}"
        );
    }
    let err = store
        .get(&key("w0/0"))
        .await
        .expect_err("the server is down");
    let message = err.to_string();
    assert!(
        message.contains("unreachable"),
        "the error must say so: {message}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );

    // Start it again on the same folder: the same store recovers by itself.
    server.spawn();
    let mut recovered = false;
    for _ in 0..600 {
        match store.get(&key("w0/0")).await {
            Ok(_) => {
                recovered = true;
                break;
            }
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("unexpected error after the restart: {e:?}"),
        }
    }
    assert!(
        recovered,
        "the store did not work again after the server came back"
    );
    let quiet = store
        .wait_after(&key("quiet"), 0, 10, Duration::from_millis(50))
        .await
        .expect("tails work again too, without rebuilding the store");
    assert!(quiet.is_empty());

    // Let the writers make progress on the restarted server, then stop them.
    let before = acked_count.load(Ordering::Relaxed);
    for _ in 0..6000 {
        if acked_count.load(Ordering::Relaxed) >= before + 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer task");
    }
    let unexpected = unexpected.lock().expect("lock").clone();
    assert!(
        unexpected.is_empty(),
        "errors other than Unavailable: {unexpected:?}"
    );
    assert!(
        acked_count.load(Ordering::Relaxed) > before,
        "the writers made no progress after the restart"
    );

    // Nothing acknowledged is lost: not before the kill, not after.
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    for (key, value) in &acked.kv {
        let entry = store
            .get(&mcp_persist_core::conformance::key(key))
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("acknowledged put of {key} was lost"));
        assert_eq!(&entry.value, value, "value of {key}");
    }
    let log = store
        .read_after(&key("events"), 0, usize::MAX)
        .await
        .expect("read log");
    let stored: BTreeMap<u64, Vec<u8>> = log.into_iter().map(|r| (r.seq, r.data)).collect();
    for (seq, record) in &acked.log {
        assert_eq!(
            stored.get(seq),
            Some(record),
            "acknowledged append {seq} was lost or changed"
        );
    }
    let next = store
        .append(&key("events"), vec![b"after".to_vec()], None)
        .await
        .expect("append after the restart");
    let last_acked = acked.log.keys().next_back().copied().unwrap_or(0);
    assert!(
        next[0] > last_acked,
        "sequence numbers went back after the restart"
    );
    eprintln!(
        "checked {} acknowledged puts and {} acknowledged appends across the kill",
        acked.kv.len(),
        acked.log.len()
    );
}

/// A server that stops answering (SIGSTOP) leaves the connection open, so
/// only the store's own timeout can end an operation: every kind of append,
/// and reads and writes of records, fail with `Unavailable` within the
/// operation timeout, and the same store works again once the server goes on
/// (SIGCONT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_fails_operations_in_time() {
    let Some(bin) = server_bin() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = DurableRedis::start(&bin, dir.path(), free_port());
    let timeout = Duration::from_millis(400);
    let store = RedisStore::standalone(format!("redis://127.0.0.1:{}/", server.port))
        .operation_timeout(timeout)
        .connect()
        .await
        .expect("connect");
    let ttl = Some(Duration::from_secs(600));
    // A first append with a TTL sets the log's expiry, so the next one is a
    // single `XADD` and not the script: both paths are tried below.
    store
        .append(&key("events"), vec![b"0".to_vec()], ttl)
        .await
        .expect("append before the stop");

    server.signal("STOP");
    let started = std::time::Instant::now();
    let outcomes = [
        (
            "append, one record",
            store
                .append(&key("events"), vec![b"a".to_vec()], None)
                .await
                .err(),
        ),
        (
            "append, one record, fresh TTL",
            store
                .append(&key("events"), vec![b"b".to_vec()], ttl)
                .await
                .err(),
        ),
        (
            "append, two records",
            store
                .append(&key("events"), vec![b"c".to_vec(), b"d".to_vec()], ttl)
                .await
                .err(),
        ),
        ("get", store.get(&key("k")).await.err()),
        (
            "put",
            store
                .put(
                    &key("k"),
                    b"v".to_vec(),
                    PutOptions::new(PutMode::Overwrite),
                )
                .await
                .err(),
        ),
    ];
    let elapsed = started.elapsed();
    server.signal("CONT");
    for (what, outcome) in outcomes {
        assert!(
            matches!(outcome, Some(Error::Unavailable { .. })),
            "{what} on a stopped server must give Unavailable, got {outcome:?}"
        );
    }
    // Five operations one after another, each bounded by the timeout; the
    // margin is for a busy machine.
    assert!(
        elapsed < timeout * 5 + Duration::from_secs(2),
        "five operations took {elapsed:?} with a timeout of {timeout:?} each"
    );

    // The same store goes on once the server does.
    let mut appended = None;
    for _ in 0..100 {
        match store.append(&key("events"), vec![b"e".to_vec()], ttl).await {
            Ok(seqs) => {
                appended = Some(seqs);
                break;
            }
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("unexpected error after SIGCONT: {e:?}"),
        }
    }
    let seqs = appended.expect("the store did not work again after the server went on");
    let records = store
        .read_after(&key("events"), 0, 100)
        .await
        .expect("read");
    assert_eq!(
        records.last().map(|r| (r.seq, r.data.clone())),
        Some((seqs[0], b"e".to_vec())),
        "the append after the pause is the last record"
    );
}
