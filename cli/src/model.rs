//! What a key means: its kind, the log it names, the record behind it, and
//! how long it has left.

use std::time::Duration;

use mcp_persist::{
    Key, Timestamp,
    declare::{self, Family, Lifetime},
    stores::inspect::Inspected,
};

/// The kinds of state, as `ls`, `stats` and `copy --kinds` name them: the
/// families of core's record declarations, and `other` for keys no
/// declaration knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Server sessions.
    Sessions,
    /// SSE event streams: their metadata and their logs.
    Events,
    /// Client state: server profiles, legacy sessions, in-flight journal.
    Clients,
    /// Credentials, pending authorizations, resource issuers, refresh leases.
    Credentials,
    /// Durable tasks and their inboxes.
    Tasks,
    /// Shared server keys.
    Keys,
    /// Instance liveness leases.
    Instances,
    /// Anything else.
    Other,
}

impl Kind {
    /// Every kind, in display order.
    pub(crate) const ALL: [Kind; 8] = [
        Kind::Sessions,
        Kind::Events,
        Kind::Clients,
        Kind::Credentials,
        Kind::Tasks,
        Kind::Keys,
        Kind::Instances,
        Kind::Other,
    ];

    /// The kind a declaration's family is listed under.
    fn of_family(family: Family) -> Kind {
        match family {
            Family::Sessions => Kind::Sessions,
            Family::Events => Kind::Events,
            Family::Clients => Kind::Clients,
            Family::Credentials => Kind::Credentials,
            Family::Tasks => Kind::Tasks,
            Family::Keys => Kind::Keys,
            Family::Instances => Kind::Instances,
            _ => Kind::Other,
        }
    }

    /// The kind of a key-value key.
    pub(crate) fn of(key: &str) -> Kind {
        declare::of_key(key).map_or(Kind::Other, |d| Kind::of_family(d.family))
    }

    /// The name used on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Sessions => "sessions",
            Kind::Events => "events",
            Kind::Clients => "clients",
            Kind::Credentials => "credentials",
            Kind::Tasks => "tasks",
            Kind::Keys => "keys",
            Kind::Instances => "instances",
            Kind::Other => "other",
        }
    }
}

/// The log a key-value key names, with the record kind its entries hold:
/// a stream's event log, or a task's inbox.
pub(crate) fn log_of(key: &str) -> Option<(String, &'static str)> {
    let (log, d) = declare::of_key(key)?.log_of(key)?;
    Some((log.to_string(), d.kind))
}

/// Every log that no key-value record names (the fleet bus), with the
/// record kind it holds.
pub(crate) fn standalone_logs() -> Vec<(String, &'static str)> {
    declare::ALL
        .iter()
        .filter(|d| d.space == declare::Space::Log && d.components.is_empty())
        .map(|d| (d.key(&[]).to_string(), d.kind))
        .collect()
}

/// Whether `name` is the name of a declared log.
pub(crate) fn is_log_name(name: &str) -> bool {
    declare::of_log(name).is_some()
}

/// The components of `key` under its declaration, unescaped.
pub(crate) fn components(key: &str) -> Option<Vec<String>> {
    declare::of_key(key)?.parse(key)
}

/// Whether `key` is one the credentials side of a split bundle holds
/// (credentials, pending authorizations, refresh leases, shared keys).
pub(crate) fn is_credential_key(key: &str) -> bool {
    declare::of_key(key).is_some_and(|d| d.role == declare::Role::Credentials)
}

/// The prefixes of every kind the credentials side of a split bundle holds.
pub(crate) fn credential_prefixes() -> Vec<&'static str> {
    declare::ALL
        .iter()
        .filter(|d| d.role == declare::Role::Credentials && d.space == declare::Space::Kv)
        .map(|d| d.prefix)
        .collect()
}

/// A key as the store lists it, for messages of keys typed by an operator.
pub(crate) fn key(text: &str) -> Result<Key, crate::fail::Failure> {
    Key::new(text).map_err(|e| {
        // An oversized key is named by its head: the error says its size.
        let shown = match text.char_indices().nth(SHOWN_KEY_CHARS) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text.to_owned(),
        };
        crate::fail::usage(format!("`{shown}` is not a key: {e}"))
    })
}

/// The most characters of a rejected key an error repeats.
const SHOWN_KEY_CHARS: usize = 80;

