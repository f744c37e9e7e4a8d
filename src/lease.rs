//! The lease of one claimed run: how long it is valid, and the refresher that keeps it so.
//!
//! **A lease is only as good as its last confirmed refresh.** The API dates a lease from when it
//! receives the request (`now + TTL`); the worker cannot know that moment, so it dates the
//! lease from when it *sent* the request whose answer confirmed it (the claim, then each
//! refresh), and never later than the end the API itself states for it ([`LeaseClock`]: a
//! lease the API's database dated back counts for what is left of it; a claim whose lease ends
//! before its first refresh is released unexecuted): [`LeaseClock::valid_until`] is never
//! later than the API's expiry. Every store call
//! an execution makes is bounded by it ([`crate::store`]), and the run's supervisor stops the
//! execution when it passes ([`LeaseEnd::Expired`]), so that no run executes past its lease:
//! past that moment the API's reaper may hand the run to another worker.
//!
//! The refresher starts at the claim, so that a run claimed ahead ([`crate::claim_ahead`])
//! keeps its lease while it waits for a slot, and refreshes the lease
//! (`POST /api/v1/internal/runs/{id}/lease`) every refresh interval until its bound (the
//! cutoff: from there the invocation writes the run's fate itself, after confirming the lease
//! once more). A refresh that fails is retried at once with a short backoff, each attempt
//! bounded by the lease's validity; when the validity runs out without a confirmed refresh
//! (the API is down, or accepts connections and never answers), the lease has
//! [expired](LeaseEnd::Expired). A refusal (409) ends it too: the refresher reads the run to
//! tell a cancel or a pause from another worker's takeover, after following a sub-workflow
//! child's lease to its root, as the reference worker does.
//!
//! **TTL and refresh interval.** Between two refreshes the lease must survive one interval
//! plus the time a refresh takes; everything beyond that is what failed refreshes can be
//! retried in before the lease expires: `TTL − interval`. The builder refuses an interval that
//! is not below the TTL; keep `TTL ≥ 2 × interval` (the default 90 s / 30 s leaves 60 s of
//! retries, enough to ride out an API restart).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use ironflow_engine::engine::chain_root;
use ironflow_store::entities::{LeaseRequest, Run, RunStatus};
use ironflow_store::error::StoreError;
use ironflow_store::store::Store;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};
use uuid::Uuid;

use crate::deadline::{LeaseClock, later};
use crate::store::fault::FaultLog;
use crate::store::scope::{CallScope, RunKey};

/// Longest wait between two attempts of a failed refresh: 1 s (less when the lease's validity
/// ends sooner).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a lease ended before its refresher's bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Another worker holds the run's lease now (the reaper took the run back and it was
    /// claimed again, or the lease was moved by hand).
    TakenOver {
        /// The worker that holds it, when the API says.
        held_by: Option<String>,
    },
    /// The run was cancelled through the API.
    Cancelled,
    /// The run left Running for another reason (an operator paused it; it ended).
    Left {
        /// Its status as read back.
        status: RunStatus,
    },
    /// The API refused the renewal without naming a holder (the run had left Running, or
    /// its lease was cleared), and the run's status could not be read back.
    Unexplained,
    /// No refresh was confirmed before the lease's validity ran out.
    Expired {
        /// The last refresh's error, if one failed (none: it got no answer at all).
        last_error: Option<String>,
    },
}

impl LeaseEnd {
    /// A sentence for the run's report and the log.
    pub fn describe(&self) -> String {
        match self {
            Self::TakenOver { held_by } => format!(
                "lease lost to another worker ({})",
                held_by.as_deref().unwrap_or("holder not named by the API")
            ),
            Self::Cancelled => "run cancelled through the API while it executed".to_string(),
            Self::Unexplained => "lease refused by the API, no holder named, and the run's \
                                  status could not be read: abandoned"
                .to_string(),
            Self::Left { status } => {
                format!("run left Running while it executed (now {status}): abandoned")
            }
            Self::Expired { last_error } => match last_error {
                Some(e) => format!(
                    "lease expired: no refresh confirmed within the lease TTL (last error: {e})"
                ),
                None => "lease expired: no refresh confirmed within the lease TTL (the API \
                         accepted connections but did not answer)"
                    .to_string(),
            },
        }
    }
}

/// A running refresher. Dropping it stops the task.
pub struct LeaseRefresher {
    clock: Arc<LeaseClock>,
    ended: watch::Receiver<Option<LeaseEnd>>,
    target: Arc<Mutex<Uuid>>,
    task: AbortOnDropHandle<()>,
}

