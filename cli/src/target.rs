//! Store URLs: parsing them, and opening the backends they name.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use mcp_persist_core::{KvStore, LogRecord, LogStore};
use mcp_persist_store_file::FileStore;
use mcp_persist_store_redis::RedisStore;
use mcp_persist_store_sqlite::{SqliteOptions, SqliteStore};
use mcp_persist_store_vault::{
    SecretsManagerStore,
    aws_sdk_secretsmanager::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    },
};

pub(crate) use crate::probe::{Access, Found};
use crate::{
    fail::{Failure, usage},
    output::{Level, diag},
    probe,
};

/// The URL forms, for help texts and error messages.
pub(crate) const FORMS: &str = "  sqlite:PATH                         a SQLite database file
  file:DIR                            a file-store directory
  redis://HOST:PORT[/DB][?prefix=P]   a Redis server (rediss:// for TLS)
  redis+cluster://H1:P1,H2:P2[?prefix=P]
                                      a Redis Cluster, by some of its nodes
  secretsmanager://REGION?prefix=P[&endpoint=URL]
                                      AWS Secrets Manager (key-value only; endpoint
                                      overrides the service address, e.g. for moto)
  credentials=URL;rest=URL            credentials and shared keys in one store,
                                      everything else in another";

/// One backend location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// `sqlite:PATH`.
    Sqlite(PathBuf),
    /// `file:DIR`.
    File(PathBuf),
    /// `redis://` or `redis+cluster://`.
    Redis {
        /// Node URLs as the redis crate takes them.
        urls: Vec<String>,
        /// A cluster, not one server.
        cluster: bool,
        /// The key prefix the application configured.
        prefix: Option<String>,
    },
    /// `secretsmanager://REGION?prefix=P`.
    SecretsManager {
        /// The AWS region.
        region: String,
        /// The secret name prefix.
        prefix: String,
        /// A service address override (moto, LocalStack).
        endpoint: Option<String>,
    },
}

/// A parsed store argument: one location, or a split bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Where everything but credentials lives (and credentials, unless split).
    pub(crate) rest: Location,
    /// Where credentials and shared keys live, when split off.
    pub(crate) credentials: Option<Location>,
}

impl Spec {
    /// Parses a store argument (see [`FORMS`]).
    pub(crate) fn parse(text: &str) -> Result<Spec, Failure> {
        let text = text.trim();
        if text.contains("credentials=") || text.contains("rest=") && text.contains(';') {
            let mut rest = None;
            let mut credentials = None;
            for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
                match part.split_once('=') {
                    Some(("credentials", url)) => credentials = Some(Location::parse(url)?),
                    Some(("rest", url)) => rest = Some(Location::parse(url)?),
                    _ => {
                        return Err(usage(format!(
                            "`{part}` in the split store `{text}` is neither credentials=URL nor rest=URL"
                        )));
                    }
                }
            }
            let rest = rest.ok_or_else(|| {
                usage(format!(
                    "the split store `{text}` names no rest=URL for sessions, events and client state"
                ))
            })?;
            return Ok(Spec { rest, credentials });
        }
        Ok(Spec {
            rest: Location::parse(text)?,
            credentials: None,
        })
    }
}

fn path_part(scheme: &str, rest: &str, whole: &str) -> Result<PathBuf, Failure> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(usage(format!(
            "`{whole}` names no path; write {scheme}:PATH, e.g. {scheme}:./state"
        )));
    }
    Ok(PathBuf::from(path))
}

