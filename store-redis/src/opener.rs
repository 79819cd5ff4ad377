//! `redis://` and `redis+cluster://` URLs, for the
//! [registry](mcp_persist_core::registry).

use std::time::Duration;

use async_trait::async_trait;
use mcp_persist_core::{
    Error, Result,
    registry::{OpenOptions, OpenedStore, Opener, StoreUrl},
};

use crate::{RedisStore, RedisStoreBuilder};

/// Opens `redis://HOST:PORT[/DB][?prefix=P]` (`rediss://` for TLS) and
/// `redis+cluster://H1:P1,H2:P2[?prefix=P]` (`rediss+cluster://`).
///
/// `prefix` is the key prefix the application configured
/// ([`RedisStoreBuilder::key_prefix`](crate::RedisStoreBuilder::key_prefix)).
/// Opening writes nothing, so [`OpenMode::Existing`] needs no extra care:
/// a server without the application's keys simply lists nothing.
///
/// [`OpenMode::Existing`]: mcp_persist_core::registry::OpenMode::Existing
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisOpener;

fn usage(url: &StoreUrl, why: impl std::fmt::Display) -> Error {
    Error::invalid("store URL", format!("`{url}`: {why}"))
}

/// The `prefix=` of a query, and whether anything else was there.
fn prefix_of(url: &StoreUrl, query: Option<&str>) -> Result<Option<String>> {
    let mut prefix = None;
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*name {
            "prefix" => prefix = Some(value.into_owned()),
            other => {
                return Err(usage(
                    url,
                    format!("unknown option `{other}`; only prefix=P is known"),
                ));
            }
        }
    }
    Ok(prefix)
}

/// A builder for the server or cluster `url` names, with its key prefix:
/// the URL checked as `open` checks it, without connecting.
fn builder_for(url: &StoreUrl) -> Result<RedisStoreBuilder> {
    let scheme = url.scheme();
    let (builder, prefix) = if let Some(node_scheme) = scheme.strip_suffix("+cluster") {
        let body = url.rest().strip_prefix("//").ok_or_else(|| {
            usage(
                url,
                format!("write the cluster as {scheme}://HOST:PORT,HOST:PORT"),
            )
        })?;
        let (nodes, query) = match body.split_once('?') {
            Some((n, q)) => (n, Some(q)),
            None => (body, None),
        };
        let nodes: Vec<String> = nodes
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| format!("{node_scheme}://{n}/"))
            .collect();
        if nodes.is_empty() {
            return Err(usage(url, "names no cluster node"));
        }
        (RedisStore::cluster(nodes), prefix_of(url, query)?)
    } else {
        let mut parsed = url::Url::parse(url.as_str())
            .map_err(|e| usage(url, format!("not a valid Redis URL: {e}")))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(usage(url, "names no Redis host; write redis://HOST:PORT"));
        }
        let prefix = prefix_of(url, parsed.query())?;
        parsed.set_query(None);
        (RedisStore::standalone(parsed.to_string()), prefix)
    };
    let builder = match prefix {
        Some(prefix) => {
            crate::keys::KeyLayout::new(&prefix)?;
            builder.key_prefix(prefix)
        }
        None => builder,
    };
    Ok(builder)
}

#[async_trait]
impl Opener for RedisOpener {
    fn schemes(&self) -> &'static [&'static str] {
        &["redis", "rediss", "redis+cluster", "rediss+cluster"]
    }

    fn forms(&self) -> &'static str {
        "redis://HOST:PORT[/DB][?prefix=P]   a Redis server (rediss:// for TLS)
redis+cluster://H1:P1,H2:P2[?prefix=P]
                                    a Redis Cluster, by some of its nodes"
    }

    async fn open(&self, url: &StoreUrl, _options: OpenOptions) -> Result<OpenedStore> {
        let builder = builder_for(url)?;
        let store = builder
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(OpenedStore::both(store, url))
    }

    /// Checks the URL as `open` does, without connecting: a prefix leaves
    /// no mark of a store on the server, so a well-formed URL is one.
    async fn exists(&self, url: &StoreUrl, _options: OpenOptions) -> Result<bool> {
        builder_for(url).map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dry run and a split store ask `exists` before anything is opened:
    /// it refuses each URL `open` refuses, with the same words, and neither
    /// connects (nothing listens on port 9).
    #[tokio::test]
    async fn exists_refuses_what_open_refuses() {
        mcp_persist_core::conformance::opener::refused_alike(
            RedisOpener,
            &[
                ("redis+cluster:127.0.0.1:9", "write the cluster as"),
                ("redis+cluster://,", "names no cluster node"),
                ("redis:///0", "names no Redis host"),
                ("redis://127.0.0.1:9/0?db=2", "only prefix=P is known"),
                ("redis://127.0.0.1:9/0?prefix=a{b}", "hash tags"),
                ("redis+cluster://127.0.0.1:9?prefix=a{b}", "hash tags"),
            ],
        )
        .await;
        let good = StoreUrl::parse("redis://127.0.0.1:9/0?prefix=app:").expect("parses");
        assert!(
            RedisOpener
                .exists(&good, OpenOptions::read_only())
                .await
                .expect("a well-formed URL is checked without connecting")
        );
    }
}
