//! The lock a `copy` holds on its destination, so that copies into one
//! store take turns: two copies appending the same log at once would number
//! one's records after the other's, duplicating them.
//!
//! | destination | lock | held after a crash |
//! |---|---|---|
//! | `file:DIR` | `flock` on the store's folder | no: the system drops it |
//! | `sqlite:PATH` | `flock` on the database file | no: the system drops it |
//! | `redis://` | the key `<prefix>{cli:copy-lock}`, renewed while held | until its TTL ([`REDIS_TTL`]) runs out |
//!
//! A copy that finds the lock taken says so and waits; Ctrl-C stops the
//! wait. Key-value records need no lock (they are written create-only or by
//! compare-and-swap), so a destination without logs (Secrets Manager) takes
//! none.

use std::{
    fs::File,
    mem::ManuallyDrop,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::{
    fail::{Code, Failure},
    interrupt,
    output::{Level, diag},
    rawredis::{Conn, connect},
    target::{Backend, Location},
};

/// How long the Redis lock outlives a copy that stopped renewing it (a
/// copy killed with SIGKILL, a machine gone).
pub(crate) const REDIS_TTL: Duration = Duration::from_secs(10);
/// How often a held Redis lock is renewed.
const REDIS_RENEW: Duration = Duration::from_secs(2);
/// How often a waiting copy tries again.
const RETRY: Duration = Duration::from_millis(100);

/// A held destination lock; [`DestLock::release`] gives it back.
pub(crate) struct DestLock {
    held: Held,
}

enum Held {
    /// A file-store folder.
    Folder(File),
    /// A SQLite database file. Closing any descriptor of the database
    /// drops every POSIX lock this process holds on it, SQLite's own
    /// included; this one therefore stays open until the process ends,
    /// when SQLite's go too.
    #[expect(dead_code, reason = "never read: holding the descriptor is the lock")]
    Database(ManuallyDrop<File>),
    /// A Redis key, renewed by a task until released.
    Redis(RedisLock),
}

fn interrupted_while_waiting(label: &str) -> Failure {
    Failure::new(
        Code::Interrupted,
        format!(
            "interrupted while waiting for another copy into {label} to finish; this run copied nothing"
        ),
    )
    .with_hint("run the same command again once the other copy is done")
}

fn waiting(label: &str, holder: Option<&str>) {
    let by = holder.map(|h| format!(" ({h})")).unwrap_or_default();
    diag(
        Level::Note,
        &format!(
            "another copy into {label} is running{by}; waiting for it to finish (Ctrl-C stops waiting)"
        ),
    );
}

/// Takes an exclusive `flock` on `path`, waiting while another process
/// holds it. With `keep_open` (a SQLite database this process has open),
/// the descriptor is never closed, even on failure: closing it would drop
/// SQLite's own POSIX locks on the file.
async fn flock(path: &Path, label: &str, keep_open: bool) -> Result<File, Failure> {
    let file = File::open(path).map_err(|e| {
        Failure::new(
            Code::Other,
            format!("cannot open {} to lock it: {e}", path.display()),
        )
    })?;
    let failed = |file: File, failure: Failure| {
        if keep_open {
            std::mem::forget(file);
        }
        Err(failure)
    };
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                let failure =
                    Failure::new(Code::Other, format!("cannot lock {}: {e}", path.display()));
                return failed(file, failure);
            }
        }
        if !told {
            waiting(label, None);
            told = true;
        }
        if interrupt::requested() {
            return failed(file, interrupted_while_waiting(label));
        }
        tokio::time::sleep(RETRY).await;
    }
}

impl DestLock {
    /// Locks the destination `backend` (opened already, so its file or
    /// folder exists); `None` for a backend without logs.
    pub(crate) async fn acquire(backend: &Backend) -> Result<Option<DestLock>, Failure> {
        let label = &backend.label;
        let held = match (&backend.location, &backend.redis_prefix) {
            (Location::File(dir), _) => Held::Folder(flock(dir, label, false).await?),
            (Location::Sqlite(path), _) => {
                Held::Database(ManuallyDrop::new(flock(path, label, true).await?))
            }
            (Location::Redis { urls, cluster, .. }, Some(prefix)) => {
                Held::Redis(RedisLock::acquire(urls, *cluster, prefix, label).await?)
            }
            _ => return Ok(None),
        };
        Ok(Some(DestLock { held }))
    }

