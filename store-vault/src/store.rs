//! The [`KvStore`] over Secrets Manager calls.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use aws_sdk_secretsmanager::{
    Client,
    primitives::Blob,
    types::{Filter, FilterNameStringType},
};
use mcp_persist_core::{
    Backend, Error, Key, KvEntry, KvStore, PutMode, PutOptions, Result, Version, kit::check_value,
};
use tracing::Instrument;

use crate::{
    BACKEND, Deletion, MAX_VALUE_BYTES, SecretsManagerStore,
    error::{code_of, from_sdk},
    gate::{Coalescer, RateLimiter},
    names::{Names, SecretName},
    stamp::{Kind, Stamp, expiry, now_micros, now_ms},
};

/// The staging label a new version carries until `AWSCURRENT` moves to it.
const PENDING: &str = "MCPPERSIST_PENDING";
const CURRENT: &str = "AWSCURRENT";
/// Placeholder stored for the empty value and tombstones: Secrets Manager
/// refuses an empty secret.
const PLACEHOLDER: &[u8] = &[0];
/// Rounds of read and compare-and-swap one write may lose to concurrent
/// writers before it gives up with `Conflict`.
const MAX_ROUNDS: u32 = 64;

const NOT_FOUND: &str = "ResourceNotFoundException";
const INVALID_REQUEST: &str = "InvalidRequestException";
const INVALID_PARAMETER: &str = "InvalidParameterException";
const EXISTS: &str = "ResourceExistsException";

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) names: Names,
    pub(crate) deletion: Deletion,
    pub(crate) sweep_margin_ms: u64,
    pub(crate) limiter: Option<RateLimiter>,
    pub(crate) coalescer: Coalescer,
}

/// The secret behind a key, as `DescribeSecret` shows it.
enum Current {
    /// No secret of that name.
    Missing,
    /// Scheduled for deletion (within its recovery window).
    Deleted,
    /// The secret, with the id of its `AWSCURRENT` version.
    At(String),
}

/// What the current version means to a precondition.
#[derive(Debug, Clone, Copy)]
enum Live {
    Absent,
    At(Version),
    /// There, but not readable (not written by this store): no caller can
    /// hold its version.
    Unreadable,
}

impl Live {
    fn check(self, key: &str, mode: PutMode) -> Result<()> {
        match self {
            Live::Absent => mode.check(key, None),
            Live::At(version) => mode.check(key, Some(version)),
            Live::Unreadable => match mode {
                PutMode::Overwrite => Ok(()),
                PutMode::Create => Err(Error::AlreadyExists { key: key.into() }),
                PutMode::Update(_) => Err(Error::Conflict { key: key.into() }),
            },
        }
    }
}

/// One write through the compare-and-swap loop.
#[derive(Debug, Clone, Copy)]
enum Op<'a> {
    /// Store `value`, on behalf of `n` coalesced overwrites (versions
    /// `top - n + 1 ..= top` are reserved).
    Put {
        value: &'a [u8],
        mode: PutMode,
        ttl: Option<Duration>,
        n: u64,
    },
    /// Leave a tombstone.
    Delete { if_version: Option<Version> },
}

/// The `AWSCURRENT` version id in a map of version ids to staging labels.
fn current_of(stages: Option<&HashMap<String, Vec<String>>>) -> Option<&str> {
    stages?
        .iter()
        .find(|(_, labels)| labels.iter().any(|l| l == CURRENT))
        .map(|(id, _)| id.as_str())
}

/// A short pause after a lost race, growing with the round, with jitter.
async fn back_off(round: u32) {
    let ceiling = 2u64 << round.min(5);
    let jitter = now_micros() % ceiling.max(1);
    tokio::time::sleep(Duration::from_millis(1 + jitter)).await;
}

