//! Claims that need more than one process: acknowledged writes survive
//! SIGKILL at any instant, and compare-and-swap is exact across processes.
//!
//! The test binary re-executes itself as the child process: with the
//! environment variable [`CHILD_ROLE`] set, a test runs the child's loop
//! instead of the parent's checks.
//!
//! `MCP_PERSIST_KILLS` sets how many times the SIGKILL test kills a writer
//! (default [`DEFAULT_KILLS`], what CI runs; each kill takes well under a
//! second). A longer run by hand:
//!
//! ```text
//! MCP_PERSIST_KILLS=1000 cargo test -p mcp-persist-store-sqlite --release \
//!     --test processes sigkill -- --nocapture
//! ```

use std::{
    collections::{BTreeMap, hash_map::RandomState},
    hash::{BuildHasher, Hasher},
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use mcp_persist_core::{Error, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_sqlite::SqliteStore;

/// Which child loop to run (`crash` or `increment`).
const CHILD_ROLE: &str = "MCP_PERSIST_SQLITE_CHILD_ROLE";
/// The database file the child opens.
const CHILD_DB: &str = "MCP_PERSIST_SQLITE_CHILD_DB";

const COUNTER: &str = "crash/counter";
const LOGS: u64 = 4;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Starts this test binary again as a child running `test` in `role`.
fn spawn_child(test: &str, role: &str, db: &Path) -> Child {
    Command::new(std::env::current_exe().expect("path of the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_DB, db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child process")
}

/// Which role this process plays for `role`: `Some(db)` in a child.
fn child_db(role: &str) -> Option<String> {
    match std::env::var(CHILD_ROLE) {
        Ok(r) if r == role => Some(std::env::var(CHILD_DB).expect("child database path")),
        _ => None,
    }
}

/// A small random source without a dependency: seeded by the standard
/// library's per-process random hasher keys.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Rng(RandomState::new().build_hasher().finish() | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

// ---------------------------------------------------------------------------
// SIGKILL at random instants

/// The child: one task increments a counter by compare-and-swap, four tasks
/// append to their own logs (one to three records per call, so that group
/// commit and multi-record appends are both in flight when the kill lands).
/// Every acknowledgement is printed only after the call returned `Ok`.
async fn crash_child(db: String) {
    // A failure in any task must end the child at once, visibly (the parent
    // checks that the child died of its SIGKILL and of nothing else).
    std::panic::set_hook(Box::new(|info| {
        eprintln!("crash child failed: {info}");
        std::process::abort();
    }));
    let store = SqliteStore::open(&db).await.expect("child opens the store");
    {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                let current = store.get(COUNTER).await.expect("get counter");
                let (n, mode) = match &current {
                    Some(entry) => (parse_counter(&entry.value), PutMode::Update(entry.version)),
                    None => (0, PutMode::Create),
                };
                store
                    .put(
                        COUNTER,
                        (n + 1).to_string().into_bytes(),
                        PutOptions::new(mode),
                    )
                    .await
                    .expect("only this task writes the counter");
                println!("ACK kv {}", n + 1);
            }
        });
    }
    for t in 0..LOGS {
        let store = store.clone();
        tokio::spawn(async move {
            let log = format!("crash/log-{t}");
            let existing = store
                .read_after(&log, 0, usize::MAX)
                .await
                .expect("read log");
            let mut n = existing.last().map_or(0, |r| parse_record(t, &r.data));
            let mut rng = Rng::new();
            loop {
                let count = 1 + rng.below(3);
                let records: Vec<Vec<u8>> = (1..=count)
                    .map(|i| format!("{t}:{}", n + i).into_bytes())
                    .collect();
                let seqs = store.append(&log, records, None).await.expect("append");
                let pairs: Vec<String> = seqs
                    .iter()
                    .zip(1..)
                    .map(|(seq, i)| format!("{seq}:{}", n + i))
                    .collect();
                n += count;
                println!("ACK log {t} {}", pairs.join(" "));
            }
        });
    }
    // Runs until the parent kills it.
    std::future::pending::<()>().await;
}

fn parse_counter(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("counter value {value:?} does not parse"))
}

