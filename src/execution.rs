//! One claimed run, executed under its lease, its run deadline and the invocation cutoff,
//! down to an [`Outcome`].
//!
//! ```text
//! select {
//!   engine.execute_handler_run(run)  → Completed │ Failed (already recorded by the engine)
//!                                     │ Panicked → fail_or_schedule_retry (retryable)
//!   lease lost                       → LeaseLost (no status write)
//!   run deadline                     → TimedOut → fail_or_schedule_retry (retryable)
//!   cutoff                           → handback (HandedBack, or Failed by the loop guard)
//! }
//! ```

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use ironflow_engine::engine::Engine;
use ironflow_store::entities::{LeaseRequest, Run, RunStatus};
use serde::Serialize;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::{Instrument, error, info, info_span, warn};
use uuid::Uuid;

use crate::claimed_store::ClaimedRunStore;
use crate::handback::{self, HandbackPolicy};
use crate::lease::LeaseRefresher;

/// How one run ended in this invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The handler finished; the engine recorded the run's final status (`completed`, or
    /// `warning`, `cancelled`... as the run ended).
    Completed,
    /// The handler stopped before the end of the workflow, which now waits: for a timer or a
    /// signal (status `sleeping`), an approval (`awaiting_approval`) or an operator
    /// (`paused`; `pending` or `running` if already resumed). The API wakes it back to
    /// Pending, and a later invocation (schedule tick, wake-up or direct call) claims it.
    Suspended,
    /// The handler returned an error; the engine already recorded the failure or armed a retry.
    Failed,
    /// The run attempt outlived the run timeout; failed or scheduled for retry.
    TimedOut,
    /// The handler panicked; failed or scheduled for retry.
    Panicked,
    /// The lease went to someone else; nothing was written.
    LeaseLost,
    /// Still running at the cutoff: written back to Pending for the next invocation.
    HandedBack,
    /// Claimed ahead of a free slot, or among an invocation's first claims sent together
    /// ([`crate::claim_ahead`]), but not started before the claim window closed, or claimed
    /// by a claim answered only after the window closed: written back to Pending without
    /// executing, for the next invocation.
    Released,
    /// Claimed while its workflow was blocked as a poison pill: failed without executing
    /// (fail mode), or written back to Pending without executing (defer mode).
    PoisonBlocked,
}

impl Outcome {
    /// Whether the outcome counts as a failure of the workflow for the poison-pill table.
    pub fn is_workflow_failure(self) -> bool {
        matches!(self, Self::Failed | Self::TimedOut | Self::Panicked)
    }
}

/// What became of one claimed run, as listed in the invocation summary.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The run's id.
    pub run_id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// How it ended in this invocation.
    pub outcome: Outcome,
    /// Time it executed in this invocation (zero when it never started). In the summary as
    /// `duration_ms`, whole milliseconds.
    #[serde(rename = "duration_ms", serialize_with = "whole_millis")]
    pub executed: Duration,
    /// The error, for every outcome but Completed and a clean HandedBack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run's attempt counter when claimed (`retry_count`), part of the failure id.
    #[serde(skip)]
    pub retry_count: u32,
}

fn whole_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl RunReport {
    /// The report of a claimed run that never executed: its workflow was blocked
    /// (PoisonBlocked), it was claimed ahead and got no slot (Released), or its lease was lost
    /// while it waited for one (LeaseLost).
    pub(crate) fn not_executed(run: &Run, outcome: Outcome, error: Option<String>) -> Self {
        Self {
            run_id: run.id,
            workflow: run.workflow_name.clone(),
            outcome,
            executed: Duration::ZERO,
            error,
            retry_count: run.retry_count,
        }
    }
}

/// A claimed run with its lease refresher, started at the claim so that a run claimed ahead
/// keeps its lease while it waits for a slot, and the run's tracing span.
pub(crate) struct Claimed {
    pub run: Run,
    pub refresher: LeaseRefresher,
    pub span: tracing::Span,
}

