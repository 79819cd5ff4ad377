//! The whole core conformance suite (key-value, log, typed, crash), on a
//! fresh store directory per test. Every open opens the directory again, as
//! a restarted process would, so reopen tests prove durability.

use mcp_persist_store_file::{FileStore, FileStoreOptions};

// Small segments, so that log tests cross segment boundaries.
mcp_persist_core::backend_conformance!(open: |place| async move {
    FileStore::open_with(place.dir.join("store"), FileStoreOptions::default().segment_bytes(2048))
        .await
});

/// Opened by URL: a missing folder is not a store to `ReadOnly` and
/// `Existing`, twice over, and only `Create` makes one.
#[tokio::test]
async fn open_modes() {
    use mcp_persist_core::conformance::opener::{Absent, open_modes};
    let dir = tempfile::tempdir().expect("a temporary folder");
    // A missing folder, and an empty one: neither is a store.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("an empty folder");
    for folder in [dir.path().join("store"), empty] {
        let url = format!("file:{}", folder.display());
        let file = mcp_persist_store_file::FileOpener;
        open_modes(file, &url, &url, Absent::NotAStore).await;
    }
}
