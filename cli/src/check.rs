//! `check`: every record decoded under the current schema, every log read
//! through and its records decoded.

use std::{collections::HashMap, io::Write};

use mcp_persist::{Error, stores::inspect::inspect};
use serde_json::{Value, json};

use crate::{
    fail::{Code, Failure},
    inventory::Ctx,
    model::{log_of, standalone_logs},
    output::{Table, print_json},
};

/// One damaged record or log.
struct Finding {
    key: String,
    reason: String,
    newer: bool,
}

fn reason(error: &Error) -> String {
    match error {
        Error::Corrupt { reason, .. } => reason.clone(),
        Error::NewerSchema {
            found, supported, ..
        } => format!(
            "written with schema {found}, newer than {supported} which this version reads: upgrade mcp-persist-cli"
        ),
        other => other.to_string(),
    }
}

/// What one event log has shown so far, to tell records that cannot be
/// where they are: a message that must be unique seen twice, progress that
/// goes back.
#[derive(Default)]
struct EventOrder {
    /// Messages that may appear once per stream (requests and responses,
    /// by their JSON-RPC id; progress notifications), by their bytes, with
    /// the sequence number they first had.
    once: HashMap<Vec<u8>, u64>,
    /// The last progress of each progress token.
    progress: HashMap<String, f64>,
}

impl EventOrder {
    /// Looks at the event numbered `seq`, stored as `bytes` and decoded as
    /// `record`; says what is wrong with it, if anything.
    fn check(&mut self, seq: u64, bytes: &[u8], record: &Value) -> Option<String> {
        let payload = record.get("payload")?;
        let progress = (payload.get("method").and_then(Value::as_str)
            == Some("notifications/progress"))
        .then(|| {
            let params = payload.get("params")?;
            Some((
                params.get("progressToken")?.to_string(),
                params.get("progress")?.as_f64()?,
            ))
        })
        .flatten();
        let what = match (&progress, payload.get("id"), payload.get("method")) {
            (Some((token, value)), _, _) => Some(format!("progress {value} of token {token}")),
            (None, Some(id), Some(method)) => {
                Some(format!("request {id} ({})", method.as_str().unwrap_or("?")))
            }
            (None, Some(id), None) => Some(format!("the response to request {id}")),
            _ => None,
        };
        if let Some(what) = what {
            if let Some(first) = self.once.get(bytes) {
                return Some(format!(
                    "duplicate of record #{first} ({what}): the same message stored twice; delete its stream with `mcp-persist rm` and copy it again from its source"
                ));
            }
            self.once.insert(bytes.to_vec(), seq);
        }
        if let Some((token, value)) = progress {
            if let Some(before) = self.progress.get(&token).copied()
                && value <= before
            {
                return Some(format!(
                    "out of order: progress {value} of token {token} after progress {before}"
                ));
            }
            self.progress.insert(token, value);
        }
        None
    }
}

