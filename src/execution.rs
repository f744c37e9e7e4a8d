//! One claimed run, executed under its lease, its run deadline and the invocation cutoff,
//! down to an [`Outcome`].
//!
//! The engine executes the run on the execution runtime ([`crate::runtime`]), inside the run's
//! store scope ([`crate::store::scope`]); its supervisor, here on the invocation's runtime,
//! waits for the first of:
//!
//! ```text
//! select {
//!   the execution's task      → Completed │ Suspended │ Failed (recorded by the engine)
//!                             │ Panicked → fail_or_schedule_retry (retryable)
//!   an API fault the store's retries could not overcome
//!                             → handback (an infrastructure error, never a workflow failure)
//!   the next step would not fit before the cutoff (not created: cutoff-aware starts)
//!                             → handback (not counted by the loop guard)
//!   the lease ended           → Cancelled │ LeaseLost (nothing written)
//!                             │ expired: handback once the lease is confirmed again
//!   run deadline              → TimedOut → fail_or_schedule_retry (retryable)
//!   cutoff                    → handback (HandedBack, or Failed by the loop guard)
//! }
//! ```
//!
//! Every way but the first stops the execution before anything is written: its scope is
//! fenced (nothing it sends from then on reaches the API), its task is aborted (its child
//! processes die with it, `kill_on_drop`) and awaited for [`STOP_GRACE`]. A task still running
//! then is blocked in workflow code that does not yield: the run's fate is written all the
//! same, and the report says `stuck`.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_engine::engine::{WorkflowResult, chain_root};
use ironflow_engine::error::EngineError;
use ironflow_store::entities::{LeaseUpdate, Run, RunStatus, RunUpdate};
use ironflow_store::error::StoreError;
use ironflow_store::store::RunStore;
use tokio::task::JoinError;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, error, info, warn};
use uuid::Uuid;

use crate::attempt_time;
use crate::claimed::{Claimed, StepsAhead};
use crate::context::Invocation;
use crate::deadline::later;
use crate::handback::{Handback, Why};
use crate::lease::{LeaseEnd, LeaseRefresher};
use crate::orphans;
use crate::process_mark::{LiveMark, RunMark};
use crate::report::{Fate, Outcome, RunReport, Spend};
use crate::store::fit::StartFit;
use crate::store::scope::{CallScope, InFlight, RunKey, ScopeStop};

/// How long a stopped execution's task is awaited after its abort: 100 ms. Cancelled at its
/// next await, a task ends in microseconds; one still running after this is blocked in
/// workflow code.
pub const STOP_GRACE: Duration = Duration::from_millis(100);

/// Execute the `claimed` run (claimed under the invocation's lease) and return its report.
pub(crate) async fn execute(ctx: Arc<Invocation>, claimed: Claimed) -> RunReport {
    let span = claimed.span.clone();
    execute_in_span(&ctx, claimed).instrument(span).await
}

/// Why the supervisor stopped waiting.
enum Stop {
    /// The execution's task ended: the engine's result, or a panic.
    Finished(Box<Result<Result<WorkflowResult, EngineError>, JoinError>>),
    /// A store call stopped the execution (an API fault, or the run left this worker).
    Scope(ScopeStop),
    /// The lease ended.
    Lease(LeaseEnd),
    TimedOut,
    Cutoff,
}