impl Claimed {
    /// Start refreshing the lease of `run`, just claimed under `lease`, every `interval` until
    /// `cutoff`.
    pub fn new(
        engine: &Engine,
        run: Run,
        lease: &LeaseRequest,
        interval: Duration,
        cutoff: Instant,
    ) -> Self {
        let span = info_span!("run", run_id = %run.id, workflow = %run.workflow_name);
        let refresher = span.in_scope(|| {
            LeaseRefresher::spawn(
                engine.store().clone(),
                run.id,
                lease.clone(),
                interval,
                cutoff,
            )
        });
        Self {
            run,
            refresher,
            span,
        }
    }
}

/// Everything one execution needs, cloned out of the worker so it can run in its own task.
#[derive(Clone)]
pub(crate) struct ExecutionParams {
    pub engine: Arc<Engine>,
    /// The engine's store, primed with each run before the engine reads it.
    pub claimed_store: Arc<ClaimedRunStore>,
    pub lease: LeaseRequest,
    pub run_timeout: Duration,
    pub cutoff: Instant,
    /// The invocation deadline: no status write may run past it.
    pub deadline: Instant,
    pub handback: HandbackPolicy,
}

/// Execute the `claimed` run (claimed under `params.lease`) and return its report.
pub(crate) async fn execute(params: ExecutionParams, claimed: Claimed) -> RunReport {
    let Claimed {
        run,
        refresher,
        span,
    } = claimed;
    execute_in_span(params, run, refresher)
        .instrument(span)
        .await
}

async fn execute_in_span(p: ExecutionParams, run: Run, refresher: LeaseRefresher) -> RunReport {
    let started = Instant::now();
    // When it starts executing here; a run claimed ahead may have waited since its claim.
    let claimed_at = Utc::now();
    let report = |outcome, error: Option<String>| RunReport {
        run_id: run.id,
        workflow: run.workflow_name.clone(),
        outcome,
        executed: started.elapsed(),
        error,
        retry_count: run.retry_count,
    };

    let attempt_start = attempt_started_at(&p.engine, &run, claimed_at).await;
    let used = (claimed_at - attempt_start).to_std().unwrap_or_default();
    let run_deadline = started + p.run_timeout.saturating_sub(used);
    let timeout_msg = format!(
        "run timed out after {}s (counted from its attempt's first start at {})",
        p.run_timeout.as_secs(),
        attempt_start.to_rfc3339()
    );

    info!(attempt_started_at = %attempt_start, "executing run");
    // The engine's first read of the run is served the claimed copy (no request); the guard
    // drops the copy once the execution stops, if the read never came.
    let primed = p.claimed_store.prime(&run);
    // Polled by this task rather than spawned: the run's end releases its slot without a hop
    // to another task (each hop waits for a thread, a long wait while shell steps keep both
    // cores busy). A panic of the handler is caught here as a spawned task's would be.
    let mut execution =
        Box::pin(std::panic::AssertUnwindSafe(p.engine.execute_handler_run(run.id)).catch_unwind());

    enum Stop {
        /// The handler returned (`Ok`: the run the engine returned, with its status: ours, or
        /// the root run a sub-workflow child resumed), or panicked.
        Finished(Result<Result<(Uuid, RunStatus), String>, String>),
        LeaseLost,
        TimedOut,
        Cutoff,
    }
    let stop = tokio::select! {
        biased;
        finished = &mut execution => Stop::Finished(match finished {
            Ok(result) => Ok(result
                .map(|r| (r.run.id, r.run.status.state))
                .map_err(|e| e.to_string())),
            Err(panic) => Err(panic_message(panic)),
        }),
        () = refresher.lost() => Stop::LeaseLost,
        () = sleep_until(run_deadline) => Stop::TimedOut,
        () = sleep_until(p.cutoff) => Stop::Cutoff,
    };
    // Whatever follows (a failure recorded, a handback) reads the run from the API.
    drop(primed);
    let target = refresher.target();
    if matches!(stop, Stop::Finished(Ok(_))) {
        // The engine wrote the run's status: nothing of ours follows that a late refresh
        // could race with.
        refresher.abort();
    } else {
        refresher.stop().await;
        // Drop the execution: its child processes die with it (kill_on_drop), and nothing it
        // started can write to the API any more.
        drop(execution);
    }

    match stop {
        // Our own run, left waiting by its handler (a timer or signal: sleeping; an approval;
        // an operator's pause, or already resumed from it: pending, running). A sub-workflow
        // child resumes its root, whose status is not this run's: completed, as before.
        Stop::Finished(Ok(Ok((id, status)))) if id == run.id && !status.is_terminal() => {
            info!(status = %status, "run suspended");
            report(Outcome::Suspended, None)
        }
        Stop::Finished(Ok(Ok(_))) => {
            info!("run completed");
            report(Outcome::Completed, None)
        }
        Stop::Finished(Ok(Err(e))) => {
            // The engine routed this failure through fail_or_schedule_retry already: writing
            // Failed again would cancel an armed retry.
            error!(error = %e, "run failed");
            report(Outcome::Failed, Some(e))
        }
        Stop::Finished(Err(panic)) => {
            let msg = format!("run panicked: {panic}");
            error!(error = %msg, "run panicked");
            record_failure(&p, run.id, &msg).await;
            report(Outcome::Panicked, Some(msg))
        }
        Stop::LeaseLost => {
            warn!("abandoning run: lease lost");
            report(
                Outcome::LeaseLost,
                Some("lease lost to another worker".into()),
            )
        }
        Stop::TimedOut => {
            error!(error = %timeout_msg, "run timed out");
            record_failure(&p, run.id, &timeout_msg).await;
            report(Outcome::TimedOut, Some(timeout_msg))
        }
        Stop::Cutoff => {
            let executed = started.elapsed();
            let (outcome, error) =
                handback::hand_back(&p, &run, target, claimed_at, executed).await;
            report(outcome, error)
        }
    }
}