impl Location {
    /// Parses one backend URL.
    pub(crate) fn parse(text: &str) -> Result<Location, Failure> {
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(usage(format!(
                "`{text}` is not a store URL; use one of:\n{FORMS}"
            )));
        };
        match scheme {
            "sqlite" => Ok(Location::Sqlite(path_part(scheme, rest, text)?)),
            "file" => Ok(Location::File(path_part(scheme, rest, text)?)),
            "redis" | "rediss" => {
                let mut url = url::Url::parse(text)
                    .map_err(|e| usage(format!("`{text}` is not a valid Redis URL: {e}")))?;
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(usage(format!(
                        "`{text}` names no Redis host; write redis://HOST:PORT"
                    )));
                }
                let prefix = take_query(&mut url, "prefix")?;
                Ok(Location::Redis {
                    urls: vec![url.to_string()],
                    cluster: false,
                    prefix,
                })
            }
            "redis+cluster" | "rediss+cluster" => {
                let node_scheme = scheme.trim_end_matches("+cluster");
                let body = rest.strip_prefix("//").ok_or_else(|| {
                    usage(format!(
                        "write the cluster as {scheme}://HOST:PORT,HOST:PORT"
                    ))
                })?;
                let (nodes, query) = match body.split_once('?') {
                    Some((n, q)) => (n, Some(q)),
                    None => (body, None),
                };
                let mut prefix = None;
                for pair in query
                    .unwrap_or_default()
                    .split('&')
                    .filter(|p| !p.is_empty())
                {
                    match pair.split_once('=') {
                        Some(("prefix", p)) => prefix = Some(decode(p)?),
                        _ => {
                            return Err(usage(format!(
                                "unknown option `{pair}` in `{text}`; only prefix=P is known"
                            )));
                        }
                    }
                }
                let urls: Vec<String> = nodes
                    .trim_end_matches('/')
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(|n| format!("{node_scheme}://{n}/"))
                    .collect();
                if urls.is_empty() {
                    return Err(usage(format!("`{text}` names no cluster node")));
                }
                Ok(Location::Redis {
                    urls,
                    cluster: true,
                    prefix,
                })
            }
            "secretsmanager" => {
                let mut url = url::Url::parse(text).map_err(|e| {
                    usage(format!(
                        "`{text}` is not a valid secretsmanager:// URL: {e}"
                    ))
                })?;
                let region = url.host_str().unwrap_or_default().to_owned();
                if region.is_empty() {
                    return Err(usage(format!(
                        "`{text}` names no region; write secretsmanager://REGION?prefix=P"
                    )));
                }
                let prefix = take_query(&mut url, "prefix")?.ok_or_else(|| {
                    usage(format!(
                        "`{text}` names no prefix; write secretsmanager://{region}?prefix=P (the prefix the application uses)"
                    ))
                })?;
                let endpoint = take_query(&mut url, "endpoint")?;
                if let Some(unknown) = url.query_pairs().next() {
                    return Err(usage(format!(
                        "unknown option `{}` in `{text}`; known: prefix, endpoint",
                        unknown.0
                    )));
                }
                Ok(Location::SecretsManager {
                    region,
                    prefix,
                    endpoint,
                })
            }
            _ => Err(usage(format!(
                "unknown store scheme `{scheme}:` in `{text}`; use one of:\n{FORMS}"
            ))),
        }
    }

    /// The location as shown to the operator, without any password.
    pub(crate) fn display(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite:{}", p.display()),
            Location::File(p) => format!("file:{}", p.display()),
            Location::Redis { urls, cluster, .. } => {
                let shown: Vec<String> = urls
                    .iter()
                    .map(|u| match url::Url::parse(u) {
                        Ok(mut u) if u.password().is_some() => {
                            let _ = u.set_password(Some("***"));
                            u.to_string()
                        }
                        _ => u.clone(),
                    })
                    .collect();
                if *cluster {
                    format!("redis cluster {}", shown.join(","))
                } else {
                    shown.join(",")
                }
            }
            Location::SecretsManager { region, prefix, .. } => {
                format!("secretsmanager://{region}?prefix={prefix}")
            }
        }
    }
}

