//! A durable rmcp Streamable HTTP client: it survives crashes and restarts.
//!
//! [`DurableClientBuilder`] gives an rmcp transport, ready for rmcp's
//! `serve`, and a [`ClientHandle`] next to it. Inside the transport a
//! [`DurableHttpClient`] decorates rmcp's HTTP client (reqwest, or anything
//! implementing rmcp's `StreamableHttpClient`, such as rmcp's `AuthClient`)
//! and keeps the session in a store from `mcp-persist-core`, keyed by
//! endpoint URL and profile ([`ServerKey`]).
//!
//! # What it guarantees
//!
//! * **No second handshake.** After a real `initialize` the session id and
//!   the whole `InitializeResult` are stored. A restarted process answers
//!   rmcp's `initialize` from the store (same JSON-RPC id, stored session
//!   id) and drops the `notifications/initialized` the server already has:
//!   its first request carries the old `Mcp-Session-Id`. The stored
//!   capabilities, server info and instructions are readable through
//!   [`ClientHandle::initialize_result`] before any network call.
//! * **Request ids never repeat within a session.** rmcp numbers requests
//!   from 0 in every process; the decorator renumbers them on the wire from
//!   blocks reserved in the store (one write per block, the next block
//!   reserved in the background) and maps answers back to rmcp's ids.
//! * **Answers are not lost.** Every request sent in a session is journaled
//!   with its method, params and the last SSE event id of its response
//!   stream. A restarted process lists them with
//!   [`ClientHandle::interrupted`] and collects them with
//!   [`ClientHandle::recover`]: resumed with `GET` and `Last-Event-ID`
//!   (missed notifications, then the final answer), or reported with a task
//!   id to poll, or reported as lost with method and params. Nothing is sent
//!   again without the application deciding so.
//! * **Server messages are not lost either.** The last event id of the
//!   session's standalone GET stream (server notifications and requests
//!   outside any request) is stored too; the first GET of a restarted process
//!   sends it as `Last-Event-ID`, so the server replays what it sent while no
//!   process listened. A server that refuses it (events expired, or none
//!   kept) gets a fresh GET. Messages that arrived within the journal's
//!   coalescing window before a crash may arrive again.
//! * **No stall.** Journal and cursor writes go to a background writer that
//!   coalesces them: a request answered within the coalescing window
//!   ([`DurableClientBuilder::journal_delay`], 10 ms by default) is never
//!   written at all. The price: a crash within that window after a request
//!   was sent loses its journal entry.
//! * **The session outlives the process.** Dropping or closing the rmcp
//!   client sends no `DELETE`; [`ClientHandle::end_session`] does.
//! * **A lost session is said so.** On a 404 for the stored session the
//!   client forgets it, lets rmcp re-initialize, stores the new session, and
//!   tells the application through [`ClientNotice::SessionExpired`] and
//!   [`ClientNotice::NewSession`] (and a `tracing` warning): the server-side
//!   state of the old session is gone.
//! * **A stale era verdict is re-probed once.** A request sent under the
//!   stored verdict and refused as an unsupported protocol version (-32022,
//!   -32004, -32001 in a JSON answer; nothing else is taken as proof) makes
//!   the client forget the verdict, send one `server/discover` (at most one
//!   per process), store what it finds and send
//!   [`ClientNotice::StaleVerdict`]. If the server still supports the
//!   request's modern version the request is sent once more; otherwise, or
//!   if the probe fails, the refusal is the answer: a running rmcp service
//!   cannot switch eras, the next start uses the new verdict. In a legacy
//!   session the verdict and the session are forgotten and the next start
//!   probes.
//! * **Bad state never reaches the wire.** A corrupt stored record, one of
//!   a newer schema, or one whose session id or `InitializeResult` no longer
//!   parses, starts a fresh session with a warning, and
//!   [`ClientHandle::start`] says why. A store that fails at runtime (disk
//!   full, database locked) turns the client into an in-memory one
//!   ([`ClientNotice::StoreDegraded`]); MCP calls keep working.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_persist_core::{MemoryStore, Stores};
//! use mcp_persist_transport_http::client::DurableClientBuilder;
//! use rmcp::{ServiceExt, model::CallToolRequestParams};
//!
//! // A durable backend in production: `FileStore`, `SqliteStore`, ...
//! let stores = Stores::new(MemoryStore::new());
//! let (transport, handle) = DurableClientBuilder::new("http://127.0.0.1:8080/mcp", &stores)
//!     .profile("default")
//!     .build()
//!     .await?;
//! if let Some(info) = handle.initialize_result() {
//!     println!("resuming with {} before any request", info.server_info.name);
//! }
//! // Answers a previous process never saw:
//! for recovery in handle.recover() {
//!     println!("interrupted: {}", recovery.request().method);
//! }
//! let client = ().serve(transport).await?;
//! let result = client.call_tool(CallToolRequestParams::new("echo")).await?;
//! println!("{result:?}");
//! // Closing keeps the session for the next process...
//! client.cancel().await?;
//! // ...unless the application ends it.
//! handle.end_session().await?;
//! # Ok(()) }
//! ```

