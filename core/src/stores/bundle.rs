use std::{sync::Arc, time::Duration};

use super::{
    AuthStore, BusRetention, CallStore, ClientStateStore, EventLog, EventLogConfig, InstanceLeases,
    NotificationBus, ServerSessionStore, SharedKeyStore, TaskStore,
};
use crate::{
    Error, KvStore, LogStore, Result,
    observe::Observed,
    seal::{Sealed, Sealing},
    telemetry::Telemetry,
};

/// Which backend holds which kind of state.
///
/// Start from one backend that does both primitives, then route single kinds
/// elsewhere, e.g. credentials to a secrets manager:
///
/// ```
/// use std::sync::Arc;
/// use mcp_persist_core::{MemoryStore, Stores};
/// let main = MemoryStore::new();
/// let secrets = MemoryStore::new(); // a vault backend in production
/// let stores = Stores::new(main).with_credentials(Arc::new(secrets));
/// assert_eq!(stores.credentials().backend_name(), "memory");
/// ```
///
/// A key-value-only backend can hold every kind but the event log; asking a
/// bundle without a log store for an [`EventLog`] is
/// [`Error::Unsupported`], and a backend that is no [`LogStore`] cannot be
/// passed where logs go at all.
///
/// [`encrypted`](Stores::encrypted) seals records before they reach any of
/// the backends (see [`seal`](crate::seal)). Every call to a backend is a
/// `store {operation}` span, and with [`with_telemetry`](Stores::with_telemetry)
/// a sample of its duration (see [`telemetry`](crate::telemetry)).
#[derive(Clone, Debug)]
pub struct Stores {
    client_state: Arc<dyn KvStore>,
    credentials: Arc<dyn KvStore>,
    sessions: Arc<dyn KvStore>,
    events: Option<(Arc<dyn KvStore>, Arc<dyn LogStore>)>,
    /// The seal, and the event log behind it (made once: its writer
    /// position must be one per process).
    sealing: Option<(Sealing, Option<Arc<dyn LogStore>>)>,
    telemetry: Telemetry,
}

impl Stores {
    /// Every kind of state in one backend.
    pub fn new<B: KvStore + LogStore>(backend: B) -> Self {
        let backend = Arc::new(backend);
        Stores::from_parts(backend.clone(), Some(backend))
    }

    /// Every kind of state in a key-value backend, and the event log in
    /// `log` if given.
    pub fn from_parts(kv: Arc<dyn KvStore>, log: Option<Arc<dyn LogStore>>) -> Self {
        Stores {
            client_state: kv.clone(),
            credentials: kv.clone(),
            sessions: kv.clone(),
            events: log.map(|log| (kv, log)),
            sealing: None,
            telemetry: Telemetry::disabled(),
        }
    }

