//! A fleet under load: what a session costs in the store, and whether
//! restore and replay stay fast when thousands of sessions share it.
//!
//! [`run`] starts `--instances` server processes on one store, runs a
//! reference phase of `--reference` sessions, then `--sessions` sessions
//! (70 % legacy sessions with progress streams that hang up and resume on
//! other instances, 30 % 2026-07-28 task clients; see [`scripts`]) with the
//! fleet bus announcing meanwhile, kills one instance with SIGKILL when 40 %
//! of them have started and starts it again a second later, and then
//! measures what the store holds ([`measure`]) and runs the reference phase
//! again on the store now full, so that what the store holds is told apart
//! from how busy the fleet is. It prints a table and, with `--json`, writes
//! every figure. It fails when any event was lost or duplicated.

pub mod fleet;
pub mod measure;
pub mod scripts;
pub mod stats;
pub mod wire;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use fleet::Fleet;
use measure::Usage;
use scripts::{Ctx, DUPLICATED, LOST};
use stats::{REPLAY, RESTORE, Stats, Summary};

/// The command line of `drive`.
pub const USAGE: &str = "\
usage: mcp-persist-load drive --store URL [--sessions N] [--instances M] [--seconds S]
                              [--concurrency C] [--reference R] [--dir DIR] [--json PATH]
       mcp-persist-load serve --store-url URL [example server flags]

  --store URL        the store every instance opens (redis+cluster://H:P,H:P, redis://H:P/,
                     sqlite:PATH, postgres://USER:PASS@H:P/DB)
  --sessions N       sessions of the main phase (default 10000)
  --instances M      server processes, at least 2 (default 4)
  --seconds S        no session starts after S seconds of the main phase (default 240)
  --concurrency C    sessions running at once (default 64)
  --reference R      sessions of the reference phase, run first and again last (default 100; 0: none)
  --dir DIR          where the instances' logs go (default: a folder under the system's temp)
  --json PATH        also write every figure as JSON
";

/// What `drive` was asked for.
#[derive(Debug, Clone)]
struct Options {
    store: String,
    sessions: usize,
    instances: usize,
    seconds: u64,
    concurrency: usize,
    reference: usize,
    dir: Option<PathBuf>,
    json: Option<PathBuf>,
}

impl Options {
    fn parse(args: Vec<String>) -> Result<Options> {
        let mut o = Options {
            store: String::new(),
            sessions: 10_000,
            instances: 4,
            seconds: 240,
            concurrency: 64,
            reference: 100,
            dir: None,
            json: None,
        };
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
            let number = |v: String| -> Result<u64> {
                v.parse()
                    .with_context(|| format!("{flag} takes a whole number, not {v:?}"))
            };
            match flag.as_str() {
                "--store" => o.store = value()?,
                "--sessions" => o.sessions = number(value()?)? as usize,
                "--instances" => o.instances = number(value()?)? as usize,
                "--seconds" => o.seconds = number(value()?)?,
                "--concurrency" => o.concurrency = (number(value()?)? as usize).max(1),
                "--reference" => o.reference = number(value()?)? as usize,
                "--dir" => o.dir = Some(value()?.into()),
                "--json" => o.json = Some(value()?.into()),
                other => bail!("unknown flag {other}\n{USAGE}"),
            }
        }
        if o.store.is_empty() {
            bail!("--store is required\n{USAGE}");
        }
        if o.instances < 2 {
            bail!("--instances must be at least 2: sessions move between instances");
        }
        Ok(o)
    }
}

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The store URL's scheme.
    pub backend: String,
    /// Server processes.
    pub instances: usize,
    /// Sessions asked for in the main phase.
    pub sessions: usize,
    /// Sessions running at once.
    pub concurrency: usize,
    /// The reference phase, when run.
    pub reference: Option<Summary>,
    /// The reference phase run again after the main phase, on the store
    /// holding its sessions, when run.
    pub after: Option<Summary>,
    /// The main phase.
    pub main: Summary,
    /// When the instance was killed and how long it took to serve again,
    /// in seconds from the start of the main phase.
    pub kill: Option<(f64, f64)>,
    /// What the store held after the main phase.
    pub store: Option<Usage>,
    /// Bytes per session, per stream and per event.
    pub per_session: Option<f64>,
    /// Bytes per SSE stream, its events apart.
    pub per_stream: Option<f64>,
    /// Bytes per stored event.
    pub per_event: Option<f64>,
    /// On Redis, the same store again after the cost cut
    /// ([`measure::repack_redis_streams`]), measured at the end of the run.
    pub cut: Option<Cut>,
}

