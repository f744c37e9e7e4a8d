//! The invocation context ([`Invocation`]): what one invocation is to everything done to a run
//! it claimed (claim, execute, fail, release, hand back), built once per invocation by
//! [`crate::invocation`] and shared by its executions (each holds an `Arc` of it in its own
//! task).
//!
//! It owns the invocation's own calls ([`Calls`]), the lease every claim asks for, every bound
//! of the invocation ([`Budget`]), the loop guard's policy and what the executions run with.
//! What is done to a run is a method of it, each in the module of its concern: [`Invocation::key`]
//! and [`fail_or_leave_to_reaper`] here, the claim in `invocation/claims.rs`, the releases in
//! `invocation/unstarted.rs`, the handback and the write-back in [`crate::handback`].
//!
//! Invariant: every call it makes about a run carries the run's key under the invocation's
//! lease (its writes are read back against it) and is bounded by the invocation's last write,
//! or by a sooner bound its caller gives.
//!
//! It is built from the worker in [`crate::invocation`] (`Invocation::new`), so that this
//! module, which the handback and the executions import, does not import the worker.
//!
//! The claim capabilities are not here: the batch asks its poison-pill gate for them before
//! every claim (`Batch::claim_capabilities`, one method), because in defer mode they change
//! during an invocation. A run that ends failed can block its workflow (the gate's counters
//! are updated when an outcome is recorded, by this invocation or another one of the process
//! sharing them), and a blocked workflow's cooldown can end; computing them once would claim
//! a workflow that a run of the batch just blocked. In fail mode they are the registered list.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use ironflow_engine::engine::Engine;
use ironflow_store::entities::{LeaseRequest, Run, RunStatus};
use tokio::time::Instant;
use tracing::{error, info, warn};
use uuid::Uuid;

use crate::calls::Calls;
use crate::claimed::Claimed;
use crate::deadline::Budget;
use crate::lease::RefreshContext;
use crate::report::{Fate, Outcome};
use crate::runtime::{ExecutionRuntime, StuckExecutions};
use crate::step_times::StepTimes;
use crate::store::GuardedStore;
use crate::store::claim_log::{ClaimLog, Holding};
use crate::store::scope::RunKey;

/// The loop guard's settings ([`crate::handback`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandbackPolicy {
    /// Handbacks in a row without a completed step before the run is failed.
    pub max_without_progress: u32,
    /// A run that executed this long in one invocation without any step running or finishing
    /// is failed at the cutoff instead of handed back.
    pub stall_window: Duration,
    /// A cutoff counts for the loop guard only when the run executed at least this long in
    /// the invocation ([`Budget::fair_share`]: half the window between an invocation's start
    /// and its cutoff).
    pub fair_share: Duration,
}

/// One invocation, as its claims, executions, handbacks and releases see it.
pub(crate) struct Invocation {
    /// The invocation's own calls (claims, handbacks, releases, recorded failures).
    pub calls: Calls,
    /// The lease every claim asks for: this invocation's worker id and the lease TTL.
    pub lease: LeaseRequest,
    /// Its claims, numbered: each run's latest ([`crate::store::claim_log`]).
    pub claims: Arc<ClaimLog>,
    /// Every bound of the invocation.
    pub budget: Budget,
    /// The loop guard's settings.
    pub handback: HandbackPolicy,
    /// The engine that executes runs (on `runtime`).
    pub engine: Arc<Engine>,
    /// The engine's store, primed with each run before the engine reads it.
    pub engine_store: Arc<GuardedStore>,
    /// Where the engine executes.
    pub runtime: Arc<ExecutionRuntime>,
    /// The run timeout (`IRONFLOW_RUN_TIMEOUT_SECS`).
    pub run_timeout: Duration,
    /// The steps' durations this process saw, for cutoff-aware starts; `None`: off.
    pub step_times: Option<Arc<StepTimes>>,
    /// The expected duration of a step never seen.
    pub default_step: Duration,
    /// Executions of this worker still running after they were told to stop.
    pub stuck: Arc<StuckExecutions>,
    /// Processes the invocation's runs left and that were killed at each run's end.
    pub processes_killed: Arc<AtomicUsize>,
    /// Workflows this invocation claims no more runs of ([`LeftOut`]).
    pub left_out: LeftOut,
}

