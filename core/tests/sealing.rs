//! Sealing on the memory backend: the sealing suite (but its child
//! processes, which need a store shared between processes), and what the
//! bundle, the key sources and `Debug` promise.

#![allow(clippy::unwrap_used)] // helpers of tests, outside #[test] functions

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, OnceLock},
};

use mcp_persist_core::{
    KvStore, LogStore, MemoryStore, Stores,
    conformance::crash::Place,
    declare,
    seal::{EnvKeys, FileKeys, KeySource, Keyring, SealKey, Sealing},
};

/// One memory store per place, so that reopening a place finds its store.
fn store_at(place: &Place) -> MemoryStore {
    static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
    STORES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap()
        .entry(place.name.clone())
        .or_default()
        .clone()
}

/// Every value and log record the memory store holds, as stored.
async fn raw_bytes(store: MemoryStore) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut logs = BTreeSet::new();
    for key in store.list("").await.unwrap() {
        if let Some(entry) = store.get(&key).await.unwrap() {
            raw.extend_from_slice(&entry.value);
        }
        if let Some((log, _)) = declare::of_key(&key).and_then(|d| d.log_of(&key)) {
            logs.insert(log);
        }
    }
    for sample in mcp_persist_core::conformance::samples::all() {
        if sample.declaration.space == declare::Space::Log {
            logs.insert(sample.key);
        }
    }
    for log in logs {
        for record in store.read_after(&log, 0, usize::MAX).await.unwrap() {
            raw.extend_from_slice(&record.data);
        }
    }
    raw
}

mcp_persist_core::seal_conformance!(
    in_process,
    open: |place| async move { Ok::<_, mcp_persist_core::Error>(store_at(&place)) },
    raw: |place| async move { raw_bytes(store_at(&place)).await },
);

