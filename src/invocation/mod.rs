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
//! What the phases do to a run (claim it, release it, fail it, execute it, hand it back) goes
//! through the invocation context ([`Invocation`]), built once here; every bound they keep
//! comes from its [`Budget`]. A claim's answer is handled in one place (`taken.rs`).
//!
//! [one invocation]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#one-invocation
//! [claim-ahead]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#claim-ahead
//! [handback]: https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/design.md#handback
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod claims;
mod finish;
mod slots;
mod taken;
mod unstarted;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use ironflow_store::entities::{LeaseRequest, WorkerCapabilities};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, error, error_span, info, warn};
use uuid::Uuid;

use self::claims::Windowed;
use self::finish::LogPump;
use self::slots::{Next, SlotState};
use self::taken::Taken;
use crate::api::logs::LogRoutes;
use crate::claimed::Claimed;
use crate::context::{HandbackPolicy, Invocation, LeftOut};
use crate::deadline::Budget;
use crate::execution;
use crate::orphans::InvocationGuard;
use crate::poison::PoisonMode;
use crate::poison::gate::PoisonGate;
use crate::report::{
    BatchRequest, Fate, InvocationSummary, Outcome, RunReport, SleepWatch, StopReason,
};
use crate::store::fault::FaultLog;
use crate::worker::LambdaWorker;

/// The invocation context is built here, from the worker, and not in [`crate::context`]:
/// the context stays below the worker in the module graph.
impl Invocation {
    /// The context of an invocation of `worker` under `worker_id`, within `budget` (started),
    /// its calls' faults counted in `faults`.
    pub(crate) fn new(
        worker: &LambdaWorker,
        worker_id: &str,
        budget: Budget,
        faults: Arc<FaultLog>,
    ) -> Self {
        let s = &worker.settings;
        Self {
            calls: worker.calls(faults),
            lease: LeaseRequest {
                worker_id: worker_id.to_string(),
                ttl: s.lease_ttl,
            },
            claims: Arc::default(),
            budget,
            handback: HandbackPolicy {
                max_without_progress: s.max_handbacks_without_progress,
                stall_window: s.function_timeout.saturating_sub(s.deadline_margin) / 2,
                fair_share: budget.fair_share(),
            },
            engine: worker.engine.clone(),
            engine_store: worker.engine_store.clone(),
            runtime: worker.runtime.clone(),
            run_timeout: s.run_timeout,
            step_times: s.cutoff_aware_starts.then(|| worker.step_times.clone()),
            default_step: s.default_step_duration,
            stuck: worker.stuck.clone(),
            processes_killed: Arc::default(),
            left_out: LeftOut::default(),
        }
    }
}

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
    // At ERROR level, the highest: enabled whatever the filter lets through, so that a WARN or
    // ERROR line still carries the invocation's fields (crate::logging).
    let span = error_span!("invocation", request_id = %request_id, worker_id = %worker_id);
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
    let logs = LogPump::start(worker, inbox, batch.ctx.budget.last_write());
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
    /// The invocation context: calls, lease, bounds, what the executions run with.
    ctx: Arc<Invocation>,
    max_runs: usize,
    poison: PoisonGate,
    slots: Arc<Semaphore>,
    executions: JoinSet<(RunReport, OwnedSemaphorePermit)>,
    /// The reports of each run, in the order they were kept: a run can be claimed twice in one
    /// invocation (handed back, then claimed again), and each claim gets one.
    reports: HashMap<Uuid, VecDeque<RunReport>>,
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
        // The invocation starts now, once admitted: its fair share counts from here.
        let budget = budget.started();
        let faults = Arc::new(FaultLog::default());
        let ctx = Arc::new(Invocation::new(worker, &worker_id, budget, faults));
        let poison = PoisonGate::new(
            worker.poison_table.clone(),
            s.poison,
            s.poison_mode,
            budget.last_write(),
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
            ctx,
            max_runs,
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
        self.ctx.budget.open_window()
    }

    /// What the next claim asks for: the registered capabilities, less the workflows the
    /// poison-pill gate blocks in defer mode (read once per invocation, then from its cache;
    /// a workflow blocked by a run that ended meanwhile is left out from then on) and those
    /// this invocation left out ([`LeftOut`]); `None` when these leave none (the claims are
    /// over).
    async fn claim_capabilities(&mut self) -> Option<WorkerCapabilities> {
        let mut capabilities = self.unblocked_capabilities().await;
        if let Some(workflows) = capabilities.workflows.take() {
            capabilities.workflows = Some(self.ctx.left_out.claimable(workflows)?);
        }
        Some(capabilities)
    }

    /// The registered capabilities less the workflows the poison-pill gate blocks in defer
    /// mode: what the API is asked about the backlog (a run this invocation left out is
    /// still the next invocation's to take).
    async fn unblocked_capabilities(&mut self) -> WorkerCapabilities {
        self.poison
            .capabilities_for_claim(&self.worker.capabilities)
            .await
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
        let Some(capabilities) = self.claim_capabilities().await else {
            self.first_stop = Some(StopReason::Cutoff);
            return;
        };
        let sent = Instant::now();
        let requests = (0..together).map(|_| self.ctx.claim(&capabilities));
        let cutoff = self.ctx.budget.cutoff();
        let answers =
            match claims::in_window(join_all(requests), together, window_end, cutoff).await {
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
        // Defer mode: blocked workflows are left out (read once, then from the cache); so are
        // the workflows whose runs this invocation deferred.
        let Some(capabilities) = self.claim_capabilities().await else {
            return Taken::Stop(StopReason::Cutoff);
        };
        let sent = Instant::now();
        let request = self.ctx.claim(&capabilities);
        let cutoff = self.ctx.budget.cutoff();
        let answer = claims::in_window(request, 1, window_end, cutoff).await;
        self.take(answer, sent, Instant::now(), ahead).await
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
            let report = match self.poison.mode() {
                // Boxed: a large future that only a blocked workflow's runs make, which inline
                // would size every run's start.
                PoisonMode::Fail => Box::pin(self.ctx.fail_blocked(&run, reason)).await,
                PoisonMode::Defer => self.ctx.defer_blocked(&run, reason).await,
            };
            self.keep_unexecuted(report).await;
            return;
        }
        let ctx = self.ctx.clone();
        // The slot goes back with the report: the run claimed ahead starts in it only once
        // this run's outcome has reached the poison-pill table.
        let execution = async move { (execution::execute(ctx, next).await, slot) };
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
        self.keep_report(report);
    }

    /// Keep `report`, after the earlier reports of its run (one per claim).
    fn keep_report(&mut self, report: RunReport) {
        self.reports
            .entry(report.run_id)
            .or_default()
            .push_back(report);
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
        self.keep_report(report);
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
            let report = self.ctx.release(&run, why).await;
            self.keep_unexecuted(report).await;
        }
    }

    /// After a refused claim, the API's status and the setting it points to, in its error.
    async fn explain_refused_claim(&mut self) {
        let capabilities = self.unblocked_capabilities().await;
        let until = self.ctx.budget.last_write();
        claims::explain_refusal(&self.worker.api, &capabilities, &mut self.errors, until).await;
    }

    /// Phase 5: every execution ends (at the latest at the cutoff, then handed back).
    async fn drain(&mut self) {
        while let Some(joined) = self.executions.join_next().await {
            self.settle(joined).await;
        }
    }
}
