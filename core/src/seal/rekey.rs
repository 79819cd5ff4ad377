//! Re-sealing under the active key ([`Rekey`]) and finding what is sealed
//! with which key ([`check`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use tracing::{debug, info, warn};

use super::{
    KeyId, Keyring, SealProblem, Sealed, Sealing,
    envelope::{self, Parsed},
};
use crate::{
    AuthStore, CredentialKey, Error, Key, KvStore, LogStore, PutMode, PutOptions, Result,
    Timestamp,
    declare::{self, Lifetime, Space},
    kit,
    retry::Backoff,
};

/// How many times one record is read again after a concurrent write won
/// its compare-and-swap, before it is left for a later run.
const ATTEMPTS: usize = 16;

/// How a [`Rekey`] runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RekeyOptions {
    /// Skip every key up to and including this one: the
    /// [`last_key`](RekeyReport::last_key) of an interrupted run, to resume
    /// without even reading what it did. (A run from the start also
    /// resumes: records already under the active key are only read.)
    pub start_after: Option<Key>,
    /// The refresh lease TTL of the clients sharing the store (30 s by
    /// default): rekey takes a credential's refresh lease before re-sealing
    /// it, and takes over one left unchanged this long, as a client would.
    pub lease_ttl: Duration,
    /// Log records read at once.
    pub page: usize,
}

impl Default for RekeyOptions {
    fn default() -> Self {
        RekeyOptions {
            start_after: None,
            lease_ttl: Duration::from_secs(30),
            page: 512,
        }
    }
}

impl RekeyOptions {
    /// Resumes after `key`.
    pub fn start_after(mut self, key: Option<Key>) -> Self {
        self.start_after = key;
        self
    }

    /// Sets the refresh lease TTL.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }
}

/// What became of one key-value record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Already sealed under the active key.
    Current,
    /// Re-sealed under the active key; it was under `from`.
    Resealed {
        /// The key it was sealed with.
        from: KeyId,
    },
    /// Sealed under the active key; it was plain text.
    SealedPlaintext,
    /// Plain text of a kind this scope leaves plain (leases always).
    PlainByScope,
    /// Plain text of a kind with a TTL that a plain record does not tell:
    /// left as it is, to expire or to be sealed by its next write.
    PlainUntilExpiry,
    /// Deleted or expired meanwhile.
    Gone,
    /// A client was refreshing it, or writers kept winning its
    /// compare-and-swap: left for a later run.
    Busy,
    /// Cannot be opened: its key is not in the ring, or it is damaged.
    Unreadable(SealProblem),
}

/// The state of one log: records per key, and plain ones.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogFinding {
    /// The log's name.
    pub log: Key,
    /// Records in it.
    pub records: u64,
    /// Sealed records per key id.
    pub by_key: BTreeMap<KeyId, u64>,
    /// Plain-text records of a log this scope seals.
    pub plain: u64,
    /// When the log expires unless appended to again, as its last record
    /// says (`None`: unknown, or no TTL).
    pub expires_at: Option<Timestamp>,
}

/// Progress of a [`Rekey`] or a [`check`], after each record and each log.
#[derive(Debug)]
#[non_exhaustive]
pub struct RekeyProgress<'a> {
    /// Records and logs done so far.
    pub done: usize,
    /// Records and logs to do in all.
    pub total: usize,
    /// The key or log just done.
    pub name: &'a Key,
    /// What became of it, for a record (`None` for a log).
    pub state: Option<&'a RecordState>,
}

/// What a [`Rekey`] did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RekeyReport {
    /// Key-value records looked at.
    pub records: usize,
    /// Records re-sealed from an old key.
    pub resealed: usize,
    /// Plain-text records sealed.
    pub sealed_plaintext: usize,
    /// Records already under the active key.
    pub current: usize,
    /// Plain-text records of kinds this scope leaves plain.
    pub plain_by_scope: usize,
    /// Plain-text records left to expire (see [`RecordState::PlainUntilExpiry`]).
    pub plain_until_expiry: Vec<Key>,
    /// Records left for a later run (see [`RecordState::Busy`]).
    pub busy: Vec<Key>,
    /// Records that do not open, and why.
    pub unreadable: Vec<(Key, SealProblem)>,
    /// Logs holding records not under the active key. Logs are append-only,
    /// so they are not re-sealed: their old records go when the log expires
    /// or is trimmed, and the old key must stay in the ring until then.
    pub logs: Vec<LogFinding>,
    /// The last key done, to resume after with
    /// [`RekeyOptions::start_after`].
    pub last_key: Option<Key>,
}

