//! The builder: reads what is stored for the server once, and wires the
//! decorator, the handle and the background writer to one shared state.

use std::{ops::Range, sync::Arc, time::Duration};

use mcp_persist_core::{
    ClientStateStore, Error as StoreError, InFlightRequest, KvStore, LegacySession, ServerKey,
    Stores,
};
use rmcp::{
    model::InitializeResult,
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{StreamableHttpClient, StreamableHttpClientTransportConfig},
    },
};
use tracing::{info, warn};

use super::{
    decorator::DurableHttpClient,
    handle::{ClientHandle, LastHandle},
    health::Health,
    journal::{self, STANDALONE_STREAM},
    recovery::RecoveryConfig,
    report::{ClientError, ClientNotice, StartKind},
    session::Seed,
    state::Shared,
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
}

impl ClientStateSource for &Stores {
    fn into_client_state(self) -> ClientStateStore {
        self.client_state()
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
}

impl DurableClientBuilder {
    /// A client of the MCP endpoint at `endpoint`, keeping its state in
    /// `store`, under the profile `default`.
    pub fn new(endpoint: impl Into<String>, store: impl ClientStateSource) -> Self {
        DurableClientBuilder {
            endpoint: endpoint.into(),
            profile: "default".to_owned(),
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
    pub async fn build(self) -> Result<(DurableTransport, ClientHandle), ClientError> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Http {
                source: Box::new(e),
            })?;
        self.build_with_client(client).await
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
        let health = Arc::new(Health::new());
        let journal = journal::spawn(
            self.store.clone(),
            key.clone(),
            health.clone(),
            self.journal_delay,
        );
        let shared = Arc::new(Shared::new(
            key.clone(),
            self.store.clone(),
            health.clone(),
            journal,
            self.id_block,
        ));

        let start = load(&shared, &self.store).await;
        let listed = if matches!(start, StartKind::InMemory { .. }) {
            Vec::new()
        } else {
            read_journal(&self.store, &key, &health).await
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
            shared: shared.clone(),
            wire,
            start,
            interrupted: Arc::new(std::sync::Mutex::new(listed)),
            recovery: self.recovery,
            _last: Arc::new(LastHandle(shared.journal().clone())),
        };
        let transport = StreamableHttpClientTransport::with_client(
            DurableHttpClient {
                inner: client,
                shared,
            },
            config,
        );
        Ok((transport, handle))
    }
}

/// Reads what is stored for the server and installs it.
async fn load(shared: &Arc<Shared>, store: &ClientStateStore) -> StartKind {
    let key = shared.key();
    match store.profile(key).await {
        Ok(Some(profile)) => shared.verdict().install(profile),
        Ok(None) => {}
        Err(e) => {
            warn!(server = %key, error = %e, "stored server profile is unusable; the era will be probed again")
        }
    }
    let stored = match store.session(key).await {
        Ok(Some(stored)) => stored.record,
        Ok(None) => {
            info!(server = %key, "no stored session; starting fresh");
            return StartKind::Fresh;
        }
        Err(e @ (StoreError::Corrupt { .. } | StoreError::InvalidInput { .. })) => {
            warn!(server = %key, error = %e, "stored session is unreadable; starting a fresh session");
            return StartKind::FreshAfterBadState {
                reason: e.to_string(),
            };
        }
        Err(e @ StoreError::NewerSchema { .. }) => {
            // Written by a newer version: neither used nor overwritten.
            warn!(server = %key, error = %e, "stored session has a newer schema; running in memory without touching it");
            return StartKind::InMemory {
                reason: e.to_string(),
            };
        }
        Err(e) => {
            warn!(server = %key, error = %e, "client state store cannot be read; running in memory");
            return StartKind::InMemory {
                reason: format!("the store cannot be read: {e}"),
            };
        }
    };
    let seed = match validate(&stored) {
        Ok(seed) => seed,
        Err(reason) => {
            warn!(server = %key, %reason, "stored session is unusable; starting a fresh session");
            return StartKind::FreshAfterBadState { reason };
        }
    };
    let ids = match store.reserve_request_ids(key, shared.ids().block()).await {
        Ok(ids) => ids,
        Err(e @ mcp_persist_core::Error::Corrupt { .. }) => {
            // The session has no ids left to continue with without repeating one.
            let reason = e.to_string();
            warn!(server = %key, %reason, "stored session is unusable; starting a fresh session");
            return StartKind::FreshAfterBadState { reason };
        }
        Err(e) => {
            warn!(server = %key, error = %e, "cannot reserve request ids; running in memory");
            shared
                .health()
                .degrade(format!("reserving request ids failed: {e}"));
            memory_ids(&stored, shared.ids().block())
        }
    };
    info!(server = %key, session = %stored.session_id, next_id = ids.start, "resuming stored session");
    let session_id = seed.session_id.clone();
    shared.install_seed(seed, ids);
    if let Some(event) = stored.last_event_ids.get(STANDALONE_STREAM) {
        shared
            .session()
            .install_standalone_cursor(session_id.clone(), event.clone());
    }
    StartKind::Resumed { session_id }
}

/// Every request an earlier process journaled and nobody collected or
/// dismissed: those of the stored session, of sessions forgotten since (a
/// 404, an ended session: reported lost), and the tasks of a server without
/// sessions.
async fn read_journal(
    store: &ClientStateStore,
    key: &ServerKey,
    health: &Health,
) -> Vec<(mcp_persist_core::SessionId, InFlightRequest)> {
    match store.journal(key).await {
        Ok(list) => {
            if !list.is_empty() {
                info!(server = %key, interrupted = list.len(), "requests of earlier processes to collect");
            }
            list
        }
        Err(e) => {
            warn!(server = %key, error = %e, "the journal of interrupted requests cannot be read");
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