fn decode(s: &str) -> Result<String, Failure> {
    url::form_urlencoded::parse(format!("v={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| usage(format!("`{s}` is not a valid query value")))
}

/// Removes `name` from the URL's query and returns its value.
fn take_query(url: &mut url::Url, name: &str) -> Result<Option<String>, Failure> {
    let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let value = pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone());
    let others: Vec<&(String, String)> = pairs.iter().filter(|(k, _)| k != name).collect();
    if others.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut()
            .clear()
            .extend_pairs(others.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
    Ok(value)
}

/// One opened backend.
#[derive(Clone)]
pub(crate) struct Backend {
    /// Where it is, for messages.
    pub(crate) label: String,
    /// Where it is.
    pub(crate) location: Location,
    /// Its key-value side.
    pub(crate) kv: Arc<dyn KvStore>,
    /// Its log side, when it has one.
    pub(crate) log: Option<Arc<dyn LogStore>>,
    /// The file store itself, for its whole-store verification.
    pub(crate) file: Option<FileStore>,
    /// The SQLite store itself, to close it (and checkpoint its
    /// write-ahead log) before the process ends.
    sqlite: Option<SqliteStore>,
    /// The key prefix of a Redis store, as the store uses it.
    pub(crate) redis_prefix: Option<String>,
}

impl Backend {
    /// A store error of this backend, classified, with advice.
    pub(crate) fn fail(&self, error: mcp_persist_core::Error) -> Failure {
        Failure::store(&self.label, self.location.db_file(), error)
    }
}

impl Location {
    /// The database file of a SQLite location.
    pub(crate) fn db_file(&self) -> Option<&Path> {
        match self {
            Location::Sqlite(path) => Some(path),
            _ => None,
        }
    }

    /// Whether this location is a file or folder on this machine.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Location::Sqlite(_) | Location::File(_))
    }

    /// Whether a store here holds logs (event streams, task inboxes).
    pub(crate) fn holds_logs(&self) -> bool {
        !matches!(self, Location::SecretsManager { .. })
    }

    /// Looks at a local location before opening it, refusing what is not a
    /// store (or, for `Create`, not a place for one), changing nothing.
    pub(crate) fn probe(&self, access: Access) -> Result<Found, Failure> {
        match self {
            Location::Sqlite(path) => probe::sqlite(path, access),
            Location::File(dir) => probe::file_store(dir, access),
            _ => Ok(Found::Store),
        }
    }

    /// Opens the backend, after [`Location::probe`].
    pub(crate) async fn open(&self, access: Access) -> Result<Backend, Failure> {
        self.probe(access)?;
        let label = self.display();
        let fail = |e| Failure::store(&label, self.db_file(), e);
        let backend = match self {
            Location::Sqlite(path) => {
                // The command line sweeps only when asked (`gc`).
                let options = SqliteOptions::default().sweep_interval(None);
                let store = SqliteStore::open_with(path, options).await.map_err(fail)?;
                let shared = Arc::new(store.clone());
                Backend {
                    label,
                    location: self.clone(),
                    kv: shared.clone(),
                    log: Some(shared),
                    file: None,
                    sqlite: Some(store),
                    redis_prefix: None,
                }
            }
            Location::File(dir) => {
                let store = FileStore::open(dir.clone()).await.map_err(fail)?;
                Backend {
                    label,
                    location: self.clone(),
                    kv: Arc::new(store.clone()),
                    log: Some(Arc::new(store.clone())),
                    file: Some(store),
                    sqlite: None,
                    redis_prefix: None,
                }
            }
            Location::Redis {
                urls,
                cluster,
                prefix,
            } => {
                let mut builder = if *cluster {
                    RedisStore::cluster(urls.clone())
                } else {
                    RedisStore::standalone(urls.first().cloned().unwrap_or_default())
                };
                if let Some(prefix) = prefix {
                    builder = builder.key_prefix(prefix.clone());
                }
                let store = builder
                    .connect_timeout(std::time::Duration::from_secs(5))
                    .connect()
                    .await
                    .map_err(fail)?;
                let redis_prefix = Some(store.key_prefix().to_owned());
                let store = Arc::new(store);
                Backend {
                    label,
                    location: self.clone(),
                    kv: store.clone(),
                    log: Some(store),
                    file: None,
                    sqlite: None,
                    redis_prefix,
                }
            }
            Location::SecretsManager {
                region,
                prefix,
                endpoint,
            } => {
                let mut builder = SecretsManagerStore::builder(prefix.clone());
                let client = match endpoint {
                    Some(endpoint) => {
                        let key = std::env::var("AWS_ACCESS_KEY_ID").map_err(|_| {
                            usage(format!(
                                "{label} with endpoint={endpoint} needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment (any value for a local emulator)"
                            ))
                        })?;
                        let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default();
                        let config = Config::builder()
                            .behavior_version(BehaviorVersion::latest())
                            .region(Region::new(region.clone()))
                            .credentials_provider(Credentials::new(key, secret, None, None, "env"))
                            .endpoint_url(endpoint)
                            .build();
                        Client::from_conf(config)
                    }
                    None => {
                        let config = mcp_persist_store_vault::aws_config::defaults(
                            mcp_persist_store_vault::aws_config::BehaviorVersion::latest(),
                        )
                        .region(Region::new(region.clone()))
                        .load()
                        .await;
                        Client::new(&config)
                    }
                };
                builder = builder.client(client).max_writes_per_second(None);
                let store = builder.build().await.map_err(fail)?;
                Backend {
                    label,
                    location: self.clone(),
                    kv: Arc::new(store),
                    log: None,
                    file: None,
                    sqlite: None,
                    redis_prefix: None,
                }
            }
        };
        Ok(backend)
    }
}

/// Whether a key belongs to the credentials side of a split bundle:
/// credentials, pending authorizations, refresh leases and shared keys.
pub(crate) fn is_credential_key(key: &str) -> bool {
    CREDENTIAL_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// The key prefixes the credentials side of a split bundle holds.
const CREDENTIAL_PREFIXES: [&str; 2] = ["cred/", "server/key/"];

/// An opened store argument: where each key goes.
#[derive(Clone)]
pub(crate) struct Store {
    /// The argument as shown.
    pub(crate) label: String,
    /// Everything but credentials (and credentials, unless split).
    pub(crate) rest: Backend,
    /// Credentials and shared keys, when split off.
    pub(crate) credentials: Option<Backend>,
}

impl Spec {
    /// Looks at every local location the spec names (see
    /// [`Location::probe`]).
    pub(crate) fn probe(&self, access: Access) -> Result<Found, Failure> {
        let mut found = self.rest.probe(access)?;
        if let Some(c) = &self.credentials
            && c.probe(access)? == Found::New
        {
            found = Found::New;
        }
        Ok(found)
    }

    /// The store as shown, without opening it.
    pub(crate) fn display(&self) -> String {
        match &self.credentials {
            Some(c) => format!("credentials={};rest={}", c.display(), self.rest.display()),
            None => self.rest.display(),
        }
    }
}

impl Store {
    /// Opens every backend the spec names.
    pub(crate) async fn open(spec: &Spec, access: Access) -> Result<Store, Failure> {
        // Every location is looked at before any is opened.
        spec.probe(access)?;
        let rest = spec.rest.open(access).await?;
        let credentials = match &spec.credentials {
            Some(location) => match location.open(access).await {
                Ok(backend) => Some(backend),
                Err(failure) => {
                    rest.close().await;
                    return Err(failure);
                }
            },
            None => None,
        };
        let label = match &credentials {
            Some(c) => format!("credentials={};rest={}", c.label, rest.label),
            None => rest.label.clone(),
        };
        Ok(Store {
            label,
            rest,
            credentials,
        })
    }

    /// Closes every backend: a SQLite store checkpoints its write-ahead
    /// log and removes the `-wal` and `-shm` files when this is the last
    /// process using it, so a store that was only read is left as it was.
    pub(crate) async fn close(self) {
        self.rest.close().await;
        if let Some(c) = self.credentials {
            c.close().await;
        }
    }

    /// The backend holding `key`.
    pub(crate) fn backend_for(&self, key: &str) -> &Backend {
        match &self.credentials {
            Some(c) if is_credential_key(key) => c,
            _ => &self.rest,
        }
    }

    /// The log store, if the bundle has one.
    pub(crate) fn log(&self) -> Option<&Arc<dyn LogStore>> {
        self.rest.log.as_ref()
    }

    /// Every record of `log`, in order; none when the bundle holds no logs.
    ///
    /// A file store gets to read only a log that has a folder: reading one
    /// that has none would create its lock file, and it holds no record.
    pub(crate) async fn read_log(&self, log: &str) -> mcp_persist_core::Result<Vec<LogRecord>> {
        let Some(store) = self.log() else {
            return Ok(Vec::new());
        };
        if let Location::File(root) = &self.rest.location
            && !probe::file_log_exists(root, log)
        {
            return Ok(Vec::new());
        }
        read_all(&**store, log).await
    }

    /// Every live key under `prefix`, from whichever backend holds it, sorted.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<String>, Failure> {
        let mut keys: Vec<String> = self
            .rest
            .kv
            .list(prefix)
            .await
            .map_err(|e| self.rest.fail(e))?;
        if let Some(c) = &self.credentials {
            keys.retain(|k| !is_credential_key(k));
            for p in CREDENTIAL_PREFIXES {
                if p.starts_with(prefix) || prefix.starts_with(p) {
                    let from = if prefix.len() > p.len() { prefix } else { p };
                    keys.extend(c.kv.list(from).await.map_err(|e| c.fail(e))?);
                }
            }
            keys.sort();
        }
        Ok(keys)
    }

    /// Every backend, for sweeps.
    pub(crate) fn backends(&self) -> Vec<&Backend> {
        let mut all = vec![&self.rest];
        all.extend(self.credentials.as_ref());
        all
    }
}

impl Backend {
    async fn close(self) {
        let Backend {
            label,
            sqlite,
            kv,
            log,
            file,
            ..
        } = self;
        // Every other handle goes first: this one is then the last.
        drop((kv, log, file));
        if let Some(store) = sqlite
            && let Err(e) = store.close().await
        {
            diag(
                Level::Warning,
                &format!("{label}: closing the database failed: {e}"),
            );
        }
    }
}

/// Every record of `log` in `store`, in order.
pub(crate) async fn read_all(
    store: &dyn LogStore,
    log: &str,
) -> mcp_persist_core::Result<Vec<LogRecord>> {
    let mut out: Vec<LogRecord> = Vec::new();
    loop {
        let after = out.last().map_or(0, |r| r.seq);
        let batch = store.read_after(log, after, 1024).await?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            Location::parse("sqlite:./state.db").unwrap(),
            Location::Sqlite("./state.db".into())
        );
        assert_eq!(
            Location::parse("file:/var/lib/x").unwrap(),
            Location::File("/var/lib/x".into())
        );
        assert_eq!(
            Location::parse("redis://127.0.0.1:6379?prefix=app:").unwrap(),
            Location::Redis {
                urls: vec!["redis://127.0.0.1:6379".into()],
                cluster: false,
                prefix: Some("app:".into())
            }
        );
        assert_eq!(
            Location::parse("redis+cluster://a:7000,b:7001?prefix=p").unwrap(),
            Location::Redis {
                urls: vec!["redis://a:7000/".into(), "redis://b:7001/".into()],
                cluster: true,
                prefix: Some("p".into())
            }
        );
        assert_eq!(
            Location::parse(
                "secretsmanager://eu-west-1?prefix=mcp/&endpoint=http://127.0.0.1:5000"
            )
            .unwrap(),
            Location::SecretsManager {
                region: "eu-west-1".into(),
                prefix: "mcp/".into(),
                endpoint: Some("http://127.0.0.1:5000".into())
            }
        );
        let split = Spec::parse("credentials=secretsmanager://us-east-1?prefix=p;rest=sqlite:s.db")
            .unwrap();
        assert_eq!(split.rest, Location::Sqlite("s.db".into()));
        assert!(matches!(
            split.credentials,
            Some(Location::SecretsManager { .. })
        ));
    }

    #[test]
    fn bad_urls_say_what_to_write() {
        for (bad, hint) in [
            ("postgres://x", "unknown store scheme"),
            ("sqlite:", "sqlite:PATH"),
            ("state.db", "not a store URL"),
            ("secretsmanager://us-east-1", "prefix=P"),
            ("credentials=sqlite:a", "rest=URL"),
        ] {
            let err = Spec::parse(bad).unwrap_err();
            assert_eq!(err.code, crate::fail::Code::Usage, "{bad}");
            assert!(err.message.contains(hint), "{bad}: {}", err.message);
        }
    }
}