impl Inner {
    async fn limit(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.acquire().await;
        }
    }

    async fn describe(&self, name: &str, key: &str) -> Result<Current> {
        match self.client.describe_secret().secret_id(name).send().await {
            Ok(out) if out.deleted_date().is_some() => Ok(Current::Deleted),
            Ok(out) => match current_of(out.version_ids_to_stages()) {
                Some(id) => Ok(Current::At(id.to_owned())),
                None => Err(Error::corrupt(
                    key,
                    "the secret has no AWSCURRENT version; it was not written by mcp-persist",
                )),
            },
            Err(e) if code_of(&e) == Some(NOT_FOUND) => Ok(Current::Missing),
            Err(e) => Err(from_sdk("DescribeSecret", e)),
        }
    }

    async fn restore(&self, name: &str) -> Result<()> {
        self.limit().await;
        match self.client.restore_secret().secret_id(name).send().await {
            Ok(_) => Ok(()),
            // Gone for good, or restored meanwhile: the next round sees which.
            Err(e) if matches!(code_of(&e), Some(NOT_FOUND | INVALID_REQUEST)) => Ok(()),
            Err(e) => Err(from_sdk("RestoreSecret", e)),
        }
    }

    /// Reads and checks a key's live record.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KvEntry>> {
        let name = self.names.name_of(key);
        let out = match self
            .client
            .get_secret_value()
            .secret_id(&name.name)
            // The default, but said explicitly: some stand-ins for the
            // service otherwise answer with the first version ever current.
            .version_stage(CURRENT)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if code_of(&e) == Some(NOT_FOUND) => return Ok(None),
            // Scheduled for deletion: the record is gone.
            Err(e) if code_of(&e) == Some(INVALID_REQUEST) => return Ok(None),
            Err(e) => return Err(from_sdk("GetSecretValue", e)),
        };
        let id = out
            .version_id()
            .ok_or_else(|| Error::corrupt(key, "the secret's version has no id"))?;
        let stamp = Stamp::parse(key, id)?;
        if !stamp.is_live(now_ms()) {
            return Ok(None);
        }
        let value = match stamp.kind {
            Kind::Value => out
                .secret_binary()
                .ok_or_else(|| Error::corrupt(key, "the secret holds no binary value"))?
                .as_ref()
                .to_vec(),
            Kind::Empty | Kind::Tombstone => Vec::new(),
        };
        if !stamp.matches(key, &value) {
            return Err(Error::corrupt(
                key,
                "the value does not match its version stamp (changed outside mcp-persist, or not this key's)",
            ));
        }
        Ok(Some(KvEntry::new(value, Version::new(stamp.counter))))
    }

    /// The compare-and-swap loop of every write: read the current version,
    /// check the precondition, add the new version under a pending label,
    /// then move `AWSCURRENT` to it from the version read. Moving the label
    /// fails if another writer moved it first; then the loop reads again.
    ///
    /// Returns the new version, or `None` for a delete that found nothing.
    async fn write(&self, key: &str, op: Op<'_>) -> Result<Option<Version>> {
        let name = self.names.name_of(key);
        // The stamp of our last attempt: if a round finds it current, an
        // earlier round succeeded even though its answer was lost.
        let mut attempted: Option<(String, Version)> = None;
        for round in 0..MAX_ROUNDS {
            let (live, previous_counter, from) = match self.describe(&name.name, key).await? {
                Current::Missing => (Live::Absent, 0, None),
                Current::Deleted => {
                    if let Op::Delete { if_version } = op {
                        Live::Absent
                            .check(key, if_version.map_or(PutMode::Overwrite, PutMode::Update))?;
                        return Ok(None);
                    }
                    tracing::debug!(key, "restoring a secret scheduled for deletion to write it");
                    self.restore(&name.name).await?;
                    continue;
                }
                Current::At(id) => {
                    if let Some((token, version)) = &attempted
                        && *token == id
                    {
                        return Ok(Some(*version));
                    }
                    match Stamp::parse(key, &id) {
                        Ok(stamp) if stamp.is_live(now_ms()) => (
                            Live::At(Version::new(stamp.counter)),
                            stamp.counter,
                            Some(id),
                        ),
                        Ok(stamp) => (Live::Absent, stamp.counter, Some(id)),
                        Err(e @ Error::NewerSchema { .. }) => return Err(e),
                        Err(_) => (Live::Unreadable, 0, Some(id)),
                    }
                }
            };
            let (value, kind, expires_ms, n) = match op {
                Op::Put {
                    value,
                    mode,
                    ttl,
                    n,
                } => {
                    live.check(key, mode)?;
                    let kind = if value.is_empty() {
                        Kind::Empty
                    } else {
                        Kind::Value
                    };
                    (value, kind, expiry(ttl), n)
                }
                Op::Delete { if_version } => {
                    if let Some(want) = if_version {
                        live.check(key, PutMode::Update(want))?;
                    }
                    if matches!(live, Live::Absent) {
                        return Ok(None);
                    }
                    (&[][..], Kind::Tombstone, 0, 1)
                }
            };
            // Versions increase per key, and never fall below the clock (in
            // 1/1024 microseconds), so they keep increasing after a secret was
            // removed for good. The random low bits keep two writers racing
            // from one version in the same microsecond from writing the same
            // version id: both would take the service's idempotent answer,
            // and the `landed` check after it, as their own success, and one
            // write would be lost.
            let counter = previous_counter
                .saturating_add(n)
                .max(now_micros().saturating_mul(1024))
                .saturating_add(jitter());
            let stamp = Stamp::new(key, counter, expires_ms, kind, value, from.as_deref());
            let token = stamp.id();
            let version = Version::new(counter);
            attempted = Some((token.clone(), version));
            let stored = if kind == Kind::Value {
                value
            } else {
                PLACEHOLDER
            };
            let landed = match from {
                None => self.create(&name, key, &token, stored).await?,
                Some(from) => {
                    // A lost race, or a retried call whose first answer was
                    // lost after it landed: only the versions written since tell.
                    self.swap(&name.name, &from, &token, stored).await?
                        || self.landed(&name.name, &token).await?
                }
            };
            if landed {
                return Ok(Some(version));
            }
            tracing::debug!(key, round, "lost a compare-and-swap race; reading again");
            back_off(round).await;
        }
        tracing::warn!(
            key,
            rounds = MAX_ROUNDS,
            "giving up a write after losing every race"
        );
        Err(Error::Conflict { key: key.into() })
    }

    /// Creates the secret with its first version. `false`: someone else
    /// created it first (or it is scheduled for deletion).
    async fn create(
        &self,
        name: &SecretName,
        key: &str,
        token: &str,
        stored: &[u8],
    ) -> Result<bool> {
        self.limit().await;
        let result = self
            .client
            .create_secret()
            .name(&name.name)
            .client_request_token(token)
            .secret_binary(Blob::new(stored))
            // A hashed name cannot be read back into its key: keep the key
            // where `list` finds it. Keys are identifiers, never secrets.
            .set_description(name.hashed.then(|| key.to_owned()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if matches!(code_of(&e), Some(EXISTS | INVALID_REQUEST)) => Ok(false),
            Err(e) => Err(from_sdk("CreateSecret", e)),
        }
    }

    /// Adds a version and moves `AWSCURRENT` to it from `from`. `false`:
    /// `from` was no longer current (a lost race), or the secret went away.
    async fn swap(&self, name: &str, from: &str, token: &str, stored: &[u8]) -> Result<bool> {
        self.limit().await;
        let put = self
            .client
            .put_secret_value()
            .secret_id(name)
            .client_request_token(token)
            .secret_binary(Blob::new(stored))
            .version_stages(PENDING)
            .send()
            .await;
        match put {
            Ok(_) => {}
            Err(e) if matches!(code_of(&e), Some(NOT_FOUND | INVALID_REQUEST)) => return Ok(false),
            Err(e) => return Err(from_sdk("PutSecretValue", e)),
        }
        self.limit().await;
        let moved = self
            .client
            .update_secret_version_stage()
            .secret_id(name)
            .version_stage(CURRENT)
            .remove_from_version_id(from)
            .move_to_version_id(token)
            .send()
            .await;
        match moved {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    code_of(&e),
                    Some(INVALID_PARAMETER | INVALID_REQUEST | NOT_FOUND)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(from_sdk("UpdateSecretVersionStage", e)),
        }
    }

    /// Whether the version `token` became current at some point: it is
    /// current, or another version names it as its predecessor (see
    /// [`Stamp`]).
    async fn landed(&self, name: &str, token: &str) -> Result<bool> {
        let mut next: Option<String> = None;
        loop {
            let mut request = self
                .client
                .list_secret_version_ids()
                .secret_id(name)
                .include_deprecated(true)
                .max_results(100);
            if let Some(token) = next.take() {
                request = request.next_token(token);
            }
            let out = match request.send().await {
                Ok(out) => out,
                Err(e) if matches!(code_of(&e), Some(NOT_FOUND | INVALID_REQUEST)) => {
                    return Ok(false);
                }
                Err(e) => return Err(from_sdk("ListSecretVersionIds", e)),
            };
            for version in out.versions() {
                let Some(id) = version.version_id() else {
                    continue;
                };
                let current = version.version_stages().iter().any(|s| s == CURRENT);
                if (id == token && current)
                    || Stamp::parse(name, id).is_ok_and(|s| s.follows(token))
                {
                    tracing::debug!("a write whose answer was lost had landed");
                    return Ok(true);
                }
            }
            match out.next_token() {
                Some(token) if !token.is_empty() => next = Some(token.to_owned()),
                _ => return Ok(false),
            }
        }
    }

    /// Every secret of this store whose name may hold a key starting with
    /// `prefix`: (key, name, current version id).
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, String, Option<String>)>> {
        let filter = self.names.list_filter(prefix);
        let mut found = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let mut request = self.client.list_secrets().max_results(100);
            if !filter.is_empty() {
                request = request.filters(
                    Filter::builder()
                        .key(FilterNameStringType::Name)
                        .values(filter.clone())
                        .build(),
                );
            }
            if let Some(token) = next.take() {
                request = request.next_token(token);
            }
            let out = request
                .send()
                .await
                .map_err(|e| from_sdk("ListSecrets", e))?;
            for entry in out.secret_list() {
                let Some(name) = entry.name() else { continue };
                if entry.deleted_date().is_some() {
                    continue;
                }
                // The name filter is a case-insensitive prefix match: keep
                // exactly the keys asked for.
                let Some(key) = self.names.key_of(name, entry.description()) else {
                    continue;
                };
                if !key.starts_with(prefix) {
                    continue;
                }
                let current = current_of(entry.secret_versions_to_stages()).map(str::to_owned);
                found.push((key, name.to_owned(), current));
            }
            match out.next_token() {
                Some(token) if !token.is_empty() => next = Some(token.to_owned()),
                _ => break,
            }
        }
        Ok(found)
    }

    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        let now = now_ms();
        let mut keys: Vec<Key> = self
            .scan(prefix)
            .await?
            .into_iter()
            .filter(|(key, _, current)| match current {
                None => false,
                // A version this build cannot read is still there: `get`
                // reports it as the typed error it is.
                Some(id) => Stamp::parse(key, id).map_or(true, |s| s.is_live(now)),
            })
            // A secret whose name maps to no valid key is not one of ours.
            .filter_map(|(key, _, _)| Key::new(key).ok())
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    pub(crate) async fn sweep(&self) -> Result<u64> {
        let now = now_ms();
        let mut removed = 0;
        for (key, name, current) in self.scan("").await? {
            let Some(id) = current else { continue };
            if !Stamp::parse(&key, &id).is_ok_and(|s| s.sweepable(now, self.sweep_margin_ms)) {
                continue;
            }
            // Read again right before deleting: a write since the scan keeps it.
            match self.describe(&name, &key).await {
                Ok(Current::At(again)) if again == id => {}
                _ => continue,
            }
            self.limit().await;
            let mut request = self.client.delete_secret().secret_id(&name);
            request = match self.deletion {
                Deletion::Immediate => request.force_delete_without_recovery(true),
                Deletion::RecoveryWindowDays(days) => {
                    request.recovery_window_in_days(i64::from(days))
                }
            };
            match request.send().await {
                Ok(_) => {}
                Err(e) if code_of(&e) == Some(NOT_FOUND) => continue,
                Err(e) => return Err(from_sdk("DeleteSecret", e)),
            }
            if let Deletion::RecoveryWindowDays(_) = self.deletion {
                // A write that slipped in between the check and the delete
                // is live: undo the deletion, which the recovery window allows.
                let described = self.client.describe_secret().secret_id(&name).send().await;
                if let Ok(out) = described
                    && current_of(out.version_ids_to_stages()) != Some(id.as_str())
                {
                    tracing::info!(key, "a write raced the sweep; restoring the secret");
                    self.restore(&name).await?;
                    continue;
                }
            }
            tracing::debug!(key, "removed an expired or deleted secret");
            removed += 1;
        }
        Ok(removed)
    }
}

