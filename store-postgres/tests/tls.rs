//! TLS through rustls (feature `rustls`): `sslmode=require` connects over
//! TLS to a server whose certificate the given rustls configuration trusts,
//! and refuses one it does not trust, saying what to do.

#![cfg(feature = "rustls")]

mod common;

use std::{sync::Arc, time::Duration};

use mcp_persist_core::{Error, Key, KvStore, LogStore, PutOptions};
use mcp_persist_store_postgres::{PostgresStore, rustls};

fn trusting(pem: &std::path::Path) -> rustls::ClientConfig {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pem).expect("read the certificate") {
        roots
            .add(cert.expect("a certificate"))
            .expect("add the root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_speaks_tls() {
    let server = common::OwnServer::start_tls();
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=require&schema=tls",
        server.port
    );
    let store = PostgresStore::builder(&url)
        .tls_config(trusting(&server.certificate()))
        .connect()
        .await
        .expect("connect over TLS");
    let key = Key::new("k").expect("key");
    store
        .put(&key, b"v".to_vec(), PutOptions::default())
        .await
        .expect("put");
    let log = Key::new("l").expect("key");
    let first = store
        .append(&log, vec![b"a".to_vec()], None)
        .await
        .expect("append");
    // The listening connection speaks TLS too.
    let waiting = {
        let store = store.clone();
        let log = log.clone();
        tokio::spawn(async move {
            store
                .wait_after(&log, first[0], 10, Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    store
        .append(&log, vec![b"b".to_vec()], None)
        .await
        .expect("append");
    assert_eq!(waiting.await.expect("task").expect("wait").len(), 1);
    assert!(store.is_listening());

    // The server sees TLS connections.
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("admin");
    tokio::spawn(connection);
    let tls_backends: i64 = client
        .query_one("SELECT count(*) FROM pg_stat_ssl WHERE ssl", &[])
        .await
        .expect("query")
        .get(0);
    assert!(tls_backends >= 2, "{tls_backends} TLS connections");

    // A certificate no root vouches for is refused, saying what to do.
    let err = PostgresStore::builder(&url)
        .connect()
        .await
        .expect_err("an untrusted certificate");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("ClientConfig"), "{err}");
}

#[tokio::test]
async fn sslmode_require_against_a_plain_server_fails() {
    let mut url = url::Url::parse(&common::url()).expect("url");
    url.query_pairs_mut().append_pair("sslmode", "require");
    let err = PostgresStore::builder(url.as_str())
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .expect_err("the test server has no TLS");
    let secret = url.password().expect("password").to_owned();
    assert!(!format!("{err} {err:?}").contains(&secret));
}