/// A log record is `t:n`; anything else is garbage.
fn parse_record(t: u64, data: &[u8]) -> u64 {
    let text = std::str::from_utf8(data).unwrap_or_else(|_| panic!("record {data:?} is not text"));
    let (owner, n) = text
        .split_once(':')
        .unwrap_or_else(|| panic!("record {text:?} is not t:n"));
    assert_eq!(
        owner,
        t.to_string(),
        "record {text:?} in the log of task {t}"
    );
    n.parse()
        .unwrap_or_else(|_| panic!("record {text:?} has no number"))
}

/// What the parent has seen acknowledged so far.
#[derive(Default)]
struct Acks {
    /// The last counter value acknowledged.
    counter: u64,
    /// The counter value found by the last check: a child killed between a
    /// commit and its acknowledgement leaves one increment unacknowledged,
    /// and the next child counts on from it.
    found: u64,
    /// Per log: acknowledged sequence number -> record number.
    logs: BTreeMap<u64, BTreeMap<u64, u64>>,
}

impl Acks {
    fn record(&mut self, line: &str) {
        // The test harness may have printed the test's name before the first
        // acknowledgement, on the same line.
        let Some(start) = line.find("ACK ") else {
            return;
        };
        let mut words = line[start..].split_whitespace();
        match (words.next(), words.next()) {
            (Some("ACK"), Some("kv")) => {
                let n: u64 = words.next().and_then(|w| w.parse().ok()).expect("kv ack");
                assert!(
                    n > self.counter,
                    "counter acknowledged {n} after {}",
                    self.counter
                );
                self.counter = n;
            }
            (Some("ACK"), Some("log")) => {
                let t: u64 = words.next().and_then(|w| w.parse().ok()).expect("log ack");
                let log = self.logs.entry(t).or_default();
                for pair in words {
                    let (seq, n) = pair.split_once(':').expect("seq:n");
                    log.insert(seq.parse().expect("seq"), n.parse().expect("n"));
                }
            }
            _ => {}
        }
    }

    /// Opens the database as a fresh process would and checks that nothing
    /// acknowledged is missing and nothing unreadable is there.
    async fn check(&mut self, db: &Path, kill: u32) {
        let store = SqliteStore::open(db)
            .await
            .unwrap_or_else(|e| panic!("database does not open after kill {kill}: {e}"));
        let counter = store
            .get(COUNTER)
            .await
            .unwrap_or_else(|e| panic!("counter unreadable after kill {kill}: {e}"))
            .map_or(0, |entry| parse_counter(&entry.value));
        // Nothing acknowledged is lost, and at most the one increment in
        // flight when the kill landed was committed without acknowledgement.
        let floor = self.counter.max(self.found);
        assert!(
            counter == floor || counter == floor + 1,
            "after kill {kill}: counter is {counter}, last acknowledged {}, found before {}",
            self.counter,
            self.found
        );
        self.found = counter;
        for t in 0..LOGS {
            let records = store
                .read_after(&format!("crash/log-{t}"), 0, usize::MAX)
                .await
                .unwrap_or_else(|e| panic!("log {t} unreadable after kill {kill}: {e}"));
            let mut stored = BTreeMap::new();
            let mut previous: Option<(u64, u64)> = None;
            for record in &records {
                let n = parse_record(t, &record.data);
                if let Some((seq, m)) = previous {
                    assert!(record.seq > seq, "log {t}: sequence numbers not increasing");
                    assert_eq!(n, m + 1, "log {t}: record {n} follows {m}");
                }
                previous = Some((record.seq, n));
                stored.insert(record.seq, n);
            }
            for (seq, n) in self.logs.get(&t).into_iter().flatten() {
                assert_eq!(
                    stored.get(seq),
                    Some(n),
                    "after kill {kill}: acknowledged record {t}:{n} at seq {seq} is missing"
                );
            }
        }
    }
}

/// How many kills the SIGKILL test does unless `MCP_PERSIST_KILLS` says.
const DEFAULT_KILLS: u32 = 200;
/// The environment variable that overrides [`DEFAULT_KILLS`].
const KILLS_VAR: &str = "MCP_PERSIST_KILLS";

