//! Conformance tests of the [`KvStore`] contract.

use super::key;
use std::{sync::Arc, time::Duration};

use super::KvFixture;
use crate::{Error, KvStore, PutMode, PutOptions, Version};

async fn put(store: &dyn KvStore, key: &str, value: &[u8], mode: PutMode) -> Version {
    store
        .put(&super::key(key), value.to_vec(), PutOptions::new(mode))
        .await
        .unwrap_or_else(|e| panic!("put {key:?} with {mode:?} failed: {e}"))
}

async fn value_of(store: &dyn KvStore, key: &str) -> Option<Vec<u8>> {
    store
        .get(&super::key(key))
        .await
        .unwrap_or_else(|e| panic!("get {key:?} failed: {e}"))
        .map(|entry| entry.value)
}

/// Reading a key never written gives `None`.
pub async fn get_missing_is_none(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    assert_eq!(value_of(&*store, "never/written").await, None);
}

/// What is written is read back with the version the write returned.
pub async fn put_get_roundtrip(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let v = put(&*store, "a/b", b"value", PutMode::Create).await;
    let entry = store.get(&key("a/b")).await.expect("get").expect("present");
    assert_eq!(entry.value, b"value");
    assert_eq!(entry.version, v);
    // The empty value is a value, not an absence.
    put(&*store, "empty", b"", PutMode::Overwrite).await;
    assert_eq!(value_of(&*store, "empty").await, Some(Vec::new()));
}

/// Every write of a key returns a greater version than the one before.
pub async fn versions_strictly_increase(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let mut last = put(&*store, "k", b"0", PutMode::Create).await;
    for i in 1..20u32 {
        let mode = if i % 2 == 0 {
            PutMode::Overwrite
        } else {
            PutMode::Update(last)
        };
        let v = put(&*store, "k", i.to_string().as_bytes(), mode).await;
        assert!(v > last, "version {v} after {last} is not greater");
        last = v;
    }
}

