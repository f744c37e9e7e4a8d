//! Claim-ahead: while every slot is busy, one more run is claimed, so that it starts the moment
//! a slot frees instead of one claim round trip later.
//!
//! The reference worker claims only once a slot is free: every run start waits for a claim
//! (`GET /api/v1/internal/runs/next`). For short runs that wait is a large share of a slot's
//! time: against a loopback API, about a fifth of a no-op run. For long runs it is negligible,
//! and a run claimed ahead would sit behind them while another instance could have started it.
//! So an invocation claims ahead only while the runs this warm instance completed lately were
//! short: the moving average of their execution times is below the threshold
//! (`IRONFLOW_CLAIM_AHEAD_BELOW_MS`, default 1000 ms; `0` never claims ahead). A cold start has
//! no history, so its first runs are claimed one free slot at a time.
//!
//! Whatever the pace, N (`IRONFLOW_MAX_RUNS_PER_INVOCATION`) still bounds the runs claimed per
//! invocation and C (`IRONFLOW_CONCURRENCY`) the runs executing at once; at most one run waits.
//!
//! A run claimed ahead is safe to hold:
//! - its lease refresher starts at the claim (every run's does, see [`crate::lease`]), so its
//!   lease cannot lapse while it waits;
//! - the invocation's claim loop starts it in the next slot that frees, after the run that
//!   ended there has been settled: the poison-pill gate checks its workflow with that
//!   outcome counted (a workflow blocked meanwhile: failed or deferred, not executed), and a
//!   lease found lost meanwhile abandons it unexecuted;
//! - if no slot frees before the claim window closes (`IRONFLOW_MIN_CLAIM_BUDGET_MS` before
//!   the cutoff, so it never starts with less time than a claim would have), it is written
//!   back to Pending without executing ([`crate::execution::Outcome::Released`]), after
//!   confirming its lease as a handback does; it does not count as a handback, and the
//!   wake-up after the batch brings the next invocation to it;
//! - a failed, timed-out or panicked run, or a release, clears the history, and a run handed
//!   back at the cutoff counts as a long one: claim-ahead runs only during a streak of short
//!   completed runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::execution::Outcome;

/// No history: a cold start, or a failure since the last completed run.
const UNKNOWN: u64 = u64::MAX;

/// Weight of the newest run in the moving average: 1/4.
const NEWEST_WEIGHT: u64 = 4;

/// The pace of the runs this warm instance completed, kept across invocations (Lambda reuses
/// the process), and whether it is short enough to claim ahead.
#[derive(Debug)]
pub struct RunPace {
    below: Duration,
    /// Exponential moving average of the execution times of completed runs, in microseconds;
    /// [`UNKNOWN`] without history.
    average_us: AtomicU64,
}

impl RunPace {
    /// A pace with no history that claims ahead once completed runs average under `below`
    /// (`Duration::ZERO`: never).
    pub fn new(below: Duration) -> Self {
        Self {
            below,
            average_us: AtomicU64::new(UNKNOWN),
        }
    }

    /// Take in how a run ended and how long it executed in this invocation.
    /// - Completed, HandedBack: the execution time moves the average (the first one sets
    ///   it); a run handed back ran until the cutoff, so it pushes the average up.
    /// - Failed, TimedOut, Panicked (a failure of the workflow) and Released (slots stayed
    ///   busy until the claim window closed): the history is cleared.
    /// - LeaseLost, PoisonBlocked: ignored, they say nothing about the pace.
    pub fn record(&self, outcome: Outcome, executed: Duration) {
        if outcome.is_workflow_failure() || outcome == Outcome::Released {
            self.average_us.store(UNKNOWN, Ordering::Relaxed);
            return;
        }
        if !matches!(outcome, Outcome::Completed | Outcome::HandedBack) {
            return;
        }
        let new = u64::try_from(executed.as_micros()).unwrap_or(UNKNOWN - 1);
        // Invocations run one at a time per instance; a lost update between overlapping local
        // invocations would only skew a heuristic.
        let old = self.average_us.load(Ordering::Relaxed);
        let average = if old == UNKNOWN {
            new
        } else {
            (old.saturating_mul(NEWEST_WEIGHT - 1).saturating_add(new)) / NEWEST_WEIGHT
        };
        self.average_us.store(average, Ordering::Relaxed);
    }

    /// Runs to claim beyond the free slots: 1 while completed runs average under the
    /// threshold, else 0.
    pub fn runs_ahead(&self) -> usize {
        let average = self.average_us.load(Ordering::Relaxed);
        usize::from(average != UNKNOWN && Duration::from_micros(average) < self.below)
    }

    /// The moving average of completed runs' execution times; `None` without history.
    pub fn average(&self) -> Option<Duration> {
        let average = self.average_us.load(Ordering::Relaxed);
        (average != UNKNOWN).then(|| Duration::from_micros(average))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_cold_start_claims_one_free_slot_at_a_time() {
        let pace = RunPace::new(1000 * MS);
        assert_eq!(pace.runs_ahead(), 0);
        assert_eq!(pace.average(), None);
    }

    #[test]
    fn completed_short_runs_claim_ahead_and_long_ones_stop_it() {
        let pace = RunPace::new(1000 * MS);
        pace.record(Outcome::Completed, 20 * MS);
        assert_eq!(pace.runs_ahead(), 1);
        assert_eq!(pace.average(), Some(20 * MS));
        // 20 → (3·20 + 4000) / 4 = 1015 ms: above the threshold.
        pace.record(Outcome::Completed, 4000 * MS);
        assert_eq!(pace.average(), Some(1015 * MS));
        assert_eq!(pace.runs_ahead(), 0);
        // Short runs bring it back under: 1015 → 766.25 ms.
        pace.record(Outcome::Completed, 20 * MS);
        assert_eq!(pace.runs_ahead(), 1);
    }

    #[test]
    fn a_workflow_failure_or_a_release_clears_the_history() {
        for clearing in [
            Outcome::Failed,
            Outcome::TimedOut,
            Outcome::Panicked,
            Outcome::Released,
        ] {
            let pace = RunPace::new(1000 * MS);
            pace.record(Outcome::Completed, 5 * MS);
            pace.record(clearing, 5 * MS);
            assert_eq!(pace.runs_ahead(), 0, "{clearing:?}");
            assert_eq!(pace.average(), None, "{clearing:?}");
        }
    }

    #[test]
    fn a_handback_counts_as_a_long_run_and_lease_losses_or_skips_are_ignored() {
        let pace = RunPace::new(1000 * MS);
        pace.record(Outcome::Completed, 5 * MS);
        for ignored in [Outcome::LeaseLost, Outcome::PoisonBlocked] {
            pace.record(ignored, 60_000 * MS);
        }
        assert_eq!(pace.average(), Some(5 * MS));
        // A run that executed until the cutoff: (3·5 + 880 000) / 4 ms.
        pace.record(Outcome::HandedBack, 880_000 * MS);
        assert_eq!(pace.runs_ahead(), 0);
    }

    #[test]
    fn a_zero_threshold_never_claims_ahead() {
        let pace = RunPace::new(Duration::ZERO);
        pace.record(Outcome::Completed, Duration::ZERO);
        assert_eq!(pace.runs_ahead(), 0);
    }
}
