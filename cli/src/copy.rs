//! `copy SOURCE DEST`: migrating state between backends.
//!
//! * Key-value records are written with [`PutMode::Create`]: a record the
//!   destination already holds is compared, never blindly replaced. The
//!   same bytes count as copied already (a resumed run); a destination
//!   record that its own timestamps say is newer is kept; an older one is
//!   replaced by compare-and-swap on its version; anything else is refused.
//! * TTLs come from the records' own times ([`TtlPolicy`]); expired records
//!   and live leases are not copied.
//! * Logs keep their sequence numbers, because SSE event ids carry them: only
//!   the records after the destination's last one are appended, each append
//!   is checked to have been numbered as in the source, and a destination
//!   log that differs from the source is refused. A source log whose first
//!   records were dropped by retention starts at a higher number: the
//!   destination is padded up to it and the padding trimmed away.
//!
//! * A copy holds a lock on its destination ([`DestLock`]) from before it
//!   reads the destination until it is done, so copies into one store take
//!   turns: the second finds the first's work there and appends nothing
//!   twice.
//!
//! So a copy killed at any point and run again ends complete, with nothing
//! duplicated. Ctrl-C stops it at a record boundary, saying where.

use std::{collections::BTreeMap, io::Write, time::Duration};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mcp_persist::{Error, LogRecord, PutMode, PutOptions, Timestamp, stores::inspect::inspect};
use serde_json::json;

use crate::{
    fail::{Code, Failure},
    interrupt,
    lock::DestLock,
    model::{Expiry, Kind, TtlPolicy, log_of, written_at},
    output::{Table, print_json},
    target::Store,
};

/// Where a copy goes.
pub(crate) struct Destination<'a> {
    /// The destination as shown.
    pub(crate) label: String,
    /// The opened store; `None` in a dry run into a local store, which is
    /// only looked at, never opened.
    pub(crate) store: Option<&'a Store>,
    /// Whether it holds logs.
    pub(crate) holds_logs: bool,
    /// Whether it does not exist yet (the copy creates it).
    pub(crate) new: bool,
    /// The lock held on it.
    pub(crate) lock: Option<&'a DestLock>,
}

/// Why a copy stopped before its end.
enum Halt {
    /// A failure.
    Failed(Failure),
    /// Ctrl-C, at this key or log position.
    Interrupted(String),
    /// The destination lock was lost.
    LockLost,
}

impl From<Failure> for Halt {
    fn from(f: Failure) -> Self {
        Halt::Failed(f)
    }
}

/// Stops the copy if Ctrl-C was pressed or the lock is gone; `at` says
/// where it stands.
fn checkpoint(lock: Option<&DestLock>, at: impl FnOnce() -> String) -> Result<(), Halt> {
    if interrupt::requested() {
        return Err(Halt::Interrupted(at()));
    }
    if lock.is_some_and(DestLock::lost) {
        return Err(Halt::LockLost);
    }
    Ok(())
}

/// The command line as typed, quoted for a shell where needed.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Records per append.
const BATCH: usize = 256;

#[derive(Default)]
struct Summary {
    copied: u64,
    already: u64,
    replaced_older: u64,
    kept_newer: u64,
    expired: u64,
    transient: u64,
    would_copy: u64,
    logs: u64,
    log_records_appended: u64,
    log_records_already: u64,
    /// Key or log, and why it was refused or skipped as damaged.
    refused: Vec<(String, String)>,
    damaged: Vec<(String, String)>,
    /// What to verify at the end: KV keys expected equal in both stores,
    /// logs with their source records.
    verify_keys: Vec<String>,
    verify_logs: Vec<(String, Vec<LogRecord>)>,
}

