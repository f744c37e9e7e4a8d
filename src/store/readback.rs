//! Reading back a write whose answer was lost (a reset, a timeout, a 5xx after the write
//! landed): the store tells whether it landed, must be sent again, or can no longer apply
//! because the run left this worker ([`ReadBack`]). `guard::write` calls these after a
//! write's fault, before deciding to send it again.
//!
//! A write of a holding the invocation has since claimed again
//! ([`CallScope::claimed_again`]: `guard` sends none of its calls), or about a run the
//! invocation claimed after the write was sent, is never sent again, whatever the run reads:
//! the run is the later claim's, under the same worker id. While a claim is unanswered, a run
//! read Running under this worker id may be its: the read-back says [`ReadBack::Unknown`] and
//! is made again.
//!
//! [`CallScope::claimed_again`]: super::scope::CallScope::claimed_again

use ironflow_store::prelude::*;
use uuid::Uuid;

use super::GuardedStore;
use super::claim_log::{Standing, WriteSent};
use super::guard::ReadBack;
use super::scope::CallScope;

impl GuardedStore {
    /// Read back a run write whose answer was lost: did it reach `target` (`None`: a write
    /// that changes no status)? A write that releases the scope's own run's lease (`releases`:
    /// ironflow-engine's `resume_chain`, once the chain's root took it) landed if the run,
    /// still Running, has no holder. `sent`: the write's first send ([`WriteSent`], one for all
    /// its read-backs), from which a claim of the run is a later one.
    pub(super) async fn run_write_landed(
        &self,
        id: Uuid,
        target: Option<RunStatus>,
        releases: bool,
        sent: Option<&WriteSent>,
    ) -> ReadBack<()> {
        let run = match self.inner().get_run(id).await {
            Ok(Some(run)) => run,
            _ => return ReadBack::Unknown,
        };
        let status = run.status.state;
        // Read after the run: a claim answered since the read is seen here.
        let standing = sent.map_or(Standing::Held, |s| s.standing(id));
        let scope = CallScope::current();
        let Some(key) = scope.run_key().filter(|k| k.run_id == id) else {
            // Not the scope's own run (a sub-workflow's, the chain's root): the API refuses a
            // transition that no longer applies. Claimed by this invocation since the write
            // was sent, it is the later claim's: not sent again.
            return match standing {
                _ if target == Some(status) => ReadBack::Applied(()),
                Standing::ClaimedAgain => ReadBack::Applied(()),
                Standing::ClaimInFlight if status == RunStatus::Running => ReadBack::Unknown,
                _ => ReadBack::Resend,
            };
        };
        if scope.claimed_again() {
            // A claim takes a Pending or Retrying run: a write to either landed (or the reaper
            // requeued the run: the later claim has it all the same). Any other write's fate
            // is unknown, and no longer this holding's to write.
            return match target {
                Some(RunStatus::Pending | RunStatus::Retrying) => ReadBack::Applied(()),
                _ => ReadBack::RunLeft {
                    status,
                    held_by: run.worker_id,
                },
            };
        }
        let ours = run.worker_id.as_deref() == Some(key.worker_id.as_str());
        if releases && target.is_none() && status == RunStatus::Running && run.worker_id.is_none() {
            return ReadBack::Applied(());
        }
        match target {
            Some(target) if status == target && (status != RunStatus::Running || ours) => {
                ReadBack::Applied(())
            }
            // A handback's Pending landed, and another worker has claimed the run since.
            Some(RunStatus::Pending) if status == RunStatus::Running && !ours => {
                ReadBack::Applied(())
            }
            // Running under this worker id: its own holding, unless an unanswered claim of the
            // invocation brought it again; read again once that claim is answered.
            _ if status == RunStatus::Running && ours && standing == Standing::ClaimInFlight => {
                ReadBack::Unknown
            }
            _ if status == RunStatus::Running && ours => ReadBack::Resend,
            _ => ReadBack::RunLeft {
                status,
                held_by: run.worker_id,
            },
        }
    }

