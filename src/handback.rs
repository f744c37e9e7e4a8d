//! Handback: a run whose execution stopped before its end goes back to Pending, to be resumed
//! by the next invocation through ironflow's replay (completed steps are served from the store,
//! the interrupted step runs again). A run is handed back at the cutoff, when its attempt ended
//! on an API fault (an infrastructure error is never a workflow failure), when its lease
//! expired without a confirmed refresh but can still be confirmed now, and before a step that
//! would not fit before the cutoff (cutoff-aware starts: [`Why::Deferred`]).
//!
//! By the time [`Invocation::hand_back`] is called (its inputs: [`Handback`]) the execution has
//! been stopped (and fenced: nothing it sends reaches the API) and the lease refresher has
//! stopped. Then, in order, with the
//! invocation's own calls, each retried until the last write:
//! 1. confirm the lease is still this invocation's (`renew_lease`); if not, write nothing (the
//!    run was cancelled or is someone else's);
//! 2. the loop guard, at a *counted* cutoff only: a run that made no progress (no step
//!    completed in this invocation) for the `max_handbacks_without_progress`-th time in a row
//!    is failed instead, and so is a run that spent a long stretch without starting or
//!    finishing any step (outside steps, a replay redoes the same work, so it could never
//!    finish). A cutoff counts only when the execution had a fair chance: the API cost it no
//!    time (no call met a fault, every attempt being one request so that no retry is hidden,
//!    and no answer took [`SLOW_ANSWER`] or more: [`CallScope::lost_time_to_api`]) and it
//!    executed for at least half an invocation's window ([`HandbackPolicy::fair_share`]), and no
//!    step completed in this invocation (a handback after progress is not "without progress",
//!    then or later). The reaper's interruptions of a dead holder's steps never count (the
//!    poison pill counts that death). Handbacks after an API fault or an expired lease never
//!    count: an infrastructure error is never a workflow failure, and a run claimed late in an
//!    invocation is not a slow step; nor does a deferral (the step was not started, and a
//!    fresh invocation never defers a step it could give no more time: `crate::store::fit`);
//! 3. mark the steps left Running as interrupted (as `Engine::interrupt_running_steps` does),
//!    with this handback's mark in the step's debug messages ([`INTERRUPTION_KEY`]): `cutoff`
//!    for one the loop guard counts, another word for one it does not (so that later handbacks
//!    do not count it either). An interruption without the mark is the API's reaper's: the
//!    poison pill tells by it that a recovered run's dead holder had started a step
//!    ([`crate::poison::recovery`]). With no step Running (a deferral, a cut outside any step),
//!    record instead, in a debug message of one of the attempt's steps, when this invocation
//!    took the run up and that it begins to wait now ([`attempt_time::handback_mark`]), so that
//!    the run timeout counts what it executed here and not the time it waits Pending;
//! 4. write Pending, adding this invocation's time to the run's `duration_ms`.
//!
//! A step the execution left Running that cannot be marked interrupted keeps the run from
//! being written Pending (its replay would take the Running step for a finished one). When a
//! write cannot be made before the last write (the API keeps failing), the run is left Running
//! under a lease nobody refreshes: the API's reaper requeues it once the lease TTL has passed,
//! and fails it instead once it expired more times than its `max_retries`. The report says so
//! (`left_to_reaper`), and the poison-pill table is told to expect that recovery
//! ([`crate::poison::gate::PoisonGate::record`]), so that it does not count as a dead
//! invocation.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_store::entities::Run;
use ironflow_store::entities::{RunStatus, RunUpdate, Step, StepStatus, StepUpdate};
use ironflow_store::error::StoreError;
use ironflow_store::store::RunStore;
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use serde_json::json;
use tokio::time::Instant;
use tracing::{error, info, warn};
use uuid::Uuid;

use crate::attempt_time;
pub(crate) use crate::context::HandbackPolicy;
use crate::context::{Invocation, fail_or_leave_to_reaper};
use crate::report::{Fate, Outcome};
use crate::store::fault::ApiFault;
use crate::store::fit::Deferral;
use crate::store::scope::RunKey;
#[cfg(doc)]
use crate::store::scope::{CallScope, SLOW_ANSWER};

