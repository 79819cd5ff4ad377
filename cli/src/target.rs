//! Store arguments: URLs opened through the facade's registry of backends,
//! and the split form that puts credentials in a store of their own.
//!
//! The command line knows no backend by hand: every URL scheme, its
//! parsing, the look at a local path before opening it (refusing what is
//! not a store, changing nothing) and the open itself come from the
//! backend's opener in [`mcp_persist::backends`].

use std::{path::PathBuf, sync::Arc};

use mcp_persist::{
    KvStore, LogRecord, LogStore,
    registry::{OpenOptions, OpenedStore, Registry, StoreUrl},
};

use crate::{
    fail::{Failure, usage},
    model::{credential_prefixes, is_credential_key},
    output::{Level, diag},
};

/// The split form's line of the help text (the URL forms come from the
/// registry).
const SPLIT_FORM: &str =
    "  credentials=URL;rest=URL            credentials and shared keys in one store,
                                      everything else in another";

/// Every backend this build opens.
pub(crate) fn registry() -> Registry {
    mcp_persist::backends()
}

/// The store URL forms, for help texts and error messages.
pub(crate) fn forms() -> String {
    format!("{}{SPLIT_FORM}", registry().forms())
}

/// What a command may do to the store it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Only read (`ls`, `show`, `stats`, `check`, a `copy` source): the
    /// store must exist, and opening it must not change it.
    ReadOnly,
    /// Change an existing store (`rm`, `gc`, `quarantine`).
    Write,
    /// Write into it, creating it if missing (a `copy` destination). Its
    /// folder must exist unless `create_dirs`.
    Create {
        /// Create missing parent folders too (`--create-dirs`).
        create_dirs: bool,
    },
}

impl Access {
    fn options(self) -> OpenOptions {
        match self {
            Access::ReadOnly => OpenOptions::read_only(),
            Access::Write => OpenOptions::existing(),
            Access::Create { create_dirs } => OpenOptions::default().create_folders(create_dirs),
        }
    }
}

/// One backend location: a URL a backend of this build opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    url: StoreUrl,
}

impl Location {
    /// Parses one backend URL.
    pub(crate) fn parse(text: &str) -> Result<Location, Failure> {
        registry()
            .parse(text)
            .map(|url| Location { url })
            .map_err(|e| match e {
                mcp_persist::Error::InvalidInput { reason, .. } if !text.contains(':') => usage(
                    format!("`{text}` is not a store URL; use one of:\n{}", forms())
                        + &format!("\n({reason})"),
                ),
                mcp_persist::Error::InvalidInput { reason, .. } => usage(reason),
                other => usage(other.to_string()),
            })
    }

    /// The location as shown to the operator, without any password.
    pub(crate) fn display(&self) -> String {
        self.url.redacted()
    }

    /// The file or folder on this machine that holds the store, if any.
    pub(crate) fn local_path(&self) -> Option<PathBuf> {
        registry().local_path(&self.url)
    }

    /// The database file of a SQLite store: damage reported against it is
    /// damage of the whole file.
    pub(crate) fn db_file(&self) -> Option<PathBuf> {
        (self.url.scheme() == "sqlite")
            .then(|| self.local_path())
            .flatten()
    }

    /// Whether a store is there (`true`) or opening it with `access` would
    /// create one (`false`), refusing what is not a store, opening nothing.
    pub(crate) async fn exists(&self, access: Access) -> Result<bool, Failure> {
        registry()
            .exists(&self.url, access.options())
            .await
            .map_err(|e| self.failure(access, e))
    }

    /// An opener's error, with the advice this command line can give.
    fn failure(&self, access: Access, error: mcp_persist::Error) -> Failure {
        let missing_folder = matches!(
            &error,
            mcp_persist::Error::NotFound { detail: Some(d), .. } if d.contains("does not exist")
        );
        let failure = Failure::store(&self.display(), self.db_file().as_deref(), error);
        match access {
            Access::Create { create_dirs: false } if missing_folder => failure.with_hint(
                "check the path, or pass --create-dirs to have `copy` create the missing folders",
            ),
            _ => failure,
        }
    }

