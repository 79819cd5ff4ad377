//! The conformance suite every backend must pass (feature `conformance`).
//!
//! Public async test functions over the backend traits and the typed stores,
//! and macros that stamp them as tokio tests for a backend's fixture. A
//! backend's test file builds a fixture and invokes the macros; nothing else:
//!
//! ```
//! // tests/conformance.rs of a backend crate (tokio is a dev-dependency).
//! // The memory backend's fixture stands in for yours here.
//! use mcp_persist_core::conformance::MemoryFixture;
//!
//! /// A fresh, empty store for each test.
//! async fn fixture() -> MemoryFixture {
//!     MemoryFixture::default()
//! }
//!
//! mcp_persist_core::kv_conformance!(fixture());
//! mcp_persist_core::log_conformance!(fixture());
//! # fn main() {}
//! ```
//!
//! A fixture names one store. [`KvFixture::open_kv`] opens it; every later
//! call opens it **again**, the way a restarted process would (a new
//! connection, a new file handle), so durable backends prove that what was
//! acknowledged survives. Each call of the fixture expression must give a
//! fresh, empty store (a new folder, database or key prefix), because the
//! tests run concurrently.
//!
//! Every function panics with a message on the first broken promise.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{Key, KvStore, LogStore, MemoryStore};

/// `text` as a [`Key`], for tests: panics when it is not a valid key.
pub fn key(text: impl AsRef<str>) -> Key {
    let text = text.as_ref();
    Key::new(text).unwrap_or_else(|e| panic!("{text:?} is not a valid key: {e}"))
}

pub mod crash;
pub mod kv;
pub mod log;
pub mod opener;
pub mod samples;
pub mod tasks;
pub mod typed;

/// A way to open (and reopen) one key-value store under test.
#[async_trait]
pub trait KvFixture: Send + Sync {
    /// Opens the store. The first call may create it; later calls reopen the
    /// same store from scratch, as a restarted process would.
    async fn open_kv(&self) -> Arc<dyn KvStore>;
}

/// A way to open (and reopen) one log store under test, together with the
/// key-value store the typed event store keeps its stream metadata in.
#[async_trait]
pub trait LogFixture: KvFixture {
    /// Opens the log store; later calls reopen it, as with [`KvFixture::open_kv`].
    async fn open_log(&self) -> Arc<dyn LogStore>;
}

/// A fixture made from an open closure (see [`backend_conformance!`](crate::backend_conformance!)):
/// each test gets a fresh [`Place`](crash::Place), and every `open_*` opens
/// the store there again, as a restarted process would.
pub struct PlaceFixture {
    place: crash::Place,
    _guard: crash::PlaceGuard,
    open: crash::Opener,
}

impl PlaceFixture {
    /// A fresh place for a store opened by `open`.
    pub fn new(open: crash::Opener) -> Self {
        let (place, guard) = crash::Place::fresh();
        PlaceFixture {
            place,
            _guard: guard,
            open,
        }
    }
}

#[async_trait]
impl KvFixture for PlaceFixture {
    async fn open_kv(&self) -> Arc<dyn KvStore> {
        (self.open)(self.place.clone()).await.kv
    }
}

#[async_trait]
impl LogFixture for PlaceFixture {
    async fn open_log(&self) -> Arc<dyn LogStore> {
        (self.open)(self.place.clone())
            .await
            .log
            .expect("the log suite runs on a backend with a log")
    }
}

/// Gives an open closure its signature, so that its parameter needs no
/// annotation in a backend's test file.
#[doc(hidden)]
pub fn __opener<F, Fut, S: 'static, E>(open: F, wrap: fn(S) -> crash::Opened) -> crash::Opener
where
    F: Fn(crash::Place) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<S, E>> + Send + 'static,
    E: std::fmt::Display + 'static,
{
    Arc::new(move |place| {
        let opening = open(place);
        Box::pin(async move {
            match opening.await {
                Ok(store) => wrap(store),
                Err(e) => panic!("opening the store under test failed: {e}"),
            }
        })
    })
}

/// The fixture of the memory backend: every open returns the same store.
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture(pub MemoryStore);

#[async_trait]
impl KvFixture for MemoryFixture {
    async fn open_kv(&self) -> Arc<dyn KvStore> {
        Arc::new(self.0.clone())
    }
}

#[async_trait]
impl LogFixture for MemoryFixture {
    async fn open_log(&self) -> Arc<dyn LogStore> {
        Arc::new(self.0.clone())
    }
}

