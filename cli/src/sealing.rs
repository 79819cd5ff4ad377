//! Sealed stores on the command line: `--keyring`, opening sealed records
//! for `show`, `ls`, `stats` and `check`, and `rekey`.
//!
//! Without a keyring, a sealed record is shown as sealed (its key, kind and
//! the id of the key it needs), never as damage; with one, it is opened and
//! shown like any other, and `check` reports the records under keys the
//! ring no longer holds.

use std::{io::Write, time::Duration};

use mcp_persist::{
    Error, Key, Timestamp,
    seal::{
        EnvKeys, FileKeys, KeySource, Keyring, LogFinding, Rekey, RekeyOptions, RekeyReport,
        SealInfo, SealProblem, Sealing,
    },
};
use serde_json::{Value, json};

use crate::{
    copy::progress,
    fail::{Code, Failure, usage},
    interrupt,
    model::format_time,
    output::{Level, Table, diag, or_dash, print_json},
    target::{Backend, Store},
};

/// The keyring source forms, for help texts.
pub(crate) const KEYRING_FORMS: &str = "\
Keyring sources (--keyring): base64 keys, the active one first, separated by
newlines, commas or spaces:
  env:VAR                     an environment variable
  file:PATH                   a file only its owner may read (chmod 600)
  secretsmanager:SECRET_ID    an AWS Secrets Manager secret (region and
                              credentials from the AWS environment)";

/// Loads the keyring `spec` names, if any.
pub(crate) async fn load(spec: Option<&str>) -> Result<Option<Keyring>, Failure> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let source: Box<dyn KeySource> = match spec.split_once(':') {
        Some(("env", var)) if !var.is_empty() => Box::new(EnvKeys::new(var)),
        Some(("file", path)) if !path.is_empty() => Box::new(FileKeys::new(path)),
        Some(("secretsmanager", id)) if !id.is_empty() => Box::new(
            mcp_persist::vault::SecretsManagerKeys::from_env(id)
                .await
                .map_err(|e| usage(e.to_string()))?,
        ),
        _ => {
            return Err(usage(format!(
                "`{spec}` is not a keyring source\n{KEYRING_FORMS}"
            )));
        }
    };
    let ring = source.load().await.map_err(|e| {
        let code = match e {
            Error::NotFound { .. } | Error::Unavailable { .. } => Code::Unreachable,
            Error::InvalidInput { .. } => Code::Usage,
            _ => Code::Other,
        };
        Failure::new(code, format!("the keyring cannot be loaded: {e}"))
    })?;
    diag(
        Level::Note,
        &format!(
            "keyring from {}: active key {}, {} key(s)",
            source.describe(),
            ring.active(),
            ring.ids().len()
        ),
    );
    Ok(Some(ring))
}

/// The problem of a sealed value read without a keyring.
fn no_keyring(info: &SealInfo) -> SealProblem {
    SealProblem::MissingKey {
        key_id: info.key_id,
    }
}

/// Opens a value read from key-value record `key`: plain text as it is, a
/// sealed value with `ring` (or [`Error::Sealing`] without one). Also says
/// how it was sealed.
pub(crate) fn open_value(
    ring: Option<&Keyring>,
    key: &str,
    bytes: Vec<u8>,
) -> (Result<Vec<u8>, Error>, Option<SealInfo>) {
    let Some(info) = mcp_persist::seal::info(&bytes) else {
        // Plain text, or a damaged envelope the ring reports.
        return match ring {
            Some(ring) if bytes.first() == Some(&0xFF) => (ring.open(key, &bytes), None),
            _ => (Ok(bytes), None),
        };
    };
    let opened = match ring {
        Some(ring) => ring.open(key, &bytes),
        None => Err(Error::Sealing {
            key: key.to_owned(),
            problem: no_keyring(&info),
        }),
    };
    (opened, Some(info))
}

/// Opens record `seq` of `log`, as [`open_value`] does.
pub(crate) fn open_log_record(
    ring: Option<&Keyring>,
    log: &str,
    seq: u64,
    data: &[u8],
) -> Result<Vec<u8>, Error> {
    match (mcp_persist::seal::info(data), ring) {
        (None, _) if data.first() != Some(&0xFF) => Ok(data.to_vec()),
        (_, Some(ring)) => ring.open_log_record(log, seq, data),
        (Some(info), None) => Err(Error::Sealing {
            key: format!("{log}#{seq}"),
            problem: no_keyring(&info),
        }),
        (None, None) => Ok(data.to_vec()),
    }
}

