//! Claim-ahead's pace: the moving averages of this warm instance's claim round trips and run
//! execution times, kept across invocations, and what they decide: whether one run may be
//! claimed while every slot is busy ([`RunPace::runs_ahead`]), and how many of an invocation's
//! first claims go out together ([`RunPace::first_claims`]). The claim loop acts on them
//! (`crate::invocation::slots`). Why and when it pays, and why a run claimed ahead is safe to
//! hold: `docs/design.md#claim-ahead`.
//!
//! Invariants: N (`IRONFLOW_MAX_RUNS_PER_INVOCATION`) bounds the runs claimed per invocation
//! and C (`IRONFLOW_CONCURRENCY`) the runs executing at once, whatever the pace; at most one run
//! waits for a slot; a threshold of 0 turns both decisions off (the reference worker's claims).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::report::Outcome;

/// No history: a cold start, or a failure since the last completed run.
const UNKNOWN: u64 = u64::MAX;

/// Weight of the newest sample in a moving average: 1/4.
const NEWEST_WEIGHT: u64 = 4;

/// A moving average of durations, in microseconds, that can be cleared.
#[derive(Debug)]
struct MovingAverage(AtomicU64);

impl MovingAverage {
    fn unknown() -> Self {
        Self(AtomicU64::new(UNKNOWN))
    }

    fn add(&self, sample: Duration) {
        let new = u64::try_from(sample.as_micros()).unwrap_or(UNKNOWN - 1);
        // Several invocations of one process may add at once (Lambda Managed Instances): each
        // sample moves the average from the value it replaces, none is lost.
        let moved = |old: u64| {
            Some(if old == UNKNOWN {
                new
            } else {
                (old.saturating_mul(NEWEST_WEIGHT - 1).saturating_add(new)) / NEWEST_WEIGHT
            })
        };
        // `moved` always gives a value: the update cannot be refused.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, moved);
    }

    fn clear(&self) {
        self.0.store(UNKNOWN, Ordering::Relaxed);
    }

    fn get(&self) -> Option<Duration> {
        let average = self.0.load(Ordering::Relaxed);
        (average != UNKNOWN).then(|| Duration::from_micros(average))
    }
}

/// The pace of this warm instance's claims and runs, kept across invocations (Lambda reuses
/// the process) and shared by the invocations in flight at once, and whether claiming ahead
/// pays.
#[derive(Debug)]
pub struct RunPace {
    percent: u32,
    /// Execution times of completed (or handed-back) runs.
    run: MovingAverage,
    /// Round trips of claims that the API answered.
    claim: MovingAverage,
    /// Whether this instance's last batch took its N.
    last_batch_full: AtomicBool,
}

impl RunPace {
    /// A pace with no history that claims ahead once a claim's round trip is at least
    /// `percent` % of a run's execution time (`0`: never).
    pub fn new(percent: u32) -> Self {
        Self {
            percent,
            run: MovingAverage::unknown(),
            claim: MovingAverage::unknown(),
            last_batch_full: AtomicBool::new(false),
        }
    }

    /// Take in how a batch ended: `full` when it took its N.
    pub fn record_batch_end(&self, full: bool) {
        self.last_batch_full.store(full, Ordering::Relaxed);
    }

    /// How many of an invocation's first claims go out together: one per slot (`concurrency`,
    /// at most `max_runs`) after a batch that took its N, else 1; always 1 with a threshold of
    /// 0 (the reference worker's claims, one at a time into a free slot).
    pub fn first_claims(&self, concurrency: usize, max_runs: usize) -> usize {
        if self.percent > 0 && self.last_batch_full.load(Ordering::Relaxed) {
            concurrency.min(max_runs).max(1)
        } else {
            1
        }
    }

    /// Take in how a run ended and how long it executed in this invocation.
    /// - Completed, Suspended, HandedBack: the execution time moves the average (the first
    ///   one sets it); a run handed back ran until the cutoff, so it pushes the average up.
    /// - Failed, TimedOut, Panicked (a failure of the workflow) and Released (slots stayed
    ///   busy until the claim window closed): the run history is cleared.
    /// - LeaseLost, PoisonBlocked: ignored, they say nothing about the pace.
    pub fn record(&self, outcome: Outcome, executed: Duration) {
        if outcome.is_workflow_failure() || outcome == Outcome::Released {
            self.run.clear();
        } else if matches!(
            outcome,
            Outcome::Completed | Outcome::Suspended | Outcome::HandedBack
        ) {
            self.run.add(executed);
        }
    }

    /// Take in the round trip of a claim the API answered (with a run or without).
    pub fn record_claim(&self, round_trip: Duration) {
        self.claim.add(round_trip);
    }