/// What one handback is given: the run, what stopped it, how long it executed here.
pub(crate) struct Handback<'a> {
    /// The run whose execution stopped.
    pub run: &'a Run,
    /// The key of the run whose lease is held (the run itself, or the root of its sub-workflow
    /// chain), for the execution's holding: the handback's calls are made for it, never for a
    /// later claim of the run by this invocation ([`crate::store::claim_log`]).
    pub key: RunKey,
    /// When this invocation took it up.
    pub claimed_at: DateTime<Utc>,
    /// How long it executed here.
    pub executed: Duration,
    /// Why it is handed back.
    pub why: Why,
    /// The API cost its execution time (faults, slow answers:
    /// [`CallScope::lost_time_to_api`]).
    pub lost_time: bool,
    /// No write past this: the invocation's last write, or sooner for a lease that expired.
    pub until: Instant,
}

/// Why a run is handed back.
#[derive(Debug, Clone)]
pub(crate) enum Why {
    /// It was still running at the cutoff.
    Cutoff,
    /// Its attempt ended on an API fault the retries could not overcome.
    ApiFault(ApiFault),
    /// Its lease expired without a confirmed refresh (the description).
    LeaseExpired(String),
    /// Its next step would not fit before the cutoff and was not created (cutoff-aware
    /// starts, [`crate::store::fit`]): never counted by the loop guard.
    Deferred(Deferral),
}

/// The key of the debug message that marks an interruption written by a handback
/// (`{"ironflow_lambda_interruption": "cutoff" | "api_fault" | "lease_expired" |
/// "short_cutoff" | "cutoff_after_progress" | "deferred" | "paused"}`): [`COUNTED_MARK`] for
/// one the loop guard counts; [`PAUSED_MARK`] is written after an operator's pause.
pub const INTERRUPTION_KEY: &str = "ironflow_lambda_interruption";

/// The interruption mark of a cutoff the loop guard counts.
pub const COUNTED_MARK: &str = "cutoff";

impl Why {
    /// The interruption mark of the steps this handback interrupts: [`COUNTED_MARK`] for a
    /// cutoff that counts for the loop guard (`counted`), `progressed` for one after a step
    /// completed in this invocation.
    fn mark(&self, counted: bool, progressed: bool) -> &'static str {
        match self {
            Self::Cutoff if counted => COUNTED_MARK,
            Self::Cutoff if progressed => "cutoff_after_progress",
            Self::Cutoff => "short_cutoff",
            Self::ApiFault(_) => "api_fault",
            Self::LeaseExpired(_) => "lease_expired",
            Self::Deferred(_) => "deferred",
        }
    }

    /// Whether this handback counts for the loop guard: a cutoff after an execution that lost
    /// no time to the API (`lost_time`) and executed at least [`HandbackPolicy::fair_share`].
    fn counts(&self, policy: &HandbackPolicy, executed: Duration, lost_time: bool) -> bool {
        matches!(self, Self::Cutoff) && !lost_time && executed >= policy.fair_share
    }

    /// Why, for the report's error (`None` at the cutoff: a clean handback).
    fn note(&self) -> Option<String> {
        match self {
            Self::Cutoff => None,
            Self::ApiFault(fault) => Some(format!("handed back after an API fault: {fault}")),
            Self::LeaseExpired(end) => Some(format!("{end}; confirmed again and handed back")),
            Self::Deferred(deferral) => Some(format!(
                "{deferral}: handed back to start it in the next invocation"
            )),
        }
    }
}

impl Invocation {
    /// Hand a run back (see the module docs), in its numbered steps, each write retried until
    /// `h.until`.
    pub(crate) async fn hand_back(&self, h: Handback<'_>) -> Fate {
        let (until, key) = (h.until, h.key.clone());
        self.calls
            .within(until, Some(key), self.hand_back_steps(&h))
            .await
    }

    async fn hand_back_steps(&self, h: &Handback<'_>) -> Fate {
        // 1. The lease.
        if let Err(fate) = self.confirm_lease(h.key.run_id).await {
            return not_confirmed(fate, &h.why);
        }
        // 2. The loop guard.
        let guarded = match self.guard(h).await {
            Ok(guarded) => guarded,
            Err(fate) => return fate,
        };
        // 3. The steps left Running, or when the run begins to wait.
        let mark = h.why.mark(guarded.counted, guarded.progressed);
        if let Err(e) = self.interrupt_running_steps(&guarded.steps, mark).await {
            return reaper(format!(
                "could not mark the running steps interrupted ({e})"
            ));
        }
        self.mark_the_wait(h.key.run_id, h.claimed_at, Utc::now(), h.until, &guarded)
            .await;
        // 4. Pending.
        self.write_pending(h, &guarded.run).await
    }

