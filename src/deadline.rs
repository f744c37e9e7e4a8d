//! Deadline arithmetic: from `Context.deadline` (ms since the Unix epoch) to every bound one
//! invocation works against ([`Budget`]: the cutoff, the last write, the claim window's end, the
//! fair share, the wake-up phase's end), the time reserves those bounds keep ([`bounds`]), and
//! until when a run's lease is valid ([`LeaseClock`]).
//!
//! Invariant: each bound of an invocation is derived here, once, from the deadline and the
//! settings; the rest of the crate reads it from the [`Budget`]. Every conversion saturates: a
//! deadline of `0`, one already past, or one absurdly far in the future never panics. A past
//! deadline gives a cutoff that has already passed, so nothing is claimed.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::{info, warn};

/// The time reserves of an invocation's bounds, each defined once.
pub mod bounds {
    use std::time::Duration;

    /// Time kept for the response after our last write to the API: 250 ms (the invocation's
    /// last write, [`super::Budget::last_write`], and the webhook receiver's last call,
    /// [`super::webhook_until`]).
    pub const RESPONSE_RESERVE: Duration = Duration::from_millis(250);

    /// Time kept free before the invocation deadline by the wake-up phase: 500 ms.
    pub const WAKE_DEADLINE_RESERVE: Duration = Duration::from_millis(500);

    /// Longest the wake-up phase takes (pending count, queue attributes, send): 5 s.
    pub const WAKE_PHASE_TIMEOUT: Duration = Duration::from_secs(5);

    /// The longest a webhook request's calls take (pending count, queue depth, send): 3 s.
    pub const WEBHOOK_TIME: Duration = Duration::from_secs(3);
}

use self::bounds::{RESPONSE_RESERVE, WAKE_DEADLINE_RESERVE, WAKE_PHASE_TIMEOUT, WEBHOOK_TIME};

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Time left until `deadline_ms` (ms since the epoch), zero once it has passed.
pub fn time_left(deadline_ms: u64) -> Duration {
    Duration::from_millis(deadline_ms.saturating_sub(now_ms()))
}

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

/// Until when a webhook request's calls may go on, its invocation's deadline `deadline_ms`
/// (ms since the epoch): [`WEBHOOK_TIME`] at most, keeping [`RESPONSE_RESERVE`] free before the
/// deadline. Answered within milliseconds: an emulator's past deadline gives the calls their
/// usual time.
pub fn webhook_until(deadline_ms: u64) -> Instant {
    let left = time_left(deadline_ms);
    let time = if left.is_zero() {
        WEBHOOK_TIME
    } else {
        WEBHOOK_TIME.min(left.saturating_sub(RESPONSE_RESERVE))
    };
    Instant::now() + time
}

/// The time budget of one invocation, anchored on the monotonic clock: every bound it works
/// against.
///
/// ```text
/// start ─ claims ─ claim window's end ─ min claim budget ─ cutoff ─ margin ─ deadline
///                                         last write = deadline − RESPONSE_RESERVE ┘
/// ```
///
/// `deadline` is when Lambda stops the invocation; `cutoff` is `deadline − margin`
/// (`IRONFLOW_DEADLINE_MARGIN_MS`), the moment by which every run still executing must have
/// been handed back.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    deadline: Instant,
    cutoff: Instant,
    last_write: Instant,
    claim_window_end: Option<Instant>,
    start: Instant,
}

impl Budget {
    /// The budget of an invocation whose `Context.deadline` is `deadline_ms` (ms since the
    /// Unix epoch), with the deadline `margin` (`IRONFLOW_DEADLINE_MARGIN_MS`) and the
    /// `min_claim_budget` (`IRONFLOW_MIN_CLAIM_BUDGET_MS`). An emulator's deadline (one already
    /// past, as `cargo lambda watch` sends, in 1970) gives the `emulated` length
    /// (`IRONFLOW_EMULATED_INVOCATION_SECS`) when there is one. Reads the wall clock once.
    pub fn for_context(
        deadline_ms: u64,
        margin: Duration,
        min_claim_budget: Duration,
        emulated: Option<Duration>,
    ) -> Self {
        let now = now_ms();
        let past = deadline_ms <= now;
        let wall_left = Duration::from_millis(deadline_ms.saturating_sub(now));
        let left = match emulated {
            Some(length) if past => {
                info!(
                    deadline_ms,
                    invocation_secs = length.as_secs(),
                    "Context.deadline has passed: emulated invocation (IRONFLOW_EMULATED_INVOCATION_SECS)"
                );
                length
            }
            None if past => {
                past_deadline_once(deadline_ms);
                wall_left
            }
            _ => wall_left,
        };
        Self::from_time_left(left, margin, min_claim_budget)
    }

    /// Budget for an invocation with `left` time until its deadline (clamped to
    /// [`MAX_INVOCATION`]), `margin` kept free before it, and claims ending `min_claim_budget`
    /// before the cutoff.
    pub fn from_time_left(left: Duration, margin: Duration, min_claim_budget: Duration) -> Self {
        let now = Instant::now();
        let left = left.min(MAX_INVOCATION);
        let deadline = later(now, left);
        let cutoff = later(now, left.saturating_sub(margin));
        Self {
            deadline,
            // Our own last writes (handbacks, log pushes, heartbeat) end a little before the
            // deadline, so that the response still goes out in time.
            last_write: deadline.checked_sub(RESPONSE_RESERVE).unwrap_or(now),
            claim_window_end: cutoff.checked_sub(min_claim_budget),
            cutoff,
            start: now,
        }
    }