    /// Whether the lock was lost (a Redis lock not renewed in time): the
    /// copy must stop before it appends anything more.
    pub(crate) fn lost(&self) -> bool {
        match &self.held {
            Held::Redis(lock) => lock.lost.load(Ordering::SeqCst),
            _ => false,
        }
    }

    /// Gives the lock back. Call it after the destination store is closed.
    pub(crate) async fn release(self) {
        match self.held {
            Held::Folder(file) => drop(file),
            // Given back when the process ends (see `Held::Database`).
            Held::Database(_) => {}
            Held::Redis(lock) => lock.release().await,
        }
    }
}

/// Extends the lock if it is still ours.
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/// Deletes the lock if it is still ours.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

struct RedisLock {
    conn: Conn,
    key: String,
    token: String,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

/// Who holds the lock, for the operator who waits: this host and process.
fn holder_token() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "mcp-persist copy, process {} on {host}, {nanos}",
        std::process::id()
    )
}

fn redis_failure(label: &str, e: &redis::RedisError) -> Failure {
    Failure::new(
        Code::Unreachable,
        format!("{label}: cannot take the copy lock: {e}"),
    )
    .with_hint("check that the server is running and the URL's host and port are right")
}

impl RedisLock {
    async fn acquire(
        urls: &[String],
        cluster: bool,
        prefix: &str,
        label: &str,
    ) -> Result<RedisLock, Failure> {
        let mut conn = connect(urls, cluster)
            .await
            .map_err(|e| redis_failure(label, &e))?;
        // Beside the store's own keys (`<prefix>{kv:..}`, `<prefix>{log:..}`),
        // never among them.
        let key = format!("{prefix}{{cli:copy-lock}}");
        let token = holder_token();
        let ttl_ms = REDIS_TTL.as_millis().to_string();
        let mut told = false;
        loop {
            let set: Option<String> = conn
                .query(
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(&ttl_ms),
                )
                .await
                .map_err(|e| redis_failure(label, &e))?;
            if set.is_some() {
                break;
            }
            if !told {
                let holder: Option<String> = conn
                    .query(redis::cmd("GET").arg(&key))
                    .await
                    .map_err(|e| redis_failure(label, &e))?;
                waiting(label, holder.as_deref());
                told = true;
            }
            if interrupt::requested() {
                return Err(interrupted_while_waiting(label));
            }
            tokio::time::sleep(RETRY).await;
        }
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = {
            let mut renew_conn = connect(urls, cluster)
                .await
                .map_err(|e| redis_failure(label, &e))?;
            let (key, token, lost) = (key.clone(), token.clone(), lost.clone());
            tokio::spawn(async move {
                let script = redis::Script::new(RENEW);
                loop {
                    tokio::time::sleep(REDIS_RENEW).await;
                    let renewed: redis::RedisResult<i64> = tokio::time::timeout(
                        REDIS_RENEW,
                        renew_conn.script(&script, &key, &[&token, &ttl_ms]),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "renewal timed out",
                        )))
                    });
                    if !matches!(renewed, Ok(1)) {
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            })
        };
        Ok(RedisLock {
            conn,
            key,
            token,
            lost,
            renewer,
        })
    }

    async fn release(mut self) {
        self.renewer.abort();
        // Best effort: a lock left behind expires within REDIS_TTL.
        let released: redis::RedisResult<i64> = self
            .conn
            .script(&redis::Script::new(RELEASE), &self.key, &[&self.token])
            .await;
        if let Err(e) = released {
            diag(
                Level::Warning,
                &format!(
                    "could not give back the copy lock {}: {e}; it expires within {} s",
                    self.key,
                    REDIS_TTL.as_secs()
                ),
            );
        }
    }
}
