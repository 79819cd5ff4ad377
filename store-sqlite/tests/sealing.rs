//! The sealing suite on a database file: no planted secret or key in the
//! database's pages (the main file and its write-ahead log, read raw),
//! swapped ciphertexts and wrong keys as typed errors, rekey under load and
//! after a SIGKILL, and the key-value and log suites through the seal.

use mcp_persist_store_sqlite::SqliteStore;

/// Every byte of every file the database keeps (main file, WAL, index).
fn files_under(dir: &std::path::Path) -> Vec<u8> {
    let mut raw = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the store's folder") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            raw.extend(std::fs::read(&path).expect("read a database file"));
        }
    }
    raw
}

mcp_persist_core::seal_conformance!(
    open: |place| async move { SqliteStore::open(place.dir.join("store.db")).await },
    raw: |place| async move { files_under(&place.dir) },
);
