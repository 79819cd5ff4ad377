//! Keys to secret names and back.
//!
//! Secret names allow up to 512 characters of `[A-Za-z0-9/_+=.@-]`; keys are
//! any UTF-8 up to 1024 bytes. A key becomes `<prefix><escaped key>`, where
//! every byte outside `[A-Za-z0-9/_+.@-]` (and `=` itself) is written as
//! `=XX`, two upper-case hex digits of the byte. That is percent-encoding
//! with `=` as the escape: reversible, and two keys never share a name.
//!
//! A key whose escaped form does not fit is **hashed**: its name is the
//! prefix, the escaped key cut to what fits (never inside an escape), then
//! `=H` and the 64 hex digits of the key's SHA-256. `=H` cannot occur in an
//! escaped key (an escape is `=` and two hex digits), so hashed and plain
//! names never meet. A hashed name cannot be read back into its key, so the
//! full key is kept in the secret's description (for `list`) and covered by
//! the digest in every version stamp (checked by `get`).

use mcp_persist_core::{Error, Result};
use sha2::{Digest, Sha256};

/// The longest secret name Secrets Manager accepts.
pub(crate) const MAX_NAME_CHARS: usize = 512;
/// The longest name prefix this store accepts, leaving room for keys.
pub(crate) const MAX_PREFIX_CHARS: usize = 256;
/// Why an empty prefix is refused, and what to name instead.
pub(crate) const EMPTY_PREFIX: &str = "an empty prefix would make every secret of the account and region this store's, \
     so that deleting or overwriting a record could replace another application's secret; \
     name one the application alone writes under, such as `my-agent/`";
/// Marks a hashed name: `=` followed by a non-hex character.
const HASH_MARK: &str = "=H";
/// Characters of a hashed name after the cut escaped key.
const HASH_TAIL: usize = HASH_MARK.len() + 64;

/// Bytes kept as they are in a name.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'+' | b'.' | b'@' | b'-')
}

/// Whether a prefix only uses characters secret names allow.
pub(crate) fn is_name_text(s: &str) -> bool {
    s.bytes().all(|b| is_plain(b) || b == b'=')
}

fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if is_plain(b) {
            out.push(char::from(b));
        } else {
            out.push('=');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0xf));
        }
    }
    out
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(n & 0xf)])
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The key of a plain escaped name, or `None` when it is no escaped key.
fn unescape(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'=' => {
                let hi = hex_value(*bytes.get(i + 1)?)?;
                let lo = hex_value(*bytes.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b if is_plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The longest start of `escaped` of at most `budget` characters that does
/// not cut an escape sequence in two.
fn cut(escaped: &str, budget: usize) -> &str {
    if escaped.len() <= budget {
        return escaped;
    }
    let bytes = escaped.as_bytes();
    let mut end = budget;
    // An escape is 3 characters starting with `=`: step back over a partial one.
    for back in 1..=2 {
        if end >= back && bytes[end - back] == b'=' {
            end -= back;
            break;
        }
    }
    &escaped[..end]
}

fn sha256_hex(key: &str) -> String {
    mcp_persist_core::kit::hex(&Sha256::digest(key.as_bytes()))
}

/// The secret name of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretName {
    /// The full secret name.
    pub(crate) name: String,
    /// Whether the key had to be hashed (its full text lives in the description).
    pub(crate) hashed: bool,
}

/// The name layout of one store.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    /// Checks the prefix: name characters only, at most [`MAX_PREFIX_CHARS`].
    pub(crate) fn new(prefix: String) -> Result<Self> {
        if prefix.is_empty() {
            // Every secret name starts with the empty prefix: the store would
            // list every secret of the account and region as its own, and
            // `rm` or an overwrite would replace their values.
            return Err(Error::invalid("secret name prefix", EMPTY_PREFIX));
        }
        if prefix.len() > MAX_PREFIX_CHARS {
            return Err(Error::TooLarge {
                what: "secret name prefix",
                size: prefix.len(),
                limit: MAX_PREFIX_CHARS,
            });
        }
        if !is_name_text(&prefix) {
            return Err(Error::invalid(
                "secret name prefix",
                "only A-Z, a-z, 0-9 and / _ + = . @ - are allowed in secret names",
            ));
        }
        Ok(Names { prefix })
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Characters of the escaped key a hashed name keeps.
    fn head_budget(&self) -> usize {
        MAX_NAME_CHARS - self.prefix.len() - HASH_TAIL
    }

    /// The secret name of a (validated) key.
    pub(crate) fn name_of(&self, key: &str) -> SecretName {
        let escaped = escape(key);
        if self.prefix.len() + escaped.len() <= MAX_NAME_CHARS {
            return SecretName {
                name: format!("{}{escaped}", self.prefix),
                hashed: false,
            };
        }
        let head = cut(&escaped, self.head_budget());
        SecretName {
            name: format!("{}{head}{HASH_MARK}{}", self.prefix, sha256_hex(key)),
            hashed: true,
        }
    }

    /// The key a secret of this store holds, from its name and, for hashed
    /// names, its description. `None` for a secret that is not one of ours.
    pub(crate) fn key_of(&self, name: &str, description: Option<&str>) -> Option<String> {
        let rest = name.strip_prefix(&self.prefix)?;
        if rest.contains(HASH_MARK) {
            let key = description?;
            // The description is only trusted when it maps back to this very name.
            (self.name_of(key).name == name).then(|| key.to_owned())
        } else {
            unescape(rest)
        }
    }

    /// A value for the `name` filter of `ListSecrets` that matches the
    /// names of every key starting with `prefix` (and possibly more; callers
    /// filter the decoded keys exactly).
    pub(crate) fn list_filter(&self, prefix: &str) -> String {
        let escaped = escape(prefix);
        format!("{}{}", self.prefix, cut(&escaped, self.head_budget()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::new("app/test/".into()).expect("valid prefix")
    }

    #[test]
    fn plain_keys_round_trip_and_stay_distinct() {
        let names = names();
        let keys = [
            "odd/ключ/日本語/🦀",
            "odd/a b%2Fc",
            "odd/a b/c",
            "odd/=41",
            "odd/A",
            "odd/{tag}:x",
            "app/token/https%3A%2F%2Fissuer/x",
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let name = names.name_of(key);
            assert!(!name.hashed);
            assert!(name.name.len() <= MAX_NAME_CHARS);
            assert!(is_name_text(&name.name), "{name:?}");
            assert_eq!(names.key_of(&name.name, None).as_deref(), Some(key));
            assert!(seen.insert(name.name), "two keys share a name");
        }
    }

    #[test]
    fn long_keys_are_hashed_within_the_name_limit() {
        let names = names();
        for key in [
            "k".repeat(1024),
            format!("odd/{}", "x".repeat(1020)),
            "é".repeat(512),
            format!("{}é{}", "a".repeat(180), "b".repeat(800)),
        ] {
            let name = names.name_of(&key);
            assert!(name.hashed);
            assert!(name.name.len() <= MAX_NAME_CHARS, "{}", name.name.len());
            assert!(is_name_text(&name.name));
            assert_eq!(names.key_of(&name.name, None), None);
            assert_eq!(names.key_of(&name.name, Some(&key)).as_deref(), Some(&*key));
            assert_eq!(names.key_of(&name.name, Some("other")), None);
            // The list filter of any start of the key matches the name.
            for len in [0, 1, 100, 300, key.len()] {
                if key.is_char_boundary(len) {
                    let filter = names.list_filter(&key[..len]);
                    assert!(name.name.starts_with(&filter), "{len}");
                }
            }
        }
        let a = names.name_of(&"a".repeat(1024));
        let b = names.name_of(&format!("{}b", "a".repeat(1023)));
        assert_ne!(a.name, b.name);
    }

    #[test]
    fn foreign_names_are_not_keys() {
        let names = names();
        assert_eq!(names.key_of("other/app/x", None), None);
        assert_eq!(names.key_of("app/test/bad=ZZ", None), None);
        assert_eq!(names.key_of("app/test/trunc=4", None), None);
        // Escapes that are not UTF-8 are not keys either.
        assert_eq!(names.key_of("app/test/=FF", None), None);
    }

    #[test]
    fn bad_prefixes_are_refused() {
        assert!(matches!(
            Names::new("with space/".into()),
            Err(Error::InvalidInput { .. })
        ));
        assert!(matches!(
            Names::new("p".repeat(MAX_PREFIX_CHARS + 1)),
            Err(Error::TooLarge { .. })
        ));
        let empty = Names::new(String::new()).expect_err("an empty prefix claims every secret");
        assert!(
            matches!(&empty, Error::InvalidInput { .. }) && empty.to_string().contains("my-agent/"),
            "{empty}"
        );
    }
}
