//! The sealing suite on a store folder: no planted secret or key in any
//! file the store writes (records, log segments, indexes), swapped
//! ciphertexts and wrong keys as typed errors, rekey under load and after a
//! SIGKILL, and the key-value and log suites through the seal.

use mcp_persist_store_file::FileStore;

/// Every byte of every file under `dir`, depth first.
fn files_under(dir: &std::path::Path) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read a folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                raw.extend(bytes);
            }
        }
    }
    raw
}

mcp_persist_core::seal_conformance!(
    open: |place| async move { FileStore::open(place.dir.join("store")).await },
    raw: |place| async move { files_under(&place.dir) },
);
