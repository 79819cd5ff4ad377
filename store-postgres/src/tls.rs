//! TLS to the server: none, or rustls (feature `rustls`).

use mcp_persist_core::{Error, Result};
use tokio_postgres::config::SslMode;

/// How connections are made.
#[derive(Clone)]
pub(crate) enum Tls {
    /// Plain TCP or a Unix socket.
    None,
    /// TLS through rustls.
    #[cfg(feature = "rustls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// The connector for `mode`: TLS when the URL says `sslmode=require`, with
/// `custom` when the application gave its own rustls configuration and the
/// platform's trusted roots otherwise.
#[cfg(feature = "rustls")]
pub(crate) fn connector(mode: SslMode, custom: Option<&rustls::ClientConfig>) -> Result<Tls> {
    if mode != SslMode::Require {
        return Ok(Tls::None);
    }
    let config = match custom {
        Some(config) => config.clone(),
        None => platform_config()?,
    };
    Ok(Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(
        config,
    )))
}

#[cfg(feature = "rustls")]
fn platform_config() -> Result<rustls::ClientConfig> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(Error::invalid(
            "Postgres TLS",
            "sslmode=require, but this machine has no trusted root certificates \
             (install ca-certificates, or give the builder a rustls ClientConfig)",
        ));
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid("Postgres TLS", e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// Without the `rustls` feature there is no TLS to ask for.
#[cfg(not(feature = "rustls"))]
pub(crate) fn connector(mode: SslMode) -> Result<Tls> {
    if mode == SslMode::Require {
        return Err(Error::invalid(
            "Postgres URL",
            "sslmode=require, but this build has no TLS: turn on the feature `rustls` of \
             mcp-persist-store-postgres (or `postgres` of mcp-persist, which has it)",
        ));
    }
    Ok(Tls::None)
}
