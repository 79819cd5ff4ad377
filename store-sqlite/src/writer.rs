//! The writer thread: one connection, one queue, group commit.
//!
//! Every write (and, for an in-memory database, every read) is a job sent to
//! one thread that owns the write connection. The thread takes the first job
//! waiting, then every other job already queued behind it (up to a count and
//! a byte budget), and runs them all in **one** `BEGIN IMMEDIATE` transaction,
//! each inside its own savepoint so that a failed precondition or a failed
//! statement undoes that job alone. Each caller gets its answer only after the
//! shared `COMMIT` returned, so a write that returned `Ok` is on disk, and the
//! cost of the commit (one fsync of the WAL) is shared by every job of the
//! batch. While one batch commits, the next one gathers in the queue; when
//! the last batch answered several callers (jobs sent by one task count
//! once), the next also waits (a quarter of the last batch's time, at most
//! 0.5 ms, less when such waits bring nobody: see `Linger`) for as many
//! jobs, so that the callers just
//! answered, who send their next job at once, share the next commit rather
//! than leave it to the half of them who were waiting (64 appenders: 32
//! appends per commit before, 64 with the wait). An unsynced put
//! ([`Commit::Shared`]) that would commit alone waits up to a millisecond
//! for another job instead: a keyed call's kept answer then shares the
//! commit of the response's event, which follows it at once (a durable
//! server's commits per keyed call went from 3.6 to 3.0 in
//! `cargo xtask bench client`).

use std::{
    panic::AssertUnwindSafe,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use mcp_persist_core::{Error, Result};
use rusqlite::Connection;
use tokio::sync::{Notify, oneshot};

use crate::{
    SqliteOptions, WriteStats,
    error::{Ctx, SetupError, SharedError, writer_gone},
    ops, schema,
};

/// At most this many jobs share one transaction...
const MAX_BATCH_JOBS: usize = 512;
/// ...and once their payloads reach this many bytes, the batch is closed.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// The longest a batch waits for the callers of the last one to come back.
const MAX_LINGER: Duration = Duration::from_micros(500);
/// The shortest wait for the last batch's callers that [`Linger`] falls
/// to after waits in which no job came.
const MIN_LINGER: Duration = Duration::from_micros(20);
/// Waits shorter than this yield the thread instead of sleeping (see
/// [`receive_by`]).
const SPIN_UNDER: Duration = Duration::from_micros(100);
/// The longest a batch of [`Commit::Shared`] jobs waits for another job to
/// join it before it commits alone.
const COMPANY_WAIT: Duration = Duration::from_millis(1);

/// What a job asks of the commit it is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Synced as the store's durability says.
    Synced,
    /// Skips the fsync when every job of its batch does.
    Unsynced,
    /// Skips the fsync as [`Unsynced`](Commit::Unsynced) does, and is not
    /// committed alone if another job comes within [`COMPANY_WAIT`]: a
    /// write whose caller sends a synced one right behind it (a kept answer,
    /// then the response's event) shares that commit, rather than cost a
    /// commit (and two `PRAGMA synchronous` switches) of its own. Only its
    /// own answer waits; a job that comes ends the wait at once.
    Shared,
}