/// `Create` on a live key is `AlreadyExists` and leaves the value alone.
pub async fn create_on_existing_is_already_exists(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    put(&*store, "k", b"first", PutMode::Create).await;
    let err = store
        .put(
            &key("k"),
            b"second".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect_err("create on an existing key must fail");
    assert!(
        matches!(err, Error::AlreadyExists { ref key } if key == "k"),
        "want AlreadyExists naming the key, got {err:?}"
    );
    assert_eq!(value_of(&*store, "k").await.as_deref(), Some(&b"first"[..]));
}

/// `Update` with a version that is no longer current is `Conflict`, and the
/// newer value stays.
pub async fn update_with_stale_version_is_conflict(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let v1 = put(&*store, "k", b"1", PutMode::Create).await;
    put(&*store, "k", b"2", PutMode::Update(v1)).await;
    let err = store
        .put(
            &key("k"),
            b"3".to_vec(),
            PutOptions::new(PutMode::Update(v1)),
        )
        .await
        .expect_err("a stale update must fail");
    assert!(
        matches!(err, Error::Conflict { ref key } if key == "k"),
        "got {err:?}"
    );
    assert_eq!(value_of(&*store, "k").await.as_deref(), Some(&b"2"[..]));
}

/// `Update` of an absent key is `Conflict` and creates nothing.
pub async fn update_on_missing_is_conflict(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let err = store
        .put(
            &key("absent"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Update(Version::new(1))),
        )
        .await
        .expect_err("update of an absent key must fail");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
    assert_eq!(value_of(&*store, "absent").await, None);
}

/// `Overwrite` writes whatever is there.
pub async fn overwrite_ignores_versions(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    put(&*store, "k", b"1", PutMode::Overwrite).await;
    put(&*store, "k", b"2", PutMode::Overwrite).await;
    assert_eq!(value_of(&*store, "k").await.as_deref(), Some(&b"2"[..]));
}

/// `delete` with a version is a compare-and-swap; without, it always deletes.
pub async fn delete_with_version(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let v1 = put(&*store, "k", b"1", PutMode::Create).await;
    let v2 = put(&*store, "k", b"2", PutMode::Update(v1)).await;
    let err = store
        .delete(&key("k"), Some(v1))
        .await
        .expect_err("a stale delete must fail");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
    assert!(
        store
            .delete(&key("k"), Some(v2))
            .await
            .expect("delete at v2")
    );
    assert_eq!(value_of(&*store, "k").await, None);
    assert!(!store.delete(&key("k"), None).await.expect("delete absent"));
    let err = store
        .delete(&key("k"), Some(v2))
        .await
        .expect_err("a versioned delete of an absent key must fail");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
}

/// A version once handed out for a key is never handed out again, even after
/// the key was deleted (no ABA).
pub async fn versions_never_repeat_after_delete(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let v1 = put(&*store, "k", b"1", PutMode::Create).await;
    store.delete(&key("k"), None).await.expect("delete");
    let v2 = put(&*store, "k", b"2", PutMode::Create).await;
    assert!(v2 > v1, "version {v2} after delete is not above {v1}");
    let err = store
        .put(
            &key("k"),
            b"3".to_vec(),
            PutOptions::new(PutMode::Update(v1)),
        )
        .await
        .expect_err("the pre-delete version must not match");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
}

/// 8 tasks doing 25 read-modify-write increments each end at exactly 200.
pub async fn cas_race_ends_exact(f: &dyn KvFixture) {
    const TASKS: u64 = 8;
    const INCREMENTS: u64 = 25;
    let store = f.open_kv().await;
    put(&*store, "counter", b"0", PutMode::Create).await;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        // Half the tasks use a freshly opened handle, as a second process would.
        let store = if handles.len() % 2 == 0 {
            Arc::clone(&store)
        } else {
            f.open_kv().await
        };
        handles.push(tokio::spawn(async move {
            let mut conflicts = 0u64;
            for _ in 0..INCREMENTS {
                loop {
                    let entry = store
                        .get(&key("counter"))
                        .await
                        .expect("get")
                        .expect("present");
                    let n: u64 = std::str::from_utf8(&entry.value)
                        .expect("utf8")
                        .parse()
                        .expect("number");
                    match store
                        .put(
                            &key("counter"),
                            (n + 1).to_string().into_bytes(),
                            PutOptions::new(PutMode::Update(entry.version)),
                        )
                        .await
                    {
                        Ok(_) => break,
                        Err(Error::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("increment failed: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let total = value_of(&*store, "counter").await.expect("counter");
    assert_eq!(
        std::str::from_utf8(&total).expect("utf8"),
        (TASKS * INCREMENTS).to_string()
    );
}

/// Of 8 concurrent `Create`s of one key, exactly one succeeds.
pub async fn create_race_has_one_winner(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let mut handles = Vec::new();
    for i in 0..8u8 {
        let store = Arc::clone(&store);
        handles.push(tokio::spawn(async move {
            store
                .put(&key("lock"), vec![i], PutOptions::new(PutMode::Create))
                .await
        }));
    }
    let mut winners = 0;
    for h in handles {
        match h.await.expect("task") {
            Ok(_) => winners += 1,
            Err(Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(winners, 1, "exactly one create must win");
}

const SHORT_TTL: Duration = Duration::from_millis(300);
const PAST_TTL: Duration = Duration::from_millis(700);

/// A record past its TTL is never returned by `get` or `list`.
pub async fn expired_record_is_never_returned(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let written = tokio::time::Instant::now();
    store
        .put(
            &key("ttl/short"),
            b"x".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(SHORT_TTL)),
        )
        .await
        .expect("put with ttl");
    store
        .put(
            &key("ttl/long"),
            b"y".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(Duration::from_secs(600))),
        )
        .await
        .expect("put with ttl");
    let live = value_of(&*store, "ttl/short").await;
    // Before the TTL the record is there; a backend too slow to answer
    // within the TTL cannot be asked that, but must still never return it
    // after expiry (below).
    if written.elapsed() < SHORT_TTL {
        assert!(live.is_some(), "a record within its TTL was not returned");
    }
    tokio::time::sleep(PAST_TTL).await;
    assert_eq!(
        value_of(&*store, "ttl/short").await,
        None,
        "expired record returned"
    );
    assert_eq!(
        value_of(&*store, "ttl/long").await.as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(store.list("ttl/").await.expect("list"), vec!["ttl/long"]);
    store.sweep_expired().await.expect("sweep");
    assert_eq!(value_of(&*store, "ttl/short").await, None);
    assert_eq!(
        value_of(&*store, "ttl/long").await.as_deref(),
        Some(&b"y"[..])
    );
}

/// An expired key is absent: `Create` succeeds, `Update` with its old
/// version is `Conflict`.
pub async fn expired_record_counts_as_absent(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let v1 = store
        .put(
            &key("lease"),
            b"a".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(SHORT_TTL)),
        )
        .await
        .expect("put");
    tokio::time::sleep(PAST_TTL).await;
    let err = store
        .put(
            &key("lease"),
            b"b".to_vec(),
            PutOptions::new(PutMode::Update(v1)),
        )
        .await
        .expect_err("update of an expired record");
    assert!(matches!(err, Error::Conflict { .. }), "got {err:?}");
    let v2 = store
        .put(
            &key("lease"),
            b"c".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("create over an expired record");
    assert!(v2 > v1);
}

/// A write without a TTL makes the key permanent again.
pub async fn put_without_ttl_clears_ttl(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    // The TTL is long enough for the second write to land before it on any
    // sane backend; it is still well short of the wait below.
    let ttl = Duration::from_millis(500);
    let v = store
        .put(
            &key("k"),
            b"1".to_vec(),
            PutOptions::new(PutMode::Create).with_ttl(Some(ttl)),
        )
        .await
        .expect("put");
    put(&*store, "k", b"2", PutMode::Overwrite).await;
    assert!(
        v < store
            .get(&key("k"))
            .await
            .expect("get")
            .expect("present")
            .version
    );
    tokio::time::sleep(ttl + PAST_TTL).await;
    assert_eq!(value_of(&*store, "k").await.as_deref(), Some(&b"2"[..]));
}

/// `list` returns exactly the live keys under a prefix, sorted.
pub async fn list_by_prefix(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    for key in ["a/1", "a/2", "a/sub/3", "b/1", "a"] {
        put(&*store, key, b"x", PutMode::Overwrite).await;
    }
    assert_eq!(
        store.list("a/").await.expect("list"),
        vec!["a/1", "a/2", "a/sub/3"]
    );
    assert_eq!(store.list("b/").await.expect("list"), vec!["b/1"]);
    assert!(store.list("c/").await.expect("list").is_empty());
    store.delete(&key("a/2"), None).await.expect("delete");
    assert_eq!(
        store.list("a/").await.expect("list"),
        vec!["a/1", "a/sub/3"]
    );
}

/// Keys with unicode, path separators, dots, spaces and percent signs are
/// distinct keys and list back exactly.
pub async fn unicode_and_odd_keys_roundtrip(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let keys = [
        "odd/ключ/日本語/🦀",
        "odd/../../etc/passwd",
        "odd/a b%2Fc",
        "odd/a b/c",
        "odd/.",
        "odd/..",
        "odd/{tag}:x",
        "odd/CaseSensitive",
        "odd/casesensitive",
        "odd/trailing/",
    ];
    for (i, key) in keys.iter().enumerate() {
        put(&*store, key, i.to_string().as_bytes(), PutMode::Create).await;
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            value_of(&*store, key).await,
            Some(i.to_string().into_bytes()),
            "key {key:?}"
        );
    }
    let mut expected: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    expected.sort();
    assert_eq!(store.list("odd/").await.expect("list"), expected);
    let long = format!("odd/{}", "x".repeat(crate::backend::MAX_KEY_BYTES - 4));
    put(&*store, &long, b"long", PutMode::Create).await;
    assert_eq!(
        value_of(&*store, &long).await.as_deref(),
        Some(&b"long"[..])
    );
}

/// Values of 1 MiB (or the backend's limit, if smaller) round-trip byte for byte.
pub async fn large_values(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let size = store.max_value_bytes().min(1024 * 1024);
    let value: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    put(&*store, "big", &value, PutMode::Create).await;
    assert!(
        value_of(&*store, "big").await == Some(value),
        "1 MiB value changed"
    );
}

/// A value one byte over the backend's limit is `TooLarge` and writes nothing.
pub async fn oversized_value_is_too_large(f: &dyn KvFixture) {
    let store = f.open_kv().await;
    let limit = store.max_value_bytes();
    let err = store
        .put(
            &key("huge"),
            vec![0u8; limit + 1],
            PutOptions::new(PutMode::Overwrite),
        )
        .await
        .expect_err("an oversized value must be refused");
    assert!(
        matches!(err, Error::TooLarge { limit: l, .. } if l == limit),
        "got {err:?}"
    );
    assert_eq!(value_of(&*store, "huge").await, None);
}

/// Everything acknowledged is there after the store is dropped and reopened,
/// versions included.
pub async fn reopen_keeps_acknowledged_writes(f: &dyn KvFixture) {
    let mut versions = Vec::new();
    {
        let store = f.open_kv().await;
        for i in 0..50u32 {
            versions.push(
                put(
                    &*store,
                    &format!("durable/{i}"),
                    &i.to_be_bytes(),
                    PutMode::Create,
                )
                .await,
            );
        }
        store.delete(&key("durable/7"), None).await.expect("delete");
    }
    let store = f.open_kv().await;
    for i in 0..50u32 {
        let entry = store.get(&key(format!("durable/{i}"))).await.expect("get");
        if i == 7 {
            assert!(entry.is_none(), "deleted key came back after reopen");
            continue;
        }
        let entry = entry.unwrap_or_else(|| panic!("durable/{i} lost on reopen"));
        assert_eq!(entry.value, i.to_be_bytes());
        assert_eq!(entry.version, versions[i as usize]);
    }
    let v = put(&*store, "durable/0", b"again", PutMode::Update(versions[0])).await;
    assert!(v > versions[0]);
}
