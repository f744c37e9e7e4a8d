//! One invocation, top to bottom: budget, claim loop, joins, summary.
//!
//! ```text
//! budget = Context.deadline − margin ("cutoff")
//! while (claimed < N or a run waits) and time before the claim window closes
//!                                                   (cutoff − minimum claim budget):
//!     settle the runs that ended (outcomes → poison-pill table)
//!     a free slot and a run waiting → start it
//!     a free slot, or none but claim-ahead pays     claim-ahead (crate::claim_ahead): one
//!       (crate::claim_ahead) → claim                run claimed while every slot is busy
//!         (ApiRunStore::pick_next_pending_for),     waits for the next slot
//!         start its lease refresher, count a run recovered from a dead invocation as a
//!         failure, then start it (free slot) or keep it waiting
//!     else → wait for a run to end
//!   starting a run: lease lost meanwhile? → abandoned; workflow blocked? → fail the run
//!   (fail mode) or write it back to Pending (defer mode, whose claims leave blocked
//!   workflows out); else spawn its execution in the slot
//! a run still waiting → released: written back to Pending after confirming its lease
//! await every execution → outcomes → poison-pill table
//! kill the processes runs left behind
//! wake-ups: runs handed back, or N taken with runs still pending → SQS (crate::wake)
//! → summary
//! ```
//!
//! Nothing outlives [`run`]: every execution, lease refresher, child process and wake-up send is
//! finished or cancelled before it returns, because Lambda freezes the process after the
//! response.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use ironflow_store::entities::{LeaseRequest, Run, WorkerCapabilities};
use ironflow_store::error::StoreError;
use ironflow_store::store::RunStore;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};
use uuid::Uuid;

use crate::calls::Calls;
use crate::deadline::Budget;
use crate::execution::{self, Claimed, ExecutionParams};
use crate::handback::{HandbackPolicy, NotWrittenBack, write_back_unexecuted};
use crate::lease::RefreshContext;
use crate::orphans::InvocationGuard;
use crate::poison::PoisonMode;
use crate::poison::gate::PoisonGate;
use crate::report::{BatchRequest, Fate, InvocationSummary, Outcome, RunReport, StopReason};
use crate::store::fault::FaultLog;
use crate::store::scope::RunKey;
use crate::wake::{self, BatchEnd};
use crate::worker::LambdaWorker;
use crate::{heartbeat, metrics};

/// Run one invocation of `worker` against `budget`.
pub async fn run(
    worker: &LambdaWorker,
    request_id: &str,
    budget: Budget,
    request: &BatchRequest,
) -> InvocationSummary {
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
    run_in_span(worker, request_id, worker_id, budget, request)
        .instrument(span)
        .await
}

