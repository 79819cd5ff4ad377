//! Every kind of record, declared once: where it lives, how it is encoded,
//! which of its fields are secret, and how tools list and age it.
//!
//! A [`Declaration`] is the one place that knows a kind's key layout. The
//! typed stores build their keys with [`Declaration::key`]; operator tools
//! (`mcp-persist ls`, `show`, `stats`, `check`, `gc`, `copy`) find a key's
//! kind with [`of_key`] and take it apart with [`Declaration::parse`]; the
//! sealing of secrets and the redaction of `show` follow
//! [`secret_fields`](Declaration::secret_fields). No key prefix is written
//! anywhere else.
//!
//! | kind | key or log | components |
//! |---|---|---|
//! | `server_profile` | `client/profile/…` | profile, endpoint |
//! | `legacy_session` | `client/session/…` | profile, endpoint |
//! | `in_flight_request` | `client/inflight/…` | profile, endpoint, session, request |
//! | `credentials` | `cred/token/…` | issuer, resource |
//! | `refresh_lease` | `cred/lease/…` | issuer, resource |
//! | `resource_issuer` | `cred/issuer/…` | resource |
//! | `pending_authorization` | `cred/pending/…` | hash of the OAuth `state` |
//! | `dpop_key` | `cred/dpop/…` | issuer, resource |
//! | `server_session` | `server/session/…` | session id |
//! | `event_stream` | `server/stream/…` | stream id |
//! | `event` (log) | `server/events/…` | stream id |
//! | `shared_key_ring` | `server/key/…` | key name |
//! | `task` | `server/task/…` | task id |
//! | `task_inbox` (log) | `server/task-inbox/…` | task id |
//! | `fleet_notice` (log) | `server/bus` | none |
//! | `instance_lease` | `server/instance/…` | instance id |
//! | `instance_heartbeat` (log) | `server/heartbeats` | none |
//! | `tool_lock` | `tool/lock/…` | lock name |
//!
//! Components are escaped (`%` as `%25`, `/` as `%2F`), so `/` always
//! separates them and no two inputs share a key.
//!
//! ```
//! use mcp_persist_core::declare::{self, Family};
//! let key = declare::SERVER_SESSION.key(&["abc/def"]);
//! assert_eq!(key.as_str(), "server/session/abc%2Fdef");
//! let kind = declare::of_key(&key).expect("a declared key");
//! assert_eq!(kind.kind, "server_session");
//! assert_eq!(kind.family, Family::Sessions);
//! assert_eq!(kind.parse(&key), Some(vec!["abc/def".to_owned()]));
//! ```

use crate::{Error, Key, Result};

/// How operator tools group kinds (`mcp-persist ls sessions`, `copy --kinds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Family {
    /// Server sessions.
    Sessions,
    /// SSE event streams: their metadata and their logs.
    Events,
    /// Client state: server profiles, legacy sessions, the in-flight journal.
    Clients,
    /// Credentials, pending authorizations, resource issuers, refresh leases.
    Credentials,
    /// Durable tasks and their inboxes.
    Tasks,
    /// Shared server keys.
    Keys,
    /// Instance liveness leases.
    Instances,
    /// The fleet notification bus.
    Bus,
    /// Locks operator tools hold while they work on a store.
    Tools,
}

impl Family {
    /// Every family, in display order.
    pub const ALL: [Family; 9] = [
        Family::Sessions,
        Family::Events,
        Family::Clients,
        Family::Credentials,
        Family::Tasks,
        Family::Keys,
        Family::Instances,
        Family::Bus,
        Family::Tools,
    ];

    /// The family's name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Family::Sessions => "sessions",
            Family::Events => "events",
            Family::Clients => "clients",
            Family::Credentials => "credentials",
            Family::Tasks => "tasks",
            Family::Keys => "keys",
            Family::Instances => "instances",
            Family::Bus => "bus",
            Family::Tools => "tools",
        }
    }
}

/// Whether a kind lives in a [`KvStore`](crate::KvStore) record or a
/// [`LogStore`](crate::LogStore) log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// One record per key.
    Kv,
    /// One log per name, many records in it.
    Log,
}

