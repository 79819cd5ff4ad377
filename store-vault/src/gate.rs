//! Keeping writes under the service's rate: a rate limiter for write calls,
//! and coalescing of overwrites of one key.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use mcp_persist_core::{Result, Version};
use tokio::{sync::oneshot, time::Instant};

/// Spaces write calls so that at most `per_second` start in any second,
/// after a burst of `per_second` (a token bucket, kept as the time at which
/// the bucket is full again).
#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Duration,
    burst: Duration,
    full_at: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// `None`: no limit.
    pub(crate) fn new(per_second: Option<u32>) -> Option<Self> {
        let per_second = per_second.filter(|n| *n > 0)?;
        let interval = Duration::from_secs(1) / per_second;
        Some(RateLimiter {
            interval,
            burst: interval * per_second,
            full_at: Mutex::new(None),
        })
    }

    /// Waits until one more write call may start.
    pub(crate) async fn acquire(&self) {
        let start = {
            let mut full_at = self
                .full_at
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            let at = full_at.map_or(now, |t| t.max(now));
            let next = at + self.interval;
            *full_at = Some(next);
            // Calls may start while the bucket is less than `burst` behind.
            next.checked_sub(self.burst).filter(|s| *s > now)
        };
        if let Some(start) = start {
            tracing::debug!(
                wait_ms = (start - Instant::now()).as_millis() as u64,
                "write rate limit reached; waiting"
            );
            tokio::time::sleep_until(start).await;
        }
    }
}

/// One overwrite waiting for the write in flight on its key.
struct Waiter {
    value: Vec<u8>,
    ttl: Option<Duration>,
    tx: oneshot::Sender<Turn>,
}

/// What a waiting overwrite is told.
enum Turn {
    /// Written, at this version.
    Written(Version),
    /// Write these (the waiter's own value first) as the next batch.
    Lead(Vec<Waiter>),
    /// The batch failed: write alone.
    Failed,
}

/// Overwrites of one key arriving while one is in flight are queued, then
/// written as one: the last value is stored, and each overwrite gets its own
/// version, in arrival order, all of them committed by that one write. The
/// earlier values are overwritten at the very instant they are written, so
/// nothing a reader could observe differs from writing them one by one, and
/// an `Update` against an earlier one's version is a `Conflict`, as it must.
#[derive(Default)]
pub(crate) struct Coalescer {
    /// Keys with an overwrite in flight, and the overwrites queued behind it.
    queues: Mutex<HashMap<String, Vec<Waiter>>>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

/// Hands the queue of a key to its next leader when the leader is done,
/// also when its future is dropped half way.
struct Handover<'a> {
    coalescer: &'a Coalescer,
    key: &'a str,
}

impl Drop for Handover<'_> {
    fn drop(&mut self) {
        let mut queues = self.coalescer.queues();
        let queue = queues.get_mut(self.key).map(std::mem::take);
        match queue {
            Some(mut queue) if !queue.is_empty() => {
                // The first waiter leads the next batch; the key stays busy.
                let first = queue.remove(0);
                let mut batch = Vec::with_capacity(queue.len() + 1);
                let tx = first.tx;
                batch.push(Waiter {
                    value: first.value,
                    ttl: first.ttl,
                    tx: oneshot::channel().0,
                });
                batch.extend(queue);
                if let Err(Turn::Lead(batch)) = tx.send(Turn::Lead(batch)) {
                    // The next leader is gone: tell its followers to write alone.
                    for waiter in batch.into_iter().skip(1) {
                        let _ = waiter.tx.send(Turn::Failed);
                    }
                    queues.remove(self.key);
                }
            }
            _ => {
                queues.remove(self.key);
            }
        }
    }
}

