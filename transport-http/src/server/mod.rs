//! Durable sessions and event replay for rmcp Streamable HTTP servers, on
//! any instance behind a load balancer or on serverless.
//!
//! [`DurableServer`] builds, from core's [`Stores`]:
//!
//! * a [`StreamableHttpServerConfig`] whose `session_store` is a
//!   [`DurableSessionStore`]: rmcp restores a session on any instance by
//!   replaying the client's stored `initialize`;
//! * a [`DurableSessionManager`]: rmcp's own session workers, with every SSE
//!   event committed to a [`DurableEventStore`] shared by all instances, and
//!   session liveness (idle TTL) decided by the shared store;
//! * a [`SessionBindingLayer`]: binds each session to the authenticated
//!   principal that created it, and answers bad `Last-Event-ID`s with a clear
//!   HTTP error.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use mcp_persist_core::{MemoryStore, Stores};
//! use mcp_persist_transport_http::server::DurableServer;
//! # #[derive(Clone)] struct MyHandler;
//! # impl rmcp::ServerHandler for MyHandler {}
//!
//! let stores = Stores::new(MemoryStore::new()); // a shared durable backend in production
//! let server = DurableServer::builder(stores)
//!     .idle_ttl(Duration::from_secs(30 * 60))
//!     .build()?;
//! // A tower service: mount it in axum with `Router::new().nest_service("/mcp", service)`.
//! let service = server.service(|| Ok(MyHandler));
//! # let _ = service; Ok(()) }
//! ```

mod binding;
pub mod bus;
pub mod calls;
pub mod capability;
mod event_store;
mod instance;
mod manager;
mod session_store;
mod spans;
pub mod tasks;

use std::{sync::Arc, time::Duration};

pub use binding::{Principal, SessionBinding, SessionBindingLayer};
pub use bus::FleetBus;
pub use calls::{ExactlyOnce, KeyedCalls};
pub use capability::{ClientFeature, MissingClientCapability};
pub use event_store::DurableEventStore;
pub use manager::{DurableSessionManager, SessionManagerError, SessionTransport};
use mcp_persist_core::{EventLogConfig, Result, Stores};
pub use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::SessionConfig,
};
pub use session_store::DurableSessionStore;
pub use tasks::{DurableTasks, DurableTasksBuilder, TaskContext, client_accepts_tasks};

/// The default [`liveness_grace`](DurableServerBuilder::liveness_grace).
pub const DEFAULT_LIVENESS_GRACE: Duration = Duration::from_millis(1500);

/// Builds a durable rmcp server configuration; see the [module docs](self).
#[derive(Clone)]
pub struct DurableServerBuilder {
    stores: Stores,
    idle_ttl: Duration,
    strict_sessions: bool,
    events: Option<EventLogConfig>,
    tail_idle: Duration,
    config: StreamableHttpServerConfig,
    session_config: SessionConfig,
    /// Whether the application gave its own session configuration.
    session_config_given: bool,
    principal: Option<Arc<binding::PrincipalFn>>,
    liveness_grace: Duration,
    exactly_once: ExactlyOnce,
}

impl std::fmt::Debug for DurableServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableServerBuilder")
            .field("stores", &self.stores)
            .field("idle_ttl", &self.idle_ttl)
            .field("strict_sessions", &self.strict_sessions)
            .field("events", &self.events)
            .field("tail_idle", &self.tail_idle)
            .finish_non_exhaustive()
    }
}