    /// Records the duration of every backend call, and gives the
    /// transport's builders (which take it from the bundle) where to
    /// record theirs. Call it after installing the application's meter
    /// provider:
    ///
    /// ```
    /// use mcp_persist_core::{MemoryStore, Stores, telemetry::{SessionIds, Telemetry}};
    /// let stores = Stores::new(MemoryStore::new())
    ///     .with_telemetry(Telemetry::disabled().session_ids(SessionIds::Omitted));
    /// assert!(!stores.telemetry().records_metrics());
    /// ```
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        if let Some(sealing) = self.sealing().cloned() {
            let log = self.sealed_log(&sealing);
            self.sealing = Some((sealing, log));
        }
        self
    }

    /// Where metrics go, and how session ids appear in spans.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    fn observed_kv(&self, kv: &Arc<dyn KvStore>) -> Arc<dyn KvStore> {
        Arc::new(Observed::new(kv.clone(), self.telemetry.clone()))
    }

    fn observed_log(&self, log: &Arc<dyn LogStore>) -> Arc<dyn LogStore> {
        Arc::new(Observed::new(log.clone(), self.telemetry.clone()))
    }

    /// Seals records before they reach any backend of the bundle, those
    /// routed later included: by default the records whose kind has secret
    /// fields (see [`Sealing`] for more), with the keyring's active key.
    /// Calling it again replaces the seal, never seals twice.
    ///
    /// ```
    /// use mcp_persist_core::{MemoryStore, Stores, seal::{Keyring, SealKey, Sealing}};
    /// let (key, _) = SealKey::generate()?;
    /// let stores = Stores::new(MemoryStore::new())
    ///     .encrypted(Sealing::new(Keyring::new(key)).seal_everything());
    /// assert!(stores.sealing().is_some());
    /// # Ok::<_, mcp_persist_core::Error>(())
    /// ```
    pub fn encrypted(mut self, sealing: impl Into<Sealing>) -> Self {
        let sealing = sealing.into();
        let ring = sealing.keyring();
        tracing::info!(active = %ring.active(), keys = ring.ids().len(), scope = ?sealing.scope(), "records are sealed before they reach the backends");
        let log = self.sealed_log(&sealing);
        self.sealing = Some((sealing, log));
        self
    }

    /// The seal, when [`encrypted`](Stores::encrypted).
    pub fn sealing(&self) -> Option<&Sealing> {
        self.sealing.as_ref().map(|(s, _)| s)
    }

    fn sealed_log(&self, sealing: &Sealing) -> Option<Arc<dyn LogStore>> {
        self.events.as_ref().map(|(_, log)| {
            Arc::new(Sealed::new(self.observed_log(log), sealing.clone())) as Arc<dyn LogStore>
        })
    }

    /// `kv` as the typed stores see it: observed, behind the seal if any.
    fn kv(&self, kv: &Arc<dyn KvStore>) -> Arc<dyn KvStore> {
        let kv = self.observed_kv(kv);
        match &self.sealing {
            Some((sealing, _)) => Arc::new(Sealed::new(kv, sealing.clone())),
            None => kv,
        }
    }

    /// The event log's key-value and log stores as the typed stores see them.
    fn events_parts(&self) -> Option<(Arc<dyn KvStore>, Arc<dyn LogStore>)> {
        let (kv, log) = self.events.as_ref()?;
        let log = match &self.sealing {
            Some((_, Some(sealed))) => sealed.clone(),
            _ => self.observed_log(log),
        };
        Some((self.kv(kv), log))
    }

    /// Routes credentials (tokens, client secrets, pending authorizations)
    /// and the server's [shared keys](Stores::shared_keys) to `kv`.
    pub fn with_credentials(mut self, kv: Arc<dyn KvStore>) -> Self {
        self.credentials = kv;
        self
    }

    /// Routes client state (profiles, sessions, in-flight journal) to `kv`.
    pub fn with_client_state(mut self, kv: Arc<dyn KvStore>) -> Self {
        self.client_state = kv;
        self
    }

    /// Routes server sessions to `kv`.
    pub fn with_sessions(mut self, kv: Arc<dyn KvStore>) -> Self {
        self.sessions = kv;
        self
    }

    /// Routes the event log to `log`, with stream metadata in `kv`.
    pub fn with_events(mut self, kv: Arc<dyn KvStore>, log: Arc<dyn LogStore>) -> Self {
        self.events = Some((kv, log));
        if let Some(sealing) = self.sealing().cloned() {
            let log = self.sealed_log(&sealing);
            self.sealing = Some((sealing, log));
        }
        self
    }

    /// The client state store.
    pub fn client_state(&self) -> ClientStateStore {
        ClientStateStore::new(self.kv(&self.client_state))
    }

    /// The credential store.
    pub fn credentials(&self) -> AuthStore {
        AuthStore::new(self.kv(&self.credentials))
    }

    /// Secret keys shared by a server fleet, kept where credentials are.
    pub fn shared_keys(&self) -> SharedKeyStore {
        SharedKeyStore::new(self.kv(&self.credentials))
    }

    /// The server session store, with sessions expiring after `idle_ttl`.
    pub fn sessions(&self, idle_ttl: Duration) -> ServerSessionStore {
        ServerSessionStore::new(self.kv(&self.sessions), idle_ttl)
    }

    /// Tool calls keyed for exactly-once execution, kept with the sessions
    /// for `window` after their last change.
    pub fn calls(&self, window: Duration) -> CallStore {
        CallStore::new(self.kv(&self.sessions), window)
    }

    /// The durable task store, kept where the event log is (records in its
    /// key-value store, inboxes in its log store), or
    /// [`Error::Unsupported`] when no log store is routed.
    pub fn tasks(&self) -> Result<TaskStore> {
        match self.events_parts() {
            Some((kv, log)) => Ok(TaskStore::new(kv, log)),
            None => Err(Error::Unsupported {
                operation: "durable tasks",
                backend: self.client_state.backend_name(),
            }),
        }
    }

    /// The fleet notification bus, in the event log's log store, or
    /// [`Error::Unsupported`] when no log store is routed.
    pub fn bus(&self, retention: BusRetention) -> Result<NotificationBus> {
        match self.events_parts() {
            Some((_, log)) => Ok(NotificationBus::new(log, retention)),
            None => Err(Error::Unsupported {
                operation: "the fleet notification bus",
                backend: self.client_state.backend_name(),
            }),
        }
    }

    /// The fleet's instance liveness leases, kept with the sessions, with
    /// heartbeats in the event log's log store when one is routed (see
    /// [`InstanceLeases`] for both rules); an instance is dead once it has
    /// been silent for `grace`.
    pub fn instance_leases(&self, grace: Duration) -> InstanceLeases {
        let leases = InstanceLeases::new(self.kv(&self.sessions), grace);
        match self.events_parts() {
            Some((_, log)) => leases.with_heartbeats(log),
            None => leases,
        }
    }

    /// The event store, or [`Error::Unsupported`] when no log store is routed.
    pub fn events(&self, config: EventLogConfig) -> Result<EventLog> {
        match self.events_parts() {
            Some((kv, log)) => Ok(EventLog::new(kv, log, config)),
            None => Err(Error::Unsupported {
                operation: "event logs",
                backend: self.client_state.backend_name(),
            }),
        }
    }
}
