//! `ls`, `show` and `stats`: what a store holds, read through core's record
//! types, secrets never shown.

use std::{collections::BTreeMap, io::Write};

use mcp_persist::{
    Credentials, Timestamp, declare,
    records::decode,
    stores::inspect::{Inspected, inspect},
};
use serde_json::{Value, json};

use crate::{
    fail::{Code, Failure},
    model::{
        Expiry, Kind, TtlPolicy, components, created_at, format_duration, format_time, is_log_name,
        log_of, standalone_logs, time_at,
    },
    output::{Level, Table, diag, or_dash, print_json},
    sealing,
    target::Store,
};

/// What every reading command needs.
pub(crate) struct Ctx<'a> {
    /// The store.
    pub(crate) store: &'a Store,
    /// TTLs the records do not carry.
    pub(crate) ttl: TtlPolicy,
    /// JSON instead of a table.
    pub(crate) json: bool,
    /// The keyring that opens sealed records, if given.
    pub(crate) keys: Option<&'a mcp_persist::seal::Keyring>,
}

/// A record read and decoded, or why not.
pub(crate) struct Read {
    /// Its key.
    pub(crate) key: String,
    /// Its size in bytes.
    pub(crate) bytes: usize,
    /// Its version.
    pub(crate) version: u64,
    /// The decoded record, or the reason it is damaged.
    pub(crate) record: Result<Inspected, mcp_persist::Error>,
    /// How it is sealed, when it is.
    pub(crate) sealed: Option<mcp_persist::seal::SealInfo>,
}

impl Ctx<'_> {
    /// Reads and decodes the record under `key`; `None` when absent.
    pub(crate) async fn read(&self, key: &str) -> Result<Option<Read>, Failure> {
        let backend = self.store.backend_for(key);
        match backend.kv.get(&crate::model::key(key)?).await {
            Ok(None) => Ok(None),
            Ok(Some(entry)) => {
                let (bytes, version) = (entry.value.len(), entry.version.get());
                let (opened, sealed) = sealing::open_value(self.keys, key, entry.value);
                Ok(Some(Read {
                    key: key.to_owned(),
                    bytes,
                    version,
                    record: opened.and_then(|plain| inspect(key, &plain)),
                    sealed,
                }))
            }
            Err(
                e @ (mcp_persist::Error::Corrupt { .. } | mcp_persist::Error::NewerSchema { .. }),
            ) => Ok(Some(Read {
                key: key.to_owned(),
                bytes: 0,
                version: 0,
                record: Err(e),
                sealed: None,
            })),
            Err(e) => Err(backend.fail(e)),
        }
    }

    /// Reads every record under `prefix`, skipping keys that vanished
    /// between the listing and the read.
    /// Sealed records are left out without a keyring (with a note saying
    /// so): they are not damage.
    pub(crate) async fn read_all(&self, prefix: &str) -> Result<Vec<Read>, Failure> {
        let mut out = Vec::new();
        let mut sealed = 0;
        for key in self.store.list(prefix).await? {
            if let Some(read) = self.read(&key).await? {
                if matches!(&read.record, Err(e) if sealing::is_sealed_without_keyring(self.keys, e))
                {
                    sealed += 1;
                    continue;
                }
                out.push(read);
            }
        }
        sealing::note_sealed(sealed);
        Ok(out)
    }

    /// Opens record `seq` of `log` (see [`sealing::open_log_record`]).
    pub(crate) fn open_log_record(
        &self,
        log: &str,
        seq: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, mcp_persist::Error> {
        sealing::open_log_record(self.keys, log, seq, data)
    }

    /// Whether the store holds logs.
    pub(crate) fn has_logs(&self) -> bool {
        self.store.log().is_some()
    }
}

fn warn_damaged(damaged: usize) {
    if damaged > 0 {
        diag(
            Level::Warning,
            &format!(
                "{damaged} record(s) could not be read and are not listed; run `mcp-persist check` for the reasons"
            ),
        );
    }
}

