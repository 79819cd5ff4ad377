use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::{Stored, read, write};
use crate::retry::retry_cas;
use crate::{
    Error, Key, KvStore, PutMode, Result, Secret, declare,
    records::Record,
    types::{Timestamp, check_visible_ascii, hex},
};

/// How many rotations are tried before a lost race is reported.
const ATTEMPTS: usize = 8;
/// The longest key name.
const MAX_NAME_BYTES: usize = 128;

/// One secret key of a [`KeyRing`], with its id.
#[derive(Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SharedKey {
    /// A short random id, to name the key in what it signs (16 hex digits).
    pub id: String,
    /// 32 random bytes as 64 hex digits.
    pub secret: Secret,
    /// When it was created.
    pub created_at: Timestamp,
}

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKey")
            .field("id", &self.id)
            .field("secret", &self.secret)
            .field("created_at", &self.created_at)
            .finish()
    }
}

/// The keys of one name: the active one signs, the previous one (after a
/// rotation) is still accepted, so that what it signed stays valid while it
/// drains.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeyRing {
    /// The key that signs.
    pub active: SharedKey,
    /// The key active before the last rotation, if any.
    pub previous: Option<SharedKey>,
}

impl KeyRing {
    /// Every key to accept: the active one first.
    pub fn keys(&self) -> impl Iterator<Item = &SharedKey> {
        std::iter::once(&self.active).chain(self.previous.as_ref())
    }
}

impl Record for KeyRing {
    const DECLARATION: &'static crate::declare::Declaration = &crate::declare::SHARED_KEY_RING;
}

/// Secret keys every instance of a server fleet must share, such as the key
/// that protects SEP-2322 `requestState` (an instance must accept state
/// another instance signed).
///
/// The first instance that asks for a name creates its key (32 bytes from
/// the operating system) with a compare-and-swap `Create`; every other
/// instance, racing or later, reads that same key. Keys never expire and are
/// never printed. They are routed with credentials (see
/// [`Stores::with_credentials`](crate::Stores::with_credentials)), so a
/// secrets manager can hold them.
///
/// | key | record |
/// |---|---|
/// | `server/key/<name>` | [`KeyRing`] |
#[derive(Clone, Debug)]
pub struct SharedKeyStore {
    kv: Arc<dyn KvStore>,
}

fn key_of(name: &str) -> Result<Key> {
    check_visible_ascii("key name", name, MAX_NAME_BYTES)?;
    declare::SHARED_KEY_RING.try_key(&[name])
}

fn new_key() -> Result<SharedKey> {
    let mut bytes = [0u8; 40];
    getrandom::fill(&mut bytes).map_err(|e| Error::backend("os random", e.to_string()))?;
    Ok(SharedKey {
        id: hex(&bytes[..8]),
        secret: Secret::new(hex(&bytes[8..])),
        created_at: Timestamp::now(),
    })
}

impl SharedKeyStore {
    pub(crate) fn new(kv: Arc<dyn KvStore>) -> Self {
        SharedKeyStore { kv }
    }

    /// The key ring named `name`, created by whichever instance asks first.
    ///
    /// A stored ring that cannot be read is [`Error::Corrupt`] and is left
    /// as it is (replacing it would invalidate what its keys signed); delete
    /// it to start over.
    pub async fn get_or_create(&self, name: &str) -> Result<KeyRing> {
        let key = &key_of(name)?;
        // Losing the race to create it means another instance did: the next
        // attempt reads theirs.
        retry_cas(key, ATTEMPTS, move || async move {
            if let Some(Stored { record, .. }) = read::<KeyRing>(&*self.kv, key).await? {
                return Ok(record);
            }
            let ring = KeyRing {
                active: new_key()?,
                previous: None,
            };
            write(&*self.kv, key, &ring, PutMode::Create, None).await?;
            info!(name, id = %ring.active.id, "created a shared key");
            Ok(ring)
        })
        .await
    }

