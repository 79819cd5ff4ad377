//! Throughput of `FileStore` beside raw file operations measured in the same
//! run, on the same disk: what the crash-safety and locking cost on top of
//! the fsyncs they cannot avoid.
//!
//! ```text
//! cargo bench -p mcp-persist-store-file --bench bench_file
//! ```
//!
//! Works in a temporary directory under `MCP_PERSIST_BENCH_DIR` if set, else
//! under the system temp directory (which should be a real disk, not tmpfs,
//! for the numbers to mean anything). Runs well under a minute.
//!
//! Every row ends in an `aim:` line: the least ratio to its raw baseline
//! aimed at, and whether this run met it. `bound:` lines give what a bare
//! `spawn_blocking` doing the raw work costs, the most a store whose every
//! file operation runs on tokio's blocking pool can reach; gets of small
//! records and appends written in place by the calling task (see
//! `FileStoreOptions::appends_on_caller`, measured off on its own line)
//! skip it.

use mcp_persist_core::conformance::key;
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use mcp_persist_core::{KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::{FileStore, FileStoreOptions};

/// Time spent on each side of a comparison at most.
const BUDGET: Duration = Duration::from_millis(2400);
/// Slices each side's budget is cut into; the two sides take turns, so a
/// disk that slows down or speeds up during the run affects both alike.
const SLICES: u32 = 6;
/// Operations per side at most.
const MAX_OPS: u64 = 200_000;
const VALUE_BYTES: usize = 256;
const BATCH: usize = 100;
/// Logs appended to at once in the concurrent comparison.
const STREAMS: usize = 64;

/// Runs `ours` and `raw` in alternating slices until each has spent its
/// budget or count; returns both rates in operations per second.
fn compare(
    mut ours: impl FnMut() -> Result<()>,
    mut raw: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let slice = BUDGET / SLICES;
    let (mut ours_n, mut ours_t) = (0u64, Duration::ZERO);
    let (mut raw_n, mut raw_t) = (0u64, Duration::ZERO);
    for _ in 0..SLICES {
        for (op, n, t) in [
            (
                &mut ours as &mut dyn FnMut() -> Result<()>,
                &mut ours_n,
                &mut ours_t,
            ),
            (
                &mut raw as &mut dyn FnMut() -> Result<()>,
                &mut raw_n,
                &mut raw_t,
            ),
        ] {
            let start = Instant::now();
            let limit = MAX_OPS / u64::from(SLICES);
            let mut done = 0;
            while done < limit && start.elapsed() < slice {
                op()?;
                done += 1;
            }
            *n += done;
            *t += start.elapsed();
        }
    }
    Ok((
        ours_n as f64 / ours_t.as_secs_f64(),
        raw_n as f64 / raw_t.as_secs_f64(),
    ))
}

/// Cache flushes the disk holding `dir` has completed so far (Linux block
/// statistics, the 16th field), or `None` where they cannot be read.
fn disk_flushes(dir: &Path) -> Option<u64> {
    let dev = fs::metadata(dir).ok()?.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let mut sys = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("partition").exists() {
        // Flushes are counted on the whole disk.
        sys = sys.join("..");
    }
    let stat = fs::read_to_string(sys.join("stat")).ok()?;
    stat.split_whitespace().nth(15)?.parse().ok()
}

/// Rates (records per second) and disk flushes per record of one side of
/// the concurrent comparison.
#[derive(Default)]
struct Side {
    records: u64,
    time: Duration,
    flushes: Option<u64>,
}

impl Side {
    fn add(&mut self, records: u64, time: Duration, flushes: Option<u64>) {
        self.records += records;
        self.time += time;
        self.flushes = match (self.records == records, self.flushes, flushes) {
            (true, _, f) => f,
            (false, Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.time.as_secs_f64()
    }

    fn flushes_per_record(&self) -> String {
        match self.flushes {
            Some(f) if self.records > 0 => format!("{:.3}", f as f64 / self.records as f64),
            _ => "n/a".into(),
        }
    }
}

/// Appends to `STREAMS` logs at once for a slice, each log from its own
/// task; returns how many records went in.
fn our_slice(
    rt: &tokio::runtime::Runtime,
    store: &FileStore,
    value: &[u8],
    slice: Duration,
) -> Result<u64> {
    let start = Instant::now();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..STREAMS {
            let store = store.clone();
            let value = value.to_vec();
            tasks.spawn(async move {
                let log = format!("bench/stream-{i}");
                let mut n = 0u64;
                while start.elapsed() < slice {
                    store
                        .append(
                            &mcp_persist_core::conformance::key(&log),
                            vec![value.clone()],
                            None,
                        )
                        .await?;
                    n += 1;
                }
                anyhow::Ok(n)
            });
        }
        let mut total = 0;
        while let Some(n) = tasks.join_next().await {
            total += n??;
        }
        Ok(total)
    })
}

/// The raw side: `STREAMS` threads, each writing and fdatasyncing its own
/// file, for a slice; returns how many records went in.
fn raw_slice(files: &mut [File], frame: &[u8], slice: Duration) -> Result<u64> {
    let start = Instant::now();
    std::thread::scope(|scope| {
        let threads: Vec<_> = files
            .iter_mut()
            .map(|file| {
                scope.spawn(move || -> Result<u64> {
                    let mut n = 0u64;
                    while start.elapsed() < slice {
                        file.write_all(frame)?;
                        file.sync_data()?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("appender thread"))
            .sum()
    })
}

/// `STREAMS` tasks, each handing a write and an fdatasync of its own file
/// to a bare `spawn_blocking`, for a slice: what the blocking pool alone
/// costs an append. Returns how many records went in.
fn bare_slice(
    rt: &tokio::runtime::Runtime,
    files: &[std::sync::Arc<File>],
    frame: &[u8],
    slice: Duration,
) -> Result<u64> {
    let start = Instant::now();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for file in files {
            let (file, frame) = (std::sync::Arc::clone(file), frame.to_vec());
            tasks.spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < slice {
                    let (file, frame) = (std::sync::Arc::clone(&file), frame.clone());
                    tokio::task::spawn_blocking(move || {
                        (&*file).write_all(&frame)?;
                        file.sync_data()
                    })
                    .await??;
                    n += 1;
                }
                anyhow::Ok(n)
            });
        }
        let mut total = 0;
        while let Some(n) = tasks.join_next().await {
            total += n??;
        }
        Ok(total)
    })
}

/// Measures `f` (which returns a record count) with the disk's flushes.
fn measured(dir: &Path, f: impl FnOnce() -> Result<u64>) -> Result<(u64, Duration, Option<u64>)> {
    let flushes = disk_flushes(dir);
    let start = Instant::now();
    let records = f()?;
    let time = start.elapsed();
    let flushes = flushes
        .zip(disk_flushes(dir))
        .map(|(a, b)| b.saturating_sub(a));
    Ok((records, time, flushes))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// The raw crash-safe replace: write a temp file, fsync, rename.
fn raw_replace(dir: &Path, value: &[u8], dir_fsync: bool) -> Result<()> {
    let tmp = dir.join("tmp");
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(value)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join("record"))?;
    if dir_fsync {
        sync_dir(dir)?;
    }
    Ok(())
}

struct Row {
    what: &'static str,
    ours: f64,
    raw: f64,
    baseline: &'static str,
    /// The least ratio to the raw baseline aimed at.
    aim: f64,
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    let base = std::env::var_os("MCP_PERSIST_BENCH_DIR")
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::tempdir_in(&base).context("creating the benchmark directory")?;
    let raw_dir = tmp.path().join("raw");
    fs::create_dir(&raw_dir)?;
    let store = rt.block_on(FileStore::open(tmp.path().join("store")))?;
    let value = vec![7u8; VALUE_BYTES];
    let mut rows = Vec::new();
    // Reference figures: what a bare `spawn_blocking` costs the same work.
    let mut bounds = Vec::new();

    // Key-value puts: a compare-and-swap update each time, against the raw
    // replace without and with the directory fsync our puts also do.
    let mut version = rt.block_on(store.put(
        &key("bench/key"),
        value.clone(),
        PutOptions::new(PutMode::Create),
    ))?;
    let mut put = || -> Result<()> {
        version = rt.block_on(store.put(
            &key("bench/key"),
            value.clone(),
            PutOptions::new(PutMode::Update(version)),
        ))?;
        Ok(())
    };
    for (dir_fsync, baseline) in [
        (false, "write+fsync+rename"),
        (true, "write+fsync+rename+dir fsync"),
    ] {
        let (ours, raw) = compare(&mut put, || raw_replace(&raw_dir, &value, dir_fsync))?;
        rows.push(Row {
            what: "kv put (CAS update, 256 B)",
            ours,
            raw,
            baseline,
            // A put syncs the directory too: about half of the baseline
            // without that sync, all of the one with it.
            aim: if dir_fsync { 0.8 } else { 0.4 },
        });
    }
    // An unsynced put (`PutOptions::unsynced`, a durable server's kept
    // answers) skips the directory fsync: the raw replace without it.
    let mut put_unsynced = || -> Result<()> {
        version = rt.block_on(store.put(
            &key("bench/key"),
            value.clone(),
            PutOptions::new(PutMode::Update(version)).unsynced(),
        ))?;
        Ok(())
    };
    let (ours, raw) = compare(&mut put_unsynced, || raw_replace(&raw_dir, &value, false))?;
    rows.push(Row {
        what: "kv put, unsynced (CAS update, 256 B)",
        ours,
        raw,
        baseline: "write+fsync+rename",
        aim: 0.8,
    });

    // Key-value gets.
    let (ours, raw) = compare(
        || {
            std::hint::black_box(
                rt.block_on(store.get(&key("bench/key")))?
                    .context("present")?,
            );
            Ok(())
        },
        || {
            std::hint::black_box(fs::read(raw_dir.join("record"))?);
            Ok(())
        },
    )?;
    rows.push(Row {
        what: "kv get (256 B)",
        ours,
        raw,
        baseline: "read whole file",
        aim: 0.5,
    });
    // What the blocking pool alone costs a read: the bound of a get that
    // cannot be served from memory at once.
    let read_path = raw_dir.join("record");
    let (bare, raw) = compare(
        || {
            let path = read_path.clone();
            std::hint::black_box(
                rt.block_on(async { tokio::task::spawn_blocking(move || fs::read(path)).await })??,
            );
            Ok(())
        },
        || {
            std::hint::black_box(fs::read(raw_dir.join("record"))?);
            Ok(())
        },
    )?;
    bounds.push(format!(
        "a bare spawn_blocking reading the whole file: {:.0}/s, {:.2} of reading it at once",
        bare,
        bare / raw
    ));

    // Log appends, one record at a time, then in batches (records per second).
    let mut raw_log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(raw_dir.join("log"))?;
    let frame = vec![1u8; VALUE_BYTES + 24];
    let (ours, raw) = compare(
        || {
            rt.block_on(store.append(&key("bench/log"), vec![value.clone()], None))?;
            Ok(())
        },
        || {
            raw_log.write_all(&frame)?;
            raw_log.sync_data()?;
            Ok(())
        },
    )?;
    rows.push(Row {
        what: "log append, 1 record (256 B)",
        ours,
        raw,
        baseline: "append+fdatasync",
        aim: 0.8,
    });
    // What the blocking pool alone costs an append: the same write and
    // fdatasync on a pool thread, awaited from the caller's side.
    let bare_log = std::sync::Arc::new(
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(raw_dir.join("bare-log"))?,
    );
    let (bare, raw) = compare(
        || {
            let (file, frame) = (std::sync::Arc::clone(&bare_log), frame.clone());
            rt.block_on(async {
                tokio::task::spawn_blocking(move || {
                    (&*file).write_all(&frame)?;
                    file.sync_data()
                })
                .await
            })??;
            Ok(())
        },
        || {
            raw_log.write_all(&frame)?;
            raw_log.sync_data()?;
            Ok(())
        },
    )?;
    bounds.push(format!(
        "a bare spawn_blocking doing one append+fdatasync: {:.0}/s, {:.2} of doing it at once",
        bare,
        bare / raw
    ));
    // The first append to a new log each time: directory, segment and
    // numbering mark, against a file created whole the crash-safe way.
    let mut new_logs = 0u64;
    let (ours, raw) = compare(
        || {
            new_logs += 1;
            rt.block_on(store.append(
                &key(format!("bench/new-{new_logs}")),
                vec![value.clone()],
                None,
            ))?;
            Ok(())
        },
        || raw_replace(&raw_dir, &frame, true),
    )?;
    rows.push(Row {
        what: "log append, 1 record to a new log",
        ours,
        raw,
        baseline: "write+fsync+rename+dir fsync",
        // The segment and the numbering mark: two such writes.
        aim: 0.4,
    });
    let frames = frame.repeat(BATCH);
    let (ours, raw) = compare(
        || {
            rt.block_on(store.append(&key("bench/batched"), vec![value.clone(); BATCH], None))?;
            Ok(())
        },
        || {
            raw_log.write_all(&frames)?;
            raw_log.sync_data()?;
            Ok(())
        },
    )?;
    rows.push(Row {
        what: "log append, batches of 100 (records/s)",
        ours: ours * BATCH as f64,
        raw: raw * BATCH as f64,
        baseline: "one write+fdatasync per batch",
        aim: 0.8,
    });

    // Many logs at once, with and without group commit, beside threads
    // that each write and fdatasync their own file; slices alternate.
    let grouped = &store;
    let ungrouped = rt.block_on(FileStore::open_with(
        tmp.path().join("store-ungrouped"),
        FileStoreOptions::default().group_commit(false),
    ))?;
    // The default store with every append on the blocking pool, to show
    // what writing in place on the calling task saves.
    let pooled = rt.block_on(FileStore::open_with(
        tmp.path().join("store-pooled"),
        FileStoreOptions::default().appends_on_caller(false),
    ))?;
    let mut raw_files = (0..STREAMS)
        .map(|i| {
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(raw_dir.join(format!("log-{i}")))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let (mut with_group, mut without_group, mut pooled_side, mut raw_side, mut bare_side) = (
        Side::default(),
        Side::default(),
        Side::default(),
        Side::default(),
        Side::default(),
    );
    let slice = BUDGET / SLICES;
    let bare_files: Vec<std::sync::Arc<File>> = (0..STREAMS)
        .map(|i| {
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(raw_dir.join(format!("bare-{i}")))
                .map(std::sync::Arc::new)
        })
        .collect::<std::io::Result<_>>()?;
    for _ in 0..SLICES {
        let (n, t, f) = measured(tmp.path(), || our_slice(&rt, grouped, &value, slice))?;
        with_group.add(n, t, f);
        let (n, t, f) = measured(tmp.path(), || our_slice(&rt, &ungrouped, &value, slice))?;
        without_group.add(n, t, f);
        let (n, t, f) = measured(tmp.path(), || our_slice(&rt, &pooled, &value, slice))?;
        pooled_side.add(n, t, f);
        let (n, t, f) = measured(tmp.path(), || raw_slice(&mut raw_files, &frame, slice))?;
        raw_side.add(n, t, f);
        let (n, t, f) = measured(tmp.path(), || bare_slice(&rt, &bare_files, &frame, slice))?;
        bare_side.add(n, t, f);
    }
    for (what, side) in [
        ("log append, 64 logs at once", &with_group),
        ("  the same, group commit off", &without_group),
    ] {
        rows.push(Row {
            what,
            ours: side.rate(),
            raw: raw_side.rate(),
            baseline: "64 threads, each append+fdatasync",
            aim: 0.8,
        });
    }
    let on_the_pool = format!(
        "64 logs at once with appends_on_caller off (every append on the blocking pool): {:.0}/s, {:.2} of the raw threads",
        pooled_side.rate(),
        pooled_side.rate() / raw_side.rate()
    );
    bounds.push(format!(
        "64 tasks, each a bare spawn_blocking doing append+fdatasync: {:.0}/s, {:.2} of the raw threads",
        bare_side.rate(),
        bare_side.rate() / raw_side.rate()
    ));

    println!(
        "{:<40} {:>12} {:>12} {:>7}  raw baseline (same run, same disk)",
        "operation", "file ops/s", "raw ops/s", "ratio"
    );
    for row in &rows {
        println!(
            "{:<40} {:>12.0} {:>12.0} {:>7.2}  {}",
            row.what,
            row.ours,
            row.raw,
            row.ours / row.raw,
            row.baseline
        );
    }
    println!(
        "disk cache flushes per record, 64 logs at once: group commit {}, group commit off {}, raw threads {}",
        with_group.flushes_per_record(),
        without_group.flushes_per_record(),
        raw_side.flushes_per_record(),
    );
    println!("{on_the_pool}");
    for bound in &bounds {
        println!("bound: {bound}");
    }
    for row in &rows {
        let ratio = row.ours / row.raw;
        println!(
            "aim: {}, at least {:.2} of {}: {ratio:.2} ({})",
            row.what.trim_start(),
            row.aim,
            row.baseline,
            if ratio >= row.aim { "met" } else { "not met" }
        );
    }
    println!(
        "note: fsync latency depends on the disk's journal commits and other writers; \
         both sides take turns, but compare ratios over a few runs"
    );
    Ok(())
}
