//! The two retry shapes every store and transport uses: a compare-and-swap
//! loop that tries again when another writer won, and a pause that doubles
//! between polls.

use std::{future::Future, time::Duration};

use tokio::time::Instant;

use crate::{Error, Result};

/// Runs one read-modify-write `attempt` of `key` until it succeeds, trying
/// again whenever it fails because another writer got there first
/// ([`Error::Conflict`] or [`Error::AlreadyExists`]); any other outcome is
/// returned as it is. After `attempts` lost races the answer is
/// [`Error::Conflict`] naming `key`.
///
/// Each attempt must read the current record itself, so that the next one
/// starts from what the winner wrote. An attempt is a closure returning a
/// future (`move || async move { .. }` over references), so the loop's
/// future stays `Send` wherever the attempt's is.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use mcp_persist_core::{Key, KvStore, MemoryStore, PutMode, PutOptions, retry::retry_cas};
///
/// let store = Arc::new(MemoryStore::new());
/// let store = &store;
/// let key = &Key::new("counter")?;
/// let counter = retry_cas(key, 16, move || async move {
///     let (n, mode) = match store.get(key).await? {
///         Some(e) => (String::from_utf8_lossy(&e.value).parse::<u64>().unwrap_or(0), PutMode::Update(e.version)),
///         None => (0, PutMode::Create),
///     };
///     store.put(key, (n + 1).to_string().into_bytes(), PutOptions::new(mode)).await?;
///     Ok(n + 1)
/// })
/// .await?;
/// assert_eq!(counter, 1);
/// # Ok::<_, mcp_persist_core::Error>(()) }).unwrap();
/// ```
pub async fn retry_cas<T, F, Fut>(key: &str, attempts: usize, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    for _ in 0..attempts {
        match attempt().await {
            Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => continue,
            outcome => return outcome,
        }
    }
    Err(Error::Conflict {
        key: key.to_owned(),
    })
}

/// A pause between polls that starts at `first` and doubles up to `max`.
///
/// ```
/// use std::{future::Future, time::Duration};
/// use mcp_persist_core::retry::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(25));
/// assert_eq!(backoff.next_pause(), Duration::from_millis(10));
/// assert_eq!(backoff.next_pause(), Duration::from_millis(20));
/// assert_eq!(backoff.next_pause(), Duration::from_millis(25));
/// assert_eq!(backoff.next_pause(), Duration::from_millis(25));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff whose first pause is `first` and whose longest is `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff { next: first, max }
    }

    /// The pause to take now; the one after it is twice as long, up to the
    /// maximum.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next.min(self.max);
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// Sleeps for the next pause, but never past `deadline`.
    pub async fn sleep_before(&mut self, deadline: Instant) {
        let pause = self.next_pause();
        tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
    }
}
