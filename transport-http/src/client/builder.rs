//! The builder: reads what is stored for the server once, and wires each
//! concern of the decorator, the handle and the background writer to the
//! parts of the client's state it uses.

use std::{ops::Range, sync::Arc, time::Duration};

use mcp_persist_core::{
    ClientStateStore, Error as StoreError, InFlightRequest, KvStore, LegacySession, ServerKey,
    Stores,
    telemetry::{Side, Telemetry},
};
use rmcp::{
    model::InitializeResult,
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{StreamableHttpClient, StreamableHttpClientTransportConfig},
    },
};
use tracing::{Instrument, Span, info, warn};

use super::{
    decorator::{DurableHttpClient, Routes},
    era::{Era, Verdict},
    handle::{ClientHandle, LastHandle},
    health::Health,
    ids::WireIds,
    inbox::Inbox,
    journal::{self, JournalScope, STANDALONE_STREAM},
    progress::ProgressTokens,
    recovery::{Recoverer, RecoveryConfig},
    report::{ClientError, ClientNotice, StartKind},
    requests::Requests,
    session::{Lifecycle, Seed, SessionState},
    streams::Streams,
    tasks::TaskWatch,
    wire::WireClient,
};

/// The rmcp transport a [`DurableClientBuilder`] makes.
pub type DurableTransport<C = reqwest::Client> =
    StreamableHttpClientTransport<DurableHttpClient<C>>;

/// How many request ids are reserved in the store at a time by default.
pub const DEFAULT_ID_BLOCK: u32 = 256;

/// Anything that can hold client state: a [`ClientStateStore`], a
/// [`Stores`] bundle (its client-state route is used), or a backend behind
/// an `Arc`.
pub trait ClientStateSource {
    /// The client state store.
    fn into_client_state(self) -> ClientStateStore;

    /// Where the client records its metrics: a bundle's
    /// [`telemetry`](Stores::telemetry), nowhere for anything else (give
    /// one with [`DurableClientBuilder::telemetry`]).
    fn telemetry(&self) -> Telemetry {
        Telemetry::disabled()
    }
}

impl ClientStateSource for ClientStateStore {
    fn into_client_state(self) -> ClientStateStore {
        self
    }
}

impl ClientStateSource for Stores {
    fn into_client_state(self) -> ClientStateStore {
        self.client_state()
    }

    fn telemetry(&self) -> Telemetry {
        Stores::telemetry(self).clone()
    }
}

impl ClientStateSource for &Stores {
    fn into_client_state(self) -> ClientStateStore {
        self.client_state()
    }

    fn telemetry(&self) -> Telemetry {
        Stores::telemetry(self).clone()
    }
}

impl<B: KvStore + 'static> ClientStateSource for Arc<B> {
    fn into_client_state(self) -> ClientStateStore {
        ClientStateStore::new(self)
    }
}

impl ClientStateSource for Arc<dyn KvStore> {
    fn into_client_state(self) -> ClientStateStore {
        ClientStateStore::new(self)
    }
}

/// Builds a durable rmcp transport and its [`ClientHandle`].
#[derive(Debug)]
pub struct DurableClientBuilder {
    endpoint: String,
    profile: String,
    store: ClientStateStore,
    config: Option<StreamableHttpClientTransportConfig>,
    journal_delay: Duration,
    id_block: u32,
    recovery: RecoveryConfig,
    telemetry: Telemetry,
}

impl DurableClientBuilder {
    /// A client of the MCP endpoint at `endpoint`, keeping its state in
    /// `store`, under the profile `default`.
    pub fn new(endpoint: impl Into<String>, store: impl ClientStateSource) -> Self {
        let telemetry = store.telemetry();
        DurableClientBuilder {
            endpoint: endpoint.into(),
            profile: "default".to_owned(),
            telemetry,
            store: store.into_client_state(),
            config: None,
            journal_delay: Duration::from_millis(10),
            id_block: DEFAULT_ID_BLOCK,
            recovery: RecoveryConfig {
                timeout: Duration::from_secs(300),
                poll_interval: Duration::from_millis(500),
            },
        }
    }