async fn run_in_span(
    worker: &LambdaWorker,
    request_id: &str,
    worker_id: String,
    budget: Budget,
    request: &BatchRequest,
) -> InvocationSummary {
    // One invocation at a time per worker (see LambdaWorker): the step-log channel, claim
    // pace and pooled connections shared across invocations serve this one alone.
    let _one_at_a_time = worker.one_at_a_time.lock().await;
    let s = &worker.settings;
    let guard = InvocationGuard::enter();
    let max_runs = request
        .max_runs
        .unwrap_or(s.max_runs_per_invocation)
        .min(s.max_runs_per_invocation);
    let lease = LeaseRequest {
        worker_id: worker_id.clone(),
        ttl: s.lease_ttl,
    };
    // Our own last writes (handbacks, log pushes, heartbeat) end a little before the deadline,
    // so that the response still goes out in time.
    let last_write = budget
        .deadline()
        .checked_sub(RESPONSE_RESERVE)
        .unwrap_or_else(Instant::now);
    let faults = Arc::new(FaultLog::default());
    let calls = worker.calls(faults.clone());
    let params = ExecutionParams {
        engine: worker.engine.clone(),
        engine_store: worker.engine_store.clone(),
        runtime: worker.runtime.clone(),
        calls: calls.clone(),
        lease: lease.clone(),
        run_timeout: s.run_timeout,
        cutoff: budget.cutoff(),
        last_write,
        handback: HandbackPolicy {
            max_without_progress: s.max_handbacks_without_progress,
            stall_window: s.function_timeout.saturating_sub(s.deadline_margin) / 2,
            // Half of this invocation's window, from now to its cutoff.
            fair_share: budget.cutoff().saturating_duration_since(Instant::now()) / 2,
        },
        stuck: worker.stuck.clone(),
    };
    let claim_window_end = budget.cutoff().checked_sub(s.min_claim_budget);
    let log_pump_stop = CancellationToken::new();
    // Should this invocation be dropped or panic before it stops the pump, the pump stops too
    // and lets go of the log channel (the next invocation's pump needs it).
    let _stop_pump_on_drop = log_pump_stop.clone().drop_guard();
    let log_pump = {
        let (logs, stop) = (worker.logs.clone(), log_pump_stop.clone());
        tokio::spawn(async move { logs.pump(stop, last_write).await })
    };
    let mut poison = PoisonGate::new(
        worker.poison_table.clone(),
        s.poison,
        worker.poison_mode,
        last_write,
        &worker_id,
    );
    let slots = Arc::new(Semaphore::new(s.concurrency));
    let mut executions = JoinSet::new();
    let mut reports: HashMap<Uuid, RunReport> = HashMap::new();
    let mut order = Vec::new();
    let mut errors = Vec::new();
    info!(
        max_runs,
        until_cutoff_ms = budget.until_cutoff().as_millis() as u64,
        "invocation started"
    );

    if let Some(end) = claim_window_end.filter(|end| Instant::now() < *end) {
        let probes = 2 * s.concurrency + 2;
        worker
            .pool
            .before_claims(
                worker.calls_store.unguarded(),
                worker.engine_store.unguarded(),
                &worker.runtime,
                probes,
                end,
            )
            .await;
    }
    // A run claimed while every slot was busy (claim-ahead, crate::claim_ahead). The loop
    // starts it in the next slot that frees, once the runs that ended have been settled, so
    // the poison-pill gate has seen their outcomes when it checks the run's workflow.
    let mut waiting: Option<Claimed> = None;
    // After a full batch, the first claims go out together, one per slot (crate::claim_ahead);
    // the loop starts them as it would claim, then stops for the reason one of them gave.
    let mut first: VecDeque<Claimed> = VecDeque::new();
    let mut first_stop: Option<StopReason> = None;
    let together = worker.pace.first_claims(s.concurrency, max_runs);
    if let Some(window_end) = claim_window_end.filter(|end| together > 1 && Instant::now() < *end) {
        let capabilities = poison.capabilities_for_claim(&worker.capabilities).await;
        let sent = Instant::now();
        let claims = (0..together).map(|_| claim(&calls, &lease, &capabilities, last_write));
        match claim_in_window(join_all(claims), window_end, params.cutoff).await {
            Windowed::Late(answers) => {
                first_stop = Some(StopReason::Cutoff);
                for answer in answers {
                    let late = release_late_claim(&calls, answer, &lease, last_write, &mut errors);
                    if let Some(report) = late.await {
                        order.push(report.run_id);
                        reports.insert(report.run_id, report);
                    }
                }
            }
            Windowed::Unanswered => {
                first_stop = Some(StopReason::Cutoff);
                errors.push(unanswered_claim(together, s.lease_ttl));
            }
            Windowed::InTime(answers) => {
                let round_trip = sent.elapsed();
                for answer in answers {
                    match answer {
                        Ok(Some(run)) => {
                            worker.pace.record_claim(round_trip);
                            let claimed = take_claimed(
                                worker,
                                &calls,
                                run,
                                sent,
                                false,
                                &mut order,
                                &mut poison,
                                &lease,
                                params.cutoff,
                            )
                            .await;
                            first.push_back(claimed);
                        }
                        Ok(None) => {
                            worker.pace.record_claim(round_trip);
                            first_stop.get_or_insert(StopReason::NoPendingRun);
                        }
                        Err(e) => {
                            error!(error = %e, "claim failed");
                            errors.push(format!("claim failed: {e}"));
                            first_stop = Some(StopReason::ClaimError);
                        }
                    }
                }
            }
        }
    }
    let stop_reason = loop {
        if order.len() >= max_runs && waiting.is_none() && first.is_empty() {
            break StopReason::MaxRuns;
        }
        let Some(window_end) = claim_window_end.filter(|end| Instant::now() < *end) else {
            break StopReason::Cutoff;
        };
        // Settle what ended first: whatever follows sees its poison-pill count.
        while let Some(joined) = executions.try_join_next() {
            settle(joined, worker, &mut poison, &mut reports).await;
        }
        let free_slot = slots.clone().try_acquire_owned().ok();
        let to_start = match (free_slot, waiting.take()) {
            (Some(slot), Some(next)) => Some((next, slot)),
            (None, Some(next)) => {
                waiting = Some(next);
                None
            }
            (None, None) if worker.pace.runs_ahead() == 0 => None,
            // A run of the first claims: into the free slot, or waiting for one.
            (slot, None) if !first.is_empty() => match (first.pop_front(), slot) {
                (Some(claimed), Some(slot)) => Some((claimed, slot)),
                (Some(claimed), None) => {
                    waiting = Some(claimed);
                    continue;
                }
                (None, _) => continue,
            },
            // A free slot, or none but room for one run ahead: claim.
            (slot, None) => {
                if let Some(reason) = first_stop.take() {
                    break reason;
                }
                // Defer mode: blocked workflows are left out (read once, then from the cache).
                let capabilities = poison.capabilities_for_claim(&worker.capabilities).await;
                let sent = Instant::now();
                let claim = claim(&calls, &lease, &capabilities, last_write);
                let claimed = match claim_in_window(claim, window_end, params.cutoff).await {
                    Windowed::InTime(claimed) => claimed,
                    Windowed::Late(answer) => {
                        let late =
                            release_late_claim(&calls, answer, &lease, last_write, &mut errors);
                        if let Some(report) = late.await {
                            order.push(report.run_id);
                            reports.insert(report.run_id, report);
                        }
                        break StopReason::Cutoff;
                    }
                    Windowed::Unanswered => {
                        errors.push(unanswered_claim(1, s.lease_ttl));
                        break StopReason::Cutoff;
                    }
                };
                if claimed.is_ok() {
                    worker.pace.record_claim(sent.elapsed());
                }
                let run = match claimed {
                    Ok(Some(run)) => run,
                    Ok(None) => break StopReason::NoPendingRun,
                    Err(e) => {
                        error!(error = %e, "claim failed");
                        errors.push(format!("claim failed: {e}"));
                        break StopReason::ClaimError;
                    }
                };
                let ahead = slot.is_none();
                let claimed = take_claimed(
                    worker,
                    &calls,
                    run,
                    sent,
                    ahead,
                    &mut order,
                    &mut poison,
                    &lease,
                    params.cutoff,
                )
                .await;
                match slot {
                    Some(slot) => Some((claimed, slot)),
                    None => {
                        waiting = Some(claimed);
                        continue;
                    }
                }
            }
        };
        let Some((next, slot)) = to_start else {
            // No free slot, and a run already waits or claiming ahead does not pay: wait.
            if !wait_for_an_end(
                &mut executions,
                window_end,
                worker,
                &mut poison,
                &mut reports,
            )
            .await
            {
                break StopReason::Cutoff;
            }
            continue;
        };
        // Start it, unless its lease was lost or its workflow got blocked meanwhile.
        let run = &next.run;
        if next.refresher.end().is_some() {
            warn!(run_id = %run.id, "abandoning a run claimed ahead: lease lost while it waited");
            let error = next
                .refresher
                .end()
                .map_or_else(|| "lease lost".to_string(), |end| end.describe());
            let error = format!("{error}, before the run started");
            let report = RunReport::not_executed(run, Fate::new(Outcome::LeaseLost, Some(error)));
            reports.insert(run.id, report);
            continue;
        }
        if let Some(reason) = poison.blocked_reason(&run.workflow_name).await {
            let run = next.run.clone();
            next.refresher.stop().await;
            let report = match poison.mode() {
                PoisonMode::Fail => fail_blocked(&calls, &run, &lease, reason, last_write).await,
                PoisonMode::Defer => defer_blocked(&calls, &run, &lease, reason, last_write).await,
            };
            reports.insert(run.id, report);
            continue;
        }
        executions.spawn(
            {
                let params = params.clone();
                // The slot goes back with the report: the run claimed ahead starts in it only
                // once this run's outcome has reached the poison-pill table.
                async move { (execution::execute(params, next).await, slot) }
            }
            .instrument(tracing::Span::current()),
        );
    };
    for next in waiting.take().into_iter().chain(first.drain(..)) {
        // No slot freed before the claim window closed: it goes back to Pending unexecuted,
        // and the pace learns that slots stayed busy longer than claim-ahead bets.
        let run = next.run.clone();
        next.refresher.stop().await;
        worker.pace.record(Outcome::Released, Duration::ZERO);
        let why = "run claimed ahead released: no slot freed in time, Pending again";
        let report = release(&calls, &run, &lease, last_write, why).await;
        reports.insert(run.id, report);
    }

    if stop_reason == StopReason::ClaimError {
        explain_refused_claim(worker, &mut poison, &mut errors, last_write).await;
    }

    while let Some(joined) = executions.join_next().await {
        settle(joined, worker, &mut poison, &mut reports).await;
    }
    // Every run has stopped: what they printed is queued; send it all before returning.
    log_pump_stop.cancel();
    let mut logs = log_pump.await.unwrap_or_default();
    logs += worker.logs.flush(last_write).await;
    let orphans_killed = guard.finish().await;
    let heartbeat = match &s.heartbeat_url {
        Some(url) if errors.is_empty() => {
            Some(heartbeat::ping(worker.api.http(), url, last_write).await)
        }
        _ => None,
    };
    worker.pool.after_invocation();
    worker
        .pace
        .record_batch_end(stop_reason == StopReason::MaxRuns);

    let runs: Vec<RunReport> = order.iter().filter_map(|id| reports.remove(id)).collect();
    let mut outcomes = BTreeMap::new();
    for r in &runs {
        *outcomes.entry(r.outcome).or_insert(0) += 1;
    }
    let wake_ups = match &worker.wake {
        None => None,
        Some(waker) => {
            // The backlog is counted with what the next claim would ask for (defer mode leaves
            // out the workflows the poison-pill table blocks: their runs wake nobody).
            let capabilities = poison.capabilities_for_claim(&worker.capabilities).await;
            let end = BatchEnd {
                request_id,
                handed_back: [Outcome::HandedBack, Outcome::Released]
                    .iter()
                    .filter_map(|o| outcomes.get(o))
                    .sum(),
                filled: stop_reason == StopReason::MaxRuns,
                capabilities: &capabilities,
                budget,
            };
            wake::after_batch(waker, &worker.api, s.max_runs_per_invocation, end).await
        }
    };
    let summary = InvocationSummary {
        request_id: request_id.to_string(),
        worker_id,
        claimed: order.len(),
        outcomes,
        runs,
        stop_reason,
        errors,
        api_errors: faults.snapshot(),
        lease_recoveries: poison.lease_recoveries(),
        time_left_ms: u64::try_from(budget.until_deadline().as_millis()).unwrap_or(u64::MAX),
        orphans_killed,
        logs,
        heartbeat,
        poison_table_errors: poison.table_errors(),
        wake_ups,
    };
    metrics::record(&summary);
    info!(
        claimed = summary.claimed,
        stop_reason = summary.stop_reason.as_str(),
        time_left_ms = summary.time_left_ms,
        "invocation finished"
    );
    summary
}