/// What the store held after a cost cut, measured in the same run.
#[derive(Debug, Serialize)]
pub struct Cut {
    /// What was cut.
    pub what: String,
    /// What the store held then.
    pub store: Usage,
    /// Bytes per session, per stream and per event then.
    pub per_session: Option<f64>,
    /// Bytes per SSE stream, its events apart, then.
    pub per_stream: Option<f64>,
    /// Bytes per stored event then.
    pub per_event: Option<f64>,
}

/// `mcp-persist-load drive`.
pub async fn run(args: Vec<String>) -> Result<()> {
    let options = Options::parse(args)?;
    let dir = match &options.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("mcp-persist-load-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = std::env::current_exe().context("finding this program")?;
    // Five minutes of events, the retention of the capacity figures; the
    // library's default liveness grace.
    let server_args: Vec<String> = ["--event-retention-ms", "300000", "--sse-retry-ms", "200"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    println!(
        "starting {} instances on {} (logs in {})",
        options.instances,
        scheme(&options.store),
        dir.display()
    );
    let fleet =
        Arc::new(Fleet::start(&exe, &options.store, &server_args, options.instances, &dir).await?);
    let outcome = drive(&options, fleet.clone()).await;
    fleet.stop().await;
    let report = outcome?;
    print_report(&report);
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    verdict(&report.main, report.reference.as_ref())?;
    match &report.after {
        Some(after) => verdict(after, None),
        None => Ok(()),
    }
}

/// Fails when a phase lost or duplicated an event: both must be 0.
fn verdict(main: &Summary, reference: Option<&Summary>) -> Result<()> {
    let of = |name| main.counter(name) + reference.map_or(0, |r| r.counter(name));
    let (lost, duplicated) = (of(LOST), of(DUPLICATED));
    if lost > 0 || duplicated > 0 {
        bail!("{lost} events lost and {duplicated} duplicated: both must be 0");
    }
    Ok(())
}

fn scheme(url: &str) -> &str {
    url.split(':').next().unwrap_or(url)
}

async fn drive(options: &Options, fleet: Arc<Fleet>) -> Result<Report> {
    let wire = wire::Wire::new(Duration::from_secs(30))?;
    let reference = if options.reference > 0 {
        println!("reference phase: {} sessions", options.reference);
        let ctx = Ctx {
            fleet: fleet.clone(),
            wire: wire.clone(),
            stats: Arc::new(Stats::default()),
        };
        phase(&ctx, 1_000_000_000, options.reference, options, None).await;
        Some(ctx.stats.summary())
    } else {
        None
    };
    println!(
        "main phase: {} sessions, {} at once, with the fleet bus; one instance SIGKILLed at 40 %",
        options.sessions, options.concurrency
    );
    let ctx = Ctx {
        fleet: fleet.clone(),
        wire,
        stats: Arc::new(Stats::default()),
    };
    // The bus: a listener on every instance, a publisher round the fleet.
    let listeners: Vec<Arc<scripts::Listener>> = (0..fleet.len())
        .map(|_| Arc::new(scripts::Listener::default()))
        .collect();
    let listening: Vec<_> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| tokio::spawn(l.clone().run(ctx.clone(), i)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn(scripts::publish(
        ctx.clone(),
        Duration::from_millis(250),
        stop.clone(),
    ));
    let kill = phase(&ctx, 0, options.sessions, options, Some(fleet.len() - 1)).await;
    stop.store(true, Ordering::Relaxed);
    let notices = publisher.await.context("the bus publisher")?;
    tokio::time::sleep(scripts::BUS_GRACE).await;
    let stopped = Instant::now();
    for (task, listener) in listening.into_iter().zip(&listeners) {
        task.abort();
        listener.close(stopped);
    }
    scripts::account(&ctx, &notices, &listeners);
    let main = ctx.stats.summary();
    println!("measuring the store");
    let store = match measure::measure(&options.store).await {
        Ok(usage) => Some(usage),
        Err(e) => {
            eprintln!("could not measure the store: {e:#}");
            None
        }
    };
    // The reference load again, on a store now holding the main phase's
    // sessions: the same work on the same fleet, so what differs is what
    // the store holds (the main phase also differs in how busy it is).
    let after = if options.reference > 0 {
        println!(
            "reference phase again: {} sessions, on the full store",
            options.reference
        );
        let ctx = Ctx {
            fleet: fleet.clone(),
            wire: ctx.wire.clone(),
            stats: Arc::new(Stats::default()),
        };
        phase(&ctx, 2_000_000_000, options.reference, options, None).await;
        Some(ctx.stats.summary())
    } else {
        None
    };
    // The cost cut, on the same events: the run's servers are done
    // writing, so every log can be written again as a server configured so
    // would have written it.
    let cut = match measure::repack_redis_streams(&options.store).await {
        Ok(Some(logs)) => {
            println!("measuring the store again after the cost cut ({logs} event logs rewritten)");
            match measure::measure(&options.store).await {
                Ok(usage) => Some(Cut {
                    what: format!(
                        "Redis stream-node-max-bytes {} (default 4096), {logs} event logs rewritten",
                        measure::STREAM_NODE_MAX_BYTES
                    ),
                    per_session: usage.per_session(),
                    per_stream: usage.per_stream(),
                    per_event: usage.per_event(),
                    store: usage,
                }),
                Err(e) => {
                    eprintln!("could not measure the store after the cost cut: {e:#}");
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("could not apply the cost cut: {e:#}");
            None
        }
    };
    Ok(Report {
        backend: scheme(&options.store).to_owned(),
        instances: options.instances,
        sessions: options.sessions,
        concurrency: options.concurrency,
        reference,
        after,
        main,
        kill,
        per_session: store.as_ref().and_then(Usage::per_session),
        per_stream: store.as_ref().and_then(Usage::per_stream),
        per_event: store.as_ref().and_then(Usage::per_event),
        store,
        cut,
    })
}

/// Runs `count` sessions numbered from `first`, `--concurrency` at once,
/// starting none after `--seconds`. With `kill`, that instance is SIGKILLed
/// once 40 % have started and started again a second later; returns when
/// (seconds into the phase) it was killed and when it served again.
async fn phase(
    ctx: &Ctx,
    first: usize,
    count: usize,
    options: &Options,
    kill: Option<usize>,
) -> Option<(f64, f64)> {
    let started = Arc::new(AtomicUsize::new(0));
    let begun = Instant::now();
    let bound = Duration::from_secs(options.seconds);
    let killer = kill.map(|index| {
        let fleet = ctx.fleet.clone();
        let started = started.clone();
        let at = (count * 2 / 5).max(1);
        tokio::spawn(async move {
            while started.load(Ordering::Relaxed) < at && begun.elapsed() < bound * 2 / 5 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let killed = begun.elapsed().as_secs_f64();
            println!("  SIGKILL instance {index} at {killed:.1} s");
            if let Err(e) = fleet.kill(index).await {
                eprintln!("  could not kill instance {index}: {e:#}");
                return None;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            match fleet.restart(index).await {
                Ok(()) => {
                    let back = begun.elapsed().as_secs_f64();
                    println!("  instance {index} serving again at {back:.1} s");
                    Some((killed, back))
                }
                Err(e) => {
                    eprintln!("  could not restart instance {index}: {e:#}");
                    None
                }
            }
        })
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency));
    let mut running = tokio::task::JoinSet::new();
    let mut last_note = Instant::now();
    for n in first..first + count {
        if begun.elapsed() > bound {
            ctx.stats
                .error(format!("not started within {} s", options.seconds));
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        started.fetch_add(1, Ordering::Relaxed);
        let ctx = ctx.clone();
        running.spawn(async move {
            let _permit = permit;
            let outcome = tokio::time::timeout(Duration::from_secs(120), async {
                if n % 10 < 7 {
                    scripts::legacy(&ctx, n).await
                } else {
                    scripts::task(&ctx, n).await
                }
            })
            .await;
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let kind = e.kind();
                    tracing::debug!(session = n, error = %e, "session failed");
                    if matches!(e, wire::Failure::Protocol(_)) {
                        eprintln!("  session {n}: {e}");
                    }
                    ctx.stats.error(kind);
                }
                Err(_) => ctx.stats.error("session over 120 s"),
            }
        });
        while running.try_join_next().is_some() {}
        if last_note.elapsed() > Duration::from_secs(10) {
            last_note = Instant::now();
            println!(
                "  {:>6} of {count} started, {:.0} s",
                n + 1 - first,
                begun.elapsed().as_secs_f64()
            );
        }
    }
    while running.join_next().await.is_some() {}
    match killer {
        Some(k) => k.await.ok().flatten(),
        None => None,
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_report(r: &Report) {
    let main = &r.main;
    println!("\n== fleet under load: {}", r.backend);
    println!(
        "{} instances, {} sessions asked for ({} legacy, {} task clients), {} at once, {:.1} s",
        r.instances,
        thousands(r.sessions as u64),
        thousands(main.counter(scripts::SESSIONS)),
        thousands(main.counter(scripts::TASKS_DONE)),
        r.concurrency,
        main.seconds
    );
    if let Some((killed, back)) = r.kill {
        println!("instance SIGKILLed at {killed:.1} s, serving again at {back:.1} s");
    }
    let events = main.counter(scripts::EVENTS) + main.counter(scripts::REPLAYED);
    println!(
        "events/s: {:.0} to clients ({} on live and resumed streams, {} replayed), {:.1} bus notices heard/s",
        events as f64 / main.seconds,
        thousands(main.counter(scripts::EVENTS)),
        thousands(main.counter(scripts::REPLAYED)),
        main.counter(scripts::NOTICES) as f64 / main.seconds
    );
    println!(
        "calls answered {}, orphaned by the kill {}, tasks completed {}",
        main.counter(scripts::CALLS_DONE),
        main.counter(scripts::CALLS_ORPHANED),
        main.counter(scripts::TASKS_DONE)
    );
    println!(
        "\n{:<18} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "n", "p50", "p99", "p999", "max"
    );
    for (name, l) in &main.latencies {
        println!(
            "{name:<18} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            l.n, l.p50, l.p99, l.p999, l.max
        );
    }
    if let Some(reference) = &r.reference {
        println!(
            "\nreference phase ({} sessions first, same fleet and concurrency):",
            reference.counter(scripts::SESSIONS) + reference.counter(scripts::TASKS_DONE)
        );
        let mut against = vec![("in the main phase", main)];
        if let Some(after) = &r.after {
            against.push(("again on the full store", after));
        }
        for name in [RESTORE, REPLAY] {
            for (label, other) in &against {
                if let (Some(small), Some(big)) =
                    (reference.latencies.get(name), other.latencies.get(name))
                {
                    let ratio = if small.p99 > 0.0 {
                        big.p99 / small.p99
                    } else {
                        0.0
                    };
                    println!(
                        "  {name:<16} p99 {:>7.1} ms first, {:>7.1} ms {label}: x{ratio:.2}{}",
                        small.p99,
                        big.p99,
                        if ratio <= 2.0 { "" } else { "  (over 2x)" }
                    );
                }
            }
        }
    }
    if let Some(store) = &r.store {
        println!("\nstore: {}", store.method);
        println!(
            "{:<28} {:>10} {:>11} {:>13} {:>9}",
            "kind", "keys/logs", "records", "bytes", "B/item"
        );
        for (kind, k) in &store.kinds {
            println!(
                "{kind:<28} {:>10} {:>11} {:>13} {:>9.0}",
                thousands(k.items),
                thousands(k.records),
                thousands(k.bytes),
                k.bytes as f64 / k.items.max(1) as f64
            );
        }
        println!(
            "total (backend's own count): {} bytes",
            thousands(store.total_bytes)
        );
        if let Some(fit) = store.event_fit {
            println!(
                "event logs: bytes = {:.0} per log + {:.0} per event (least squares over every log)",
                fit.per_log, fit.per_record
            );
        }
        let show = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0} B"));
        // What an event adds at the margin can be 0 (a Redis stream's node
        // is allocated whole); what the logs hold per event says the rest.
        let (log_bytes, _) = store.of(mcp_persist_core::declare::EVENT.kind);
        let events = store
            .kinds
            .get(mcp_persist_core::declare::EVENT.kind)
            .map_or(0, |k| k.records);
        let average = (events > 0).then(|| log_bytes as f64 / events as f64);
        println!(
            "per session {}, per stream {}, per event {} (at the margin; {} averaged over the logs)",
            show(r.per_session),
            show(r.per_stream),
            show(r.per_event),
            show(average)
        );
    }
    if let Some(cut) = &r.cut {
        let show = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0} B"));
        let (log_bytes, logs) = cut.store.of(mcp_persist_core::declare::EVENT.kind);
        println!("\nafter the cost cut: {}", cut.what);
        println!(
            "event logs: {} bytes over {} logs ({:.0} B per log); total (backend's own count): {} bytes",
            thousands(log_bytes),
            thousands(logs),
            log_bytes as f64 / logs.max(1) as f64,
            thousands(cut.store.total_bytes)
        );
        println!(
            "per session {}, per stream {} (before: {}), per event {}",
            show(cut.per_session),
            show(cut.per_stream),
            show(r.per_stream),
            show(cut.per_event)
        );
    }
    println!(
        "\nlost events: {}   duplicated events: {}",
        main.counter(LOST),
        main.counter(DUPLICATED)
    );
    if main.errors.is_empty() {
        println!("errors: none");
    } else {
        println!("errors by kind:");
        for (kind, n) in &main.errors {
            println!("  {n:>7}  {kind}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_or_duplicated_event_in_either_phase_fails_the_run() {
        let clean = Stats::default();
        clean.count(scripts::EVENTS, 40);
        assert!(verdict(&clean.summary(), Some(&clean.summary())).is_ok());
        for counter in [LOST, DUPLICATED] {
            let bad = Stats::default();
            bad.count(counter, 1);
            let err = verdict(&clean.summary(), Some(&bad.summary())).expect_err("fails");
            assert!(err.to_string().contains("must be 0"), "{err}");
            assert!(verdict(&bad.summary(), None).is_err());
        }
    }
}