/// Whether `error` is a sealed record read without a keyring.
pub(crate) fn is_sealed_without_keyring(ring: Option<&Keyring>, error: &Error) -> bool {
    ring.is_none()
        && matches!(
            error,
            Error::Sealing {
                problem: SealProblem::MissingKey { .. },
                ..
            }
        )
}

/// Says that `count` sealed records were left out for want of a keyring.
pub(crate) fn note_sealed(count: usize) {
    if count > 0 {
        diag(
            Level::Note,
            &format!(
                "{count} sealed record(s) not shown: pass --keyring SOURCE to open them (`mcp-persist show` names the key each needs)"
            ),
        );
    }
}

/// How `show` presents a sealed record it cannot open.
pub(crate) fn sealed_view(key: &str, bytes: usize, version: u64, info: &SealInfo) -> Value {
    json!({
        "key": key,
        "kind": mcp_persist::declare::of_key(key).map(|d| d.kind),
        "version": version,
        "bytes": bytes,
        "sealed": {
            "key_id": info.key_id.to_string(),
            "expires_at": info.expires_at.map(format_time),
        },
    })
}

/// Key ids of the records `mcp_persist::seal::check` found, for `check`.
pub(crate) async fn key_use(store: &Store, ring: &Keyring) -> Result<Value, Failure> {
    let sealing = Sealing::new(ring.clone());
    let mut by_key = std::collections::BTreeMap::new();
    for backend in store.backends() {
        let found =
            mcp_persist::seal::check(&*backend.kv, backend.log.as_deref(), &sealing, |_| {})
                .await
                .map_err(|e| backend.fail(e))?;
        for (id, n) in found.by_key {
            *by_key.entry(id).or_insert(0u64) += n;
        }
    }
    Ok(Value::Array(
        by_key
            .into_iter()
            .map(|(id, records)| {
                let role = if id == ring.active() {
                    "active"
                } else if ring.holds(id) {
                    "old"
                } else {
                    "not in the keyring"
                };
                json!({"key_id": id.to_string(), "records": records, "key": role})
            })
            .collect(),
    ))
}