    /// Opens the backend.
    pub(crate) async fn open(&self, access: Access) -> Result<Backend, Failure> {
        let label = self.display();
        let opened = registry()
            .open_url(&self.url, access.options())
            .await
            .map_err(|e| self.failure(access, e))?;
        Ok(Backend {
            label,
            location: self.clone(),
            kv: opened.kv.clone(),
            log: opened.log.clone(),
            opened: Arc::new(tokio::sync::Mutex::new(Some(opened))),
        })
    }
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
    /// Parses a store argument (see [`forms`]).
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

    /// Which locations hold a store already (`false` where opening with
    /// `access` would create one), writing nothing.
    pub(crate) async fn exists(&self, access: Access) -> Result<Found, Failure> {
        let rest = self.rest.exists(access).await?;
        let credentials = match &self.credentials {
            Some(c) => c.exists(access).await?,
            None => true,
        };
        Ok(Found { rest, credentials })
    }

    /// The store as shown, without opening it.
    pub(crate) fn display(&self) -> String {
        match &self.credentials {
            Some(c) => format!("credentials={};rest={}", c.display(), self.rest.display()),
            None => self.rest.display(),
        }
    }

    /// Whether any location is a file or folder on this machine.
    pub(crate) fn is_local(&self) -> bool {
        self.rest.local_path().is_some()
            || self
                .credentials
                .as_ref()
                .is_some_and(|c| c.local_path().is_some())
    }
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
    /// The store as its opener gave it (until closed).
    opened: Arc<tokio::sync::Mutex<Option<OpenedStore>>>,
}

impl Backend {
    /// A store error of this backend, classified, with advice.
    pub(crate) fn fail(&self, error: mcp_persist::Error) -> Failure {
        Failure::store(&self.label, self.location.db_file().as_deref(), error)
    }

    /// Runs `f` on the backend's own type, when it is an `S`.
    pub(crate) async fn with_concrete<S: std::any::Any, T>(
        &self,
        f: impl FnOnce(&S) -> T,
    ) -> Option<T> {
        let opened = self.opened.lock().await;
        opened.as_ref()?.downcast_ref::<S>().map(f)
    }

    async fn close(self) {
        let Backend {
            label,
            kv,
            log,
            opened,
            ..
        } = self;
        // Every other handle goes first: the opener's is then the last.
        drop((kv, log));
        let Some(opened) = opened.lock().await.take() else {
            return;
        };
        if let Err(e) = opened.close().await {
            diag(
                Level::Warning,
                &format!("{label}: closing the store failed: {e}"),
            );
        }
    }
}

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

/// What [`Spec::exists`] found at each location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    /// A store is at the `rest` location.
    pub(crate) rest: bool,
    /// A store is at the credentials location, or there is none.
    pub(crate) credentials: bool,
}

impl Found {
    /// Whether every location holds a store.
    pub(crate) fn all(self) -> bool {
        self.rest && self.credentials
    }
}

impl Store {
    /// Opens every backend the spec names; every location is looked at
    /// before any is opened.
    pub(crate) async fn open(spec: &Spec, access: Access) -> Result<Store, Failure> {
        let found = match access {
            // An existing store is opened: nothing to look at first.
            Access::Write => None,
            _ => Some(spec.exists(access).await?),
        };
        Store::open_found(spec, access, found).await
    }

