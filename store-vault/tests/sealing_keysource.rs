//! The sealing keyring kept in a Secrets Manager secret (on moto): loaded,
//! rotated by writing a new version, reloaded by a running process, and
//! typed errors that never show key text.

#![allow(clippy::unwrap_used)] // helpers of tests, outside #[test] functions

mod common;

use std::sync::Arc;

use mcp_persist_core::{
    Error, KvStore, MemoryStore, Stores,
    seal::{KeySource, SealKey, Sealing},
};
use mcp_persist_store_vault::SecretsManagerKeys;

#[tokio::test]
async fn a_secret_holds_the_ring_and_a_new_version_rotates_it() {
    let Some(url) = common::moto_url() else {
        return;
    };
    let client = common::client(&url);
    let id = format!("{}keys", common::unique_prefix("sealing"));
    let (k1, t1) = SealKey::generate().unwrap();
    let (k2, t2) = SealKey::generate().unwrap();

    let source = SecretsManagerKeys::new(client.clone(), &id);
    let missing = source.load().await.unwrap_err();
    assert!(
        matches!(&missing, Error::NotFound { detail: Some(d), .. } if d.contains(&id)),
        "{missing:?}"
    );

    client
        .create_secret()
        .name(&id)
        .secret_string(format!("{}\n", t1.expose_secret()))
        .send()
        .await
        .unwrap();
    let sealing = Sealing::new(source.load().await.unwrap());
    assert_eq!(sealing.keyring().ids(), vec![k1.id()]);
    let backend = MemoryStore::new();
    let stores = Stores::new(backend.clone()).encrypted(sealing.clone());
    let ring = stores
        .shared_keys()
        .get_or_create("request-state")
        .await
        .unwrap();

    // The operator writes a new version: the new key first, the old kept.
    client
        .put_secret_value()
        .secret_id(&id)
        .secret_string(format!("{}\n{}\n", t2.expose_secret(), t1.expose_secret()))
        .send()
        .await
        .unwrap();
    assert_eq!(sealing.reload(&source).await.unwrap(), k2.id());
    assert_eq!(sealing.keyring().ids(), vec![k2.id(), k1.id()]);
    // What the old key sealed still opens; what is written now uses the new one.
    let again = stores
        .shared_keys()
        .get_or_create("request-state")
        .await
        .unwrap();
    assert_eq!(again.active.secret, ring.active.secret);
    stores.shared_keys().rotate("request-state").await.unwrap();
    let key = backend
        .list(mcp_persist_core::declare::SHARED_KEY_RING.prefix)
        .await
        .unwrap()
        .remove(0);
    let raw = backend.get(&key).await.unwrap().unwrap().value;
    assert_eq!(mcp_persist_core::seal::info(&raw).unwrap().key_id, k2.id());

    // A binary value holding the same text works too.
    client
        .put_secret_value()
        .secret_id(&id)
        .secret_binary(aws_smithy_blob(t2.expose_secret()))
        .send()
        .await
        .unwrap();
    assert_eq!(source.load().await.unwrap().ids(), vec![k2.id()]);

    // A damaged version: a typed error without the text, the ring kept.
    let damaged = format!("{}-but-longer", t2.expose_secret());
    client
        .put_secret_value()
        .secret_id(&id)
        .secret_string(&damaged)
        .send()
        .await
        .unwrap();
    let err = sealing.reload(&source).await.unwrap_err();
    let shown = format!("{err} {err:?} {source:?}");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(shown.contains(&id), "{shown}");
    assert!(!shown.contains(t2.expose_secret()), "{shown}");
    assert_eq!(sealing.keyring().active(), k2.id());
    // A source is shared with the background reload as an `Arc`.
    let shared: Arc<dyn KeySource> = Arc::new(source);
    assert!(shared.describe().contains(&id));
}

fn aws_smithy_blob(
    text: &str,
) -> mcp_persist_store_vault::aws_sdk_secretsmanager::primitives::Blob {
    mcp_persist_store_vault::aws_sdk_secretsmanager::primitives::Blob::new(text.as_bytes())
}
