//! Sealing keys kept in AWS Secrets Manager.

use std::fmt;

use async_trait::async_trait;
use aws_sdk_secretsmanager::Client;
use mcp_persist_core::{
    Error, Result,
    seal::{KeySource, Keyring},
};
use zeroize::Zeroizing;

use crate::error::{code_of, from_sdk};

const NOT_FOUND: &str = "ResourceNotFoundException";

/// A [`KeySource`] reading the sealing keyring from one Secrets Manager
/// secret: its current version (`AWSCURRENT`), as a string or binary value
/// holding the [text form](Keyring#text-form) of a keyring (base64 keys, the
/// active one first).
///
/// Rotating is writing a new version of the secret, the new key first and
/// the former one after it; processes that
/// [reload](mcp_persist_core::seal::Sealing::reload_every) pick it up.
/// Errors carry the service's code and message, never the secret's text.
///
/// Name the keyring outside the prefix of any [`SecretsManagerStore`](crate::SecretsManagerStore):
/// every secret under a store's prefix is taken for one of its records, so
/// `mcp-persist check` would report the keyring as damaged and
/// `mcp-persist rm --prefix` could replace it with a tombstone. The crate's
/// example keeps records under `my-agent/`; this keyring is `my-agent-keys`,
/// outside it.
///
/// ```no_run
/// # async fn run() -> Result<(), mcp_persist_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use mcp_persist_core::{MemoryStore, Stores, seal::{KeySource, Sealing}};
/// use mcp_persist_store_vault::SecretsManagerKeys;
///
/// let source = SecretsManagerKeys::from_env("my-agent-keys").await?;
/// let sealing = Sealing::new(source.load().await?);
/// // A rotation done in Secrets Manager reaches this process within 5 minutes.
/// let _reloading = sealing.reload_every(Arc::new(source), Duration::from_secs(300));
/// let stores = Stores::new(MemoryStore::new()).encrypted(sealing);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SecretsManagerKeys {
    client: Client,
    secret_id: String,
}

impl fmt::Debug for SecretsManagerKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsManagerKeys")
            .field("secret_id", &self.secret_id)
            .finish_non_exhaustive()
    }
}

impl SecretsManagerKeys {
    /// The keys in secret `secret_id` (a name or an ARN), read with `client`.
    pub fn new(client: Client, secret_id: impl Into<String>) -> SecretsManagerKeys {
        SecretsManagerKeys {
            client,
            secret_id: secret_id.into(),
        }
    }

    /// The same, with a client configured from the standard AWS environment;
    /// a missing region is [`Error::InvalidInput`].
    pub async fn from_env(secret_id: impl Into<String>) -> Result<SecretsManagerKeys> {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        if config.region().is_none() {
            return Err(Error::invalid(
                "AWS configuration",
                "no region: set AWS_REGION (or a profile's region), or pass a client",
            ));
        }
        Ok(SecretsManagerKeys::new(Client::new(&config), secret_id))
    }
}

#[async_trait]
impl KeySource for SecretsManagerKeys {
    async fn load(&self) -> Result<Keyring> {
        let out = match self
            .client
            .get_secret_value()
            .secret_id(&self.secret_id)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if code_of(&e) == Some(NOT_FOUND) => {
                return Err(Error::NotFound {
                    what: "sealing keyring",
                    detail: Some(format!(
                        "Secrets Manager has no secret {}; create it with the base64 keys, the active one first",
                        self.secret_id
                    )),
                });
            }
            Err(e) => return Err(from_sdk("GetSecretValue", e)),
        };
        let text = match (out.secret_string(), out.secret_binary()) {
            (Some(text), _) => Zeroizing::new(text.to_owned()),
            (None, Some(blob)) => Zeroizing::new(
                String::from_utf8(blob.as_ref().to_vec()).map_err(|_| {
                    Error::invalid(
                        "keyring",
                        format!(
                            "the binary value of secret {} is not text; store the base64 keys as text",
                            self.secret_id
                        ),
                    )
                })?,
            ),
            (None, None) => Zeroizing::new(String::new()),
        };
        let ring = Keyring::parse(&text, &self.describe())?;
        tracing::debug!(secret = %self.secret_id, active = %ring.active(), keys = ring.ids().len(), "sealing keyring loaded from Secrets Manager");
        Ok(ring)
    }

    fn describe(&self) -> String {
        format!("Secrets Manager secret {}", self.secret_id)
    }
}