fn time_cell(t: Option<Timestamp>) -> String {
    or_dash(t.map(format_time))
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn ttl_left(expiry: Expiry) -> (String, Value) {
    match expiry {
        Expiry::At(t) => {
            let left = t.since(Timestamp::now());
            (format_duration(left), json!(left.as_secs()))
        }
        Expiry::Never => ("never".into(), Value::Null),
        Expiry::Transient => ("lease".into(), Value::Null),
    }
}

/// `ls sessions`.
pub(crate) async fn ls_sessions(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut table = Table::new(&[
        "ID",
        "PRINCIPAL",
        "CLIENT",
        "CLIENT VERSION",
        "PROTOCOL",
        "CREATED",
        "LAST SEEN",
        "TTL LEFT",
    ]);
    let mut rows = Vec::new();
    let mut damaged = 0;
    for read in ctx.read_all(declare::SERVER_SESSION.prefix).await? {
        let Ok(rec) = read.record else {
            damaged += 1;
            continue;
        };
        let r = &rec.record;
        let (ttl_text, ttl_secs) = ttl_left(ctx.ttl.expiry(&rec));
        let row = json!({
            "id": str_at(r, "/session_id"),
            "principal": str_at(r, "/principal"),
            "client_name": str_at(r, "/initialize_params/clientInfo/name"),
            "client_version": str_at(r, "/initialize_params/clientInfo/version"),
            "protocol_version": str_at(r, "/initialize_params/protocolVersion"),
            "created": time_at(r, "/created_at").map(format_time),
            "last_seen": time_at(r, "/last_seen").map(format_time),
            "ttl_left_secs": ttl_secs,
        });
        table.row(vec![
            or_dash(str_at(r, "/session_id")),
            or_dash(str_at(r, "/principal")),
            or_dash(str_at(r, "/initialize_params/clientInfo/name")),
            or_dash(str_at(r, "/initialize_params/clientInfo/version")),
            or_dash(str_at(r, "/initialize_params/protocolVersion")),
            time_cell(time_at(r, "/created_at")),
            time_cell(time_at(r, "/last_seen")),
            ttl_text,
        ]);
        rows.push(row);
    }
    warn_damaged(damaged);
    emit(ctx, out, table, rows)
}

fn emit(
    ctx: &Ctx<'_>,
    out: &mut impl Write,
    table: Table,
    rows: Vec<Value>,
) -> Result<(), Failure> {
    if ctx.json {
        print_json(out, &Value::Array(rows))?;
    } else {
        table.print(out)?;
    }
    Ok(())
}

/// `ls events`.
pub(crate) async fn ls_events(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut table = Table::new(&["STREAM", "SESSION", "EVENTS", "LAST SEQ", "AGE"]);
    let mut rows = Vec::new();
    let mut damaged = 0;
    for read in ctx.read_all(declare::EVENT_STREAM.prefix).await? {
        let Ok(rec) = read.record else {
            damaged += 1;
            continue;
        };
        let stream = components(&read.key)
            .and_then(|c| c.into_iter().next())
            .unwrap_or_else(|| read.key.clone());
        let (events, last) = match (ctx.has_logs(), log_of(&read.key)) {
            (true, Some((name, _))) => match ctx.store.read_log(&name).await {
                Ok(records) => (
                    Some(records.len()),
                    records.last().map(|r| r.seq).unwrap_or(0),
                ),
                Err(_) => {
                    damaged += 1;
                    (None, 0)
                }
            },
            _ => (None, 0),
        };
        let created = time_at(&rec.record, "/created_at");
        let age = created.map(|c| Timestamp::now().since(c));
        table.row(vec![
            stream.clone(),
            or_dash(str_at(&rec.record, "/session")),
            or_dash(events),
            last.to_string(),
            or_dash(age.map(format_duration)),
        ]);
        rows.push(json!({
            "stream": stream,
            "session": str_at(&rec.record, "/session"),
            "events": events,
            "last_seq": last,
            "age_secs": age.map(|a| a.as_secs()),
        }));
    }
    warn_damaged(damaged);
    emit(ctx, out, table, rows)
}

/// `ls clients`.
pub(crate) async fn ls_clients(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    #[derive(Default)]
    struct Server {
        era: Option<String>,
        protocol: Option<String>,
        session: Option<String>,
        inflight: usize,
    }
    let mut servers: BTreeMap<(String, String), Server> = BTreeMap::new();
    let mut damaged = 0;
    let client_kinds = [
        &declare::SERVER_PROFILE,
        &declare::LEGACY_SESSION,
        &declare::IN_FLIGHT_REQUEST,
    ];
    for d in client_kinds {
        for read in ctx.read_all(d.prefix).await? {
            let Some(parts) = d.parse(&read.key) else {
                continue;
            };
            let [profile, endpoint, ..] = parts.as_slice() else {
                continue;
            };
            let server = servers
                .entry((endpoint.clone(), profile.clone()))
                .or_default();
            let Ok(rec) = read.record else {
                damaged += 1;
                continue;
            };
            if d == &declare::SERVER_PROFILE {
                server.era = str_at(&rec.record, "/era").map(str::to_owned);
                server.protocol = server
                    .protocol
                    .take()
                    .or_else(|| str_at(&rec.record, "/protocol_version").map(str::to_owned));
            } else if d == &declare::LEGACY_SESSION {
                server.session = str_at(&rec.record, "/session_id").map(str::to_owned);
                server.protocol = str_at(&rec.record, "/protocol_version").map(str::to_owned);
            } else {
                server.inflight += 1;
            }
        }
    }
    warn_damaged(damaged);
    let mut table = Table::new(&[
        "SERVER",
        "PROFILE",
        "ERA",
        "PROTOCOL",
        "SESSION",
        "IN-FLIGHT",
    ]);
    let mut rows = Vec::new();
    for ((endpoint, profile), s) in servers {
        table.row(vec![
            endpoint.clone(),
            profile.clone(),
            or_dash(s.era.as_deref()),
            or_dash(s.protocol.as_deref()),
            or_dash(s.session.as_deref()),
            s.inflight.to_string(),
        ]);
        rows.push(json!({
            "server": endpoint,
            "profile": profile,
            "era": s.era,
            "protocol_version": s.protocol,
            "session": s.session,
            "in_flight": s.inflight,
        }));
    }
    emit(ctx, out, table, rows)
}

/// `ls credentials`: issuer, resource, scopes, expiry and whether a refresh
/// token is held, never any token text.
pub(crate) async fn ls_credentials(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut table = Table::new(&["ISSUER", "RESOURCE", "SCOPES", "EXPIRES", "REFRESH TOKEN"]);
    let mut rows = Vec::new();
    let mut damaged = 0;
    for key in ctx.store.list(declare::CREDENTIALS.prefix).await? {
        let backend = ctx.store.backend_for(&key);
        let entry = match backend.kv.get(&crate::model::key(&key)?).await {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(mcp_persist::Error::Corrupt { .. }) => {
                damaged += 1;
                continue;
            }
            Err(e) => return Err(backend.fail(e)),
        };
        let value = match sealing::open_value(ctx.keys, &key, entry.value) {
            (Ok(value), _) => value,
            (Err(e), Some(_)) if sealing::is_sealed_without_keyring(ctx.keys, &e) => {
                // The key names issuer and resource; the rest is sealed.
                let parts = components(&key).unwrap_or_default();
                let part = |i: usize| parts.get(i).cloned().unwrap_or_default();
                table.row(vec![
                    part(0),
                    part(1),
                    "sealed".into(),
                    "sealed".into(),
                    "sealed".into(),
                ]);
                rows.push(json!({"issuer": part(0), "resource": part(1), "sealed": true}));
                continue;
            }
            (Err(_), _) => {
                damaged += 1;
                continue;
            }
        };
        let Ok(creds) = decode::<Credentials>(&key, &value) else {
            damaged += 1;
            continue;
        };
        let expires = creds.expires_at.map(format_time);
        table.row(vec![
            creds.key.issuer.clone(),
            creds.key.resource.clone(),
            if creds.scopes.is_empty() {
                "-".into()
            } else {
                creds.scopes.join(" ")
            },
            or_dash(expires.as_deref()),
            if creds.refresh_token.is_some() {
                "yes".into()
            } else {
                "no".into()
            },
        ]);
        rows.push(json!({
            "issuer": creds.key.issuer,
            "resource": creds.key.resource,
            "scopes": creds.scopes,
            "expires": expires,
            "refresh_token": creds.refresh_token.is_some(),
        }));
    }
    warn_damaged(damaged);
    emit(ctx, out, table, rows)
}

/// `ls tasks`.
pub(crate) async fn ls_tasks(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut table = Table::new(&[
        "ID",
        "STATUS",
        "PRINCIPAL",
        "OWNER",
        "RUNS",
        "CREATED",
        "UPDATED",
        "TTL LEFT",
    ]);
    let mut rows = Vec::new();
    let mut damaged = 0;
    for read in ctx.read_all(declare::TASK.prefix).await? {
        let Ok(rec) = read.record else {
            damaged += 1;
            continue;
        };
        let r = &rec.record;
        let (ttl_text, ttl_secs) = ttl_left(ctx.ttl.expiry(&rec));
        let status = r.pointer("/status").map(|s| match s {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        table.row(vec![
            or_dash(str_at(r, "/task_id")),
            or_dash(status.as_deref()),
            or_dash(str_at(r, "/principal")),
            or_dash(str_at(r, "/owner/instance")),
            or_dash(r.pointer("/runs").and_then(Value::as_u64)),
            time_cell(time_at(r, "/created_at")),
            time_cell(time_at(r, "/last_updated_at")),
            ttl_text,
        ]);
        rows.push(json!({
            "id": str_at(r, "/task_id"),
            "status": status,
            "principal": str_at(r, "/principal"),
            "owner": str_at(r, "/owner/instance"),
            "runs": r.pointer("/runs"),
            "created": time_at(r, "/created_at").map(format_time),
            "updated": time_at(r, "/last_updated_at").map(format_time),
            "ttl_left_secs": ttl_secs,
        }));
    }
    warn_damaged(damaged);
    emit(ctx, out, table, rows)
}

/// `ls keys`: shared key rings, by name and key id, never key material.
pub(crate) async fn ls_keys(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut table = Table::new(&["NAME", "ACTIVE KEY", "CREATED", "PREVIOUS KEY"]);
    let mut rows = Vec::new();
    let mut damaged = 0;
    for read in ctx.read_all(declare::SHARED_KEY_RING.prefix).await? {
        let Ok(rec) = read.record else {
            damaged += 1;
            continue;
        };
        let r = &rec.record;
        let name = components(&read.key)
            .and_then(|c| c.into_iter().next())
            .unwrap_or_else(|| read.key.clone());
        table.row(vec![
            name.clone(),
            or_dash(str_at(r, "/active/id")),
            time_cell(time_at(r, "/active/created_at")),
            or_dash(str_at(r, "/previous/id")),
        ]);
        rows.push(json!({
            "name": name,
            "active_key": str_at(r, "/active/id"),
            "created": time_at(r, "/active/created_at").map(format_time),
            "previous_key": str_at(r, "/previous/id"),
        }));
    }
    warn_damaged(damaged);
    emit(ctx, out, table, rows)
}

/// `show KEY`: one record decoded, secrets redacted; or a log's records.
pub(crate) async fn show(ctx: &Ctx<'_>, key: &str, out: &mut impl Write) -> Result<(), Failure> {
    if let Some(read) = ctx.read(key).await? {
        if let (Err(e), Some(info)) = (&read.record, &read.sealed)
            && sealing::is_sealed_without_keyring(ctx.keys, e)
        {
            let value = sealing::sealed_view(key, read.bytes, read.version, info);
            if ctx.json {
                print_json(out, &value)?;
            } else {
                writeln!(out, "key:     {key}")?;
                writeln!(out, "kind:    {}", or_dash(value["kind"].as_str()))?;
                writeln!(out, "version: {}", read.version)?;
                writeln!(out, "bytes:   {}", read.bytes)?;
                writeln!(
                    out,
                    "sealed:  with key {}; pass --keyring SOURCE to open it",
                    info.key_id
                )?;
            }
            return Ok(());
        }
        let rec = read
            .record
            .map_err(|e| ctx.store.backend_for(key).fail(e))?;
        let mut value = json!({
            "key": key,
            "kind": rec.kind,
            "schema": rec.schema,
            "version": read.version,
            "bytes": read.bytes,
            "record": rec.record,
        });
        if let Some(info) = &read.sealed {
            value["sealed"] = json!({"key_id": info.key_id.to_string()});
        }
        if ctx.json {
            print_json(out, &value)?;
        } else {
            writeln!(out, "key:     {key}")?;
            writeln!(out, "kind:    {} (schema {})", rec.kind, rec.schema)?;
            writeln!(out, "version: {}", read.version)?;
            writeln!(out, "bytes:   {}", read.bytes)?;
            if let Some(info) = &read.sealed {
                writeln!(out, "sealed:  with key {}", info.key_id)?;
            }
            print_json(out, &rec.record)?;
        }
        return Ok(());
    }
    let is_log = is_log_name(key);
    if is_log && ctx.has_logs() {
        let records = ctx
            .store
            .read_log(key)
            .await
            .map_err(|e| ctx.store.rest.fail(e))?;
        if !records.is_empty() {
            let mut items = Vec::new();
            for r in records {
                let name = format!("{key}#{}", r.seq);
                let decoded = match ctx.open_log_record(key, r.seq, &r.data) {
                    Ok(plain) => inspect(&name, &plain),
                    Err(e) if sealing::is_sealed_without_keyring(ctx.keys, &e) => {
                        let info = mcp_persist::seal::info(&r.data);
                        items.push(json!({"seq": r.seq, "sealed": {
                            "key_id": info.map(|i| i.key_id.to_string()),
                        }}));
                        continue;
                    }
                    Err(e) => Err(e),
                }
                .map_err(|e| ctx.store.rest.fail(e))?;
                items.push(json!({"seq": r.seq, "kind": decoded.kind, "record": decoded.record}));
            }
            let value = json!({"log": key, "records": items});
            if ctx.json {
                print_json(out, &value)?;
            } else {
                writeln!(out, "log:     {key}")?;
                writeln!(
                    out,
                    "records: {}",
                    value["records"].as_array().map_or(0, Vec::len)
                )?;
                print_json(out, &value["records"])?;
            }
            return Ok(());
        }
    }
    Err(Failure::new(
        Code::Other,
        format!(
            "no record or log under `{key}` in {}; list keys with `mcp-persist ls` or `stats`",
            ctx.store.label
        ),
    ))
}

#[derive(Default)]
struct KindStats {
    records: u64,
    bytes: u64,
    damaged: u64,
    oldest: Option<Timestamp>,
    newest: Option<Timestamp>,
}

impl KindStats {
    fn note(&mut self, bytes: usize, at: Option<Timestamp>) {
        self.records += 1;
        self.bytes += bytes as u64;
        if let Some(at) = at {
            self.oldest = Some(self.oldest.map_or(at, |o| o.min(at)));
            self.newest = Some(self.newest.map_or(at, |n| n.max(at)));
        }
    }
}

/// `stats`: counts and bytes per kind, oldest and newest.
pub(crate) async fn stats(ctx: &Ctx<'_>, out: &mut impl Write) -> Result<(), Failure> {
    let mut kinds: BTreeMap<Kind, KindStats> = BTreeMap::new();
    let mut logs: BTreeMap<&'static str, (u64, KindStats)> = BTreeMap::new();
    let mut log_names = Vec::new();
    for read in ctx.read_all("").await? {
        let entry = kinds.entry(Kind::of(&read.key)).or_default();
        match &read.record {
            Ok(rec) => entry.note(read.bytes, created_at(rec)),
            Err(_) => entry.damaged += 1,
        }
        if let Some(name) = log_of(&read.key) {
            log_names.push(name);
        }
    }
    log_names.extend(standalone_logs());
    if ctx.has_logs() {
        for (name, kind) in log_names {
            let label = match kind {
                "event" => "event logs",
                "task_inbox" => "task inboxes",
                _ => "notification bus",
            };
            let entry = logs.entry(label).or_default();
            match ctx.store.read_log(&name).await {
                Ok(records) if records.is_empty() => {}
                Ok(records) => {
                    entry.0 += 1;
                    for r in records {
                        let at = ctx
                            .open_log_record(&name, r.seq, &r.data)
                            .ok()
                            .and_then(|plain| inspect(&name, &plain).ok())
                            .and_then(|i| time_at(&i.record, "/published_at"));
                        entry.1.note(r.data.len(), at);
                    }
                }
                Err(_) => entry.1.damaged += 1,
            }
        }
    }
    let mut table = Table::new(&[
        "KIND", "LOGS", "RECORDS", "BYTES", "DAMAGED", "OLDEST", "NEWEST",
    ]);
    let mut rows = Vec::new();
    let mut add = |name: &str, logs: Option<u64>, s: &KindStats| {
        table.row(vec![
            name.to_owned(),
            or_dash(logs),
            s.records.to_string(),
            s.bytes.to_string(),
            s.damaged.to_string(),
            time_cell(s.oldest),
            time_cell(s.newest),
        ]);
        rows.push(json!({
            "kind": name,
            "logs": logs,
            "records": s.records,
            "bytes": s.bytes,
            "damaged": s.damaged,
            "oldest": s.oldest.map(format_time),
            "newest": s.newest.map(format_time),
        }));
    };
    for (kind, s) in &kinds {
        add(kind.name(), None, s);
    }
    for (name, (count, s)) in &logs {
        if *count > 0 || s.damaged > 0 {
            add(name, Some(*count), s);
        }
    }
    emit(ctx, out, table, rows)
}

/// After a listing of a Redis store named without `?prefix=`: when the
/// store holds nothing at all under the default prefix, says so, and where
/// mcp-persist keys are on that server, so an empty table is not mistaken
/// for an empty store.
pub(crate) async fn explain_empty(store: &Store) {
    use mcp_persist_store_redis::RedisStore;
    let backend = &store.rest;
    let Some((default, prefix)) = backend
        .with_concrete(|redis: &RedisStore| {
            (redis.has_default_prefix(), redis.key_prefix().to_owned())
        })
        .await
    else {
        return;
    };
    if !default || !backend.kv.list("").await.is_ok_and(|keys| keys.is_empty()) {
        return;
    }
    let found = match backend
        .with_concrete(|redis: &RedisStore| redis.clone())
        .await
    {
        Some(redis) => redis.prefixes_in_use(100_000).await,
        None => None,
    };
    let elsewhere = match found {
        Some(found) if found.is_empty() => {
            " No mcp-persist records were found under any other prefix either.".to_owned()
        }
        Some(found) => {
            // The URL as shown: any password masked.
            let base = backend.label.trim_end_matches('/');
            let listed: Vec<String> = found.iter().map(|p| format!("`{p}`")).collect();
            format!(
                " mcp-persist records are on this server under {}: e.g. {base}?prefix={}",
                listed.join(", "),
                query_value(&found[0])
            )
        }
        None => String::new(),
    };
    diag(
        Level::Note,
        &format!(
            "{} holds nothing under the default key prefix `{prefix}`: the URL names no ?prefix=, and an application that sets its own (RedisStore's key_prefix) keeps its keys under that; name it with ?prefix=P.{elsewhere}",
            backend.label
        ),
    );
}

/// A prefix as a URL query value: only what would break the query escaped.
fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' | '&' | '#' | '+' | ' ' | '=' | '?' => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}
