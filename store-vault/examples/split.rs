//! Credentials in AWS Secrets Manager, everything else in SQLite, in one
//! builder call.
//!
//! Against a local moto (what `cargo xtask test` starts):
//!
//! ```text
//! MCP_PERSIST_MOTO_URL=http://127.0.0.1:5000 cargo run -p mcp-persist-store-vault --example split
//! ```
//!
//! Against AWS, with the standard environment (`AWS_REGION`, credentials
//! from the usual chain), leave `MCP_PERSIST_MOTO_URL` unset.

use std::{path::Path, time::Duration};

use mcp_persist_core::{
    ClientRegistration, CredentialKey, Credentials, EventLogConfig, KvStore, ProtocolEra,
    ProtocolVersion, Secret, ServerKey, ServerProfile, Stores, Timestamp,
};
use mcp_persist_store_sqlite::SqliteStore;
use mcp_persist_store_vault::{
    SecretsManagerStore,
    aws_sdk_secretsmanager::{
        Client, Config,
        config::{BehaviorVersion, Credentials as AwsCredentials, Region},
    },
};

/// What the run left where.
#[derive(Debug)]
pub(crate) struct Report {
    /// Keys in Secrets Manager under the example's prefix.
    pub(crate) in_secrets_manager: Vec<mcp_persist_core::Key>,
    /// Keys in SQLite.
    pub(crate) in_sqlite: Vec<mcp_persist_core::Key>,
}

/// Opens the split (credentials under `prefix` in Secrets Manager, the rest
/// in the SQLite file `db`), stores a credential and a server profile, and
/// reads them back as a restarted process would.
pub(crate) async fn run(moto_url: Option<&str>, prefix: &str, db: &Path) -> anyhow::Result<Report> {
    let open = || async {
        // The one builder call: credentials here, the rest in SQLite.
        let stores: Stores = vault(prefix, moto_url)
            .build_split(SqliteStore::open(db).await?)
            .await?;
        anyhow::Ok(stores)
    };

    let key = CredentialKey::new("https://auth.example.com", "https://mcp.example.com/mcp")?;
    let server = ServerKey::new("https://mcp.example.com/mcp", "default")?;
    {
        let stores = open().await?;
        stores
            .credentials()
            .save(
                &Credentials::new(
                    key.clone(),
                    Secret::new("example-access-token"),
                    ClientRegistration::new("example-agent"),
                )
                .with_expires_at(Timestamp::now().plus(Duration::from_secs(3600)))
                .with_refresh_token(Secret::new("example-refresh-token"))
                .with_scopes(vec!["mcp:tools".into()]),
            )
            .await?;
        stores
            .client_state()
            .save_profile(
                &server,
                &ServerProfile::new(ProtocolEra::Legacy, ProtocolVersion::new("2025-11-25")?),
            )
            .await?;
        // Event logs go to SQLite: Secrets Manager holds none.
        stores
            .events(EventLogConfig::default())?
            .append("stream-1", None, &serde_json::json!({"hello": "world"}))
            .await?;
    }

    // A restart: everything is read back before any network call to the MCP
    // server or the authorization server.
    let stores = open().await?;
    let credentials = stores
        .credentials()
        .load(&key)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the credential was not kept"))?;
    // Secrets print as `[redacted]`.
    println!("credential: {:?}", credentials.record.access_token);
    let profile = stores.client_state().profile(&server).await?;
    println!("server profile era: {:?}", profile.map(|p| p.era));

    let in_secrets_manager = vault(prefix, moto_url).build().await?.list("").await?;
    let in_sqlite = SqliteStore::open(db).await?.list("").await?;
    Ok(Report {
        in_secrets_manager,
        in_sqlite,
    })
}

/// A Secrets Manager store builder: on moto when its address is given,
/// otherwise configured from the standard AWS environment.
fn vault(
    prefix: &str,
    moto_url: Option<&str>,
) -> mcp_persist_store_vault::SecretsManagerStoreBuilder {
    let builder = SecretsManagerStore::builder(prefix);
    match moto_url {
        // moto accepts any credentials.
        Some(url) => builder.client(Client::from_conf(
            Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new("us-east-1"))
                .credentials_provider(AwsCredentials::new(
                    "testing", "testing", None, None, "example",
                ))
                .endpoint_url(url)
                .build(),
        )),
        None => builder,
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let moto_url = std::env::var("MCP_PERSIST_MOTO_URL").ok();
    let dir = tempfile::tempdir()?;
    let report = run(
        moto_url.as_deref(),
        "mcp-persist-example/",
        &dir.path().join("state.db"),
    )
    .await?;
    println!("in Secrets Manager: {:?}", report.in_secrets_manager);
    println!("in SQLite:          {:?}", report.in_sqlite);
    Ok(())
}