async fn execute_in_span(ctx: &Invocation, claimed: Claimed) -> RunReport {
    let Claimed {
        run,
        refresher,
        claim_sent,
        interval,
        start_margin,
        steps_ahead,
        ..
    } = claimed;
    let started = Instant::now();
    // When it starts executing here; a run claimed ahead may have waited since its claim.
    let claimed_at = Utc::now();
    let key = ctx.key(run.id).executing(run.lease_recoveries);

    // What this attempt executed in earlier invocations: the run timeout counts the rest.
    let used = executed_before(ctx, &run, claimed_at).await;
    let run_deadline = later(started, ctx.run_timeout.saturating_sub(used));
    let timeout_msg = format!(
        "run timed out after {}s of execution ({} ms of it in earlier invocations of this \
         attempt; waits not counted)",
        ctx.run_timeout.as_secs(),
        used.as_millis()
    );
    // A resumed attempt says how much of its timeout is spent; a first start adds nothing to
    // the claim's line but at DEBUG.
    if used.is_zero() {
        debug!("executing run");
    } else {
        info!(
            executed_before_ms = used.as_millis() as u64,
            "executing run"
        );
    }

    let cutoff = ctx.budget.cutoff();
    let mut scope = CallScope::execution(
        key,
        cutoff,
        refresher.clock().clone(),
        ctx.calls.faults.clone(),
    )
    .with_start_margin(start_margin);
    if let Some(times) = &ctx.step_times {
        let late = started.saturating_duration_since(ctx.budget.start());
        let fit = StartFit::new(&run.workflow_name, times.clone(), ctx.default_step, late);
        scope = scope.with_fit(fit);
    }
    let scope = Arc::new(scope);
    // Every process the run's steps start carries this mark: they end with the run.
    let live_mark = LiveMark::new();
    let mark = live_mark.mark();
    // The tasks the engine spawns outside the scope (`ctx.parallel`'s branches) find the cutoff.
    let _in_flight = InFlight::enter(cutoff);
    let mut task = spawn_work(ctx, &run, &scope, mark, claim_sent, interval, steps_ahead);

    let mut stop = supervise(&mut task, &scope, &refresher, run_deadline, cutoff).await;
    let executed = started.elapsed();
    let target = refresher.target();
    let stuck = stop_task(ctx, run.id, &mut task, &scope, &mut stop).await;
    let lease_valid_until = refresher.clock().valid_until();
    refresher.stop().await;
    end_processes(ctx, mark).await;
    // From here on, a process with this mark belongs to no live run: a sweep may take it.
    live_mark.ended();

    let timing = Timing {
        claimed_at,
        executed,
        timeout_msg,
        lease_valid_until,
    };
    let fate = decide(ctx, &run, stop, &scope, target, timing).await;
    report(ctx, &run, fate, executed, &scope, stuck)
}

/// The report of `run`, which executed for `executed` to `fate` in `scope` (`stuck`: its
/// execution did not stop), with when it is due again and what it spent.
fn report(
    ctx: &Invocation,
    run: &Run,
    fate: Fate,
    executed: Duration,
    scope: &CallScope,
    stuck: bool,
) -> RunReport {
    let mut report = RunReport::new(run, fate, executed);
    // A retry's backoff or a sleep the engine wrote (or, for a timeout or a panic, the retry
    // record_failure armed): when the run is due again.
    if report.due.is_none() {
        report.due = scope.due().filter(|_| {
            matches!(
                report.outcome,
                Outcome::Failed | Outcome::Suspended | Outcome::TimedOut | Outcome::Panicked
            )
        });
    }
    report.spend = spend(ctx, scope, &report);
    info!(
        outcome = ?report.outcome,
        input_tokens = report.spend.input_tokens,
        output_tokens = report.spend.output_tokens,
        cost_usd = report.spend.cost_usd,
        steps_cut = report.spend.steps_cut,
        calls_cut = report.spend.calls_cut,
        estimated_input_tokens = report.spend.estimated_input_tokens,
        "run execution ended"
    );
    if stuck {
        report.stuck = true;
        let note = "its execution did not stop (a step blocks its thread)";
        report.error = Some(match report.error.take() {
            Some(e) => format!("{e}; {note}"),
            None => note.to_string(),
        });
    }
    report
}

/// What the run's steps used and cost in this execution (the records this worker wrote), the
/// model calls its scope saw cut, and, for a run handed back, its steps still running (cut).
fn spend(ctx: &Invocation, scope: &CallScope, report: &RunReport) -> Spend {
    let (mut spend, open) = ctx.engine_store.take_spend(report.run_id);
    if report.outcome == Outcome::HandedBack {
        spend.steps_cut = open;
    }
    (spend.calls_cut, spend.estimated_input_tokens) = scope.calls_cut();
    spend
}

/// Kill what the run's steps left running (detached processes included: they carry `mark`),
/// waiting at most 1 s, never past the invocation's last write; counted in the invocation's
/// `orphans_killed`. Other runs' processes are left alone.
async fn end_processes(ctx: &Invocation, mark: RunMark) {
    // The common end (its steps' processes exited and were reaped): one system call, no
    // blocking task.
    if orphans::has_no_child() {
        return;
    }
    let wait = PROCESS_REAP_WAIT.min(
        ctx.budget
            .last_write()
            .saturating_duration_since(Instant::now()),
    );
    match tokio::task::spawn_blocking(move || mark.kill_processes(wait)).await {
        Ok(killed) => {
            if killed > 0 {
                info!(count = killed, "killed processes the run left");
            }
            ctx.processes_killed.fetch_add(killed, Ordering::Relaxed);
        }
        Err(e) => warn!(error = %e, "the run's process cleanup failed"),
    }
}

