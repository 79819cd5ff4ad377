//! Request ids on the wire: unique within a session across restarts, from
//! blocks reserved in the store, and the map back to rmcp's own ids.

use std::{collections::HashMap, ops::Range, sync::Arc, sync::Mutex};

use mcp_persist_core::{ClientStateStore, ServerKey, SessionId};
use rmcp::model::NumberOrString;
use tracing::{Instrument, warn};

use super::health::{Health, lock};

#[derive(Debug, Default)]
struct IdBlocks {
    session: Option<SessionId>,
    next: i64,
    end: i64,
    prefetched: Option<Range<i64>>,
    fetching: bool,
}

impl IdBlocks {
    fn starting(session: SessionId, ids: Range<i64>) -> Self {
        IdBlocks {
            session: Some(session),
            next: ids.start,
            end: ids.end,
            prefetched: None,
            fetching: false,
        }
    }
}

#[derive(Debug, Default)]
struct IdMap {
    wire_to_local: HashMap<i64, NumberOrString>,
    local_to_wire: HashMap<NumberOrString, i64>,
}

/// The wire ids of one client: reserved blocks, and which rmcp id each
/// wire id in flight stands for.
#[derive(Debug)]
pub(crate) struct WireIds {
    key: ServerKey,
    store: ClientStateStore,
    health: Arc<Health>,
    block: u32,
    blocks: tokio::sync::Mutex<IdBlocks>,
    map: Mutex<IdMap>,
}

impl WireIds {
    pub(crate) fn new(
        key: ServerKey,
        store: ClientStateStore,
        health: Arc<Health>,
        block: u32,
    ) -> Self {
        WireIds {
            key,
            store,
            health,
            block: block.max(2),
            blocks: tokio::sync::Mutex::new(IdBlocks::default()),
            map: Mutex::new(IdMap::default()),
        }
    }

    /// How many ids a store write reserves.
    pub(crate) fn block(&self) -> u32 {
        self.block
    }

    /// Continues a stored session at start, with ids in `ids`.
    pub(crate) fn install(&self, session: SessionId, ids: Range<i64>) {
        if let Ok(mut blocks) = self.blocks.try_lock() {
            *blocks = IdBlocks::starting(session, ids);
        }
    }

    /// A new session starts numbering in `ids`.
    pub(crate) async fn restart(&self, session: SessionId, ids: Range<i64>) {
        *self.blocks.lock().await = IdBlocks::starting(session, ids);
    }

    /// The next request id on the wire in `session`: unique within the
    /// session across restarts, from blocks reserved in the store.
    pub(crate) async fn next(self: &Arc<Self>, session: &SessionId) -> i64 {
        let mut blocks = self.blocks.lock().await;
        if blocks.session.as_ref() != Some(session) {
            // A session this process did not initialize or resume: start
            // above anything stored for it.
            let start = match self.store.session(&self.key).await {
                Ok(Some(s)) if s.record.session_id == *session => s.record.request_id_high_water,
                _ => 0,
            };
            *blocks = IdBlocks::starting(session.clone(), start..start);
        }
        if blocks.next >= blocks.end {
            let range = match blocks.prefetched.take() {
                Some(r) => r,
                None => self.reserve(blocks.end).await,
            };
            blocks.next = range.start.max(blocks.next);
            blocks.end = range.end.max(blocks.next);
            if blocks.next >= blocks.end {
                blocks.end = blocks.next.saturating_add(i64::from(self.block));
            }
        }
        let id = blocks.next;
        blocks.next += 1;
        let remaining = blocks.end - blocks.next;
        if remaining < i64::from(self.block / 2)
            && blocks.prefetched.is_none()
            && !blocks.fetching
            && self.health.persisting()
        {
            blocks.fetching = true;
            let me = self.clone();
            let session = session.clone();
            let above = blocks.end;
            tokio::spawn(
                async move {
                    let range = me.reserve(above).await;
                    let mut blocks = me.blocks.lock().await;
                    blocks.fetching = false;
                    if blocks.session.as_ref() == Some(&session) {
                        blocks.prefetched = Some(range);
                    }
                }
                .in_current_span(),
            );
        }
        id
    }

    /// Reserves a block in the store; in memory (above `above`) once the
    /// store has failed.
    async fn reserve(&self, above: i64) -> Range<i64> {
        let memory = above..above.saturating_add(i64::from(self.block));
        if !self.health.persisting() {
            return memory;
        }
        match self.store.reserve_request_ids(&self.key, self.block).await {
            Ok(r) if r.start >= above => r,
            Ok(r) => r.end.max(above)..r.end.max(above),
            Err(e) => {
                warn!(error = %e, "reserving request ids failed; continuing in memory");
                self.health
                    .degrade(format!("reserving request ids failed: {e}"));
                memory
            }
        }
    }

    /// Remembers that rmcp's `local` went out as `wire`.
    pub(crate) fn map(&self, local: NumberOrString, wire: i64) {
        let mut map = lock(&self.map);
        if let Some(old) = map.local_to_wire.insert(local.clone(), wire) {
            map.wire_to_local.remove(&old);
        }
        map.wire_to_local.insert(wire, local);
    }

    /// The rmcp id of an answer that went out as `wire`, forgetting the pair.
    pub(crate) fn take_local(&self, wire: i64) -> Option<NumberOrString> {
        let mut map = lock(&self.map);
        let local = map.wire_to_local.remove(&wire)?;
        map.local_to_wire.remove(&local);
        Some(local)
    }

    /// The wire id rmcp's `local` went out as, if it is in flight.
    pub(crate) fn wire_of(&self, local: &NumberOrString) -> Option<i64> {
        lock(&self.map).local_to_wire.get(local).copied()
    }
}