/// The kill count: `MCP_PERSIST_KILLS` if set (a positive integer), else
/// [`DEFAULT_KILLS`].
fn kills() -> u32 {
    match std::env::var(KILLS_VAR) {
        Ok(n) => n
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{KILLS_VAR}={n:?} is not a positive integer")),
        Err(std::env::VarError::NotPresent) => DEFAULT_KILLS,
        Err(e) => panic!("{KILLS_VAR}: {e}"),
    }
}

#[test]
fn sigkill_loses_no_acknowledged_write() {
    // A kill takes well under a second; the budget only stops a hung run.
    const BUDGET_PER_KILL: Duration = Duration::from_millis(1200);
    if let Some(db) = child_db("crash") {
        runtime().block_on(crash_child(db));
        return;
    }
    let kills = kills();
    let budget = BUDGET_PER_KILL * kills;
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("crash.db");
    let rt = runtime();
    let mut acks = Acks::default();
    let mut rng = Rng::new();
    let started = Instant::now();
    for kill in 1..=kills {
        assert!(
            started.elapsed() < budget,
            "only {} kills within {budget:?}",
            kill - 1
        );
        let mut child = spawn_child("sigkill_loses_no_acknowledged_write", "crash", &db);
        let stdout = child.stdout.take().expect("piped stdout");
        let (lines_tx, lines) = mpsc::channel::<String>();
        let reader = thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match stdout.read_line(&mut line) {
                    // A line cut short by the kill is not an acknowledgement.
                    Ok(0) | Err(_) => break,
                    Ok(_) if !line.ends_with('\n') => break,
                    Ok(_) => {
                        if lines_tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        // Kill at a random instant after the child has started acknowledging.
        let first = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("the child acknowledged nothing within a minute");
            if line.contains("ACK ") {
                break line;
            }
        };
        acks.record(&first);
        thread::sleep(Duration::from_micros(rng.below(25_000)));
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "the child died of something else: {status}"
            );
        }
        assert!(!status.success(), "the child exited on its own: {status}");
        reader.join().expect("stdout reader");
        for line in lines.try_iter() {
            acks.record(&line);
        }
        rt.block_on(acks.check(&db, kill));
    }
    assert!(
        acks.counter > 0,
        "no counter increment was ever acknowledged"
    );
    let raw = rusqlite::Connection::open(&db).expect("open with plain SQLite");
    let integrity: String = raw
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check");
    assert_eq!(integrity, "ok", "SQLite finds the file damaged");
    let appended: usize = acks.logs.values().map(BTreeMap::len).sum();
    eprintln!(
        "{kills} kills in {:?}: counter at {}, {appended} acknowledged log records, all present",
        started.elapsed(),
        acks.counter
    );
}

// ---------------------------------------------------------------------------
// Two processes, one counter

const SHARED_COUNTER: &str = "shared/counter";
const INCREMENTS: u64 = 160;
const TASKS: u64 = 4;

/// One read-modify-write increment; `false` when another writer got there first.
async fn increment(store: &SqliteStore) -> bool {
    let current = store.get(SHARED_COUNTER).await.expect("get");
    let (n, mode) = match &current {
        Some(entry) => (parse_counter(&entry.value), PutMode::Update(entry.version)),
        None => (0, PutMode::Create),
    };
    match store
        .put(
            SHARED_COUNTER,
            (n + 1).to_string().into_bytes(),
            PutOptions::new(mode),
        )
        .await
    {
        Ok(_) => true,
        Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => false,
        Err(e) => panic!("increment failed: {e}"),
    }
}