    /// Step 2: the loop guard, at a counted cutoff. The run whose lease is held and its
    /// steps, or the fate when it was failed instead (or its steps could not be read).
    async fn guard(&self, h: &Handback<'_>) -> Result<Guarded, Fate> {
        let (store, target) = (&self.calls.store, h.key.run_id);
        let run = if target == h.run.id {
            h.run.clone()
        } else {
            match store.get_run(target).await {
                Ok(Some(root)) => root,
                _ => h.run.clone(),
            }
        };
        let steps = match store.list_steps(target).await {
            Ok(steps) => steps,
            Err(e) => {
                return Err(reaper(format!(
                    "could not list the run's steps before handing it back ({e})"
                )));
            }
        };
        // A handback after a step completed here is not "without progress", now or later.
        let attempt = run.retry_count + 1;
        let progressed = progressed_since(attempt, &steps, h.claimed_at);
        let policy = &self.handback;
        let counted = h.why.counts(policy, h.executed, h.lost_time) && !progressed;
        let failed_instead = counted
            .then(|| loop_guard(policy, attempt, &steps, h.executed))
            .flatten();
        if let Some(reason) = failed_instead {
            error!(target_run_id = %target, error = %reason, "failing the run instead of handing it back");
            let calls = &self.calls;
            return Err(
                fail_or_leave_to_reaper(calls, target, Outcome::Failed, reason, false).await,
            );
        }
        Ok(Guarded {
            run,
            steps,
            counted,
            progressed,
        })
    }

    /// Step 4: write the run Pending, adding this invocation's time to its `duration_ms`.
    async fn write_pending(&self, h: &Handback<'_>, run: &Run) -> Fate {
        let executed_ms = u64::try_from(h.executed.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let update = RunUpdate {
            status: Some(RunStatus::Pending),
            duration_ms: Some(run.duration_ms.saturating_add(executed_ms)),
            ..RunUpdate::default()
        };
        let target = h.key.run_id;
        match self.calls.store.update_run(target, update).await {
            Ok(()) => {
                info!(target_run_id = %target, executed_ms, "run handed back: Pending for the next invocation");
                Fate::new(Outcome::HandedBack, h.why.note())
            }
            Err(StoreError::LeaseLost { .. }) => Fate::new(
                Outcome::LeaseLost,
                Some(
                    "the run left this worker while it was handed back: nothing more written"
                        .into(),
                ),
            ),
            Err(e) => reaper(format!("could not write the run back to Pending ({e})")),
        }
    }
}

/// What the loop guard let through to be handed back: the run whose lease is held, its steps,
/// whether this cutoff counts for the guard and whether a step completed here.
struct Guarded {
    run: Run,
    steps: Vec<Step>,
    counted: bool,
    progressed: bool,
}

/// Step 1 failed (`fate`): nothing is written. After an expired lease, the run is the
/// reaper's (or another worker's): the lease stays expired.
fn not_confirmed(mut fate: Fate, why: &Why) -> Fate {
    if let Why::LeaseExpired(end) = why {
        fate.outcome = match fate.outcome {
            Outcome::HandedBack => Outcome::LeaseLost,
            other => other,
        };
        fate.error = Some(format!("{end}; {}", fate.error.unwrap_or_default()));
    }
    fate
}

/// A handback that could not be written: the run is the reaper's.
fn reaper(what: String) -> Fate {
    let msg = format!(
        "{what}: left Running to the API's reaper, which requeues it once its lease expires \
         (or fails it once it expired more than max_retries times)"
    );
    error!("{msg}");
    Fate::left_to_reaper(Outcome::HandedBack, msg)
}

impl Invocation {
    /// Step 1 of a handback or release: confirm the lease is still this invocation's
    /// (`renew_lease`, retried within the caller's scope). `Err` with the fate when it is not:
    /// cancelled, someone else's, or unconfirmable (the API keeps failing: the reaper's).
    async fn confirm_lease(&self, run_id: Uuid) -> Result<(), Fate> {
        let calls = &self.calls;
        match calls.store.renew_lease(run_id, self.lease.clone()).await {
            Ok(_) => Ok(()),
            Err(StoreError::LeaseLost { held_by, .. }) => {
                let status = match calls.store.get_run(run_id).await {
                    Ok(Some(run)) => Some(run.status.state),
                    _ => None,
                };
                let fate = if status == Some(RunStatus::Paused) {
                    Fate::paused("its write back to Pending")
                } else if status == Some(RunStatus::Cancelled) {
                    Fate::new(
                        Outcome::Cancelled,
                        Some("run cancelled through the API: nothing written".into()),
                    )
                } else {
                    Fate::new(
                        Outcome::LeaseLost,
                        Some(format!(
                            "lease lost before the run's fate was written (held by {}): nothing \
                         written",
                            held_by.as_deref().unwrap_or("nobody")
                        )),
                    )
                };
                warn!(run_id = %run_id, error = fate.error.as_deref().unwrap_or(""), "not written back");
                Err(fate)
            }
            Err(e) => Err(reaper(format!("could not confirm the lease ({e})"))),
        }
    }