/// A unit of work for the writer thread.
trait Job: Send {
    /// Payload bytes, for the batch budget.
    fn weight(&self) -> usize;
    /// Whether a commit of this job adds log records (wakes tailing readers).
    fn appends(&self) -> bool;
    /// What this job asks of its commit; a batch of jobs that all waive
    /// the sync commits without an fsync.
    fn commit(&self) -> Commit;
    /// The task that sent it, if it was sent from one.
    fn caller(&self) -> Option<tokio::task::Id>;
    /// Runs the work on the connection; returns whether it succeeded.
    fn run(&mut self, conn: &Connection, ctx: Ctx<'_>) -> bool;
    /// Sends the answer, once the fate of the transaction is known.
    fn finish(self: Box<Self>, commit: Option<&SharedError>, ctx: Ctx<'_>);
}

struct Task<T, F> {
    work: Option<F>,
    outcome: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
    weight: usize,
    appends: bool,
    commit: Commit,
    caller: Option<tokio::task::Id>,
}

impl<T, F> Job for Task<T, F>
where
    T: Send,
    F: FnOnce(&Connection, Ctx<'_>) -> Result<T> + Send,
{
    fn weight(&self) -> usize {
        self.weight
    }

    fn appends(&self) -> bool {
        self.appends
    }

    fn commit(&self) -> Commit {
        self.commit
    }

    fn caller(&self) -> Option<tokio::task::Id> {
        self.caller
    }

    fn run(&mut self, conn: &Connection, ctx: Ctx<'_>) -> bool {
        let outcome = match self.work.take() {
            // A panic fails this job alone: its savepoint (or the lone
            // transaction) is rolled back like any failed job's, and the
            // thread goes on serving the others.
            Some(work) => std::panic::catch_unwind(AssertUnwindSafe(|| work(conn, ctx)))
                .unwrap_or_else(|panic| Err(job_panicked(ctx, panic.as_ref()))),
            None => Err(writer_gone()),
        };
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn finish(self: Box<Self>, commit: Option<&SharedError>, ctx: Ctx<'_>) {
        let outcome = match (self.outcome, commit) {
            // Nothing of a failed transaction was committed: a job that
            // succeeded inside it failed after all.
            (Some(Ok(_)), Some(failed)) | (None, Some(failed)) => Err(ctx.shared(failed)),
            (Some(outcome), _) => outcome,
            (None, None) => Err(writer_gone()),
        };
        // The caller may have stopped waiting; the outcome stands regardless.
        let _ = self.reply.send(outcome);
    }
}

/// The error of a job that panicked, with the panic's message.
fn job_panicked(ctx: Ctx<'_>, panic: &(dyn std::any::Any + Send)) -> Error {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    tracing::error!(db = ctx.db, %message, "a SQLite write panicked; it was rolled back");
    Error::backend(crate::error::NAME, SetupError::Panicked { message })
}

#[derive(Default)]
pub(crate) struct Stats {
    transactions: AtomicU64,
    operations: AtomicU64,
    queued: AtomicUsize,
    running: AtomicUsize,
}

impl Stats {
    pub(crate) fn snapshot(&self) -> WriteStats {
        WriteStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            operations: self.operations.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
        }
    }
}

/// The handle to the writer thread. Dropping it lets the thread finish the
/// jobs already queued, close the connection and stop.
pub(crate) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
    stats: Arc<Stats>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    /// Starts the thread, which opens (and migrates) the database; the
    /// returned receiver tells whether that worked.
    pub(crate) fn spawn(
        path: Option<PathBuf>,
        options: SqliteOptions,
        label: Arc<str>,
        appended: Arc<Notify>,
    ) -> Result<(Self, oneshot::Receiver<Result<()>>)> {
        let (jobs, queue) = mpsc::channel::<Box<dyn Job>>();
        let (ready_tx, ready) = oneshot::channel();
        let stats = Arc::new(Stats::default());
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("mcp-persist-sqlite".to_owned())
            .spawn(move || {
                let ctx = Ctx {
                    db: &label,
                    busy_timeout: options.busy_timeout,
                };
                let conn = match schema::open_writer(path.as_deref(), &options, ctx) {
                    Ok(conn) => conn,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                tracing::info!(
                    db = ctx.db,
                    schema = schema::SCHEMA_VERSION,
                    "SQLite store open"
                );
                let _ = ready_tx.send(Ok(()));
                serve(
                    &conn,
                    ctx,
                    &queue,
                    &thread_stats,
                    &appended,
                    options.sweep_interval,
                    options.durability == crate::Durability::Full,
                );
                tracing::debug!(db = ctx.db, "SQLite writer stopping");
            })
            .map_err(|e| Error::backend(crate::error::NAME, e))?;
        Ok((
            Writer {
                jobs,
                stats,
                thread,
            },
            ready,
        ))
    }

    /// Stops taking jobs and blocks until the thread has committed the ones
    /// already queued and closed the connection.
    pub(crate) fn shutdown_blocking(self) -> Result<()> {
        drop(self.jobs);
        self.thread.join().map_err(|_| writer_gone())
    }

    pub(crate) fn stats(&self) -> WriteStats {
        self.stats.snapshot()
    }

    /// Queues `work` and waits until the transaction it ran in has committed
    /// (or failed). `weight` is its payload size in bytes.
    pub(crate) async fn run<T, F>(&self, weight: usize, appends: bool, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Ctx<'_>) -> Result<T> + Send + 'static,
    {
        self.run_with(weight, appends, Commit::Synced, work).await
    }

    /// [`run`](Writer::run), with what the job asks of its commit.
    pub(crate) async fn run_with<T, F>(
        &self,
        weight: usize,
        appends: bool,
        commit: Commit,
        work: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Ctx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Task {
            work: Some(work),
            outcome: None,
            reply,
            weight,
            appends,
            commit,
            caller: tokio::task::try_id(),
        });
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if self.jobs.send(job).is_err() {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(writer_gone());
        }
        answer.await.map_err(|_| writer_gone())?
    }
}

/// The thread's loop: gather a batch, run it in one transaction, answer.
fn serve(
    conn: &Connection,
    ctx: Ctx<'_>,
    queue: &mpsc::Receiver<Box<dyn Job>>,
    stats: &Stats,
    appended: &Notify,
    sweep_interval: Option<Duration>,
    full: bool,
) {
    // Whether the connection syncs commits now; a store opened with
    // `Durability::Full` drops to NORMAL for a batch whose every job waived
    // the sync, and goes back before the next batch that needs it.
    let mut syncing = full;
    // How many callers the last batch answered, and how long it took to
    // run.
    let mut last: Option<(usize, Duration)> = None;
    let mut linger = Linger::default();
    let mut next_sweep = sweep_interval.map(|every| Instant::now() + every);
    loop {
        let first = match next_sweep {
            Some(at) => match queue.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    sweep(conn, ctx);
                    next_sweep = sweep_interval.map(|every| Instant::now() + every);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match queue.recv() {
                Ok(job) => job,
                Err(mpsc::RecvError) => return,
            },
        };
        let mut bytes = first.weight();
        let arrived = Instant::now();
        let mut batch = vec![first];
        // While the callers answered by the last commit send their next
        // jobs, gather as many as that commit had, for a fraction of what
        // it took at most: concurrent callers then share one commit instead
        // of splitting into two cohorts that alternate. How long is learned
        // (see `Linger`).
        let wait = match last {
            Some((jobs, took)) if jobs > 1 => Some((jobs, linger.wait(took))),
            _ => None,
        };
        // How many jobs the batch had when it started waiting for more.
        let mut lingered = None;
        while batch.len() < MAX_BATCH_JOBS && bytes < MAX_BATCH_BYTES {
            let next = match queue.try_recv() {
                Ok(job) => Some(job),
                Err(_) => {
                    let lingering = match wait {
                        Some((jobs, wait)) if batch.len() < jobs => {
                            lingered.get_or_insert(batch.len());
                            Some(arrived + wait)
                        }
                        _ => None,
                    };
                    let company = batch
                        .iter()
                        .all(|job| job.commit() == Commit::Shared)
                        .then(|| arrived + COMPANY_WAIT);
                    lingering
                        .max(company)
                        .and_then(|until| receive_by(queue, until))
                }
            };
            let Some(job) = next else { break };
            bytes = bytes.saturating_add(job.weight());
            batch.push(job);
        }
        if let (Some((jobs, _)), Some(had)) = (wait, lingered) {
            linger.learn(batch.len() >= jobs, batch.len() > had, arrived.elapsed());
        }
        stats.running.store(batch.len(), Ordering::Relaxed);
        stats.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        let wanted = full && batch.iter().any(|job| job.commit() == Commit::Synced);
        if wanted != syncing {
            let level = if wanted { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", level) {
                Ok(()) => syncing = wanted,
                // Staying at FULL is safe; failing to return to it is not
                // silent: this batch then commits without its fsync.
                Err(e) => {
                    tracing::warn!(db = ctx.db, level, error = %e, "could not change PRAGMA synchronous")
                }
            }
        }
        let began = Instant::now();
        let outcome = run_batch(conn, ctx, &mut batch);
        last = Some((
            callers(batch.iter().map(|job| job.caller())),
            began.elapsed(),
        ));
        match &outcome {
            Ok(()) => {
                stats.transactions.fetch_add(1, Ordering::Relaxed);
                stats
                    .operations
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                tracing::trace!(db = ctx.db, jobs = batch.len(), bytes, "group commit");
            }
            Err(e) => {
                tracing::warn!(db = ctx.db, jobs = batch.len(), error = %e, "SQLite transaction failed");
            }
        }
        let woke_tails = outcome.is_ok() && batch.iter().any(|job| job.appends());
        // Before any answer goes out, so that a caller who got one sees
        // counters that include its own transaction.
        stats.running.store(0, Ordering::Relaxed);
        for job in batch {
            job.finish(outcome.as_ref().err(), ctx);
        }
        if woke_tails {
            appended.notify_waiters();
        }
    }
}

/// The callers a batch answered: its jobs, those sent by one task counted
/// once (a keyed call's record is sent beside its stream's first event, by
/// the same task, which then comes back with one job, not two). Jobs sent
/// from outside any task count one each.
fn callers(jobs: impl Iterator<Item = Option<tokio::task::Id>>) -> usize {
    let mut tasks = Vec::new();
    let mut outside = 0;
    for caller in jobs {
        match caller {
            Some(task) if !tasks.contains(&task) => tasks.push(task),
            Some(_) => {}
            None => outside += 1,
        }
    }
    tasks.len() + outside
}

/// How long a batch waits for the callers of the last one to come back,
/// learned from the waits before it.
///
/// The last batch's callers (see [`callers`]) are waited for, but a caller
/// may not come back at once (it answered its client and waits for the
/// next request), and a wait for it is spent for nothing, on every call
/// (a quarter of a commit, up to [`MAX_LINGER`]). So a wait in which no
/// job came at all halves the next one (down to [`MIN_LINGER`]), and a
/// wait that brought some or all of the jobs it waited for lets the next
/// one grow back (doubling, or to four times what a wait that filled its
/// batch took): concurrent callers, who always bring some, keep the whole
/// wait, and a lone caller whose jobs come at once waits next to nothing.
#[derive(Debug, Clone, Copy)]
struct Linger {
    limit: Duration,
}

impl Default for Linger {
    fn default() -> Self {
        Linger { limit: MAX_LINGER }
    }
}

impl Linger {
    /// The wait after a batch whose run took `took`.
    fn wait(&self, took: Duration) -> Duration {
        (took / 4).min(self.limit)
    }

    /// Learns from a wait that ended after `waited`: `filled` when as many
    /// jobs came as were waited for, `some` when any came.
    fn learn(&mut self, filled: bool, some: bool, waited: Duration) {
        self.limit = if filled {
            self.limit.max(waited * 4).min(MAX_LINGER)
        } else if some {
            (self.limit * 2).min(MAX_LINGER)
        } else {
            (self.limit / 2).max(MIN_LINGER)
        };
    }
}

/// The next job if one comes by `until`. A short wait yields the thread
/// rather than sleep: a sleeping thread wakes a timer slack (50 µs on
/// Linux) after its deadline at the earliest, more than a short wait.
fn receive_by(queue: &mpsc::Receiver<Box<dyn Job>>, until: Instant) -> Option<Box<dyn Job>> {
    let left = until.saturating_duration_since(Instant::now());
    if left > SPIN_UNDER {
        return queue.recv_timeout(left).ok();
    }
    loop {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if Instant::now() >= until => return None,
            Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
}

/// Runs every job of the batch in one `BEGIN IMMEDIATE` transaction, each in
/// its own savepoint, and commits. An `Err` means nothing was committed.
fn run_batch(
    conn: &Connection,
    ctx: Ctx<'_>,
    batch: &mut [Box<dyn Job>],
) -> Result<(), SharedError> {
    let step = |sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]))
    };
    let result = (|| {
        step("BEGIN IMMEDIATE")?;
        let mut any_ok = false;
        if let [job] = batch {
            // A lone job needs no savepoint: the transaction is its own.
            any_ok = job.run(conn, ctx);
        } else {
            for job in batch.iter_mut() {
                step("SAVEPOINT job")?;
                if job.run(conn, ctx) {
                    any_ok = true;
                } else {
                    step("ROLLBACK TO job")?;
                }
                step("RELEASE job")?;
            }
        }
        step(if any_ok { "COMMIT" } else { "ROLLBACK" })?;
        Ok(())
    })();
    if result.is_err() && !conn.is_autocommit() {
        // Best effort: the error already reports what went wrong.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result.map_err(|e: rusqlite::Error| SharedError(Arc::new(e)))
}

/// Reclaims expired records and logs, in a transaction of its own.
fn sweep(conn: &Connection, ctx: Ctx<'_>) {
    let (reply, mut answer) = oneshot::channel();
    let mut batch: [Box<dyn Job>; 1] = [Box::new(Task {
        work: Some(|conn: &Connection, ctx: Ctx<'_>| {
            Ok((ops::kv_sweep(conn, ctx)?, ops::log_sweep(conn, ctx)?))
        }),
        outcome: None,
        reply,
        weight: 0,
        appends: false,
        commit: Commit::Synced,
        caller: None,
    })];
    let committed = run_batch(conn, ctx, &mut batch);
    let [job] = batch;
    job.finish(committed.as_ref().err(), ctx);
    match answer.try_recv() {
        Ok(Ok((records, logs))) => {
            tracing::debug!(db = ctx.db, records, logs, "swept expired SQLite rows");
        }
        Ok(Err(error)) => {
            tracing::warn!(db = ctx.db, %error, "periodic sweep of expired SQLite rows failed");
        }
        Err(_) => tracing::warn!(
            db = ctx.db,
            "periodic sweep of expired SQLite rows gave no answer"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: Duration = Duration::from_millis(2);

    /// Two jobs a task sends at once are one caller, who comes back with
    /// one job: the batch after them does not wait for a second.
    #[tokio::test]
    async fn jobs_of_one_task_are_one_caller() {
        let task = || tokio::spawn(async { tokio::task::id() });
        let (a, b) = (task().await.expect("task"), task().await.expect("task"));
        assert_ne!(a, b);
        assert_eq!(callers([Some(a), Some(a)].into_iter()), 1);
        assert_eq!(callers([Some(a), Some(b), Some(a)].into_iter()), 2);
        assert_eq!(callers([None, None, Some(b)].into_iter()), 3);
    }

    /// Callers that do not come back at once (each waits for its client's
    /// next request): the wait brings nobody, every time, and falls to the
    /// least.
    #[test]
    fn waits_that_bring_nobody_fall_to_the_least() {
        let mut linger = Linger::default();
        assert_eq!(linger.wait(COMMIT), MAX_LINGER);
        for _ in 0..8 {
            let wait = linger.wait(COMMIT);
            linger.learn(false, false, wait);
        }
        assert_eq!(linger.wait(COMMIT), MIN_LINGER);
        // The pair itself came together: a short wait that filled its
        // batch does not raise it again.
        linger.learn(true, true, Duration::from_micros(2));
        assert_eq!(linger.wait(COMMIT), MIN_LINGER);
    }

    /// Concurrent callers always bring some of the jobs waited for: the
    /// wait grows back to the whole of it, and a wait that filled its batch
    /// late keeps room for the next cohort.
    #[test]
    fn waits_that_bring_callers_grow_back() {
        let mut linger = Linger::default();
        for _ in 0..8 {
            linger.learn(false, false, MAX_LINGER);
        }
        for _ in 0..5 {
            linger.learn(false, true, MIN_LINGER);
        }
        assert_eq!(linger.wait(COMMIT), MAX_LINGER);
        let mut filled = Linger {
            limit: Duration::from_micros(40),
        };
        filled.learn(true, true, Duration::from_micros(100));
        assert_eq!(filled.wait(COMMIT), Duration::from_micros(400));
        // Never past the least of a quarter of the last commit and the
        // most.
        assert_eq!(
            filled.wait(Duration::from_micros(800)),
            Duration::from_micros(200)
        );
    }
}