/// Claim the next run this worker can take, with the invocation's own calls: a fault is
/// retried (at most [`crate::store::CLAIM_ATTEMPTS`] attempts, none past `until`; the caller
/// gives up on a claim still unanswered at the cutoff, [`claim_in_window`]). A lost claim
/// answer is safe to retry: the run it may have claimed sits under a lease nobody refreshes,
/// and the API's reaper requeues it after the lease TTL.
async fn claim(
    calls: &Calls,
    lease: &LeaseRequest,
    capabilities: &WorkerCapabilities,
    until: Instant,
) -> Result<Option<Run>, StoreError> {
    let pick = calls
        .store
        .pick_next_pending_for(Some(lease.clone()), Some(capabilities.clone()));
    calls.within(until, None, pick).await
}

/// After a claim the API refused (`worker API error: <body>`: ApiRunStore keeps no status, and
/// a wrong path has no body), the status of a read-only probe of the same API and the setting
/// it points to, appended to that claim's error ([`crate::api::ApiClient::claim_refusal_hint`]).
/// Once per invocation, after the claim loop, while the invocation's runs (if any) go on, and
/// given up at `until`.
async fn explain_refused_claim(
    worker: &LambdaWorker,
    poison: &mut PoisonGate,
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
    let capabilities = poison.capabilities_for_claim(&worker.capabilities).await;
    if let Ok(Some(hint)) = timeout_at(until, worker.api.claim_refusal_hint(&capabilities)).await {
        *refused = format!("{} ({hint})", refused.trim_end());
    }
}