/// One line of `check`'s output on the keys in use.
pub(crate) fn key_use_line(keys: &Value) -> String {
    let parts: Vec<String> = keys
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            format!(
                "{} record(s) under key {} ({})",
                k["records"],
                k["key_id"].as_str().unwrap_or("?"),
                k["key"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if parts.is_empty() {
        "sealing: no sealed record".to_owned()
    } else {
        format!("sealing: {}", parts.join(", "))
    }
}

/// What `rekey` is asked to do.
pub(crate) struct RekeyArgs {
    /// The scope the applications seal with.
    pub(crate) everything: bool,
    /// The clients' refresh lease TTL.
    pub(crate) lease_ttl: Duration,
    /// Resume after this key.
    pub(crate) start_after: Option<String>,
}

/// `rekey`: every backend of the store re-sealed under the ring's active
/// key while the applications run; stops at Ctrl-C and says how to go on.
pub(crate) async fn rekey(
    store: &Store,
    ring: Keyring,
    args: RekeyArgs,
    json: bool,
    out: &mut impl Write,
) -> Result<Option<Code>, Failure> {
    let mut sealing = Sealing::new(ring.clone());
    if args.everything {
        sealing = sealing.seal_everything();
    }
    let start_after = args
        .start_after
        .as_deref()
        .map(crate::model::key)
        .transpose()?;
    let options = RekeyOptions::default()
        .lease_ttl(args.lease_ttl)
        .start_after(start_after);
    interrupt::install();
    let mut reports = Vec::new();
    for backend in store.backends() {
        let bar = progress(0, json);
        bar.set_message(backend.label.clone());
        let last = std::sync::Mutex::new(None::<Key>);
        let rekey =
            Rekey::new(&sealing, backend.kv.clone(), backend.log.clone()).options(options.clone());
        let run = rekey.run(|p| {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
            if p.state.is_some() {
                *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(p.name.clone());
            }
        });
        let report = tokio::select! {
            report = run => report.map_err(|e| backend.fail(e))?,
            () = interrupted() => {
                bar.abandon();
                let at = last
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map(|k| format!(" after {k}"))
                    .unwrap_or_default();
                return Err(Failure::new(
                    Code::Interrupted,
                    format!("rekey of {} interrupted{at}", backend.label),
                )
                .with_hint(
                    "run the same command again: records already under the active key are only read, so it goes on where it stopped (--start-after KEY skips even those)",
                ));
            }
        };
        bar.finish_and_clear();
        reports.push((backend, report));
    }
    print_reports(store, &ring, &reports, json, out)?;
    let incomplete = reports
        .iter()
        .any(|(_, r)| !r.busy.is_empty() || !r.unreadable.is_empty());
    Ok(incomplete.then_some(Code::Damaged))
}

/// Resolves once Ctrl-C was pressed.
async fn interrupted() {
    while !interrupt::requested() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_row(log: &LogFinding, ring: &Keyring) -> Value {
    let old: u64 = log
        .by_key
        .iter()
        .filter(|(id, _)| **id != ring.active())
        .map(|(_, n)| n)
        .sum();
    json!({
        "log": log.log.to_string(),
        "records": log.records,
        "under_old_keys": old,
        "plain": log.plain,
        "keys": log.by_key.keys().map(ToString::to_string).collect::<Vec<_>>(),
        "expires_at": log.expires_at.map(format_time),
    })
}

fn print_reports(
    store: &Store,
    ring: &Keyring,
    reports: &[(&Backend, RekeyReport)],
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let until: Option<Timestamp> = reports
        .iter()
        .filter_map(|(_, r)| r.old_keys_needed_until())
        .max();
    if json {
        let value = json!({
            "store": store.label,
            "active_key": ring.active().to_string(),
            "backends": reports.iter().map(|(b, r)| json!({
                "backend": b.label,
                "records": r.records,
                "resealed": r.resealed,
                "sealed_plaintext": r.sealed_plaintext,
                "current": r.current,
                "plain_by_scope": r.plain_by_scope,
                "plain_until_expiry": r.plain_until_expiry.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "busy": r.busy.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "unreadable": r.unreadable.iter().map(|(k, p)| json!({"key": k.to_string(), "problem": p.to_string()})).collect::<Vec<_>>(),
                "logs": r.logs.iter().map(|l| log_row(l, ring)).collect::<Vec<_>>(),
                "last_key": r.last_key.as_ref().map(ToString::to_string),
            })).collect::<Vec<_>>(),
            "old_keys_needed_until": until.map(format_time),
        });
        print_json(out, &value)?;
        return Ok(());
    }
    for (backend, r) in reports {
        writeln!(
            out,
            "{}: {} record(s) under key {}: {} re-sealed, {} sealed (were plain), {} already current, {} plain by scope",
            backend.label,
            r.records,
            ring.active(),
            r.resealed,
            r.sealed_plaintext,
            r.current,
            r.plain_by_scope
        )?;
        if !r.plain_until_expiry.is_empty() {
            writeln!(
                out,
                "  left in plain text until they expire (a plain record does not say its TTL; their next write seals them):"
            )?;
            for key in &r.plain_until_expiry {
                writeln!(out, "    {key}")?;
            }
        }
        if !r.busy.is_empty() {
            writeln!(
                out,
                "  in use (a client was refreshing them): run rekey again to finish:"
            )?;
            for key in &r.busy {
                writeln!(out, "    {key}")?;
            }
        }
        if !r.unreadable.is_empty() {
            let mut table = Table::new(&["KEY", "PROBLEM"]);
            for (key, problem) in &r.unreadable {
                table.row(vec![key.to_string(), format!("record {problem}")]);
            }
            writeln!(out, "  cannot be re-sealed:")?;
            table.print(out)?;
        }
        if !r.logs.is_empty() {
            writeln!(
                out,
                "  logs still holding records under old keys (logs are append-only: these go when the log expires or is trimmed):"
            )?;
            let mut table = Table::new(&["LOG", "RECORDS", "OLD OR PLAIN", "EXPIRES"]);
            for log in &r.logs {
                let row = log_row(log, ring);
                table.row(vec![
                    log.log.to_string(),
                    log.records.to_string(),
                    (row["under_old_keys"].as_u64().unwrap_or(0) + log.plain).to_string(),
                    or_dash(log.expires_at.map(format_time)),
                ]);
            }
            table.print(out)?;
        }
    }
    match until {
        Some(t) => writeln!(
            out,
            "keep the old keys in the keyring until {}; then `mcp-persist check --keyring …` without them should find nothing they sealed",
            format_time(t)
        )?,
        None if reports.iter().all(|(_, r)| r.logs.is_empty()) => writeln!(
            out,
            "nothing is sealed with an old key any more: old keys can leave the keyring"
        )?,
        None => writeln!(
            out,
            "some logs under old keys have no TTL: keep the old keys until `mcp-persist check` no longer finds them"
        )?,
    }
    Ok(())
}