    /// Mark the Running steps among `steps` Failed with `STEP_INTERRUPTED_ERROR`, so that the
    /// replay executes them again, each write retried within the caller's scope, and with the
    /// interruption `mark` in their debug messages; ended now, or at the latest instant the
    /// steps of their attempt record if the API's clock runs ahead
    /// ([`attempt_time::not_before_recorded`]).
    async fn interrupt_running_steps(&self, steps: &[Step], mark: &str) -> Result<(), StoreError> {
        let now = Utc::now();
        for step in steps
            .iter()
            .filter(|s| s.status.state == StepStatus::Running)
        {
            // Never before an instant the API stamped on its attempt: the wait begins here.
            let attempt = steps.iter().filter(|s| s.attempt == step.attempt);
            let update = StepUpdate {
                status: Some(StepStatus::Failed),
                error: Some(STEP_INTERRUPTED_ERROR.to_string()),
                completed_at: Some(attempt_time::not_before_recorded(attempt, now)),
                debug_messages: Some(json!([{ INTERRUPTION_KEY: mark }])),
                ..StepUpdate::default()
            };
            self.calls.store.update_step(step.id, update).await?;
            info!(step = %step.name, position = step.position, "interrupted step will be executed again");
        }
        Ok(())
    }
}

impl Invocation {
    /// Step 3, with no step Running: record on one of the attempt's steps that the run executed
    /// from when this invocation took it up and begins to wait now
    /// ([`attempt_time::handback_mark`]). A write that fails is read back (the mark
    /// landed if a step carries it) and sent again, at most [`MARK_ATTEMPTS`] times in all; one
    /// that still fails costs only the run timeout's reading of this invocation and the wait
    /// after it (read as the stretch before them, docs/design.md): the handback goes on. It takes at most a third of the time left
    /// to the handback's last write, so that the Pending write keeps the rest; and it is not
    /// written when the run whose lease is held could not be read (its attempt is unknown).
    ///
    /// `target` is the run whose lease is held, `taken_up` when this invocation took it up, `at`
    /// when the run began to wait (or the latest instant its steps record, if later), `until`
    /// the handback's last write.
    async fn mark_the_wait(
        &self,
        target: Uuid,
        taken_up: DateTime<Utc>,
        at: DateTime<Utc>,
        until: Instant,
        guarded: &Guarded,
    ) {
        if guarded.run.id != target {
            return;
        }
        let share = until.saturating_duration_since(Instant::now()) / 3;
        if tokio::time::timeout(share, self.send_the_mark(target, taken_up, at, guarded))
            .await
            .is_err()
        {
            warn!(
                "no time left to record when the run began to wait: the run timeout reads this invocation and the wait after it as it reads the time before them (docs/design.md)"
            );
        }
    }

