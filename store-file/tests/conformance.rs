//! The whole core conformance suite (key-value, log, typed, crash), on a
//! fresh store directory per test. Every open opens the directory again, as
//! a restarted process would, so reopen tests prove durability.

use mcp_persist_store_file::{FileStore, FileStoreOptions};

// Small segments, so that log tests cross segment boundaries.
mcp_persist_core::backend_conformance!(open: |place| async move {
    FileStore::open_with(place.dir.join("store"), FileStoreOptions::default().segment_bytes(2048))
        .await
});
