//! One invocation, as a handful of named phases ([`run_in_span`]): warm the connections, the
//! first claims, the claim loop (its next step decided by [`slots::next`], without I/O), the
//! release of runs claimed and never started, the drain of the executions, the flush and
//! cleanup (step logs, leftover processes, heartbeat), and the summary with the wake-ups. The
//! mechanisms, explained once: `docs/design.md` ([one invocation], [claim-ahead], [handback]).
//!
//! Nothing outlives [`run`]: every execution, lease refresher, child process and wake-up send is
//! finished or cancelled before it returns, because Lambda freezes the process after the
//! response.
//!
//! [one invocation]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#one-invocation
//! [claim-ahead]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#claim-ahead
//! [handback]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#handback

mod claims;
mod finish;
mod slots;
mod unstarted;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use ironflow_engine::engine::chain_root;
use ironflow_store::entities::{LeaseRequest, Run};
use ironflow_store::store::RunStore;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, error, info, info_span, warn};
use uuid::Uuid;

use self::claims::Windowed;
use self::finish::LogPump;
use self::slots::{Next, SlotState};
use crate::api::logs::LogRoutes;
use crate::calls::Calls;
use crate::claimed::{Claimed, StepsAhead};
use crate::deadline::Budget;
use crate::execution::{self, ExecutionParams};
use crate::handback::HandbackPolicy;
use crate::lease::RefreshContext;
use crate::orphans::InvocationGuard;
use crate::poison::PoisonMode;
use crate::poison::gate::PoisonGate;
use crate::report::{
    BatchRequest, Fate, InvocationSummary, Outcome, RunReport, SleepWatch, StopReason,
};
use crate::store::fault::FaultLog;
use crate::store::fit;
use crate::worker::LambdaWorker;

/// Time kept for the response after our last write to the API: 250 ms.
const RESPONSE_RESERVE: Duration = Duration::from_millis(250);

/// Who sent one invocation: Lambda's ids for it.
#[derive(Debug, Clone, Copy)]
pub struct Invoked<'a> {
    /// The request id (`Context.request_id`; empty outside Lambda).
    pub request_id: &'a str,
    /// The X-Ray trace header (`Context.xray_trace_id`), carried on the invocation's wake-ups.
    pub trace_id: Option<&'a str>,
}

/// Run one invocation of `worker` against `budget`.
pub async fn run(
    worker: &LambdaWorker,
    invoked: Invoked<'_>,
    budget: Budget,
    request: &BatchRequest,
) -> InvocationSummary {
    let request_id = invoked.request_id;
    let worker_id = format!(
        "{}-{}-{}",
        worker.settings.worker_id_prefix,
        if request_id.is_empty() {
            "local"
        } else {
            request_id
        },
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let span = info_span!("invocation", request_id = %request_id, worker_id = %worker_id);
    run_in_span(worker, invoked, worker_id, budget, request)
        .instrument(span)
        .await
}

/// The phases of one invocation.
async fn run_in_span(
    worker: &LambdaWorker,
    invoked: Invoked<'_>,
    worker_id: String,
    budget: Budget,
    request: &BatchRequest,
) -> InvocationSummary {
    // At most M invocations at once in this worker (crate::admission).
    let _admitted = match worker.admission.enter(budget.cutoff()).await {
        Ok(admitted) => admitted,
        Err(refused) => return unstarted::not_admitted(invoked, worker_id, budget, refused),
    };
    let processes = InvocationGuard::enter();
    let (log_routes, inbox) = worker.logs.inbox();
    let mut batch = Batch::new(worker, invoked, worker_id, budget, request, log_routes);
    let logs = LogPump::start(worker, inbox, batch.last_write);
    batch.warm_connections().await;
    batch.first_claims().await;
    let stop_reason = batch.claim_loop().await;
    batch.release_unstarted().await;
    if stop_reason == StopReason::ClaimError {
        batch.explain_refused_claim().await;
    }
    batch.drain().await;
    let cleanup = batch.flush_and_clean_up(logs, processes, stop_reason).await;
    batch.summary(stop_reason, cleanup).await
}

/// The state of one invocation's batch.
struct Batch<'w> {
    worker: &'w LambdaWorker,
    invoked: Invoked<'w>,
    worker_id: String,
    budget: Budget,
    max_runs: usize,
    lease: LeaseRequest,
    /// No write of ours past this: the deadline minus [`RESPONSE_RESERVE`].
    last_write: Instant,
    /// No claim past this (the cutoff minus the minimum claim budget); `None`: none at all.
    claim_window_end: Option<Instant>,
    faults: Arc<FaultLog>,
    calls: Calls,
    params: ExecutionParams,
    poison: PoisonGate,
    slots: Arc<Semaphore>,
    executions: JoinSet<(RunReport, OwnedSemaphorePermit)>,
    reports: HashMap<Uuid, RunReport>,
    /// Claimed runs, in claim order.
    order: Vec<Uuid>,
    errors: Vec<String>,
    /// A run claimed while every slot was busy ([`crate::claim_ahead`]), started in the next
    /// slot that frees once the runs that ended have been settled, so that the poison-pill gate
    /// has seen their outcomes when it checks the run's workflow.
    waiting: Option<Claimed>,
    /// Runs of the first claims, sent together after a full batch, not started yet.
    first: VecDeque<Claimed>,
    /// Why the first claims stop the batch, once they are all started.
    first_stop: Option<StopReason>,
    /// Where the step logs of this invocation's runs go ([`crate::api::logs`]).
    log_routes: LogRoutes,
    /// The sleeping runs the trigger's timer wake-ups watch, looked at after the batch.
    watch: Vec<SleepWatch>,
}

