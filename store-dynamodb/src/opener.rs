//! `dynamodb://` URLs, for the [registry](mcp_persist_core::registry).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::{Client, config::Region};
use mcp_persist_core::{
    Error, Result,
    registry::{OpenMode, OpenOptions, OpenedStore, Opener, StoreUrl, endpoint_option},
};

use crate::DynamoStore;

/// Opens `dynamodb://TABLE[?region=R][&endpoint=URL][&create=1][&poll_ms=N]`:
/// the store in one DynamoDB table.
///
/// Credentials come from the AWS default chain (environment, profile,
/// instance or function role); the region from `region=` or the
/// environment. `endpoint=` overrides the service address (a local
/// emulator such as moto, a VPC endpoint). `create=1` creates the table
/// first ([`DynamoStore::create_table`], idempotent), the one way a store
/// URL creates anything; without it a missing table is
/// [`Error::NotFound`] saying how to create it. Opened with
/// [`OpenMode::Existing`] or [`OpenMode::ReadOnly`], it writes nothing,
/// `create=1` or not, and a missing table is not a store
/// ([`not_a_store`](mcp_persist_core::registry::not_a_store)).
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamoOpener;

fn usage(url: &StoreUrl, why: impl std::fmt::Display) -> Error {
    Error::invalid("store URL", format!("`{url}`: {why}"))
}

/// What a `dynamodb://` URL says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed {
    table: String,
    region: Option<String>,
    endpoint: Option<String>,
    create: bool,
    poll: Option<Duration>,
}

fn parse(url: &StoreUrl) -> Result<Parsed> {
    let rest = url
        .rest()
        .strip_prefix("//")
        .ok_or_else(|| usage(url, "write dynamodb://TABLE?region=REGION"))?;
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err(usage(
            url,
            "names no table; write dynamodb://TABLE?region=REGION",
        ));
    }
    crate::table::check_name(table)?;
    let mut parsed = Parsed {
        table: table.to_owned(),
        ..Parsed::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("region", r)) if !r.is_empty() => parsed.region = Some(r.to_owned()),
            Some(("endpoint", e)) => parsed.endpoint = Some(endpoint_option(e)?),
            Some(("region", _)) => return Err(usage(url, "`region=` has no value")),
            Some(("create", c)) => {
                parsed.create = match c {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    other => return Err(usage(url, format!("create={other}: write create=1"))),
                }
            }
            Some(("poll_ms", ms)) => {
                let ms: u64 = ms
                    .parse()
                    .map_err(|_| usage(url, format!("poll_ms={ms} is not a whole number")))?;
                parsed.poll = Some(Duration::from_millis(ms));
            }
            _ => {
                return Err(usage(
                    url,
                    format!("unknown option `{pair}`; known: region, endpoint, create, poll_ms"),
                ));
            }
        }
    }
    Ok(parsed)
}

#[async_trait]
impl Opener for DynamoOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["dynamodb"]
    }

    fn forms(&self) -> &'static str {
        "dynamodb://TABLE[?region=R&endpoint=URL&create=1&poll_ms=N]
                                    one Amazon DynamoDB table (create=1 makes it first;
                                    endpoint overrides the service address, e.g. for moto)"
    }

    async fn open(&self, url: &StoreUrl, options: OpenOptions) -> Result<OpenedStore> {
        let parsed = parse(url)?;
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = &parsed.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &parsed.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(usage(
                url,
                "no region: add region=REGION, or set AWS_REGION",
            ));
        }
        let client = Client::new(&config);
        if parsed.create && options.mode == OpenMode::Create {
            DynamoStore::create_table(&client, &parsed.table).await?;
        }
        let mut builder = DynamoStore::builder(&parsed.table).client(client);
        if let Some(poll) = parsed.poll {
            builder = builder.poll_interval(poll);
        }
        match builder.build().await {
            Ok(store) => Ok(OpenedStore::both(store, url)),
            // A tool that only reads says "not a store", as for every other
            // backend (it said "DynamoDB table not found" under `ReadOnly`,
            // which the CLI took for a failing backend).
            Err(Error::NotFound { detail, .. }) if options.needs_existing() => {
                Err(mcp_persist_core::registry::not_a_store(format!(
                    "not a store: {}",
                    detail.unwrap_or_else(|| format!("no table `{}`", parsed.table))
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Checks the URL as `open` does. When opening would make the table
    /// (`create=1` under [`OpenMode::Create`]), it also asks, read-only,
    /// whether the table is there (`false`: opening would make it), so
    /// that a dry run says so and a tool opens what it would make last.
    /// Otherwise opening makes nothing, and `open` refuses a missing table.
    async fn exists(&self, url: &StoreUrl, options: OpenOptions) -> Result<bool> {
        let parsed = parse(url)?;
        if !(parsed.create && options.mode == OpenMode::Create) {
            return Ok(true);
        }
        mcp_persist_core::registry::there_read_only(self, url).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Parsed> {
        parse(&StoreUrl::parse(text)?)
    }

    #[test]
    fn urls_parse() {
        let p = parsed("dynamodb://mcp-state?region=eu-west-1&endpoint=http://127.0.0.1:5000&create=1&poll_ms=20")
            .expect("parses");
        assert_eq!(p.table, "mcp-state");
        assert_eq!(p.region.as_deref(), Some("eu-west-1"));
        assert_eq!(p.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(p.create);
        assert_eq!(p.poll, Some(Duration::from_millis(20)));
        let plain = parsed("dynamodb://mcp-state").expect("parses");
        assert_eq!(plain.region, None);
        assert!(!plain.create);
    }

    #[tokio::test]
    async fn bad_urls_say_what_to_write() {
        let mut cases = Vec::new();
        for (text, says) in [
            ("dynamodb:mcp-state", "dynamodb://TABLE"),
            ("dynamodb://", "names no table"),
            ("dynamodb://ab", "3 to 255"),
            ("dynamodb://bad name", "3 to 255"),
            ("dynamodb://t1t?prefix=x", "known: region"),
            ("dynamodb://t1t?create=maybe", "create=1"),
            ("dynamodb://t1t?poll_ms=fast", "whole number"),
            ("dynamodb://t1t?endpoint=", "`endpoint=` has no value"),
            ("dynamodb://t1t?endpoint=localhost:8000", "http://HOST:PORT"),
            ("dynamodb://t1t?region=&create=1", "`region=` has no value"),
        ] {
            let err = parsed(text).expect_err(text);
            assert!(matches!(err, Error::InvalidInput { .. }), "{text}: {err:?}");
            assert!(err.to_string().contains(says), "{text}: {err}");
            cases.push((text, says));
        }
        // A dry run and a split store ask `exists` first: refused alike, in
        // every mode, before any request.
        mcp_persist_core::conformance::opener::refused_alike(DynamoOpener, &cases).await;
    }
}
