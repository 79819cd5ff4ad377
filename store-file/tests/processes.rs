//! Crash safety and cross-process exclusion, proven with real processes.
//!
//! The tests start this same test binary again as a child (see
//! [`child_process`]), which works on a store directory and prints one line
//! per acknowledged write. The crash test kills it with SIGKILL at random
//! moments, then reopens the store and checks that every acknowledged write
//! is there and nothing is garbage.
//!
//! `MCP_PERSIST_FILE_CRASH_KILLS` (or `MCP_PERSIST_KILLS`, which the SQLite
//! crash test reads too) sets how many times the crash test kills its child
//! (default 200, what CI runs, a few seconds on a laptop). For a
//! longer hunt, run it alone:
//!
//! ```text
//! MCP_PERSIST_FILE_CRASH_KILLS=1000 cargo test -p mcp-persist-store-file \
//!     --test processes sigkill -- --nocapture
//! ```
//!
//! It prints its seed, the number of kills, the time taken and how many
//! torn tails it found and cut.

use mcp_persist_core::conformance::key;
use std::{
    io::{BufRead, BufReader},
    os::unix::process::ExitStatusExt,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

const ROLE_ENV: &str = "MCP_PERSIST_FILE_TEST_ROLE";
const DIR_ENV: &str = "MCP_PERSIST_FILE_TEST_DIR";
const TAG_ENV: &str = "MCP_PERSIST_FILE_TEST_TAG";
const COUNT_ENV: &str = "MCP_PERSIST_FILE_TEST_COUNT";

/// Kills in the crash test (see the module docs).
const KILLS_ENV: &str = "MCP_PERSIST_FILE_CRASH_KILLS";
/// The kill count every disk backend's crash test reads, when
/// [`KILLS_ENV`] is not set.
const SHARED_KILLS_ENV: &str = "MCP_PERSIST_KILLS";
/// Kills when neither variable is set: what CI runs.
const DEFAULT_KILLS: u32 = 200;

const BLOB_BYTES: usize = 64 * 1024;

/// Small segments, so crashes also hit segment creation.
fn options() -> FileStoreOptions {
    FileStoreOptions::default().segment_bytes(4096)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Not a test of its own: the body of the child processes the other tests
/// start. Without the role variable it returns at once.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let dir = std::env::var(DIR_ENV).expect("store directory");
    let tag = std::env::var(TAG_ENV).unwrap_or_default();
    runtime().block_on(async move {
        let store = FileStore::open_with(&dir, options()).await.expect("open");
        match role.as_str() {
            "crash" => crash_child(&store, &tag).await,
            "increment" => {
                let count: u64 = std::env::var(COUNT_ENV)
                    .expect("count")
                    .parse()
                    .expect("number");
                increment_child(&store, &tag, count).await;
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// Reads the counter under `key`, adds one with compare-and-swap, retrying
/// on conflict; returns the new value and how many conflicts it met.
async fn increment(store: &FileStore, key: &str) -> (u64, u64) {
    let mut conflicts = 0;
    loop {
        let (n, mode) = match store
            .get(&mcp_persist_core::conformance::key(key))
            .await
            .expect("get")
        {
            None => (0, PutMode::Create),
            Some(entry) => (
                std::str::from_utf8(&entry.value)
                    .expect("utf8")
                    .parse::<u64>()
                    .expect("number"),
                PutMode::Update(entry.version),
            ),
        };
        match store
            .put(
                &mcp_persist_core::conformance::key(key),
                (n + 1).to_string().into_bytes(),
                PutOptions::new(mode),
            )
            .await
        {
            Ok(_) => return (n + 1, conflicts),
            Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => conflicts += 1,
            Err(e) => panic!("increment failed: {e}"),
        }
    }
}

/// Loops CAS increments, a 64 KiB overwrite and log appends until killed,
/// printing each acknowledgement. Stops by itself after 30 s.
async fn crash_child(store: &FileStore, tag: &str) {
    let started = Instant::now();
    let mut j = 0u64;
    for i in 0u64.. {
        if started.elapsed() > Duration::from_secs(30) {
            return;
        }
        let (n, _) = increment(store, "counter").await;
        println!("ACK kv {n}");
        store
            .put(
                &key("blob"),
                vec![(n % 251) as u8; BLOB_BYTES],
                PutOptions::new(PutMode::Overwrite),
            )
            .await
            .expect("put blob");
        println!("ACK blob {n}");
        let batch = 1 + (i % 3);
        let records: Vec<Vec<u8>> = (j..j + batch)
            .map(|k| format!("{tag}:{k}").into_bytes())
            .collect();
        j += batch;
        let seqs = store
            .append(&key("log"), records.clone(), None)
            .await
            .expect("append");
        for (seq, data) in seqs.iter().zip(&records) {
            println!("ACK log {seq} {}", String::from_utf8_lossy(data));
        }
    }
}

/// `count` CAS increments of `shared`, each followed by an append to a
/// shared log; prints the conflicts met.
async fn increment_child(store: &FileStore, tag: &str, count: u64) {
    let mut conflicts = 0;
    for i in 0..count {
        conflicts += increment(store, "shared").await.1;
        store
            .append(
                &key("shared-log"),
                vec![format!("{tag}:{i}").into_bytes()],
                None,
            )
            .await
            .expect("append");
    }
    println!("DONE conflicts={conflicts}");
}

fn child(role: &str, dir: &Path, tag: &str, count: u64) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .env(TAG_ENV, tag)
        .env(COUNT_ENV, count.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start child")
}

/// A small deterministic generator; the seed is printed so a failing run
/// can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// How many kills a crash test makes (see the module docs).
fn kills() -> u32 {
    match std::env::var(KILLS_ENV).or_else(|_| std::env::var(SHARED_KILLS_ENV)) {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{KILLS_ENV}={v:?} is not a positive number")),
        Err(_) => DEFAULT_KILLS,
    }
}

/// A generator seeded from the clock, its seed printed.
fn seeded() -> Rng {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed}");
    Rng(seed)
}

/// Starts the crash child on `dir` and kills it with SIGKILL at a random
/// moment: half the time after a random number of acknowledgements (and a
/// random pause), otherwise after a random delay, possibly while it is
/// still starting up or opening the store. Returns what it acknowledged.
fn run_and_kill(dir: &Path, tag: &str, rng: &mut Rng, kill: u32) -> Acks {
    let mut proc = child("crash", dir, tag, 0);
    let stdout = proc.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find("ACK ") {
                // Only the parent may have gone; then stop quietly.
                let _ = tx.send(line[at + 4..].to_owned());
            }
        }
    });
    let mut lines = Vec::new();
    if rng.below(2) == 0 {
        let wanted = 1 + rng.below(30);
        for _ in 0..wanted {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        spin(Duration::from_micros(rng.below(3000)));
    } else {
        thread::sleep(Duration::from_millis(rng.below(60)));
    }
    proc.kill().expect("SIGKILL the child");
    let status = proc.wait().expect("reap the child");
    // It must die of the SIGKILL, not of a failure of its own first.
    assert_eq!(
        status.signal(),
        Some(9),
        "child {kill} ended otherwise: {status:?}"
    );
    reader.join().expect("reader thread");
    let mut acks = Acks::default();
    lines.extend(rx.try_iter());
    for line in lines {
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("kv"), Some(n), None) => acks.counter = Some(n.parse().expect("number")),
            (Some("blob"), Some(_), None) => {}
            (Some("log"), Some(seq), Some(data)) => {
                acks.log.push((seq.parse().expect("seq"), data.to_owned()));
            }
            _ => panic!("unexpected acknowledgement {line:?}"),
        }
    }
    acks
}

/// What a child acknowledged before it was killed.
#[derive(Default)]
struct Acks {
    counter: Option<u64>,
    log: Vec<(u64, String)>,
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let kills = kills();
    let mut rng = seeded();
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let rt = runtime();

    let mut counter = 0u64; // the value found after the last kill
    let mut log: Vec<(u64, String)> = Vec::new(); // the log found after the last kill
    let mut torn_tails_seen = 0;
    let started = Instant::now();
    for kill in 0..kills {
        let tag = format!("c{kill}");
        let acks = run_and_kill(&dir, &tag, &mut rng, kill);

        rt.block_on(async {
            let store = FileStore::open_with(&dir, options())
                .await
                .unwrap_or_else(|e| panic!("store does not open after kill {kill}: {e}"));
            // Every record parses; a torn log tail may be there, not yet cut.
            let before = store.verify().await.expect("verify");
            assert!(
                before.is_clean(),
                "after kill {kill}: {:?}",
                before.problems
            );
            if before.torn_tail_bytes > 0 {
                torn_tails_seen += 1;
            }

            // The counter is the last acknowledged value, or one more (the
            // write was committed but the child died before printing).
            let last_acked = acks.counter.unwrap_or(counter);
            let found = match store.get(&key("counter")).await.expect("get counter") {
                Some(entry) => std::str::from_utf8(&entry.value)
                    .expect("counter is utf8")
                    .parse::<u64>()
                    .expect("counter is a number"),
                None => 0,
            };
            assert!(
                found == last_acked || found == last_acked + 1,
                "after kill {kill}: counter is {found}, last acknowledged {last_acked}"
            );
            assert!(
                found >= counter,
                "after kill {kill}: counter went back from {counter} to {found}"
            );
            counter = found;
            if let Some(blob) = store.get(&key("blob")).await.expect("get blob") {
                assert_eq!(blob.value.len(), BLOB_BYTES, "after kill {kill}: blob size");
                assert!(
                    blob.value.iter().all(|b| *b == blob.value[0]),
                    "after kill {kill}: blob mixes two writes"
                );
            }

            // The log: what was there before, unchanged, then this child's
            // records: every acknowledged one, in order, then at most the one
            // batch it was appending when killed.
            let read = store
                .read_after(&key("log"), 0, usize::MAX)
                .await
                .expect("read log");
            let read: Vec<(u64, String)> = read
                .into_iter()
                .map(|r| {
                    (
                        r.seq,
                        String::from_utf8(r.data).expect("log record is utf8"),
                    )
                })
                .collect();
            assert!(
                read.windows(2).all(|w| w[0].0 < w[1].0),
                "after kill {kill}: seqs not increasing"
            );
            assert!(
                read.len() >= log.len() && read[..log.len()] == log[..],
                "after kill {kill}: earlier log records changed or vanished"
            );
            let new = &read[log.len()..];
            assert!(
                new.len() >= acks.log.len() && new[..acks.log.len()] == acks.log[..],
                "after kill {kill}: acknowledged appends missing: acked {:?}, found {:?}",
                acks.log,
                new
            );
            let unacked = &new[acks.log.len()..];
            assert!(
                unacked.len() <= 3,
                "after kill {kill}: more than one unacknowledged batch: {unacked:?}"
            );
            for (k, (_, data)) in new.iter().enumerate() {
                assert_eq!(
                    data,
                    &format!("{tag}:{k}"),
                    "after kill {kill}: unexpected record"
                );
            }
            log = read;

            // Touching the log cut any torn tail: nothing follows the last record.
            let after = store.verify().await.expect("verify");
            assert!(after.is_clean(), "after kill {kill}: {:?}", after.problems);
            assert_eq!(
                after.torn_tail_bytes, 0,
                "after kill {kill}: torn tail not cut"
            );
            assert_eq!(after.log_records, log.len() as u64);
        });
    }
    eprintln!(
        "{kills} kills in {:?}: counter at {counter}, {} log records, {torn_tails_seen} torn tails found and cut",
        started.elapsed(),
        log.len()
    );
    assert!(
        counter > 0 && !log.is_empty(),
        "the children never got to write"
    );
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

#[test]
fn the_numbering_mark_survives_sigkill() {
    // Kills at random moments, as above, with segments small enough that
    // the mark is raised every few kills. After each, a copy of the store
    // loses every log directory: the log must then refuse, and once set
    // aside go on above every number ever acknowledged.
    let kills = kills().div_ceil(4);
    let mut rng = seeded();
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let rt = runtime();
    let mut highest = 0u64;
    let mut raised = 0;
    let mut last_mark = None;
    for kill in 0..kills {
        let acks = run_and_kill(&dir, &format!("m{kill}"), &mut rng, kill);
        highest = acks.log.iter().map(|(seq, _)| *seq).fold(highest, u64::max);
        if !dir.join("log").is_dir() {
            continue; // killed before the store was laid out
        }
        let mark = std::fs::read_dir(dir.join("mark"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| std::fs::read(e.path()).expect("read mark"));
        if mark.is_some() && mark != last_mark {
            raised += 1;
            last_mark = mark;
        }
        let copy = tmp.path().join(format!("copy-{kill}"));
        copy_tree(&dir, &copy);
        std::fs::remove_dir_all(copy.join("log")).expect("delete the logs");
        std::fs::create_dir(copy.join("log")).expect("recreate the log root");
        rt.block_on(async {
            let store = FileStore::open_with(&copy, options())
                .await
                .unwrap_or_else(|e| panic!("copy does not open after kill {kill}: {e}"));
            if highest > 0 {
                let refused = store.append(&key("log"), vec![b"x".to_vec()], None).await;
                assert!(
                    matches!(refused, Err(Error::Corrupt { .. })),
                    "after kill {kill}: a log that handed out up to {highest} went on \
                     without its files: {refused:?}"
                );
            }
            store.quarantine_log("log").await.expect("quarantine");
            let next = store
                .append(&key("log"), vec![b"x".to_vec()], None)
                .await
                .expect("append")[0];
            assert!(
                next > highest,
                "after kill {kill}: {next} reuses a number up to {highest}"
            );
        });
        std::fs::remove_dir_all(&copy).expect("remove copy");
    }
    eprintln!(
        "{kills} kills: numbers up to {highest} acknowledged, the mark changed {raised} times"
    );
    assert!(highest > 0, "the children never got to append");
    if kills >= 20 {
        assert!(raised > 1, "the mark was never raised");
    }
}

fn spin(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
