//! The crash suite: writers killed with SIGKILL at random instants, and two
//! processes racing on one key, each in a child process of the test binary.
//!
//! A backend gets it from [`backend_conformance!`](crate::backend_conformance!): the macro
//! stamps a `crash_child` test that, when started by the suite with
//! [`ROLE_VAR`] set, runs the child's loop instead of returning, and the
//! tests below that start it. The child opens the store at the same
//! [`Place`] the parent chose, so a backend's open closure is all the suite
//! needs.
//!
//! `MCP_PERSIST_KILLS` sets how many times the SIGKILL test kills a writer
//! (default [`DEFAULT_KILLS`], or what the backend's invocation says). A longer run by hand, for one backend:
//!
//! ```text
//! MCP_PERSIST_KILLS=1000 cargo test -p mcp-persist-store-sqlite --release \
//!     --test conformance sigkill -- --nocapture
//! ```

use std::{
    collections::{BTreeMap, hash_map::RandomState},
    future::Future,
    hash::{BuildHasher, Hasher},
    io::{BufRead, BufReader},
    path::PathBuf,
    pin::Pin,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use super::key;
use crate::{Error, KvStore, LogStore, PutMode, PutOptions};

/// Which child loop a re-executed test binary runs (`crash` or `increment`).
pub const ROLE_VAR: &str = "MCP_PERSIST_CONFORMANCE_ROLE";
const DIR_VAR: &str = "MCP_PERSIST_CONFORMANCE_DIR";
const NAME_VAR: &str = "MCP_PERSIST_CONFORMANCE_NAME";

/// How many kills the SIGKILL test does unless `MCP_PERSIST_KILLS` says.
pub const DEFAULT_KILLS: u32 = 200;
const KILLS_VAR: &str = "MCP_PERSIST_KILLS";

const COUNTER: &str = "crash/counter";
const SHARED_COUNTER: &str = "crash/shared-counter";
const LOGS: u64 = 4;
const INCREMENTS: u64 = 100;
const INCREMENTS_VAR: &str = "MCP_PERSIST_CONFORMANCE_INCREMENTS";
const INCREMENT_TASKS: u64 = 4;
/// How many rounds of eight simultaneous first opens.
pub const OPEN_ROUNDS: usize = 20;

/// Where one test's store lives: a fresh folder (removed when the
/// [`PlaceGuard`] drops) and a unique name, for backends that put stores on
/// a server (a key prefix, a schema, a table).
#[derive(Debug, Clone)]
pub struct Place {
    /// A fresh, empty folder of this test's own.
    pub dir: PathBuf,
    /// A name no other test of this run uses: ASCII letters, digits and `_`,
    /// starting with a letter, at most 40 characters.
    pub name: String,
}

/// Removes a [`Place`]'s folder when dropped (the parent's, not a child's).
#[derive(Debug)]
pub struct PlaceGuard(PathBuf);

impl Drop for PlaceGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Place {
    /// A new place: a folder under the system's temporary folder and a name.
    pub fn fresh() -> (Place, PlaceGuard) {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let salt = RandomState::new().build_hasher().finish() & 0xff_ffff;
        let name = format!("t{}_{n}_{salt:x}", std::process::id());
        let dir = std::env::temp_dir().join(format!("mcp-persist-conformance-{name}"));
        std::fs::create_dir_all(&dir).expect("create the test's folder");
        (
            Place {
                dir: dir.clone(),
                name,
            },
            PlaceGuard(dir),
        )
    }

    /// The place a parent handed to this child process, if this is one.
    fn of_child() -> Option<(String, Place)> {
        let role = std::env::var(ROLE_VAR).ok()?;
        let dir = std::env::var_os(DIR_VAR)?.into();
        let name = std::env::var(NAME_VAR).ok()?;
        Some((role, Place { dir, name }))
    }
}

/// A store as the suite uses it: a key-value half, and a log half when the
/// backend has one.
#[derive(Clone)]
pub struct Opened {
    /// The key-value half.
    pub kv: Arc<dyn KvStore>,
    /// The log half, if any.
    pub log: Option<Arc<dyn LogStore>>,
}

impl Opened {
    /// A backend with both halves.
    pub fn both<S: KvStore + LogStore>(store: S) -> Opened {
        let store = Arc::new(store);
        Opened {
            kv: store.clone(),
            log: Some(store),
        }
    }

    /// A key-value-only backend.
    pub fn kv<S: KvStore>(store: S) -> Opened {
        Opened {
            kv: Arc::new(store),
            log: None,
        }
    }
}

/// How the suite opens (and reopens) a backend at a place.
pub type Opener = Arc<dyn Fn(Place) -> Pin<Box<dyn Future<Output = Opened> + Send>> + Send + Sync>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A small random source without a dependency.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Rng(RandomState::new().build_hasher().finish() | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Runs the child's loop when this process is a child the suite started,
/// and returns whether it was (the `crash_child` test then returns).
pub fn child_main(open: &Opener) -> bool {
    let Some((role, place)) = Place::of_child() else {
        return false;
    };
    // A failure in any task must end the child at once, visibly: the parent
    // checks that the child died of its SIGKILL and of nothing else.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("conformance child failed: {info}");
        std::process::abort();
    }));
    let rt = runtime();
    match role.as_str() {
        "crash" => rt.block_on(crash_loop(open(place))),
        "increment" => {
            let increments = std::env::var(INCREMENTS_VAR)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(INCREMENTS);
            rt.block_on(increment_loop(open(place), increments));
        }
        "open" => open_child(&rt, open, place),
        other => panic!("unknown child role {other:?}"),
    }
    true
}

