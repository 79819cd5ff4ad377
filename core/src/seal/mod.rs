//! Sealing: encryption at rest on every backend, with keys rotated while
//! servers and clients run.
//!
//! A [`Sealed`] store wraps any backend ([`KvStore`](crate::KvStore),
//! [`LogStore`](crate::LogStore) or both) and seals record values with
//! AES-256-GCM before they reach it; [`Stores::encrypted`](crate::Stores::encrypted)
//! puts every backend of a bundle behind one. The backend only ever sees
//! ciphertext, so a backup, a Redis `MONITOR` or read access to a volume no
//! longer gives away a refresh token.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use mcp_persist_core::{seal::{Keyring, SealKey, Sealing}, *};
//!
//! let (key, _text) = SealKey::generate()?; // in production: Keyring::parse / a KeySource
//! let backend = MemoryStore::new();
//! let stores = Stores::new(backend.clone()).encrypted(Keyring::new(key));
//!
//! let creds = Credentials::new(
//!     CredentialKey::new("https://as.example", "https://mcp.example/mcp")?,
//!     Secret::new("token-text"),
//!     ClientRegistration::new("client-1"),
//! );
//! stores.credentials().save(&creds).await?;
//! // The application reads it back as usual...
//! let loaded = stores.credentials().load(&creds.key).await?.expect("stored");
//! assert_eq!(loaded.record.access_token.expose_secret(), "token-text");
//! // ...while the backend holds ciphertext under a readable key.
//! let keys = backend.list("cred/").await?;
//! let raw = backend.get(&keys[0]).await?.expect("stored").value;
//! assert!(!String::from_utf8_lossy(&raw).contains("token-text"));
//! # Ok::<_, Error>(()) }).unwrap();
//! ```
//!
//! # What is sealed
//!
//! * By default ([`Scope::Secrets`]), every record whose
//!   [declaration](crate::declare) names secret fields: credentials,
//!   pending authorizations (PKCE verifiers), shared key rings, event
//!   stream tokens; and any record under a key no declaration knows (it
//!   might hold anything).
//! * With [`Sealing::seal_everything`], every record and log record:
//!   sessions, events, tasks, client state, the bus.
//! * Never: liveness and refresh leases (random holder ids and times).
//!   Their holders judge each other by the record's version, so
//!   [`rekey`](Rekey) must not rewrite them, and they hold nothing to hide.
//!
//! Keys and log names stay readable: `ls`, `gc` and expiry sweeps work
//! without the keyring. Versions, compare-and-swap and TTL are the
//! backend's, untouched: the wrapper transforms values only, and its
//! [`max_value_bytes`](crate::KvStore::max_value_bytes) is the backend's
//! less [`KV_OVERHEAD`] (log records: [`LOG_OVERHEAD`]).
//!
//! # The envelope
//!
//! A sealed value is a small versioned envelope (magic, form, [`KeyId`],
//! the writer's expiry instant, a fresh nonce drawn by AWS-LC for every
//! write, the ciphertext and its tag; layout in the source of
//! `envelope.rs`). The associated data is the header and the record's
//! **key**, or for a log record the **log name** and the writer's
//! position. So a ciphertext copied onto another key, another session's
//! record or another log does not open: [`Error::Sealing`] naming the
//! record, with [`SealProblem::Unopenable`].
//!
//! ## Positions within a log
//!
//! A log's sequence numbers are given by the backend at append time, after
//! the record is sealed, so they cannot be in the associated data. Instead
//! each sealed log store (one per process and bundle) is a *writer* with a
//! random 64-bit id and a counter; its appends to one log are serialized,
//! so its counter grows in the order its records reach the log, and every
//! record carries (writer, counter) under the tag. A read checks that,
//! among the records it returns, each writer's counters strictly increase.
//!
//! What a swap of two records within one log does, exactly:
//!
//! * two records of **one writer**, read together (a replay, a tail that
//!   returns both): the read fails with [`SealProblem::OutOfOrder`] naming
//!   the later record; a record duplicated within the log, likewise;
//! * two records of **different writers** (two server instances appending
//!   to the bus), or a read that returns only one of them: not detected.
//!   Each still opens, as a genuine record of this log. Someone able to
//!   rewrite the backend can reorder records of different writers within
//!   one log; never move one to another log or key, alter one, or forge one.
//!
//! # Keys and rotation
//!
//! A [`Keyring`] holds one active key, which seals every write, and old
//! keys, which still open what they sealed. Keys come from a
//! [`KeySource`]: an [environment variable](EnvKeys), a [file](FileKeys),
//! or AWS Secrets Manager (`mcp-persist-store-vault`). Key ids are derived
//! from the keys. Keys never reach a log line, an error or `Debug`, and
//! are zeroed when dropped.
//!
//! Rotating without downtime:
//!
//! 1. Add the new key to every process's ring as an **old** key (readers
//!    first), through [`Sealing::set_keyring`], [`Sealing::reload`] or
//!    [`Sealing::reload_every`], or a rolling restart.
//! 2. Make it the **active** key everywhere, keeping the former one as old.
//! 3. Run [`Rekey`] (`mcp-persist rekey`): it re-seals every key-value
//!    record under the active key with compare-and-swap while the fleet
//!    runs, and reports the log records still under old keys and when
//!    their logs expire.
//! 4. When [`check`] finds nothing under the old key (logs expired), drop
//!    it from the ring ([`Keyring::without`]).
//!
//! AES-GCM with random 96-bit nonces is safe for about 2³² writes under
//! one key; rotate well before that.
//!
//! # Turning it on for an existing store
//!
//! Reads accept plain-text records (written before sealing was on) as they
//! are, and every write seals. [`Rekey`] seals what is still plain, then
//! [`Sealing::refuse_plaintext`] makes a plain-text record an error
//! ([`SealProblem::Plaintext`]) instead of being believed.
//!
//! Rekey replaces records; it cannot scrub the plain bytes a backend may
//! still keep of their former values in its free space: SQLite's free pages
//! and write-ahead log, Redis's append-only file, file-system blocks, and
//! any backup taken before. After turning sealing on for a store that held
//! secrets, compact it (SQLite `VACUUM` after a checkpoint, Redis
//! `BGREWRITEAOF`) and retire older backups.
//!
//! # Errors
//!
//! Every failure to open is [`Error::Sealing`] with the record's name (a
//! key, or `<log>#<seq>`) and a [`SealProblem`] that says what to do: the
//! key id a record needs and the ring lacks, a record altered or moved, a
//! plain-text record refused, a damaged envelope. Nothing is changed on
//! the way. It is a variant of its own, not [`Error::Corrupt`]: callers
//! that start afresh over a damaged record (a client's stored session, say)
//! do not do so over a record that only lacks its key.

