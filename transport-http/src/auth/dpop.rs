//! DPoP (RFC 9449): the client's key pair, its proofs, and the nonces
//! servers hand out.
//!
//! One ES256 key pair per issuer and resource, generated here with AWS-LC
//! and stored through core's [`AuthStore`](mcp_persist_core::AuthStore)
//! (sealed at rest when the store encrypts). A proof is a compact JWS signed
//! with it: header `typ: dpop+jwt`, `alg: ES256` and the public `jwk`;
//! claims `jti` (fresh for every proof), `htm`, `htu` (the URL without query
//! or fragment), `iat`, and with an access token `ath` (its SHA-256), with a
//! server's `nonce` when it asked for one.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
};

use aws_lc_rs::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair},
};
use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use mcp_persist_core::{CredentialKey, DpopKey, Secret, Timestamp};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The one proof algorithm this client signs with.
pub(crate) const ES256: &str = "ES256";

/// Why a stored DPoP key cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DpopKeyProblem {
    /// No key is stored, while credentials bound to one are.
    Missing,
    /// The record cannot be read (damaged, sealed with a key the keyring no
    /// longer holds, written by a newer version).
    Unreadable,
    /// The record reads, but its private key does not parse or does not
    /// match its public key and thumbprint.
    Invalid,
    /// The record names an algorithm this version cannot sign with.
    Unsupported,
}

impl fmt::Display for DpopKeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DpopKeyProblem::Missing => "is missing",
            DpopKeyProblem::Unreadable => "cannot be read",
            DpopKeyProblem::Invalid => "is not a valid key pair",
            DpopKeyProblem::Unsupported => "uses an algorithm this version cannot sign with",
        })
    }
}

impl std::error::Error for DpopKeyProblem {}

/// A DPoP key pair ready to sign proofs. `Debug` shows only the thumbprint.
pub(crate) struct DpopSigner {
    pair: EcdsaKeyPair,
    jwk: Value,
    thumbprint: String,
}

impl fmt::Debug for DpopSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DpopSigner")
            .field("jkt", &self.thumbprint)
            .finish()
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The public JWK of an uncompressed P-256 point (`0x04 || x || y`).
fn public_jwk(point: &[u8]) -> Option<Value> {
    if point.len() != 65 || point[0] != 4 {
        return None;
    }
    Some(json!({
        "kty": "EC",
        "crv": "P-256",
        "x": b64(&point[1..33]),
        "y": b64(&point[33..]),
    }))
}

/// The RFC 7638 SHA-256 thumbprint of an EC public JWK, base64url.
pub(crate) fn thumbprint(jwk: &Value) -> Option<String> {
    let member = |name: &str| jwk.get(name).and_then(Value::as_str);
    // The required members in lexicographic order, no whitespace.
    let canonical = format!(
        r#"{{"crv":"{}","kty":"{}","x":"{}","y":"{}"}}"#,
        member("crv")?,
        member("kty")?,
        member("x")?,
        member("y")?
    );
    Some(b64(&Sha256::digest(canonical.as_bytes())))
}

/// The `ath` of an access token: its SHA-256, base64url.
pub(crate) fn access_token_hash(token: &str) -> String {
    b64(&Sha256::digest(token.as_bytes()))
}

/// The `htu` of a request URL: the URL without query and fragment.
pub(crate) fn htu(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// The origin a nonce belongs to (scheme, host and port).
pub(crate) fn origin(url: &reqwest::Url) -> String {
    url.origin().ascii_serialization()
}

impl DpopSigner {
    /// A new ES256 key pair for `key`, and its record to store.
    pub(crate) fn generate(key: &CredentialKey) -> Result<(Self, DpopKey), DpopKeyProblem> {
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING)
            .map_err(|_| DpopKeyProblem::Invalid)?;
        let pkcs8 = pair.to_pkcs8v1().map_err(|_| DpopKeyProblem::Invalid)?;
        let jwk = public_jwk(pair.public_key().as_ref()).ok_or(DpopKeyProblem::Invalid)?;
        let thumbprint = thumbprint(&jwk).ok_or(DpopKeyProblem::Invalid)?;
        let record = DpopKey::new(
            key.clone(),
            ES256,
            Secret::new(b64(pkcs8.as_ref())),
            jwk.clone(),
            thumbprint.clone(),
        );
        Ok((
            DpopSigner {
                pair,
                jwk,
                thumbprint,
            },
            record,
        ))
    }

    /// The signer of a stored key pair, after checking that its private key
    /// parses and matches the stored public key and thumbprint.
    pub(crate) fn from_record(record: &DpopKey) -> Result<Self, DpopKeyProblem> {
        if record.algorithm != ES256 {
            return Err(DpopKeyProblem::Unsupported);
        }
        let der = URL_SAFE_NO_PAD
            .decode(record.private_key.expose_secret())
            .map_err(|_| DpopKeyProblem::Invalid)?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der)
            .map_err(|_| DpopKeyProblem::Invalid)?;
        let jwk = public_jwk(pair.public_key().as_ref()).ok_or(DpopKeyProblem::Invalid)?;
        let jkt = thumbprint(&jwk).ok_or(DpopKeyProblem::Invalid)?;
        if jkt != record.thumbprint || thumbprint(&record.public_jwk).as_ref() != Some(&jkt) {
            return Err(DpopKeyProblem::Invalid);
        }
        Ok(DpopSigner {
            pair,
            jwk,
            thumbprint: jkt,
        })
    }

    /// The key's RFC 7638 thumbprint (the `jkt` bound tokens carry).
    pub(crate) fn thumbprint(&self) -> &str {
        &self.thumbprint
    }

    /// A fresh proof for a `method` request to `url`, presenting
    /// `access_token` when given, with the server's `nonce` when it asked
    /// for one.
    pub(crate) fn proof(
        &self,
        method: &str,
        url: &reqwest::Url,
        access_token: Option<&str>,
        nonce: Option<&str>,
    ) -> Result<Secret, DpopKeyProblem> {
        let mut jti = [0u8; 16];
        getrandom::fill(&mut jti).map_err(|_| DpopKeyProblem::Invalid)?;
        let header = json!({"typ": "dpop+jwt", "alg": ES256, "jwk": self.jwk});
        let mut claims = json!({
            "jti": b64(&jti),
            "htm": method,
            "htu": htu(url),
            "iat": Timestamp::now().as_unix_millis() / 1000,
        });
        if let Some(token) = access_token {
            claims["ath"] = Value::String(access_token_hash(token));
        }
        if let Some(nonce) = nonce {
            claims["nonce"] = Value::String(nonce.to_owned());
        }
        let signing_input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(|_| DpopKeyProblem::Invalid)?;
        Ok(Secret::new(format!(
            "{signing_input}.{}",
            b64(signature.as_ref())
        )))
    }
}