impl DurableServerBuilder {
    /// Reads the request's principal with `f` instead of from the
    /// [`Principal`] request extension (see [`SessionBindingLayer`]).
    pub fn principal_from<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.principal = Some(Arc::new(f));
        self
    }

    /// How long a session lives without being used, on every instance
    /// (default 30 minutes). Touches are coalesced to one store write per
    /// tenth of this.
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl = ttl;
        self
    }

    /// With `strict` (the default), every request reads its session from
    /// the store, so a session ended on one instance (a `DELETE`, or its idle
    /// TTL) is gone on all at once; the price is one store read per request
    /// (`cargo xtask bench` reports it). With `false`, an instance that holds
    /// a session notices an end elsewhere only at its next coalesced touch,
    /// up to a tenth of the idle TTL later (three minutes with the default
    /// TTL), and serves the session meanwhile.
    pub fn strict_sessions(mut self, strict: bool) -> Self {
        self.strict_sessions = strict;
        self
    }

    /// How long and how much of each event stream is kept (default: core's
    /// [`EventLogConfig::default`], one hour and 10 000 events).
    pub fn event_retention(mut self, config: EventLogConfig) -> Self {
        self.events = Some(config);
        self
    }

    /// When an SSE event counts as stored (default
    /// [`EventDurability::Synced`](mcp_persist_core::EventDurability::Synced):
    /// committed, and synced on disk backends, before it is sent).
    /// [`EventDurability::PIPELINED`](mcp_persist_core::EventDurability::PIPELINED)
    /// sends at once and commits within 10 ms, many events per commit: a
    /// crash of this instance loses at most that window, and a client
    /// resuming inside it gets 410 saying so.
    /// [`EventDurability::Written`](mcp_persist_core::EventDurability::Written)
    /// commits each event before sending it without syncing it to disk
    /// (file and SQLite skip their fsync): nothing sent is lost when the
    /// instance crashes, a power cut may take the last events.
    pub fn event_durability(mut self, durability: mcp_persist_core::EventDurability) -> Self {
        if let Some(config) = &mut self.events {
            *config = config.with_durability(durability);
        }
        self
    }

    /// Keeps no event log: streams cannot be resumed, as with rmcp's
    /// defaults, but sessions are still restored on any instance.
    pub fn without_events(mut self) -> Self {
        self.events = None;
        self
    }

    /// How long a resumed stream waits for a new event from the instance
    /// still writing it before it ends and lets the client resume again
    /// (default 60 seconds). Every resumed stream starts with a priming
    /// event carrying the resumed-from id, so a client resumes from the same
    /// place when the stream ends with nothing new.
    pub fn tail_idle(mut self, idle: Duration) -> Self {
        self.tail_idle = idle;
        self
    }

    /// Starts from this rmcp server configuration (allowed hosts, SSE retry,
    /// keep-alive...). Its `session_store` is replaced.
    pub fn http_config(mut self, config: StreamableHttpServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Configures rmcp's per-session workers. Its `keep_alive` (how long an
    /// idle session stays in this instance's memory) is capped at the idle
    /// TTL; the session itself lives in the store.
    pub fn session_config(mut self, config: SessionConfig) -> Self {
        self.session_config = config;
        self.session_config_given = true;
        self
    }

    /// How long this instance may go without a heartbeat before other
    /// instances call it stopped (default [`DEFAULT_LIVENESS_GRACE`],
    /// 1.5 s). It appends one small heartbeat every twelfth of that (not
    /// synced to disk) and renews its lease record every third. Then a
    /// replaying instance ends the streams it was writing with an error the
    /// client can act on, and its unfinished tasks are failed or taken over.
    ///
    /// With the default, a killed instance's calls end about 1.5 to 1.8 s
    /// after the kill, and a live instance whose store writes stall for up
    /// to about 1.3 s keeps its streams and tasks. A longer grace tolerates
    /// longer stalls and ends a dead instance's calls later. Every instance
    /// of a fleet should use the same value. Observers decide on their own
    /// monotonic clock (see [`InstanceLeases`](mcp_persist_core::InstanceLeases)):
    /// no wall-clock step decides it.
    pub fn liveness_grace(mut self, grace: Duration) -> Self {
        self.liveness_grace = grace.max(Duration::from_millis(30));
        self
    }

    /// How `tools/call` requests carrying an idempotency key are served
    /// (default [`ExactlyOnce::new`]: each key runs its tool at most once,
    /// on any instance; see [`calls`]). [`ExactlyOnce::disabled`] ignores
    /// keys.
    pub fn exactly_once(mut self, config: ExactlyOnce) -> Self {
        self.exactly_once = config;
        self
    }

    /// The configured server; [`mcp_persist_core::Error::Unsupported`] when
    /// events are kept but the stores route no log backend.
    pub fn build(self) -> Result<DurableServer> {
        let sessions = self
            .stores
            .sessions(self.idle_ttl)
            .with_strict_liveness(self.strict_sessions);
        let life = instance::InstanceLife::new(&self.stores, self.liveness_grace)?;
        if self.events.is_some() {
            // Heartbeat from the start, not from the first stream: another
            // instance's streams this one may have to replay can end only
            // once it has heartbeats of its own a grace period old.
            life.start_in_background();
        }
        let events = match self.events {
            Some(config) => Some(self.stores.events(config)?.with_writer(life.id())),
            None => None,
        };
        let mut session_config = self.session_config;
        session_config.keep_alive = Some(
            session_config
                .keep_alive
                .map_or(self.idle_ttl, |k| k.min(self.idle_ttl)),
        );
        // rmcp's default session configuration carries its own 3 s retry,
        // which would override the interval configured on the HTTP side for
        // every POST stream: unless the application gave a session
        // configuration of its own, the HTTP configuration's interval holds
        // for every stream.
        if !self.session_config_given || session_config.sse_retry.is_none() {
            session_config.sse_retry = self.config.sse_retry;
        }
        let rmcp_events = events.clone().map(|e| {
            DurableEventStore::new(e, self.tail_idle)
                .with_liveness(life.clone())
                .with_retry(session_config.sse_retry)
                .with_telemetry(self.stores.telemetry().clone())
        });
        let principal = self
            .principal
            .unwrap_or_else(|| Arc::new(binding::principal_from_extension));
        let calls = calls::Calls::new(
            &self.stores,
            life.clone(),
            principal.clone(),
            self.exactly_once,
        );
        let manager = Arc::new(
            DurableSessionManager::new(sessions.clone(), rmcp_events, session_config)
                .with_calls(calls.clone()),
        );
        let mut config = self.config;
        config.session_store = Some(Arc::new(
            DurableSessionStore::new(sessions.clone())
                .with_telemetry(self.stores.telemetry().clone()),
        ));
        Ok(DurableServer {
            config,
            manager,
            layer: SessionBindingLayer::with_principal_fn(sessions, events, principal.clone()),
            stores: self.stores,
            principal,
            life,
            calls,
        })
    }
}