mod envelope;
mod key;
mod rekey;
mod source;
mod store;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;

use std::{
    fmt,
    sync::{Arc, RwLock},
    time::Duration,
};

pub use envelope::{KV_OVERHEAD, LOG_OVERHEAD, SealInfo, info};
pub use key::{KEY_BYTES, KeyId, Keyring, SealKey};
pub use rekey::{
    Check, LogFinding, RecordState, Rekey, RekeyOptions, RekeyProgress, RekeyReport, check,
};
pub use source::{EnvKeys, FileKeys, KeySource};
pub use store::Sealed;

use crate::{
    Error, Result,
    declare::{self, Lifetime, Space},
};

/// Which records a [`Sealing`] seals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Scope {
    /// Records whose declaration names secret fields, and undeclared keys.
    #[default]
    Secrets,
    /// Every record and log record (but leases, see the [module docs](self)).
    Everything,
}

/// Why a sealed record could not be opened; the `problem` of
/// [`Error::Sealing`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealProblem {
    /// The record is sealed with a key the keyring does not hold.
    #[error(
        "is sealed with key {key_id}, which the keyring does not hold; add that key to the keyring (as an old key) to read it"
    )]
    MissingKey {
        /// The key it needs.
        key_id: KeyId,
    },
    /// The tag does not verify: the record was altered, or copied here from
    /// another key, session or log.
    #[error(
        "does not open under key {key_id}: it was altered, or copied here from another record or log"
    )]
    Unopenable {
        /// The key its envelope names.
        key_id: KeyId,
    },
    /// A log record comes before an earlier record of the same writer: records
    /// were swapped or duplicated within the log.
    #[error("is out of its writer's order in the log: records were swapped or copied within it")]
    OutOfOrder {
        /// The key it was sealed with.
        key_id: KeyId,
    },
    /// A plain-text record where [`Sealing::refuse_plaintext`] refuses them.
    #[error(
        "is stored in plain text, which this store refuses; seal it with `mcp-persist rekey`, or allow plain text until every record is sealed"
    )]
    Plaintext,
    /// The envelope is damaged.
    #[error("has a damaged seal envelope: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The envelope is of a form this build does not know.
    #[error("is sealed in envelope form {form}, newer than this build knows; upgrade mcp-persist")]
    NewerFormat {
        /// The form found.
        form: u8,
    },
}

