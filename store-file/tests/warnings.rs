//! A store directory or file open to group or others draws a warning.
//!
//! Its own test binary: it installs a process-wide tracing subscriber, since
//! the store works on tokio's blocking threads.

use mcp_persist_core::conformance::key;
use std::{
    fmt::Write as _,
    fs,
    os::unix::fs::PermissionsExt,
    sync::{Arc, Mutex},
};

use mcp_persist_core::{KvStore, PutMode, PutOptions};
use mcp_persist_store_file::FileStore;
use tracing::{
    Event, Level, Metadata, Subscriber,
    field::{Field, Visit},
    span,
};

/// Keeps the text of every warning.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().expect("not poisoned").push(text.0);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_open_to_others_draws_a_warning() {
    let warnings = Warnings::default();
    tracing::subscriber::set_global_default(warnings.clone()).expect("first subscriber");
    let tmp = tempfile::tempdir().expect("temp dir");

    // A private store: no warning.
    let private = tmp.path().join("private");
    let store = FileStore::open(&private).await.expect("open");
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    store.get(&key("k")).await.expect("get");
    assert_eq!(warnings.take(), Vec::<String>::new());

    // A directory someone made world-readable.
    let shared = tmp.path().join("shared");
    fs::create_dir(&shared).expect("mkdir");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).expect("chmod");
    let store = FileStore::open(&shared).await.expect("open");
    let seen = warnings.take();
    assert!(
        seen.iter()
            .any(|w| w.contains("accessible by group or others") && w.contains("755")),
        "no warning about the directory: {seen:?}"
    );
    // The store does not change modes it did not create.
    assert_eq!(
        fs::metadata(&shared).expect("stat").permissions().mode() & 0o777,
        0o755
    );

    // A record file someone made group-readable: warned about when read.
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    let file = fs::read_dir(shared.join("kv"))
        .expect("kv")
        .next()
        .expect("one record")
        .expect("entry")
        .path();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).expect("chmod");
    warnings.take();
    store.get(&key("k")).await.expect("get");
    let seen = warnings.take();
    assert!(
        seen.iter()
            .any(|w| w.contains("accessible by group or others") && w.contains("640")),
        "no warning about the record file: {seen:?}"
    );
    // The value never appears in a warning.
    assert!(seen.iter().all(|w| !w.contains("\"v\"")));
}