/// What a refresher needs to reach the API: the invocation's store and the log its faults are
/// counted in.
#[derive(Clone)]
pub struct RefreshContext {
    /// The invocation's store (never the executions': their runtime may be blocked).
    pub store: Arc<dyn Store>,
    /// The invocation's fault log.
    pub faults: Arc<FaultLog>,
}

impl LeaseRefresher {
    /// Start refreshing the lease of `claimed` (the claim's answer), claimed under `lease` by
    /// a request sent at `claim_sent`, every `interval` until `until`. The lease is valid
    /// until `claim_sent` plus the TTL, or the end the answer states if that comes first
    /// ([`LeaseClock::claimed`]).
    pub fn spawn(
        ctx: RefreshContext,
        claimed: &Run,
        lease: LeaseRequest,
        claim_sent: Instant,
        interval: Duration,
        until: Instant,
    ) -> Self {
        let run_id = claimed.id;
        let clock = Arc::new(LeaseClock::claimed(
            claim_sent,
            lease.ttl,
            claimed.updated_at,
            claimed.lease_expires_at,
        ));
        let (end_tx, ended) = watch::channel(None);
        let target = Arc::new(Mutex::new(run_id));
        let refresh = Refresh {
            ctx,
            run_id,
            lease,
            first: later(claim_sent, interval),
            interval,
            until,
            clock: clock.clone(),
            target: target.clone(),
        };
        let task = AbortOnDropHandle::new(tokio::spawn(
            async move {
                if let Some(end) = refresh.run().await {
                    end_tx.send_replace(Some(end));
                }
            }
            .instrument(tracing::Span::current()),
        ));
        Self {
            clock,
            ended,
            target,
            task,
        }
    }

    /// The lease's validity, for the execution's store calls and its supervisor.
    pub fn clock(&self) -> &Arc<LeaseClock> {
        &self.clock
    }

    /// Resolves once the lease has ended (see [`LeaseEnd`]); never otherwise.
    pub async fn ended(&self) -> LeaseEnd {
        let mut ended = self.ended.clone();
        let end = match ended.wait_for(Option::is_some).await {
            Ok(end) => end.clone(),
            Err(_) => None,
        };
        match end {
            Some(end) => end,
            // The refresher returned at its bound without an end: the invocation decides.
            None => std::future::pending().await,
        }
    }

    /// How the lease ended, if it has.
    pub fn end(&self) -> Option<LeaseEnd> {
        self.ended.borrow().clone()
    }

