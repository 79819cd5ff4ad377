//! Bad input: a wrong password, an unreachable host, a database without
//! rights, a dropped table, a damaged log header, a newer or foreign
//! schema, a value over the limit. Each is a typed error that says what to
//! do, and nothing is written anywhere. And the password never shows.

mod common;

use std::time::Duration;

use mcp_persist_core::{
    Error, Key, KvStore, LogStore, PutOptions,
    registry::{OpenMode, OpenOptions, Opener, StoreUrl},
};
use mcp_persist_store_postgres::{PostgresOpener, PostgresStore};

fn key(text: &str) -> Key {
    Key::new(text).expect("valid key")
}

/// The test URL with another password.
fn with_password(url: &str, password: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("test URL");
    parsed.set_password(Some(password)).expect("set password");
    parsed.to_string()
}

fn with_user(url: &str, user: &str, password: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("test URL");
    parsed.set_username(user).expect("set user");
    parsed.set_password(Some(password)).expect("set password");
    parsed.to_string()
}

/// Every way an error prints, for secret checks.
fn all_text(e: &Error) -> String {
    let mut text = format!("{e}\n{e:?}\n");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    text
}

/// Whether `schema` exists on the test server.
async fn schema_exists(schema: &str) -> bool {
    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .expect("query")
        .get(0)
}

#[tokio::test]
async fn wrong_password_is_a_typed_error_without_the_password() {
    let secret = "Wr0ngSecret-e5a1";
    let schema = common::unique_schema("wrongpw");
    let err = PostgresStore::builder(&with_password(&common::url(), secret))
        .schema(&schema)
        .connect()
        .await
        .expect_err("a wrong password is refused");
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                what: "Postgres login",
                ..
            }
        ),
        "{err:?}"
    );
    let text = all_text(&err);
    assert!(text.contains("password"), "says what to check: {text}");
    assert!(!text.contains(secret), "the password leaked: {text}");
    assert!(!schema_exists(&schema).await, "nothing is created");
}

#[tokio::test]
async fn unreachable_host_is_unavailable() {
    let secret = "Unre4chable-77c0";
    // Port 1 on loopback: nothing listens there.
    let url = format!("postgres://postgres:{secret}@127.0.0.1:1/postgres");
    let started = std::time::Instant::now();
    let err = PostgresStore::builder(&url)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(started.elapsed() < Duration::from_secs(10));
    let text = all_text(&err);
    assert!(text.contains("127.0.0.1:1"), "names the server: {text}");
    assert!(!text.contains(secret), "the password leaked: {text}");
}

#[tokio::test]
async fn missing_database_is_not_found() {
    let mut url = url::Url::parse(&common::url()).expect("url");
    url.set_path("/no_such_database_here");
    let err = PostgresStore::connect(url.as_str())
        .await
        .expect_err("no such database");
    assert!(
        matches!(
            err,
            Error::NotFound {
                what: "Postgres database",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("createdb"), "{err}");
}

#[tokio::test]
async fn database_without_rights_writes_nothing() {
    let role = common::unique_schema("norights");
    let password = "N0Rights-pw";
    common::admin(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD '{password}'; \
         REVOKE CREATE ON DATABASE postgres FROM PUBLIC; REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
    ))
    .await;
    let schema = common::unique_schema("denied");
    let err = PostgresStore::builder(&with_user(&common::url(), &role, password))
        .schema(&schema)
        .connect()
        .await
        .expect_err("no right to create the schema");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = all_text(&err);
    assert!(
        text.contains("GRANT CREATE ON DATABASE"),
        "names the fix: {text}"
    );
    assert!(!text.contains(password), "the password leaked: {text}");
    assert!(!schema_exists(&schema).await, "nothing was created");

    // A store that exists, but whose tables the role may not touch.
    let owned = common::unique_schema("owned");
    drop(common::open(&owned).await);
    let err = PostgresStore::builder(&with_user(&common::url(), &role, password))
        .schema(&owned)
        .connect()
        .await
        .expect_err("no right to read the store");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(all_text(&err).contains("GRANT"), "{err}");
}

#[tokio::test]
async fn dropped_table_is_corrupt_and_never_recreated() {
    let schema = common::unique_schema("dropped");
    let store = common::open(&schema).await;
    store
        .put(&key("k"), b"v".to_vec(), PutOptions::default())
        .await
        .expect("put");
    store
        .append(&key("l"), vec![b"r".to_vec()], None)
        .await
        .expect("append");
    common::admin(&format!(
        "DROP TABLE \"{schema}\".kv; DROP TABLE \"{schema}\".log_records;"
    ))
    .await;

    let err = store
        .put(&key("k"), b"w".to_vec(), PutOptions::default())
        .await
        .expect_err("table gone");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&schema), "names the schema: {err}");
    assert!(
        err.to_string().contains("DROP SCHEMA"),
        "says what to do: {err}"
    );
    let err = store.get(&key("k")).await.expect_err("table gone");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let err = store
        .append(&key("l"), vec![b"s".to_vec()], None)
        .await
        .expect_err("table gone");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let err = store
        .read_after(&key("l"), 0, 10)
        .await
        .expect_err("table gone");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");

    // Opening again refuses too, and recreates nothing.
    let err = PostgresStore::builder(&common::url())
        .schema(&schema)
        .connect()
        .await
        .expect_err("a damaged store is refused");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("kv"), "names the table: {err}");
    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("admin");
    tokio::spawn(connection);
    let gone: bool = client
        .query_one(
            "SELECT to_regclass($1) IS NULL",
            &[&format!("\"{schema}\".kv")],
        )
        .await
        .expect("query")
        .get(0);
    assert!(gone, "the store recreated a dropped table");
}