/// Reads a timestamp field of a decoded record.
pub(crate) fn time_at(record: &serde_json::Value, pointer: &str) -> Option<Timestamp> {
    record
        .pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .map(Timestamp::from_unix_millis)
}

/// The time a record was last written, by its own account: what `copy`
/// compares to tell the newer of two versions of one key.
pub(crate) fn written_at(inspected: &Inspected) -> Option<Timestamp> {
    inspected.written_at()
}

/// The time a record was created, by its own account.
pub(crate) fn created_at(inspected: &Inspected) -> Option<Timestamp> {
    inspected.created_at()
}

/// TTL settings the records do not carry: the servers' configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TtlPolicy {
    /// The servers' session idle TTL.
    pub(crate) session_idle: Duration,
    /// The servers' event retention.
    pub(crate) event_retention: Duration,
    /// The servers' window for keyed calls.
    pub(crate) call_window: Duration,
    /// How long a pending authorization lives.
    pub(crate) pending_authorization: Duration,
}

/// What happens to a record's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Kept until deleted.
    Never,
    /// Expires at this time.
    At(Timestamp),
    /// Live process state (leases): not migrated.
    Transient,
}

impl TtlPolicy {
    /// When the record under `key` expires, from its own times and the
    /// policy. Leases are transient.
    pub(crate) fn expiry(&self, inspected: &Inspected) -> Expiry {
        let r = &inspected.record;
        match inspected.declaration.lifetime {
            Lifetime::SessionIdle => inspected
                .written_at()
                .map_or(Expiry::Never, |t| Expiry::At(t.plus(self.session_idle))),
            Lifetime::EventRetention => {
                Expiry::At(Timestamp::now().plus(self.event_retention * 3 / 2))
            }
            Lifetime::PendingAuthorization => inspected.created_at().map_or(Expiry::Never, |t| {
                Expiry::At(t.plus(self.pending_authorization))
            }),
            Lifetime::Task => {
                let created = inspected.created_at();
                let ttl = r.pointer("/ttl_ms").and_then(serde_json::Value::as_u64);
                match (created, ttl) {
                    (Some(c), Some(ms)) => {
                        Expiry::At(c.plus(Duration::from_millis(ms.saturating_mul(2))))
                    }
                    _ => Expiry::Never,
                }
            }
            Lifetime::CallWindow => inspected
                .written_at()
                .map_or(Expiry::Never, |t| Expiry::At(t.plus(self.call_window))),
            Lifetime::Transient => Expiry::Transient,
            _ => Expiry::Never,
        }
    }
}

/// Formats a time as UTC `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn format_time(t: Timestamp) -> String {
    let secs = t.as_unix_millis() / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Formats a duration the short way: `42s`, `5m`, `3h12m`, `2d4h`.
pub(crate) fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Parses a duration given as `90s`, `30m`, `2h`, `1d` or plain seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration; write e.g. 90s, 30m, 2h or 1d"))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("unknown unit in `{text}`; use ms, s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_format() {
        assert_eq!(
            format_time(Timestamp::from_unix_millis(0)),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            format_time(Timestamp::from_unix_millis(1_709_210_096_000)),
            "2024-02-29T12:34:56Z"
        );
        assert_eq!(format_duration(Duration::from_secs(3725)), "1h02m");
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn keys_map_to_kinds_and_logs() {
        let session = declare::SERVER_SESSION.key(&["abc"]);
        assert_eq!(Kind::of(&session), Kind::Sessions);
        let creds = declare::CREDENTIALS.key(&["a", "b"]);
        assert_eq!(Kind::of(&creds), Kind::Credentials);
        assert!(is_credential_key(&creds));
        assert!(!is_credential_key(&session));
        let stream = declare::EVENT_STREAM.key(&["s/1"]);
        assert_eq!(
            log_of(&stream),
            Some((declare::EVENT.key(&["s/1"]).to_string(), "event"))
        );
        assert_eq!(Kind::of("not/a/declared/key"), Kind::Other);
        // The logs that no record names: `stats` and `check` read them too.
        let logs: Vec<&str> = standalone_logs().iter().map(|(_, kind)| *kind).collect();
        assert_eq!(logs, ["fleet_notice", "instance_heartbeat"]);
    }
}