/// The latest `DPoP-Nonce` each origin handed out, shared by the clones of
/// one client. Nonces live in memory: servers rotate them often, and a
/// restarted process learns the current one from its first answer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Nonces(Arc<Mutex<HashMap<String, String>>>);

impl Nonces {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The nonce last handed out by the origin of `url`.
    pub(crate) fn get(&self, url: &reqwest::Url) -> Option<String> {
        self.map().get(&origin(url)).cloned()
    }

    /// Keeps the `DPoP-Nonce` of a response from the origin of `url`;
    /// whether it carried one.
    pub(crate) fn remember(&self, url: &reqwest::Url, headers: &http::HeaderMap) -> bool {
        let Some(nonce) = headers
            .get("dpop-nonce")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        else {
            return false;
        };
        self.map().insert(origin(url), nonce.to_owned());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(part: &str) -> Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).expect("JSON")
    }

    #[test]
    fn proofs_verify_with_the_stored_public_key_and_carry_the_claims() {
        let key = CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap();
        let (signer, record) = DpopSigner::generate(&key).unwrap();
        let again = DpopSigner::from_record(&record).unwrap();
        assert_eq!(again.thumbprint(), record.thumbprint);
        assert!(!format!("{record:?} {again:?}").contains(record.private_key.expose_secret()));
        let url = reqwest::Url::parse("https://mcp.example/mcp?x=1#f").unwrap();
        let proof = signer.proof("POST", &url, Some("AT"), Some("n-1")).unwrap();
        let parts: Vec<&str> = proof.expose_secret().split('.').collect();
        assert_eq!(parts.len(), 3);
        let header = decode(parts[0]);
        assert_eq!(header["typ"], "dpop+jwt");
        assert!(header["jwk"].get("d").is_none(), "no private member");
        assert_eq!(
            thumbprint(&header["jwk"]).as_deref(),
            Some(signer.thumbprint())
        );
        let claims = decode(parts[1]);
        assert_eq!(claims["htu"], "https://mcp.example/mcp");
        assert_eq!(claims["htm"], "POST");
        assert_eq!(claims["nonce"], "n-1");
        assert_eq!(claims["ath"], access_token_hash("AT"));
        let point = [
            &[4u8][..],
            &URL_SAFE_NO_PAD
                .decode(header["jwk"]["x"].as_str().unwrap())
                .unwrap(),
            &URL_SAFE_NO_PAD
                .decode(header["jwk"]["y"].as_str().unwrap())
                .unwrap(),
        ]
        .concat();
        let public = aws_lc_rs::signature::UnparsedPublicKey::new(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
            point,
        );
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        public
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("the proof verifies");
        let other = signer.proof("POST", &url, None, None).unwrap();
        assert_ne!(
            decode(other.expose_secret().split('.').nth(1).unwrap())["jti"],
            claims["jti"]
        );
    }

    #[test]
    fn a_record_whose_halves_disagree_is_refused() {
        let key = CredentialKey::new("https://as.example", "https://mcp.example/mcp").unwrap();
        let (_, mut record) = DpopSigner::generate(&key).unwrap();
        let (_, other) = DpopSigner::generate(&key).unwrap();
        record.thumbprint = other.thumbprint.clone();
        assert_eq!(
            DpopSigner::from_record(&record).err(),
            Some(DpopKeyProblem::Invalid)
        );
        let (_, mut garbage) = DpopSigner::generate(&key).unwrap();
        garbage.private_key = Secret::new("not a key");
        assert_eq!(
            DpopSigner::from_record(&garbage).err(),
            Some(DpopKeyProblem::Invalid)
        );
        let (_, mut foreign) = DpopSigner::generate(&key).unwrap();
        foreign.algorithm = "EdDSA".into();
        assert_eq!(
            DpopSigner::from_record(&foreign).err(),
            Some(DpopKeyProblem::Unsupported)
        );
    }
}
