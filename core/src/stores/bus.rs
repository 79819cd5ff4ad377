//! The fleet notification bus: a notification published once on any
//! instance reaches every instance, through one shared, bounded log.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::debug;

use crate::{
    Key, LogStore, Result, declare,
    records::{Record, decode, encode},
    types::Timestamp,
};

/// A change every instance should tell its listeners about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FleetNotice {
    /// The tool list changed (`notifications/tools/list_changed`).
    ToolsListChanged,
    /// The prompt list changed (`notifications/prompts/list_changed`).
    PromptsListChanged,
    /// The resource list changed (`notifications/resources/list_changed`).
    ResourcesListChanged,
    /// A resource changed (`notifications/resources/updated`).
    ResourceUpdated {
        /// The resource's URI.
        uri: String,
    },
}

/// One published notice, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BusMessage {
    /// The notice.
    pub notice: FleetNotice,
    /// When it was published, by the publisher's clock.
    pub published_at: Timestamp,
    /// The instance that published it, when it said.
    pub origin: Option<String>,
    /// The W3C `traceparent` of the span that published it, so that each
    /// delivery continues that trace. `None` without tracing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Record for BusMessage {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::FLEET_NOTICE;
}

/// How much of the bus is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BusRetention {
    /// Notices kept at most (older ones are trimmed as new ones come).
    pub max_len: u64,
    /// Notices older than this are not delivered, and an idle bus expires.
    pub max_age: Duration,
}

impl Default for BusRetention {
    /// 10 000 notices, one hour.
    fn default() -> Self {
        BusRetention {
            max_len: 10_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

impl BusRetention {
    /// At most `max_len` notices, none older than `max_age`.
    pub fn new(max_len: u64, max_age: Duration) -> Self {
        BusRetention {
            max_len: max_len.max(1),
            max_age,
        }
    }
}

/// The bus over a log store: `server/bus` holds one record per notice.
#[derive(Clone)]
pub struct NotificationBus {
    log: Arc<dyn LogStore>,
    retention: BusRetention,
    published: Arc<AtomicU64>,
}

impl fmt::Debug for NotificationBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotificationBus")
            .field("log", &self.log.backend_name())
            .field("retention", &self.retention)
            .finish()
    }
}

/// The largest notice the bus carries, encoded: every instance reads every
/// notice, so one huge notice would slow the whole fleet. A resource URI of
/// this size is not a URI any client can use either.
pub const MAX_NOTICE_BYTES: usize = 16 * 1024;
/// Each publisher trims the bus once every this many of its publishes.
const TRIM_EVERY: u64 = 64;

/// The bus's log.
fn log() -> Key {
    declare::FLEET_NOTICE.key(&[])
}

impl NotificationBus {
    /// The bus in `log`, keeping what `retention` says.
    pub fn new(log: Arc<dyn LogStore>, retention: BusRetention) -> Self {
        NotificationBus {
            log,
            retention,
            published: Arc::default(),
        }
    }

    /// The retention in force.
    pub fn retention(&self) -> BusRetention {
        self.retention
    }

    /// Publishes `notice` for every instance; returns its position. The
    /// notice is committed to the shared log before this returns.
    ///
    /// A notice over [`MAX_NOTICE_BYTES`] encoded is refused with
    /// [`Error::TooLarge`](crate::Error::TooLarge) and nothing is published.
    pub async fn publish(&self, notice: FleetNotice, origin: Option<&str>) -> Result<u64> {
        self.publish_traced(notice, origin, None).await
    }

    /// [`publish`](Self::publish), carrying the W3C `traceparent` of the
    /// publishing span to every delivery.
    pub async fn publish_traced(
        &self,
        notice: FleetNotice,
        origin: Option<&str>,
        traceparent: Option<String>,
    ) -> Result<u64> {
        let message = BusMessage {
            notice,
            published_at: Timestamp::now(),
            origin: origin.map(str::to_owned),
            traceparent,
        };
        let encoded = encode(&message)?;
        if encoded.len() > MAX_NOTICE_BYTES {
            return Err(crate::Error::TooLarge {
                what: "fleet notice",
                size: encoded.len(),
                limit: MAX_NOTICE_BYTES,
            });
        }
        let seqs = self
            .log
            .append(&log(), vec![encoded], Some(self.retention.max_age))
            .await?;
        let seq = seqs.last().copied().unwrap_or_default();
        let published = self.published.fetch_add(1, Ordering::Relaxed) + 1;
        if published.is_multiple_of(TRIM_EVERY) && seq > self.retention.max_len {
            let dropped = self
                .log
                .trim(&log(), (seq - self.retention.max_len).saturating_add(1))
                .await?;
            debug!(dropped, "fleet bus trimmed to its length limit");
        }
        debug!(seq, notice = ?message.notice, "fleet notice published");
        Ok(seq)
    }

    /// The position of the newest notice (0 when none): listen after it to
    /// get only what comes next.
    pub async fn head(&self) -> Result<u64> {
        let mut after = 0;
        loop {
            let records = self.log.read_after(&log(), after, 1024).await?;
            match records.last() {
                Some(last) => after = last.seq,
                None => return Ok(after),
            }
        }
    }

    /// Notices after position `after`, waiting up to `timeout` for one to
    /// come. Notices older than the retention age are skipped; a record that
    /// does not decode is skipped with a warning (it cannot be delivered,
    /// and must not stop the others).
    pub async fn wait(
        &self,
        after: u64,
        timeout: Duration,
    ) -> Result<(u64, Vec<(u64, BusMessage)>)> {
        let records = self.log.wait_after(&log(), after, 256, timeout).await?;
        let mut last = after;
        let mut out = Vec::with_capacity(records.len());
        let oldest = Timestamp::now()
            .as_unix_millis()
            .saturating_sub(u64::try_from(self.retention.max_age.as_millis()).unwrap_or(u64::MAX));
        for record in records {
            last = last.max(record.seq);
            match decode::<BusMessage>(declare::FLEET_NOTICE.prefix, &record.data) {
                Ok(message) if message.published_at.as_unix_millis() >= oldest => {
                    out.push((record.seq, message));
                }
                Ok(_) => debug!(
                    seq = record.seq,
                    "fleet notice older than the retention age skipped"
                ),
                Err(e) => {
                    tracing::warn!(seq = record.seq, error = %e, "undecodable fleet notice skipped")
                }
            }
        }
        Ok((last, out))
    }
}