impl RekeyReport {
    /// Whether every key-value record that this scope seals is now under the
    /// active key (logs aside): nothing busy, unreadable, or left plain.
    pub fn is_complete(&self) -> bool {
        self.busy.is_empty() && self.unreadable.is_empty() && self.plain_until_expiry.is_empty()
    }

    /// The latest instant until which a log may still hold records under an
    /// old key, if any log does and says (see [`LogFinding::expires_at`]).
    pub fn old_keys_needed_until(&self) -> Option<Timestamp> {
        self.logs.iter().filter_map(|l| l.expires_at).max()
    }
}

/// Re-seals every key-value record of a backend under the active key, while
/// servers and clients keep using it.
///
/// Give it the **backend itself** (not a [`Sealed`] wrapper) and the
/// [`Sealing`] its applications use. For each key:
///
/// * a record under the active key is left as it is (only read), so a
///   re-run resumes an interrupted one ([`RekeyOptions::start_after`] skips
///   even the reads);
/// * a record under an old key, or plain text of a kind the scope seals and
///   that lives until deleted, is sealed under the active key and written
///   back with **compare-and-swap** on the version read, keeping its TTL
///   (the envelope carries the writer's expiry). A writer that wins the
///   race leaves its own, newer value: the record is read again; nothing a
///   writer wrote is ever replaced by an older value;
/// * a credential is re-sealed only while rekey holds its refresh lease,
///   so no client is between spending a refresh token and storing the
///   rotated one (whose compare-and-swap would otherwise fail and lose it).
///   A busy record is tried again at the end of the run;
/// * leases are never touched (their holders judge each other by version).
///
/// Re-sealing changes a record's version and nothing else; the typed stores
/// treat a lost compare-and-swap as "read again", so writers carry on.
/// Logs are append-only and not rewritten: the report lists the logs still
/// holding records under old keys, and when each expires.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use mcp_persist_core::{seal::*, *};
///
/// let (k1, _) = SealKey::generate()?;
/// let (k2, _) = SealKey::generate()?;
/// let (id1, id2) = (k1.id(), k2.id());
/// let backend = MemoryStore::new();
/// let sealing = Sealing::new(Keyring::new(k1));
/// let stores = Stores::new(backend.clone()).encrypted(sealing.clone());
/// stores.shared_keys().get_or_create("request-state").await?;
///
/// // Rotate: the new key seals, the old one still opens...
/// sealing.set_keyring(sealing.keyring().rotated(k2));
/// let mut progress = (0, 0);
/// let report = Rekey::new(&sealing, Arc::new(backend.clone()), Some(Arc::new(backend.clone())))
///     .run(|p| progress = (p.done, p.total))
///     .await?;
/// assert_eq!(report.resealed, 1);
/// assert_eq!(progress, (3, 3)); // the record, and the (empty) bus and heartbeat logs
/// // ...and once rekey has run, the old key can go.
/// assert_eq!(check(&backend, None, &sealing, |_| {}).await?.in_use(), vec![id2]);
/// sealing.set_keyring(sealing.keyring().without(id1));
/// assert!(stores.shared_keys().get_or_create("request-state").await.is_ok());
/// # Ok::<_, Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct Rekey {
    kv: Arc<dyn KvStore>,
    log: Option<Arc<dyn LogStore>>,
    sealing: Sealing,
    options: RekeyOptions,
    leases: AuthStore,
}

/// A plan for one record: its new plain value and expiry.
struct Plan {
    plain: Vec<u8>,
    expires_at: Option<Timestamp>,
    done: RecordState,
}

impl Rekey {
    /// A rekey of the backend `kv` (and its logs in `log`) to the active key
    /// of `sealing`.
    pub fn new(sealing: &Sealing, kv: Arc<dyn KvStore>, log: Option<Arc<dyn LogStore>>) -> Rekey {
        let leases = AuthStore::new(Arc::new(Sealed::new(kv.clone(), sealing.clone())));
        Rekey {
            kv,
            log,
            sealing: sealing.clone(),
            options: RekeyOptions::default(),
            leases,
        }
    }

    /// The same rekey with `options`.
    pub fn options(mut self, options: RekeyOptions) -> Rekey {
        self.options = options;
        self
    }