fn assert_corrupt(err: &Error, name: &str) {
    assert!(
        matches!(err, Error::Corrupt { key, .. } if key == name),
        "want Corrupt naming {name:?}, got {err:?}"
    );
}

/// A log header changed outside the store to a number no append can go on
/// from is `Corrupt` naming that log, for an append and for `next_seq`
/// alike: never a number that could repeat one. Appends to other logs, in
/// the same group commits, go on.
#[tokio::test]
async fn a_damaged_log_header_is_corrupt_for_next_seq_and_append_alike() {
    let schema = common::unique_schema("header");
    let store = common::open(&schema).await;
    for name in ["full", "negative", "other"] {
        store
            .append(&key(name), vec![b"a".to_vec()], None)
            .await
            .expect("append");
    }
    common::admin(&format!(
        "UPDATE \"{schema}\".logs SET head = {} WHERE name = 'full'; \
         UPDATE \"{schema}\".logs SET head = -5 WHERE name = 'negative';",
        i64::MAX
    ))
    .await;
    for _ in 0..2 {
        let err = store
            .next_seq(&key("full"))
            .await
            .expect_err("no number is left");
        assert_corrupt(&err, "full");
        assert!(err.to_string().contains("changed outside"), "{err}");
        let err = store
            .append(&key("full"), vec![b"b".to_vec()], None)
            .await
            .expect_err("no number is left");
        assert_corrupt(&err, "full");
    }
    // Asked twice, the same: asking writes nothing.
    for _ in 0..2 {
        let err = store
            .next_seq(&key("negative"))
            .await
            .expect_err("a negative last number");
        assert_corrupt(&err, "negative");
    }
    // Refused before anything is written, the second time as the first:
    // the header still reads -5 (an append below zero would have moved it).
    for _ in 0..2 {
        let err = store
            .append(&key("negative"), vec![b"b".to_vec()], None)
            .await
            .expect_err("a negative last number");
        assert_corrupt(&err, "negative");
        assert!(err.to_string().contains("-5"), "{err}");
    }
    let err = store
        .next_seq(&key("negative"))
        .await
        .expect_err("still damaged");
    assert!(err.to_string().contains("-5"), "the header moved: {err}");

    // Concurrent appends to the damaged log and another one: whether or not
    // they share a transaction, each fails or succeeds on its own log.
    let mut calls = Vec::new();
    for i in 0..16u8 {
        let store = store.clone();
        let name = if i % 2 == 0 { "full" } else { "other" };
        calls.push(tokio::spawn(async move {
            (name, store.append(&key(name), vec![vec![i]], None).await)
        }));
    }
    let mut other = Vec::new();
    for call in calls {
        match call.await.expect("task") {
            ("full", result) => assert_corrupt(&result.expect_err("damaged"), "full"),
            (_, result) => other.extend(result.expect("an undamaged log appends")),
        }
    }
    other.sort_unstable();
    assert_eq!(other, (2..=9).collect::<Vec<u64>>());
    assert_eq!(
        store.next_seq(&key("other")).await.expect("next_seq"),
        Some(10)
    );
    // The damaged log's record still reads.
    let read = store.read_after(&key("full"), 0, 10).await.expect("read");
    assert_eq!(read.len(), 1);
}