    /// [`Invocation::mark_the_wait`]'s writes and read-backs.
    async fn send_the_mark(
        &self,
        target: Uuid,
        taken_up: DateTime<Utc>,
        at: DateTime<Utc>,
        guarded: &Guarded,
    ) {
        let store = &self.calls.store;
        let attempt = guarded.run.retry_count.saturating_add(1);
        let Some(mut mark) = attempt_time::handback_mark(&guarded.steps, attempt, taken_up, at)
        else {
            return;
        };
        let mut error = None;
        for _ in 0..MARK_ATTEMPTS {
            let (step_id, messages, at) = mark;
            let update = StepUpdate {
                debug_messages: Some(messages),
                ..StepUpdate::default()
            };
            let Err(e) = store.update_step(step_id, update).await else {
                return;
            };
            error = Some(e);
            match store.list_steps(target).await {
                Ok(steps) if attempt_time::is_marked(&steps, attempt, at) => return,
                Ok(steps) => match attempt_time::handback_mark(&steps, attempt, taken_up, at) {
                    Some(again) => mark = again,
                    None => break,
                },
                Err(_) => break,
            }
        }
        let error = error.map(|e| e.to_string()).unwrap_or_default();
        warn!(
            error,
            "could not record when the run began to wait: the run timeout reads this invocation and the wait after it as it reads the time before them (docs/design.md)"
        );
    }
}

/// The interruption mark of the steps an execution left Running when an operator paused its
/// run ([`Invocation::mark_the_pause`]): never counted by the loop guard.
pub const PAUSED_MARK: &str = "paused";

impl Invocation {
    /// An operator paused the run whose lease was held (its `key`, for the execution's
    /// holding) while it executed here, taken up at `taken_up`: nothing of a handback is
    /// written but its step 3, so that the pause is a wait for the run timeout (docs/design.md,
    /// "The run timeout across invocations"). The API's pause interrupted the steps Running at that moment; the
    /// execution went on until it saw the pause, and may have started another step. Then, with
    /// the invocation's calls, until `until`:
    /// 1. read the run whose lease was held: if it is no longer Paused (resumed since: the
    ///    resume interrupts the steps left Running itself, and another worker may hold it now),
    ///    write nothing;
    /// 2. mark Failed with `STEP_INTERRUPTED_ERROR` (and [`PAUSED_MARK`]) the steps this
    ///    execution created or started and left Running (`ours`; never another's), so that the
    ///    resume executes them again and their interruption begins the wait;
    /// 3. with none Running, record that this invocation executed the run from its claim and
    ///    that it waits ([`Invocation::mark_the_wait`]): from the API's interruption of one of
    ///    its steps (or the latest instant its steps record after it), else from now.
    ///
    /// Called when the execution saw the pause, and when a handback or a failure's write met
    /// it first (and wrote nothing: [`Fate::paused`]). The lease is not confirmed: a paused run
    /// has no holder (step writes are not lease-checked). A write that fails costs only the run
    /// timeout's reading of the pause.
    pub(crate) async fn mark_the_pause(
        &self,
        key: RunKey,
        taken_up: DateTime<Utc>,
        until: Instant,
        ours: &[Uuid],
    ) {
        let (store, target) = (&self.calls.store, key.run_id);
        let write = async {
            // 1. Still paused.
            let run = match store.get_run(target).await {
                Ok(Some(run)) if run.status.state == RunStatus::Paused => run,
                _ => return,
            };
            let Ok(steps) = store.list_steps(target).await else {
                warn!("could not list the paused run's steps: the run timeout may count its pause");
                return;
            };
            // 2. Its steps left Running.
            let left: Vec<Step> = steps
                .iter()
                .filter(|s| s.status.state == StepStatus::Running && ours.contains(&s.id))
                .cloned()
                .collect();
            if let Err(e) = self.interrupt_running_steps(&left, PAUSED_MARK).await {
                warn!(error = %e, "could not mark the paused run's running steps interrupted: the run timeout may count its pause");
                return;
            }
            // 3. When it began to wait.
            if left.is_empty() {
                // The API's pause interrupted a step of ours (no handback's mark on it).
                let by_the_api = steps.iter().any(|s| {
                    ours.contains(&s.id)
                        && s.status.state == StepStatus::Failed
                        && s.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)
                        && interruption_mark(s).is_none()
                });
                let at = match by_the_api {
                    true => DateTime::<Utc>::MIN_UTC,
                    false => Utc::now(),
                };
                let guarded = Guarded {
                    run,
                    steps,
                    counted: false,
                    progressed: false,
                };
                self.mark_the_wait(target, taken_up, at, until, &guarded)
                    .await;
            }
        };
        self.calls.within(until, Some(key), write).await
    }
}

/// How many times a handback sends the mark of the run's wait at most
/// ([`Invocation::mark_the_wait`]).
const MARK_ATTEMPTS: usize = 3;

/// Why a run that did not execute was not written back to Pending.
#[derive(Debug)]
pub(crate) enum NotWrittenBack {
    /// The lease is someone else's, or the run left Running (paused, cancelled): nothing was
    /// written, the run is theirs. The fate to report.
    Gone(Fate),
    /// The API kept failing, or the time ran out: the run stays Running under a lease nobody
    /// refreshes, for the API's reaper (the sentence for the report).
    Reaper(String),
}

