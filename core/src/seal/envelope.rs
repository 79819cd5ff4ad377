//! The sealed envelope: what a sealed value or log record looks like in a
//! backend.
//!
//! ```text
//! key-value record (form 1)            log record (form 2)
//! 0   4  magic FF 'M' 'P' 'S'          0   4  magic
//! 4   1  form = 1                      4   1  form = 2
//! 5   8  key id                        5   8  key id
//! 13  8  expiry, ms since the epoch    13  8  expiry (0: none)
//!        (0: none), big-endian         21  8  writer id
//! 21 12  nonce                         29  8  writer's counter
//! 33  …  ciphertext, 16-byte tag       37 12  nonce
//!                                      49  …  ciphertext, 16-byte tag
//! ```
//!
//! The associated data is everything before the nonce followed by the key
//! (or log name), so the form, key id, expiry, writer position and the name
//! are all authenticated: a ciphertext opens only under the name it was
//! sealed for, and no header field can be changed without the tag failing.
//! A plain-text record is JSON and so never starts with `0xFF`, which no
//! UTF-8 text does.

use aws_lc_rs::aead::{Aad, NONCE_LEN, Nonce};

use super::{KeyId, Keyring, SealProblem};
use crate::Timestamp;

const MAGIC: [u8; 4] = [0xFF, b'M', b'P', b'S'];
const FORM_KV: u8 = 1;
const FORM_LOG: u8 = 2;
const TAG_LEN: usize = 16;
const KV_HEAD: usize = 4 + 1 + KeyId::LEN + 8;
const LOG_HEAD: usize = KV_HEAD + 8 + 8;

/// Bytes a sealed key-value record adds to its value.
pub const KV_OVERHEAD: usize = KV_HEAD + NONCE_LEN + TAG_LEN;
/// Bytes a sealed log record adds to its data.
pub const LOG_OVERHEAD: usize = LOG_HEAD + NONCE_LEN + TAG_LEN;

/// Where a sealed log record's writer put it: a random id per writer (one
/// sealed log store in one process) and that writer's counter, which grows
/// in the order its appends reach the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) writer: [u8; 8],
    pub(crate) counter: u64,
}

/// The readable part of a sealed envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SealInfo {
    /// The key it was sealed with.
    pub key_id: KeyId,
    /// When the writer's TTL runs out (`None`: it had none). For a log
    /// record: the TTL of the append, which the whole log outlives.
    pub expires_at: Option<Timestamp>,
    /// Whether it is a log record (else a key-value record).
    pub log: bool,
    pub(crate) position: Option<Position>,
}

/// What a stored value is.
pub(crate) enum Parsed<'a> {
    /// Not sealed.
    Plain,
    /// Sealed: its header, the associated data prefix, nonce and ciphertext.
    Sealed {
        info: SealInfo,
        head: &'a [u8],
        nonce: [u8; NONCE_LEN],
        body: &'a [u8],
    },
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(b)
}

/// Takes a stored value apart, checking every length before use.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed<'_>, SealProblem> {
    if bytes.first() != Some(&MAGIC[0]) {
        return Ok(Parsed::Plain);
    }
    if bytes.len() < 5 || bytes[..4] != MAGIC {
        return Err(SealProblem::Malformed {
            reason: "starts like a seal but has no envelope".into(),
        });
    }
    let (head_len, log) = match bytes[4] {
        FORM_KV => (KV_HEAD, false),
        FORM_LOG => (LOG_HEAD, true),
        form => return Err(SealProblem::NewerFormat { form }),
    };
    if bytes.len() < head_len + NONCE_LEN + TAG_LEN {
        return Err(SealProblem::Malformed {
            reason: format!("{} bytes, shorter than an empty sealed record", bytes.len()),
        });
    }
    let mut id = [0u8; KeyId::LEN];
    id.copy_from_slice(&bytes[5..5 + KeyId::LEN]);
    let expiry = u64_at(bytes, 13);
    let position = log.then(|| {
        let mut writer = [0u8; 8];
        writer.copy_from_slice(&bytes[21..29]);
        Position {
            writer,
            counter: u64_at(bytes, 29),
        }
    });
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[head_len..head_len + NONCE_LEN]);
    Ok(Parsed::Sealed {
        info: SealInfo {
            key_id: KeyId::from_bytes(id),
            expires_at: (expiry != 0).then(|| Timestamp::from_unix_millis(expiry)),
            log,
            position,
        },
        head: &bytes[..head_len],
        nonce,
        body: &bytes[head_len + NONCE_LEN..],
    })
}

/// The header of a sealed value, or `None` for plain text (or a damaged
/// envelope, whose problem [`Keyring::open`] reports).
pub fn info(bytes: &[u8]) -> Option<SealInfo> {
    match parse(bytes) {
        Ok(Parsed::Sealed { info, .. }) => Some(info),
        _ => None,
    }
}

fn associated_data(head: &[u8], name: &str) -> Vec<u8> {
    let mut ad = Vec::with_capacity(head.len() + name.len());
    ad.extend_from_slice(head);
    ad.extend_from_slice(name.as_bytes());
    ad
}

/// Seals `plain` for the record or log `name` under the ring's active key.
/// `position` is `Some` for a log record.
pub(crate) fn seal(
    ring: &Keyring,
    name: &str,
    plain: &[u8],
    expires_at: Option<Timestamp>,
    position: Option<Position>,
) -> crate::Result<Vec<u8>> {
    let key = ring.active_key();
    let head_len = if position.is_some() {
        LOG_HEAD
    } else {
        KV_HEAD
    };
    let mut out = Vec::with_capacity(head_len + NONCE_LEN + plain.len() + TAG_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(if position.is_some() {
        FORM_LOG
    } else {
        FORM_KV
    });
    out.extend_from_slice(key.id().as_bytes());
    out.extend_from_slice(
        &expires_at
            .map_or(0, |t| t.as_unix_millis().max(1))
            .to_be_bytes(),
    );
    if let Some(p) = position {
        out.extend_from_slice(&p.writer);
        out.extend_from_slice(&p.counter.to_be_bytes());
    }
    let ad = associated_data(&out, name);
    let mut body = Vec::with_capacity(plain.len() + TAG_LEN);
    body.extend_from_slice(plain);
    let nonce = key
        .cipher()
        .seal_in_place_append_tag(Aad::from(&ad[..]), &mut body)
        .map_err(|_| crate::Error::backend("sealing", "AES-256-GCM refused to seal"))?;
    out.extend_from_slice(nonce.as_ref());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Opens a sealed value read from `name`.
pub(crate) fn open(
    ring: &Keyring,
    name: &str,
    info: &SealInfo,
    head: &[u8],
    nonce: [u8; NONCE_LEN],
    body: &[u8],
) -> Result<Vec<u8>, SealProblem> {
    let key = ring.key(info.key_id).ok_or(SealProblem::MissingKey {
        key_id: info.key_id,
    })?;
    let ad = associated_data(head, name);
    let mut buf = body.to_vec();
    let plain_len = key
        .cipher()
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&ad[..]),
            &mut buf,
        )
        .map_err(|_| SealProblem::Unopenable {
            key_id: info.key_id,
        })?
        .len();
    buf.truncate(plain_len);
    Ok(buf)
}
