//! Deadline arithmetic: from `Context.deadline` (ms since the Unix epoch) to the cutoff this
//! invocation works against ([`Budget`]), and until when a run's lease is valid
//! ([`LeaseClock`]).
//!
//! Every conversion saturates: a deadline of `0`, one already past, or one absurdly far in the
//! future never panics. A past deadline gives a cutoff that has already passed, so nothing is
//! claimed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// How far ahead [`later`] ever reaches: 100 years, far beyond any setting this crate accepts
/// (see [`crate::settings::MAX_DURATION`]), and still within any platform's clock.
pub const HORIZON: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `at + d`, saturating: never panics, never more than [`HORIZON`] after `at`. Every instant
/// this crate computes from a duration goes through it (or through `checked_add`).
pub fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d.min(HORIZON))
        .or_else(|| at.checked_add(Duration::from_secs(24 * 3600)))
        .unwrap_or(at)
}

/// The longest invocation this crate plans for. Lambda's own maximum is 15 minutes; a deadline
/// further away than this (a bogus or hand-written `Context`) is clamped to it.
pub const MAX_INVOCATION: Duration = Duration::from_secs(15 * 60);

/// The time budget of one invocation, anchored on the monotonic clock.
///
/// `deadline` is when Lambda stops the invocation; `cutoff` is `deadline − margin`, the moment
/// by which every run still executing must have been handed back.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    deadline: Instant,
    cutoff: Instant,
}