impl Coalescer {
    fn queues(&self) -> MutexGuard<'_, HashMap<String, Vec<Waiter>>> {
        // Every mutation under the lock is a single insert, take or remove.
        self.queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Overwrites `key` with `value` through `write`, possibly together with
    /// other overwrites of the same key. `write(value, ttl, n)` stores one
    /// value on behalf of `n` overwrites, reserving `n` versions, and returns
    /// the greatest.
    pub(crate) async fn overwrite<F, Fut>(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
        write: F,
    ) -> Result<Version>
    where
        F: Fn(Vec<u8>, Option<Duration>, u64) -> Fut,
        Fut: Future<Output = Result<Version>>,
    {
        let turn = {
            let mut queues = self.queues();
            match queues.get_mut(key) {
                Some(queue) => {
                    let (tx, rx) = oneshot::channel();
                    queue.push(Waiter {
                        value: value.clone(),
                        ttl,
                        tx,
                    });
                    Some(rx)
                }
                None => {
                    queues.insert(key.to_owned(), Vec::new());
                    None
                }
            }
        };
        let (own, mut batch) = match turn {
            None => ((value, ttl), Vec::new()),
            Some(rx) => match rx.await {
                Ok(Turn::Written(version)) => return Ok(version),
                Ok(Turn::Lead(mut batch)) => {
                    let own = batch.remove(0);
                    ((own.value, own.ttl), batch)
                }
                // The batch failed, or its leader was dropped: write alone.
                Ok(Turn::Failed) | Err(_) => return write(value, ttl, 1).await,
            },
        };
        let _handover = Handover {
            coalescer: self,
            key,
        };
        let n = 1 + batch.len() as u64;
        let (last_value, last_ttl) = match batch.last_mut() {
            Some(last) => (std::mem::take(&mut last.value), last.ttl),
            None => own,
        };
        if n > 1 {
            tracing::debug!(key, overwrites = n, "coalesced overwrites into one write");
        }
        match write(last_value, last_ttl, n).await {
            Ok(top) => {
                // The batch's versions, in arrival order, end at `top`.
                let first = top.get() - (n - 1);
                for (i, waiter) in batch.drain(..).enumerate() {
                    let _ = waiter
                        .tx
                        .send(Turn::Written(Version::new(first + 1 + i as u64)));
                }
                Ok(Version::new(first))
            }
            Err(e) => {
                for waiter in batch.drain(..) {
                    let _ = waiter.tx.send(Turn::Failed);
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };

    use tokio::sync::Notify;

    use super::*;

    /// A fake service: remembers each write's batch size and the stored value.
    #[derive(Default)]
    struct Fake {
        writes: Mutex<Vec<u64>>,
        stored: Mutex<Vec<u8>>,
        counter: AtomicU64,
        release: Notify,
    }

    impl Fake {
        async fn write(&self, value: Vec<u8>, n: u64) -> Result<Version> {
            self.writes.lock().expect("not poisoned").push(n);
            self.release.notified().await;
            *self.stored.lock().expect("not poisoned") = value;
            Ok(Version::new(
                self.counter.fetch_add(n, Ordering::SeqCst) + n,
            ))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn overwrites_behind_a_write_in_flight_become_one_write() {
        let fake = Arc::new(Fake::default());
        let coalescer = Arc::new(Coalescer::default());
        let mut tasks = Vec::new();
        for i in 0..10u8 {
            let (task_fake, task_coalescer) = (fake.clone(), coalescer.clone());
            tasks.push(tokio::spawn(async move {
                task_coalescer
                    .overwrite("k", vec![i], None, |v, _, n| {
                        let fake = task_fake.clone();
                        async move { fake.write(v, n).await }
                    })
                    .await
                    .expect("write")
            }));
            // Let the first task reach the fake service before the others start.
            while i == 0 && fake.writes.lock().expect("not poisoned").is_empty() {
                tokio::task::yield_now().await;
            }
        }
        // Everyone else is queued now; release the writes one by one.
        let mut released = 0;
        while !tasks.iter().all(|t| t.is_finished()) {
            let pending = fake.writes.lock().expect("not poisoned").len();
            if pending > released {
                fake.release.notify_one();
                released += 1;
            }
            tokio::task::yield_now().await;
        }
        let mut versions = Vec::new();
        for task in tasks {
            versions.push(task.await.expect("task").get());
        }
        assert_eq!(*fake.writes.lock().expect("not poisoned"), vec![1, 9]);
        assert_eq!(*fake.stored.lock().expect("not poisoned"), vec![9]);
        // Ten overwrites, ten distinct versions, in arrival order.
        assert_eq!(versions, (1..=10).collect::<Vec<u64>>());
        assert!(coalescer.queues().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_leader_hands_its_queue_on() {
        let fake = Arc::new(Fake::default());
        let coalescer = Arc::new(Coalescer::default());
        let spawn = |i: u8| {
            let (fake, coalescer) = (fake.clone(), coalescer.clone());
            tokio::spawn(async move {
                coalescer
                    .overwrite("k", vec![i], None, |v, _, n| {
                        let fake = fake.clone();
                        async move { fake.write(v, n).await }
                    })
                    .await
            })
        };
        let leader = spawn(0);
        while fake.writes.lock().expect("not poisoned").is_empty() {
            tokio::task::yield_now().await;
        }
        let followers: Vec<_> = (1..4).map(spawn).collect();
        tokio::task::yield_now().await;
        // The leader goes away in the middle of its write.
        leader.abort();
        assert!(leader.await.expect_err("aborted").is_cancelled());
        while !followers.iter().all(|t| t.is_finished()) {
            fake.release.notify_one();
            tokio::task::yield_now().await;
        }
        for follower in followers {
            follower.await.expect("task").expect("written");
        }
        // The followers were written as one batch by the next leader.
        assert_eq!(*fake.writes.lock().expect("not poisoned"), vec![1, 3]);
        assert_eq!(*fake.stored.lock().expect("not poisoned"), vec![3]);
        assert!(coalescer.queues().is_empty());
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn rate_limiter_spaces_calls_after_a_burst() {
        let limiter = RateLimiter::new(Some(10)).expect("limited");
        let start = Instant::now();
        for _ in 0..10 {
            limiter.acquire().await;
        }
        assert_eq!(Instant::now(), start, "the burst passes at once");
        limiter.acquire().await;
        assert_eq!(Instant::now() - start, Duration::from_millis(100));
        assert!(RateLimiter::new(None).is_none());
    }
}