/// What a claim's answer leaves the batch with.
enum Taken {
    /// A run under this invocation's lease, its refresher started.
    Run(Box<Claimed>),
    /// The run was written back unexecuted; the claims go on.
    Released,
    /// The claims are over.
    Stop(StopReason),
}

impl<'w> Batch<'w> {
    fn new(
        worker: &'w LambdaWorker,
        invoked: Invoked<'w>,
        worker_id: String,
        budget: Budget,
        request: &BatchRequest,
        log_routes: LogRoutes,
    ) -> Self {
        let s = &worker.settings;
        let max_runs = request
            .max_runs
            .unwrap_or(s.max_runs_per_invocation)
            .min(s.max_runs_per_invocation);
        let lease = LeaseRequest {
            worker_id: worker_id.clone(),
            ttl: s.lease_ttl,
        };
        // Our own last writes (handbacks, log pushes, heartbeat) end a little before the
        // deadline, so that the response still goes out in time.
        let last_write = budget
            .deadline()
            .checked_sub(RESPONSE_RESERVE)
            .unwrap_or_else(Instant::now);
        let faults = Arc::new(FaultLog::default());
        let calls = worker.calls(faults.clone());
        // Half of this invocation's window, from now to its cutoff.
        let half_window = budget.cutoff().saturating_duration_since(Instant::now()) / 2;
        let params = ExecutionParams {
            engine: worker.engine.clone(),
            engine_store: worker.engine_store.clone(),
            runtime: worker.runtime.clone(),
            calls: calls.clone(),
            lease: lease.clone(),
            run_timeout: s.run_timeout,
            cutoff: budget.cutoff(),
            invocation_start: Instant::now(),
            step_times: s.cutoff_aware_starts.then(|| worker.step_times.clone()),
            default_step: s.default_step_duration,
            last_write,
            handback: HandbackPolicy {
                max_without_progress: s.max_handbacks_without_progress,
                stall_window: s.function_timeout.saturating_sub(s.deadline_margin) / 2,
                fair_share: half_window,
            },
            stuck: worker.stuck.clone(),
            processes_killed: Arc::default(),
        };
        let poison = PoisonGate::new(
            worker.poison_table.clone(),
            s.poison,
            worker.poison_mode,
            last_write,
            &worker_id,
        )
        .sharing(worker.poison_seen.clone());
        info!(
            max_runs,
            until_cutoff_ms = budget.until_cutoff().as_millis() as u64,
            "invocation started"
        );
        Self {
            worker,
            invoked,
            worker_id,
            budget,
            max_runs,
            lease,
            last_write,
            claim_window_end: budget.cutoff().checked_sub(s.min_claim_budget),
            faults,
            calls,
            params,
            poison,
            slots: Arc::new(Semaphore::new(s.concurrency)),
            executions: JoinSet::new(),
            reports: HashMap::new(),
            order: Vec::new(),
            errors: Vec::new(),
            waiting: None,
            first: VecDeque::new(),
            first_stop: None,
            log_routes,
            watch: request.watch.clone(),
        }
    }

    /// The claim window's end, while it is open.
    fn open_window(&self) -> Option<Instant> {
        self.claim_window_end.filter(|end| Instant::now() < *end)
    }

