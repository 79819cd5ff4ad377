//! A store opened by a one-part relative path (`"state"`), as a program run
//! in its own folder would. This changes the current directory, which is
//! shared by the whole process: it is the only test in this binary.

use mcp_persist_core::conformance::key;
use mcp_persist_core::{KvStore, PutMode, PutOptions};
use mcp_persist_store_file::FileStore;

#[tokio::test]
async fn a_one_part_relative_path_opens_and_reopens() {
    let tmp = tempfile::tempdir().expect("temp dir");
    std::env::set_current_dir(tmp.path()).expect("enter the temp dir");

    // First run: the directory does not exist yet and is created.
    let store = FileStore::open("state").await.expect("first open");
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    drop(store);
    assert!(tmp.path().join("state").join("store.json").is_file());

    // Second run finds it.
    let store = FileStore::open("state").await.expect("second open");
    assert_eq!(
        store
            .get(&key("k"))
            .await
            .expect("get")
            .expect("present")
            .value,
        b"v"
    );
}
