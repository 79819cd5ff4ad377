//! Store URLs: one place that turns `sqlite:state.db`, `file:./state`,
//! `redis://host:6379/?prefix=app`, … into an open backend.
//!
//! Each backend crate has an [`Opener`] for its schemes; a [`Registry`] holds
//! the openers an application (or a tool) was built with and opens whichever
//! backend a URL names. The `mcp-persist` facade builds the registry of the
//! backends its features enable (`mcp_persist::registry()`), and the
//! command line uses that registry: no tool matches backends by hand, and a
//! new backend is one line there.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use mcp_persist_core::registry::{OpenOptions, Registry};
//! use mcp_persist_core::{Error, memory};
//!
//! let registry = Registry::new().with(memory::MemoryOpener);
//! let store = registry.open("memory:", OpenOptions::default()).await?;
//! assert_eq!(store.kv.backend_name(), "memory");
//! assert!(store.log.is_some());
//!
//! let err = registry.open("nosuch://x", OpenOptions::default()).await.unwrap_err();
//! assert!(matches!(err, Error::InvalidInput { .. }));
//! assert!(err.to_string().contains("memory:"), "{err}"); // it lists what it knows
//! # Ok::<_, Error>(()) }).unwrap();
//! ```

use std::{any::Any, fmt, future::Future, pin::Pin, sync::Arc};

use async_trait::async_trait;

use crate::{Error, KvStore, LogStore, Result, Stores};

/// Whether opening may create the store, or change it.
///
/// In the two modes that need an existing store, anything that is not a
/// store of this backend (a missing path, an empty or foreign file, a folder
/// that is not a store) is [`Error::NotFound`] with `what` = `"store"` and a
/// detail that starts with what was found, and is left exactly as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OpenMode {
    /// Create the store when it does not exist yet (what applications do).
    #[default]
    Create,
    /// Open only a store that already exists; opening may bring it up to
    /// date (a schema migration, a layout completed).
    Existing,
    /// Open only a store that already exists, and change nothing while
    /// opening (what tools that only read need): a store that opening would
    /// upgrade or complete is refused with [`Error::Unsupported`] instead.
    ReadOnly,
}

/// How to open a store.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OpenOptions {
    /// Create, open what exists, or open what exists without changing it.
    pub mode: OpenMode,
    /// With [`OpenMode::Create`], also create missing parent folders of a
    /// local store (default: yes). Tools turn it off, so a mistyped path is
    /// refused rather than created.
    pub create_folders: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            mode: OpenMode::Create,
            create_folders: true,
        }
    }
}

impl OpenOptions {
    /// Options that open only an existing store (see [`OpenMode::Existing`]).
    pub fn existing() -> Self {
        OpenOptions {
            mode: OpenMode::Existing,
            ..Self::default()
        }
    }

    /// Options that open only an existing store and change nothing (see
    /// [`OpenMode::ReadOnly`]).
    pub fn read_only() -> Self {
        OpenOptions {
            mode: OpenMode::ReadOnly,
            ..Self::default()
        }
    }

    /// The same options, creating missing parent folders or not.
    pub fn create_folders(mut self, create: bool) -> Self {
        self.create_folders = create;
        self
    }

    /// Whether the store must already exist.
    pub fn needs_existing(&self) -> bool {
        matches!(self.mode, OpenMode::Existing | OpenMode::ReadOnly)
    }
}