pub(crate) fn progress(total: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    // Draws only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:40} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// Runs the copy; returns the failing exit code when something was refused
/// (5), damaged or not verified (1).
pub(crate) async fn copy(
    source: &Store,
    dest: &Destination<'_>,
    kinds: &[Kind],
    ttl: TtlPolicy,
    dry_run: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<Option<Code>, Failure> {
    let keys: Vec<String> = source
        .list("")
        .await?
        .into_iter()
        .filter(|k| kinds.contains(&Kind::of(k)))
        .collect();
    let needs_logs = keys.iter().any(|k| log_of(k).is_some());
    if needs_logs && source.log().is_some() && !dest.holds_logs {
        return Err(Failure::new(
            Code::Usage,
            format!(
                "{} holds no logs, so event streams and tasks cannot go there; copy them to a store that does (a split destination credentials=URL;rest=URL), or leave them out with --kinds",
                dest.label
            ),
        ));
    }
    let bar = progress(keys.len() as u64, json);
    let mut summary = Summary::default();
    let total = keys.len();
    let mut run = async || -> Result<(), Halt> {
        for (i, key) in keys.iter().enumerate() {
            checkpoint(dest.lock, || format!("{key}, record {} of {total}", i + 1))?;
            bar.set_message(key.clone());
            match dest.store {
                Some(to) if !dry_run => {
                    copy_key(source, to, dest.lock, key, ttl, &mut summary, &bar).await?;
                }
                _ => count_key(source, key, ttl, &mut summary).await?,
            }
            bar.inc(1);
        }
        Ok(())
    };
    let halted = run().await;
    bar.finish_and_clear();
    match halted {
        Ok(()) => {}
        Err(Halt::Failed(failure)) => return Err(failure),
        Err(Halt::Interrupted(at)) => {
            return Err(Failure::new(
                Code::Interrupted,
                format!(
                    "interrupted: the copy stopped at {at}; {} records and {} log records were copied into {} before it, none of them half-written",
                    summary.copied + summary.replaced_older,
                    summary.log_records_appended,
                    dest.label
                ),
            )
            .with_hint(format!(
                "run the same command again to continue where it stopped: {}",
                command_line()
            )));
        }
        Err(Halt::LockLost) => {
            return Err(Failure::new(
                Code::Other,
                format!(
                    "lost the copy lock on {}: it could not be renewed in time (the connection stalled), so this copy stopped before another could overlap it",
                    dest.label
                ),
            )
            .with_hint(format!(
                "run the same command again; it continues where this one stopped: {}",
                command_line()
            )));
        }
    }

    let mismatches = match dest.store {
        Some(to) if !dry_run => verify(to, &summary).await?,
        _ => Vec::new(),
    };
    report(source, dest, &summary, &mismatches, dry_run, json, out)?;
    Ok(if !summary.refused.is_empty() {
        Some(Code::Refused)
    } else if !summary.damaged.is_empty() || !mismatches.is_empty() {
        Some(Code::Damaged)
    } else {
        None
    })
}

/// What there is to copy under `key`, for a dry run: read and decoded,
/// nothing written.
async fn count_key(
    source: &Store,
    key: &str,
    ttl: TtlPolicy,
    summary: &mut Summary,
) -> Result<(), Failure> {
    if let Some(record) = read_source(source, key, summary).await? {
        match ttl.expiry(&record.1) {
            Expiry::Transient => summary.transient += 1,
            Expiry::At(at) if at.since(Timestamp::now()).is_zero() => summary.expired += 1,
            _ => summary.would_copy += 1,
        }
    }
    Ok(())
}

/// The source record under `key` with its decoded form; `None` when it is
/// gone or damaged (counted as damaged).
async fn read_source(
    source: &Store,
    key: &str,
    summary: &mut Summary,
) -> Result<Option<(Vec<u8>, mcp_persist::stores::inspect::Inspected)>, Failure> {
    let from = source.backend_for(key);
    let entry = match from.kv.get(&crate::model::key(key)?).await {
        Ok(Some(entry)) => entry,
        Ok(None) => return Ok(None), // gone since the listing: expired or deleted
        Err(e @ Error::Corrupt { .. }) => {
            summary.damaged.push((key.to_owned(), e.to_string()));
            return Ok(None);
        }
        Err(e) => return Err(from.fail(e)),
    };
    match inspect(key, &entry.value) {
        Ok(record) => Ok(Some((entry.value, record))),
        Err(e @ Error::NewerSchema { .. }) => Err(from.fail(e)),
        Err(e) => {
            summary.damaged.push((key.to_owned(), e.to_string()));
            Ok(None)
        }
    }
}

async fn copy_key(
    source: &Store,
    dest: &Store,
    lock: Option<&DestLock>,
    key: &str,
    ttl: TtlPolicy,
    summary: &mut Summary,
    bar: &ProgressBar,
) -> Result<(), Halt> {
    let Some((entry_value, record)) = read_source(source, key, summary).await? else {
        return Ok(());
    };
    let record_ttl = match ttl.expiry(&record) {
        Expiry::Transient => {
            summary.transient += 1;
            return Ok(());
        }
        Expiry::Never => None,
        Expiry::At(at) => {
            let left = at.since(Timestamp::now());
            if left.is_zero() {
                summary.expired += 1;
                return Ok(());
            }
            Some(left)
        }
    };
    let to = dest.backend_for(key);
    let put = PutOptions::new(PutMode::Create).with_ttl(record_ttl);
    let mut kv_done = true;
    match to
        .kv
        .put(&crate::model::key(key)?, entry_value.clone(), put)
        .await
    {
        Ok(_) => {
            summary.copied += 1;
            summary.verify_keys.push(key.to_owned());
        }
        Err(Error::AlreadyExists { .. }) => {
            let existing = to
                .kv
                .get(&crate::model::key(key)?)
                .await
                .map_err(|e| to.fail(e))?;
            match existing {
                Some(existing) if existing.value == entry_value => {
                    summary.already += 1;
                    summary.verify_keys.push(key.to_owned());
                }
                Some(existing) => {
                    let theirs = inspect(key, &existing.value)
                        .ok()
                        .and_then(|r| written_at(&r));
                    let ours = written_at(&record);
                    let same_stream = record.kind == "event_stream"
                        && stream_token(&existing.value) == stream_token(&entry_value);
                    if record.kind == "event_stream" && !same_stream {
                        summary.refused.push((
                            key.to_owned(),
                            "the destination holds another stream of this name (its event ids carry another token); remove it there with `mcp-persist rm` and copy again".into(),
                        ));
                        return Ok(());
                    }
                    // The same stream: the source's metadata (retention
                    // bound, request) is the one its log goes with.
                    let (ours, theirs) = if same_stream {
                        (
                            Some(Timestamp::from_unix_millis(1)),
                            Some(Timestamp::from_unix_millis(0)),
                        )
                    } else {
                        (ours, theirs)
                    };
                    match (ours, theirs) {
                        (Some(ours), Some(theirs)) if ours > theirs => {
                            let update = PutOptions::new(PutMode::Update(existing.version))
                                .with_ttl(record_ttl);
                            to.kv
                                .put(&crate::model::key(key)?, entry_value.clone(), update)
                                .await
                                .map_err(|e| to.fail(e))?;
                            summary.replaced_older += 1;
                            summary.verify_keys.push(key.to_owned());
                        }
                        (Some(ours), Some(theirs)) if ours < theirs => {
                            summary.kept_newer += 1;
                            kv_done = false;
                        }
                        _ => {
                            summary.refused.push((
                                key.to_owned(),
                                "the destination holds a different record of the same age; compare them with `show` and remove the wrong one".into(),
                            ));
                            kv_done = false;
                        }
                    }
                }
                // Expired between the two calls: try once more next run.
                None => {
                    summary.refused.push((
                        key.to_owned(),
                        "the destination record vanished during the copy; run the copy again"
                            .into(),
                    ));
                    kv_done = false;
                }
            }
        }
        Err(e) => return Err(to.fail(e).into()),
    }
    if let (true, Some((name, kind))) = (kv_done, log_of(key)) {
        if source.log().is_none() || dest.log().is_none() {
            return Ok(());
        }
        let log_ttl = match kind {
            "event" => Some(ttl.event_retention),
            _ => record_ttl,
        };
        copy_log(source, dest, lock, &name, log_ttl, summary, bar).await?;
    }
    Ok(())
}

/// The token of a stream's metadata record, read from its raw envelope
/// (the decoded view redacts it).
fn stream_token(bytes: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()?
        .pointer("/record/token")?
        .as_str()
        .map(str::to_owned)
}

/// Says which numbers a batch got, for the operator.
fn numbers(seqs: &[u64]) -> String {
    match (seqs.first(), seqs.last()) {
        (Some(a), Some(b)) if a == b => format!("number {a}"),
        (Some(a), Some(b)) => format!("numbers {a} to {b}"),
        _ => "no numbers".to_owned(),
    }
}

async fn copy_log(
    source: &Store,
    dest: &Store,
    lock: Option<&DestLock>,
    name: &str,
    ttl: Option<Duration>,
    summary: &mut Summary,
    bar: &ProgressBar,
) -> Result<(), Halt> {
    let Some(dst) = dest.log() else {
        return Ok(());
    };
    let dst_fail = |e| dest.rest.fail(e);
    let records = match source.read_log(name).await {
        Ok(records) => records,
        Err(e @ Error::Corrupt { .. }) => {
            summary.damaged.push((name.to_owned(), e.to_string()));
            return Ok(());
        }
        Err(e) => return Err(source.rest.fail(e).into()),
    };
    let Some(first) = records.first().map(|r| r.seq) else {
        return Ok(());
    };
    for r in &records {
        if let Err(e) = inspect(&format!("{name}#{}", r.seq), &r.data) {
            summary.damaged.push((name.to_owned(), e.to_string()));
            return Ok(());
        }
    }
    if let Some(gap) = records.windows(2).find(|w| w[1].seq != w[0].seq + 1) {
        summary.refused.push((
            name.to_owned(),
            format!(
                "the source log jumps from {} to {}; the destination numbers records one by one, so its event ids could not match",
                gap[0].seq, gap[1].seq
            ),
        ));
        return Ok(());
    }
    bar.inc_length(records.len() as u64);
    let existing = dest.read_log(name).await.map_err(dst_fail)?;
    let by_seq: BTreeMap<u64, &LogRecord> = records.iter().map(|r| (r.seq, r)).collect();
    for r in existing.iter().filter(|r| r.seq >= first) {
        if by_seq.get(&r.seq).is_none_or(|s| s.data != r.data) {
            summary.refused.push((
                name.to_owned(),
                format!(
                    "the destination log differs from the source at sequence number {}; delete it there (`mcp-persist rm` on its stream or task) and copy again",
                    r.seq
                ),
            ));
            return Ok(());
        }
    }
    let dest_last = existing.last().map_or(0, |r| r.seq);
    let todo: Vec<&LogRecord> = records.iter().filter(|r| r.seq > dest_last).collect();
    let already = records.len() - todo.len();
    summary.log_records_already += already as u64;
    bar.inc(already as u64);
    summary.logs += 1;
    summary.verify_logs.push((name.to_owned(), records.clone()));
    let Some(next) = todo.first().map(|r| r.seq) else {
        return Ok(());
    };
    if next > dest_last + 1 {
        // The source's first records were dropped by retention: number the
        // destination up to the same place, then drop the padding.
        let mut missing = next - dest_last - 1;
        while missing > 0 {
            checkpoint(lock, || format!("{name}, before sequence number {next}"))?;
            let n = missing.min(BATCH as u64);
            dst.append(
                &crate::model::key(name)?,
                vec![b"{}".to_vec(); n as usize],
                ttl,
            )
            .await
            .map_err(dst_fail)?;
            missing -= n;
        }
    }
    for chunk in todo.chunks(BATCH) {
        let expected: Vec<u64> = chunk.iter().map(|r| r.seq).collect();
        checkpoint(lock, || {
            format!("{name}, before sequence number {}", expected[0])
        })?;
        let got = dst
            .append(
                &crate::model::key(name)?,
                chunk.iter().map(|r| r.data.clone()).collect(),
                ttl,
            )
            .await
            .map_err(dst_fail)?;
        if got != expected {
            summary.refused.push((
                name.to_owned(),
                format!(
                    "the destination gave these records {} where the source has {}: something else appended to this log meanwhile (a server writing to it, or a copy of another version), so resumed event ids would not match; delete the log there (`mcp-persist rm` on its stream or task) and copy again",
                    numbers(&got),
                    numbers(&expected)
                ),
            ));
            return Ok(());
        }
        summary.log_records_appended += chunk.len() as u64;
        bar.inc(chunk.len() as u64);
    }
    if dst
        .read_after(&crate::model::key(name)?, 0, 1)
        .await
        .map_err(dst_fail)?
        .first()
        .is_some_and(|r| r.seq < first)
    {
        dst.trim(&crate::model::key(name)?, first)
            .await
            .map_err(dst_fail)?;
    }
    Ok(())
}

/// Reads back what was copied; returns what does not match. A log must
/// hold exactly the source's records from the source's first on: one more
/// is as wrong as one fewer.
async fn verify(dest: &Store, summary: &Summary) -> Result<Vec<String>, Failure> {
    let mut mismatches = Vec::new();
    for key in &summary.verify_keys {
        let to = dest.backend_for(key);
        if to
            .kv
            .get(&crate::model::key(key)?)
            .await
            .map_err(|e| to.fail(e))?
            .is_none()
        {
            mismatches.push(format!("{key}: missing in the destination"));
        }
    }
    for (name, records) in &summary.verify_logs {
        let first = records.first().map_or(0, |r| r.seq);
        let got = dest.read_log(name).await.map_err(|e| dest.rest.fail(e))?;
        let got: Vec<&LogRecord> = got.iter().filter(|r| r.seq >= first).collect();
        if got.len() != records.len()
            || records
                .iter()
                .zip(&got)
                .any(|(a, b)| a.seq != b.seq || a.data != b.data)
        {
            mismatches.push(format!(
                "{name}: the destination holds {} records from {first} on, the source {}",
                got.len(),
                records.len()
            ));
        }
    }
    Ok(mismatches)
}

fn report(
    source: &Store,
    dest: &Destination<'_>,
    s: &Summary,
    mismatches: &[String],
    dry_run: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    if json {
        print_json(
            out,
            &json!({
                "source": source.label,
                "destination": dest.label,
                "dry_run": dry_run,
                "destination_new": dest.new,
                "would_copy": s.would_copy,
                "copied": s.copied,
                "already_there": s.already,
                "replaced_older": s.replaced_older,
                "kept_newer_in_destination": s.kept_newer,
                "expired_skipped": s.expired,
                "leases_skipped": s.transient,
                "logs": s.logs,
                "log_records_appended": s.log_records_appended,
                "log_records_already_there": s.log_records_already,
                "refused": s.refused.iter().map(|(k, r)| json!({"key": k, "reason": r})).collect::<Vec<_>>(),
                "damaged": s.damaged.iter().map(|(k, r)| json!({"key": k, "reason": r})).collect::<Vec<_>>(),
                "verified": !dry_run && mismatches.is_empty(),
                "mismatches": mismatches,
            }),
        )?;
        return Ok(());
    }
    if dry_run {
        let new = if dest.new {
            "; it does not exist yet and would be created"
        } else {
            ""
        };
        writeln!(
            out,
            "dry run: {} records would be copied from {} to {}{new} ({} expired and {} leases would be skipped, {} damaged); nothing was written",
            s.would_copy,
            source.label,
            dest.label,
            s.expired,
            s.transient,
            s.damaged.len()
        )?;
        return Ok(());
    }
    if !s.refused.is_empty() || !s.damaged.is_empty() {
        let mut table = Table::new(&["KEY", "NOT COPIED BECAUSE"]);
        for (k, r) in s.refused.iter().chain(&s.damaged) {
            table.row(vec![k.clone(), r.clone()]);
        }
        table.print(out)?;
        writeln!(out)?;
    }
    writeln!(out, "copied {} to {}:", source.label, dest.label)?;
    writeln!(
        out,
        "  records: {} copied, {} already there, {} older ones replaced, {} kept (newer in the destination)",
        s.copied, s.already, s.replaced_older, s.kept_newer
    )?;
    writeln!(
        out,
        "  skipped: {} expired, {} leases, {} damaged, {} refused",
        s.expired,
        s.transient,
        s.damaged.len(),
        s.refused.len()
    )?;
    writeln!(
        out,
        "  logs:    {} ({} records appended, {} already there)",
        s.logs, s.log_records_appended, s.log_records_already
    )?;
    if mismatches.is_empty() {
        writeln!(
            out,
            "verified: {} records and {} logs read back identical",
            s.verify_keys.len(),
            s.verify_logs.len()
        )?;
    } else {
        writeln!(out, "verification FAILED:")?;
        for m in mismatches {
            writeln!(out, "  {m}")?;
        }
    }
    Ok(())
}