    /// Read back a step write whose answer was lost: is the step at `target`?
    pub(super) async fn step_write_landed(
        &self,
        step_id: Uuid,
        target: Option<StepStatus>,
    ) -> ReadBack<()> {
        let scope = CallScope::current();
        let Some(key) = scope.run_key() else {
            return ReadBack::Resend;
        };
        match self.inner().list_steps(key.run_id).await {
            Ok(steps) => match steps.iter().find(|s| s.id == step_id) {
                Some(step) if target == Some(step.status.state) => ReadBack::Applied(()),
                // Settled otherwise: interrupted by an operator's pause or the reaper. The run
                // changed too: its next read goes to the API.
                Some(step) if step.status.state.is_terminal() => {
                    self.forget(key.run_id);
                    ReadBack::Refused(format!(
                        "step {step_id} is {} ({}): the API refuses to write it {}",
                        step.status.state,
                        step.error.as_deref().unwrap_or("no error"),
                        target.map_or("again".to_string(), |t| format!("{t}"))
                    ))
                }
                _ => ReadBack::Resend,
            },
            Err(_) => ReadBack::Unknown,
        }
    }

    /// Read back a step creation whose answer was lost: a step of the run with its name,
    /// position and kind, still Pending, that this execution had not seen before.
    pub(super) async fn step_created(&self, new: &NewStep) -> ReadBack<Step> {
        let scope = CallScope::current();
        match self.inner().list_steps(new.run_id).await {
            Ok(steps) => steps
                .into_iter()
                .filter(|s| {
                    s.name == new.name
                        && s.position == new.position
                        && s.kind == new.kind
                        && s.is_error_handler == new.is_error_handler
                        && s.status.state == StepStatus::Pending
                        && !scope.has_seen_step(s.id)
                })
                .max_by_key(|s| s.created_at)
                .map_or(ReadBack::Resend, ReadBack::Applied),
            Err(_) => ReadBack::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ironflow_store::memory::InMemoryStore;
    use tokio::time::Instant;

    use ironflow_store::entities::LeaseRequest;

    use super::*;
    use crate::store::claim_log::ClaimLog;
    use crate::store::scope::RunKey;

    /// A run claimed under worker `w` in a real in-memory store, and a scope of calls for its
    /// holding in `log`.
    async fn claimed(log: &Arc<ClaimLog>) -> (GuardedStore, Uuid, Arc<CallScope>) {
        let inner = Arc::new(InMemoryStore::new());
        inner
            .create_run(ironflow_local_api::new_run("w", 0))
            .await
            .unwrap();
        let lease = LeaseRequest {
            worker_id: "w".into(),
            ttl: Duration::from_secs(30),
        };
        let run = inner.pick_next_pending(Some(lease.clone())).await.unwrap();
        let id = run.unwrap().id;
        log.claimed(id);
        let key = RunKey::new(id, &lease).held(log.holding());
        let until = Instant::now() + Duration::from_secs(10);
        let scope = CallScope::returning(until, Arc::default()).with_run(key);
        (GuardedStore::over(inner), id, Arc::new(scope))
    }

    #[tokio::test]
    async fn a_run_running_under_this_worker_id_is_this_holding_s_until_claimed_again() {
        let log = Arc::new(ClaimLog::default());
        let (store, id, scope) = claimed(&log).await;
        let landed = |target| {
            let (store, scope) = (&store, scope.clone());
            async move {
                let sent = scope.write_sent();
                let landed = store.run_write_landed(id, target, false, sent.as_ref());
                scope.run(landed).await
            }
        };

        assert_eq!(landed(Some(RunStatus::Pending)).await, ReadBack::Resend);
        assert_eq!(landed(Some(RunStatus::Completed)).await, ReadBack::Resend);
        let in_flight = log.claiming();
        assert_eq!(
            landed(Some(RunStatus::Pending)).await,
            ReadBack::Unknown,
            "an unanswered claim may have brought it"
        );
        drop(in_flight);

        // The write gave the run up and the same invocation claimed it again, under the same
        // worker id.
        log.claimed(id);
        assert_eq!(
            landed(Some(RunStatus::Pending)).await,
            ReadBack::Applied(())
        );
        assert_eq!(
            landed(Some(RunStatus::Retrying)).await,
            ReadBack::Applied(())
        );
        let left = ReadBack::RunLeft {
            status: RunStatus::Running,
            held_by: Some("w".into()),
        };
        assert_eq!(landed(Some(RunStatus::Completed)).await, left);
        assert_eq!(landed(None).await, left);
    }
}
