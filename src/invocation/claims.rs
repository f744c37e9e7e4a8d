//! A claim's I/O: the request (`GET /api/v1/internal/runs/next`, retried by the invocation's
//! calls), the claim window it is awaited in, and the hint added to a claim the API refused.
//!
//! Invariant: a claim in flight when the claim window closes is not dropped (the API may have
//! taken a run for it): it is awaited until the cutoff ([`in_window`]), and a run it brings
//! then is released.

use std::future::Future;
use std::time::Duration;

use ironflow_store::entities::{Run, WorkerCapabilities};
use ironflow_store::error::StoreError;
use ironflow_store::store::RunStore;
use tokio::time::{Instant, timeout_at};
use tracing::error;

use crate::api::ApiClient;
use crate::context::Invocation;
use crate::report::FaultKind;

/// What a claim answers: a run under this invocation's lease, none pending, or an error.
pub(super) type Answer = Result<Option<Run>, StoreError>;

impl Invocation {
    /// Claim the next run this worker can take (`capabilities`), under the invocation's lease,
    /// with its own calls: a fault is retried (at most [`crate::store::CLAIM_ATTEMPTS`]
    /// attempts, none past the last write; the caller gives up on a claim still unanswered at
    /// the cutoff, [`in_window`]). A lost claim answer is retried although the API may have
    /// leased a run for it: the internal API has no way to find that run again (no route lists
    /// a worker's runs, and a claim is not idempotent), so it sits Running under a lease nobody
    /// refreshes until the reaper takes it back ([`lost_answers`] says so in the summary).
    pub(super) async fn claim(&self, capabilities: &WorkerCapabilities) -> Answer {
        let pick = self
            .calls
            .store
            .pick_next_pending_for(Some(self.lease.clone()), Some(capabilities.clone()));
        let until = self.budget.last_write();
        // Counted from before the request leaves: a read-back that finds a run Running under
        // this worker id waits for the answer, which may be this claim's.
        let in_flight = self.claims.claiming();
        let answer = self.calls.within(until, None, pick).await;
        if let Ok(Some(run)) = &answer {
            // Before anything else sees the run: a holding of it that began before this claim
            // ends here (a write giving it up landed, its answer lost).
            self.claims.claimed(run.id);
        }
        drop(in_flight);
        answer
    }
}

/// A claim's answer, as the claim window saw it ([`in_window`]).
pub(super) enum Windowed<T> {
    /// Answered before the claim window closed.
    InTime(T),
    /// Answered after the claim window closed, before the cutoff.
    Late(T),
    /// `claims` claims still unanswered at the cutoff; given up.
    Unanswered { claims: usize },
}

/// Await `claim` (`claims` claims sent together) until `window_end`, and one still in flight
/// then until `cutoff`, instead of dropping it as the window closes: the API may already have
/// taken a run for it, which would otherwise sit Running under a lease nobody refreshes until
/// the lease TTL runs out. The invocation waits for its running executions until the cutoff
/// anyway.
pub(super) async fn in_window<F: Future>(
    claim: F,
    claims: usize,
    window_end: Instant,
    cutoff: Instant,
) -> Windowed<F::Output> {
    let mut claim = std::pin::pin!(claim);
    if let Ok(answer) = timeout_at(window_end, claim.as_mut()).await {
        return Windowed::InTime(answer);
    }
    match timeout_at(cutoff, claim).await {
        Ok(answer) => Windowed::Late(answer),
        Err(_) => Windowed::Unanswered { claims },
    }
}

/// What becomes of a run the API leased for a claim whose answer never came: the reaper's
/// part, for the errors.
fn stranded(worker_id: &str, lease_ttl: Duration) -> String {
    format!(
        "a run the API leased to worker id {worker_id} for it stays Running until its lease \
         expires ({} s), then the API's reaper requeues it, using up one of its lease \
         recoveries, or fails it once they exceed its max_retries (docs/faults.md, \"Lost claim \
         answers\")",
        lease_ttl.as_secs()
    )
}

/// The error kept for `claims` still unanswered at the cutoff.
pub(super) fn unanswered(claims: usize, worker_id: &str, lease_ttl: Duration) -> String {
    let e = format!(
        "{claims} claim(s) still unanswered at the cutoff, given up: the API accepted the \
         connection but did not answer; {}",
        stranded(worker_id, lease_ttl)
    );
    error!("{e}");
    e
}

/// The error kept when claim attempts lost their answer after the request went out (the
/// connection failed, or no answer came within the attempt's bound; `faults`, the invocation's
/// fault counts): the API may have leased a run for each, which this invocation never received.
/// `None` when none did.
pub(super) fn lost_answers(
    faults: &[crate::report::ApiErrorCount],
    worker_id: &str,
    lease_ttl: Duration,
) -> Option<String> {
    let lost: u32 = faults
        .iter()
        .filter(|f| {
            f.route == crate::store::fault::CLAIM_ROUTE
                && matches!(f.kind, FaultKind::Transport | FaultKind::Timeout)
        })
        .map(|f| f.count)
        .sum();
    (lost > 0).then(|| {
        let e = format!(
            "{lost} claim attempt(s) lost their answer after the request went out (retried): {}",
            stranded(worker_id, lease_ttl)
        );
        error!("{e}");
        e
    })
}

/// After a claim the API refused (`worker API error: <body>`: ApiRunStore keeps no status, and
/// a wrong path has no body), the status of a read-only probe of the same API and the setting
/// it points to, appended to that claim's error ([`ApiClient::claim_refusal_hint`]). Once per
/// invocation, after the claim loop, while the invocation's runs (if any) go on, and given up
/// at `until`.
pub(super) async fn explain_refusal(
    api: &ApiClient,
    capabilities: &WorkerCapabilities,
    errors: &mut [String],
    until: Instant,
) {
    let Some(refused) = errors
        .iter_mut()
        .rev()
        .find(|e| e.contains("worker API error"))
    else {
        return;
    };
    if let Ok(Some(hint)) = timeout_at(until, api.claim_refusal_hint(capabilities)).await {
        *refused = format!("{} ({hint})", refused.trim_end());
    }
}