impl SealProblem {
    /// The [`Error::Sealing`] of the record `name`.
    pub(crate) fn at(self, name: impl Into<String>) -> Error {
        Error::Sealing {
            key: name.into(),
            problem: self,
        }
    }
}

/// What a store is sealed with: a shared, replaceable [`Keyring`] and the
/// rules of what to seal.
///
/// Clones share the keyring: [`set_keyring`](Sealing::set_keyring) on any
/// clone changes the keys of every store sealed with it, at once, without
/// a restart. `Debug` shows key ids only.
///
/// ```
/// use mcp_persist_core::seal::{Keyring, Scope, SealKey, Sealing};
/// let (k1, _) = SealKey::generate()?;
/// let (k2, _) = SealKey::generate()?;
/// let id2 = k2.id();
/// let sealing = Sealing::new(Keyring::new(k1)).seal_everything();
/// assert_eq!(sealing.scope(), Scope::Everything);
/// let shared = sealing.clone();
/// shared.set_keyring(sealing.keyring().rotated(k2));
/// assert_eq!(sealing.keyring().active(), id2);
/// # Ok::<_, mcp_persist_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Sealing {
    keyring: Arc<RwLock<Arc<Keyring>>>,
    scope: Scope,
    refuse_plaintext: bool,
}

impl fmt::Debug for Sealing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealing")
            .field("keyring", &self.keyring())
            .field("scope", &self.scope)
            .field("refuse_plaintext", &self.refuse_plaintext)
            .finish()
    }
}

impl From<Keyring> for Sealing {
    fn from(keyring: Keyring) -> Self {
        Sealing::new(keyring)
    }
}

impl Sealing {
    /// Seals with `keyring`, records with secrets only, plain text accepted.
    pub fn new(keyring: Keyring) -> Sealing {
        Sealing {
            keyring: Arc::new(RwLock::new(Arc::new(keyring))),
            scope: Scope::Secrets,
            refuse_plaintext: false,
        }
    }

    /// Seals every record (sessions, events, tasks, client state too).
    pub fn seal_everything(mut self) -> Sealing {
        self.scope = Scope::Everything;
        self
    }

    /// Makes a plain-text record that this scope would seal an error
    /// ([`SealProblem::Plaintext`]) instead of a value: once [`Rekey`] has
    /// sealed every record, this stops believing records written by
    /// whoever can write to the backend without the key.
    pub fn refuse_plaintext(mut self) -> Sealing {
        self.refuse_plaintext = true;
        self
    }

    /// Which records are sealed.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Whether plain-text records are refused.
    pub fn refuses_plaintext(&self) -> bool {
        self.refuse_plaintext
    }

    /// The keyring now in use.
    pub fn keyring(&self) -> Keyring {
        (*self.current()).clone()
    }

    /// The keyring in use, shared: what every operation reads once.
    pub(crate) fn current(&self) -> Arc<Keyring> {
        self.keyring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the keyring of every store sealed with this (or a clone):
    /// later writes seal with its active key, later reads open with any of
    /// its keys.
    pub fn set_keyring(&self, keyring: Keyring) {
        tracing::info!(active = %keyring.active(), keys = keyring.ids().len(), "sealing keyring replaced");
        *self.keyring.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keyring);
    }

    /// Loads the keyring from `source` and puts it in use; on an error the
    /// keyring in use stays. Returns the new active key's id.
    pub async fn reload(&self, source: &dyn KeySource) -> Result<KeyId> {
        let ring = source.load().await?;
        let active = ring.active();
        if self.keyring().ids() != ring.ids() {
            self.set_keyring(ring);
        }
        Ok(active)
    }