    /// The profile: separate identities talking to one server from one
    /// store keep separate state (1 to 64 of `[A-Za-z0-9._-]`).
    pub fn profile(mut self, profile: impl Into<String>) -> Self {
        self.profile = profile.into();
        self
    }

    /// rmcp's transport settings (auth header, custom headers, retry
    /// policy, ...). Its URI is replaced by the builder's endpoint, and
    /// `reinit_on_expired_session` should stay on for 404 recovery.
    pub fn transport_config(mut self, config: StreamableHttpClientTransportConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// How long each change waits before the store gets it (10 ms by
    /// default): a request answered within it is never written, and an
    /// answer's mark is committed this long after the answer arrived. It is
    /// also what a crash can cut (see the [module docs](super)): a request
    /// sent less than this before a SIGKILL is not listed, and an answer
    /// received less than this (plus one store write) before may be
    /// collected again. Zero writes at once.
    pub fn journal_delay(mut self, delay: Duration) -> Self {
        self.journal_delay = delay;
        self
    }

    /// Where the client records its metrics (request durations, journal
    /// entries pending, sessions restored), and how session ids appear in
    /// its spans; by default what the [`Stores`] bundle it was built from
    /// says (see [`telemetry`](crate::telemetry)).
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// How many request ids are reserved per store write (256 by default).
    pub fn id_block(mut self, ids: u32) -> Self {
        self.id_block = ids;
        self
    }

    /// How long [`ResumedRequest::next`](crate::client::ResumedRequest::next) waits for a final answer (5
    /// minutes by default), and how often it polls a replay that ended
    /// before the answer when the server gives no `retry` (500 ms).
    pub fn recovery_timing(mut self, timeout: Duration, poll_interval: Duration) -> Self {
        self.recovery = RecoveryConfig {
            timeout,
            poll_interval,
        };
        self
    }

    /// Builds with rmcp's default HTTP client settings (no idle connection
    /// pool, same-origin redirects not followed).
    ///
    /// The HTTP client is made on a blocking thread while the store is
    /// read: loading the platform's root certificates takes about as long
    /// as reading the store (2 ms here) with rustls, and about 40 ms with
    /// OpenSSL, which reqwest picks when `native-tls` is on (beside
    /// `rustls` too). A plain-HTTP endpoint (a local or sidecar server)
    /// loads none: redirects are not followed, so its client never opens a
    /// TLS connection, and with both features on it takes rustls.
    pub async fn build(self) -> Result<(DurableTransport, ClientHandle), ClientError> {
        let plain = self
            .endpoint
            .get(..7)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
        let client = tokio::task::spawn_blocking(move || http_client(plain));
        let client = async move {
            client
                .await
                .map_err(|e| ClientError::Http {
                    source: Box::new(e),
                })?
                .map_err(|e| ClientError::Http {
                    source: Box::new(e),
                })
        };
        let key = ServerKey::new(&self.endpoint, &self.profile)
            .map_err(|source| ClientError::InvalidTarget { source })?;
        let span = client_span(&key);
        self.build_in_span(key, client, span.clone())
            .instrument(span)
            .await
    }

    /// Builds over any rmcp HTTP client (rmcp's `AuthClient`, a configured
    /// `reqwest::Client`, ...).
    ///
    /// Reads the store once: the stored session (validated), the first
    /// block of request ids, and the journal of interrupted requests. A
    /// store that cannot be read gives an in-memory client, never an error.
    pub async fn build_with_client<C: StreamableHttpClient + Sync>(
        self,
        client: C,
    ) -> Result<(DurableTransport<C>, ClientHandle), ClientError> {
        let key = ServerKey::new(&self.endpoint, &self.profile)
            .map_err(|source| ClientError::InvalidTarget { source })?;
        let span = client_span(&key);
        self.build_in_span(key, async { Ok(client) }, span.clone())
            .instrument(span)
            .await
    }

    /// Wires each concern to the parts of the client's state it uses, and
    /// reads the store; `client` is awaited once the store has been read.
    async fn build_in_span<C: StreamableHttpClient + Sync>(
        self,
        key: ServerKey,
        client: impl std::future::Future<Output = Result<C, ClientError>>,
        span: Span,
    ) -> Result<(DurableTransport<C>, ClientHandle), ClientError> {
        let store = self.store;
        // A client of this server dropped earlier in this process may
        // still be committing what it ended with.
        journal::settle(&key).await;
        let health = Arc::new(Health::new());
        let journal = journal::spawn(
            store.clone(),
            key.clone(),
            health.clone(),
            self.journal_delay,
            span.clone(),
            self.telemetry.clone(),
        );
        let verdict = Arc::new(Verdict::new(journal.clone()));
        let ids = Arc::new(WireIds::new(
            key.clone(),
            store.clone(),
            health.clone(),
            self.id_block,
        ));
        let session_state = Arc::new(SessionState::default());
        let progress = Arc::new(ProgressTokens::default());
        let inbox = Arc::new(Inbox::new());
        let session = Lifecycle::new(
            session_state.clone(),
            ids.clone(),
            verdict.clone(),
            journal.clone(),
            health.clone(),
        );
        let tasks = TaskWatch::new(journal.clone(), health.clone());
        let requests = Requests::new(
            ids.clone(),
            progress.clone(),
            tasks.clone(),
            journal.clone(),
            health.clone(),
        );
        let streams = Streams::new(
            session_state,
            requests.clone(),
            progress,
            journal.clone(),
            inbox.clone(),
        );

        let restore = tracing::info_span!(
            "mcp_persist.session.restore",
            otel.name = "mcp_persist.session.restore",
            mcp_persist.side = "client",
            mcp_persist.outcome = tracing::field::Empty,
        );
        crate::telemetry::continue_trace(&restore, None);
        // The journal is read while the session is loaded: neither depends
        // on the other, and the request-id reservation's synced commit is
        // the longest step of a start, so the listing costs no time beside
        // it. Nothing is journaled before the client is built.
        let (start, journaled) = tokio::join!(
            load(&key, &store, &verdict, &session, &ids, &health).instrument(restore.clone()),
            store.journal(&key),
        );
        restore.record("mcp_persist.outcome", start_outcome(&start));
        if matches!(start, StartKind::Resumed { .. }) {
            self.telemetry.session_restored(Side::Client);
        }
        drop(restore);
        // A client running in memory leaves the store alone, the journal
        // of earlier processes included: what was read is set aside.
        let listed = if matches!(start, StartKind::InMemory { .. }) {
            Vec::new()
        } else {
            collect_journal(journaled, &health)
        };
        match &start {
            StartKind::FreshAfterBadState { reason } => {
                health.notify(ClientNotice::BadStoredState {
                    reason: reason.clone(),
                })
            }
            StartKind::InMemory { reason } => health.degrade(reason.clone()),
            _ => {}
        }

        let client = client.await?;
        let mut config = self
            .config
            .unwrap_or_else(|| StreamableHttpClientTransportConfig::with_uri(key.endpoint()));
        config.uri = Arc::from(self.endpoint.as_str());
        let wire = Arc::new(WireClient {
            inner: std::sync::Mutex::new(client.clone()),
            uri: config.uri.clone(),
            auth_header: config.auth_header.clone(),
        });
        let handle = ClientHandle {
            key: key.clone(),
            health: health.clone(),
            start,
            recoverer: Recoverer {
                session: session.clone(),
                journal: journal.clone(),
                ids,
                inbox,
                wire,
                config: self.recovery,
                listed: Arc::new(std::sync::Mutex::new(listed)),
                span: span.clone(),
                verdict: verdict.clone(),
            },
            _last: Arc::new(LastHandle(journal)),
        };
        let routes = Routes {
            key,
            span,
            era: Era::new(verdict, health),
            session,
            requests,
            tasks,
            streams,
            telemetry: self.telemetry,
        };
        let transport = StreamableHttpClientTransport::with_client(
            DurableHttpClient {
                inner: client,
                routes: Arc::new(routes),
            },
            config,
        );
        Ok((transport, handle))
    }
}

/// The HTTP client [`DurableClientBuilder::build`] uses: no idle connection
/// pool, redirects not followed; for a `plain` (`http://`) endpoint, with
/// no root certificates loaded, and rustls when both TLS features are on.
///
/// Without a pool every request opens a connection of its own, as stock
/// rmcp's client does, and for the same reason: a reused connection to a
/// server that does not set `TCP_NODELAY` (`axum::serve` does not by
/// default) waits out the client's delayed ACK on every response. Measured
/// on loopback with `bench_client`'s echo server and a pool switched on for
/// the measurement: 23 calls/s against such a server instead of about
/// 1,900; against one that sets it, 1.1 to 1.5 times stock rmcp's calls/s
/// instead of 0.75 to 0.9. A pool is worth offering only with a way to
/// tell the two kinds of server apart.
fn http_client(plain: bool) -> reqwest::Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none());
    #[cfg(any(feature = "rustls", feature = "native-tls"))]
    let builder = if plain {
        let builder = builder.tls_certs_only(std::iter::empty());
        // With both TLS features on, reqwest picks the platform's library,
        // and OpenSSL loads the system's whole CA bundle when its connector
        // is made, whatever certificates the client is given: about 40 ms
        // per client on a Debian machine with 146 roots, against 1.7 ms for
        // rustls with them. A plain endpoint never opens TLS, so it takes
        // the cheaper one.
        #[cfg(all(feature = "rustls", feature = "native-tls"))]
        let builder = builder.tls_backend_rustls();
        builder
    } else {
        builder
    };
    #[cfg(not(any(feature = "rustls", feature = "native-tls")))]
    let _ = plain;
    builder.build()
}

