//! What the batch does with a claim's answer ([`Batch::take`]): a run it keeps under its
//! lease (listed, its refresher started, its recovery counted by the poison-pill gate), or
//! one it writes back to Pending unexecuted (stuck here already, its first step would not fit,
//! its lease too short, its answer late), or the reason the claims stop.
//!
//! Invariant: every claimed run leaves here either under a running lease refresher or written
//! back (or left to the reaper) with its report kept: none is dropped.

use ironflow_engine::engine::chain_root;
use ironflow_store::entities::Run;
use ironflow_store::store::RunStore;
use tokio::time::Instant;
use tracing::{Instrument, error, info, warn};

use super::Batch;
use super::claims::{self, Windowed};
use crate::claimed::{Claimed, StepsAhead};
use crate::report::{Outcome, StopReason};
use crate::store::fit;

/// What a claim's answer leaves the batch with.
pub(super) enum Taken {
    /// A run under this invocation's lease, its refresher started.
    Run(Box<Claimed>),
    /// The run was written back unexecuted; the claims go on.
    Released,
    /// The claims are over.
    Stop(StopReason),
}

impl Batch<'_> {
    /// The one place a claim's answer is handled: a run is listed in claim order, its
    /// recovery from a dead invocation counted by the poison-pill gate, its lease refresher
    /// started (every interval, until the cutoff); an answer after the claim window closed
    /// releases its run; an empty answer, an error or no answer stops the claims.
    pub(super) async fn take(
        &mut self,
        answer: Windowed<claims::Answer>,
        sent: Instant,
        answered: Instant,
        ahead: bool,
    ) -> Taken {
        let answer = match answer {
            Windowed::InTime(answer) => answer,
            Windowed::Late(answer) => {
                // Boxed, as the other rare ends of a claim are: inline, their large futures
                // would size the future of every claim.
                Box::pin(self.release_late(answer)).await;
                return Taken::Stop(StopReason::Cutoff);
            }
            Windowed::Unanswered { claims } => {
                let ttl = self.worker.settings.lease_ttl;
                let worker_id = &self.ctx.lease.worker_id;
                self.errors.push(claims::unanswered(claims, worker_id, ttl));
                return Taken::Stop(StopReason::Cutoff);
            }
        };
        let run = match answer {
            Ok(Some(run)) => run,
            Ok(None) => {
                self.worker.pace.record_claim(answered.duration_since(sent));
                return Taken::Stop(StopReason::NoPendingRun);
            }
            Err(e) => {
                error!(error = %e, "claim failed");
                self.errors.push(format!("claim failed: {e}"));
                return Taken::Stop(StopReason::ClaimError);
            }
        };
        self.worker.pace.record_claim(answered.duration_since(sent));
        self.keep(run, sent, ahead).await
    }

    /// A run a claim sent at `sent` took (`ahead`: while every slot was busy): written back
    /// unexecuted when it cannot execute here, else kept under its lease, its refresher
    /// started and its recovery counted.
    async fn keep(&mut self, run: Run, sent: Instant, ahead: bool) -> Taken {
        if !self.worker.registered(&run.workflow_name) {
            return Box::pin(self.release_foreign(&run)).await;
        }
        if self.worker.stuck.holds(run.id) {
            // Its earlier execution still holds it in this process: executed here it would only
            // wait. Back to Pending for another process; this one retires.
            let why = "run released: an earlier execution of it is stuck in this process";
            let report = self.ctx.release(&run, why).await;
            self.order.push(run.id);
            self.keep_unexecuted(report).await;
            return Taken::Stop(StopReason::Retiring);
        }
        if let Some(deferral) = self.first_step_would_not_fit(&run) {
            return self.release_unfit(&run, &deferral).await;
        }
        self.order.push(run.id);
        // Its step logs come to this invocation, whichever pump routes them.
        self.log_routes.route(run.id);
        info!(run_id = %run.id, workflow = %run.workflow_name, ahead, "claimed run");
        // The lease starts now: its refresher before the poison-pill table's calls.
        let (ctx, cutoff) = (&self.ctx, self.ctx.budget.cutoff());
        let interval = self.worker.settings.lease_refresh_interval;
        let mut claimed = ctx.start_lease(run, sent, interval);
        if claimed.refresher.clock().granted() <= interval {
            return Box::pin(self.release_short_lease(claimed)).await;
        }
        if ahead && chain_root(&claimed.run).is_none() {
            // Its steps, read while it waits: one round trip less once it starts.
            let until = claimed.refresher.clock().valid_until().min(cutoff);
            claimed.steps_ahead = Some(StepsAhead::read(
                ctx.engine_store.clone(),
                claimed.run.id,
                until,
                ctx.calls.faults.clone(),
            ));
        }
        self.count_recovery(&claimed).await;
        Taken::Run(Box::new(claimed))
    }

    /// The poison-pill gate counts `claimed`'s recovery from a dead invocation, if the API's
    /// reaper recovered it; its steps are read only then, within its lease and the cutoff.
    async fn count_recovery(&mut self, claimed: &Claimed) {
        let (ctx, cutoff) = (&self.ctx, self.ctx.budget.cutoff());
        let (calls, run_id) = (&ctx.calls, claimed.run.id);
        let key = ctx.key(run_id);
        let until = claimed.refresher.clock().valid_until().min(cutoff);
        let steps = async move {
            calls
                .within(
                    until,
                    Some(key),
                    RunStore::list_steps(calls.store.as_ref(), run_id),
                )
                .await
                .ok()
        };
        self.poison.on_claim(&claimed.run, steps).await;
    }

    /// Cutoff-aware starts in the claim window: a claimed run that never executed (its next
    /// step is its workflow's first) whose first step, as this process saw it take, would not
    /// fit before the cutoff yet would in the next invocation ([`fit::deferral`]). The claim
    /// does not say which run comes, so this is decided once it came; a run that executed
    /// before, whose next step is known only to its handler, is left to the step gate
    /// ([`CallScope::may_start`](crate::store::scope::CallScope::may_start)), and so is a
    /// workflow whose first step this process never saw complete.
    fn first_step_would_not_fit(&self, run: &Run) -> Option<fit::Deferral> {
        let times = self.ctx.step_times.as_ref()?;
        if run.duration_ms > 0 {
            return None;
        }
        let (step, expected) = times.first_step(&run.workflow_name)?;
        let now = Instant::now();
        let left = self.ctx.budget.cutoff().saturating_duration_since(now);
        let gain = now.saturating_duration_since(self.ctx.budget.start());
        fit::deferral(&step, expected, left, gain)
    }

    /// Write `run`, claimed, back to Pending untouched: no handler of its workflow is registered
    /// here, so the API ignored the claim's workflow list (an API older than the filter, a
    /// gateway that drops the query). It is no failure of the workflow, and its lease is not
    /// left to the reaper, which would fail it once its `max_retries` were spent. It is no run
    /// of this batch either (the summary does not list it): the claims stop with a claim error
    /// naming it, so that an invocation that took nothing else fails (its SQS records retried,
    /// the function's error alarm raised) instead of reporting an empty backlog while the
    /// foreign run, the oldest, keeps every claim from reaching this worker's own.
    async fn release_foreign(&mut self, run: &Run) -> Taken {
        let why = format!(
            "run {} released untouched: no handler of its workflow '{}' is registered in this \
             worker, so the API ignored the claim's workflow list (an ironflow API older than \
             the filter, or a gateway that drops the query); until it filters, this worker's \
             claims keep meeting runs it cannot take",
            run.id, run.workflow_name
        );
        error!(run_id = %run.id, workflow = %run.workflow_name, "{why}");
        let report = self.ctx.release(run, &why).await;
        self.errors.push(why);
        // Its recovery is expected if the write-back failed (left to the reaper).
        self.poison.expect_recovery(&report).await;
        Taken::Stop(StopReason::ClaimError)
    }

    /// Write `run`, claimed, back to Pending unexecuted: its first step would not fit
    /// (`deferral`). An invocation with the time it needs takes it; the claims stop here (the
    /// next one could take it again).
    async fn release_unfit(&mut self, run: &Run, deferral: &fit::Deferral) -> Taken {
        let why = format!("run released before its first step: {deferral}");
        let mut report = self.ctx.release(run, &why).await;
        if report.outcome == Outcome::Released {
            report.error = Some(why);
        }
        self.order.push(run.id);
        self.keep_unexecuted(report).await;
        Taken::Stop(StopReason::Cutoff)
    }

    /// A run whose lease, as the API stated it in the claim's answer, ends before its first
    /// refresh (dated back: see [`crate::deadline::LeaseClock`]): executed, it would run
    /// unleased, and the API's reaper could hand it to another worker meanwhile. Written back
    /// to Pending unexecuted (after the lease is confirmed again, as every release is), or
    /// left to the reaper.
    async fn release_short_lease(&mut self, claimed: Claimed) -> Taken {
        let granted = claimed.refresher.clock().granted();
        claimed.refresher.stop().await;
        let run = claimed.run;
        warn!(
            run_id = %run.id,
            granted_ms = granted.as_millis() as u64,
            ttl_ms = self.ctx.lease.ttl.as_millis() as u64,
            "the API granted a lease that ends before its first refresh (dated back by the \
             API's database): releasing the run unexecuted"
        );
        let why = "run released: its lease, as the API granted it, ended before its first refresh";
        let report = self.ctx.release(&run, why).instrument(claimed.span).await;
        self.keep_unexecuted(report).await;
        Taken::Released
    }

    /// A claim answered after the claim window closed: a run it took goes back to Pending
    /// without executing; a failure is logged and kept in the errors.
    async fn release_late(&mut self, answer: claims::Answer) {
        match answer {
            Ok(Some(run)) => {
                let why = "run released: its claim was answered after the claim window closed";
                let report = self.ctx.release(&run, why).await;
                self.order.push(report.run_id);
                self.keep_unexecuted(report).await;
            }
            Ok(None) => {}
            Err(e) => {
                error!(error = %e, "claim failed after the claim window closed");
                self.errors.push(format!("claim failed: {e}"));
            }
        }
    }
}