    /// This budget for an invocation that starts now (once admitted): its [`Budget::start`]
    /// and [`Budget::fair_share`] count from now.
    pub fn started(self) -> Self {
        Self {
            start: Instant::now(),
            ..self
        }
    }

    /// When Lambda ends the invocation.
    #[cfg(test)]
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When every run still executing is handed back (`deadline − margin`).
    pub fn cutoff(&self) -> Instant {
        self.cutoff
    }

    /// No write of ours past this: the deadline minus [`RESPONSE_RESERVE`].
    pub fn last_write(&self) -> Instant {
        self.last_write
    }

    /// The claim window's end, while it is open: no claim past the cutoff minus the minimum
    /// claim budget (`IRONFLOW_MIN_CLAIM_BUDGET_MS`); `None` once it has passed, or when there
    /// was none at all.
    pub fn open_window(&self) -> Option<Instant> {
        self.claim_window_end.filter(|end| Instant::now() < *end)
    }

    /// When the invocation started: a run that starts later may gain that time by a deferral.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Half of the invocation's window, from its start to its cutoff: a cutoff counts for the
    /// loop guard only when the run executed at least this long
    /// ([`crate::context::HandbackPolicy::fair_share`]).
    pub fn fair_share(&self) -> Duration {
        self.cutoff.saturating_duration_since(self.start) / 2
    }

    /// Until when the wake-up phase may go on: [`WAKE_PHASE_TIMEOUT`] from now at most,
    /// keeping [`WAKE_DEADLINE_RESERVE`] free before the deadline; `None` once that has passed.
    pub fn wake_phase_end(&self) -> Option<Instant> {
        self.deadline
            .checked_sub(WAKE_DEADLINE_RESERVE)
            .map(|d| d.min(Instant::now() + WAKE_PHASE_TIMEOUT))
            .filter(|until| *until > Instant::now())
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

/// Say once per process that `Context.deadline` has already passed: an emulator sends such a
/// deadline (`cargo lambda watch`: 600000 ms after the epoch, in 1970), and nothing can be
/// claimed against it until `IRONFLOW_EMULATED_INVOCATION_SECS` gives emulated invocations a
/// length. Lambda itself always sends a future deadline.
fn past_deadline_once(deadline_ms: u64) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        warn!(
            deadline_ms,
            "Context.deadline has already passed (an emulator's constant deadline, as cargo \
             lambda watch sends): nothing can be claimed; set IRONFLOW_EMULATED_INVOCATION_SECS \
             to give emulated invocations a length"
        );
    });
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

    /// The budget of `deadline_ms` with a deadline margin of 5 s, no claim budget, no emulation.
    fn for_context(deadline_ms: u64) -> Budget {
        Budget::for_context(deadline_ms, Duration::from_secs(5), Duration::ZERO, None)
    }

    #[test]
    fn zero_deadline_has_no_time_left() {
        let budget = for_context(0);
        assert_eq!(budget.until_cutoff(), Duration::ZERO);
        assert_eq!(budget.until_deadline(), Duration::ZERO);
    }

    #[test]
    fn absurd_deadline_is_clamped() {
        let budget = for_context(u64::MAX);
        assert!(budget.until_deadline() <= MAX_INVOCATION);
        assert!(budget.until_cutoff() <= MAX_INVOCATION - Duration::from_secs(5));
        assert!(budget.until_cutoff() > Duration::from_secs(60));
    }

    #[test]
    fn margin_larger_than_time_left_leaves_no_cutoff_budget() {
        let budget = Budget::from_time_left(
            Duration::from_secs(3),
            Duration::from_secs(10),
            Duration::ZERO,
        );
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
    fn every_bound_follows_from_the_deadline_and_the_settings() {
        let (margin, min_claim) = (Duration::from_secs(10), Duration::from_secs(2));
        let budget = Budget::from_time_left(Duration::from_secs(60), margin, min_claim);
        assert_eq!(budget.deadline() - budget.last_write(), RESPONSE_RESERVE);
        let window_end = budget.open_window().unwrap();
        assert_eq!(budget.cutoff() - window_end, min_claim);
        assert_eq!(budget.fair_share(), Duration::from_secs(25));
        let wake_end = budget.wake_phase_end().unwrap();
        assert!(wake_end <= Instant::now() + WAKE_PHASE_TIMEOUT);
        // Too little time for a claim: no claim window; none for the wake-up phase.
        let short = Budget::from_time_left(Duration::from_millis(400), Duration::ZERO, min_claim);
        assert!(short.open_window().is_none());
        assert!(short.wake_phase_end().is_none());
        // Started later (once admitted), the fair share is half of what is left then.
        assert!(budget.started().fair_share() <= budget.fair_share());
    }

    #[test]
    fn cutoff_is_deadline_minus_margin() {
        let budget = Budget::from_time_left(
            Duration::from_secs(60),
            Duration::from_secs(10),
            Duration::ZERO,
        );
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
