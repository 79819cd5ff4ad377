//! The command line on a sealed store: `show`, `ls` and `check` show sealed
//! records as sealed without a keyring (never as damage, never their
//! secrets), open them with `--keyring`, and `check` reports records under
//! keys the ring no longer holds; `rekey` re-seals everything under the
//! active key, resumes after a key, and refuses bad keyring sources.

#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, path::Path};

use crate::support::{PLANTED_ACCESS, PLANTED_REFRESH, cli, cli_expect, stderr, stdout};
use mcp_persist_core::{
    ClientRegistration, CredentialKey, Credentials, Secret, ServerSession, SessionId, Stores,
    declare,
    seal::{Keyring, SealKey},
};
use mcp_persist_store_sqlite::SqliteStore;
use serde_json::Value;

const CREDENTIALS: usize = 12;

fn write_keys(path: &Path, texts: &[&Secret]) {
    let text: Vec<&str> = texts.iter().map(|t| t.expose_secret()).collect();
    std::fs::write(path, text.join("\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn resource(i: usize) -> String {
    format!("https://mcp{i:02}.example.com/mcp")
}

/// A store with credentials (sealed by default) and a server session
/// (plain by default), sealed with `key`.
async fn fill(db: &Path, key: SealKey) {
    let sqlite = SqliteStore::open(db).await.unwrap();
    let stores = Stores::new(sqlite.clone()).encrypted(Keyring::new(key));
    for i in 0..CREDENTIALS {
        stores
            .credentials()
            .save(
                &Credentials::new(
                    CredentialKey::new("https://as.example.com", &resource(i)).unwrap(),
                    Secret::new(format!("{PLANTED_ACCESS}-{i}")),
                    ClientRegistration::new("client-1"),
                )
                .with_refresh_token(Secret::new(format!("{PLANTED_REFRESH}-{i}"))),
            )
            .await
            .unwrap();
    }
    stores
        .sessions(std::time::Duration::from_secs(3600))
        .create(&ServerSession::new(
            SessionId::new("plain-session").unwrap(),
            serde_json::json!({}),
            Some("alice".into()),
        ))
        .await
        .unwrap();
    drop(stores);
    sqlite.close().await.unwrap();
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_store_is_shown_checked_and_rekeyed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let store = format!("sqlite:{}", db.display());
    let (k1, t1) = SealKey::generate().unwrap();
    let (k2, t2) = SealKey::generate().unwrap();
    let (id1, id2) = (k1.id().to_string(), k2.id().to_string());
    fill(&db, k1).await;
    let old_ring = dir.path().join("old.keys");
    let both = dir.path().join("both.keys");
    let new_only = dir.path().join("new.keys");
    write_keys(&old_ring, &[&t1]);
    write_keys(&both, &[&t2, &t1]);
    write_keys(&new_only, &[&t2]);
    let keyring = |path: &Path| format!("file:{}", path.display());
    let cred = declare::CREDENTIALS
        .key(&["https://as.example.com", &resource(0)])
        .to_string();

    // Without a keyring: shown as sealed, with the key it needs.
    let shown = cli_expect(&["show", &store, &cred], 0);
    assert!(
        shown.contains(&format!("sealed:  with key {id1}")),
        "{shown}"
    );
    assert!(shown.contains("kind:    credentials"), "{shown}");
    let shown = json_of(&cli_expect(&["--json", "show", &store, &cred], 0));
    assert_eq!(shown["sealed"]["key_id"], id1.as_str());
    let listed = cli_expect(&["ls", &store, "credentials"], 0);
    assert!(
        listed.contains(&resource(3)) && listed.contains("sealed"),
        "{listed}"
    );
    let checked = cli(&["check", &store]);
    assert_eq!(checked.status.code(), Some(0), "{}", stderr(&checked));
    assert!(
        stderr(&checked).contains(&format!("{CREDENTIALS} sealed record(s) not shown")),
        "{}",
        stderr(&checked)
    );
    // The plain session is still listed.
    assert!(cli_expect(&["ls", &store, "sessions"], 0).contains("plain-session"));

    // With the keyring: opened, secrets still redacted.
    let opened = cli_expect(
        &["--keyring", &keyring(&old_ring), "show", &store, &cred],
        0,
    );
    assert!(
        opened.contains("\"access_token\": \"[redacted]\""),
        "{opened}"
    );
    assert!(
        opened.contains(&format!("sealed:  with key {id1}")),
        "{opened}"
    );
    let listed = cli_expect(
        &[
            "--keyring",
            &keyring(&old_ring),
            "ls",
            &store,
            "credentials",
        ],
        0,
    );
    assert!(
        listed.contains("yes"),
        "the refresh token is held: {listed}"
    );

    // A ring without the key the records need: check names key and records.
    let missing = cli(&["--keyring", &keyring(&new_only), "check", &store]);
    assert_eq!(missing.status.code(), Some(1), "{}", stdout(&missing));
    let text = stdout(&missing);
    assert!(
        text.contains(&cred) && text.contains(&format!("sealed with key {id1}")),
        "{text}"
    );
    assert!(text.contains("not in the keyring"), "{text}");

    // Rotation: the new key first, the old kept; rekey everything after the
    // fourth credential, then the rest.
    let fourth = declare::CREDENTIALS
        .key(&["https://as.example.com", &resource(3)])
        .to_string();
    let partial = json_of(&cli_expect(
        &[
            "--json",
            "--keyring",
            &keyring(&both),
            "rekey",
            &store,
            "--start-after",
            &fourth,
        ],
        0,
    ));
    let resealed = |v: &Value| v["backends"][0]["resealed"].as_u64().unwrap();
    assert_eq!(resealed(&partial), (CREDENTIALS - 4) as u64, "{partial}");
    let rest = cli_expect(&["--keyring", &keyring(&both), "rekey", &store], 0);
    assert!(rest.contains("4 re-sealed"), "{rest}");
    assert!(rest.contains("old keys can leave the keyring"), "{rest}");
    let again = json_of(&cli_expect(
        &["--json", "--keyring", &keyring(&both), "rekey", &store],
        0,
    ));
    assert_eq!(resealed(&again), 0, "a second rekey does nothing: {again}");

    // The old key can go: the new key alone reads and checks everything.
    let clean = cli_expect(&["--keyring", &keyring(&new_only), "check", &store], 0);
    assert!(
        clean.contains(&format!("{CREDENTIALS} record(s) under key {id2} (active)")),
        "{clean}"
    );
    let shown = cli_expect(
        &["--keyring", &keyring(&new_only), "show", &store, &cred],
        0,
    );
    assert!(
        shown.contains(&format!("sealed:  with key {id2}")),
        "{shown}"
    );

    // No token and no key text reached any output.
    for output in [&shown, &clean, &rest, &listed, &text] {
        for secret in [
            PLANTED_ACCESS,
            PLANTED_REFRESH,
            t1.expose_secret(),
            t2.expose_secret(),
        ] {
            assert!(!output.contains(secret), "a secret was printed");
        }
    }
    let raw = std::fs::read(&db).unwrap();
    let wal = std::fs::read(dir.path().join("state.db-wal")).unwrap_or_default();
    for bytes in [&raw, &wal] {
        assert!(
            !bytes
                .windows(PLANTED_ACCESS.len())
                .any(|w| w == PLANTED_ACCESS.as_bytes())
        );
    }
}

#[test]
fn rekey_needs_a_keyring_and_bad_sources_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let out = cli(&["rekey", &store]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("rekey needs --keyring"),
        "{}",
        stderr(&out)
    );

    let out = cli(&["--keyring", "vault:x", "show", &store, "k"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("env:VAR"), "{}", stderr(&out));

    let (_, text) = SealKey::generate().unwrap();
    let open = dir.path().join("open.keys");
    std::fs::write(&open, text.expose_secret()).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cli(&[
        "--keyring",
        &format!("file:{}", open.display()),
        "rekey",
        &store,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(text.expose_secret()));
    assert!(
        !dir.path().join("s.db").exists(),
        "nothing was opened or created"
    );

    let out = cli(&["--keyring", "env:MCP_PERSIST_NO_SUCH_KEYS", "check", &store]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("MCP_PERSIST_NO_SUCH_KEYS is not set"),
        "{}",
        stderr(&out)
    );
}