impl Invocation {
    /// Write a run that did not execute in this invocation back to Pending, with the invocation's
    /// calls, until its last write: a run claimed ahead that got no slot before the claim window closed
    /// ([`Outcome::Released`]), or a run of a blocked workflow in defer mode. As a handback does,
    /// it first confirms that the lease is still this invocation's, so it never takes back a run another
    /// worker took over, a user paused or cancelled (a cancelled run written Pending would also be
    /// an illegal transition). Nothing else is written: the run has no step to interrupt and no
    /// time to add to its `duration_ms`, and the loop guard does not count it.
    ///
    /// # Errors
    ///
    /// [`NotWrittenBack`], with what to report.
    pub(crate) async fn write_back_unexecuted(&self, run_id: Uuid) -> Result<(), NotWrittenBack> {
        let calls = &self.calls;
        let write = async {
            if let Err(fate) = self.confirm_lease(run_id).await {
                return Err(match fate.left_to_reaper {
                    true => NotWrittenBack::Reaper(fate.error.unwrap_or_default()),
                    false => NotWrittenBack::Gone(fate),
                });
            }
            let update = RunUpdate {
                status: Some(RunStatus::Pending),
                ..RunUpdate::default()
            };
            match calls.store.update_run(run_id, update).await {
                Ok(()) => Ok(()),
                Err(StoreError::LeaseLost { .. }) => Err(NotWrittenBack::Gone(Fate::new(
                    Outcome::LeaseLost,
                    Some(
                        "the run left this worker before it was written back: nothing written"
                            .into(),
                    ),
                ))),
                Err(e) => Err(NotWrittenBack::Reaper(
                    reaper(format!("writing it back to Pending failed ({e})"))
                        .error
                        .unwrap_or_default(),
                )),
            }
        };
        let until = self.budget.last_write();
        calls.within(until, Some(self.key(run_id)), write).await
    }
}

/// The interruption mark a handback wrote in `step`'s debug messages, if any.
pub(crate) fn interruption_mark(step: &Step) -> Option<&str> {
    step.debug_messages
        .as_ref()
        .and_then(|m| m.as_array())
        .and_then(|m| m.iter().find_map(|e| e.get(INTERRUPTION_KEY)?.as_str()))
}

/// Whether `step` was interrupted by a handback the loop guard counted ([`COUNTED_MARK`]): not
/// one marked otherwise (an API fault, an expired lease, a short cutoff, a cutoff after a step
/// completed), nor the API's reaper's (no mark): a dead holder's step ran for a time nobody
/// measured, and its death is the poison pill's to count ([`crate::poison::recovery`]).
fn counted_interruption(step: &Step) -> bool {
    interrupted(step) && interruption_mark(step) == Some(COUNTED_MARK)
}

/// Whether `step` was interrupted (by a handback, the reaper or the engine): it runs again.
fn interrupted(step: &Step) -> bool {
    step.status.state == StepStatus::Failed && step.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)
}

/// Whether `step` ended by itself (completed, failed, skipped): progress, for the loop guard.
fn finished(step: &Step) -> bool {
    step.status.state.is_terminal() && !interrupted(step)
}

/// Whether a step of `attempt` finished since `claimed_at`.
fn progressed_since(attempt: u32, steps: &[Step], claimed_at: DateTime<Utc>) -> bool {
    steps
        .iter()
        .filter(|s| s.attempt == attempt && finished(s))
        .any(|s| s.completed_at.is_some_and(|at| at >= claimed_at))
}