    /// Phase 1: evict pooled connections that died during a freeze ([`crate::pool`]); not
    /// while another invocation is in flight (the process is not frozen, its pool in use).
    async fn warm_connections(&self) {
        let Some(end) = self.open_window() else {
            return;
        };
        let w = self.worker;
        if w.admission.in_flight() > 1 {
            return;
        }
        let probes = 2 * w.settings.concurrency + 2;
        w.pool
            .before_claims(
                w.calls_store.unguarded(),
                w.engine_store.unguarded(),
                &w.runtime,
                probes,
                end,
            )
            .await;
    }

    /// Phase 2: after a full batch, the first claims go out together, one per slot
    /// ([`crate::claim_ahead`]); the claim loop starts them as it would claim, then stops for
    /// the reason one of them gave.
    async fn first_claims(&mut self) {
        let w = self.worker;
        let together = w.pace.first_claims(w.settings.concurrency, self.max_runs);
        let Some(window_end) = self.open_window().filter(|_| together > 1) else {
            return;
        };
        let capabilities = self.poison.capabilities_for_claim(&w.capabilities).await;
        let sent = Instant::now();
        let requests = (0..together)
            .map(|_| claims::claim(&self.calls, &self.lease, &capabilities, self.last_write));
        let answers =
            match claims::in_window(join_all(requests), together, window_end, self.params.cutoff)
                .await
            {
                Windowed::InTime(all) => all.into_iter().map(Windowed::InTime).collect(),
                Windowed::Late(all) => all.into_iter().map(Windowed::Late).collect(),
                Windowed::Unanswered { claims } => vec![Windowed::Unanswered { claims }],
            };
        let answered = Instant::now();
        for answer in answers {
            match self.take(answer, sent, answered, false).await {
                Taken::Run(claimed) => self.first.push_back(*claimed),
                Taken::Released => {}
                // A claim error or the cutoff overrides an empty answer.
                Taken::Stop(StopReason::NoPendingRun) => {
                    self.first_stop.get_or_insert(StopReason::NoPendingRun);
                }
                Taken::Stop(reason) => self.first_stop = Some(reason),
            }
        }
    }

    /// Phase 3: claim and start runs until N are claimed, none is pending, a claim fails or
    /// the claim window closes; the reason it stopped.
    async fn claim_loop(&mut self) -> StopReason {
        loop {
            // Settle what ended first: whatever follows sees its poison-pill count.
            while let Some(joined) = self.executions.try_join_next() {
                self.settle(joined).await;
            }
            let window_end = self.open_window();
            let state = SlotState {
                claimed: self.order.len(),
                max_runs: self.max_runs,
                window_open: window_end.is_some(),
                free_slot: self.slots.available_permits() > 0,
                waiting: self.waiting.is_some(),
                first_queued: !self.first.is_empty(),
                first_stop: self.first_stop,
                runs_ahead: self.worker.pace.runs_ahead(),
            };
            let step = slots::next(state);
            let window_end = match (step, window_end) {
                (Next::Stop(reason), _) => return reason,
                (_, Some(end)) => end,
                // `next` stops once the window is closed.
                (_, None) => return StopReason::Cutoff,
            };
            match step {
                Next::Stop(reason) => return reason,
                Next::AwaitEnd => {
                    if !self.await_end(window_end).await {
                        return StopReason::Cutoff;
                    }
                }
                Next::StartWaiting => {
                    if let (Some(slot), Some(next)) = (self.free_slot(), self.waiting.take()) {
                        self.start(next, slot).await;
                    }
                }
                Next::StartFirst => {
                    if let (Some(slot), Some(next)) = (self.free_slot(), self.first.pop_front()) {
                        self.start(next, slot).await;
                    }
                }
                Next::HoldFirst => self.waiting = self.first.pop_front(),
                Next::Claim { ahead } => {
                    let slot = if ahead { None } else { self.free_slot() };
                    match self.claim_one(window_end, slot.is_none()).await {
                        Taken::Run(claimed) => match slot {
                            Some(slot) => self.start(*claimed, slot).await,
                            None => self.waiting = Some(*claimed),
                        },
                        Taken::Released => {}
                        Taken::Stop(reason) => return reason,
                    }
                }
            }
        }
    }

    fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// One claim in the loop (`ahead`: while every slot is busy).
    async fn claim_one(&mut self, window_end: Instant, ahead: bool) -> Taken {
        // Defer mode: blocked workflows are left out (read once, then from the cache).
        let w = self.worker;
        let capabilities = self.poison.capabilities_for_claim(&w.capabilities).await;
        let sent = Instant::now();
        let request = claims::claim(&self.calls, &self.lease, &capabilities, self.last_write);
        let answer = claims::in_window(request, 1, window_end, self.params.cutoff).await;
        self.take(answer, sent, Instant::now(), ahead).await
    }

