//! Where keyrings come from: [`KeySource`], and the environment and file
//! sources.

use std::{fmt, path::PathBuf};

use async_trait::async_trait;
use zeroize::Zeroizing;

use super::Keyring;
use crate::{Error, Result};

/// A place operators keep sealing keys, in the [text
/// form](Keyring#text-form) of a keyring.
///
/// Loading again picks up a rotation done there (see
/// [`Sealing::reload_every`](super::Sealing::reload_every)). This crate has
/// [`EnvKeys`] and [`FileKeys`]; `mcp-persist-store-vault` adds AWS Secrets
/// Manager. An implementation never puts key text in an error or a log
/// line.
#[async_trait]
pub trait KeySource: Send + Sync + fmt::Debug {
    /// Reads the keyring as it is now.
    async fn load(&self) -> Result<Keyring>;

    /// Where the keys are, for messages (`environment variable X`).
    fn describe(&self) -> String;
}

/// Keys in an environment variable.
///
/// ```
/// use mcp_persist_core::seal::{EnvKeys, KeySource};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let err = EnvKeys::new("MCP_PERSIST_DOC_NO_SUCH_VARIABLE").load().await.unwrap_err();
/// assert!(err.to_string().contains("MCP_PERSIST_DOC_NO_SUCH_VARIABLE is not set"), "{err}");
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct EnvKeys {
    var: String,
}

impl EnvKeys {
    /// The variable usually holding them.
    pub const DEFAULT_VAR: &'static str = "MCP_PERSIST_SEALING_KEYS";

    /// Keys in the variable `var`.
    pub fn new(var: impl Into<String>) -> EnvKeys {
        EnvKeys { var: var.into() }
    }
}

#[async_trait]
impl KeySource for EnvKeys {
    async fn load(&self) -> Result<Keyring> {
        let text = Zeroizing::new(std::env::var(&self.var).map_err(|e| {
            Error::invalid(
                "keyring",
                match e {
                    std::env::VarError::NotPresent => format!(
                        "environment variable {} is not set; put the base64 sealing keys there, the active one first",
                        self.var
                    ),
                    std::env::VarError::NotUnicode(_) => {
                        format!("environment variable {} is not UTF-8", self.var)
                    }
                },
            )
        })?);
        Keyring::parse(&text, &self.describe())
    }

    fn describe(&self) -> String {
        format!("environment variable {}", self.var)
    }
}

/// Keys in a file that only its owner may read (mode `0600` or stricter on
/// Unix; a file others can read is refused, as `ssh` refuses such a key).
#[derive(Debug, Clone)]
pub struct FileKeys {
    path: PathBuf,
}

impl FileKeys {
    /// Keys in the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> FileKeys {
        FileKeys { path: path.into() }
    }
}

#[async_trait]
impl KeySource for FileKeys {
    async fn load(&self) -> Result<Keyring> {
        let path = self.path.clone();
        let describe = self.describe();
        tokio::task::spawn_blocking(move || read_key_file(&path, &describe))
            .await
            .map_err(|e| Error::backend("key file", e.to_string()))?
    }

    fn describe(&self) -> String {
        format!("key file {}", self.path.display())
    }
}

fn read_key_file(path: &std::path::Path, describe: &str) -> Result<Keyring> {
    let io = |e: std::io::Error| {
        Error::invalid(
            "keyring",
            format!("{describe} cannot be read: {e} (is the path right?)"),
        )
    };
    let file = std::fs::File::open(path).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(io)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(Error::invalid(
                "keyring",
                format!(
                    "{describe} is open to other users (mode {:o}); make it private with `chmod 600 {}`",
                    mode & 0o777,
                    path.display()
                ),
            ));
        }
    }
    let mut text = Zeroizing::new(String::new());
    std::io::Read::read_to_string(&mut &file, &mut text).map_err(io)?;
    Keyring::parse(&text, describe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::SealKey;

    #[tokio::test]
    async fn a_key_file_others_can_read_is_refused_and_a_private_one_loads() {
        let dir = std::env::temp_dir().join(format!("mcp-persist-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        let (key, text) = SealKey::generate().unwrap();
        std::fs::write(&path, format!("{}\n", text.expose_secret())).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let err = FileKeys::new(&path).load().await.unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{err}");
            assert!(!err.contains(text.expose_secret()));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let ring = FileKeys::new(&path).load().await.unwrap();
        assert_eq!(ring.active(), key.id());
        let missing = FileKeys::new(dir.join("nope")).load().await.unwrap_err();
        assert!(matches!(missing, Error::InvalidInput { .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