#[tokio::test]
async fn routes_chosen_after_encrypted_are_sealed_too_and_sealing_twice_seals_once() {
    let (key, _) = SealKey::generate().unwrap();
    let main = MemoryStore::new();
    let vault = MemoryStore::new();
    let stores = Stores::new(main.clone())
        .encrypted(Keyring::new(key))
        .with_credentials(Arc::new(vault.clone()));
    let (again, _) = SealKey::generate().unwrap();
    let stores = stores.encrypted(Keyring::new(again));
    let ring = stores.shared_keys().get_or_create("k").await.unwrap();
    let keys = vault.list("").await.unwrap();
    let raw = vault.get(&keys[0]).await.unwrap().unwrap().value;
    assert!(!String::from_utf8_lossy(&raw).contains(ring.active.secret.expose_secret()));
    // Sealed once, with the last keyring: it opens with that ring alone.
    let active = stores.sealing().unwrap().keyring();
    assert!(active.open(&keys[0], &raw).is_ok());
    assert!(main.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn debug_of_keys_rings_and_sealing_shows_ids_only() {
    let (key, text) = SealKey::generate().unwrap();
    let id = key.id();
    let sealing = Sealing::new(Keyring::new(key));
    let stores = Stores::new(MemoryStore::new()).encrypted(sealing.clone());
    let shown = format!("{sealing:?} {:?} {stores:?}", sealing.keyring());
    assert!(shown.contains(&id.to_string()), "{shown}");
    assert!(!shown.contains(text.expose_secret()), "{shown}");
}

/// The child of the environment test: loads the ring from the variable
/// its parent set and prints the key ids (it returns at once when the
/// harness runs it).
#[tokio::test]
async fn env_keys_child() {
    let Ok(var) = std::env::var("MCP_PERSIST_TEST_ENV_KEYS_VAR") else {
        return;
    };
    match EnvKeys::new(&var).load().await {
        Ok(ring) => println!(
            "IDS {:?}",
            ring.ids()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ),
        Err(e) => println!("ERROR {e}"),
    }
}

fn load_in_child(value: Option<&str>) -> String {
    let var = "MCP_PERSIST_TEST_RING";
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "env_keys_child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("MCP_PERSIST_TEST_ENV_KEYS_VAR", var)
    .env_remove(var);
    if let Some(value) = value {
        cmd.env(var, value);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout
        .lines()
        .find_map(|l| {
            l.find("IDS ")
                .or_else(|| l.find("ERROR "))
                .map(|at| l[at..].to_owned())
        })
        .unwrap_or_else(|| panic!("no answer from the child: {stdout}"))
}

#[test]
fn an_environment_variable_holds_a_ring_active_key_first() {
    let (k1, t1) = SealKey::generate().unwrap();
    let (k2, t2) = SealKey::generate().unwrap();
    let answer = load_in_child(Some(&format!(
        "{}, {}\n",
        t2.expose_secret(),
        t1.expose_secret()
    )));
    assert_eq!(answer, format!("IDS [\"{}\", \"{}\"]", k2.id(), k1.id()));
    let missing = load_in_child(None);
    assert!(
        missing.contains("MCP_PERSIST_TEST_RING is not set"),
        "{missing}"
    );
    let bad = load_in_child(Some("definitely not a key"));
    assert!(
        bad.starts_with("ERROR") && bad.contains("key 1 of environment variable"),
        "{bad}"
    );
    assert!(!bad.contains("definitely"), "{bad}");
}

#[tokio::test]
async fn reload_puts_a_rotation_made_in_the_key_file_in_use_and_keeps_the_ring_on_errors() {
    use std::os::unix::fs::PermissionsExt;
    let (k1, t1) = SealKey::generate().unwrap();
    let (k2, t2) = SealKey::generate().unwrap();
    let (place, _guard) = Place::fresh();
    let path = place.dir.join("keys");
    let write = |text: String| {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    write(format!("{}\n", t1.expose_secret()));
    let source = FileKeys::new(&path);
    let sealing = Sealing::new(source.load().await.unwrap());
    let backend = MemoryStore::new();
    let stores = Stores::new(backend.clone()).encrypted(sealing.clone());
    let before = stores.shared_keys().get_or_create("k").await.unwrap();

    // The operator rotates in the file; the running process reloads.
    write(format!(
        "# rotated\n{}\n{}\n",
        t2.expose_secret(),
        t1.expose_secret()
    ));
    assert_eq!(sealing.reload(&source).await.unwrap(), k2.id());
    assert_eq!(sealing.keyring().ids(), vec![k2.id(), k1.id()]);
    // Old records still open, new ones seal with the new key.
    let after = stores.shared_keys().get_or_create("k").await.unwrap();
    assert_eq!(after.active.secret, before.active.secret);
    stores.shared_keys().rotate("k").await.unwrap();
    let key = backend.list("server/key/").await.unwrap().remove(0);
    let raw = backend.get(&key).await.unwrap().unwrap().value;
    assert_eq!(mcp_persist_core::seal::info(&raw).unwrap().key_id, k2.id());

    write("garbage".into());
    let err = sealing.reload(&source).await.unwrap_err().to_string();
    assert!(err.contains("key file"), "{err}");
    assert_eq!(
        sealing.keyring().active(),
        k2.id(),
        "a failed reload keeps the ring"
    );
}

#[tokio::test]
async fn reload_every_picks_up_a_rotation_without_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let (k1, t1) = SealKey::generate().unwrap();
    let (k2, t2) = SealKey::generate().unwrap();
    let (place, _guard) = Place::fresh();
    let path = place.dir.join("keys");
    std::fs::write(&path, t1.expose_secret()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let source = Arc::new(FileKeys::new(&path));
    let sealing = Sealing::new(source.load().await.unwrap());
    let task = sealing.reload_every(source, std::time::Duration::from_millis(20));
    std::fs::write(
        &path,
        format!("{}\n{}", t2.expose_secret(), t1.expose_secret()),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while sealing.keyring().active() != k2.id() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotation never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(sealing.keyring().ids(), vec![k2.id(), k1.id()]);
    task.abort();
}