    /// The run whose lease is held: the claimed run, or the root it was followed to.
    pub fn target(&self) -> Uuid {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stop refreshing and wait until the task has ended: no refresh is sent after this.
    /// For a run whose fate the invocation writes next (handback, timeout, panic, release of
    /// a run claimed ahead, a waiting run whose workflow got blocked).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// One refresher's loop.
struct Refresh {
    ctx: RefreshContext,
    run_id: Uuid,
    lease: LeaseRequest,
    /// When the first refresh is due: one interval after the claim was sent.
    first: Instant,
    interval: Duration,
    until: Instant,
    clock: Arc<LeaseClock>,
    target: Arc<Mutex<Uuid>>,
}

impl Refresh {
    /// Refresh until the bound (`None`) or until the lease ends.
    async fn run(self) -> Option<LeaseEnd> {
        let ttl = self.lease.ttl;
        let mut target = self.run_id;
        let mut next = self.first;
        let mut last_error: Option<String> = None;
        loop {
            if next >= self.until {
                // The bound comes first: the invocation decides the run's fate from here.
                return None;
            }
            sleep_until(next).await;
            let sent = Instant::now();
            let valid_until = self.clock.valid_until();
            if sent >= valid_until {
                return Some(self.expired(target, last_error));
            }
            match self.renew(target, valid_until).await {
                Ok(expires_at) => {
                    // A renewal the API dated back (a stale database transaction) extends the
                    // lease only as far as the API says.
                    let lost = self.clock.confirm_until(sent, ttl, expires_at);
                    if lost > self.interval {
                        warn!(
                            target_run_id = %target,
                            lost_ms = lost.as_millis() as u64,
                            "the API dated the renewed lease back (its database's clock \
                             reading was stale): the lease counts only to the end it stated"
                        );
                    }
                    last_error = None;
                    next = later(sent, self.interval);
                }
                Err(StoreError::LeaseLost { held_by, .. }) => {
                    if target == self.run_id
                        && let Some((root, expires_at)) = self.follow_to_root(valid_until).await
                    {
                        info!(run_id = %self.run_id, root_run_id = %root, "lease followed the run to its root");
                        target = root;
                        *self
                            .target
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = root;
                        self.clock.confirm_until(sent, ttl, expires_at);
                        next = later(sent, self.interval);
                        continue;
                    }
                    let end = self.why_refused(target, held_by, valid_until).await;
                    warn!(target_run_id = %target, reason = %end.describe(), "lease ended");
                    return Some(end);
                }
                Err(StoreError::RunNotFound(_)) => {
                    let end = LeaseEnd::TakenOver { held_by: None };
                    warn!(target_run_id = %target, "lease ended: the run no longer exists");
                    return Some(end);
                }
                Err(e) => {
                    // Retried until the validity ends (each attempt was bounded by it already).
                    warn!(target_run_id = %target, error = %e, "lease refresh failed, retrying");
                    last_error = Some(e.to_string());
                    let left = self
                        .clock
                        .valid_until()
                        .saturating_duration_since(Instant::now());
                    next = later(Instant::now(), RETRY_AFTER.min(left / 2));
                }
            }
        }
    }

    /// One renewal of `target`'s lease, retried on faults (the invocation's store), never past
    /// `valid_until`: the lease's end, on the API's clock.
    async fn renew(&self, target: Uuid, valid_until: Instant) -> Result<DateTime<Utc>, StoreError> {
        let key = RunKey::new(target, &self.lease);
        let scope = CallScope::returning(valid_until, self.ctx.faults.clone()).with_run(key);
        Arc::new(scope)
            .run(self.ctx.store.renew_lease(target, self.lease.clone()))
            .await
    }

    fn expired(&self, target: Uuid, last_error: Option<String>) -> LeaseEnd {
        let end = LeaseEnd::Expired { last_error };
        warn!(target_run_id = %target, ttl_secs = self.lease.ttl.as_secs(), reason = %end.describe(), "lease ended");
        end
    }

    /// Why the API refused to renew `target`'s lease: the run's status tells a cancel or a
    /// pause from another worker's takeover.
    async fn why_refused(&self, target: Uuid, held_by: Option<String>, until: Instant) -> LeaseEnd {
        let scope = Arc::new(CallScope::returning(until, self.ctx.faults.clone()));
        let run = scope.run(self.ctx.store.get_run(target)).await;
        match run {
            Ok(Some(run)) if run.status.state == RunStatus::Cancelled => LeaseEnd::Cancelled,
            Ok(Some(run)) if run.status.state != RunStatus::Running => LeaseEnd::Left {
                status: run.status.state,
            },
            Ok(Some(run)) => LeaseEnd::TakenOver {
                held_by: held_by.or(run.worker_id),
            },
            Ok(None) => LeaseEnd::TakenOver { held_by },
            // No status: only a holder the API named tells a takeover.
            Err(_) => match held_by {
                Some(_) => LeaseEnd::TakenOver { held_by },
                None => LeaseEnd::Unexplained,
            },
        }
    }

    /// The root run that took over the lease of sub-workflow child `run_id`, if its lease
    /// renews for this worker, with the renewed lease's end (the API's clock).
    async fn follow_to_root(&self, until: Instant) -> Option<(Uuid, DateTime<Utc>)> {
        let scope = Arc::new(CallScope::returning(until, self.ctx.faults.clone()));
        let store = &self.ctx.store;
        let lease = self.lease.clone();
        scope
            .run(async move {
                let run = store.get_run(self.run_id).await.ok()??;
                let root = chain_root(&run)?;
                store
                    .renew_lease(root, lease)
                    .await
                    .ok()
                    .map(|end| (root, end))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_says_what_happened() {
        assert!(LeaseEnd::Cancelled.describe().contains("cancelled"));
        assert!(LeaseEnd::Unexplained.describe().contains("no holder named"));
        assert!(
            LeaseEnd::TakenOver {
                held_by: Some("w2".into())
            }
            .describe()
            .contains("w2")
        );
        assert!(
            LeaseEnd::Expired { last_error: None }
                .describe()
                .contains("did not answer")
        );
        assert!(
            LeaseEnd::Left {
                status: RunStatus::Paused
            }
            .describe()
            .contains("Paused")
        );
    }
}