/// The client's span: entered around everything the client does, so that
/// every line it logs carries the server and profile. At `WARN`, the level
/// of the most important lines the client logs, so that a filter that lets
/// those through keeps the span as well.
fn client_span(key: &ServerKey) -> Span {
    tracing::warn_span!(
        "mcp_persist_client",
        server = %key.endpoint(),
        profile = %key.profile()
    )
}

/// How a start went, for the restore span.
fn start_outcome(start: &StartKind) -> &'static str {
    match start {
        StartKind::Resumed { .. } => "resumed",
        StartKind::Fresh => "fresh",
        StartKind::FreshAfterBadState { .. } => "fresh_after_bad_state",
        StartKind::InMemory { .. } => "in_memory",
        _ => "other",
    }
}

/// Reads what is stored for the server and installs it: the era verdict,
/// and the session with the next block of its request ids.
async fn load(
    key: &ServerKey,
    store: &ClientStateStore,
    verdict: &Verdict,
    session: &Lifecycle,
    ids: &WireIds,
    health: &Health,
) -> StartKind {
    // Two reads of their own, made at once.
    let (profile, stored) = tokio::join!(store.profile(key), store.session(key));
    match profile {
        Ok(Some(profile)) => verdict.install(profile),
        Ok(None) => {}
        Err(e) => {
            warn!(error = %e, "stored server profile is unusable; the era will be probed again")
        }
    }
    let read = match stored {
        Ok(Some(read)) => read,
        Ok(None) => {
            info!("no stored session; starting fresh");
            return StartKind::Fresh;
        }
        Err(e @ (StoreError::Corrupt { .. } | StoreError::InvalidInput { .. })) => {
            warn!(error = %e, "stored session is unreadable; starting a fresh session");
            return StartKind::FreshAfterBadState {
                reason: e.to_string(),
            };
        }
        Err(e @ StoreError::NewerSchema { .. }) => {
            // Written by a newer version: neither used nor overwritten.
            warn!(error = %e, "stored session has a newer schema; running in memory without touching it");
            return StartKind::InMemory {
                reason: e.to_string(),
            };
        }
        Err(e) => {
            warn!(error = %e, "client state store cannot be read; running in memory");
            return StartKind::InMemory {
                reason: format!("the store cannot be read: {e}"),
            };
        }
    };
    let stored = read.record.clone();
    let seed = match validate(&stored) {
        Ok(seed) => seed,
        Err(reason) => {
            warn!(%reason, "stored session is unusable; starting a fresh session");
            return StartKind::FreshAfterBadState { reason };
        }
    };
    // Reserved in the session as read: no second read before the first
    // request, unless another process changed it meanwhile.
    let ids = match store
        .reserve_request_ids_after(key, read, ids.block())
        .await
    {
        Ok(ids) => ids,
        Err(e @ mcp_persist_core::Error::Corrupt { .. }) => {
            // The session has no ids left to continue with without repeating one.
            let reason = e.to_string();
            warn!(%reason, "stored session is unusable; starting a fresh session");
            return StartKind::FreshAfterBadState { reason };
        }
        Err(e) => {
            warn!(error = %e, "cannot reserve request ids; running in memory");
            health.degrade(format!("reserving request ids failed: {e}"));
            memory_ids(&stored, ids.block())
        }
    };
    info!(session = %stored.session_id.hashed(), next_id = ids.start, "resuming stored session");
    let session_id = seed.session_id.clone();
    session.install_seed(seed, ids);
    if let Some(event) = stored.last_event_ids.get(STANDALONE_STREAM) {
        session
            .state()
            .install_standalone_cursor(session_id.clone(), event.clone());
    }
    StartKind::Resumed { session_id }
}

