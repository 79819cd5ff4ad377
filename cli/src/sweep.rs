//! `rm` and `gc`: deleting records, and sweeping expired state.

use std::io::{BufRead, IsTerminal, Write};

use serde_json::json;

use crate::{
    fail::{Code, Failure},
    model::log_of,
    output::{Level, diag, print_json},
    target::Store,
};

/// Asks on a terminal; anywhere else the command line is the consent.
fn confirm(question: &str, yes: bool) -> Result<bool, Failure> {
    if yes || !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// `rm`: deletes `keys` and every key under `prefix`, with the logs they
/// name.
pub(crate) async fn rm(
    store: &Store,
    mut keys: Vec<String>,
    prefix: Option<String>,
    dry_run: bool,
    yes: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    if let Some(prefix) = prefix {
        keys.extend(store.list(&prefix).await?);
    }
    keys.sort();
    keys.dedup();
    let mut present = Vec::new();
    for key in keys {
        let backend = store.backend_for(&key);
        match backend.kv.get(&crate::model::key(&key)?).await {
            Ok(Some(_)) | Err(mcp_persist::Error::Corrupt { .. }) => present.push(key),
            Ok(None) => diag(Level::Note, &format!("no record under `{key}`")),
            Err(e) => return Err(backend.fail(e)),
        }
    }
    if present.is_empty() {
        return Err(Failure::new(
            Code::Other,
            format!("nothing to delete in {}: no such key", store.label),
        ));
    }
    let logs: Vec<String> = present
        .iter()
        .filter_map(|k| log_of(k).map(|(log, _)| log))
        .collect();
    if dry_run {
        if json {
            print_json(
                out,
                &json!({"dry_run": true, "would_delete": present, "logs": logs}),
            )?;
        } else {
            for key in &present {
                writeln!(out, "would delete {key}")?;
            }
            for log in &logs {
                writeln!(out, "would delete log {log}")?;
            }
            writeln!(
                out,
                "dry run: {} records and {} logs would go",
                present.len(),
                logs.len()
            )?;
        }
        return Ok(());
    }
    if !confirm(
        &format!(
            "delete {} records and {} logs from {}?",
            present.len(),
            logs.len(),
            store.label
        ),
        yes,
    )? {
        writeln!(out, "nothing deleted")?;
        return Ok(());
    }
    let mut deleted = 0u64;
    let mut deleted_logs = 0u64;
    for key in &present {
        // The record first, then its log: a record that outlived its log
        // (an interruption in between) would let a writer start the log
        // again under what the record says, such as an event stream's
        // token, so that an old cursor named a new record. A log without
        // its record is unreachable, and expires.
        let backend = store.backend_for(key);
        if backend
            .kv
            .delete(&crate::model::key(key)?, None)
            .await
            .map_err(|e| backend.fail(e))?
        {
            deleted += 1;
        }
        if let (Some((log, _)), Some(log_store)) = (log_of(key), store.log()) {
            log_store
                .delete_log(&crate::model::key(&log)?)
                .await
                .map_err(|e| store.rest.fail(e))?;
            deleted_logs += 1;
        }
    }
    if json {
        print_json(
            out,
            &json!({"deleted": deleted, "logs_deleted": deleted_logs}),
        )?;
    } else {
        writeln!(out, "deleted {deleted} records and {deleted_logs} logs")?;
    }
    Ok(())
}

/// In-flight journal entries whose client session is gone or replaced.
async fn orphaned_inflight(store: &Store) -> Result<Vec<String>, Failure> {
    use mcp_persist::declare::{IN_FLIGHT_REQUEST, LEGACY_SESSION};
    let mut orphans = Vec::new();
    for key in store.list(IN_FLIGHT_REQUEST.prefix).await? {
        // The entry's components: profile, endpoint, session, request.
        let Some(parts) = IN_FLIGHT_REQUEST.parse(&key) else {
            continue;
        };
        let [profile, endpoint, session, _] = parts.as_slice() else {
            continue;
        };
        let Ok(session_key) = LEGACY_SESSION.try_key(&[profile, endpoint]) else {
            continue;
        };
        let backend = store.backend_for(&session_key);
        let current = match backend.kv.get(&session_key).await {
            Ok(entry) => entry,
            // A damaged session record is `check`'s business, not a sweep's.
            Err(mcp_persist::Error::Corrupt { .. }) => continue,
            Err(e) => return Err(backend.fail(e)),
        };
        let alive = current.is_some_and(|entry| {
            mcp_persist::stores::inspect::inspect(&session_key, &entry.value)
                .ok()
                .and_then(|r| {
                    r.record
                        .pointer("/session_id")
                        .and_then(serde_json::Value::as_str)
                        .map(|id| id == session)
                })
                .unwrap_or(true)
        });
        if !alive {
            orphans.push(key);
        }
    }
    Ok(orphans)
}

/// `gc`: the backends reclaim expired records and logs; in-flight entries
/// of client sessions that are gone are deleted.
pub(crate) async fn gc(
    store: &Store,
    dry_run: bool,
    yes: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let orphans = orphaned_inflight(store).await?;
    if dry_run {
        if json {
            print_json(
                out,
                &json!({"dry_run": true, "orphaned_in_flight": orphans}),
            )?;
        } else {
            for key in &orphans {
                writeln!(out, "would delete {key} (its client session is gone)")?;
            }
            writeln!(
                out,
                "dry run: {} orphaned in-flight entries would go; expired records are invisible already, and the backends' sweep would reclaim their space",
                orphans.len()
            )?;
        }
        return Ok(());
    }
    if !confirm(
        &format!(
            "sweep expired state and {} orphaned in-flight entries in {}?",
            orphans.len(),
            store.label
        ),
        yes,
    )? {
        writeln!(out, "nothing deleted")?;
        return Ok(());
    }
    let mut removed = 0u64;
    for key in &orphans {
        let backend = store.backend_for(key);
        if backend
            .kv
            .delete(&crate::model::key(key)?, None)
            .await
            .map_err(|e| backend.fail(e))?
        {
            removed += 1;
        }
    }
    let mut swept = 0u64;
    for backend in store.backends() {
        swept += backend
            .kv
            .sweep_expired()
            .await
            .map_err(|e| backend.fail(e))?;
    }
    if json {
        print_json(
            out,
            &json!({"expired_swept": swept, "orphaned_in_flight_deleted": removed}),
        )?;
    } else {
        writeln!(
            out,
            "swept {swept} expired records and logs; deleted {removed} orphaned in-flight entries"
        )?;
    }
    Ok(())
}

/// `quarantine`: sets damaged logs of a file store aside, into the store's
/// `quarantine/` directory, so the streams (or tasks) they belong to can go
/// on. Nothing is deleted, and the log's numbering continues above every
/// number it issued, so no event id is ever reused.
pub(crate) async fn quarantine(
    store: &Store,
    logs: &[String],
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let backend = &store.rest;
    let Some(log_store) = &backend.log else {
        return Err(crate::fail::usage(format!(
            "{} holds no logs, so there is none to set aside",
            store.label
        )));
    };
    let mut moved = Vec::new();
    let mut missing = Vec::new();
    for log in logs {
        match log_store.quarantine_log(&crate::model::key(log)?).await {
            Ok(Some(path)) => moved.push((log.clone(), path)),
            Ok(None) => missing.push(log.clone()),
            Err(mcp_persist::Error::Unsupported { .. }) => {
                return Err(crate::fail::usage(format!(
                    "{} cannot set a damaged log aside (only file stores keep logs apart from \
                     the rest); delete the record that names the log with `mcp-persist rm` instead",
                    store.label
                )));
            }
            Err(e) => return Err(backend.fail(e)),
        }
    }
    if json {
        let moved: Vec<_> = moved
            .iter()
            .map(|(log, path)| json!({"log": log, "moved_to": path}))
            .collect();
        print_json(out, &json!({"quarantined": moved, "missing": missing}))?;
    } else {
        for (log, path) in &moved {
            writeln!(out, "set aside log {log} in {path}")?;
        }
        for log in &missing {
            writeln!(out, "no log named {log}")?;
        }
    }
    if moved.is_empty() {
        return Err(Failure::new(
            Code::Other,
            format!("nothing set aside in {}: no such log", store.label),
        ));
    }
    Ok(())
}
