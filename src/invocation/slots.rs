//! "May I claim now?": the claim loop's next step from the state of the slots, the run
//! waiting for one and the batch's count, decided without I/O (the loop in
//! [`super`] does the claiming, starting and waiting). How claim-ahead decides that a run
//! may wait for a slot: [`crate::claim_ahead`] and `docs/design.md#claim-ahead`.

use crate::report::StopReason;

/// What the claim loop knows before its next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlotState {
    /// Runs claimed so far in this invocation.
    pub claimed: usize,
    /// Runs this invocation may claim (N, or the event's `max_runs`).
    pub max_runs: usize,
    /// Whether the claim window (cutoff − minimum claim budget) is still open.
    pub window_open: bool,
    /// A slot is free: fewer than C runs execute.
    pub free_slot: bool,
    /// A claimed run waits for a slot.
    pub waiting: bool,
    /// Runs of the invocation's first claims not started yet.
    pub first_queued: bool,
    /// Why the first claims stopped the batch, once they are all started.
    pub first_stop: Option<StopReason>,
    /// Runs that may be claimed beyond the free slots (0 or 1, [`crate::claim_ahead`]).
    pub runs_ahead: usize,
}

/// The claim loop's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// The batch's claims are over.
    Stop(StopReason),
    /// Start the waiting run in the free slot.
    StartWaiting,
    /// Start the next of the first claims in the free slot.
    StartFirst,
    /// No slot is free: the next of the first claims becomes the waiting run.
    HoldFirst,
    /// Claim one run: into the free slot, or `ahead` of one (it then waits).
    Claim {
        /// No slot is free: the claimed run waits for one.
        ahead: bool,
    },
    /// Every slot is busy and nothing else may be done: wait for an execution to end.
    AwaitEnd,
}

/// The next step, in order: N claimed and nothing left to start → stop (`max_runs`); the claim
/// window closed → stop (`cutoff`); a waiting run starts as soon as a slot frees; the first
/// claims are started (or one held) before any other claim; once they are, the reason they
/// stopped for (no pending run, a claim error) stops the batch; then a claim, into a free slot
/// or one ahead when claim-ahead pays; else wait.
pub(super) fn next(s: SlotState) -> Next {
    if s.claimed >= s.max_runs && !s.waiting && !s.first_queued {
        return Next::Stop(StopReason::MaxRuns);
    }
    if !s.window_open {
        return Next::Stop(StopReason::Cutoff);
    }
    match (s.free_slot, s.waiting) {
        (true, true) => return Next::StartWaiting,
        (false, true) => return Next::AwaitEnd,
        (false, false) if s.runs_ahead == 0 => return Next::AwaitEnd,
        _ => {}
    }
    if s.first_queued {
        return if s.free_slot {
            Next::StartFirst
        } else {
            Next::HoldFirst
        };
    }
    if let Some(reason) = s.first_stop {
        return Next::Stop(reason);
    }
    Next::Claim {
        ahead: !s.free_slot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of 8 with claims open, a free slot and nothing claimed ahead.
    fn state() -> SlotState {
        SlotState {
            claimed: 0,
            max_runs: 8,
            window_open: true,
            free_slot: true,
            waiting: false,
            first_queued: false,
            first_stop: None,
            runs_ahead: 0,
        }
    }

    #[test]
    fn a_free_slot_claims_and_a_busy_one_waits_unless_claim_ahead_pays() {
        assert_eq!(next(state()), Next::Claim { ahead: false });
        let busy = SlotState {
            free_slot: false,
            ..state()
        };
        assert_eq!(next(busy), Next::AwaitEnd);
        let ahead = SlotState {
            runs_ahead: 1,
            ..busy
        };
        assert_eq!(next(ahead), Next::Claim { ahead: true });
    }

    #[test]
    fn at_most_one_run_waits_and_it_starts_first() {
        let waiting = SlotState {
            waiting: true,
            runs_ahead: 1,
            ..state()
        };
        assert_eq!(next(waiting), Next::StartWaiting);
        let busy = SlotState {
            free_slot: false,
            ..waiting
        };
        assert_eq!(next(busy), Next::AwaitEnd, "no second run claimed ahead");
    }

    #[test]
    fn n_claimed_stops_only_once_nothing_is_left_to_start() {
        let full = SlotState {
            claimed: 8,
            ..state()
        };
        assert_eq!(next(full), Next::Stop(StopReason::MaxRuns));
        let waiting = SlotState {
            waiting: true,
            ..full
        };
        assert_eq!(next(waiting), Next::StartWaiting);
        let first = SlotState {
            first_queued: true,
            ..full
        };
        assert_eq!(next(first), Next::StartFirst);
        let closed = SlotState {
            window_open: false,
            ..full
        };
        assert_eq!(next(closed), Next::Stop(StopReason::MaxRuns));
    }

    #[test]
    fn a_closed_window_stops_the_claims_even_with_a_run_waiting() {
        let closed = SlotState {
            window_open: false,
            waiting: true,
            ..state()
        };
        assert_eq!(next(closed), Next::Stop(StopReason::Cutoff));
    }

    #[test]
    fn first_claims_start_before_any_other_claim_and_then_give_their_stop() {
        let first = SlotState {
            first_queued: true,
            first_stop: Some(StopReason::NoPendingRun),
            ..state()
        };
        assert_eq!(next(first), Next::StartFirst);
        let busy = SlotState {
            free_slot: false,
            runs_ahead: 1,
            ..first
        };
        assert_eq!(next(busy), Next::HoldFirst);
        let without_ahead = SlotState {
            runs_ahead: 0,
            ..busy
        };
        assert_eq!(next(without_ahead), Next::AwaitEnd);
        let started = SlotState {
            first_queued: false,
            ..first
        };
        assert_eq!(next(started), Next::Stop(StopReason::NoPendingRun));
    }
}
