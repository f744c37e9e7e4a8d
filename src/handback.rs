//! Handback: a run still executing at the cutoff goes back to Pending, to be resumed by the
//! next invocation through ironflow's replay (completed steps are served from the store, the
//! interrupted step runs again).
//!
//! By the time `hand_back` is called the lease refresher has stopped and the execution has
//! been dropped. Then, in order:
//! 1. confirm the lease is still this invocation's (`renew_lease`); if not, write nothing;
//! 2. the loop guard: a run that made no progress (no step completed in this invocation) for
//!    the `max_handbacks_without_progress`-th time in a row is failed instead, and so is a run
//!    that spent a long stretch without starting or finishing any step (outside steps, a
//!    replay redoes the same work, so it could never finish);
//! 3. mark the steps left Running as interrupted (`Engine::interrupt_running_steps`);
//! 4. write Pending, adding this invocation's time to the run's `duration_ms`.
//!
//! Every write is bounded by the invocation deadline. A handback cut short by the deadline
//! leaves the run Running under a lease nobody refreshes: the API's reaper requeues it once the
//! lease TTL has passed, so the run is delayed, never lost.

use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_store::entities::{LeaseRequest, Run};
use ironflow_store::entities::{RunStatus, RunUpdate, Step, StepStatus};
use ironflow_store::error::StoreError;
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use ironflow_store::store::Store;
use tokio::time::{Instant, timeout_at};
use tracing::{error, info, warn};
use uuid::Uuid;

use crate::execution::{ExecutionParams, Outcome};

/// The loop guard's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandbackPolicy {
    /// Handbacks in a row without a completed step before the run is failed.
    pub max_without_progress: u32,
    /// A run that executed this long in one invocation without any step running or finishing
    /// is failed at the cutoff instead of handed back.
    pub stall_window: Duration,
}

/// Hand `run` back (see the module docs). `target` is the run whose lease is held (the run
/// itself, or the root of its sub-workflow chain); `claimed_at` is when this invocation claimed
/// it and `executed` how long it ran here.
pub(crate) async fn hand_back(
    p: &ExecutionParams,
    run: &Run,
    target: Uuid,
    claimed_at: DateTime<Utc>,
    executed: Duration,
) -> (Outcome, Option<String>) {
    match timeout_at(
        p.deadline,
        hand_back_steps(p, run, target, claimed_at, executed),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => {
            let msg = "handback ran into the invocation deadline: the API's reaper will requeue \
                       the run once its lease expires";
            error!(run_id = %target, "{msg}");
            (Outcome::HandedBack, Some(msg.to_string()))
        }
    }
}

