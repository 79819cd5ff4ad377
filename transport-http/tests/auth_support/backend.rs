//! Where the auth tests keep their state: everything in one SQLite file, or
//! credentials in AWS Secrets Manager (moto, from `MCP_PERSIST_MOTO_URL`)
//! and everything else in SQLite.
//!
//! Without `MCP_PERSIST_MOTO_URL`, a Secrets Manager test fails under CI
//! and otherwise prints a notice and skips.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use mcp_persist_core::{AuthStore, CredentialKey, Stores};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_store_vault::{
    SecretsManagerStore,
    aws_sdk_secretsmanager::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    },
};

pub const MOTO_URL_VAR: &str = "MCP_PERSIST_MOTO_URL";

/// Where a test keeps its state. `Display` and `parse` carry it to child
/// processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Everything in one SQLite file.
    Sqlite,
    /// Credentials in Secrets Manager at `moto` under `prefix`, everything
    /// else in SQLite.
    VaultSplit { moto: String, prefix: String },
}

/// Whether we run under CI, where a missing service is a failure.
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// A secret-name prefix no other test uses.
fn unique_prefix(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("test/{what}/{:016x}/", hasher.finish())
}

impl Backend {
    /// The split backend on moto under a fresh prefix; `None` (after a
    /// notice) when `MCP_PERSIST_MOTO_URL` is not set outside CI. Under CI a
    /// missing address fails the test.
    pub fn vault_split(what: &str) -> Option<Backend> {
        match std::env::var(MOTO_URL_VAR) {
            Ok(v) if !v.trim().is_empty() => Some(Backend::VaultSplit {
                moto: v.trim().to_owned(),
                prefix: unique_prefix(what),
            }),
            _ => {
                assert!(
                    !under_ci(),
                    "{MOTO_URL_VAR} is not set; under CI the Secrets Manager tests must run (start moto with `cargo xtask test`)"
                );
                eprintln!(
                    "notice: {MOTO_URL_VAR} is not set; skipping (run `cargo xtask test` to start moto)"
                );
                None
            }
        }
    }

    /// Reads what `Display` wrote.
    pub fn parse(text: &str) -> Backend {
        match text.split_once(';') {
            None if text == "sqlite" => Backend::Sqlite,
            Some(("vault-split", rest)) => {
                let (moto, prefix) = rest.split_once(';').expect("moto url and prefix");
                Backend::VaultSplit {
                    moto: moto.to_owned(),
                    prefix: prefix.to_owned(),
                }
            }
            _ => panic!("unknown backend {text:?}"),
        }
    }

    /// The bundle a process opens on start: a new connection every call.
    pub async fn open(&self, db: &Path) -> Stores {
        let sqlite = SqliteStore::open(db).await.expect("open sqlite");
        match self {
            Backend::Sqlite => Stores::new(sqlite),
            Backend::VaultSplit { moto, prefix } => vault(moto, prefix)
                .build_split(sqlite)
                .await
                .expect("build the split stores"),
        }
    }

    /// Checks that the credential under `key` is where this backend keeps
    /// credentials, and nowhere else.
    pub async fn assert_credentials_placed(&self, db: &Path, key: &CredentialKey) {
        let sqlite = SqliteStore::open(db).await.expect("open sqlite");
        let in_sqlite = AuthStore::new(Arc::new(sqlite))
            .load(key)
            .await
            .expect("sqlite readable")
            .is_some();
        match self {
            Backend::Sqlite => assert!(in_sqlite, "credentials in SQLite"),
            Backend::VaultSplit { moto, prefix } => {
                assert!(!in_sqlite, "no credentials in SQLite");
                let store = vault(moto, prefix).build().await.expect("vault store");
                let in_vault = AuthStore::new(Arc::new(store))
                    .load(key)
                    .await
                    .expect("Secrets Manager readable")
                    .is_some();
                assert!(in_vault, "credentials in Secrets Manager");
            }
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Sqlite => f.write_str("sqlite"),
            Backend::VaultSplit { moto, prefix } => write!(f, "vault-split;{moto};{prefix}"),
        }
    }
}

/// A Secrets Manager store builder on moto with fake AWS credentials,
/// without the write rate limit (moto has none).
fn vault(moto: &str, prefix: &str) -> mcp_persist_store_vault::SecretsManagerStoreBuilder {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(moto)
        .build();
    SecretsManagerStore::builder(prefix)
        .client(Client::from_conf(config))
        .max_writes_per_second(None)
}