    /// The one place a claim's answer is handled: a run is listed in claim order, its
    /// recovery from a dead invocation counted by the poison-pill gate, its lease refresher
    /// started (every interval, until the cutoff); an answer after the claim window closed
    /// releases its run; an empty answer, an error or no answer stops the claims.
    async fn take(
        &mut self,
        answer: Windowed<claims::Answer>,
        sent: Instant,
        answered: Instant,
        ahead: bool,
    ) -> Taken {
        let answer = match answer {
            Windowed::InTime(answer) => answer,
            Windowed::Late(answer) => {
                self.release_late(answer).await;
                return Taken::Stop(StopReason::Cutoff);
            }
            Windowed::Unanswered { claims } => {
                let ttl = self.worker.settings.lease_ttl;
                self.errors.push(claims::unanswered(claims, ttl));
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
        if self.worker.stuck.holds(run.id) {
            // Its earlier execution still holds it in this process: executed here it would only
            // wait. Back to Pending for another process; this one retires.
            let why = "run released: an earlier execution of it is stuck in this process";
            let report =
                unstarted::release(&self.calls, &run, &self.lease, self.last_write, why).await;
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
        let ctx = RefreshContext {
            store: self.calls.store.clone(),
            faults: self.calls.faults.clone(),
        };
        let interval = self.worker.settings.lease_refresh_interval;
        let mut claimed = Claimed::new(ctx, run, &self.lease, sent, interval, self.params.cutoff);
        if claimed.refresher.clock().granted() <= interval {
            return self.release_short_lease(claimed).await;
        }
        if ahead && chain_root(&claimed.run).is_none() {
            // Its steps, read while it waits: one round trip less once it starts.
            let until = claimed
                .refresher
                .clock()
                .valid_until()
                .min(self.params.cutoff);
            claimed.steps_ahead = Some(StepsAhead::read(
                self.params.engine_store.clone(),
                claimed.run.id,
                until,
                self.calls.faults.clone(),
            ));
        }
        // Read only for a run the reaper recovered (see PoisonGate::on_claim).
        let (calls, run_id) = (&self.calls, claimed.run.id);
        let key = self.params.key(run_id);
        let until = claimed
            .refresher
            .clock()
            .valid_until()
            .min(self.params.cutoff);
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
        Taken::Run(Box::new(claimed))
    }

    /// Cutoff-aware starts in the claim window: a claimed run that never executed (its next
    /// step is its workflow's first) whose first step, as this process saw it take, would not
    /// fit before the cutoff yet would in the next invocation ([`fit::deferral`]). The claim
    /// does not say which run comes, so this is decided once it came; a run that executed
    /// before, whose next step is known only to its handler, is left to the step gate
    /// ([`CallScope::may_start`](crate::store::scope::CallScope::may_start)), and so is a
    /// workflow whose first step this process never saw complete.
    fn first_step_would_not_fit(&self, run: &Run) -> Option<fit::Deferral> {
        let times = self.params.step_times.as_ref()?;
        if run.duration_ms > 0 {
            return None;
        }
        let (step, expected) = times.first_step(&run.workflow_name)?;
        let now = Instant::now();
        let left = self.params.cutoff.saturating_duration_since(now);
        let gain = now.saturating_duration_since(self.params.invocation_start);
        fit::deferral(&step, expected, left, gain)
    }

    /// Write `run`, claimed, back to Pending unexecuted: its first step would not fit
    /// (`deferral`). An invocation with the time it needs takes it; the claims stop here (the
    /// next one could take it again).
    async fn release_unfit(&mut self, run: &Run, deferral: &fit::Deferral) -> Taken {
        let why = format!("run released before its first step: {deferral}");
        let mut report =
            unstarted::release(&self.calls, run, &self.lease, self.last_write, &why).await;
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
            ttl_ms = self.lease.ttl.as_millis() as u64,
            "the API granted a lease that ends before its first refresh (dated back by the \
             API's database): releasing the run unexecuted"
        );
        let why = "run released: its lease, as the API granted it, ended before its first refresh";
        let report = unstarted::release(&self.calls, &run, &self.lease, self.last_write, why)
            .instrument(claimed.span)
            .await;
        self.keep_unexecuted(report).await;
        Taken::Released
    }

    /// A claim answered after the claim window closed: a run it took goes back to Pending
    /// without executing; a failure is logged and kept in the errors.
    async fn release_late(&mut self, answer: claims::Answer) {
        match answer {
            Ok(Some(run)) => {
                let why = "run released: its claim was answered after the claim window closed";
                let report =
                    unstarted::release(&self.calls, &run, &self.lease, self.last_write, why).await;
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

    /// Start `next` in `slot`, unless its lease was lost or its workflow got blocked while it
    /// waited.
    async fn start(&mut self, next: Claimed, slot: OwnedSemaphorePermit) {
        let run = &next.run;
        if let Some(end) = next.refresher.end() {
            warn!(run_id = %run.id, "abandoning a run claimed ahead: lease lost while it waited");
            let error = format!("{}, before the run started", end.describe());
            let report = RunReport::not_executed(run, Fate::new(Outcome::LeaseLost, Some(error)));
            self.keep_unexecuted(report).await;
            return;
        }
        if let Some(reason) = self.poison.blocked_reason(&run.workflow_name).await {
            let run = next.run.clone();
            next.refresher.stop().await;
            let (calls, lease, until) = (&self.calls, &self.lease, self.last_write);
            let report = match self.poison.mode() {
                PoisonMode::Fail => {
                    unstarted::fail_blocked(calls, &run, lease, reason, until).await
                }
                PoisonMode::Defer => {
                    unstarted::defer_blocked(calls, &run, lease, reason, until).await
                }
            };
            self.keep_unexecuted(report).await;
            return;
        }
        let params = self.params.clone();
        // The slot goes back with the report: the run claimed ahead starts in it only once
        // this run's outcome has reached the poison-pill table.
        let execution = async move { (execution::execute(params, next).await, slot) };
        self.executions
            .spawn(execution.instrument(tracing::Span::current()));
    }

    /// Wait until an execution ends and settle it; `false` if the claim window closed first.
    async fn await_end(&mut self, window_end: Instant) -> bool {
        tokio::select! {
            biased;
            Some(joined) = self.executions.join_next() => {
                self.settle(joined).await;
                true
            }
            () = sleep_until(window_end) => false,
        }
    }

    /// Keep the report of a run this invocation claimed and did not execute; a run it left
    /// to the reaper (its write-back failed) or whose lease it lost has its next recovery
    /// noted as expected ([`PoisonGate::expect_recovery`]).
    async fn keep_unexecuted(&mut self, report: RunReport) {
        self.poison.expect_recovery(&report).await;
        self.reports.insert(report.run_id, report);
    }

    /// Turn a finished execution into its report and update the poison-pill table.
    async fn settle(&mut self, joined: Result<(RunReport, OwnedSemaphorePermit), JoinError>) {
        // `execute` catches the handler's panics itself; a JoinError here is a bug of ours.
        let (report, _slot) = match joined {
            Ok(done) => done,
            Err(e) => {
                error!(error = %e, "execution task failed");
                return;
            }
        };
        self.worker.pace.record(report.outcome, report.executed);
        self.poison.record(&report).await;
        self.reports.insert(report.run_id, report);
    }

    /// Phase 4: a run still waiting for a slot when the claim window closed goes back to
    /// Pending unexecuted, and the pace learns that slots stayed busy longer than claim-ahead
    /// bets.
    async fn release_unstarted(&mut self) {
        let unstarted: Vec<Claimed> = self
            .waiting
            .take()
            .into_iter()
            .chain(self.first.drain(..))
            .collect();
        for next in unstarted {
            let run = next.run.clone();
            next.refresher.stop().await;
            self.worker.pace.record(Outcome::Released, Duration::ZERO);
            let why = "run claimed ahead released: no slot freed in time, Pending again";
            let report =
                unstarted::release(&self.calls, &run, &self.lease, self.last_write, why).await;
            self.keep_unexecuted(report).await;
        }
    }

    /// After a refused claim, the API's status and the setting it points to, in its error.
    async fn explain_refused_claim(&mut self) {
        let capabilities = self
            .poison
            .capabilities_for_claim(&self.worker.capabilities)
            .await;
        claims::explain_refusal(
            &self.worker.api,
            &capabilities,
            &mut self.errors,
            self.last_write,
        )
        .await;
    }

    /// Phase 5: every execution ends (at the latest at the cutoff, then handed back).
    async fn drain(&mut self) {
        while let Some(joined) = self.executions.join_next().await {
            self.settle(joined).await;
        }
    }
}