async fn hand_back_steps(
    p: &ExecutionParams,
    run: &Run,
    target: Uuid,
    claimed_at: DateTime<Utc>,
    executed: Duration,
) -> (Outcome, Option<String>) {
    let store = p.engine.store();
    match store.renew_lease(target, p.lease.clone()).await {
        Ok(_) => {}
        Err(StoreError::LeaseLost { held_by, .. }) => {
            let msg = format!(
                "lease lost before handback (held by {}): nothing written",
                held_by.as_deref().unwrap_or("nobody")
            );
            warn!(run_id = %target, "{msg}");
            return (Outcome::LeaseLost, Some(msg));
        }
        Err(e) => {
            let msg = format!(
                "could not confirm the lease before handback ({e}): nothing written, the API's \
                 reaper will requeue the run once its lease expires"
            );
            error!(run_id = %target, "{msg}");
            return (Outcome::HandedBack, Some(msg));
        }
    }

    let run = if target == run.id {
        run.clone()
    } else {
        match store.get_run(target).await {
            Ok(Some(root)) => root,
            _ => run.clone(),
        }
    };
    let steps = match store.list_steps(target).await {
        Ok(steps) => steps,
        Err(e) => {
            warn!(run_id = %target, error = %e, "could not list steps for the loop guard");
            Vec::new()
        }
    };
    if let Some(reason) = loop_guard(&p.handback, &run, &steps, claimed_at, executed) {
        error!(run_id = %target, error = %reason, "failing the run instead of handing it back");
        return match p
            .engine
            .fail_or_schedule_retry(target, &reason, false, None, None)
            .await
        {
            Ok(_) => (Outcome::Failed, Some(reason)),
            Err(e) => (
                Outcome::Failed,
                Some(format!("{reason} (recording it failed: {e})")),
            ),
        };
    }

    if let Err(e) = p.engine.interrupt_running_steps(target).await {
        warn!(run_id = %target, error = %e, "could not mark the running steps interrupted");
    }
    let executed_ms = u64::try_from(executed.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let update = RunUpdate {
        status: Some(RunStatus::Pending),
        duration_ms: Some(run.duration_ms.saturating_add(executed_ms)),
        ..RunUpdate::default()
    };
    match store.update_run(target, update).await {
        Ok(()) => {
            info!(run_id = %target, executed_ms, "run handed back: Pending for the next invocation");
            (Outcome::HandedBack, None)
        }
        Err(e) => {
            let msg = format!(
                "could not write the run back to Pending ({e}): the API's reaper will requeue it \
                 once its lease expires"
            );
            error!(run_id = %target, "{msg}");
            (Outcome::HandedBack, Some(msg))
        }
    }
}

/// Why a run that did not execute was not written back to Pending.
#[derive(Debug)]
pub(crate) enum NotWrittenBack {
    /// The lease is someone else's (or the run left Running: paused, cancelled): nothing was
    /// written, the run is theirs.
    LeaseLost(String),
    /// The API refused or did not answer, or the deadline came first: the run stays Running
    /// under a lease nobody refreshes, and the API's reaper requeues it once the lease TTL has
    /// passed.
    Failed(String),
}

/// Write a run that did not execute in this invocation back to Pending, within the invocation
/// `deadline`: a run claimed ahead that got no slot before the claim window closed
/// ([`Outcome::Released`]), or a run of a blocked workflow in defer mode. As a handback does,
/// it first confirms that the lease is still `lease`'s (`renew_lease`, never retried), so it
/// never takes back a run another worker took over, a user paused or cancelled (a cancelled
/// run written Pending would also be an illegal transition, answered 500 and retried for
/// seconds). Nothing else is written: the run has no step to interrupt and no time to add to
/// its `duration_ms`, and the loop guard does not count it.
///
/// # Errors
///
/// [`NotWrittenBack`], with a sentence for the run's report.
pub(crate) async fn write_back_unexecuted(
    store: &dyn Store,
    run_id: Uuid,
    lease: &LeaseRequest,
    deadline: Instant,
) -> Result<(), NotWrittenBack> {
    let reaper = "the API's reaper will requeue it once its lease expires";
    let write = async {
        match store.renew_lease(run_id, lease.clone()).await {
            Ok(_) => {}
            Err(StoreError::LeaseLost { held_by, .. }) => {
                return Err(NotWrittenBack::LeaseLost(format!(
                    "lease lost before it was written back to Pending (held by {}): nothing \
                     written",
                    held_by.as_deref().unwrap_or("nobody")
                )));
            }
            Err(e) => {
                return Err(NotWrittenBack::Failed(format!(
                    "could not confirm the lease before writing it back to Pending ({e}): \
                     nothing written, {reaper}"
                )));
            }
        }
        let update = RunUpdate {
            status: Some(RunStatus::Pending),
            ..RunUpdate::default()
        };
        store.update_run(run_id, update).await.map_err(|e| {
            NotWrittenBack::Failed(format!("writing it back to Pending failed ({e}): {reaper}"))
        })
    };
    match timeout_at(deadline, write).await {
        Ok(result) => result,
        Err(_) => Err(NotWrittenBack::Failed(format!(
            "writing it back to Pending ran into the deadline: {reaper}"
        ))),
    }
}

/// Why the run must be failed rather than handed back, if it must.
fn loop_guard(
    policy: &HandbackPolicy,
    run: &Run,
    steps: &[Step],
    claimed_at: DateTime<Utc>,
    executed: Duration,
) -> Option<String> {
    let attempt = run.retry_count + 1;
    let steps: Vec<&Step> = steps.iter().filter(|s| s.attempt == attempt).collect();
    let interrupted = |s: &Step| {
        s.status.state == StepStatus::Failed && s.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)
    };
    let finished = |s: &Step| s.status.state.is_terminal() && !interrupted(s);

    let progressed = steps
        .iter()
        .copied()
        .filter(|s| finished(s))
        .any(|s| s.completed_at.is_some_and(|at| at >= claimed_at));
    if progressed {
        return None;
    }
    let running: Vec<&str> = steps
        .iter()
        .filter(|s| s.status.state == StepStatus::Running)
        .map(|s| s.name.as_str())
        .collect();
    if running.is_empty() && executed >= policy.stall_window {
        return Some(format!(
            "run spent {}s of one invocation without starting or finishing a step: a replay \
             would redo the same work, so it cannot finish on Lambda",
            executed.as_secs()
        ));
    }
    let last_progress = steps
        .iter()
        .copied()
        .filter(|s| finished(s))
        .filter_map(|s| s.completed_at)
        .max();
    let earlier = steps
        .iter()
        .copied()
        .filter(|s| interrupted(s))
        .filter(|s| last_progress.is_none_or(|p| s.completed_at.is_some_and(|at| at > p)))
        .count();
    let in_a_row = u32::try_from(earlier).unwrap_or(u32::MAX).saturating_add(1);
    (in_a_row >= policy.max_without_progress).then(|| {
        format!(
            "run handed back {in_a_row} times in a row without a step completing (step {} needs \
             more than one invocation): raise the function timeout or split the step",
            running
                .first()
                .map_or_else(|| "?".to_string(), |n| format!("'{n}'"))
        )
    })
}