/// Workflows an invocation claims no more runs of, whatever their counters: one whose run it
/// deferred (a step of it would not fit before the cutoff, and the time left only shrinks).
/// Without it, the deferred run, back to Pending and the oldest there, would be claimed again
/// at once and deferred again, until the batch's N runs were spent on it.
#[derive(Debug, Default)]
pub(crate) struct LeftOut(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl LeftOut {
    fn set(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Claim no more runs of `workflow` in this invocation.
    pub fn leave_out(&self, workflow: &str) {
        self.set().insert(workflow.to_string());
    }

    /// `workflows` without the ones left out; `None` when that leaves none of a non-empty
    /// list (the claims are over).
    pub fn claimable(&self, workflows: Vec<String>) -> Option<Vec<String>> {
        let set = self.set();
        if set.is_empty() || workflows.is_empty() {
            return Some(workflows);
        }
        let kept: Vec<String> = workflows.into_iter().filter(|w| !set.contains(w)).collect();
        (!kept.is_empty()).then_some(kept)
    }
}

impl Invocation {
    /// The scope key of `run_id`'s calls under this invocation's lease, for a holding of the
    /// run beginning now: a run just claimed, or one whose fate is written before it executed.
    pub fn key(&self, run_id: Uuid) -> RunKey {
        RunKey::new(run_id, &self.lease).held(self.claims.holding())
    }

    /// The key of `run_id`'s calls made for `holding`: an execution's, whose fate is written
    /// after it stopped, so that they never act on a later claim of the run by this invocation
    /// ([`crate::store::claim_log`]). Without one, a holding beginning now ([`Invocation::key`]).
    pub fn key_for(&self, run_id: Uuid, holding: Option<&Holding>) -> RunKey {
        match holding {
            Some(holding) => RunKey::new(run_id, &self.lease).held(holding.clone()),
            None => self.key(run_id),
        }
    }

    /// Start the lease of `run`, claimed under this invocation's lease by a request sent at
    /// `sent`: its refresher renews it every `interval` until the cutoff, with the
    /// invocation's store and fault log.
    pub fn start_lease(&self, run: Run, sent: Instant, interval: Duration) -> Claimed {
        let refresh = RefreshContext {
            store: self.calls.store.clone(),
            faults: self.calls.faults.clone(),
        };
        let cutoff = self.budget.cutoff();
        Claimed::new(refresh, run, &self.lease, sent, interval, cutoff)
    }

    /// Record the run of `key` failed for `msg` from outside its handler (a timeout, a panic, a
    /// blocked workflow; `retryable`: a retry may be armed), bounded by `until`: the fate for
    /// `outcome`, the run due again as the write left it, or left to the reaper when the
    /// write failed ([`fail_or_leave_to_reaper`]).
    pub async fn record_failure(
        &self,
        key: RunKey,
        outcome: Outcome,
        msg: String,
        retryable: bool,
        until: Instant,
    ) -> Fate {
        let write = fail_or_leave_to_reaper(&self.calls, key.run_id, outcome, msg, retryable);
        let (fate, due) = self.calls.within_noting_due(until, key, write).await;
        fate.due(due)
    }
}

/// Fail `run_id` for `msg` (`fail_or_schedule_retry`; `retryable`: a retry may be armed), or,
/// when that write fails, leave the run Running to the API's reaper: the fate for `outcome`.
/// Unbounded: the caller runs it in its scope ([`Invocation::record_failure`], or a handback's).
pub(crate) async fn fail_or_leave_to_reaper(
    calls: &Calls,
    run_id: Uuid,
    outcome: Outcome,
    msg: String,
    retryable: bool,
) -> Fate {
    let write = calls
        .engine
        .fail_or_schedule_retry(run_id, &msg, retryable, None, None);
    match write.await {
        // The engine writes nothing to a paused run.
        Ok(RunStatus::Paused) => {
            warn!(error = %msg, "the run was paused: its failure is not recorded");
            Fate::paused("its failure")
        }
        Ok(status) => {
            info!(status = %status, "failure recorded");
            Fate::new(outcome, Some(msg))
        }
        Err(e) => {
            error!(error = %e, "could not record the run's failure: left to the API's reaper");
            Fate::left_to_reaper(
                outcome,
                format!("{msg} (recording it failed: {e}; left to the API's reaper)"),
            )
        }
    }
}