    /// Reloads the keyring from `source` every `period` in a background
    /// task (abort the handle to stop): a rotation done where the keys are
    /// kept reaches this process within a period, without a restart. A
    /// failed load is logged and the keyring in use stays.
    pub fn reload_every(
        &self,
        source: Arc<dyn KeySource>,
        period: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let sealing = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if let Err(e) = sealing.reload(&*source).await {
                    tracing::warn!(source = %source.describe(), error = %e, "reloading the sealing keyring failed; keeping the keys in use");
                }
            }
        })
    }

    /// Whether a record of `space` named `name` is sealed when written.
    pub fn seals(&self, space: Space, name: &str) -> bool {
        match declare::of_key_in(space, name) {
            Some(d) if d.lifetime == Lifetime::Transient => false,
            Some(d) => self.scope == Scope::Everything || !d.secret_fields.is_empty(),
            None => true,
        }
    }

    /// Opens a value as read from the backend: sealed values are opened,
    /// plain text is returned as it is (or refused, see
    /// [`refuse_plaintext`](Sealing::refuse_plaintext)). `name` is the key,
    /// or the log's name for a log record; `label` names the record in
    /// errors.
    pub(crate) fn open_value(
        &self,
        ring: &Keyring,
        space: Space,
        name: &str,
        label: impl FnOnce() -> String,
        bytes: Vec<u8>,
    ) -> Result<(Vec<u8>, Option<SealInfo>)> {
        match envelope::parse(&bytes) {
            Ok(envelope::Parsed::Plain) => {
                if self.refuse_plaintext && self.seals(space, name) {
                    return Err(SealProblem::Plaintext.at(label()));
                }
                Ok((bytes, None))
            }
            Ok(envelope::Parsed::Sealed {
                info,
                head,
                nonce,
                body,
            }) => {
                if info.log != (space == Space::Log) {
                    return Err(SealProblem::Unopenable {
                        key_id: info.key_id,
                    }
                    .at(label()));
                }
                match envelope::open(ring, name, &info, head, nonce, body) {
                    Ok(plain) => Ok((plain, Some(info))),
                    Err(problem) => {
                        let label = label();
                        if let SealProblem::MissingKey { key_id } = &problem {
                            tracing::warn!(record = %label, %key_id, "a sealed record needs a key the keyring does not hold");
                        }
                        Err(problem.at(label))
                    }
                }
            }
            Err(problem) => Err(problem.at(label())),
        }
    }
}

impl Keyring {
    /// Opens `bytes` as read from the key-value record `key` (for tools such
    /// as `mcp-persist show`): a sealed value is opened, plain text is
    /// returned as it is. A log record opens with [`Keyring::open_log_record`].
    ///
    /// ```
    /// use mcp_persist_core::{Error, MemoryStore, KvStore, PutOptions, seal::{self, *}};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let (key, _) = SealKey::generate()?;
    /// let ring = Keyring::new(key);
    /// let raw = MemoryStore::new();
    /// let sealed = Sealed::wrap(raw.clone(), Sealing::new(ring.clone()));
    /// let k = mcp_persist_core::Key::new("notes/1")?;
    /// sealed.put(&k, b"hello".to_vec(), PutOptions::default()).await?;
    /// let stored = raw.get(&k).await?.expect("stored").value;
    /// assert_eq!(seal::info(&stored).map(|i| i.key_id), Some(ring.active()));
    /// assert_eq!(ring.open("notes/1", &stored)?, b"hello");
    /// // Under another name it does not open.
    /// assert!(matches!(ring.open("notes/2", &stored),
    ///     Err(Error::Sealing { problem: SealProblem::Unopenable { .. }, .. })));
    /// # Ok::<_, Error>(()) }).unwrap();
    /// ```
    pub fn open(&self, key: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        self.open_in(Space::Kv, key, key, bytes)
    }

    /// Opens `bytes` read from record `seq` of log `log`.
    pub fn open_log_record(&self, log: &str, seq: u64, bytes: &[u8]) -> Result<Vec<u8>> {
        self.open_in(Space::Log, log, &format!("{log}#{seq}"), bytes)
    }

    fn open_in(&self, space: Space, name: &str, label: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        let reader = Sealing::new(self.clone());
        reader
            .open_value(self, space, name, || label.to_owned(), bytes.to_vec())
            .map(|(plain, _)| plain)
    }
}