/// The whole suite for a backend, from one closure that opens it at a
/// [`Place`](crash::Place): the key-value and log contracts, every typed
/// store, and the crash suite (writers killed with SIGKILL, two processes
/// racing on one key) in child processes of the test binary.
///
/// The closure takes a `Place` (a fresh folder and a unique name) and
/// returns a future of `Result<Store, E>`; it is called again for every
/// reopen and in every child process, so it must open the same store each
/// time it gets the same place. A backend's whole conformance test file:
///
/// ```ignore
/// // tests/conformance.rs
/// mcp_persist_core::backend_conformance!(open: |place| async move {
///     mcp_persist_store_sqlite::SqliteStore::open(place.dir.join("store.db")).await
/// });
/// ```
///
/// `backend_conformance!(kv_only, open: …)` is the same for a backend without logs
/// (the key-value, key-value typed and crash suites). A trailing `kills: N`
/// sets how many writers the SIGKILL test kills by default, and how many
/// increments (at most 100) each task of the two-process race makes: a
/// slow emulated service wants fewer (`MCP_PERSIST_KILLS` overrides the
/// kills).
#[macro_export]
macro_rules! backend_conformance {
    (open: $open:expr $(, kills: $kills:expr)? $(,)?) => {
        $crate::__conformance_suite!(both, $open, $crate::__kills!($($kills)?); kv log);
    };
    (kv_only, open: $open:expr $(, kills: $kills:expr)? $(,)?) => {
        $crate::__conformance_suite!(kv, $open, $crate::__kills!($($kills)?); kv);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __kills {
    () => {
        $crate::conformance::crash::DEFAULT_KILLS
    };
    ($kills:expr) => {
        $kills
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_suite {
    ($wrap:ident, $open:expr, $kills:expr; $($suite:ident)+) => {
        mod conformance_suite {
            #[allow(unused_imports)]
            use super::*;

            const KILLS: u32 = $kills;

            fn opener() -> $crate::conformance::crash::Opener {
                $crate::conformance::__opener($open, $crate::conformance::crash::Opened::$wrap)
            }

            #[allow(dead_code)]
            async fn fixture() -> $crate::conformance::PlaceFixture {
                $crate::conformance::PlaceFixture::new(opener())
            }

            $( $crate::__conformance_suite!(@$suite); )+

            /// Not a test of its own: the entry point of the crash suite's
            /// child processes (it returns at once when run by the harness).
            #[test]
            fn crash_child() {
                $crate::conformance::crash::child_main(&opener());
            }

            #[test]
            fn sigkill_loses_no_acknowledged_write() {
                $crate::conformance::crash::sigkill_loses_no_acknowledged_write(
                    &opener(),
                    &$crate::conformance::crash::test_name(module_path!(), "crash_child"),
                    KILLS,
                );
            }

            #[test]
            fn processes_open_one_new_store_at_once() {
                $crate::conformance::crash::processes_open_one_new_store_at_once(
                    &opener(),
                    &$crate::conformance::crash::test_name(module_path!(), "crash_child"),
                );
            }

            #[test]
            fn two_processes_increment_exact() {
                $crate::conformance::crash::two_processes_increment_exact(
                    &opener(),
                    &$crate::conformance::crash::test_name(module_path!(), "crash_child"),
                    u64::from(KILLS).min(100),
                );
            }
        }
    };
    (@kv) => { $crate::kv_conformance!(fixture()); };
    (@log) => { $crate::log_conformance!(fixture()); };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($module:ident, $fixture:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let fixture = $fixture.await;
                $crate::conformance::$module::$name(&fixture).await;
            }
        )+
    };
}

/// Stamps every [`KvStore`] conformance test, and the typed stores that need
/// only a key-value store, as tokio tests. The argument is an expression that
/// evaluates to a future of a fresh [`KvFixture`].
#[macro_export]
macro_rules! kv_conformance {
    ($fixture:expr) => {
        mod kv_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_tests!(kv, $fixture;
                get_missing_is_none,
                put_get_roundtrip,
                versions_strictly_increase,
                create_on_existing_is_already_exists,
                update_with_stale_version_is_conflict,
                update_on_missing_is_conflict,
                overwrite_ignores_versions,
                delete_with_version,
                versions_never_repeat_after_delete,
                cas_race_ends_exact,
                create_race_has_one_winner,
                expired_record_is_never_returned,
                expired_record_counts_as_absent,
                put_without_ttl_clears_ttl,
                list_by_prefix,
                unicode_and_odd_keys_roundtrip,
                large_values,
                oversized_value_is_too_large,
                reopen_keeps_acknowledged_writes,
            );
        }
        mod kv_typed_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_tests!(typed, $fixture;
                client_state_roundtrip,
                client_state_is_per_server_key,
                request_ids_continue_across_reopen,
                request_ids_reserved_after_a_read_never_overlap,
                inflight_journal_roundtrip,
                credentials_roundtrip_and_issuer_isolation,
                refresh_rotation_race_newer_token_wins,
                refresh_lease_has_one_holder,
                refresh_lease_takeover_is_observed_not_timed,
                pending_authorization_taken_once,
                server_session_roundtrip,
                newer_schema_is_typed_error,
                corrupt_record_is_typed_error,
            );
            $crate::__conformance_tests!(tasks, $fixture;
                instance_lease_liveness,
            );
        }
    };
}

/// Stamps every [`LogStore`] conformance test, and the typed event store's, as
/// tokio tests. The argument evaluates to a future of a fresh [`LogFixture`].
#[macro_export]
macro_rules! log_conformance {
    ($fixture:expr) => {
        mod log_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_tests!(log, $fixture;
                read_empty_log,
                append_assigns_increasing_seqs,
                read_after_is_exclusive_and_limited,
                concurrent_appends_strictly_increase,
                logs_are_independent,
                expired_log_reads_empty,
                trim_drops_older_records,
                delete_log,
                wait_after_sees_later_append,
                wait_after_times_out_empty,
                large_records,
                reopen_keeps_acknowledged_appends,
                unsynced_appends_are_committed,
                next_seq_is_the_next_appends_number,
            );
        }
        mod log_typed_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_tests!(typed, $fixture;
                event_replay_roundtrip,
                event_replay_never_crosses_streams,
                event_replay_after_reopen,
                forged_event_id_is_rejected,
                restarted_event_log_never_serves_old_ids,
                pipelined_stream_over_an_expired_log_sends_stored_numbers,
                pipelined_events_replay_whole_and_refuse_lost_ids,
                pipelined_stream_over_a_left_log_sends_stored_numbers,
            );
            $crate::__conformance_tests!(tasks, $fixture;
                task_create_is_visible_before_return,
                task_transitions_are_compare_and_swap,
                task_terminal_state_never_changes,
                task_ttl_fails_then_deletes,
                task_newer_schema_is_typed_error,
                task_inbox_wakes_the_owner,
                bus_delivers_in_order_and_stays_bounded,
            );
        }
    };
}