/// The child: `INCREMENTS` read-modify-write increments from `TASKS` tasks,
/// retrying conflicts.
/// Both children open the database while it does not exist yet, so they also
/// race to create the file, migrate the schema and create the counter.
async fn increment_child(db: String) {
    let store = SqliteStore::open(&db).await.expect("child opens the store");
    // Start incrementing together with the other child.
    println!("READY");
    tokio::task::spawn_blocking(|| {
        let mut go = String::new();
        std::io::stdin()
            .read_line(&mut go)
            .expect("wait for the start");
    })
    .await
    .expect("start signal");
    // Several tasks per process: their writes share transactions, and each
    // compare-and-swap races the other tasks and the other process.
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut conflicts = 0u64;
                for _ in 0..INCREMENTS / TASKS {
                    while !increment(&store).await {
                        conflicts += 1;
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.expect("increment task");
    }
    println!("DONE conflicts={conflicts}");
}

#[test]
fn two_processes_incrementing_end_exact() {
    const BUDGET: Duration = Duration::from_secs(180);
    if let Some(db) = child_db("increment") {
        runtime().block_on(increment_child(db));
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("shared.db");
    let rt = runtime();
    let mut children: Vec<Child> = (0..2)
        .map(|_| spawn_child("two_processes_incrementing_end_exact", "increment", &db))
        .collect();
    // Both children open the fresh database at once; once both are ready,
    // they start incrementing at the same moment.
    let mut outputs: Vec<BufReader<std::process::ChildStdout>> = children
        .iter_mut()
        .map(|child| BufReader::new(child.stdout.take().expect("piped stdout")))
        .collect();
    for out in &mut outputs {
        let mut line = String::new();
        while !line.contains("READY") {
            line.clear();
            let n = out.read_line(&mut line).expect("child output");
            assert!(n > 0, "a child ended before it was ready");
        }
    }
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("piped stdin");
        std::io::Write::write_all(stdin, b"GO\n").expect("start the child");
    }
    let started = Instant::now();
    for (child, out) in children.iter_mut().zip(&mut outputs) {
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll the child") {
                break status;
            }
            if started.elapsed() > BUDGET {
                let _ = child.kill();
                panic!("the incrementing children did not finish within {BUDGET:?}");
            }
            thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        std::io::Read::read_to_string(out, &mut rest).expect("child output");
        assert!(status.success(), "a child failed: {status}");
        let done = rest
            .find("DONE")
            .map(|at| rest[at..].lines().next().unwrap_or_default())
            .expect("a child did not finish its increments");
        eprintln!("child: {done}");
    }
    let total = rt.block_on(async {
        let store = SqliteStore::open(&db).await.expect("reopen");
        let entry = store
            .get(SHARED_COUNTER)
            .await
            .expect("get")
            .expect("present");
        parse_counter(&entry.value)
    });
    assert_eq!(
        total,
        2 * INCREMENTS,
        "two processes x {INCREMENTS} increments"
    );
}

// ---------------------------------------------------------------------------
// Many processes opening one new store at the same instant

/// The file whose appearance starts every waiting child of a round at once.
const CHILD_GO: &str = "MCP_PERSIST_SQLITE_CHILD_GO";

/// The child: waits for the start file, opens the store, writes its own key.
/// Prints `OPENED` on success; anything else fails the process.
fn open_child(db: String) {
    let go = std::env::var(CHILD_GO).expect("start file path");
    println!("READY");
    let waiting = Instant::now();
    while !Path::new(&go).exists() {
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "no start signal"
        );
        thread::sleep(Duration::from_micros(500));
    }
    runtime().block_on(async {
        let store = match SqliteStore::open(&db).await {
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
        store.close().await.expect("close");
    });
    println!("OPENED");
}

#[test]
fn eight_processes_open_one_new_store_at_once() {
    const PROCESSES: usize = 8;
    const ROUNDS: usize = 50;
    const TEST: &str = "eight_processes_open_one_new_store_at_once";
    if let Some(db) = child_db("open") {
        open_child(db);
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let db = dir.path().join(format!("round-{round}.db"));
        let go = dir.path().join(format!("go-{round}"));
        let mut children: Vec<Child> = (0..PROCESSES)
            .map(|_| {
                Command::new(std::env::current_exe().expect("path of the test binary"))
                    .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                    .env(CHILD_ROLE, "open")
                    .env(CHILD_DB, &db)
                    .env(CHILD_GO, &go)
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
            std::io::Read::read_to_string(out, &mut rest).expect("child output");
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
        let opened = runtime().block_on(async {
            let store = SqliteStore::open(&db).await.expect("reopen");
            store.list("opened/").await.expect("list").len()
        });
        if failures.is_empty() {
            assert_eq!(
                opened, PROCESSES,
                "round {round}: every child wrote its key"
            );
        }
    }
    eprintln!(
        "{ROUNDS} rounds of {PROCESSES} processes opening one new store in {:?}",
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