/// Time kept for the response after our last write to the API: 250 ms.
const RESPONSE_RESERVE: Duration = Duration::from_millis(250);

/// Turn a finished execution into its report and update the poison-pill table.
async fn settle(
    joined: Result<(RunReport, OwnedSemaphorePermit), tokio::task::JoinError>,
    worker: &LambdaWorker,
    poison: &mut PoisonGate,
    reports: &mut HashMap<Uuid, RunReport>,
) {
    // `execute` catches the handler's panics itself; a JoinError here is a bug of ours.
    let (report, _slot) = match joined {
        Ok(done) => done,
        Err(e) => {
            error!(error = %e, "execution task failed");
            return;
        }
    };
    worker.pace.record(report.outcome, report.executed);
    poison.record(&report).await;
    reports.insert(report.run_id, report);
}

/// Fail a claimed run of a blocked workflow without executing it.
async fn fail_blocked(
    calls: &Calls,
    run: &Run,
    lease: &LeaseRequest,
    reason: String,
    until: Instant,
) -> RunReport {
    warn!(run_id = %run.id, workflow = %run.workflow_name, error = %reason, "skipping run: poison pill");
    let key = RunKey {
        run_id: run.id,
        worker_id: lease.worker_id.clone(),
    };
    let write = calls
        .engine
        .fail_or_schedule_retry(run.id, &reason, false, None, None);
    let fate = match calls.within(until, Some(key), write).await {
        Ok(_) => Fate::new(Outcome::PoisonBlocked, Some(reason)),
        Err(e) => Fate::left_to_reaper(
            Outcome::PoisonBlocked,
            format!("{reason} (recording it failed: {e}; left to the API's reaper)"),
        ),
    };
    RunReport::not_executed(run, fate)
}

