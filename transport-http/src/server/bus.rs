//! The fleet notification bus for rmcp servers: publish a change once on
//! any instance, and every instance delivers it to its own listeners.
//!
//! * **2026-07-28**: [`FleetBus::listen`] is a ready `ServerHandler::listen`:
//!   it delivers every notice the client's accepted filter allows to the
//!   `subscriptions/listen` stream, and ends cleanly on cancel or disconnect.
//! * **Legacy sessions**: [`FleetBus::forward_to_peer`] sends notices to a
//!   session's peer (its standalone stream, which the durable event log keeps
//!   replayable on any instance).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_persist_core::{BusRetention, FleetNotice, MemoryStore, Stores};
//! use mcp_persist_transport_http::server::DurableServer;
//!
//! let server = DurableServer::builder(Stores::new(MemoryStore::new())).build()?;
//! let bus = server.fleet_bus(BusRetention::default()).await?;
//! // On whichever instance the change happens:
//! bus.publish(FleetNotice::ToolsListChanged).await?;
//! // In the handler:
//! //   fn accepted_subscription_filter(&self, r: &SubscriptionFilter) -> Option<SubscriptionFilter> {
//! //       FleetBus::accept(r)
//! //   }
//! //   async fn listen(&self, cx: SubscriptionContext) -> Result<(), ErrorData> {
//! //       self.bus.listen(cx).await
//! //   }
//! # Ok(()) }
//! ```

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use mcp_persist_core::{FleetNotice, NotificationBus, telemetry::Telemetry};
use rmcp::{
    ErrorData, RoleServer,
    model::{ResourceUpdatedNotificationParam, SubscriptionFilter},
    service::{Peer, SubscriptionContext, SubscriptionSendError},
};
use tokio::sync::broadcast;
use tracing::{Instrument, debug, info, warn};

/// Notices buffered per local listener before a slow one starts missing some.
const LOCAL_BUFFER: usize = 1024;

/// This instance's end of the fleet bus. Cheap to clone.
#[derive(Clone)]
pub struct FleetBus {
    inner: Arc<Inner>,
}

struct Inner {
    bus: NotificationBus,
    local: broadcast::Sender<FleetNotice>,
    instance: String,
    /// Publish-to-delivery lag (`mcp_persist.bus.lag`).
    telemetry: Telemetry,
}

impl std::fmt::Debug for FleetBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetBus")
            .field("bus", &self.inner.bus)
            .field("instance", &self.inner.instance)
            .finish()
    }
}

fn random_id() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return format!("pid-{}", std::process::id());
    }
    mcp_persist_core::kit::hex(&bytes)
}

impl FleetBus {
    /// Starts tailing `bus` from its current end, delivering to this
    /// instance's listeners, until every clone of the returned value is
    /// dropped.
    pub async fn start(bus: NotificationBus) -> mcp_persist_core::Result<FleetBus> {
        FleetBus::start_with(bus, Telemetry::disabled()).await
    }

    /// [`start`](Self::start), recording each delivery's lag in
    /// `telemetry` (see [`telemetry`](crate::telemetry)).
    pub async fn start_with(
        bus: NotificationBus,
        telemetry: Telemetry,
    ) -> mcp_persist_core::Result<FleetBus> {
        let head = bus.head().await?;
        let (local, _) = broadcast::channel(LOCAL_BUFFER);
        let inner = Arc::new(Inner {
            bus,
            local,
            instance: random_id(),
            telemetry,
        });
        tokio::spawn(tail(Arc::downgrade(&inner), head));
        info!(instance = %inner.instance, from = head, "fleet bus started");
        Ok(FleetBus { inner })
    }

    /// Publishes `notice` to every instance (this one included, through the
    /// shared log like everyone else, so all see the same order).
    /// The publication is a `mcp_persist.bus.publish` span (a child of
    /// whatever span publishes), whose `traceparent` travels with the
    /// notice: each instance's delivery continues that trace.
    pub async fn publish(&self, notice: FleetNotice) -> mcp_persist_core::Result<()> {
        let span = tracing::info_span!(
            "mcp_persist.bus.publish",
            otel.name = "mcp_persist.bus.publish",
            otel.kind = "producer",
        );
        let traceparent = crate::telemetry::traceparent_of(&span);
        self.inner
            .bus
            .publish_traced(notice, Some(&self.inner.instance), traceparent)
            .instrument(span)
            .await?;
        Ok(())
    }