/// Which backend of a [`Stores`](crate::Stores) bundle holds a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// Client state ([`Stores::with_client_state`](crate::Stores::with_client_state)).
    ClientState,
    /// Credentials and shared keys ([`Stores::with_credentials`](crate::Stores::with_credentials)).
    Credentials,
    /// Server sessions and instance leases ([`Stores::with_sessions`](crate::Stores::with_sessions)).
    Sessions,
    /// Event streams, tasks and the bus ([`Stores::with_events`](crate::Stores::with_events)).
    Events,
}

/// How long a record lives, for tools that must give a copy the TTL that
/// the application would have given it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lifetime {
    /// Until deleted.
    Kept,
    /// Live process state (leases): meaningless in another place or time.
    Transient,
    /// The server's session idle TTL, from the record's last use.
    SessionIdle,
    /// The server's event retention.
    EventRetention,
    /// The short TTL of an authorization the user has not finished.
    PendingAuthorization,
    /// Twice the task's own `ttl_ms` from its creation.
    Task,
    /// The server's window for keyed calls, from the record's last change.
    CallWindow,
}

/// One kind of record. See the [module docs](self).
#[derive(Debug)]
#[non_exhaustive]
pub struct Declaration {
    /// The kind's name, written into each record's envelope.
    pub kind: &'static str,
    /// The schema version this build writes and the newest it reads.
    pub schema: u32,
    /// How tools group it.
    pub family: Family,
    /// Record or log.
    pub space: Space,
    /// Which backend of a bundle holds it.
    pub role: Role,
    /// The fixed start of every key (or log name) of this kind. With
    /// components it ends in `/`; without, it is the whole name.
    pub prefix: &'static str,
    /// The names of the key's components, in order.
    pub components: &'static [&'static str],
    /// JSON pointers (into the record) of the fields that hold secrets.
    /// Checked against the record type by this crate's tests.
    pub secret_fields: &'static [&'static str],
    /// JSON pointers of the times that say when the record was last written,
    /// first present wins.
    pub written_at: &'static [&'static str],
    /// JSON pointers of the times that say when it was created.
    pub created_at: &'static [&'static str],
    /// How long it lives.
    pub lifetime: Lifetime,
    /// The log that a record of this kind owns, under the same components.
    pub owns_log: Option<&'static Declaration>,
    /// One line for humans.
    pub summary: &'static str,
}