/// Record a failure observed from outside the handler (timeout, panic) as retryable, bounded
/// by the invocation deadline.
async fn record_failure(p: &ExecutionParams, run_id: Uuid, msg: &str) {
    let write = p
        .engine
        .fail_or_schedule_retry(run_id, msg, true, None, None);
    match timeout_at(p.deadline, write).await {
        Ok(Ok(status)) => info!(status = %status, "failure recorded"),
        Ok(Err(e)) => error!(error = %e, "could not record the run's failure"),
        Err(_) => error!("recording the run's failure ran into the invocation deadline"),
    }
}

/// When the current attempt of `run` first started: the earliest step of the attempt, or now
/// for a run that never executed (its recorded duration is zero) or whose attempt has no step
/// yet. The claim resets `started_at`, so the steps are the durable record.
async fn attempt_started_at(
    engine: &Engine,
    run: &Run,
    claimed_at: DateTime<Utc>,
) -> DateTime<Utc> {
    if run.duration_ms == 0 {
        return claimed_at;
    }
    let attempt = run.retry_count + 1;
    match engine.store().list_steps(run.id).await {
        Ok(steps) => steps
            .iter()
            .filter(|s| s.attempt == attempt)
            .filter_map(|s| s.started_at.or(Some(s.created_at)))
            .min()
            .unwrap_or(claimed_at)
            .min(claimed_at),
        Err(e) => {
            warn!(error = %e, "could not list steps to find the attempt's first start");
            claimed_at
        }
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shows_the_execution_time_as_whole_milliseconds() {
        let report = RunReport {
            run_id: Uuid::nil(),
            workflow: "wf".into(),
            outcome: Outcome::Completed,
            executed: Duration::from_micros(1_999),
            error: None,
            retry_count: 0,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["duration_ms"], 1);
        assert!(json.get("executed").is_none() && json.get("retry_count").is_none());
    }
}
