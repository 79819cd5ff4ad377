//! How store keys and log names become Redis keys.
//!
//! Every Redis key is `<prefix>{<kind>:<name>}<suffix>`. The braces are a
//! Redis Cluster hash tag: Redis hashes only what is between the first `{` and
//! the first `}` after it, so the record of a key and its version companion
//! (which differ only in the suffix) always live in the same slot, and the
//! Lua scripts that touch both run on one node. The `<kind>:` part keeps the
//! tag non-empty even for a name that starts with `}` (an empty tag would
//! make Redis hash the whole key and split the pair). The prefix may not hold
//! braces, so the first `{` is always ours.

use mcp_persist_core::{Error, Result};

/// The key prefix used when none is configured.
pub(crate) const DEFAULT_PREFIX: &str = "mcp-persist:";

/// Builds Redis keys under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// A layout under `prefix`, which must not contain `{` or `}`.
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        if prefix.contains(['{', '}']) {
            return Err(Error::invalid(
                "key prefix",
                "must not contain `{` or `}`: the store places its own Redis Cluster hash tags",
            ));
        }
        if prefix.contains('\0') {
            return Err(Error::invalid("key prefix", "must not contain NUL"));
        }
        Ok(KeyLayout {
            prefix: prefix.to_owned(),
        })
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn tagged(&self, kind: &str, name: &str, suffix: &str) -> Vec<u8> {
        let mut key =
            Vec::with_capacity(self.prefix.len() + kind.len() + name.len() + suffix.len() + 3);
        key.extend_from_slice(self.prefix.as_bytes());
        key.push(b'{');
        key.extend_from_slice(kind.as_bytes());
        key.push(b':');
        key.extend_from_slice(name.as_bytes());
        key.push(b'}');
        key.extend_from_slice(suffix.as_bytes());
        key
    }

    /// The string holding `<version>:<value>` of a key-value record.
    pub(crate) fn record(&self, key: &str) -> Vec<u8> {
        self.tagged("kv", key, "")
    }

    /// The companion holding the last version handed out for a key, kept for
    /// a while after the record is deleted or expires.
    pub(crate) fn version(&self, key: &str) -> Vec<u8> {
        self.tagged("kv", key, ":ver")
    }

    /// The stream of a log.
    pub(crate) fn log(&self, log: &str) -> Vec<u8> {
        self.tagged("log", log, "")
    }

    /// The `SCAN MATCH` pattern of every record (and version companion)
    /// whose key starts with `key_prefix`.
    pub(crate) fn record_pattern(&self, key_prefix: &str) -> Vec<u8> {
        let mut pattern = Vec::new();
        glob_escape(&mut pattern, &self.prefix);
        pattern.extend_from_slice(b"\\{kv:");
        glob_escape(&mut pattern, key_prefix);
        pattern.push(b'*');
        pattern
    }

    /// The store key of a Redis key found by [`record_pattern`](Self::record_pattern),
    /// or `None` for a version companion or a key that is not ours.
    pub(crate) fn key_of_record<'a>(&self, redis_key: &'a [u8]) -> Option<&'a str> {
        let rest = redis_key.strip_prefix(self.prefix.as_bytes())?;
        let rest = rest.strip_prefix(b"{kv:")?;
        // A record ends right after its tag; a companion has a suffix, so it
        // ends in `:ver`, never in `}`.
        let name = rest.strip_suffix(b"}")?;
        std::str::from_utf8(name).ok()
    }
}

/// Appends `text` to a Redis glob pattern, matching it literally.
fn glob_escape(pattern: &mut Vec<u8>, text: &str) {
    for &b in text.as_bytes() {
        if matches!(
            b,
            b'*' | b'?' | b'[' | b']' | b'\\' | b'^' | b'-' | b'{' | b'}'
        ) {
            pattern.push(b'\\');
        }
        pattern.push(b);
    }
}

/// The hash tag Redis Cluster would hash for `key`, following the rule of
/// the Redis Cluster specification.
#[cfg(test)]
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_version_share_a_non_empty_tag() {
        let layout = KeyLayout::new("app:").expect("valid prefix");
        for key in [
            "plain",
            "}starts",
            "{}",
            "a}b{c}",
            "odd/{tag}:x",
            "🦀/ключ",
            "x}:ver",
        ] {
            let record = layout.record(key);
            let version = layout.version(key);
            let tag = hash_tag(&record);
            assert_ne!(tag, &record[..], "key {key:?} has no hash tag");
            assert_eq!(tag, hash_tag(&version), "key {key:?} splits across slots");
        }
    }

    #[test]
    fn records_map_back_to_their_keys_and_companions_do_not() {
        let layout = KeyLayout::new("app:").expect("valid prefix");
        for key in ["plain", "}", "x}:ver", "a b/c", "日本語"] {
            assert_eq!(layout.key_of_record(&layout.record(key)), Some(key));
            assert_eq!(layout.key_of_record(&layout.version(key)), None);
            assert_eq!(layout.key_of_record(&layout.log(key)), None);
        }
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(matches!(
            KeyLayout::new("a{b"),
            Err(Error::InvalidInput { .. })
        ));
        assert!(KeyLayout::new("").is_ok());
    }

    #[test]
    fn glob_specials_are_escaped() {
        let layout = KeyLayout::new("p*:").expect("valid prefix");
        assert_eq!(
            layout.record_pattern("a?[b]"),
            b"p\\*:\\{kv:a\\?\\[b\\]*".to_vec()
        );
    }
}