#[tokio::test]
async fn newer_schema_is_refused_untouched() {
    let schema = common::unique_schema("newer");
    drop(common::open(&schema).await);
    common::admin(&format!(
        "UPDATE \"{schema}\".meta SET value = 99 WHERE name = 'schema_version'"
    ))
    .await;
    let err = PostgresStore::builder(&common::url())
        .schema(&schema)
        .connect()
        .await
        .expect_err("newer schema");
    assert!(
        matches!(
            err,
            Error::NewerSchema {
                found: 99,
                supported: mcp_persist_store_postgres::SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    // Untouched: still 99.
    let err = PostgresStore::builder(&common::url())
        .schema(&schema)
        .connect()
        .await
        .expect_err("still newer");
    assert!(
        matches!(err, Error::NewerSchema { found: 99, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn foreign_schema_is_refused() {
    let schema = common::unique_schema("foreign");
    common::admin(&format!(
        "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".theirs (x int);"
    ))
    .await;
    let err = PostgresStore::builder(&common::url())
        .schema(&schema)
        .connect()
        .await
        .expect_err("another application's schema");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(
        err.to_string().contains("schema="),
        "says what to do: {err}"
    );
}

#[tokio::test]
async fn bad_schema_name_is_invalid() {
    for bad in ["", "Caps", "with-dash", "1digit", "pg_x", &"x".repeat(49)] {
        let err = PostgresStore::builder(&common::url())
            .schema(bad)
            .connect()
            .await
            .expect_err("bad name");
        assert!(
            matches!(err, Error::InvalidInput { .. }),
            "{bad:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn oversized_values_are_too_large_and_write_nothing() {
    let store = common::open(&common::unique_schema("large")).await;
    let big = vec![7u8; 16 * 1024 * 1024 + 1];
    let err = store
        .put(&key("big"), big.clone(), PutOptions::default())
        .await
        .expect_err("over the limit");
    assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");
    assert!(store.get(&key("big")).await.expect("get").is_none());
    let err = store
        .append(&key("log"), vec![b"ok".to_vec(), big], None)
        .await
        .expect_err("over the limit");
    assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");
    assert!(
        store
            .read_after(&key("log"), 0, 10)
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test]
async fn existing_mode_creates_nothing() {
    let schema = common::unique_schema("absent");
    let err = PostgresStore::builder(&common::url())
        .schema(&schema)
        .open_mode(OpenMode::Existing)
        .connect()
        .await
        .expect_err("no store there");
    assert!(
        matches!(err, Error::NotFound { what: "store", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a store"), "{err}");
    assert!(!schema_exists(&schema).await);

    // Through the opener, with `?schema=`, both schemes.
    let mut url = url::Url::parse(&common::url()).expect("url");
    url.query_pairs_mut().append_pair("schema", &schema);
    let err = PostgresOpener
        .open(
            &StoreUrl::parse(url.as_str()).expect("url"),
            OpenOptions::existing(),
        )
        .await
        .expect_err("no store there");
    assert!(
        matches!(err, Error::NotFound { what: "store", .. }),
        "{err:?}"
    );
    assert!(!schema_exists(&schema).await);
    let opened = PostgresOpener
        .open(
            &StoreUrl::parse(url.as_str()).expect("url"),
            OpenOptions::default(),
        )
        .await
        .expect("created");
    assert_eq!(opened.kv.backend_name(), "postgres");
    assert!(schema_exists(&schema).await);
    let secret = url.password().expect("test URL has a password").to_owned();
    assert!(
        !opened.label.contains(&secret),
        "label leaks: {}",
        opened.label
    );
    assert!(!format!("{opened:?}").contains(&secret));
    let mut other = url.clone();
    other.set_scheme("postgresql").expect("scheme");
    let again = PostgresOpener
        .open(
            &StoreUrl::parse(other.as_str()).expect("url"),
            OpenOptions::existing(),
        )
        .await
        .expect("now it exists");
    assert_eq!(again.kv.backend_name(), "postgres");
}

#[tokio::test]
async fn the_password_never_prints() {
    let url = common::url();
    let secret = url::Url::parse(&url)
        .expect("url")
        .password()
        .expect("the test URL has a password")
        .to_owned();
    let store = common::open(&common::unique_schema("secret")).await;
    assert!(!format!("{store:?}").contains(&secret));
    let builder = PostgresStore::builder(&url);
    assert!(!format!("{builder:?}").contains(&secret), "{builder:?}");
    // Errors of every stage: a bad option, a bad schema, TLS refused.
    for bad in [
        format!("{url}?nosuchoption=1"),
        format!("{url}?schema=Bad-Name"),
        format!("{url}?sslmode=require"),
        url.replace("postgres://", "postgres:/"),
    ] {
        let err = PostgresStore::builder(&bad)
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect_err("refused");
        let text = all_text(&err);
        assert!(!text.contains(&secret), "the password leaked: {text}");
    }
}

/// A store made by the previous schema version is migrated on open (its
/// append function replaced, its version raised), with its records kept;
/// a damaged header is then refused with nothing written.
#[tokio::test]
async fn a_version_1_store_is_migrated_on_open() {
    let schema = common::unique_schema("v1");
    let store = common::open(&schema).await;
    store
        .append(&key("kept"), vec![b"a".to_vec()], None)
        .await
        .expect("append");
    drop(store);
    // What version 1 left: no guard in the append function (dropped here,
    // so only the migration can bring it back) and version 1 in `meta`.
    common::admin(&format!(
        "DROP FUNCTION \"{schema}\".append(text[], int[], bytea[], bigint[], boolean); \
         UPDATE \"{schema}\".meta SET value = 1 WHERE name = 'schema_version'; \
         UPDATE \"{schema}\".logs SET head = -1 WHERE name = 'kept';"
    ))
    .await;
    for _ in 0..2 {
        let store = common::open(&schema).await;
        let err = store
            .append(&key("kept"), vec![b"b".to_vec()], None)
            .await
            .expect_err("a negative last number");
        assert_corrupt(&err, "kept");
        store
            .append(&key("fresh"), vec![b"c".to_vec()], None)
            .await
            .expect("the migrated function appends");
    }
    common::admin(&format!(
        "DO $$ BEGIN IF (SELECT value FROM \"{schema}\".meta WHERE name = 'schema_version') \
         <> {} THEN RAISE EXCEPTION 'not migrated'; END IF; END $$;",
        mcp_persist_store_postgres::SCHEMA_VERSION
    ))
    .await;
}

/// `OpenMode::ReadOnly` (what the command line's `ls`, `show`, `stats` and
/// `check` use) creates nothing where there is no store, and migrates
/// nothing where there is an older one: a missing schema is `NotFound`, a
/// version 1 store `Unsupported`, both left exactly as they were, twice.
#[tokio::test]
async fn read_only_mode_creates_and_migrates_nothing() {
    let absent = common::unique_schema("ro_absent");
    let older = common::unique_schema("ro_older");
    drop(common::open(&older).await);
    common::admin(&format!(
        "DROP FUNCTION \"{older}\".append(text[], int[], bytea[], bigint[], boolean); \
         UPDATE \"{older}\".meta SET value = 1 WHERE name = 'schema_version';"
    ))
    .await;
    let read_only = |schema: &str| {
        PostgresStore::builder(&common::url())
            .schema(schema)
            .open_mode(OpenMode::ReadOnly)
            .connect()
    };
    for _ in 0..2 {
        let err = read_only(&absent).await.expect_err("no store there");
        assert!(
            matches!(err, Error::NotFound { what: "store", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("nothing was created"), "{err}");
        assert!(!schema_exists(&absent).await);

        let err = read_only(&older).await.expect_err("an older store");
        assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
        common::admin(&format!(
            "DO $$ BEGIN \
               IF (SELECT value FROM \"{older}\".meta WHERE name = 'schema_version') <> 1 \
               THEN RAISE EXCEPTION 'migrated by a read-only open'; END IF; \
               IF to_regprocedure('\"{older}\".append(text[], int[], bytea[], bigint[], boolean)') \
                  IS NOT NULL \
               THEN RAISE EXCEPTION 'the append function came back'; END IF; \
             END $$;"
        ))
        .await;
    }
}