#[async_trait]
impl Backend for SecretsManagerStore {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Removes the secrets of expired and deleted records from the service,
    /// with or without a recovery window (see [`Deletion`]).
    async fn sweep_expired(&self) -> Result<u64> {
        self.inner
            .sweep()
            .instrument(tracing::debug_span!("secrets_manager.sweep"))
            .await
    }
}

#[async_trait]
impl KvStore for SecretsManagerStore {
    /// 64 KiB, the service's limit for one secret value. The version stamp
    /// lives in the version id, so the whole limit is the caller's.
    fn max_value_bytes(&self) -> usize {
        MAX_VALUE_BYTES
    }

    async fn get(&self, key: &Key) -> Result<Option<KvEntry>> {
        let key = key.as_str();
        let span = tracing::debug_span!(
            "secrets_manager.get",
            kind = mcp_persist_core::telemetry::kind_of_key(key)
        );
        self.inner.get(key).instrument(span).await
    }

    async fn put(&self, key: &Key, value: Vec<u8>, options: PutOptions) -> Result<Version> {
        let PutOptions { mode, ttl, .. } = options;
        let key = key.as_str();
        check_value(&value, MAX_VALUE_BYTES)?;
        let span = tracing::debug_span!(
            "secrets_manager.put",
            kind = mcp_persist_core::telemetry::kind_of_key(key),
            ?mode,
            bytes = value.len()
        );
        let inner = &self.inner;
        // A put never finds "nothing to do"; `None` is for deletes only.
        let write = |value: Vec<u8>, mode: PutMode, ttl: Option<Duration>, n: u64| async move {
            let op = Op::Put {
                value: &value,
                mode,
                ttl,
                n,
            };
            inner
                .write(key, op)
                .await?
                .ok_or_else(|| Error::Conflict { key: key.into() })
        };
        async move {
            if mode == PutMode::Overwrite {
                inner
                    .coalescer
                    .overwrite(key, value, ttl, |value, ttl, n| {
                        write(value, PutMode::Overwrite, ttl, n)
                    })
                    .await
            } else {
                write(value, mode, ttl, 1).await
            }
        }
        .instrument(span)
        .await
    }

    async fn delete(&self, key: &Key, if_version: Option<Version>) -> Result<bool> {
        let key = key.as_str();
        let span = tracing::debug_span!(
            "secrets_manager.delete",
            kind = mcp_persist_core::telemetry::kind_of_key(key),
            ?if_version
        );
        let deleted = self
            .inner
            .write(key, Op::Delete { if_version })
            .instrument(span)
            .await?;
        Ok(deleted.is_some())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Key>> {
        self.inner
            .list(prefix)
            .instrument(tracing::debug_span!("secrets_manager.list", prefix))
            .await
    }
}

/// A random number below 1024, added to a new version's counter (see
/// `Inner::write`).
fn jitter() -> u64 {
    let mut bytes = [0u8; 2];
    // Without randomness (never seen), the clock alone still separates
    // writers but in the same microsecond.
    let _ = getrandom::fill(&mut bytes);
    u64::from(u16::from_le_bytes(bytes) & 0x3ff)
}
