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
//! its run recorded after that ends it ([`Holding::superseded`], [`Holding::ended`]). From then
//! on its calls are not sent ([`super::guard`]), its execution is stopped, and its read-backs
//! say the run left it (a Pending or Retrying write landed: a claim takes only such a run), so
//! that only the latest claim's execution writes the run. A claim is counted from before its
//! request leaves ([`ClaimLog::claiming`]): while one is unanswered, the API may already have
//! given it a run that a read-back would take for its own, and such a read-back waits for the
//! claims unanswered at its first such read ([`WriteSent`]), not for later ones (which
//! cannot have brought the run it read), so that a busy claim loop never holds it up.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The claims one invocation made: for each run it claimed, the number of its latest claim
/// (numbers grow by one from 1 in claim order), and the claims still unanswered. One per
/// invocation, dropped with it: at most one entry per run it claimed or held.
#[derive(Debug, Default)]
pub struct ClaimLog {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Claims recorded so far: the number of the latest.
    recorded: u64,
    /// Claims sent so far: the ticket of the latest.
    issued: u64,
    /// The tickets of the claims sent and not answered yet ([`ClaimInFlight`]).
    in_flight: BTreeSet<u64>,
    /// Each claimed (or held) run's latest claim.
    runs: HashMap<Uuid, RunClaims>,
}

#[derive(Debug, Default)]
struct RunClaims {
    /// The number of the run's latest claim (0: held without a claim of this invocation).
    latest: u64,
    /// Cancelled by the run's next claim: the holdings that began before it end.
    ended: CancellationToken,
}

impl ClaimLog {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a few increments and one insert: a panic cannot leave it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A claim about to be sent: counted as unanswered until the returned guard drops, which
    /// the claim's caller drops after [`ClaimLog::claimed`] if it brought a run.
    pub fn claiming(self: &Arc<Self>) -> ClaimInFlight {
        let mut state = self.state();
        state.issued = state.issued.saturating_add(1);
        let ticket = state.issued;
        state.in_flight.insert(ticket);
        ClaimInFlight {
            log: self.clone(),
            ticket,
        }
    }

    /// Record a claim that brought `run_id`: every holding of the run that began before it
    /// ends (its [`Holding::ended`] token is cancelled).
    pub fn claimed(&self, run_id: Uuid) {
        let mut state = self.state();
        state.recorded = state.recorded.saturating_add(1);
        let latest = state.recorded;
        let previous = state.runs.insert(
            run_id,
            RunClaims {
                latest,
                ended: CancellationToken::new(),
            },
        );
        if let Some(previous) = previous {
            previous.ended.cancel();
        }
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

/// A claim sent and not answered yet ([`ClaimLog::claiming`]); uncounted on drop.
#[derive(Debug)]
pub struct ClaimInFlight {
    log: Arc<ClaimLog>,
    ticket: u64,
}

impl Drop for ClaimInFlight {
    fn drop(&mut self) {
        self.log.state().in_flight.remove(&self.ticket);
    }
}

/// A write's first send, for its read-backs ([`Holding::write_sent`]): the holding as of then,
/// from which a claim of the run written is a later one, and the unanswered claims the
/// read-backs wait for: those in flight at the first read-back that could not tell the run it
/// found from one a claim brought (a claim sent after that read cannot have brought it).
#[derive(Debug)]
pub struct WriteSent {
    from: Holding,
    /// The latest ticket awaited; 0 until a read-back had to wait.
    awaited_through: AtomicU64,
}

impl WriteSent {
    /// Where the write's run `run_id` stands for its next read-back, read at once (a claim
    /// answered between two separate reads would be missed by both). The first time claims
    /// are unanswered, the read-backs take them all to wait for; from then on only those count.
    pub fn standing(&self, run_id: Uuid) -> Standing {
        let state = self.from.log.state();
        if state
            .runs
            .get(&run_id)
            .is_some_and(|r| r.latest > self.from.since)
        {
            return Standing::ClaimedAgain;
        }
        let through = match self.awaited_through.load(Ordering::Acquire) {
            0 => state.issued,
            through => through,
        };
        if state.in_flight.range(..=through).next().is_none() {
            return Standing::Held;
        }
        self.awaited_through.store(through, Ordering::Release);
        Standing::ClaimInFlight
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
            .runs
            .get(&run_id)
            .is_some_and(|r| r.latest > self.since)
    }

    /// Cancelled once the invocation claims `run_id` after this holding began (at once if it
    /// already did): what stops the holding's execution.
    pub fn ended(&self, run_id: Uuid) -> CancellationToken {
        let mut state = self.log.state();
        let run = state.runs.entry(run_id).or_default();
        if run.latest > self.since {
            let ended = CancellationToken::new();
            ended.cancel();
            return ended;
        }
        run.ended.clone()
    }

    /// The same invocation's holding beginning now: the point a lease moved to another run,
    /// from which a claim of that run is a later one.
    pub fn now(&self) -> Holding {
        self.log.holding()
    }

    /// A write of this invocation sent now ([`WriteSent`]).
    pub fn write_sent(&self) -> WriteSent {
        WriteSent {
            from: self.now(),
            awaited_through: AtomicU64::new(0),
        }
    }
}

/// Where the run of a write stands for its read-back ([`WriteSent::standing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// No later claim of the run, none unanswered.
    Held,
    /// A claim of the invocation is unanswered: it may have brought the run again.
    ClaimInFlight,
    /// The invocation claimed the run again since the holding began.
    ClaimedAgain,
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

    #[test]
    fn a_later_claim_cancels_the_holdings_before_it_and_unanswered_claims_are_counted() {
        let log = Arc::new(ClaimLog::default());
        let (run, root) = (Uuid::now_v7(), Uuid::now_v7());
        log.claimed(run);
        let holding = log.holding();
        let (own, held_root) = (holding.ended(run), holding.ended(root));
        assert!(!own.is_cancelled() && !held_root.is_cancelled());

        let sent = holding.write_sent();
        let in_flight = log.claiming();
        assert_eq!(sent.standing(run), Standing::ClaimInFlight);
        let later = log.claiming();
        log.claimed(run);
        assert_eq!(sent.standing(run), Standing::ClaimedAgain);
        drop(in_flight);
        assert_eq!(
            sent.standing(root),
            Standing::Held,
            "a claim sent after the first read that waited is not awaited"
        );
        assert_eq!(holding.write_sent().standing(root), Standing::ClaimInFlight);
        drop(later);
        assert!(own.is_cancelled(), "its run claimed again");
        assert!(!held_root.is_cancelled());
        assert!(holding.ended(run).is_cancelled(), "asked after the claim");
        assert!(
            !holding.now().ended(run).is_cancelled(),
            "the later holding's"
        );

        log.claimed(root);
        assert!(
            held_root.is_cancelled(),
            "a run held without a claim, claimed since"
        );
    }
}