impl PartialEq for Declaration {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

impl Eq for Declaration {}

/// Escapes a key component: `%` and `/` become `%25` and `%2F`.
pub(crate) fn escape(s: &str, out: &mut String) {
    // Runs without `%` or `/` are copied whole: a key is built on every
    // store operation, and most components need no escape at all.
    let mut rest = s;
    while let Some(at) = rest.find(['%', '/']) {
        out.push_str(&rest[..at]);
        out.push_str(if rest.as_bytes()[at] == b'%' {
            "%25"
        } else {
            "%2F"
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// Whether `s` is a component [`escape`] could have written: every `%`
/// starts `%25` or `%2F`.
fn escaped_well(s: &str) -> bool {
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        match rest.get(at..at + 3) {
            Some("%25" | "%2F") => rest = &rest[at + 3..],
            _ => return false,
        }
    }
    true
}

/// Undoes [`escape`]; `None` for a stray `%`.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl Declaration {
    /// The key of the record (or the name of the log) with these components,
    /// escaped.
    ///
    /// # Panics
    ///
    /// When the number of components differs from the declaration's, which
    /// is a programming error in this crate, or when a component makes the
    /// key longer than [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES): call
    /// [`try_key`](Self::try_key) with input from outside.
    pub fn key(&self, components: &[&str]) -> Key {
        match self.try_key(components) {
            Ok(key) => key,
            Err(e) => panic!("{}: {e}", self.kind),
        }
    }

    /// Like [`key`](Self::key), with an error instead of a panic for a key
    /// that would be too long or a wrong number of components.
    pub fn try_key(&self, components: &[&str]) -> Result<Key> {
        if components.len() != self.components.len() {
            return Err(Error::invalid(
                "key",
                format!(
                    "a {} key has {} components ({}), not {}",
                    self.kind,
                    self.components.len(),
                    self.components.join(", "),
                    components.len()
                ),
            ));
        }
        let mut key = String::with_capacity(
            self.prefix.len() + components.iter().map(|c| c.len() + 1).sum::<usize>(),
        );
        key.push_str(self.prefix);
        for (i, c) in components.iter().enumerate() {
            if i > 0 {
                key.push('/');
            }
            escape(c, &mut key);
        }
        Key::new(key)
    }

    /// The prefix under which every key whose first components are `leading`
    /// is listed (with a trailing `/` unless `leading` is complete).
    pub fn prefix_of(&self, leading: &[&str]) -> String {
        let mut prefix = String::from(self.prefix);
        for c in leading {
            escape(c, &mut prefix);
            prefix.push('/');
        }
        if leading.len() == self.components.len() && !leading.is_empty() {
            prefix.pop();
        }
        prefix
    }

    /// The unescaped components of `key`, or `None` when `key` is not a key
    /// of this kind (another prefix, another number of components, a broken
    /// escape).
    pub fn parse(&self, key: &str) -> Option<Vec<String>> {
        if self.components.is_empty() {
            return (key == self.prefix).then(Vec::new);
        }
        let rest = key.strip_prefix(self.prefix)?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != self.components.len() || parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        parts.into_iter().map(unescape).collect()
    }

    /// Whether `key` is a key of this kind: what [`parse`](Self::parse)
    /// accepts, without unescaping anything (telemetry names the kind of
    /// every key a store operation touches).
    pub fn matches(&self, key: &str) -> bool {
        if self.components.is_empty() {
            return key == self.prefix;
        }
        let Some(rest) = key.strip_prefix(self.prefix) else {
            return false;
        };
        let mut parts = 0;
        for part in rest.split('/') {
            parts += 1;
            if parts > self.components.len() || part.is_empty() || !escaped_well(part) {
                return false;
            }
        }
        parts == self.components.len()
    }

    /// The name of the log a record of this kind under `key` owns, if any.
    pub fn log_of(&self, key: &str) -> Option<(Key, &'static Declaration)> {
        let log = self.owns_log?;
        let components = self.parse(key)?;
        let refs: Vec<&str> = components.iter().map(String::as_str).collect();
        log.try_key(&refs).ok().map(|k| (k, log))
    }
}

macro_rules! declare {
    ($(#[$doc:meta])* $name:ident {
        kind: $kind:literal, schema: $schema:literal, family: $family:ident, space: $space:ident,
        role: $role:ident, prefix: $prefix:literal, components: [$($comp:literal),*],
        secrets: [$($secret:literal),*], written: [$($written:literal),*],
        created: [$($created:literal),*], lifetime: $lifetime:ident,
        owns_log: $log:expr, summary: $summary:literal $(,)?
    }) => {
        $(#[$doc])*
        pub const $name: Declaration = Declaration {
            kind: $kind,
            schema: $schema,
            family: Family::$family,
            space: Space::$space,
            role: Role::$role,
            prefix: $prefix,
            components: &[$($comp),*],
            secret_fields: &[$($secret),*],
            written_at: &[$($written),*],
            created_at: &[$($created),*],
            lifetime: Lifetime::$lifetime,
            owns_log: $log,
            summary: $summary,
        };
    };
}

declare!(
    /// What a client knows about a server: era, version, `server/discover`.
    SERVER_PROFILE {
        kind: "server_profile", schema: 1, family: Clients, space: Kv, role: ClientState,
        prefix: "client/profile/", components: ["profile", "endpoint"],
        secrets: [], written: ["/verdict_at"], created: ["/verdict_at"],
        lifetime: Kept, owns_log: None,
        summary: "a server's era, protocol version and cached server/discover result",
    }
);
declare!(
    /// A client's legacy session with a server.
    LEGACY_SESSION {
        kind: "legacy_session", schema: 1, family: Clients, space: Kv, role: ClientState,
        prefix: "client/session/", components: ["profile", "endpoint"],
        secrets: [], written: ["/updated_at"], created: ["/created_at"],
        lifetime: Kept, owns_log: None,
        summary: "a client's legacy session: id, initialize result, request numbering, stream cursors",
    }
);
declare!(
    /// A request sent and not yet answered.
    IN_FLIGHT_REQUEST {
        kind: "in_flight_request", schema: 1, family: Clients, space: Kv, role: ClientState,
        prefix: "client/inflight/", components: ["profile", "endpoint", "session", "request"],
        secrets: [], written: ["/sent_at"], created: ["/sent_at"],
        lifetime: Kept, owns_log: None,
        summary: "a client request sent and not yet answered (the in-flight journal)",
    }
);
declare!(
    /// OAuth credentials per issuer and resource.
    CREDENTIALS {
        kind: "credentials", schema: 1, family: Credentials, space: Kv, role: Credentials,
        prefix: "cred/token/", components: ["issuer", "resource"],
        secrets: ["/access_token", "/refresh_token", "/client/client_secret"],
        written: ["/obtained_at"], created: ["/obtained_at"],
        lifetime: Kept, owns_log: None,
        summary: "OAuth tokens and client registration for one issuer and resource",
    }
);
declare!(
    /// The lease that lets one process refresh a credential.
    REFRESH_LEASE {
        kind: "refresh_lease", schema: 1, family: Credentials, space: Kv, role: Credentials,
        prefix: "cred/lease/", components: ["issuer", "resource"],
        secrets: [], written: ["/taken_at"], created: ["/taken_at"],
        lifetime: Transient, owns_log: None,
        summary: "the process refreshing a credential right now",
    }
);
declare!(
    /// Which issuer a resource was last authorized with.
    RESOURCE_ISSUER {
        kind: "resource_issuer", schema: 1, family: Credentials, space: Kv, role: Credentials,
        prefix: "cred/issuer/", components: ["resource"],
        secrets: [], written: ["/updated_at"], created: ["/updated_at"],
        lifetime: Kept, owns_log: None,
        summary: "the authorization server in force for a resource",
    }
);
declare!(
    /// An authorization the user has not finished.
    PENDING_AUTHORIZATION {
        kind: "pending_authorization", schema: 1, family: Credentials, space: Kv, role: Credentials,
        prefix: "cred/pending/", components: ["state hash"],
        secrets: ["/pkce_verifier", "/state"], written: ["/created_at"], created: ["/created_at"],
        lifetime: PendingAuthorization, owns_log: None,
        summary: "an OAuth authorization in progress (PKCE verifier, state)",
    }
);
declare!(
    /// A client's DPoP key pair (RFC 9449) for one issuer and resource: the
    /// key its DPoP-bound tokens (and refresh tokens) are bound to.
    DPOP_KEY {
        kind: "dpop_key", schema: 1, family: Credentials, space: Kv, role: Credentials,
        prefix: "cred/dpop/", components: ["issuer", "resource"],
        secrets: ["/private_key"], written: ["/created_at"], created: ["/created_at"],
        lifetime: Kept, owns_log: None,
        summary: "a client's DPoP key pair for one issuer and resource (RFC 9449)",
    }
);
declare!(
    /// A server's legacy session.
    SERVER_SESSION {
        kind: "server_session", schema: 1, family: Sessions, space: Kv, role: Sessions,
        prefix: "server/session/", components: ["session id"],
        secrets: [], written: ["/last_seen"], created: ["/created_at"],
        lifetime: SessionIdle, owns_log: None,
        summary: "a server session: the client's initialize params and its principal",
    }
);
declare!(
    /// One SSE event of a stream (a log record).
    EVENT {
        kind: "event", schema: 1, family: Events, space: Log, role: Events,
        prefix: "server/events/", components: ["stream id"],
        secrets: [], written: [], created: [],
        lifetime: EventRetention, owns_log: None,
        summary: "the events of one SSE stream",
    }
);
declare!(
    /// An SSE stream's owner and token.
    EVENT_STREAM {
        kind: "event_stream", schema: 1, family: Events, space: Kv, role: Events,
        prefix: "server/stream/", components: ["stream id"],
        secrets: ["/token"], written: ["/created_at"], created: ["/created_at"],
        lifetime: EventRetention, owns_log: Some(&EVENT),
        summary: "an SSE stream's owner, token and retention mark",
    }
);
declare!(
    /// Keys a fleet shares.
    SHARED_KEY_RING {
        kind: "shared_key_ring", schema: 1, family: Keys, space: Kv, role: Credentials,
        prefix: "server/key/", components: ["name"],
        secrets: ["/active/secret", "/previous/secret"],
        written: ["/active/created_at"], created: ["/active/created_at"],
        lifetime: Kept, owns_log: None,
        summary: "a secret key the fleet shares, with the previous one",
    }
);
declare!(
    /// Wake-ups for the instance running a task (a log record).
    TASK_INBOX {
        kind: "task_inbox", schema: 1, family: Tasks, space: Log, role: Events,
        prefix: "server/task-inbox/", components: ["task id"],
        secrets: [], written: [], created: [],
        lifetime: Task, owns_log: None,
        summary: "wake-ups for the instance running a task",
    }
);
declare!(
    /// A durable task.
    TASK {
        kind: "task", schema: 1, family: Tasks, space: Kv, role: Events,
        prefix: "server/task/", components: ["task id"],
        secrets: [], written: ["/last_updated_at"], created: ["/created_at"],
        lifetime: Task, owns_log: Some(&TASK_INBOX),
        summary: "a durable task: status, owner, result",
    }
);
declare!(
    /// A tool call a client keyed for exactly-once execution.
    CALL_RECORD {
        kind: "call_record", schema: 1, family: Tasks, space: Kv, role: Sessions,
        prefix: "server/call/", components: ["principal hash", "key"],
        secrets: ["/answer"], written: ["/updated_at"], created: ["/created_at"],
        lifetime: CallWindow, owns_log: None,
        summary: "a keyed tool call: the instance running it, or its answer",
    }
);
declare!(
    /// A notice on the fleet bus (a log record).
    FLEET_NOTICE {
        kind: "fleet_notice", schema: 1, family: Bus, space: Log, role: Events,
        prefix: "server/bus", components: [],
        secrets: [], written: ["/published_at"], created: ["/published_at"],
        lifetime: Kept, owns_log: None,
        summary: "the fleet notification bus",
    }
);
declare!(
    /// A server instance's liveness lease.
    INSTANCE_LEASE {
        kind: "instance_lease", schema: 1, family: Instances, space: Kv, role: Sessions,
        prefix: "server/instance/", components: ["instance id"],
        secrets: [], written: ["/renewed_at"], created: ["/started_at"],
        lifetime: Transient, owns_log: None,
        summary: "a server instance's liveness lease",
    }
);

declare!(
    /// One heartbeat of a server instance (a log record).
    HEARTBEAT {
        kind: "instance_heartbeat", schema: 1, family: Instances, space: Log, role: Sessions,
        prefix: "server/heartbeats", components: [],
        secrets: [], written: [], created: [],
        lifetime: Transient, owns_log: None,
        summary: "the fleet's heartbeats: which instances are alive",
    }
);
declare!(
    /// A lock an operator tool holds while it works on a store.
    TOOL_LOCK {
        kind: "tool_lock", schema: 1, family: Tools, space: Kv, role: Sessions,
        prefix: "tool/lock/", components: ["name"],
        secrets: [], written: ["/taken_at"], created: ["/taken_at"],
        lifetime: Transient, owns_log: None,
        summary: "a lock an operator tool (a copy) holds on this store",
    }
);

/// Every declared kind.
pub const ALL: &[&Declaration] = &[
    &SERVER_PROFILE,
    &LEGACY_SESSION,
    &IN_FLIGHT_REQUEST,
    &CREDENTIALS,
    &REFRESH_LEASE,
    &RESOURCE_ISSUER,
    &PENDING_AUTHORIZATION,
    &DPOP_KEY,
    &SERVER_SESSION,
    &EVENT_STREAM,
    &EVENT,
    &SHARED_KEY_RING,
    &TASK,
    &TASK_INBOX,
    &CALL_RECORD,
    &FLEET_NOTICE,
    &INSTANCE_LEASE,
    &HEARTBEAT,
    &TOOL_LOCK,
];

/// The declaration whose key layout `key` follows, among key-value kinds
/// (`Space::Kv`) or logs (`Space::Log`).
pub fn of_key_in(space: Space, key: &str) -> Option<&'static Declaration> {
    ALL.iter()
        .copied()
        .find(|d| d.space == space && d.matches(key))
}

/// The key-value kind whose key layout `key` follows.
pub fn of_key(key: &str) -> Option<&'static Declaration> {
    of_key_in(Space::Kv, key)
}

/// The log kind whose name layout `log` follows.
pub fn of_log(log: &str) -> Option<&'static Declaration> {
    of_key_in(Space::Log, log)
}

/// The declaration of the kind named `kind` in an envelope.
pub fn of_kind(kind: &str) -> Option<&'static Declaration> {
    ALL.iter().copied().find(|d| d.kind == kind)
}