/// The longest a run's end waits for its killed processes to be reaped: 1 s.
const PROCESS_REAP_WAIT: Duration = Duration::from_secs(1);

/// The longest the handback of a run whose lease expired unconfirmed may take, from the
/// moment it starts: one API call's first attempt limit (2 s,
/// [`crate::store::guard::FIRST_ATTEMPT_TIMEOUT`]). If the lease is not confirmed again (and
/// the run written back) within it, the run is left to the API's reaper, untouched. With the
/// execution's stop ([`STOP_GRACE`]) and its processes' reap ([`PROCESS_REAP_WAIT`]), the run's
/// work ends at most 3.1 s after its lease's expiry (`docs/faults.md`, "The lease").
const LEASE_EXPIRED_HANDBACK: Duration = crate::store::guard::FIRST_ATTEMPT_TIMEOUT;

/// The run's execution, spawned on the execution runtime inside `scope`, its processes marked
/// with `mark`; the engine's reads of the run are answered from what this execution knows of it
/// (the claim's copy first; the view goes when the execution stops), its first step list from
/// `steps_ahead` when the run was claimed ahead.
fn spawn_work(
    ctx: &Invocation,
    run: &Run,
    scope: &Arc<CallScope>,
    mark: RunMark,
    claim_sent: Instant,
    interval: Duration,
    steps_ahead: Option<StepsAhead>,
) -> AbortOnDropHandle<Result<WorkflowResult, EngineError>> {
    let (engine, store, run) = (ctx.engine.clone(), ctx.engine_store.clone(), run.clone());
    let work = async move {
        let _viewed = store.prime(&run, claim_sent, interval);
        if let Some(ahead) = steps_ahead
            && let Some((steps, sent)) = ahead.ready().await
        {
            store.keep_steps(run.id, steps, sent);
        }
        engine.execute_handler_run(run.id).await
    };
    ctx.runtime
        .spawn(mark.mark(scope.clone().run(work).instrument(tracing::Span::current())))
}

/// Wait for the first way the run's execution ends (see the module docs).
async fn supervise(
    task: &mut AbortOnDropHandle<Result<WorkflowResult, EngineError>>,
    scope: &CallScope,
    refresher: &LeaseRefresher,
    run_deadline: Instant,
    cutoff: Instant,
) -> Stop {
    // A lease the API refuses to renew because the execution itself took the run out of
    // Running (its final status, a suspension) is no reason to stop it: it is winding down, and
    // its writes stay bounded by the lease's last validity. Any other status (an operator's
    // pause, or a resume since, which makes the run Pending and claimable by another worker)
    // stops it at once, as another worker's takeover does.
    let mut winding_down = false;
    loop {
        break tokio::select! {
            biased;
            joined = &mut *task => Stop::Finished(Box::new(joined)),
            why = scope.stopped() => Stop::Scope(why),
            end = refresher.ended(), if !winding_down => match end {
                LeaseEnd::Left { status } if scope.wrote_status(status) => {
                    info!(status = %status, "the run left Running: letting its execution finish");
                    winding_down = true;
                    continue;
                }
                // Refused with no holder named while this execution was writing the run out
                // of Running (its final status raced the renewal), the status unreadable or
                // read as Running with no holder (a read answered before that write landed):
                // its own write, as far as anyone can tell; nobody else holds the run (a
                // worker that claimed it would be named, by the refusal or the read).
                LeaseEnd::Unexplained | LeaseEnd::TakenOver { held_by: None }
                    if scope.left_running_itself() =>
                {
                    info!("the lease was refused as the run left Running: letting its execution finish");
                    winding_down = true;
                    continue;
                }
                end => Stop::Lease(end),
            },
            () = sleep_until(run_deadline) => Stop::TimedOut,
            () = sleep_until(cutoff) => Stop::Cutoff,
        };
    }
}