mod decorator;
mod handle;
mod journal;
mod modern;
mod recovery;
mod state;

use std::{ops::Range, sync::Arc, time::Duration};

pub use decorator::DurableHttpClient;
pub use handle::ClientHandle;
use mcp_persist_core::{
    BoxError, ClientStateStore, Error as StoreError, InFlightRequest, KvStore, LegacySession,
    ServerKey, Stores,
};
pub use recovery::{RecoveredMessage, Recovery, RecoveryError, ResumedRequest};
use rmcp::{
    model::InitializeResult,
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{StreamableHttpClient, StreamableHttpClientTransportConfig},
    },
};
use tracing::{info, warn};

use self::{
    handle::WireClient,
    journal::STANDALONE_STREAM,
    recovery::RecoveryConfig,
    state::{Health, Seed, Shared},
};

/// The rmcp transport a [`DurableClientBuilder`] makes.
pub type DurableTransport<C = reqwest::Client> =
    StreamableHttpClientTransport<DurableHttpClient<C>>;

/// How many request ids are reserved in the store at a time by default.
pub const DEFAULT_ID_BLOCK: u32 = 256;

/// How a client process started.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartKind {
    /// On the stored session: no `initialize` is sent.
    Resumed {
        /// The session continued.
        session_id: String,
    },
    /// Nothing was stored for this server and profile.
    Fresh,
    /// Stored state was unusable and was not used; the reason says why.
    FreshAfterBadState {
        /// What was wrong with it.
        reason: String,
    },
    /// The store could not be read; the client runs on in-memory state.
    InMemory {
        /// What went wrong.
        reason: String,
    },
}

/// Something the application should know about its session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientNotice {
    /// A real `initialize` created a session (also after a 404).
    NewSession {
        /// The new session id.
        session_id: String,
        /// The session it replaces, if any.
        replaced: Option<String>,
    },
    /// The server answered 404 for the session: its server-side state
    /// (subscriptions, in-flight work, anything the server kept) is gone.
    /// rmcp re-initializes; a [`NewSession`](Self::NewSession) follows.
    SessionExpired {
        /// The session that is gone.
        session_id: String,
    },
    /// Stored state was unusable and a fresh session is used instead.
    BadStoredState {
        /// What was wrong with it.
        reason: String,
    },
    /// A request sent under the stored era verdict was refused as an
    /// unsupported protocol version: the verdict was forgotten and the
    /// server probed again, once. `new_verdict` is what that probe stored
    /// (`None`: the probe failed and the next start probes again).
    StaleVerdict {
        /// The verdict that stopped working, e.g. `modern 2026-07-28`.
        stale: String,
        /// What the server answered.
        reason: String,
        /// The verdict the re-probe stored, if any.
        new_verdict: Option<String>,
    },
    /// The store failed; the client goes on with in-memory state only, and
    /// this process's session will not survive a restart.
    StoreDegraded {
        /// What failed.
        reason: String,
    },
}