    /// Makes a new key the active one and keeps the active one as previous
    /// (the one before that is dropped). Creates the ring when there is none.
    /// Instances keep signing with the key they loaded until they load the
    /// ring again; both keys are accepted meanwhile.
    pub async fn rotate(&self, name: &str) -> Result<KeyRing> {
        let key = &key_of(name)?;
        retry_cas(key, ATTEMPTS, move || async move {
            let (mode, previous) = match read::<KeyRing>(&*self.kv, key).await? {
                Some(Stored { record, version }) => (PutMode::Update(version), Some(record.active)),
                None => (PutMode::Create, None),
            };
            let ring = KeyRing {
                active: new_key()?,
                previous,
            };
            write(&*self.kv, key, &ring, mode, None).await?;
            info!(name, id = %ring.active.id, "rotated a shared key");
            Ok(ring)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, PutOptions};

    fn store() -> (SharedKeyStore, Arc<MemoryStore>) {
        let kv = Arc::new(MemoryStore::new());
        (SharedKeyStore::new(kv.clone()), kv)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_instances_share_one_key() {
        let (keys, kv) = store();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                keys.get_or_create("request-state").await
            }));
        }
        let mut rings = Vec::new();
        for task in tasks {
            rings.push(task.await.expect("task").expect("key"));
        }
        let first = &rings[0].active;
        assert_eq!(first.secret.expose_secret().len(), 64);
        assert_eq!(first.id.len(), 16);
        for ring in &rings {
            assert_eq!(ring.active.id, first.id);
            assert_eq!(
                ring.active.secret.expose_secret(),
                first.secret.expose_secret()
            );
        }
        assert_eq!(
            KvStore::list(&*kv, crate::declare::SHARED_KEY_RING.prefix)
                .await
                .expect("list"),
            vec![crate::declare::SHARED_KEY_RING.key(&["request-state"])]
        );
        // Another name is another key.
        let other = keys.get_or_create("other").await.expect("other");
        assert_ne!(
            other.active.secret.expose_secret(),
            first.secret.expose_secret()
        );
    }

    #[tokio::test]
    async fn rotation_keeps_one_previous_key() {
        let (keys, _) = store();
        let first = keys.get_or_create("k").await.expect("create");
        let second = keys.rotate("k").await.expect("rotate");
        assert_ne!(second.active.id, first.active.id);
        assert_eq!(
            second.previous.as_ref().map(|k| k.id.as_str()),
            Some(first.active.id.as_str())
        );
        let third = keys.rotate("k").await.expect("rotate again");
        assert_eq!(
            third.previous.as_ref().map(|k| k.id.as_str()),
            Some(second.active.id.as_str())
        );
        assert_eq!(third.keys().count(), 2, "the oldest key is dropped");
        let read = keys.get_or_create("k").await.expect("read");
        assert_eq!(read.active.id, third.active.id);
    }

    #[tokio::test]
    async fn keys_never_print_and_bad_input_is_typed() {
        let (keys, kv) = store();
        let ring = keys.get_or_create("k").await.expect("create");
        let printed = format!("{ring:?} {keys:?}");
        assert!(
            !printed.contains(ring.active.secret.expose_secret()),
            "{printed}"
        );
        assert!(matches!(
            keys.get_or_create("").await,
            Err(Error::InvalidInput { .. })
        ));
        // A damaged ring is reported, never replaced.
        kv.put(
            &crate::declare::SHARED_KEY_RING.key(&["broken"]),
            b"not json".to_vec(),
            PutOptions::new(PutMode::Create),
        )
        .await
        .expect("plant");
        assert!(matches!(
            keys.get_or_create("broken").await,
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            keys.rotate("broken").await,
            Err(Error::Corrupt { .. })
        ));
        let kept = KvStore::get(&*kv, &crate::declare::SHARED_KEY_RING.key(&["broken"]))
            .await
            .expect("get");
        assert_eq!(kept.expect("still there").value, b"not json");
    }
}