/// Stop the execution unless it finished (fenced, aborted, awaited for [`STOP_GRACE`]); an end
/// it reached meanwhile replaces `stop`. Returns whether it is stuck (blocked in workflow
/// code that does not yield).
async fn stop_task(
    ctx: &Invocation,
    run_id: Uuid,
    task: &mut AbortOnDropHandle<Result<WorkflowResult, EngineError>>,
    scope: &CallScope,
    stop: &mut Stop,
) -> bool {
    let mut stuck = false;
    if !matches!(stop, Stop::Finished(_)) {
        // Nothing the execution sends from now on reaches the API; then it is dropped (its
        // child processes die with it).
        scope.fence();
        task.abort();
        let grace = later(Instant::now(), STOP_GRACE).min(ctx.budget.last_write());
        match timeout_at(grace, &mut *task).await {
            // It ended on its own meanwhile: what it recorded stands.
            Ok(Ok(result)) => *stop = Stop::Finished(Box::new(Ok(result))),
            Ok(Err(e)) if e.is_panic() => *stop = Stop::Finished(Box::new(Err(e))),
            Ok(Err(_cancelled)) => {}
            Err(_) => {
                stuck = true;
                error!(
                    "the run's execution did not stop: workflow code blocks its thread; its \
                     fate is written without it, and nothing it sends later reaches the API"
                );
                // Counted until the blocked code yields (the aborted task ends then).
                ctx.stuck.add(run_id, task.abort_handle());
            }
        }
    }
    stuck
}

/// When the run was taken up here, how long it executed, the timeout's message, and its
/// lease's last confirmed validity.
struct Timing {
    claimed_at: DateTime<Utc>,
    executed: Duration,
    timeout_msg: String,
    lease_valid_until: Instant,
}

/// The run's fate for `stop`, written where it must be.
async fn decide(
    ctx: &Invocation,
    run: &Run,
    stop: Stop,
    scope: &CallScope,
    target: Uuid,
    timing: Timing,
) -> Fate {
    // A lease known lost (its last confirmed validity passed, whatever stopped the run) gets
    // `LEASE_EXPIRED_HANDBACK` to be confirmed again and the run written back, not the
    // invocation's time: the invocation can then return or take other work.
    let lease_lost = Instant::now() >= timing.lease_valid_until;
    let until = match lease_lost {
        true => later(Instant::now(), LEASE_EXPIRED_HANDBACK).min(ctx.budget.last_write()),
        false => ctx.budget.last_write(),
    };
    // A sub-workflow child's lease may have moved to its root since the refresher's last
    // renewal: what is written goes to the run whose lease is held.
    let target = held(ctx, run, target, scope, until).await;
    // Its calls are made for the execution's holding of `target` (of the chain's root, the one
    // that began as the lease moved to it): never for a later claim of it by this invocation
    // ([`crate::store::claim_log`]).
    let key = ctx.key_for(target, scope.holding_of(target).as_ref());
    // Boxed, as `record_failure` is: a handback is a large future that most executions never
    // make, and inline it would size every run's future, moved whole at each spawn.
    let hand_back = |why| {
        Box::pin(ctx.hand_back(Handback {
            run,
            key: key.clone(),
            claimed_at: timing.claimed_at,
            executed: timing.executed,
            why,
            lost_time: scope.lost_time_to_api(),
            until,
        }))
    };
    // An operator paused the run while it executed here (seen by the engine, a write or the
    // lease): the run itself, or the root a sub-workflow child's execution resumed and holds.
    let paused = match &stop {
        Stop::Finished(joined) => matches!(&**joined,
            Ok(Ok(result)) if result.run.id == target && result.run.status.state == RunStatus::Paused),
        Stop::Scope(ScopeStop::RunLeft { status, .. }) | Stop::Lease(LeaseEnd::Left { status }) => {
            *status == RunStatus::Paused
        }
        _ => false,
    };
    let fate = match stop {
        Stop::Finished(joined) => {
            finished(ctx, run, key.clone(), *joined, scope.status_refused()).await
        }
        Stop::Scope(ScopeStop::Fault(fault)) => {
            warn!(error = %fault, "the API kept failing: handing the run back");
            hand_back(Why::ApiFault(fault)).await
        }
        Stop::Scope(ScopeStop::Deferred(deferral)) => {
            info!(
                step = %deferral.step,
                expected_ms = deferral.expected.as_millis() as u64,
                left_ms = deferral.left.as_millis() as u64,
                "the next step would not fit before the cutoff: handing the run back to start it \
                 in the next invocation"
            );
            // Claimed again now, it would only be deferred again: the time left shrinks.
            ctx.left_out.leave_out(&run.workflow_name);
            hand_back(Why::Deferred(deferral)).await
        }
        Stop::Scope(ScopeStop::ClaimedAgain) => claimed_again(),
        Stop::Scope(ScopeStop::RunLeft { status, held_by }) => {
            let end = match status {
                RunStatus::Cancelled => LeaseEnd::Cancelled,
                RunStatus::Running => LeaseEnd::TakenOver { held_by },
                status => LeaseEnd::Left { status },
            };
            abandoned(&end)
        }
        Stop::Lease(end @ LeaseEnd::Expired { .. }) => {
            // Stopped at the lease's end. Writing the handback needs the lease confirmed
            // again first (the API had not reaped it yet); if not, it is the reaper's.
            hand_back(Why::LeaseExpired(end.describe())).await
        }
        Stop::Lease(end) => abandoned(&end),
        // The run deadline met an expired lease the refresher had not reported yet: the
        // failure is not written unconfirmed. Handed back (the next claim counts the time it
        // executed and times it out), or left to the reaper.
        Stop::TimedOut if lease_lost => {
            let why = format!("{}; the lease had expired unconfirmed", timing.timeout_msg);
            hand_back(Why::LeaseExpired(why)).await
        }
        Stop::TimedOut => {
            error!(error = %timing.timeout_msg, "run timed out");
            let msg = timing.timeout_msg.clone();
            record_failure(ctx, key.clone(), Outcome::TimedOut, msg).await
        }
        Stop::Cutoff => hand_back(Why::Cutoff).await,
    };
    // A pause met first by a handback's lease confirmation or by a failure's write (the engine
    // writes nothing to a paused run) left nothing written: the run is Paused, and its pause
    // is a wait, not execution, for the run timeout.
    if paused || fate.paused {
        let ours = ctx.engine_store.open_steps(run.id);
        ctx.mark_the_pause(key, timing.claimed_at, until, &ours)
            .await;
    }
    fate
}