/// Whether a store is at `url`, asked by opening it read-only and closing
/// it: `false` when the opener answers [`not_a_store`]. For an opener's
/// [`Opener::exists`] when its `open` would make the store (a Postgres
/// schema, a DynamoDB table), so that a dry run says it would be made and
/// a tool opens it after the other parts of a split store. Any other
/// error is returned as it is.
pub async fn there_read_only(opener: &(impl Opener + ?Sized), url: &StoreUrl) -> Result<bool> {
    match opener.open(url, OpenOptions::read_only()).await {
        Ok(store) => {
            store.close().await?;
            Ok(true)
        }
        Err(Error::NotFound { what: "store", .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The error of a store that is not there, or not a store: `detail` says
/// what was found (`"not a store: …"`, `"nothing at …"`).
pub fn not_a_store(detail: impl Into<String>) -> Error {
    Error::NotFound {
        what: "store",
        detail: Some(detail.into()),
    }
}

/// The value of a store URL's `endpoint=` option (a service address, such
/// as a local emulator's): an `http` or `https` URL with a host, else
/// [`Error::InvalidInput`] saying what to write. The AWS SDK took an empty
/// one for a bug of the caller's and panicked, and one without a scheme
/// failed at the first request, as if the service were unreachable.
///
/// ```
/// use mcp_persist_core::registry::endpoint_option;
/// assert!(endpoint_option("http://127.0.0.1:5000").is_ok());
/// assert!(endpoint_option("").is_err());
/// assert!(endpoint_option("127.0.0.1:5000").is_err());
/// ```
pub fn endpoint_option(value: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::invalid(
            "store URL",
            format!("`endpoint={value}` {why}: write endpoint=http://HOST:PORT (or https://)"),
        )
    };
    if value.is_empty() {
        return Err(bad("has no value"));
    }
    let parsed = url::Url::parse(value).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("is not an http or https URL"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    Ok(value.to_owned())
}

/// A store URL: its scheme and the rest, with a form for people that never
/// shows a password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    text: String,
    scheme_len: usize,
}

impl StoreUrl {
    /// Splits `text` at its scheme (everything before the first `:`).
    pub fn parse(text: &str) -> Result<StoreUrl> {
        let text = text.trim();
        let Some(colon) = text.find(':') else {
            return Err(Error::invalid(
                "store URL",
                format!(
                    "`{}` has no scheme (such as sqlite: or redis://)",
                    redact(text)
                ),
            ));
        };
        let scheme = &text[..colon];
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        {
            return Err(Error::invalid(
                "store URL",
                format!("`{}` does not start with a scheme", redact(text)),
            ));
        }
        Ok(StoreUrl {
            text: text.to_owned(),
            scheme_len: colon,
        })
    }

    /// The scheme, without the colon (`sqlite`, `redis+cluster`, ...).
    pub fn scheme(&self) -> &str {
        &self.text[..self.scheme_len]
    }

    /// What follows `scheme:`.
    pub fn rest(&self) -> &str {
        &self.text[self.scheme_len + 1..]
    }

    /// The whole URL, password included: for the opener only.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The URL with any password replaced by `****`, for messages and logs.
    pub fn redacted(&self) -> String {
        redact(&self.text)
    }
}

/// `text` with the password of any `user:password@` part replaced.
pub fn redact(text: &str) -> String {
    let Some(authority_start) = text.find("://").map(|i| i + 3) else {
        return text.to_owned();
    };
    let rest = &text[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:****{}",
            &text[..authority_start],
            &authority[..colon],
            &text[authority_start + at..]
        ),
        _ => text.to_owned(),
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({})", self.redacted())
    }
}

/// What an opener runs when the store is closed.
type Closer = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send>;

/// An open backend: its key-value half, its log half if it has one, and a
/// name for people.
#[non_exhaustive]
pub struct OpenedStore {
    /// The key-value half.
    pub kv: Arc<dyn KvStore>,
    /// The log half, when the backend has logs.
    pub log: Option<Arc<dyn LogStore>>,
    /// The URL it was opened from, password hidden.
    pub label: String,
    /// The scheme it was opened through.
    pub scheme: String,
    concrete: Arc<dyn Any + Send + Sync>,
    closer: Option<Closer>,
}

impl OpenedStore {
    /// A backend with both halves, opened from `url`.
    pub fn both<S: KvStore + LogStore>(store: S, url: &StoreUrl) -> Self {
        let store = Arc::new(store);
        OpenedStore {
            kv: store.clone(),
            log: Some(store.clone()),
            label: url.redacted(),
            scheme: url.scheme().to_owned(),
            concrete: store,
            closer: None,
        }
    }

    /// A key-value-only backend, opened from `url`.
    pub fn kv_only<S: KvStore>(store: S, url: &StoreUrl) -> Self {
        let store = Arc::new(store);
        OpenedStore {
            kv: store.clone(),
            log: None,
            label: url.redacted(),
            scheme: url.scheme().to_owned(),
            concrete: store,
            closer: None,
        }
    }

    /// The same store, running `close` once every handle above is dropped
    /// (see [`close`](Self::close)): what a backend that must flush or
    /// checkpoint before the process ends gives here.
    pub fn on_close<F, Fut>(mut self, close: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.closer = Some(Box::new(move || Box::pin(close())));
        self
    }

    /// The backend's own type, for what only that backend can do (a file
    /// store's quarantine, say): `None` when it is another backend.
    pub fn downcast_ref<S: Any>(&self) -> Option<&S> {
        self.concrete.downcast_ref::<S>()
    }

    /// Closes the store: drops these handles, then runs what the backend
    /// asked to run on close (a SQLite store checkpoints its write-ahead log
    /// and removes it when it was the last user). Clones of the handles
    /// taken earlier keep the store open.
    pub async fn close(self) -> Result<()> {
        let OpenedStore {
            kv,
            log,
            concrete,
            closer,
            ..
        } = self;
        drop((kv, log, concrete));
        match closer {
            Some(close) => close().await,
            None => Ok(()),
        }
    }

    /// The typed stores over this backend.
    pub fn stores(&self) -> Stores {
        Stores::from_parts(self.kv.clone(), self.log.clone())
    }
}

impl fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedStore")
            .field("backend", &self.kv.backend_name())
            .field("scheme", &self.scheme)
            .field("label", &self.label)
            .field("log", &self.log.is_some())
            .finish()
    }
}