/// Defer mode: a run claimed while its workflow is blocked (the block came from this claim's
/// own lease recovery, from a run that ended while this one waited for a slot, or from another
/// instance after this invocation read the counter) is written back to Pending without
/// executing; the following claims leave its workflow out.
async fn defer_blocked(
    calls: &Calls,
    run: &Run,
    lease: &LeaseRequest,
    reason: String,
    until: Instant,
) -> RunReport {
    warn!(run_id = %run.id, workflow = %run.workflow_name, error = %reason, "deferring run: poison pill");
    let fate = match write_back_unexecuted(calls, run.id, lease, until).await {
        Ok(()) => Fate::new(
            Outcome::PoisonBlocked,
            Some(format!("{reason}; written back to Pending (defer mode)")),
        ),
        Err(NotWrittenBack::Gone(fate)) => Fate::new(
            fate.outcome,
            Some(format!("{reason}; {}", fate.error.unwrap_or_default())),
        ),
        Err(NotWrittenBack::Reaper(e)) => {
            Fate::left_to_reaper(Outcome::PoisonBlocked, format!("{reason}; {e}"))
        }
    };
    RunReport::not_executed(run, fate)
}

/// A run claimed but not started before the claim window closed (`why`, logged): written back
/// to Pending (Released), unless its lease is no longer this invocation's (nothing written).
async fn release(
    calls: &Calls,
    run: &Run,
    lease: &LeaseRequest,
    until: Instant,
    why: &str,
) -> RunReport {
    let fate = match write_back_unexecuted(calls, run.id, lease, until).await {
        Ok(()) => {
            info!(run_id = %run.id, "{why}");
            Fate::new(Outcome::Released, None)
        }
        Err(NotWrittenBack::Gone(fate)) => {
            warn!(run_id = %run.id, error = fate.error.as_deref().unwrap_or(""), "run claimed ahead not released");
            fate
        }
        Err(NotWrittenBack::Reaper(e)) => {
            error!(run_id = %run.id, error = %e, "could not release a run claimed ahead");
            Fate::left_to_reaper(Outcome::Released, e)
        }
    };
    RunReport::not_executed(run, fate)
}

