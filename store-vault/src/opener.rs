//! `secretsmanager://` URLs, for the [registry](mcp_persist_core::registry).

use async_trait::async_trait;
use aws_sdk_secretsmanager::{
    Client, Config,
    config::{BehaviorVersion, Credentials, Region},
};
use mcp_persist_core::{
    Error, Result,
    registry::{OpenOptions, OpenedStore, Opener, StoreUrl, endpoint_option},
};

use crate::SecretsManagerStore;

/// Opens `secretsmanager://REGION?prefix=P[&endpoint=URL]`: the secrets named
/// `P…` in one region (key-value only).
///
/// Credentials come from the AWS default chain (environment, profile,
/// instance role). With `endpoint` (a local emulator such as moto), the
/// credentials are `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the
/// environment. Tools open without the write rate limit of an application
/// (they run alone, briefly); opening writes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct SecretsManagerOpener;

fn usage(url: &StoreUrl, why: impl std::fmt::Display) -> Error {
    Error::invalid("store URL", format!("`{url}`: {why}"))
}

/// What a `secretsmanager://` URL says, checked without a request.
struct Parsed {
    region: String,
    prefix: String,
    endpoint: Option<Endpoint>,
}

/// An `endpoint=` and the credentials from the environment that go with it.
struct Endpoint {
    url: String,
    key: String,
    secret: String,
}

fn parse(url: &StoreUrl) -> Result<Parsed> {
    let rest = url
        .rest()
        .strip_prefix("//")
        .ok_or_else(|| usage(url, "write secretsmanager://REGION?prefix=P"))?;
    let (region, query) = rest.split_once('?').unwrap_or((rest, ""));
    let region = region.trim_end_matches('/');
    if region.is_empty() {
        return Err(usage(
            url,
            "names no region; write secretsmanager://REGION?prefix=P",
        ));
    }
    let (mut prefix, mut endpoint) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("prefix", p)) => prefix = Some(p.to_owned()),
            Some(("endpoint", e)) => endpoint = Some(endpoint_option(e)?),
            _ => {
                return Err(usage(
                    url,
                    format!("unknown option `{pair}`; known: prefix, endpoint"),
                ));
            }
        }
    }
    let prefix = prefix.ok_or_else(|| {
            usage(
                url,
                format!("names no prefix; write secretsmanager://{region}?prefix=P (the prefix the application uses)"),
            )
        })?;
    if prefix.is_empty() {
        return Err(usage(url, crate::names::EMPTY_PREFIX));
    }
    crate::names::Names::new(prefix.clone())?;
    let endpoint = match endpoint {
        Some(endpoint) => {
            let key = std::env::var("AWS_ACCESS_KEY_ID").map_err(|_| {
                usage(
                    url,
                    "with endpoint= it needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment (any value for a local emulator)",
                )
            })?;
            let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default();
            Some(Endpoint {
                url: endpoint,
                key,
                secret,
            })
        }
        None => None,
    };
    Ok(Parsed {
        region: region.to_owned(),
        prefix,
        endpoint,
    })
}

#[async_trait]
impl Opener for SecretsManagerOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["secretsmanager"]
    }

    fn forms(&self) -> &'static str {
        "secretsmanager://REGION?prefix=P[&endpoint=URL]
                                    AWS Secrets Manager (key-value only; endpoint
                                    overrides the service address, e.g. for moto)"
    }

    async fn open(&self, url: &StoreUrl, _options: OpenOptions) -> Result<OpenedStore> {
        let Parsed {
            region,
            prefix,
            endpoint,
        } = parse(url)?;
        let client = match endpoint {
            Some(Endpoint { url, key, secret }) => {
                let config = Config::builder()
                    .behavior_version(BehaviorVersion::latest())
                    .region(Region::new(region.clone()))
                    .credentials_provider(Credentials::new(key, secret, None, None, "env"))
                    .endpoint_url(url)
                    .build();
                Client::from_conf(config)
            }
            None => {
                let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .region(Region::new(region.clone()))
                    .load()
                    .await;
                Client::new(&config)
            }
        };
        let store = SecretsManagerStore::builder(prefix)
            .client(client)
            .max_writes_per_second(None)
            .build()
            .await?;
        Ok(OpenedStore::kv_only(store, url))
    }

    /// Checks the URL as `open` does, without a request. A prefix leaves no
    /// mark of a store in the account, so a well-formed URL is one.
    async fn exists(&self, url: &StoreUrl, _options: OpenOptions) -> Result<bool> {
        parse(url).map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_say_what_to_write_and_never_panic() {
        let cases = [
            (
                "secretsmanager:us-east-1?prefix=p",
                "secretsmanager://REGION",
            ),
            ("secretsmanager://?prefix=p", "names no region"),
            ("secretsmanager://us-east-1", "names no prefix"),
            (
                "secretsmanager://us-east-1?prefix=p&region=x",
                "known: prefix, endpoint",
            ),
            (
                "secretsmanager://us-east-1?prefix=p&endpoint=",
                "`endpoint=` has no value",
            ),
            (
                "secretsmanager://us-east-1?endpoint=&prefix=p",
                "`endpoint=` has no value",
            ),
            ("secretsmanager://us-east-1?prefix=", "an empty prefix"),
            ("secretsmanager://us-east-1?prefix=a*b/", "only A-Z"),
            (
                "secretsmanager://us-east-1?prefix=&endpoint=http://127.0.0.1:9",
                "an empty prefix",
            ),
        ];
        // Opened for writing, existing and read-only, and asked by `exists`
        // (a dry run, a split store): refused alike, before any request.
        mcp_persist_core::conformance::opener::refused_alike(SecretsManagerOpener, &cases).await;
    }
}