/// The fate of a run whose execution's task ended: with the engine's result, or a panic; `key`
/// is the run whose lease is held, for the execution's holding.
async fn finished(
    ctx: &Invocation,
    run: &Run,
    key: RunKey,
    joined: Result<Result<WorkflowResult, EngineError>, JoinError>,
    status_refused: bool,
) -> Fate {
    let target = key.run_id;
    match joined {
        // Our own run, left waiting by its handler (a timer or signal: sleeping; an approval;
        // an operator's pause, or already resumed from it: pending, running). A sub-workflow
        // child resumes its root, whose status is not this run's: completed, as before, unless
        // an operator paused the root this execution held.
        Ok(Ok(result))
            if (result.run.id == run.id && !result.run.status.state.is_terminal())
                || (result.run.id == target
                    && target != run.id
                    && result.run.status.state == RunStatus::Paused) =>
        {
            info!(status = %result.run.status.state, "run suspended");
            // An operator's pause is no handler's suspension (the poison pill neither counts
            // nor resets it): it says so.
            let paused = (result.run.status.state == RunStatus::Paused).then(|| {
                "paused by an operator while it executed: the resume replays it".to_string()
            });
            Fate::new(Outcome::Suspended, paused)
        }
        Ok(Ok(_)) => {
            // At DEBUG: the run's end line ("run execution ended", outcome Completed) says it.
            debug!("run completed");
            Fate::new(Outcome::Completed, None)
        }
        Ok(Err(e)) => {
            // The engine routed this failure through fail_or_schedule_retry already: writing
            // Failed again would cancel an armed retry. An API fault never gets here (the
            // store stops the execution instead): this is the workflow's own failure. The API
            // may have refused that write (the engine logs it and goes on): the run is then
            // still Running under this lease, and the reaper takes it back once it expires.
            let e = e.to_string();
            if status_refused {
                error!(error = %e, "run failed, and the API refused the write of its failure: left to the API's reaper");
                return Fate::left_to_reaper(
                    Outcome::Failed,
                    format!("{e} (the API refused its failure's write; left to the API's reaper)"),
                );
            }
            error!(error = %e, "run failed");
            Fate::new(Outcome::Failed, Some(e))
        }
        Err(panic) => {
            let msg = format!("run panicked: {}", panic_message(panic));
            error!(error = %msg, "run panicked");
            record_failure(ctx, key, Outcome::Panicked, msg).await
        }
    }
}