/// An rmcp server configuration, session manager and binding layer wired to
/// shared stores. Build one per instance, from stores every instance shares.
#[derive(Clone)]
pub struct DurableServer {
    config: StreamableHttpServerConfig,
    manager: Arc<DurableSessionManager>,
    layer: SessionBindingLayer,
    stores: Stores,
    principal: Arc<binding::PrincipalFn>,
    life: Arc<instance::InstanceLife>,
    calls: Option<Arc<calls::Calls>>,
}

impl std::fmt::Debug for DurableServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableServer")
            .field("config", &self.config)
            .field("manager", &self.manager)
            .field("layer", &self.layer)
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}

impl DurableServer {
    /// A durable task runtime on this server's stores, reading principals
    /// the way the binding layer does; finish it with
    /// [`start`](DurableTasksBuilder::start). See the [module docs](crate::server::tasks).
    pub fn tasks(&self) -> DurableTasksBuilder {
        DurableTasksBuilder::new(
            self.stores.clone(),
            self.principal.clone(),
            self.life.clone(),
        )
    }

    /// This instance's id in the fleet's liveness leases.
    pub fn instance_id(&self) -> &str {
        self.life.id()
    }

    /// This instance's end of the fleet notification bus on this server's
    /// stores (see the [module docs](crate::server::bus)), tailing it from now on.
    pub async fn fleet_bus(&self, retention: mcp_persist_core::BusRetention) -> Result<FleetBus> {
        FleetBus::start_with(self.stores.bus(retention)?, self.stores.telemetry().clone()).await
    }

    /// A builder over `stores` (sessions and, unless
    /// [`without_events`](DurableServerBuilder::without_events), the event log).
    pub fn builder(stores: Stores) -> DurableServerBuilder {
        DurableServerBuilder {
            stores,
            idle_ttl: Duration::from_secs(30 * 60),
            strict_sessions: true,
            events: Some(EventLogConfig::default()),
            tail_idle: Duration::from_secs(60),
            config: StreamableHttpServerConfig::default(),
            session_config: SessionConfig::default(),
            session_config_given: false,
            principal: None,
            liveness_grace: DEFAULT_LIVENESS_GRACE,
            exactly_once: ExactlyOnce::default(),
        }
    }

    /// The rmcp server configuration, with the session store set.
    pub fn config(&self) -> StreamableHttpServerConfig {
        self.config.clone()
    }

    /// The session manager to give rmcp's `StreamableHttpService`.
    pub fn session_manager(&self) -> Arc<DurableSessionManager> {
        self.manager.clone()
    }

    /// The binding layer; wrap rmcp's service in it (or use
    /// [`service`](Self::service), which does).
    pub fn layer(&self) -> SessionBindingLayer {
        self.layer.clone()
    }

    /// rmcp's Streamable HTTP service for handlers made by `factory`, wired
    /// to the stores and wrapped in the binding layer: a tower service ready
    /// to mount (`axum::Router::nest_service`, or any hyper server). Each
    /// handler is wrapped in [`KeyedCalls`], which serves keyed `tools/call`
    /// requests exactly once (see [`calls`]) and passes the rest through.
    pub fn service<H, F>(
        &self,
        factory: F,
    ) -> SessionBinding<StreamableHttpService<KeyedCalls<H>, DurableSessionManager>>
    where
        H: rmcp::ServerHandler + Send + 'static,
        F: Fn() -> std::result::Result<H, std::io::Error> + Send + Sync + 'static,
    {
        let calls = self.calls.clone();
        let telemetry = self.stores.telemetry().clone();
        self.manager.serve_keyed_calls();
        let factory = move || {
            factory().map(|handler| KeyedCalls::new(handler, calls.clone(), telemetry.clone()))
        };
        let service =
            StreamableHttpService::new(factory, self.manager.clone(), self.config.clone());
        tower_layer::Layer::layer(&self.layer, service)
    }
}