/// Runs the check; returns the failing exit code, if anything is wrong
/// (1 damaged, 4 written by a newer version only).
pub(crate) async fn check(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<Option<Code>, Failure> {
    let mut findings = Vec::new();
    let mut records = 0u64;
    let mut logs = Vec::new();
    for read in ctx.read_all("").await? {
        records += 1;
        // `inspect` also refuses a record of another kind than the one
        // declared for its key.
        match &read.record {
            Ok(_) => {}
            Err(e) => findings.push(Finding {
                key: read.key.clone(),
                reason: reason(e),
                newer: matches!(e, Error::NewerSchema { .. }),
            }),
        }
        if let Some(log) = log_of(&read.key) {
            logs.push(log);
        }
    }
    logs.extend(standalone_logs());
    let mut log_records = 0u64;
    let mut sealed_log_records = 0usize;
    let mut logs_checked = 0u64;
    let mut damaged_logs = Vec::new();
    if ctx.has_logs() {
        for (name, kind) in &logs {
            let records = match ctx.store.read_log(name).await {
                Ok(records) => records,
                Err(e @ (Error::Corrupt { .. } | Error::NewerSchema { .. })) => {
                    if matches!(e, Error::Corrupt { .. }) {
                        damaged_logs.push(name.clone());
                    }
                    findings.push(Finding {
                        key: name.clone(),
                        reason: reason(&e),
                        newer: matches!(e, Error::NewerSchema { .. }),
                    });
                    continue;
                }
                Err(e) => return Err(ctx.store.rest.fail(e)),
            };
            if !records.is_empty() {
                logs_checked += 1;
            }
            let mut last = 0;
            let mut order = EventOrder::default();
            for r in records {
                log_records += 1;
                let at = format!("{name}#{}", r.seq);
                if r.seq <= last {
                    findings.push(Finding {
                        key: at.clone(),
                        reason: format!("sequence number {} follows {last}: out of order", r.seq),
                        newer: false,
                    });
                }
                last = r.seq;
                match ctx
                    .open_log_record(name, r.seq, &r.data)
                    .and_then(|plain| inspect(&at, &plain))
                {
                    Ok(rec) if rec.kind != *kind => findings.push(Finding {
                        key: at,
                        reason: format!("holds a {} record where a {kind} belongs", rec.kind),
                        newer: false,
                    }),
                    Ok(rec) => {
                        if *kind == "event"
                            && let Some(problem) = order.check(r.seq, &r.data, &rec.record)
                        {
                            findings.push(Finding {
                                key: at,
                                reason: problem,
                                newer: false,
                            });
                        }
                    }
                    Err(e) if crate::sealing::is_sealed_without_keyring(ctx.keys, &e) => {
                        sealed_log_records += 1;
                    }
                    Err(e) => findings.push(Finding {
                        key: at,
                        reason: reason(&e),
                        newer: matches!(e, Error::NewerSchema { .. }),
                    }),
                }
            }
        }
    }
    crate::sealing::note_sealed(sealed_log_records);
    let key_use = match ctx.keys {
        Some(ring) => Some(crate::sealing::key_use(ctx.store, ring).await?),
        None => None,
    };
    // The file backend can also read every segment and file in full,
    // including logs no record names any more.
    for backend in ctx.store.backends() {
        {
            let problems = backend.kv.verify().await.map_err(|e| backend.fail(e))?;
            for problem in problems {
                if !findings.iter().any(|f| problem.contains(&f.key)) {
                    findings.push(Finding {
                        key: backend.label.clone(),
                        reason: problem,
                        newer: false,
                    });
                }
            }
        }
    }

    let damaged = findings.iter().filter(|f| !f.newer).count();
    let newer = findings.len() - damaged;
    if ctx.json {
        let mut value = json!({
            "store": ctx.store.label,
            "records": records,
            "logs": logs_checked,
            "log_records": log_records,
            "damaged": findings.iter().map(|f| json!({
                "key": f.key, "reason": f.reason, "newer_schema": f.newer,
            })).collect::<Vec<_>>(),
        });
        if let Some(keys) = key_use {
            // Only with --keyring: the records under each key id.
            value["sealing_keys"] = keys;
        }
        print_json(out, &value)?;
    } else {
        if !findings.is_empty() {
            let mut table = Table::new(&["KEY", "PROBLEM"]);
            for f in &findings {
                table.row(vec![f.key.clone(), f.reason.clone()]);
            }
            table.print(out)?;
            writeln!(out)?;
        }
        if !damaged_logs.is_empty() {
            writeln!(
                out,
                "to set the damaged logs aside and let their streams go on: mcp-persist quarantine {} {}\n",
                ctx.store.label,
                damaged_logs.join(" ")
            )?;
        }
        if let Some(keys) = &key_use {
            writeln!(out, "{}", crate::sealing::key_use_line(keys))?;
        }
        writeln!(
            out,
            "checked {records} records and {logs_checked} logs ({log_records} log records) in {}: {}",
            ctx.store.label,
            if findings.is_empty() {
                "all sound".to_owned()
            } else {
                format!("{damaged} damaged, {newer} written by a newer version")
            }
        )?;
    }
    Ok(if damaged > 0 {
        Some(Code::Damaged)
    } else if newer > 0 {
        Some(Code::NewerSchema)
    } else {
        None
    })
}
