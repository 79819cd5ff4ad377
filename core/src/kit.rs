//! The backend kit: what every backend needs and none should write again.
//!
//! * **One clock.** [`now`] is the wall clock every backend that decides
//!   expiry itself reads (backends whose server decides, such as Redis or
//!   Postgres, use the server's clock instead; the table in
//!   [`backend`](crate::backend) says which does what).
//! * **One expiry conversion.** [`expires_at`] and [`ttl_millis`] turn a TTL
//!   into an instant or a count of milliseconds, always **rounding up**, so no
//!   record ever expires before its TTL has passed, whatever the backend's
//!   resolution. [`expires_at_secs`] does the same for services that count
//!   in whole seconds.
//! * **One liveness rule.** [`is_live`]: a record is live until the clock
//!   reaches its expiry.
//! * **One sweep margin.** [`SWEEP_MARGIN`] and [`sweepable`]: a sweep never
//!   deletes what expired less than the margin ago, so a brief forward step
//!   of the clock never destroys live data for good.
//! * **One value check.** [`check_value`] against the backend's limit.
//! * **Log TTL slack**: a log may outlive its TTL by at most
//!   [`log_ttl_slack`], never less.
//! * **One hex form.** [`hex`]: lowercase, two digits per byte, the way
//!   tokens, keys and hashed names are written throughout.
//!
//! ```
//! use std::time::Duration;
//! use mcp_persist_core::{kit, Timestamp};
//!
//! let now = Timestamp::from_unix_millis(1_000);
//! // 1.5 ms is kept for 2 ms, never 1.
//! assert_eq!(kit::expires_at_from(now, Duration::from_micros(1_500)).as_unix_millis(), 1_002);
//! assert_eq!(kit::ttl_millis(Duration::from_nanos(1)), 1);
//! assert!(kit::is_live(Some(Timestamp::from_unix_millis(1_001)), now));
//! assert!(!kit::is_live(Some(now), now));
//! // Expired 30 s ago: not yet sweepable with the default 60 s margin.
//! let expired = Timestamp::from_unix_millis(1_000);
//! assert!(!kit::sweepable(expired, expired.plus(Duration::from_secs(30)), kit::SWEEP_MARGIN));
//! assert!(kit::sweepable(expired, expired.plus(Duration::from_secs(60)), kit::SWEEP_MARGIN));
//! assert_eq!(kit::hex(&[0x00, 0x7f, 0xab]), "007fab");
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Error, Result, Timestamp};

/// How long after its expiry a record is kept by sweeps (60 s), so that a
/// brief forward step of the clock hides records without destroying them.
/// Backends that sweep take it as their default and let operators set
/// another.
pub const SWEEP_MARGIN: Duration = Duration::from_secs(60);

/// Now, by the wall clock: the one clock of backends that decide expiry
/// themselves.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// Whole milliseconds of `d`, rounded up, saturating.
fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// When a record written now with `ttl` expires, rounded up to the next
/// whole millisecond (the current sub-millisecond included), so it never
/// expires early.
pub fn expires_at(ttl: Duration) -> Timestamp {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_unix_millis(ceil_millis(since_epoch.saturating_add(ttl)))
}

/// When a record written at `now` with `ttl` expires, rounded up.
pub fn expires_at_from(now: Timestamp, ttl: Duration) -> Timestamp {
    Timestamp::from_unix_millis(now.as_unix_millis().saturating_add(ceil_millis(ttl)))
}

/// A TTL in whole milliseconds, rounded up and at least 1 (what Redis `PX`
/// and `PEXPIRE` take: 0 would be refused or mean "now").
pub fn ttl_millis(ttl: Duration) -> u64 {
    ceil_millis(ttl).max(1)
}

/// An expiry instant in whole seconds since the epoch, rounded up (for
/// services whose TTL attribute counts seconds, such as DynamoDB's).
pub fn expires_at_secs(at: Timestamp) -> u64 {
    at.as_unix_millis().div_ceil(1000)
}

/// Whether a record expiring at `expires_at` (`None`: never) is live at `now`.
pub fn is_live(expires_at: Option<Timestamp>, now: Timestamp) -> bool {
    expires_at.is_none_or(|at| at > now)
}

/// Whether a sweep at `now` may delete what expired at `expired_at`, keeping
/// `margin` (see [`SWEEP_MARGIN`]).
pub fn sweepable(expired_at: Timestamp, now: Timestamp, margin: Duration) -> bool {
    expired_at.plus(margin) <= now
}

/// How much longer than its TTL a log may live: a sixteenth (see
/// [`LogStore`](crate::LogStore)).
pub fn log_ttl_slack(ttl: Duration) -> Duration {
    ttl / 16
}

/// Checks a value or log record against a backend's size limit:
/// [`Error::TooLarge`] when it is over.
pub fn check_value(value: &[u8], limit: usize) -> Result<()> {
    if value.len() > limit {
        return Err(Error::TooLarge {
            what: "value",
            size: value.len(),
            limit,
        });
    }
    Ok(())
}

/// The lowercase hex digits of `bytes`, two per byte.
///
/// ```
/// assert_eq!(mcp_persist_core::kit::hex(b"\x01\xfe"), "01fe");
/// ```
pub fn hex(bytes: &[u8]) -> String {
    let mut digits = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut digits).to_owned()
}

/// Writes the lowercase hex digits of `bytes` into `out` (twice as long)
/// and returns them: for text written often, from a buffer on the stack.
pub(crate) fn hex_into<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    // Only ASCII digits were written.
    std::str::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names and ids already in stores (Secrets Manager names, stream
    /// tokens, version ids) were written in this form: every byte as
    /// `format!("{b:02x}")` writes it, in order, for any length.
    #[test]
    fn hex_is_the_form_stored_names_were_written_in() {
        let all: Vec<u8> = (0..=255).collect();
        let formatted: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), formatted);
        assert_eq!(hex(&[]), "");
        let mut stack = [0u8; 6];
        assert_eq!(hex_into(&[0xde, 0xad, 0x01], &mut stack), "dead01");
    }

    #[test]
    fn conversions_round_up() {
        assert_eq!(ceil_millis(Duration::ZERO), 0);
        assert_eq!(ceil_millis(Duration::from_millis(5)), 5);
        assert_eq!(ceil_millis(Duration::from_nanos(5_000_001)), 6);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
        assert_eq!(ttl_millis(Duration::ZERO), 1);
        assert_eq!(expires_at_secs(Timestamp::from_unix_millis(1_001)), 2);
        assert_eq!(expires_at_secs(Timestamp::from_unix_millis(2_000)), 2);
        let before = Timestamp::now();
        let at = expires_at(Duration::from_millis(10));
        assert!(at.as_unix_millis() >= before.as_unix_millis() + 10);
        assert_eq!(
            expires_at_from(
                Timestamp::from_unix_millis(u64::MAX - 1),
                Duration::from_secs(1)
            ),
            Timestamp::from_unix_millis(u64::MAX)
        );
    }
}