/// The run whose lease this execution holds as its fate is written: `target`, the refresher's,
/// or the root of sub-workflow child `run` once the execution moved the child's lease to it,
/// which the refresher follows only at its next renewal. ironflow-engine's `resume_chain`
/// moves the root to Running with the child's lease, then releases the child's
/// ([`CallScope::lease_moved`]: the release landed, the root holds the lease). An execution
/// stopped between the two (the root's write sent, [`CallScope::lease_sent_to`], the release
/// not landed) asks the API: a renewal of the root's lease with ours tells whether the root
/// holds it, and if so the child's lease is released here, as the engine would have, so that
/// neither run is left Running under a lease nobody renews. A child whose execution sent the
/// root nothing (it waited for a root another execution of the chain holds, or found the chain
/// settled) holds the child alone. The calls are bounded by `until`; an unanswered renewal
/// keeps the child.
async fn held(
    ctx: &Invocation,
    run: &Run,
    target: Uuid,
    scope: &CallScope,
    until: Instant,
) -> Uuid {
    let root = match chain_root(run) {
        Some(root) if target == run.id && scope.lease_sent_to(root) => root,
        _ => return target,
    };
    if scope.lease_moved() {
        debug!(root_run_id = %root, "the lease had moved to the run's root");
        return root;
    }
    let store = &ctx.calls.store;
    let follow = async {
        if store.renew_lease(root, ctx.lease.clone()).await.is_err() {
            return false;
        }
        let release = RunUpdate {
            lease: Some(LeaseUpdate::Release),
            ..RunUpdate::default()
        };
        if let Err(e) = store.update_run(run.id, release).await {
            warn!(error = %e, "could not release the child's lease after its root took it: the reaper recovers the child once it expires");
        }
        true
    };
    let key = ctx.key_for(run.id, scope.run_key().and_then(|k| k.holding.as_ref()));
    match ctx.calls.within(until, Some(key), follow).await {
        true => {
            info!(root_run_id = %root, "the execution stopped as the lease moved to the run's root: the root's is the fate to write");
            root
        }
        false => target,
    }
}

/// The fate of a run abandoned because its lease ended (nothing is written: the run is not
/// this worker's any more).
fn abandoned(end: &LeaseEnd) -> Fate {
    let why = end.describe();
    warn!(reason = %why, "abandoning the run");
    match end {
        LeaseEnd::Cancelled => Fate::new(Outcome::Cancelled, Some(why)),
        LeaseEnd::Left {
            status: RunStatus::Paused,
        } => Fate::new(Outcome::Suspended, Some(why)),
        _ => Fate::new(Outcome::LeaseLost, Some(why)),
    }
}

/// Record a failure observed from outside the handler (timeout, panic) as retryable, with the
/// invocation's own calls for `key`, bounded by the last write. A failure that could not be
/// recorded leaves the run to the reaper.
///
/// Its future is boxed: it is large and seldom made, and inline it would size every run's
/// future, which is moved whole as it is spawned.
async fn record_failure(ctx: &Invocation, key: RunKey, outcome: Outcome, msg: String) -> Fate {
    let until = ctx.budget.last_write();
    Box::pin(ctx.record_failure(key, outcome, msg, true, until)).await
}

/// The fate of a run whose execution met a later claim of the run by this invocation: the run
/// went back to Pending (a write of this execution giving it up landed, its answer lost; or an
/// operator paused and resumed it) and the claim loop took it again. Nothing more is written
/// here: the later claim's execution writes the run's fate. Handed back, with why: not
/// `LeaseLost`, whose next lease recovery the poison pill would expect (the later claim holds
/// the lease, and its holder's death must count).
fn claimed_again() -> Fate {
    let why = "claimed again by this invocation after the run went back to Pending (a write \
               giving it up landed unanswered, or a pause and a resume): its later execution \
               writes the run's fate, nothing written here";
    warn!(reason = why, "abandoning the run");
    Fate::new(Outcome::HandedBack, Some(why.to_string()))
}

