//! Runs this invocation claimed and never executed: a blocked workflow's run failed (fail
//! mode) or written back to Pending (defer mode), and a run released to Pending
//! ([`Invocation::release`]); and an invocation not admitted at all ([`not_admitted`]).
//!
//! Invariant: such a run is written back only after its lease is confirmed this invocation's,
//! and failed under that lease (the write read back against it), never past the last write;
//! when that cannot be done, it is left to the API's reaper and its report says so.

use std::collections::BTreeMap;

use ironflow_store::entities::Run;
use tracing::{error, info, warn};

use super::Invoked;
use crate::admission::Refused;
use crate::context::Invocation;
use crate::deadline::Budget;
use crate::handback::NotWrittenBack;
use crate::report::{Fate, FlushReport, InvocationSummary, Outcome, RunReport, Spend, StopReason};

impl Invocation {
    /// Fail a claimed run of a blocked workflow without executing it.
    pub(super) async fn fail_blocked(&self, run: &Run, reason: String) -> RunReport {
        warn!(run_id = %run.id, workflow = %run.workflow_name, error = %reason, "skipping run: poison pill");
        let until = self.budget.last_write();
        let fate = self
            .record_failure(
                self.key(run.id),
                Outcome::PoisonBlocked,
                reason,
                false,
                until,
            )
            .await;
        RunReport::not_executed(run, fate)
    }

    /// Defer mode: a run claimed while its workflow is blocked (the block came from this claim's
    /// own lease recovery, from a run that ended while this one waited for a slot, or from another
    /// instance after this invocation read the counter) is written back to Pending without
    /// executing; the following claims leave its workflow out.
    pub(super) async fn defer_blocked(&self, run: &Run, reason: String) -> RunReport {
        warn!(run_id = %run.id, workflow = %run.workflow_name, error = %reason, "deferring run: poison pill");
        let written = self
            .write_back_or_leave_to_reaper(run, Outcome::PoisonBlocked)
            .await;
        let fate = match written {
            Ok(()) => Fate::new(
                Outcome::PoisonBlocked,
                Some(format!("{reason}; written back to Pending (defer mode)")),
            ),
            Err(fate) => Fate {
                error: Some(format!("{reason}; {}", fate.error.unwrap_or_default())),
                ..fate
            },
        };
        RunReport::not_executed(run, fate)
    }

    /// A run claimed and not to be executed here (`why`, logged: its claim answered after the claim
    /// window closed, an earlier execution of it stuck in this process, or its lease as the API
    /// granted it too short): written back to Pending (Released), unless its lease is no longer this
    /// invocation's (nothing written).
    pub(super) async fn release(&self, run: &Run, why: &str) -> RunReport {
        let fate = match self
            .write_back_or_leave_to_reaper(run, Outcome::Released)
            .await
        {
            Ok(()) => {
                info!(run_id = %run.id, "{why}");
                Fate::new(Outcome::Released, None)
            }
            Err(fate) => fate,
        };
        RunReport::not_executed(run, fate)
    }

    /// Write `run` back to Pending without executing it ([`Invocation::write_back_unexecuted`]):
    /// `Ok(())` when written; otherwise the fate to report, logged: the one the API's answer
    /// gave (the run is no longer this invocation's: nothing written), or `outcome` left to the
    /// API's reaper (the API kept failing, or the time ran out).
    async fn write_back_or_leave_to_reaper(&self, run: &Run, outcome: Outcome) -> Result<(), Fate> {
        match self.write_back_unexecuted(run.id).await {
            Ok(()) => Ok(()),
            Err(NotWrittenBack::Gone(fate)) => {
                warn!(run_id = %run.id, ?outcome, error = fate.error.as_deref().unwrap_or(""), "claimed run not written back: no longer this invocation's");
                Err(fate)
            }
            Err(NotWrittenBack::Reaper(e)) => {
                error!(run_id = %run.id, ?outcome, error = %e, "could not write a claimed run back: left to the API's reaper");
                Err(Fate::left_to_reaper(outcome, e))
            }
        }
    }
}

/// The summary of an invocation the worker did not admit ([`crate::admission`]): nothing
/// claimed, and why.
pub(super) fn not_admitted(
    invoked: Invoked<'_>,
    worker_id: String,
    budget: Budget,
    refused: Refused,
) -> InvocationSummary {
    let (stop_reason, error) = match refused {
        Refused::NoSlotInTime => (
            StopReason::Cutoff,
            "no invocation slot freed before the cutoff: this worker serves at most \
             AWS_LAMBDA_MAX_CONCURRENCY invocations at once",
        ),
        Refused::Retiring => (
            StopReason::Retiring,
            "the process is retiring: an execution is stuck in workflow code",
        ),
    };
    warn!(
        request_id = invoked.request_id,
        error, "invocation not admitted: nothing claimed"
    );
    InvocationSummary {
        request_id: invoked.request_id.to_string(),
        worker_id,
        claimed: 0,
        outcomes: BTreeMap::new(),
        runs: Vec::new(),
        stop_reason,
        errors: vec![error.to_string()],
        spend: Spend::default(),
        api_errors: Vec::new(),
        lease_recoveries: 0,
        time_left_ms: u64::try_from(budget.until_deadline().as_millis()).unwrap_or(u64::MAX),
        orphans_killed: 0,
        logs: FlushReport::default(),
        heartbeat: None,
        poison_table_errors: 0,
        wake_ups: None,
    }
}