    /// [`open`](Self::open), with what [`Spec::exists`] found already (a
    /// look at a server store can be a request).
    pub(crate) async fn open_found(
        spec: &Spec,
        access: Access,
        found: Option<Found>,
    ) -> Result<Store, Failure> {
        let rest_made = found.is_some_and(|f| !f.rest);
        // A part that opening makes is opened last: when the other fails
        // (an unreachable server), nothing was made.
        let (rest, credentials) = match &spec.credentials {
            Some(location) if rest_made => {
                let credentials = location.open(access).await?;
                match spec.rest.open(access).await {
                    Ok(rest) => (rest, Some(credentials)),
                    Err(failure) => {
                        credentials.close().await;
                        return Err(failure);
                    }
                }
            }
            Some(location) => {
                let rest = spec.rest.open(access).await?;
                match location.open(access).await {
                    Ok(credentials) => (rest, Some(credentials)),
                    Err(failure) => {
                        rest.close().await;
                        return Err(failure);
                    }
                }
            }
            None => (spec.rest.open(access).await?, None),
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
    pub(crate) async fn read_log(&self, log: &str) -> mcp_persist::Result<Vec<LogRecord>> {
        let Some(store) = self.log() else {
            return Ok(Vec::new());
        };
        read_all(&**store, log).await
    }

    /// Every live key under `prefix`, from whichever backend holds it, sorted.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<String>, Failure> {
        let mut keys: Vec<String> = self
            .rest
            .kv
            .list(prefix)
            .await
            .map_err(|e| self.rest.fail(e))?
            .into_iter()
            .map(String::from)
            .collect();
        if let Some(c) = &self.credentials {
            keys.retain(|k| !is_credential_key(k));
            for p in credential_prefixes() {
                if p.starts_with(prefix) || prefix.starts_with(p) {
                    let from = if prefix.len() > p.len() { prefix } else { p };
                    keys.extend(
                        c.kv.list(from)
                            .await
                            .map_err(|e| c.fail(e))?
                            .into_iter()
                            .map(String::from),
                    );
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

/// Every record of `log` in `store`, in order.
pub(crate) async fn read_all(
    store: &dyn LogStore,
    log: &str,
) -> mcp_persist::Result<Vec<LogRecord>> {
    let log = mcp_persist::Key::new(log)?;
    let mut out: Vec<LogRecord> = Vec::new();
    loop {
        let after = out.last().map_or(0, |r| r.seq);
        let batch = store.read_after(&log, after, 1024).await?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

/// Whether `mode` is the read-only one (for tests of the mapping).
#[cfg(test)]
fn is_read_only(access: Access) -> bool {
    access.options().mode == mcp_persist::registry::OpenMode::ReadOnly
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_through_the_registry() {
        for good in [
            "sqlite:./state.db",
            "file:/var/lib/x",
            "redis://127.0.0.1:6379?prefix=app:",
            "redis+cluster://a:7000,b:7001?prefix=p",
            "secretsmanager://eu-west-1?prefix=mcp/&endpoint=http://127.0.0.1:5000",
            "memory:",
        ] {
            Location::parse(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let split = Spec::parse("credentials=secretsmanager://us-east-1?prefix=p;rest=sqlite:s.db")
            .unwrap();
        assert_eq!(split.rest.display(), "sqlite:s.db");
        assert!(split.credentials.is_some());
        assert!(split.is_local());
        assert!(is_read_only(Access::ReadOnly));
        assert!(!is_read_only(Access::Write));
    }

    #[test]
    fn bad_urls_say_what_to_write() {
        for (bad, hint) in [
            ("nosuch://x", "no backend for `nosuch:`"),
            ("state.db", "not a store URL"),
            ("credentials=sqlite:a", "rest=URL"),
        ] {
            let err = Spec::parse(bad).unwrap_err();
            assert_eq!(err.code, crate::fail::Code::Usage, "{bad}");
            assert!(err.message.contains(hint), "{bad}: {}", err.message);
        }
    }

    #[test]
    fn passwords_never_show() {
        let spec = Spec::parse("redis://user:hunter2@127.0.0.1:6379/").unwrap();
        assert!(!spec.display().contains("hunter2"), "{}", spec.display());
    }
}
