//! Throughput of `FileStore` beside raw file operations measured in the same
//! run, on the same disk: what the crash-safety and locking cost on top of
//! the fsyncs they cannot avoid.
//!
//! ```text
//! cargo run --release -p mcp-persist-store-file --example bench_file
//! ```
//!
//! Works in a temporary directory under `MCP_PERSIST_BENCH_DIR` if set, else
//! under the system temp directory (which should be a real disk, not tmpfs,
//! for the numbers to mean anything). Runs well under a minute.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use mcp_persist_core::{KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::FileStore;

/// Time spent on each side of a comparison at most.
const BUDGET: Duration = Duration::from_millis(2400);
/// Slices each side's budget is cut into; the two sides take turns, so a
/// disk that slows down or speeds up during the run affects both alike.
const SLICES: u32 = 6;
/// Operations per side at most.
const MAX_OPS: u64 = 200_000;
const VALUE_BYTES: usize = 256;
const BATCH: usize = 100;

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

    // Key-value puts: a compare-and-swap update each time, against the raw
    // replace without and with the directory fsync our puts also do.
    let mut version =
        rt.block_on(store.put("bench/key", value.clone(), PutOptions::new(PutMode::Create)))?;
    let mut put = || -> Result<()> {
        version = rt.block_on(store.put(
            "bench/key",
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
        });
    }

    // Key-value gets.
    let (ours, raw) = compare(
        || {
            std::hint::black_box(rt.block_on(store.get("bench/key"))?.context("present")?);
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
    });

    // Log appends, one record at a time, then in batches (records per second).
    let mut raw_log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(raw_dir.join("log"))?;
    let frame = vec![1u8; VALUE_BYTES + 24];
    let (ours, raw) = compare(
        || {
            rt.block_on(store.append("bench/log", vec![value.clone()], None))?;
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
    });
    let frames = frame.repeat(BATCH);
    let (ours, raw) = compare(
        || {
            rt.block_on(store.append("bench/batched", vec![value.clone(); BATCH], None))?;
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
    });

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
        "note: fsync latency depends on the disk's journal commits and other writers; \
         both sides take turns, but compare ratios over a few runs"
    );
    Ok(())
}
