//! The claims of one invocation, numbered, so that the calls made for one claim of a run never
//! act on a later claim of the same run by the same invocation.
//!
//! Every claim of an invocation asks for the lease under the invocation's one worker id, and
//! the API checks no holder on a run's writes. So when a write giving a run up (a handback's
//! Pending, the engine's retry or sleep) lands but its answer is lost, and the invocation's
//! claim loop claims the run again before the write is read back, the run is Running under
//! "our" worker id once more: the read-back cannot tell its own holding from the new one by
//! the worker id, and a write sent again would take the run from the execution that claimed
//! it (found by the chaos suite: the second execution went on without its lease).
//!
//! Invariant: a holding ([`Holding`]) began when its claim was recorded or later; a claim of
//! its run recorded after that ends it ([`Holding::superseded`]). From then on its calls are
//! not sent ([`super::guard`]) and its read-backs say the run left it (a Pending write landed:
//! the run was Pending to be claimed again), so that only the latest claim's execution writes
//! the run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use uuid::Uuid;

/// The claims one invocation made: for each run it claimed, the number of its latest claim
/// (numbers grow by one from 1 in claim order). One per invocation, dropped with it: at most
/// one entry per run it claimed.
#[derive(Debug, Default)]
pub struct ClaimLog {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Claims recorded so far: the number of the latest.
    recorded: u64,
    /// Each claimed run's latest claim.
    latest: HashMap<Uuid, u64>,
}

impl ClaimLog {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is one increment and one insert: a panic cannot leave it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Record a claim that brought `run_id`: every holding of the run that began before it
    /// ends.
    pub fn claimed(&self, run_id: Uuid) {
        let mut state = self.state();
        state.recorded = state.recorded.saturating_add(1);
        let n = state.recorded;
        state.latest.insert(run_id, n);
    }

    /// A holding beginning now: of a run this invocation just claimed (its claim is recorded),
    /// or holds without a claim of its own (a sub-workflow chain's root, whose lease moved to
    /// it).
    pub fn holding(self: &Arc<Self>) -> Holding {
        Holding {
            since: self.state().recorded,
            log: self.clone(),
        }
    }
}

/// One holding of a run by an invocation: the claims recorded when it began. Carried by the
/// run's [`super::scope::RunKey`], and so by every scope of calls made for it.
#[derive(Debug, Clone)]
pub struct Holding {
    log: Arc<ClaimLog>,
    since: u64,
}

impl Holding {
    /// Whether the invocation claimed `run_id` again after this holding began: the run is
    /// that claim's now.
    pub fn superseded(&self, run_id: Uuid) -> bool {
        self.log
            .state()
            .latest
            .get(&run_id)
            .is_some_and(|&n| n > self.since)
    }
}

/// Two holdings are the same when they began at the same point of the same invocation's
/// claims.
impl PartialEq for Holding {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.log, &other.log) && self.since == other.since
    }
}

impl Eq for Holding {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_later_claim_of_the_same_run_supersedes_a_holding() {
        let log = Arc::new(ClaimLog::default());
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        log.claimed(a);
        let holding = log.holding();
        assert!(!holding.superseded(a), "its own claim");
        log.claimed(b);
        assert!(!holding.superseded(a), "another run's claim");
        assert!(!holding.superseded(Uuid::nil()), "a run never claimed");
        log.claimed(a);
        assert!(holding.superseded(a), "claimed again since");
        assert!(!log.holding().superseded(a), "the new claim's holding");
    }

    #[test]
    fn holdings_of_different_invocations_differ() {
        let (one, two) = (Arc::new(ClaimLog::default()), Arc::new(ClaimLog::default()));
        let before = one.holding();
        assert_eq!(before, one.holding());
        assert_ne!(before, two.holding());
        one.claimed(Uuid::nil());
        assert_ne!(before, one.holding(), "began after another claim");
    }
}