    /// A stream of the notices this instance receives from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<FleetNotice> {
        self.inner.local.subscribe()
    }

    /// The filter to accept for a `subscriptions/listen` request: everything
    /// asked for (rmcp then narrows it to what the server advertises).
    pub fn accept(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    /// Runs one `subscriptions/listen` stream: every notice its accepted
    /// filter allows, until the client cancels or disconnects.
    pub async fn listen(&self, cx: SubscriptionContext) -> Result<(), ErrorData> {
        let mut notices = self.subscribe();
        let sink = cx.sink().clone();
        debug!(subscription = ?sink.id(), accepted = ?sink.accepted(), "listen stream open");
        loop {
            let notice = tokio::select! {
                _ = cx.cancelled() => return Ok(()),
                notice = notices.recv() => notice,
            };
            let notice = match notice {
                Ok(notice) => notice,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "a listen stream fell behind and missed notices");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            let sent = match &notice {
                FleetNotice::ToolsListChanged => sink.notify_tool_list_changed().await,
                FleetNotice::PromptsListChanged => sink.notify_prompt_list_changed().await,
                FleetNotice::ResourcesListChanged => sink.notify_resource_list_changed().await,
                FleetNotice::ResourceUpdated { uri } => {
                    sink.notify_resource_updated(uri.clone()).await
                }
                other => {
                    debug!(notice = ?other, "notice kind unknown to this version; not delivered");
                    Ok(())
                }
            };
            match sent {
                Ok(())
                | Err(SubscriptionSendError::NotificationNotAccepted(_))
                | Err(SubscriptionSendError::UnsupportedNotification(_)) => {}
                Err(SubscriptionSendError::SubscriptionClosed) => return Ok(()),
                Err(e) => {
                    debug!(error = %e, "listen stream closed by the transport");
                    return Ok(());
                }
            }
        }
    }

    /// Forwards notices to a legacy session's `peer` (list changes always;
    /// resource updates when `subscribed(uri)` says the session asked for
    /// them), until the peer is gone.
    pub fn forward_to_peer<F>(&self, peer: Peer<RoleServer>, subscribed: F)
    where
        F: Fn(&str) -> bool + Send + Sync + 'static,
    {
        let mut notices = self.subscribe();
        tokio::spawn(async move {
            loop {
                let notice = match notices.recv().await {
                    Ok(notice) => notice,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        warn!(missed, "a legacy session fell behind and missed notices");
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let sent = match notice {
                    FleetNotice::ToolsListChanged => peer.notify_tool_list_changed().await,
                    FleetNotice::PromptsListChanged => peer.notify_prompt_list_changed().await,
                    FleetNotice::ResourcesListChanged => peer.notify_resource_list_changed().await,
                    FleetNotice::ResourceUpdated { uri } if subscribed(&uri) => {
                        peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                            .await
                    }
                    _ => Ok(()),
                };
                if sent.is_err() {
                    debug!("legacy session closed; forwarding ends");
                    return;
                }
            }
        });
    }
}

/// Tails the bus into the local channel while the bus is in use.
async fn tail(inner: Weak<Inner>, mut after: u64) {
    let mut pause = Duration::from_millis(50);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let bus = strong.bus.clone();
        drop(strong);
        match bus.wait(after, Duration::from_secs(1)).await {
            Ok((last, messages)) => {
                pause = Duration::from_millis(50);
                after = last;
                let Some(strong) = inner.upgrade() else {
                    return;
                };
                for (_, message) in messages {
                    let span = tracing::info_span!(
                        "mcp_persist.bus.deliver",
                        otel.name = "mcp_persist.bus.deliver",
                        otel.kind = "consumer",
                    );
                    crate::telemetry::continue_trace(&span, message.traceparent.as_deref());
                    let _entered = span.enter();
                    let lag = mcp_persist_core::Timestamp::now()
                        .as_unix_millis()
                        .saturating_sub(message.published_at.as_unix_millis());
                    strong.telemetry.bus_delivered(Duration::from_millis(lag));
                    // No local listener is not an error.
                    let _ = strong.local.send(message.notice);
                }
            }
            Err(e) => {
                warn!(error = %e, "reading the fleet bus failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}