impl Budget {
    /// Budget for a deadline given in milliseconds since the Unix epoch (`Context.deadline`),
    /// with `margin` kept free before it.
    pub fn from_epoch_ms(deadline_ms: u64, margin: Duration) -> Self {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms)).min(MAX_INVOCATION);
        Self::from_time_left(left, margin)
    }

    /// Budget for an invocation with `left` time until its deadline (clamped to
    /// [`MAX_INVOCATION`]).
    pub fn from_time_left(left: Duration, margin: Duration) -> Self {
        let now = Instant::now();
        let left = left.min(MAX_INVOCATION);
        let deadline = later(now, left);
        let cutoff = later(now, left.saturating_sub(margin));
        Self { deadline, cutoff }
    }

    /// When Lambda ends the invocation.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When every run still executing is handed back (`deadline − margin`).
    pub fn cutoff(&self) -> Instant {
        self.cutoff
    }

    /// Time left until the cutoff, zero once it has passed.
    pub fn until_cutoff(&self) -> Duration {
        self.cutoff.saturating_duration_since(Instant::now())
    }

    /// Time left until the deadline, zero once it has passed.
    pub fn until_deadline(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// Until when a lease is valid (see [`crate::lease`]): the send time of the request whose answer last confirmed it,
/// plus the TTL, and never later than the end the API itself stated for it. Shared by the
/// refresher (which moves it forward), the execution's store calls and the run's supervisor
/// (which stop at it).
///
/// **The API's stated end.** The claim's answer carries two readings of the API's clocks: when
/// it took the claim (the run's `updated_at`, read from the API process's clock as it handled
/// the request, so no earlier than the claim's send) and when the lease ends
/// (`lease_expires_at`). That API moment is mapped on the claim's send time, so the end of any
/// lease the API states (the claim's, each renewal's) is known on this worker's clock, late
/// by at most the claim's latency, with no clock comparison between hosts. A lease the API
/// dated in the past counts for what is left of it only: a PostgreSQL store dates a lease
/// from its transaction's start (`NOW()`), which a pooled connection left inside an earlier
/// request's transaction (sqlx 0.8 and 0.9 leave one when a request is cancelled during
/// `BEGIN`) puts seconds or minutes back, so that the API's reaper may requeue the run as
/// soon as the answer leaves it.
#[derive(Debug)]
pub struct LeaseClock {
    base: Instant,
    /// Microseconds after `base`.
    valid_until: AtomicU64,
    /// The API's clock when it took the claim sent at `base`, if the claim's answer said.
    api_at_base: Option<DateTime<Utc>>,
}

impl LeaseClock {
    /// A lease confirmed by a request sent at `sent` (the claim), valid for `ttl`.
    #[cfg(test)]
    pub fn new(sent: Instant, ttl: Duration) -> Self {
        let clock = Self {
            base: sent,
            valid_until: AtomicU64::new(0),
            api_at_base: None,
        };
        clock.confirm(sent, ttl);
        clock
    }

    /// The lease a claim sent at `sent` for `ttl` got, its answer saying when the API took
    /// the claim (`taken_at`: the run's `updated_at`) and when the lease ends (`expires_at`:
    /// its `lease_expires_at`): valid until `sent + ttl`, or the stated end if that comes
    /// first (no stated end: `sent + ttl`).
    pub fn claimed(
        sent: Instant,
        ttl: Duration,
        taken_at: DateTime<Utc>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Self {
        let clock = Self {
            base: sent,
            valid_until: AtomicU64::new(0),
            api_at_base: expires_at.map(|_| taken_at),
        };
        match expires_at {
            Some(expires_at) => {
                clock.confirm_until(sent, ttl, expires_at);
            }
            None => clock.confirm(sent, ttl),
        }
        clock
    }

    /// When the lease stops being valid, as far as this worker knows.
    pub fn valid_until(&self) -> Instant {
        later(
            self.base,
            Duration::from_micros(self.valid_until.load(Ordering::Acquire)),
        )
    }

    /// How long the lease the claim's answer granted lasts, from the claim's send: its TTL,
    /// or less when the API stated an earlier end.
    pub fn granted(&self) -> Duration {
        Duration::from_micros(self.valid_until.load(Ordering::Acquire))
    }

    /// A refresh sent at `sent` was confirmed: the lease is valid until `sent + ttl` (never
    /// moved back by a late answer to an older request).
    pub fn confirm(&self, sent: Instant, ttl: Duration) {
        self.extend_to(later(sent, ttl));
    }

    /// A refresh sent at `sent` was confirmed with the lease ending at `expires_at` on the
    /// API's clock: valid until `sent + ttl`, or until that end (mapped on the claim's send
    /// time) if it comes first. Never moved back. Returns how much of the TTL the API's end
    /// took off (zero when it granted it all).
    pub fn confirm_until(
        &self,
        sent: Instant,
        ttl: Duration,
        expires_at: DateTime<Utc>,
    ) -> Duration {
        let full = later(sent, ttl);
        let mut until = full;
        if let Some(api_at_base) = self.api_at_base {
            let stated = (expires_at - api_at_base)
                .to_std()
                .unwrap_or(Duration::ZERO);
            until = until.min(later(self.base, stated));
        }
        self.extend_to(until);
        full.saturating_duration_since(until).min(ttl)
    }

    fn extend_to(&self, until: Instant) {
        let until = until.saturating_duration_since(self.base);
        let micros = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        self.valid_until.fetch_max(micros, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_deadline_has_no_time_left() {
        let budget = Budget::from_epoch_ms(0, Duration::from_secs(5));
        assert_eq!(budget.until_cutoff(), Duration::ZERO);
        assert_eq!(budget.until_deadline(), Duration::ZERO);
    }

    #[test]
    fn absurd_deadline_is_clamped() {
        let budget = Budget::from_epoch_ms(u64::MAX, Duration::from_secs(5));
        assert!(budget.until_deadline() <= MAX_INVOCATION);
        assert!(budget.until_cutoff() <= MAX_INVOCATION - Duration::from_secs(5));
        assert!(budget.until_cutoff() > Duration::from_secs(60));
    }

    #[test]
    fn margin_larger_than_time_left_leaves_no_cutoff_budget() {
        let budget = Budget::from_time_left(Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!(budget.until_cutoff(), Duration::ZERO);
        assert!(budget.until_deadline() > Duration::ZERO);
    }

    #[test]
    fn later_saturates() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        assert_eq!(later(now, Duration::MAX), now + HORIZON);
    }

    #[test]
    fn cutoff_is_deadline_minus_margin() {
        let budget = Budget::from_time_left(Duration::from_secs(60), Duration::from_secs(10));
        assert_eq!(budget.deadline() - budget.cutoff(), Duration::from_secs(10));
    }
    #[test]
    fn validity_counts_from_the_send_time_and_never_moves_back() {
        let sent = Instant::now();
        let clock = LeaseClock::new(sent, Duration::from_secs(10));
        assert_eq!(clock.valid_until(), sent + Duration::from_secs(10));
        // A refresh sent 3 s later, confirmed.
        clock.confirm(sent + Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!(clock.valid_until(), sent + Duration::from_secs(13));
        // A late answer to an older request does not shorten it.
        clock.confirm(sent + Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(clock.valid_until(), sent + Duration::from_secs(13));
        // Nor does a TTL too large to add overflow.
        clock.confirm(sent, Duration::MAX);
        assert!(clock.valid_until() > sent + Duration::from_secs(1_000_000));
    }

    #[test]
    fn a_lease_the_api_dated_in_the_past_counts_for_what_is_left_of_it() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(3);
        let taken_at = Utc::now();
        // Dated from a transaction that began 24 s before the API took the claim.
        let stale = taken_at - chrono::TimeDelta::seconds(21);
        let clock = LeaseClock::claimed(sent, ttl, taken_at, Some(stale));
        assert_eq!(clock.valid_until(), sent);
        assert_eq!(clock.granted(), Duration::ZERO);
        // Half a second lost to it: the rest counts.
        let short = taken_at + chrono::TimeDelta::milliseconds(2500);
        let clock = LeaseClock::claimed(sent, ttl, taken_at, Some(short));
        assert_eq!(clock.granted(), Duration::from_millis(2500));
        // A renewal sent 1 s later and dated right: a full TTL from its send.
        let fresh = taken_at + chrono::TimeDelta::seconds(4);
        let lost = clock.confirm_until(sent + Duration::from_secs(1), ttl, fresh);
        assert_eq!(clock.valid_until(), sent + Duration::from_secs(4));
        assert_eq!(lost, Duration::ZERO);
        // One dated back (a stale transaction again) extends nothing.
        let lost = clock.confirm_until(sent + Duration::from_secs(2), ttl, taken_at);
        assert_eq!(clock.valid_until(), sent + Duration::from_secs(4));
        assert_eq!(lost, ttl);
    }

    #[test]
    fn a_lease_granted_in_full_counts_from_the_send_time() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(3);
        let taken_at = Utc::now();
        // The database's clock a little ahead, or the API took the claim late: capped at the TTL.
        let late = taken_at + chrono::TimeDelta::seconds(5);
        let clock = LeaseClock::claimed(sent, ttl, taken_at, Some(late));
        assert_eq!(clock.valid_until(), sent + ttl);
        // No stated end: the send time and the TTL.
        let clock = LeaseClock::claimed(sent, ttl, taken_at, None);
        assert_eq!(clock.valid_until(), sent + ttl);
    }
}
