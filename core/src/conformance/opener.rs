//! What a backend's [`Opener`] promises in each [`OpenMode`](crate::registry::OpenMode):
//! a tool that only reads (`ReadOnly`) or only works on what is there
//! (`Existing`) never makes a store where there was none, and a missing
//! store is refused with the one error every tool knows
//! ([`not_a_store`](crate::registry::not_a_store)), whatever the backend.
//!
//! The command line's `ls`, `show`, `stats` and `check` open stores
//! read-only: one backend's read-only open once created the store it was
//! asked to list, another's answered a missing store with an error of its
//! own that the command line took for a failing backend. Each backend's
//! tests run [`open_modes`] at a URL where no store is.

use crate::{
    Error, PutOptions,
    registry::{OpenOptions, Opener, Registry},
};

use super::key;

/// What a backend finds at a URL where no store was ever made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    /// Nothing that is a store (a folder, a database file, a schema, a
    /// table): `Existing` and `ReadOnly` refuse it with
    /// [`Error::NotFound`] `{ what: "store" }`.
    NotAStore,
    /// An empty store: the backend keeps no mark of a store (a key prefix
    /// on a shared server), so there is nothing to refuse, and opening it
    /// writes nothing.
    Empty,
}

/// The record [`open_modes`] writes once the store is made.
const PROBE: &str = "conformance/opener/probe";

/// Checks `opener`'s modes. `absent` is a store URL where no store is (a new
/// folder, schema, table or key prefix); `create` is the URL that makes a
/// store there when opened with [`OpenMode::Create`](crate::registry::OpenMode::Create)
/// (the same URL, or one with the option that asks for creation).
///
/// * `ReadOnly` and `Existing`, each asked twice, find what `expect` says,
///   and never anything else: no other error, no store made (the second
///   round finds what the first did);
/// * `Create` makes the store; a record written there is then read back by
///   `ReadOnly` and `Existing` opens, twice each.
///
/// Panics with a message on the first broken promise.
pub async fn open_modes(opener: impl Opener, absent: &str, create: &str, expect: Absent) {
    let registry = Registry::new().with(opener);
    for round in 1..=2 {
        for options in [OpenOptions::read_only(), OpenOptions::existing()] {
            let opened = registry.open(absent, options).await;
            match (expect, opened) {
                (Absent::NotAStore, Err(Error::NotFound { what: "store", .. })) => {}
                (Absent::NotAStore, Err(e)) => panic!(
                    "round {round}, {options:?}: a missing store must be NotFound {{ what: \"store\" }} \
                     (tools report it as not a store), not {e:?}"
                ),
                (Absent::NotAStore, Ok(store)) => panic!(
                    "round {round}, {options:?}: opened {} where no store was: a store was made",
                    store.label
                ),
                (Absent::Empty, Ok(store)) => {
                    let keys = store
                        .kv
                        .list("")
                        .await
                        .unwrap_or_else(|e| panic!("round {round}, {options:?}: list: {e:?}"));
                    assert!(
                        keys.is_empty(),
                        "round {round}, {options:?}: an absent store lists {keys:?}"
                    );
                    store
                        .close()
                        .await
                        .unwrap_or_else(|e| panic!("round {round}, {options:?}: close: {e:?}"));
                }
                (Absent::Empty, Err(e)) => panic!(
                    "round {round}, {options:?}: an absent store of a backend without one is empty, \
                     not {e:?}"
                ),
            }
        }
    }

    let made = registry
        .open(create, OpenOptions::default())
        .await
        .unwrap_or_else(|e| panic!("Create at {create}: {e:?}"));
    made.kv
        .put(&key(PROBE), b"made".to_vec(), PutOptions::default())
        .await
        .unwrap_or_else(|e| panic!("put after Create: {e:?}"));
    made.close()
        .await
        .unwrap_or_else(|e| panic!("close after Create: {e:?}"));
    for round in 1..=2 {
        for options in [OpenOptions::read_only(), OpenOptions::existing()] {
            let store = registry
                .open(absent, options)
                .await
                .unwrap_or_else(|e| panic!("round {round}, {options:?} of the made store: {e:?}"));
            let value = store
                .kv
                .get(&key(PROBE))
                .await
                .unwrap_or_else(|e| panic!("round {round}, {options:?}: get: {e:?}"))
                .map(|entry| entry.value);
            assert_eq!(
                value.as_deref(),
                Some(&b"made"[..]),
                "round {round}, {options:?}: the record written after Create"
            );
            store
                .close()
                .await
                .unwrap_or_else(|e| panic!("round {round}, {options:?}: close: {e:?}"));
        }
    }
}

/// Checks that `opener` refuses each of `bad` (a URL and words its error
/// must hold) as [`Error::InvalidInput`] in every open mode, and that
/// [`Opener::exists`] refuses it too, with the same error, so that a dry
/// run or a split store (which ask `exists` of every part before they open
/// one) refuses it before anything is made. The URLs must be refused
/// before any request: give hosts that do not answer.
///
/// Panics with a message on the first URL that breaks it.
pub async fn refused_alike(opener: impl Opener, bad: &[(&str, &str)]) {
    for (text, says) in bad {
        let url = crate::registry::StoreUrl::parse(text)
            .unwrap_or_else(|e| panic!("{text} is no store URL at all: {e}"));
        for options in [
            OpenOptions::default(),
            OpenOptions::existing(),
            OpenOptions::read_only(),
        ] {
            let opened = match opener.open(&url, options).await {
                Ok(store) => panic!("{text}, {options:?}: opened {}", store.label),
                Err(e) => e,
            };
            assert!(
                matches!(opened, Error::InvalidInput { .. }),
                "{text}, {options:?}: a bad URL must be InvalidInput, not {opened:?}"
            );
            assert!(
                opened.to_string().contains(says),
                "{text}, {options:?}: the error must say `{says}`: {opened}"
            );
            match opener.exists(&url, options).await {
                Err(asked) => assert_eq!(
                    asked.to_string(),
                    opened.to_string(),
                    "{text}, {options:?}: `exists` and `open` must refuse alike"
                ),
                Ok(found) => panic!(
                    "{text}, {options:?}: `exists` answered {found} where `open` refuses: {opened}"
                ),
            }
        }
    }
}