async fn crash_loop(opened: impl Future<Output = Opened>) {
    let store = opened.await;
    {
        let kv = store.kv.clone();
        tokio::spawn(async move {
            let counter = key(COUNTER);
            loop {
                let current = kv.get(&counter).await.expect("get the counter");
                let (n, mode) = match &current {
                    Some(entry) => (parse_counter(&entry.value), PutMode::Update(entry.version)),
                    None => (0, PutMode::Create),
                };
                // Every other put may skip its sync: acknowledged, it
                // survives the process's crash all the same.
                let options = PutOptions::new(mode);
                let options = if n % 2 == 1 {
                    options.unsynced()
                } else {
                    options
                };
                kv.put(&counter, (n + 1).to_string().into_bytes(), options)
                    .await
                    .expect("only this task writes the counter");
                println!("ACK kv {}", n + 1);
            }
        });
    }
    if let Some(log) = &store.log {
        for t in 0..LOGS {
            let log = log.clone();
            tokio::spawn(async move {
                let name = key(format!("crash/log-{t}"));
                let existing = log
                    .read_after(&name, 0, usize::MAX)
                    .await
                    .expect("read log");
                let mut n = existing.last().map_or(0, |r| parse_record(t, &r.data));
                let mut rng = Rng::new();
                loop {
                    let count = 1 + rng.below(3);
                    let records: Vec<Vec<u8>> = (1..=count)
                        .map(|i| format!("{t}:{}", n + i).into_bytes())
                        .collect();
                    // Odd logs append unsynced: committed before return too.
                    let seqs = if t % 2 == 0 {
                        log.append(&name, records, None).await
                    } else {
                        log.append_unsynced(&name, records, None).await
                    }
                    .expect("append");
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
    }
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
    counter: u64,
    /// The counter found by the last check: a child killed between a commit
    /// and its acknowledgement leaves one increment unacknowledged.
    found: u64,
    logs: BTreeMap<u64, BTreeMap<u64, u64>>,
}

impl Acks {
    fn record(&mut self, line: &str) {
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

    /// Opens the store as a fresh process would and checks that nothing
    /// acknowledged is missing and nothing unreadable is there.
    async fn check(&mut self, store: Opened, kill: u32) {
        let counter = store
            .kv
            .get(&key(COUNTER))
            .await
            .unwrap_or_else(|e| panic!("counter unreadable after kill {kill}: {e}"))
            .map_or(0, |entry| parse_counter(&entry.value));
        let floor = self.counter.max(self.found);
        assert!(
            counter == floor || counter == floor + 1,
            "after kill {kill}: counter is {counter}, last acknowledged {}, found before {}",
            self.counter,
            self.found
        );
        self.found = counter;
        let Some(log) = &store.log else {
            return;
        };
        for t in 0..LOGS {
            let records = log
                .read_after(&key(format!("crash/log-{t}")), 0, usize::MAX)
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

/// The kill count: `MCP_PERSIST_KILLS` if set, else `default`.
pub fn kills(default: u32) -> u32 {
    match std::env::var(KILLS_VAR) {
        Ok(n) => n
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{KILLS_VAR}={n:?} is not a positive integer")),
        Err(std::env::VarError::NotPresent) => default,
        Err(e) => panic!("{KILLS_VAR}: {e}"),
    }
}

/// Starts this test binary again as a child running `child_test` in `role`
/// at `place`.
fn spawn_child(child_test: &str, role: &str, place: &Place) -> Child {
    spawn_command(child_test, role, place)
        .spawn()
        .expect("spawn the child process")
}

fn spawn_command(child_test: &str, role: &str, place: &Place) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("path of the test binary"));
    cmd.args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .env(DIR_VAR, &place.dir)
        .env(NAME_VAR, &place.name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// The name libtest knows a test by, from its `module_path!()` and name: the
/// module path without the crate's name.
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{test}"),
        None => test.to_owned(),
    }
}

fn assert_killed(status: std::process::ExitStatus) {
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
}

/// A writer (one task incrementing a counter by compare-and-swap, its puts
/// synced and unsynced in turn, four appending to their own logs, synced
/// and unsynced) is killed with SIGKILL
/// at a random instant, [`kills`] times (`default_kills` unless
/// `MCP_PERSIST_KILLS` says); after each kill the store, opened afresh,
/// holds every acknowledged write, in order, and nothing unreadable.
pub fn sigkill_loses_no_acknowledged_write(open: &Opener, child_test: &str, default_kills: u32) {
    const BUDGET_PER_KILL: Duration = Duration::from_millis(3000);
    let kills = kills(default_kills);
    let budget = BUDGET_PER_KILL * kills;
    let (place, _guard) = Place::fresh();
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
        let mut child = spawn_child(child_test, "crash", &place);
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
        assert_killed(status);
        reader.join().expect("stdout reader");
        for line in lines.try_iter() {
            acks.record(&line);
        }
        let store = rt.block_on(open(place.clone()));
        rt.block_on(acks.check(store, kill));
    }
    assert!(
        acks.counter > 0,
        "no counter increment was ever acknowledged"
    );
    let appended: usize = acks.logs.values().map(BTreeMap::len).sum();
    eprintln!(
        "{kills} kills in {:?}: counter at {}, {appended} acknowledged log records, all present",
        started.elapsed(),
        acks.counter
    );
}

async fn increment_loop(opened: impl Future<Output = Opened>, increments: u64) {
    let store = opened.await;
    let mut tasks = Vec::new();
    for _ in 0..INCREMENT_TASKS {
        let kv = store.kv.clone();
        tasks.push(tokio::spawn(async move {
            let counter = key(SHARED_COUNTER);
            let mut done = 0;
            while done < increments {
                let current = kv.get(&counter).await.expect("get");
                let (n, mode) = match &current {
                    Some(entry) => (parse_counter(&entry.value), PutMode::Update(entry.version)),
                    None => (0, PutMode::Create),
                };
                match kv
                    .put(
                        &counter,
                        (n + 1).to_string().into_bytes(),
                        PutOptions::new(mode),
                    )
                    .await
                {
                    Ok(_) => done += 1,
                    Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => {}
                    Err(e) => panic!("increment failed: {e}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("increment task");
    }
    println!("DONE");
}

/// Two processes, four tasks each, increment one key by compare-and-swap
/// (`increments` times per task, at most 100); the key ends at exactly the
/// number of increments.
pub fn two_processes_increment_exact(open: &Opener, child_test: &str, increments: u64) {
    let increments = increments.clamp(1, INCREMENTS);
    let (place, _guard) = Place::fresh();
    let children: Vec<Child> = (0..2)
        .map(|_| {
            let mut cmd = spawn_command(child_test, "increment", &place);
            cmd.env(INCREMENTS_VAR, increments.to_string());
            cmd.spawn().expect("spawn the child process")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait for the child");
        assert!(
            out.status.success(),
            "an incrementing child failed: {}",
            out.status
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("DONE"),
            "an incrementing child did not finish"
        );
    }
    let rt = runtime();
    let store = rt.block_on(open(place));
    let value = rt
        .block_on(store.kv.get(&key(SHARED_COUNTER)))
        .expect("read the counter")
        .map(|e| parse_counter(&e.value));
    assert_eq!(value, Some(2 * INCREMENT_TASKS * increments));
}

/// The child of [`processes_open_one_new_store_at_once`]: waits for the start
/// file, opens the store, writes its own key, prints `OPENED`.
fn open_child(rt: &tokio::runtime::Runtime, open: &Opener, place: Place) {
    let go = place.dir.join("go");
    println!("READY");
    let waiting = Instant::now();
    while !go.exists() {
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "no start signal"
        );
        thread::sleep(Duration::from_micros(500));
    }
    rt.block_on(async {
        let store = open(place).await;
        let mine = key(format!("opened/{}", std::process::id()));
        store
            .kv
            .put(&mine, b"1".to_vec(), PutOptions::new(PutMode::Create))
            .await
            .expect("a freshly opened store takes a write");
    });
    println!("OPENED");
}

/// Eight processes open one store that does not exist yet at the same
/// instant, [`OPEN_ROUNDS`] times: every one of them comes up and writes
/// (creation and migration are safe against each other).
pub fn processes_open_one_new_store_at_once(open: &Opener, child_test: &str) {
    const PROCESSES: usize = 8;
    let rt = runtime();
    for round in 0..OPEN_ROUNDS {
        let (place, _guard) = Place::fresh();
        let mut children: Vec<Child> = (0..PROCESSES)
            .map(|_| spawn_child(child_test, "open", &place))
            .collect();
        let mut outputs: Vec<BufReader<std::process::ChildStdout>> = children
            .iter_mut()
            .map(|child| BufReader::new(child.stdout.take().expect("piped stdout")))
            .collect();
        for out in &mut outputs {
            let mut line = String::new();
            while !line.contains("READY") {
                line.clear();
                let n = out.read_line(&mut line).expect("child output");
                assert!(n > 0, "round {round}: a child ended before it was ready");
            }
        }
        std::fs::write(place.dir.join("go"), b"").expect("start file");
        for (child, out) in children.iter_mut().zip(&mut outputs) {
            let mut rest = String::new();
            std::io::Read::read_to_string(out, &mut rest).expect("child output");
            let status = child.wait().expect("reap the child");
            assert!(
                status.success() && rest.contains("OPENED"),
                "round {round}: a process failed to open a new store beside seven others: {status}"
            );
        }
        let store = rt.block_on(open(place));
        let opened = rt
            .block_on(store.kv.list("opened/"))
            .expect("list what the processes wrote");
        assert_eq!(
            opened.len(),
            PROCESSES,
            "round {round}: every process wrote its key"
        );
    }
}