/// How long the current attempt of `run` executed before `claimed_at`, read from its steps
/// and from those of the sub-workflow runs they entered ([`attempt_time::executed`]: waits do
/// not count, a child's included), or zero for a run that never executed (its recorded
/// duration is zero). A claimed sub-workflow child (its wait ended) is executed by resuming its
/// root's chain (ironflow-engine's `resume_chain`): the root's attempt is what executes, and
/// what is read (the root's run and its steps, one more read). The reads are the invocation's,
/// bounded by the cutoff; a read of the run's steps that fails counts nothing (the timeout then
/// counts from this invocation). The children's ([`read_children`]) take at most
/// [`CHILD_READS_WAIT`] in all and [`MAX_STEP_LISTS`] lists; one left unread adds nothing of
/// its own (its `workflow` step's interval counts as executed unless a sibling read waited
/// across it).
async fn executed_before(ctx: &Invocation, run: &Run, claimed_at: DateTime<Utc>) -> Duration {
    let root = chain_root(run);
    if root.is_none() && run.duration_ms == 0 {
        return Duration::ZERO;
    }
    let store = &ctx.calls.store;
    let read = async {
        let run = match root {
            Some(root) => store.get_run(root).await?.unwrap_or_else(|| run.clone()),
            None => run.clone(),
        };
        if run.duration_ms == 0 {
            return Ok(None);
        }
        let attempt = run.retry_count + 1;
        let steps = store.list_steps(run.id).await?;
        let mut children = attempt_time::Children::new();
        let first = attempt_time::children_of(&steps, Some(attempt));
        if !first.is_empty() {
            let reads = read_children(ctx, first, &mut children);
            if tokio::time::timeout(CHILD_READS_WAIT, reads).await.is_err() {
                warn!(
                    read = children.len(),
                    "the sub-workflows' steps were not all read in time: those left unread count their time as executed unless a sibling waited"
                );
            }
        }
        Ok::<_, StoreError>(Some((steps, attempt, children)))
    };
    match ctx
        .calls
        .within(ctx.budget.cutoff(), Some(ctx.key(run.id)), read)
        .await
    {
        Ok(Some((steps, attempt, children))) => {
            attempt_time::executed(&steps, attempt, &children, claimed_at)
        }
        Ok(None) => Duration::ZERO,
        Err(e) => {
            warn!(error = %e, "could not list steps to find the attempt's executed time");
            Duration::ZERO
        }
    }
}

/// Read into `children` the steps of the sub-workflow runs `first` and of theirs, level by
/// level, each once, up to [`attempt_time::MAX_DEPTH`] levels and [`MAX_STEP_LISTS`] lists in
/// all (the run's own included), in the order [`attempt_time::children_of`] gives (those that
/// could have waited longest first). A child whose read fails is left out: it adds nothing of
/// its own.
async fn read_children(ctx: &Invocation, first: Vec<Uuid>, children: &mut attempt_time::Children) {
    let store = &ctx.calls.store;
    let (mut next, mut reads) = (first, 1);
    for _ in 0..attempt_time::MAX_DEPTH {
        let mut below = Vec::new();
        for id in next {
            if reads >= MAX_STEP_LISTS || children.contains_key(&id) {
                continue;
            }
            reads += 1;
            match store.list_steps(id).await {
                Ok(child) => {
                    below.extend(attempt_time::children_of(&child, None));
                    children.insert(id, child);
                }
                Err(e) => {
                    warn!(child_run_id = %id, error = %e, "could not list a sub-workflow's steps: its time counts as executed unless a sibling waited")
                }
            }
        }
        next = below;
    }
}

/// The most step lists [`executed_before`] reads at a claim: the run's own and 15 of its
/// sub-workflows'.
const MAX_STEP_LISTS: usize = 16;

/// The longest [`executed_before`] reads the sub-workflows' steps, in all: 2 s. An API that
/// answers slowly costs the claim no more than that.
const CHILD_READS_WAIT: Duration = Duration::from_secs(2);

fn panic_message(panic: JoinError) -> String {
    if !panic.is_panic() {
        return panic.to_string();
    }
    let payload = panic.into_panic();
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
    fn a_cancel_and_a_pause_are_told_from_a_lost_lease() {
        assert_eq!(abandoned(&LeaseEnd::Cancelled).outcome, Outcome::Cancelled);
        assert_eq!(
            abandoned(&LeaseEnd::Left {
                status: RunStatus::Paused
            })
            .outcome,
            Outcome::Suspended
        );
        let lost = abandoned(&LeaseEnd::TakenOver {
            held_by: Some("w2".into()),
        });
        assert_eq!(lost.outcome, Outcome::LeaseLost);
        assert!(lost.error.unwrap().contains("w2"));
    }
}