/// Errors of the builder and the handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The endpoint URL or the profile name is not valid.
    #[error("invalid endpoint or profile")]
    InvalidTarget {
        /// The validation error.
        #[source]
        source: StoreError,
    },
    /// The default HTTP client could not be built.
    #[error("building the HTTP client failed")]
    Http {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
    /// The server refused to end the session.
    #[error("ending the session failed")]
    EndSession {
        /// The HTTP client's error.
        #[source]
        source: BoxError,
    },
}

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

    /// How long journal writes wait to be coalesced (10 ms by default). A
    /// request answered within it is never written; zero writes at once.
    pub fn journal_delay(mut self, delay: Duration) -> Self {
        self.journal_delay = delay;
        self
    }

    /// How many request ids are reserved per store write (256 by default).
    pub fn id_block(mut self, ids: u32) -> Self {
        self.id_block = ids;
        self
    }

    /// How long [`ResumedRequest::next`] waits for a final answer (5
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

        let (start, interrupted, interrupted_session) = load(&shared, &self.store).await;
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
            interrupted: Arc::new(std::sync::Mutex::new(interrupted)),
            interrupted_session,
            recovery: self.recovery,
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
async fn load(
    shared: &Arc<Shared>,
    store: &ClientStateStore,
) -> (
    StartKind,
    Vec<InFlightRequest>,
    Option<mcp_persist_core::SessionId>,
) {
    let key = &shared.key;
    match store.profile(key).await {
        Ok(Some(profile)) => shared.install_profile(profile),
        Ok(None) => {}
        Err(e) => {
            warn!(server = %key, error = %e, "stored server profile is unusable; the era will be probed again")
        }
    }
    let stored = match store.session(key).await {
        Ok(Some(stored)) => stored.record,
        Ok(None) => {
            info!(server = %key, "no stored session; starting fresh");
            return (StartKind::Fresh, Vec::new(), None);
        }
        Err(e @ (StoreError::Corrupt { .. } | StoreError::InvalidInput { .. })) => {
            warn!(server = %key, error = %e, "stored session is unreadable; starting a fresh session");
            return (
                StartKind::FreshAfterBadState {
                    reason: e.to_string(),
                },
                Vec::new(),
                None,
            );
        }
        Err(e @ StoreError::NewerSchema { .. }) => {
            // Written by a newer version: neither used nor overwritten.
            warn!(server = %key, error = %e, "stored session has a newer schema; running in memory without touching it");
            return (
                StartKind::InMemory {
                    reason: e.to_string(),
                },
                Vec::new(),
                None,
            );
        }
        Err(e) => {
            warn!(server = %key, error = %e, "client state store cannot be read; running in memory");
            return (
                StartKind::InMemory {
                    reason: format!("the store cannot be read: {e}"),
                },
                Vec::new(),
                None,
            );
        }
    };
    let seed = match validate(&stored) {
        Ok(seed) => seed,
        Err(reason) => {
            warn!(server = %key, %reason, "stored session is unusable; starting a fresh session");
            return (StartKind::FreshAfterBadState { reason }, Vec::new(), None);
        }
    };
    let ids = match store.reserve_request_ids(key, shared.id_block).await {
        Ok(ids) => ids,
        Err(e) => {
            warn!(server = %key, error = %e, "cannot reserve request ids; running in memory");
            shared
                .health
                .degrade(format!("reserving request ids failed: {e}"));
            memory_ids(&stored, shared.id_block)
        }
    };
    let interrupted = match store.inflight(key, &stored.session_id).await {
        Ok(list) => list,
        Err(e) => {
            warn!(server = %key, error = %e, "the journal of interrupted requests cannot be read");
            shared.health.notify(ClientNotice::BadStoredState {
                reason: format!("the journal of interrupted requests cannot be read: {e}"),
            });
            Vec::new()
        }
    };
    info!(server = %key, session = %stored.session_id, next_id = ids.start,
        interrupted = interrupted.len(), "resuming stored session");
    let session_id = seed.session_id.clone();
    shared.install_seed(seed, ids);
    if let Some(event) = stored.last_event_ids.get(STANDALONE_STREAM) {
        shared.install_standalone_cursor(session_id.clone(), event.clone());
    }
    (
        StartKind::Resumed {
            session_id: session_id.to_string(),
        },
        interrupted,
        Some(session_id),
    )
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