/// Why the run must be failed rather than handed back, if it must: called only for a counted
/// cutoff of an invocation in which no step completed ([`progressed_since`]).
fn loop_guard(
    policy: &HandbackPolicy,
    attempt: u32,
    steps: &[Step],
    executed: Duration,
) -> Option<String> {
    let steps: Vec<&Step> = steps.iter().filter(|s| s.attempt == attempt).collect();

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
        .filter(|s| counted_interruption(s))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn interrupted_step(mark: Option<&str>) -> serde_json::Value {
        let mut step = json!({
            "status": "failed",
            "error": STEP_INTERRUPTED_ERROR,
        });
        if let Some(m) = mark {
            step["debug_messages"] = json!([{ INTERRUPTION_KEY: m }]);
        }
        step
    }

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }

    /// A step `name` of attempt 1 in `status`, ended at `end` with `error` and `mark`.
    fn step(name: &str, status: &str, end: Option<i64>, mark: Option<&str>) -> Step {
        let mut step = json!({
            "id": Uuid::new_v4(), "trace_id": Uuid::new_v4(), "run_id": Uuid::nil(),
            "name": name, "kind": "shell", "position": 0,
            "status": {"state": status, "state_machine_id": Uuid::nil()}, "attempt": 1,
            "duration_ms": 0, "cost_usd": "0", "created_at": t(0), "updated_at": t(0),
            "started_at": t(0), "completed_at": end.map(t), "is_error_handler": false,
        });
        if status == "failed" {
            step["error"] = json!(STEP_INTERRUPTED_ERROR);
        }
        if let Some(m) = mark {
            step["debug_messages"] = json!([{ INTERRUPTION_KEY: m }]);
        }
        serde_json::from_value(step).unwrap_or_else(|e| panic!("a step: {e}"))
    }

    #[test]
    fn a_cutoff_after_progress_and_a_dead_holder_s_step_do_not_count_for_the_loop_guard() {
        let policy = HandbackPolicy {
            max_without_progress: 2,
            stall_window: Duration::from_secs(600),
            fair_share: Duration::from_secs(1),
        };
        // l1 completed at 10 s, l2 cut at 15 s in the same invocation, then the reaper
        // interrupted l2 after its next holder died, and l2 runs again now.
        let steps = vec![
            step("l1", "completed", Some(10), None),
            step("l2", "failed", Some(15), Some("cutoff_after_progress")),
            step("l2", "failed", Some(20), None),
            step("l2", "running", None, None),
        ];
        assert!(
            progressed_since(1, &steps, t(0)),
            "l1 completed after a claim at 0 s"
        );
        assert!(
            !progressed_since(1, &steps, t(16)),
            "nothing completed after 16 s"
        );
        assert!(
            !progressed_since(2, &steps, t(0)),
            "another attempt's steps"
        );
        assert_eq!(
            loop_guard(&policy, 1, &steps, Duration::from_secs(2)),
            None,
            "one counted cutoff, this one"
        );
        // Two cutoffs the guard counted in a row: the second fails the run.
        let counted = vec![
            step("l1", "completed", Some(10), None),
            step("l2", "failed", Some(20), Some(COUNTED_MARK)),
            step("l2", "running", None, None),
        ];
        assert!(
            loop_guard(&policy, 1, &counted, Duration::from_secs(2))
                .is_some_and(|e| e.contains("2 times in a row") && e.contains("'l2'"))
        );
    }

    #[test]
    fn only_interruptions_at_the_cutoff_count_for_the_loop_guard() {
        // The mark is the one `interrupt_running_steps` writes.
        let marked = interrupted_step(Some("api_fault"));
        assert!(marked["debug_messages"][0].get(INTERRUPTION_KEY).is_some());
        assert_eq!(Why::Cutoff.mark(true, false), COUNTED_MARK);
        assert_eq!(Why::Cutoff.mark(false, false), "short_cutoff");
        assert_eq!(Why::Cutoff.mark(false, true), "cutoff_after_progress");
        assert_eq!(
            Why::LeaseExpired(String::new()).mark(true, false),
            "lease_expired"
        );
        let policy = HandbackPolicy {
            max_without_progress: 3,
            stall_window: Duration::from_secs(10),
            fair_share: Duration::from_secs(10),
        };
        let (long, short) = (Duration::from_secs(10), Duration::from_secs(9));
        assert!(Why::Cutoff.counts(&policy, long, false));
        assert!(!Why::Cutoff.counts(&policy, short, false), "claimed late");
        assert!(
            !Why::Cutoff.counts(&policy, long, true),
            "lost time to the API"
        );
        assert!(!Why::LeaseExpired(String::new()).counts(&policy, long, false));
        let deferred = Why::Deferred(Deferral {
            step: "s".into(),
            expected: long,
            left: short,
        });
        assert!(
            !deferred.counts(&policy, long, false),
            "a deferral never counts"
        );
        assert_eq!(deferred.mark(false, false), "deferred");
        assert!(Why::Cutoff.note().is_none());
        let fault = ApiFault::timeout("PUT /runs/{id}", Duration::from_millis(5));
        assert!(Why::ApiFault(fault).note().unwrap().contains("API fault"));
    }
}