    /// Runs to claim beyond the free slots: 1 while claims take at least the configured
    /// share of a run, else 0 (and 0 without history).
    pub fn runs_ahead(&self) -> usize {
        let (Some(run), Some(claim)) = (self.run.get(), self.claim.get()) else {
            return 0;
        };
        usize::from(self.percent > 0 && claim * 100 >= run * self.percent)
    }

    /// The moving averages of run execution times and claim round trips; `None` without
    /// history.
    #[cfg(test)]
    pub fn averages(&self) -> (Option<Duration>, Option<Duration>) {
        (self.run.get(), self.claim.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn samples_added_at_once_from_several_threads_all_move_the_average() {
        let average = MovingAverage::unknown();
        let start: u64 = 1 << 40;
        average.add(Duration::from_micros(start));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        average.add(Duration::ZERO);
                    }
                });
            }
        });
        // Each zero sample takes a quarter off, whatever the order: 40 of them, none lost.
        let expected = (0..40).fold(start, |a, _| a * (NEWEST_WEIGHT - 1) / NEWEST_WEIGHT);
        assert_eq!(average.get(), Some(Duration::from_micros(expected)));
    }

    #[test]
    fn a_cold_start_claims_one_free_slot_at_a_time() {
        let pace = RunPace::new(10);
        assert_eq!(pace.runs_ahead(), 0);
        pace.record_claim(MS);
        assert_eq!(pace.runs_ahead(), 0, "no run has completed yet");
    }

    #[test]
    fn claims_that_are_a_large_share_of_a_run_claim_ahead_and_small_ones_do_not() {
        let pace = RunPace::new(10);
        pace.record(Outcome::Completed, 4 * MS);
        pace.record_claim(MS);
        assert_eq!(pace.runs_ahead(), 1, "a claim is 25 % of a run");
        assert_eq!(pace.averages(), (Some(4 * MS), Some(MS)));
        // A long run: (3·4 + 100) / 4 = 28 ms; 1 ms is under 10 % of it.
        pace.record(Outcome::Completed, 100 * MS);
        assert_eq!(pace.averages().0, Some(28 * MS));
        assert_eq!(pace.runs_ahead(), 0);
        // Slower claims bring it back: (3·1 + 13) / 4 = 4 ms ≥ 2.8 ms.
        pace.record_claim(13 * MS);
        assert_eq!(pace.runs_ahead(), 1);
    }

    #[test]
    fn a_workflow_failure_or_a_release_clears_the_run_history() {
        for clearing in [
            Outcome::Failed,
            Outcome::TimedOut,
            Outcome::Panicked,
            Outcome::Released,
        ] {
            let pace = RunPace::new(10);
            pace.record(Outcome::Completed, 5 * MS);
            pace.record_claim(5 * MS);
            pace.record(clearing, 5 * MS);
            assert_eq!(pace.runs_ahead(), 0, "{clearing:?}");
            assert_eq!(pace.averages().0, None, "{clearing:?}");
        }
    }

    #[test]
    fn a_suspended_run_moves_the_average_as_a_completed_one_does() {
        let pace = RunPace::new(10);
        pace.record(Outcome::Suspended, 5 * MS);
        assert_eq!(pace.averages().0, Some(5 * MS));
    }

    #[test]
    fn a_handback_counts_as_a_long_run_and_lease_losses_or_skips_are_ignored() {
        let pace = RunPace::new(10);
        pace.record(Outcome::Completed, 5 * MS);
        pace.record_claim(5 * MS);
        for ignored in [Outcome::LeaseLost, Outcome::PoisonBlocked] {
            pace.record(ignored, 60_000 * MS);
        }
        assert_eq!(pace.averages().0, Some(5 * MS));
        assert_eq!(pace.runs_ahead(), 1);
        // A run that executed until the cutoff.
        pace.record(Outcome::HandedBack, 880_000 * MS);
        assert_eq!(pace.runs_ahead(), 0);
    }

    #[test]
    fn first_claims_go_out_together_only_after_a_full_batch() {
        let pace = RunPace::new(10);
        assert_eq!(pace.first_claims(4, 8), 1, "cold start");
        pace.record_batch_end(true);
        assert_eq!(pace.first_claims(4, 8), 4);
        assert_eq!(pace.first_claims(4, 2), 2, "never more than N");
        pace.record_batch_end(false);
        assert_eq!(pace.first_claims(4, 8), 1);
    }

    #[test]
    fn zero_percent_never_claims_ahead_nor_together() {
        let pace = RunPace::new(0);
        pace.record(Outcome::Completed, MS);
        pace.record_claim(100 * MS);
        assert_eq!(pace.runs_ahead(), 0);
        pace.record_batch_end(true);
        assert_eq!(pace.first_claims(4, 8), 1);
    }
}