/// The name of the shared key behind [`request_state_codec`].
pub const REQUEST_STATE_KEY: &str = "request-state";

/// A SEP-2322 `requestState` codec that every instance on `stores` shares.
///
/// A server that hands out `requestState` (multi round-trip requests) must
/// accept it back on whichever instance the client's retry reaches. The codec
/// seals with the fleet's shared key [`REQUEST_STATE_KEY`] (created by the
/// first instance that asks, kept where credentials are) and opens with it
/// and, after [`SharedKeyStore::rotate`](mcp_persist_core::SharedKeyStore::rotate),
/// with the previous key too. Build it at start; an instance picks up a
/// rotation when it builds the codec again, and until then still seals with
/// the previous key, which every instance keeps accepting.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use mcp_persist_core::{MemoryStore, Stores};
/// use rmcp::model::SealOptions;
///
/// let stores = Stores::new(MemoryStore::new()); // shared by every instance
/// let codec = mcp_persist_transport_http::server::request_state_codec(&stores).await?;
/// let state = codec.seal_with(b"step=2", &SealOptions::new().associated_data(b"user:alice"));
/// assert_eq!(codec.open_with(&state, b"user:alice")?, b"step=2");
/// # Ok(()) }
/// ```
pub async fn request_state_codec(stores: &Stores) -> Result<rmcp::model::RequestStateCodec> {
    let ring = stores
        .shared_keys()
        .get_or_create(REQUEST_STATE_KEY)
        .await?;
    let keys = ring
        .keys()
        .map(|k| (k.id.clone(), k.secret.expose_secret().as_bytes().to_vec()));
    rmcp::model::RequestStateCodec::new_with_keyring(ring.active.id.clone(), keys).map_err(|e| {
        mcp_persist_core::Error::corrupt(
            mcp_persist_core::declare::SHARED_KEY_RING
                .key(&[REQUEST_STATE_KEY])
                .to_string(),
            format!("the stored key ring is not a usable request-state keyring: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use mcp_persist_core::{KvStore, LogStore, MemoryStore, Stores};
    use rmcp::model::SealOptions;

    use super::request_state_codec;

    /// Two instances: two bundles over one backend, as two processes would
    /// have.
    fn fleet() -> (Stores, Stores) {
        let shared = std::sync::Arc::new(MemoryStore::new());
        let kv: std::sync::Arc<dyn KvStore> = shared.clone();
        let log: std::sync::Arc<dyn LogStore> = shared;
        (
            Stores::from_parts(kv.clone(), Some(log.clone())),
            Stores::from_parts(kv, Some(log)),
        )
    }

    #[tokio::test]
    async fn request_state_sealed_on_one_instance_opens_on_another() {
        let (a, b) = fleet();
        let on_a = request_state_codec(&a).await.expect("codec a");
        let on_b = request_state_codec(&b).await.expect("codec b");
        let bound = SealOptions::new().associated_data(b"user:alice|tools/call:book");
        let state = on_a.seal_with(b"step=2", &bound);
        assert_eq!(
            on_b.open_with(&state, b"user:alice|tools/call:book")
                .expect("b opens a's state"),
            b"step=2"
        );
        // Another principal, or a tampered value, is refused everywhere.
        assert!(
            on_b.open_with(&state, b"user:mallory|tools/call:book")
                .is_err()
        );
        // One character in the middle changed (a whole base64 digit, never a
        // padding bit).
        let mut chars: Vec<char> = state.chars().collect();
        let at = (chars.len() / 2..chars.len())
            .find(|&i| chars[i].is_ascii_alphanumeric())
            .expect("an alphanumeric character");
        chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        assert!(
            on_b.open_with(&tampered, b"user:alice|tools/call:book")
                .is_err()
        );

        // After a rotation, a rebuilt codec still opens the old state and
        // seals with the new key, which the old codec does not know.
        a.shared_keys()
            .rotate(super::REQUEST_STATE_KEY)
            .await
            .expect("rotate");
        let rotated = request_state_codec(&b).await.expect("rebuilt codec");
        assert_eq!(
            rotated
                .open_with(&state, b"user:alice|tools/call:book")
                .expect("the previous key still opens"),
            b"step=2"
        );
        let fresh = rotated.seal(b"step=3");
        assert!(on_a.open(&fresh).is_err(), "the old codec knows no new key");
        assert_eq!(
            request_state_codec(&a)
                .await
                .expect("a rebuilt")
                .open(&fresh)
                .expect("a rebuilt codec opens it"),
            b"step=3"
        );
    }
}