    /// Runs it, calling `progress` after each record and log.
    ///
    /// Errors: a backend failure stops the run with that error (what was
    /// done stays done; run again to resume). Records that cannot be
    /// re-sealed now do not stop it: they are in the report.
    pub async fn run(
        &self,
        mut progress: impl FnMut(&RekeyProgress<'_>) + Send,
    ) -> Result<RekeyReport> {
        let active = self.sealing.keyring().active();
        let mut keys = self.kv.list("").await?;
        if let Some(after) = &self.options.start_after {
            keys.retain(|k| k > after);
        }
        let logs = logs_of(&keys);
        let total = keys.len() + logs.len();
        info!(%active, records = keys.len(), logs = logs.len(), "rekey started");
        let mut report = RekeyReport::default();
        let mut done = 0;
        for key in &keys {
            let state = self.record(key).await?;
            done += 1;
            progress(&RekeyProgress {
                done,
                total,
                name: key,
                state: Some(&state),
            });
            tally(&mut report, key, state);
            report.last_key = Some(key.clone());
        }
        self.retry_busy(&mut report).await?;
        if let Some(log) = &self.log {
            for name in &logs {
                let finding = scan_log(&**log, name, &self.sealing, self.options.page, false)
                    .await?
                    .0;
                done += 1;
                progress(&RekeyProgress {
                    done,
                    total,
                    name,
                    state: None,
                });
                let stale = finding.plain > 0 || finding.by_key.keys().any(|id| *id != active);
                if stale {
                    report.logs.push(finding);
                }
            }
        }
        info!(
            resealed = report.resealed,
            sealed_plaintext = report.sealed_plaintext,
            busy = report.busy.len(),
            unreadable = report.unreadable.len(),
            stale_logs = report.logs.len(),
            "rekey finished"
        );
        Ok(report)
    }

    /// Tries the busy records again until the lease patience runs out.
    async fn retry_busy(&self, report: &mut RekeyReport) -> Result<()> {
        if report.busy.is_empty() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.options.lease_ttl.saturating_mul(2);
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        while !report.busy.is_empty() && tokio::time::Instant::now() < deadline {
            backoff.sleep_before(deadline).await;
            let busy = std::mem::take(&mut report.busy);
            for key in busy {
                let state = self.record(&key).await?;
                tally(report, &key, state);
            }
        }
        if !report.busy.is_empty() {
            warn!(
                busy = report.busy.len(),
                "rekey left records in use; run it again"
            );
        }
        Ok(())
    }

    /// Brings one record under the active key.
    async fn record(&self, key: &Key) -> Result<RecordState> {
        let declaration = declare::of_key(key);
        if declaration.is_some_and(|d| d.lifetime == Lifetime::Transient) {
            return Ok(RecordState::PlainByScope);
        }
        for _ in 0..ATTEMPTS {
            let Some(entry) = self.kv.get(key).await? else {
                return Ok(RecordState::Gone);
            };
            let ring = self.sealing.keyring();
            let plan = match self.plan(&ring, key, &entry.value) {
                Ok(plan) => plan,
                Err(state) => return Ok(state),
            };
            let ttl = match plan.expires_at {
                None => None,
                Some(at) => {
                    let left = at
                        .as_unix_millis()
                        .saturating_sub(kit::now().as_unix_millis());
                    if left == 0 {
                        return Ok(RecordState::Gone);
                    }
                    Some(Duration::from_millis(left))
                }
            };
            let lease = match declaration {
                Some(d) if d == &declare::CREDENTIALS => match self.lease(key).await? {
                    Some(lease) => Some(lease),
                    None => return Ok(RecordState::Busy),
                },
                _ => None,
            };
            let sealed = envelope::seal(&ring, key, &plan.plain, plan.expires_at, None)?;
            let written = self
                .kv
                .put(
                    key,
                    sealed,
                    PutOptions::new(PutMode::Update(entry.version)).with_ttl(ttl),
                )
                .await;
            if let Some(lease) = lease {
                self.leases.release(lease).await?;
            }
            match written {
                Ok(_) => {
                    debug!(%key, "re-sealed");
                    return Ok(plan.done);
                }
                Err(Error::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(RecordState::Busy)
    }

    /// What to write for a record read as `value`, or the state it stays in.
    fn plan(&self, ring: &Keyring, key: &Key, value: &[u8]) -> Result<Plan, RecordState> {
        match envelope::parse(value) {
            Err(problem) => Err(RecordState::Unreadable(problem)),
            Ok(Parsed::Plain) => {
                if !self.sealing.seals(Space::Kv, key) {
                    return Err(RecordState::PlainByScope);
                }
                // A plain record does not say its TTL: only kinds kept until
                // deleted can be sealed without guessing one.
                match declare::of_key(key) {
                    Some(d) if d.lifetime == Lifetime::Kept => Ok(Plan {
                        plain: value.to_vec(),
                        expires_at: None,
                        done: RecordState::SealedPlaintext,
                    }),
                    _ => Err(RecordState::PlainUntilExpiry),
                }
            }
            Ok(Parsed::Sealed {
                info,
                head,
                nonce,
                body,
            }) => {
                if info.log {
                    return Err(RecordState::Unreadable(SealProblem::Unopenable {
                        key_id: info.key_id,
                    }));
                }
                if info.key_id == ring.active() {
                    return Err(RecordState::Current);
                }
                let plain = envelope::open(ring, key, &info, head, nonce, body)
                    .map_err(RecordState::Unreadable)?;
                Ok(Plan {
                    plain,
                    expires_at: info.expires_at,
                    done: RecordState::Resealed { from: info.key_id },
                })
            }
        }
    }

    /// Takes the refresh lease of the credential under `key`, waiting a
    /// little for a refresh in progress; `None` when it stays held.
    async fn lease(&self, key: &Key) -> Result<Option<crate::RefreshLease>> {
        let Some(parts) = declare::CREDENTIALS.parse(key) else {
            return Ok(None);
        };
        let Ok(credential) = CredentialKey::new(&parts[0], &parts[1]) else {
            return Ok(None);
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(50));
        loop {
            if let Some(lease) = self
                .leases
                .try_lease(&credential, self.options.lease_ttl)
                .await?
            {
                return Ok(Some(lease));
            }
            if tokio::time::Instant::now() >= deadline {
                debug!(%key, "a client is refreshing this credential; coming back to it");
                return Ok(None);
            }
            backoff.sleep_before(deadline).await;
        }
    }
}

fn tally(report: &mut RekeyReport, key: &Key, state: RecordState) {
    // A busy record is counted when it is tried again.
    report.records += usize::from(state != RecordState::Busy);
    match state {
        RecordState::Current => report.current += 1,
        RecordState::Resealed { .. } => report.resealed += 1,
        RecordState::SealedPlaintext => report.sealed_plaintext += 1,
        RecordState::PlainByScope => report.plain_by_scope += 1,
        RecordState::PlainUntilExpiry => report.plain_until_expiry.push(key.clone()),
        RecordState::Gone => {}
        RecordState::Busy => report.busy.push(key.clone()),
        RecordState::Unreadable(problem) => {
            warn!(%key, %problem, "rekey cannot open a record");
            report.unreadable.push((key.clone(), problem));
        }
    }
}

/// The logs that records among `keys` own, and the logs of no owner (the
/// bus), in order.
fn logs_of(keys: &[Key]) -> Vec<Key> {
    let mut logs = BTreeSet::new();
    for key in keys {
        if let Some((log, _)) = declare::of_key(key).and_then(|d| d.log_of(key)) {
            logs.insert(log);
        }
    }
    for d in declare::ALL {
        if d.space == Space::Log
            && d.components.is_empty()
            && let Ok(log) = Key::new(d.prefix)
        {
            logs.insert(log);
        }
    }
    logs.into_iter().collect()
}

/// Reads every record of `log`, counting records per key. With `open`,
/// every sealed record under a key of the ring is opened too, and the ones
/// that do not open are returned.
async fn scan_log(
    log: &dyn LogStore,
    name: &Key,
    sealing: &Sealing,
    page: usize,
    open: bool,
) -> Result<(LogFinding, Vec<(String, SealProblem)>)> {
    let ring = sealing.keyring();
    let seals = sealing.seals(Space::Log, name);
    let mut finding = LogFinding {
        log: name.clone(),
        records: 0,
        by_key: BTreeMap::new(),
        plain: 0,
        expires_at: None,
    };
    let mut problems = Vec::new();
    let mut after = 0;
    loop {
        let records = log.read_after(name, after, page.max(1)).await?;
        let Some(last) = records.last() else {
            break;
        };
        after = last.seq;
        for record in &records {
            let label = || format!("{name}#{}", record.seq);
            finding.records += 1;
            finding.expires_at = None;
            match envelope::parse(&record.data) {
                Ok(Parsed::Plain) => finding.plain += u64::from(seals),
                Ok(Parsed::Sealed {
                    info,
                    head,
                    nonce,
                    body,
                }) => {
                    *finding.by_key.entry(info.key_id).or_default() += 1;
                    finding.expires_at = info.expires_at;
                    if open && ring.holds(info.key_id) {
                        let opened = if info.log {
                            envelope::open(&ring, name, &info, head, nonce, body).map(drop)
                        } else {
                            Err(SealProblem::Unopenable {
                                key_id: info.key_id,
                            })
                        };
                        if let Err(problem) = opened {
                            problems.push((label(), problem));
                        }
                    }
                }
                Err(problem) => problems.push((label(), problem)),
            }
        }
    }
    Ok((finding, problems))
}

/// What [`check`] found: which keys seal what, and what cannot be read.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Check {
    /// Key-value records read.
    pub records: usize,
    /// Log records read.
    pub log_records: u64,
    /// Records (key-value and log) sealed under each key id.
    pub by_key: BTreeMap<KeyId, u64>,
    /// Plain-text records of kinds this scope seals.
    pub plaintext: u64,
    /// Records sealed under keys the ring no longer holds: they cannot be
    /// read until that key is back in the ring.
    pub missing: Vec<(String, KeyId)>,
    /// Records that do not open under a key the ring holds (altered, or
    /// moved from another record), or whose envelope is damaged.
    pub damaged: Vec<(String, SealProblem)>,
}

impl Check {
    /// The key ids some record is sealed with, in order.
    pub fn in_use(&self) -> Vec<KeyId> {
        self.by_key.keys().copied().collect()
    }

    /// Whether every record can be read with the ring.
    pub fn is_readable(&self) -> bool {
        self.missing.is_empty() && self.damaged.is_empty()
    }
}

/// Reads every record of the backend `kv` (and the logs in `log`) and
/// reports which key seals what, records under keys `sealing`'s ring no
/// longer holds, and records that do not open. Every record under a key of
/// the ring is opened, so an altered or moved record is found. Writes
/// nothing. `progress` is called after each record and log.
pub async fn check(
    kv: &dyn KvStore,
    log: Option<&dyn LogStore>,
    sealing: &Sealing,
    mut progress: impl FnMut(&RekeyProgress<'_>) + Send,
) -> Result<Check> {
    let ring = sealing.keyring();
    let keys = kv.list("").await?;
    let logs = if log.is_some() {
        logs_of(&keys)
    } else {
        Vec::new()
    };
    let total = keys.len() + logs.len();
    let mut found = Check::default();
    let mut done = 0;
    for key in &keys {
        done += 1;
        if let Some(entry) = kv.get(key).await? {
            found.records += 1;
            let problem = match envelope::parse(&entry.value) {
                Ok(Parsed::Plain) => {
                    found.plaintext += u64::from(sealing.seals(Space::Kv, key));
                    None
                }
                Ok(Parsed::Sealed {
                    info,
                    head,
                    nonce,
                    body,
                }) => {
                    *found.by_key.entry(info.key_id).or_default() += 1;
                    if info.log {
                        Some(SealProblem::Unopenable {
                            key_id: info.key_id,
                        })
                    } else {
                        envelope::open(&ring, key, &info, head, nonce, body).err()
                    }
                }
                Err(problem) => Some(problem),
            };
            match problem {
                Some(SealProblem::MissingKey { key_id }) => {
                    found.missing.push((key.to_string(), key_id));
                }
                Some(problem) => found.damaged.push((key.to_string(), problem)),
                None => {}
            }
        }
        progress(&RekeyProgress {
            done,
            total,
            name: key,
            state: None,
        });
    }
    if let Some(log) = log {
        for name in &logs {
            let (finding, problems) = scan_log(log, name, sealing, 512, true).await?;
            found.log_records += finding.records;
            found.plaintext += finding.plain;
            for (id, n) in finding.by_key {
                *found.by_key.entry(id).or_default() += n;
                if !ring.holds(id) {
                    found.missing.push((format!("{name} ({n} records)"), id));
                }
            }
            found.damaged.extend(problems);
            done += 1;
            progress(&RekeyProgress {
                done,
                total,
                name,
                state: None,
            });
        }
    }
    Ok(found)
}