/// The journal as read at the start: every request an earlier process
/// journaled and nobody collected or dismissed; those of the stored
/// session, of sessions forgotten since (a 404, an ended session: reported
/// lost), and the tasks of a server without sessions.
fn collect_journal(
    journaled: mcp_persist_core::Result<Vec<(mcp_persist_core::SessionId, InFlightRequest)>>,
    health: &Health,
) -> Vec<(JournalScope, InFlightRequest)> {
    match journaled {
        Ok(list) => {
            if !list.is_empty() {
                info!(
                    interrupted = list.len(),
                    "requests of earlier processes to collect"
                );
            }
            list.into_iter()
                .map(|(session, request)| (JournalScope::from_stored(session), request))
                .collect()
        }
        Err(e) => {
            warn!(error = %e, "the journal of interrupted requests cannot be read");
            health.notify(ClientNotice::BadStoredState {
                reason: format!("the journal of interrupted requests cannot be read: {e}"),
            });
            Vec::new()
        }
    }
}

fn memory_ids(stored: &LegacySession, block: u32) -> Range<i64> {
    let start = stored.request_id_high_water;
    start..start.saturating_add(i64::from(block))
}

/// Checks that a stored session can go on the wire as it is.
fn validate(stored: &LegacySession) -> Result<Seed, String> {
    if http::HeaderValue::from_str(stored.session_id.as_str()).is_err() {
        return Err("the stored session id is not a valid header value".to_owned());
    }
    // A mark outside the ids a session can use cannot have been written by
    // this crate: start afresh rather than risk repeating an id.
    if !(0..=mcp_persist_core::MAX_REQUEST_ID).contains(&stored.request_id_high_water) {
        return Err(format!(
            "the stored request-id high-water mark {} leaves no ids to continue the session with",
            stored.request_id_high_water
        ));
    }
    if stored.protocol_version.era() != mcp_persist_core::ProtocolEra::Legacy {
        return Err(format!(
            "the stored session names protocol version {}, which has no sessions",
            stored.protocol_version
        ));
    }
    let result: InitializeResult = serde_json::from_value(stored.initialize_result.clone())
        .map_err(|e| format!("the stored InitializeResult does not parse: {e}"))?;
    if result.protocol_version.as_str() != stored.protocol_version.as_str() {
        return Err(format!(
            "the stored InitializeResult names version {} but the session {}",
            result.protocol_version.as_str(),
            stored.protocol_version
        ));
    }
    Ok(Seed {
        session_id: stored.session_id.clone(),
        result,
    })
}