/// A claim's answer, as the claim window saw it ([`claim_in_window`]).
enum Windowed<T> {
    /// Answered before the claim window closed.
    InTime(T),
    /// Answered after the claim window closed, before the cutoff.
    Late(T),
    /// Still unanswered at the cutoff; given up.
    Unanswered,
}

/// Await `claim` until `window_end`, and one still in flight then until `cutoff`, instead of
/// dropping it as the window closes: the API may already have taken a run for it, which would
/// otherwise sit Running under a lease nobody refreshes until the lease TTL runs out. The
/// invocation waits for its running executions until the cutoff anyway.
async fn claim_in_window<F: Future>(
    claim: F,
    window_end: Instant,
    cutoff: Instant,
) -> Windowed<F::Output> {
    let mut claim = std::pin::pin!(claim);
    if let Ok(answer) = timeout_at(window_end, claim.as_mut()).await {
        return Windowed::InTime(answer);
    }
    match timeout_at(cutoff, claim).await {
        Ok(answer) => Windowed::Late(answer),
        Err(_) => Windowed::Unanswered,
    }
}

/// A claim answered after the claim window closed: a run it took goes back to Pending without
/// executing (its report, to list in the summary); a failure is logged and kept in `errors`.
async fn release_late_claim(
    calls: &Calls,
    answer: Result<Option<Run>, StoreError>,
    lease: &LeaseRequest,
    until: Instant,
    errors: &mut Vec<String>,
) -> Option<RunReport> {
    match answer {
        Ok(Some(run)) => {
            let why = "run released: its claim was answered after the claim window closed";
            Some(release(calls, &run, lease, until, why).await)
        }
        Ok(None) => None,
        Err(e) => {
            error!(error = %e, "claim failed after the claim window closed");
            errors.push(format!("claim failed: {e}"));
            None
        }
    }
}

/// The error kept for `claims` still unanswered at the cutoff.
fn unanswered_claim(claims: usize, lease_ttl: Duration) -> String {
    let e = format!(
        "{claims} claim(s) still unanswered at the cutoff, given up: the API accepted the \
         connection but did not answer; a run the API gave one of them goes back to Pending \
         when its lease expires ({} s)",
        lease_ttl.as_secs()
    );
    error!("{e}");
    e
}

/// Take in a run just claimed by a request sent at `claim_sent` (`ahead`: while every slot was
/// busy): listed in claim order, its recovery from a dead invocation counted by the
/// poison-pill gate, its lease refresher started (every interval, until the cutoff).
#[allow(clippy::too_many_arguments)]
async fn take_claimed(
    worker: &LambdaWorker,
    calls: &Calls,
    run: Run,
    claim_sent: Instant,
    ahead: bool,
    order: &mut Vec<Uuid>,
    poison: &mut PoisonGate,
    lease: &LeaseRequest,
    cutoff: Instant,
) -> Claimed {
    order.push(run.id);
    info!(run_id = %run.id, workflow = %run.workflow_name, ahead, "claimed run");
    // The lease starts now: its refresher before the poison-pill table's calls.
    let ctx = RefreshContext {
        store: calls.store.clone(),
        faults: calls.faults.clone(),
    };
    let interval = worker.settings.lease_refresh_interval;
    let claimed = Claimed::new(ctx, run, lease, claim_sent, interval, cutoff);
    poison.on_claim(&claimed.run).await;
    claimed
}

/// Wait until an execution ends and settle it; `false` if the claim window closed first.
async fn wait_for_an_end(
    executions: &mut JoinSet<(RunReport, OwnedSemaphorePermit)>,
    window_end: Instant,
    worker: &LambdaWorker,
    poison: &mut PoisonGate,
    reports: &mut HashMap<Uuid, RunReport>,
) -> bool {
    tokio::select! {
        biased;
        Some(joined) = executions.join_next() => {
            settle(joined, worker, poison, reports).await;
            true
        }
        () = sleep_until(window_end) => false,
    }
}
