//! What a load run counts: latency samples, errors by kind, events.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use serde::Serialize;

/// The latencies a run reports, by name.
pub const RESTORE: &str = "session restore";
/// Replay after `Last-Event-ID` of a finished call, until its response.
pub const REPLAY: &str = "replay";
/// Resuming an interrupted call on another instance, until its first event.
pub const RESUME: &str = "resume";
/// One `tasks/get`.
pub const TASKS_GET: &str = "tasks/get";
/// From publishing a notice on one instance to a listener on any instance
/// hearing it.
pub const BUS: &str = "bus delivery";

/// Counters and samples, shared by every task of a run.
#[derive(Debug)]
pub struct Stats {
    inner: Mutex<Inner>,
    started: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    samples: BTreeMap<&'static str, Vec<u32>>,
    errors: BTreeMap<String, u64>,
    counters: BTreeMap<&'static str, u64>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            inner: Mutex::default(),
            started: Instant::now(),
        }
    }
}

impl Stats {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Records one latency of `metric`.
    pub fn sample(&self, metric: &'static str, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.with(|i| i.samples.entry(metric).or_default().push(micros));
    }

    /// Counts one error of `kind`.
    pub fn error(&self, kind: impl Into<String>) {
        let kind = kind.into();
        self.with(|i| *i.errors.entry(kind).or_default() += 1);
    }

    /// Adds `n` to the counter `name`.
    pub fn count(&self, name: &'static str, n: u64) {
        if n > 0 {
            self.with(|i| *i.counters.entry(name).or_default() += n);
        }
    }

    /// The counter `name`.
    pub fn counter(&self, name: &'static str) -> u64 {
        self.with(|i| i.counters.get(name).copied().unwrap_or_default())
    }

    /// Everything counted so far, with percentiles.
    pub fn summary(&self) -> Summary {
        self.with(|i| Summary {
            seconds: self.started.elapsed().as_secs_f64(),
            latencies: i
                .samples
                .iter()
                .map(|(name, samples)| {
                    let mut sorted = samples.clone();
                    sorted.sort_unstable();
                    (name.to_string(), Latency::of(&sorted))
                })
                .collect(),
            errors: i.errors.clone(),
            counters: i
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        })
    }
}

/// Percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Latency {
    /// How many samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The slowest.
    pub max: f64,
}

impl Latency {
    /// Nearest-rank percentiles of `sorted` (microseconds, ascending).
    fn of(sorted: &[u32]) -> Latency {
        let at = |q: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest sample with at least q of all at or
            // below it.
            let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
            f64::from(sorted[rank.min(sorted.len()) - 1]) / 1000.0
        };
        Latency {
            n: sorted.len(),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: sorted.last().map_or(0.0, |m| f64::from(*m) / 1000.0),
        }
    }
}

/// A phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Wall time of the phase.
    pub seconds: f64,
    /// Latencies by name.
    pub latencies: BTreeMap<String, Latency>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Counters by name.
    pub counters: BTreeMap<String, u64>,
}

impl Summary {
    /// The counter `name` (0 when never counted).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u32> = (1..=1000).map(|n| n * 1000).collect();
        let l = Latency::of(&sorted);
        assert_eq!((l.p50, l.p99, l.p999, l.max), (500.0, 990.0, 999.0, 1000.0));
        let one = Latency::of(&[2500]);
        assert_eq!((one.p50, one.p999), (2.5, 2.5));
        assert_eq!(Latency::of(&[]).n, 0);
    }
}