/// Opens the backends of some URL schemes.
#[async_trait]
pub trait Opener: Send + Sync + 'static {
    /// The schemes handled, without the colon (`sqlite`; `redis`, `rediss`).
    fn schemes(&self) -> &'static [&'static str];

    /// The URL forms, one per line, for help texts and errors: `sqlite:PATH
    /// a SQLite database file`.
    fn forms(&self) -> &'static str;

    /// Opens the store `url` names. Errors are typed: a malformed URL is
    /// [`Error::InvalidInput`], an unreachable server
    /// [`Error::Unavailable`], a missing store under
    /// [`OpenMode::Existing`] [`Error::NotFound`].
    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore>;

    /// Whether a store is at `url` (`true`), or an open with `options`
    /// would create one there (`false`), refusing what `open` would refuse,
    /// while writing nothing: what a dry run asks, and what a tool asks of
    /// every part of a split store before it opens one, so that a bad URL
    /// or an unreachable server in one part leaves the other uncreated. The
    /// default is `true` without a check. The openers of this workspace's
    /// server backends check the URL as `open` does; where `open` would
    /// make the store (a Postgres schema, a `create=1` DynamoDB table) they
    /// also ask the server, read-only ([`there_read_only`]).
    async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        let _ = (url, options);
        Ok(true)
    }

    /// The file or folder on this machine that `url` names, for backends
    /// that keep a store in one (tools lock it while they write); `None`
    /// for the rest.
    fn local_path(&self, url: &StoreUrl) -> Option<std::path::PathBuf> {
        let _ = url;
        None
    }
}

/// The openers an application or tool was built with.
#[derive(Clone, Default)]
pub struct Registry {
    openers: Vec<Arc<dyn Opener>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("schemes", &self.schemes())
            .finish()
    }
}

impl Registry {
    /// A registry that knows no backend yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same registry, also opening `opener`'s schemes.
    pub fn with(mut self, opener: impl Opener) -> Self {
        self.openers.push(Arc::new(opener));
        self
    }

    /// Every scheme known.
    pub fn schemes(&self) -> Vec<&'static str> {
        self.openers
            .iter()
            .flat_map(|o| o.schemes().iter().copied())
            .collect()
    }

    /// Every URL form known, one per line, for help texts.
    pub fn forms(&self) -> String {
        let mut out = String::new();
        for opener in &self.openers {
            for line in opener.forms().lines() {
                out.push_str("  ");
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// The opener of `scheme`.
    fn opener(&self, url: &StoreUrl) -> Result<&Arc<dyn Opener>> {
        self.openers
            .iter()
            .find(|o| o.schemes().contains(&url.scheme()))
            .ok_or_else(|| {
                Error::invalid(
                    "store URL",
                    format!(
                        "no backend for `{}:` in this build; the store URLs it knows are:\n{}",
                        url.scheme(),
                        self.forms()
                    ),
                )
            })
    }

    /// Parses `url` and checks that a backend of this registry opens it.
    pub fn parse(&self, url: &str) -> Result<StoreUrl> {
        let url = StoreUrl::parse(url)?;
        self.opener(&url)?;
        Ok(url)
    }

    /// See [`Opener::exists`].
    pub async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        self.opener(url)?.exists(url, options).await
    }

    /// See [`Opener::local_path`].
    pub fn local_path(&self, url: &StoreUrl) -> Option<std::path::PathBuf> {
        self.opener(url).ok()?.local_path(url)
    }

    /// Opens the store a parsed `url` names.
    pub async fn open_url(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let opener = self.opener(url)?;
        tracing::debug!(url = %url, mode = ?options.mode, "opening a store");
        opener.open(url, options).await
    }

    /// Opens the store `url` names.
    pub async fn open(&self, url: &str, options: OpenOptions) -> Result<OpenedStore> {
        let url = StoreUrl::parse(url)?;
        let opener = self.opener(&url)?;
        tracing::debug!(url = %url, mode = ?options.mode, "opening a store");
        opener.open(&url, options).await
    }
}
