//! `check`: every record decoded under the current schema, every log read
//! through and its records decoded.

use std::io::Write;

use mcp_persist_core::{Error, stores::inspect::inspect};
use serde_json::json;

use crate::{
    fail::{Code, Failure},
    inventory::{Ctx, read_log},
    model::{BUS_LOG, Kind, log_of},
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

/// Runs the check; returns the failing exit code, if anything is wrong
/// (1 damaged, 4 written by a newer version only).
pub(crate) async fn check(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<Option<Code>, Failure> {
    let mut findings = Vec::new();
    let mut records = 0u64;
    let mut logs = Vec::new();
    for read in ctx.read_all("").await? {
        records += 1;
        match &read.record {
            Ok(rec) => {
                let expected = Kind::record_kinds(&read.key);
                if !expected.is_empty() && !expected.contains(&rec.kind) {
                    findings.push(Finding {
                        key: read.key.clone(),
                        reason: format!(
                            "holds a {} record where a {} belongs",
                            rec.kind,
                            expected.join(" or ")
                        ),
                        newer: false,
                    });
                }
            }
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
    logs.push((BUS_LOG.to_owned(), "fleet_notice"));
    let mut log_records = 0u64;
    let mut logs_checked = 0u64;
    let mut damaged_logs = Vec::new();
    if let Some(log) = ctx.log() {
        for (name, kind) in &logs {
            let records = match read_log(&**log, name).await {
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
                Err(e) => return Err(Failure::store(&ctx.store.rest.label, e)),
            };
            if !records.is_empty() {
                logs_checked += 1;
            }
            let mut last = 0;
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
                match inspect(&at, &r.data) {
                    Ok(rec) if rec.kind != *kind => findings.push(Finding {
                        key: at,
                        reason: format!("holds a {} record where a {kind} belongs", rec.kind),
                        newer: false,
                    }),
                    Ok(_) => {}
                    Err(e) => findings.push(Finding {
                        key: at,
                        reason: reason(&e),
                        newer: matches!(e, Error::NewerSchema { .. }),
                    }),
                }
            }
        }
    }
    // The file backend can also read every segment and file in full,
    // including logs no record names any more.
    for backend in ctx.store.backends() {
        if let Some(file) = &backend.file {
            let report = file
                .verify()
                .await
                .map_err(|e| Failure::store(&backend.label, e))?;
            for problem in report.problems {
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
        print_json(
            out,
            &json!({
                "store": ctx.store.label,
                "records": records,
                "logs": logs_checked,
                "log_records": log_records,
                "damaged": findings.iter().map(|f| json!({
                    "key": f.key, "reason": f.reason, "newer_schema": f.newer,
                })).collect::<Vec<_>>(),
            }),
        )?;
    } else {
        if !findings.is_empty() {
            let mut table = Table::new(&["KEY", "PROBLEM"]);
            for f in &findings {
                table.row(vec![f.key.clone(), f.reason.clone()]);
            }
            table.print(out)?;
            writeln!(out)?;
        }
        let file_store = ctx.store.backends().iter().any(|b| b.file.is_some());
        if file_store && !damaged_logs.is_empty() {
            writeln!(
                out,
                "to set the damaged logs aside and let their streams go on: mcp-persist quarantine {} {}\n",
                ctx.store.label,
                damaged_logs.join(" ")
            )?;
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