/// Every declared prefix that a list of the whole key space should cover,
/// for tools: the key-value kinds of `family`.
pub fn kv_prefixes(family: Family) -> impl Iterator<Item = &'static str> {
    ALL.iter()
        .filter(move |d| d.family == family && d.space == Space::Kv)
        .map(|d| d.prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_unique_and_unambiguous() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.kind, b.kind, "kind declared twice");
                if a.space == b.space {
                    assert!(
                        !a.prefix.starts_with(b.prefix) && !b.prefix.starts_with(a.prefix),
                        "{} and {} share a prefix",
                        a.kind,
                        b.kind
                    );
                }
            }
            assert_eq!(
                a.prefix.ends_with('/'),
                !a.components.is_empty(),
                "{}: a prefix ends in / exactly when components follow",
                a.kind
            );
            if let Some(log) = a.owns_log {
                assert_eq!(log.space, Space::Log);
                assert_eq!(log.components.len(), a.components.len());
            }
        }
    }

    #[test]
    fn keys_round_trip_through_parse() {
        let odd = ["a/b%c", "%2F", "http://h:1/p?q=%20", "é ü", "x"];
        for d in ALL {
            let comps: Vec<&str> = odd.iter().copied().take(d.components.len()).collect();
            let key = d.key(&comps);
            assert_eq!(
                d.parse(&key),
                Some(comps.iter().map(|c| (*c).to_owned()).collect())
            );
            assert_eq!(of_key_in(d.space, &key).map(|x| x.kind), Some(d.kind));
            // One component fewer or more is not this kind.
            assert!(d.parse(&format!("{key}/extra")).is_none() || d.components.is_empty());
        }
        assert!(SERVER_SESSION.parse("server/session/a%2").is_none());
        // `matches` says what `parse` would, for keys of every kind and
        // damaged ones: bad escapes, empty, missing or extra components.
        let mut keys: Vec<String> = Vec::new();
        for d in ALL {
            let comps: Vec<&str> = odd.iter().copied().take(d.components.len()).collect();
            let key = d.key(&comps).to_string();
            keys.extend([
                format!("{key}/extra"),
                format!("{key}%"),
                format!("{key}%2"),
                format!("{key}%41"),
                format!("{key}/"),
                key.replacen('/', "//", 1),
                d.prefix.to_owned(),
                key,
            ]);
        }
        for d in ALL {
            for key in &keys {
                assert_eq!(d.matches(key), d.parse(key).is_some(), "{} {key:?}", d.kind);
            }
        }
        assert!(SERVER_SESSION.parse("server/session/").is_none());
        assert!(SERVER_SESSION.try_key(&["a", "b"]).is_err());
        assert_eq!(
            IN_FLIGHT_REQUEST.prefix_of(&["default", "https://h/mcp"]),
            "client/inflight/default/https:%2F%2Fh%2Fmcp/"
        );
        assert_eq!(SERVER_SESSION.prefix_of(&["s"]), "server/session/s");
        assert_eq!(
            EVENT_STREAM
                .log_of("server/stream/a%2Fb")
                .map(|(k, d)| (k.to_string(), d.kind)),
            Some(("server/events/a%2Fb".to_owned(), "event"))
        );
    }
}
