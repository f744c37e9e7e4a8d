//! The scope of the store calls made by one piece of work: for which run, until when, and what
//! happens when the API keeps failing.
//!
//! A scope travels with the work as a task-local ([`CallScope::run`]): the engine calls its
//! store without knowing about invocations, and the store ([`super::GuardedStore`]) looks up
//! the scope of the task it is polled from. An execution runs in a scope that
//! [stops](OnFault::Stop) its run on an infrastructure fault the retries could not overcome:
//! the call never returns to the engine (which would record the run as Failed for good), the
//! scope records why, and the run's supervisor ([`crate::execution`]) hands the run back. The
//! invocation's own calls (claims, lease refreshes, handbacks) run in scopes that
//! [return](OnFault::Return) the error to them.
//!
//! Once its supervisor has taken the run's fate in hand, the execution's scope is
//! [fenced](CallScope::fence): every later call from it, such as a step that blocked its thread
//! through the cutoff and carries on afterwards, is held back and never reaches the API.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::report::{CHARS_PER_TOKEN, Due};
use ironflow_store::entities::{LeaseRequest, NewStep, RunStatus};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::claim_log::{Holding, WriteSent};
use super::fault::{ApiFault, FaultKind, FaultLog};
use super::fit::{Deferral, StartFit};
use crate::deadline::LeaseClock;
use crate::deadline::later;

tokio::task_local! {
    static SCOPE: Arc<CallScope>;
}

/// The cutoffs of the run executions in flight in this process, each counted once per
/// execution.
static IN_FLIGHT: Mutex<std::collections::BTreeMap<Instant, usize>> =
    Mutex::new(std::collections::BTreeMap::new());

/// One run execution in flight until its cutoff, registered for the tasks the engine spawns
/// outside the execution's scope ([`CallScope::execution_cutoff`]); unregistered on drop.
#[derive(Debug)]
pub(crate) struct InFlight(Instant);

impl InFlight {
    /// Register an execution bound by `cutoff`.
    pub(crate) fn enter(cutoff: Instant) -> Self {
        *Self::cutoffs().entry(cutoff).or_default() += 1;
        Self(cutoff)
    }

    fn cutoffs() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<Instant, usize>> {
        // Every update is one insert, increment or removal: a panic cannot leave it half-done.
        IN_FLIGHT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The earliest cutoff of the executions in flight, if any.
    fn earliest() -> Option<Instant> {
        Self::cutoffs().keys().next().copied()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut cutoffs = Self::cutoffs();
        if let Some(n) = cutoffs.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                cutoffs.remove(&self.0);
            }
        }
    }
}

/// An answer that took at least this long, 1 s, cost its work time the API owes it: a healthy
/// API answers in milliseconds (see [`CallScope::lost_time_to_api`]).
pub const SLOW_ANSWER: Duration = Duration::from_secs(1);

/// Bound of a call made outside any scope (a tool or test calling the store directly): 30 s,
/// the HTTP client's own timeout.
pub const UNSCOPED_BOUND: Duration = Duration::from_secs(30);

/// What a call does when the API keeps failing until the scope's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFault {
    /// Record why, wake the supervisor ([`CallScope::stopped`]) and never return: the work
    /// (an execution) is stopped from outside and its run handed back.
    Stop,
    /// Return the error to the caller (the invocation's own calls).
    Return,
}

/// Why a [`OnFault::Stop`] scope stopped its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeStop {
    /// The API kept failing: the last fault.
    Fault(ApiFault),
    /// A write's read-back found the run no longer Running under this worker's lease (another
    /// worker took it, an operator cancelled or paused it).
    RunLeft {
        /// The run's status as read back.
        status: RunStatus,
        /// Who holds its lease now, if anyone.
        held_by: Option<String>,
    },
    /// The step about to be created would not fit before the cutoff, yet would in the next
    /// invocation ([`CallScope::may_start`]): the run is handed back, the step not created.
    Deferred(Deferral),
    /// The invocation claimed the run again ([`CallScope::claimed_again`]): a write giving it up
    /// landed though its answer was lost. The later claim's execution writes its fate.
    ClaimedAgain,
}

/// The run a scope's calls are about, and the lease they run under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKey {
    /// The run.
    pub run_id: Uuid,
    /// The worker id its lease is held under.
    pub worker_id: String,
    /// The run's `lease_recoveries` when this invocation claimed it, for an execution's key
    /// (carried in the holder's mark, [`crate::store::holder`]); `None` for other calls.
    pub claimed_recoveries: Option<u32>,
    /// The invocation's holding of the run these calls are made for: once the invocation
    /// claimed the run again, they are not sent ([`CallScope::claimed_again`]). `None`: a key
    /// outside an invocation's claims (the lease refresher's, a test's).
    pub holding: Option<Holding>,
}

impl RunKey {
    /// The key of `run_id` under `lease` (its worker id): every key of a claimed run is built
    /// here ([`crate::context::Invocation::key`], the lease's renewals).
    pub fn new(run_id: Uuid, lease: &LeaseRequest) -> Self {
        Self {
            run_id,
            worker_id: lease.worker_id.clone(),
            claimed_recoveries: None,
            holding: None,
        }
    }

    /// This key, for the calls of `holding`.
    pub fn held(self, holding: Holding) -> Self {
        Self {
            holding: Some(holding),
            ..self
        }
    }

    /// The key of a new run claimed once in `log` under worker `w`, for its holding (tests).
    #[cfg(test)]
    pub fn claimed_in(log: &Arc<super::claim_log::ClaimLog>) -> Self {
        let run_id = Uuid::now_v7();
        log.claimed(run_id);
        Self {
            run_id,
            worker_id: "w".into(),
            claimed_recoveries: None,
            holding: Some(log.holding()),
        }
    }

    /// This key, for the execution of a run claimed with `recoveries` lease recoveries.
    pub fn executing(self, recoveries: u32) -> Self {
        Self {
            claimed_recoveries: Some(recoveries),
            ..self
        }
    }
}

/// The scope of a piece of work's store calls (see the module docs).
#[derive(Debug)]
pub struct CallScope {
    run: Option<RunKey>,
    until: Instant,
    lease: Option<Arc<LeaseClock>>,
    start_margin: Duration,
    /// Cutoff-aware starts ([`StartFit`]); `None`: every step starts.
    fit: Option<StartFit>,
    on_fault: OnFault,
    faults: Arc<FaultLog>,
    fenced: AtomicBool,
    saw_fault: AtomicBool,
    /// Time spent waiting on answers that took [`SLOW_ANSWER`] or longer, and on lease
    /// refreshes before a step could start, in milliseconds.
    slow_ms: AtomicU64,
    stop: CancellationToken,
    stopped: Mutex<Option<ScopeStop>>,
    /// Steps this scope's calls have read or created (a lost creation's read-back tells its
    /// step from older ones by this).
    seen_steps: Mutex<HashSet<Uuid>>,
    /// Statuses this scope's calls wrote (or are writing) to its own run.
    statuses_written: Mutex<Vec<RunStatus>>,
    /// When its own run becomes claimable again, as its last landed write left it (a retry's
    /// backoff, a sleep's wake time).
    due: Mutex<Option<Due>>,
    /// A landed write of this scope released its own run's lease ([`CallScope::lease_moved`]).
    lease_released: AtomicBool,
    /// The API refused this scope's last status write to its own run
    /// ([`CallScope::status_refused`]).
    status_refused: AtomicBool,
    /// Another run a write of this scope gave a lease to, before the request left
    /// ([`CallScope::lease_sent_to`]), and the holding of it that began then.
    lease_set_on: Mutex<Option<(Uuid, Option<Holding>)>>,
    /// Model calls of this scope's work dropped before their answer ([`ModelCall`]).
    calls_cut: AtomicU32,
    /// Their estimated input tokens.
    estimated_input_tokens: AtomicU64,
}

impl CallScope {
    /// A scope whose calls give up at `until` and return their errors, counting faults in
    /// `faults`.
    pub fn returning(until: Instant, faults: Arc<FaultLog>) -> Self {
        Self {
            run: None,
            until,
            lease: None,
            start_margin: Duration::ZERO,
            fit: None,
            on_fault: OnFault::Return,
            faults,
            fenced: AtomicBool::new(false),
            saw_fault: AtomicBool::new(false),
            slow_ms: AtomicU64::new(0),
            stop: CancellationToken::new(),
            stopped: Mutex::new(None),
            seen_steps: Mutex::new(HashSet::new()),
            statuses_written: Mutex::new(Vec::new()),
            due: Mutex::new(None),
            lease_released: AtomicBool::new(false),
            status_refused: AtomicBool::new(false),
            lease_set_on: Mutex::new(None),
            calls_cut: AtomicU32::new(0),
            estimated_input_tokens: AtomicU64::new(0),
        }
    }

    /// The scope of one execution: calls about `run` stop at `until` (the cutoff) or when
    /// `lease` stops being valid, whichever comes first, and an unrecoverable fault stops the
    /// execution ([`OnFault::Stop`]).
    pub fn execution(
        run: RunKey,
        until: Instant,
        lease: Arc<LeaseClock>,
        faults: Arc<FaultLog>,
    ) -> Self {
        Self {
            run: Some(run),
            lease: Some(lease),
            on_fault: OnFault::Stop,
            ..Self::returning(until, faults)
        }
    }

    /// This scope about `run` (whose writes are read back against it).
    pub fn with_run(mut self, run: RunKey) -> Self {
        self.run = Some(run);
        self
    }

    /// `work`, polled inside this scope. A plain function returning the task-local future, not
    /// an `async fn` awaiting it, so that `work` is held once, not twice (as the argument and
    /// inside the awaited future): a run's work is large and its future is moved whole as it
    /// is spawned.
    pub fn run<F: Future>(self: Arc<Self>, work: F) -> impl Future<Output = F::Output> {
        SCOPE.scope(self, work)
    }

    /// The scope of the task being polled, or a returning one bounded by [`UNSCOPED_BOUND`]
    /// outside any.
    pub fn current() -> Arc<Self> {
        SCOPE.try_with(Arc::clone).unwrap_or_else(|_| {
            let until = later(Instant::now(), UNSCOPED_BOUND);
            Arc::new(Self::returning(until, Arc::default()))
        })
    }

    /// The cutoff of the run execution whose task is being polled (the bound its scope was made
    /// with): an agent provider bounds its model calls by it ([`crate::agents`]). Not the
    /// lease's validity: a refresher extends that in the background. A task the engine spawns
    /// outside the scope (the branches of `ctx.parallel`) gets the earliest cutoff of the
    /// executions in flight in the process ([`InFlight`]): its own with one invocation per
    /// process (Lambda's on-demand), an earlier one at worst with several. `None` when no
    /// execution is in flight.
    pub(crate) fn execution_cutoff() -> Option<Instant> {
        SCOPE
            .try_with(|scope| scope.run.is_some().then_some(scope.until))
            .ok()
            .flatten()
            .or_else(InFlight::earliest)
    }

    /// The run this scope's calls are about.
    pub fn run_key(&self) -> Option<&RunKey> {
        self.run.as_ref()
    }

    /// Whether the invocation claimed this scope's run again since the holding its calls are
    /// made for began ([`crate::store::claim_log`]): the run is the later claim's, and no call
    /// of this scope may act on it.
    pub fn claimed_again(&self) -> bool {
        self.run
            .as_ref()
            .is_some_and(|k| k.holding.as_ref().is_some_and(|h| h.superseded(k.run_id)))
    }

    /// What a call does once the API kept failing.
    pub fn on_fault(&self) -> OnFault {
        self.on_fault
    }

    /// No call of this scope is attempted, nor retried, past this: the scope's bound or the
    /// end of its lease's validity, whichever comes first.
    pub fn end(&self) -> Instant {
        match &self.lease {
            Some(lease) => self.until.min(lease.valid_until()),
            None => self.until,
        }
    }

    /// Steps of this scope start only with `margin` of its lease left (zero by default).
    pub fn with_start_margin(mut self, margin: Duration) -> Self {
        self.start_margin = margin;
        self
    }

    /// Steps of this scope start only if they fit before its bound (the cutoff), by `fit`.
    pub fn with_fit(mut self, fit: StartFit) -> Self {
        self.fit = Some(fit);
        self
    }

    /// The cutoff-aware start rule of this scope, if any.
    pub fn fit(&self) -> Option<&StartFit> {
        self.fit.as_ref()
    }

    /// Called before `step` is created: when it works in the invocation ([`super::fit::works`])
    /// and would not fit before this scope's bound (an execution's cutoff) but would in the
    /// next invocation ([`StartFit::defer`]), the scope stops ([`ScopeStop::Deferred`]) and this
    /// never returns: no step record is left for a step that never started, and the
    /// supervisor hands the run back. Returns at once otherwise, and in a scope without the
    /// rule.
    pub async fn may_start(&self, step: &NewStep) {
        let Some(fit) = &self.fit else {
            return;
        };
        if !super::fit::works(&step.kind, step.is_error_handler) {
            return;
        }
        let left = self.until.saturating_duration_since(Instant::now());
        if let Some(deferral) = fit.defer(&step.name, left) {
            self.stop(ScopeStop::Deferred(deferral));
            std::future::pending::<()>().await;
        }
    }

    /// Until when the lease this scope runs under is valid, as far as this worker knows, and
    /// how much of it a step needs left to start (`None`: the scope has no lease).
    pub fn step_start(&self) -> Option<(Instant, Duration)> {
        self.lease
            .as_ref()
            .map(|lease| (lease.valid_until(), self.start_margin))
    }

    /// Wait until this scope's lease (an execution's) has its step start margin left (a
    /// refresh confirmed it further). Once the lease has run out, the step never starts: the
    /// scope stops (as a call does at the scope's end) and the supervisor hands the run back or
    /// leaves it to the reaper. No wait without a lease.
    pub async fn start_margin_left(&self) {
        /// How often the lease's validity is looked at again while it is short.
        const RECHECK: Duration = Duration::from_millis(20);
        let (began, mut held_back) = (Instant::now(), false);
        loop {
            let Some((valid_until, margin)) = self.step_start() else {
                return;
            };
            let left = valid_until.saturating_duration_since(Instant::now());
            if left >= margin {
                if held_back {
                    // Held back until the API confirmed a refresh: time lost to the API.
                    let ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
                    self.slow_ms.fetch_add(ms.max(1), Ordering::Relaxed);
                }
                return;
            }
            if left.is_zero() {
                self.stop(ScopeStop::Fault(ApiFault {
                    route: "POST /steps",
                    kind: FaultKind::Timeout,
                    detail: "the lease ran out before the step could start (no refresh \
                             confirmed it in time)"
                        .into(),
                }));
                std::future::pending::<()>().await;
            }
            held_back = true;
            tokio::time::sleep(RECHECK.min(left)).await;
        }
    }

    /// Count `fault` (in the invocation's log) and remember that this scope met one.
    pub fn record(&self, fault: &ApiFault) {
        self.saw_fault.store(true, Ordering::Relaxed);
        self.faults.record(fault);
    }

    /// Whether any call of this scope met an infrastructure fault (retried or not).
    pub fn saw_fault(&self) -> bool {
        self.saw_fault.load(Ordering::Relaxed)
    }

    /// A call of this scope was answered (with a result or the API's own refusal) `took` after
    /// its attempt was sent: counted as time lost to the API when it is [`SLOW_ANSWER`] or more.
    pub fn answered(&self, took: Duration) {
        if took >= SLOW_ANSWER {
            let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
            self.slow_ms.fetch_add(ms, Ordering::Relaxed);
        }
    }

    /// Whether the API cost this scope's work time: a call met an infrastructure fault (every
    /// attempt is one request, so a retry is always seen), an answer took [`SLOW_ANSWER`] or
    /// more, or a step was held back until a lease refresh was confirmed
    /// ([`CallScope::start_margin_left`]). The loop guard does not count a handback whose execution lost time so
    /// ([`crate::handback`]).
    pub fn lost_time_to_api(&self) -> bool {
        self.saw_fault() || self.slow_ms.load(Ordering::Relaxed) > 0
    }

    /// Milliseconds spent waiting on answers that took [`SLOW_ANSWER`] or more.
    pub fn slow_answer_ms(&self) -> u64 {
        self.slow_ms.load(Ordering::Relaxed)
    }

    /// Count in this scope the time `other` (a read made for this scope's work in a scope of
    /// its own, such as a run's steps read while it waited for a slot) lost to the API.
    pub fn absorb_lost_time(&self, other: &CallScope) {
        if other.saw_fault() {
            self.saw_fault.store(true, Ordering::Relaxed);
        }
        self.slow_ms
            .fetch_add(other.slow_answer_ms(), Ordering::Relaxed);
    }

    /// Remember steps a call of this scope read or created.
    pub fn saw_steps(&self, ids: impl IntoIterator<Item = Uuid>) {
        self.seen_steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(ids);
    }

    /// Whether a call of this scope read or created step `id`.
    pub fn has_seen_step(&self, id: Uuid) -> bool {
        self.seen_steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&id)
    }

    /// A call of this scope is about to write `status` to run `run_id`: remembered if that is
    /// the scope's own run, before the request leaves (the lease refresher may see the status
    /// before the write's answer arrives).
    pub fn writing_status(&self, run_id: Uuid, status: RunStatus) {
        if self.run.as_ref().is_some_and(|k| k.run_id == run_id) {
            self.statuses_written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(status);
        }
    }

    /// Whether a call of this scope wrote (or was writing) `status` to the scope's run: a run
    /// found in that status left Running by this execution's own hand, not someone else's.
    pub fn wrote_status(&self, status: RunStatus) -> bool {
        self.statuses_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&status)
    }

    /// A write of this scope to run `run_id` landed with `status` and `scheduled_at`: the
    /// scope's own run is due then if the status is Retrying or Sleeping, and due no more
    /// otherwise.
    pub fn wrote_due(
        &self,
        run_id: Uuid,
        status: RunStatus,
        scheduled_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        if self.run.as_ref().is_some_and(|k| k.run_id == run_id) {
            self.status_refused.store(false, Ordering::SeqCst);
            let due = match (status, scheduled_at) {
                (RunStatus::Retrying | RunStatus::Sleeping, Some(at)) => Some(Due { status, at }),
                _ => None,
            };
            *self
                .due
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = due;
        }
    }

    /// The API refused (answered, not failed) a write of a status to run `run_id`:
    /// remembered if that is the scope's own run, until a later status write of it lands.
    pub fn refused_status(&self, run_id: Uuid) {
        if self.run.as_ref().is_some_and(|k| k.run_id == run_id) {
            self.status_refused.store(true, Ordering::SeqCst);
        }
    }

    /// Whether the API refused this scope's last status write to its own run: the run kept
    /// the status it had (Running, under this execution's lease), whatever the engine
    /// reported.
    pub fn status_refused(&self) -> bool {
        self.status_refused.load(Ordering::SeqCst)
    }

    /// When the scope's run becomes claimable again, if its last landed status write left it
    /// waiting for a known time.
    pub fn due(&self) -> Option<Due> {
        *self
            .due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A write of this scope that released run `run_id`'s lease landed: remembered if that is
    /// the scope's own run.
    pub fn released_lease(&self, run_id: Uuid) {
        if self.run.as_ref().is_some_and(|k| k.run_id == run_id) {
            self.lease_released.store(true, Ordering::SeqCst);
        }
    }

    /// A call of this scope is about to give run `run_id` a lease: remembered if that is not
    /// the scope's own run (ironflow-engine's `resume_chain` moving a sub-workflow child's
    /// lease to its root), before the request leaves: once sent, the root may hold the lease
    /// whatever the answer.
    pub fn setting_lease(&self, run_id: Uuid) {
        if self.run.as_ref().is_some_and(|k| k.run_id != run_id) {
            *self
                .lease_set_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((run_id, self.claims_now()));
        }
    }

    /// Whether a call of this scope sent run `run_id` (not its own) a lease
    /// ([`CallScope::setting_lease`]): the run may hold this execution's lease.
    pub fn lease_sent_to(&self, run_id: Uuid) -> bool {
        self.lease_set_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|(id, _)| *id == run_id)
    }

    /// The holding the calls about `run_id` are made for: of the chain's root this scope sent
    /// its lease to, the one that began then ([`CallScope::setting_lease`]); of any other run,
    /// the scope's own.
    pub fn holding_of(&self, run_id: Uuid) -> Option<Holding> {
        let set_on = self
            .lease_set_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match set_on.as_ref() {
            Some((id, holding)) if *id == run_id => holding.clone(),
            _ => self.holding().cloned(),
        }
    }

    /// The scope's holding as of now ([`Holding::now`]), if its calls are made for one: from
    /// here, a claim of any run is a later one.
    pub fn claims_now(&self) -> Option<Holding> {
        self.holding().map(Holding::now)
    }

    /// A write of this scope sent now, for its read-backs ([`Holding::write_sent`]), if its
    /// calls are made for a holding.
    pub fn write_sent(&self) -> Option<WriteSent> {
        self.holding().map(Holding::write_sent)
    }

    fn holding(&self) -> Option<&Holding> {
        self.run.as_ref()?.holding.as_ref()
    }

    /// Whether this execution released its own run's lease, which for a sub-workflow child
    /// means it moved the lease to the chain's root: ironflow-engine's `resume_chain` releases
    /// the child's lease only after its root took it, in the update that moved the root to
    /// Running. From then on the root's lease is the one this execution holds.
    pub fn lease_moved(&self) -> bool {
        self.lease_released.load(Ordering::SeqCst)
    }

    /// Whether a call of this scope wrote (or was writing) any status other than Running to the
    /// scope's run.
    pub fn left_running_itself(&self) -> bool {
        self.statuses_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|s| *s != RunStatus::Running)
    }

    /// Model calls of this scope's work that were sent and dropped before their answer (cut at
    /// the cutoff, or with the execution), and their input tokens as estimated from the requests'
    /// size ([`ModelCall`]).
    pub fn calls_cut(&self) -> (u32, u64) {
        (
            self.calls_cut.load(Ordering::Relaxed),
            self.estimated_input_tokens.load(Ordering::Relaxed),
        )
    }

    /// Hold back every later call of this scope (it never reaches the API).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    /// Whether [`CallScope::fence`] was called.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Stop this scope's work for `why` (the first reason is kept).
    pub fn stop(&self, why: ScopeStop) {
        let mut stopped = self
            .stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stopped.is_none() {
            *stopped = Some(why);
        }
        self.stop.cancel();
    }

    /// Why the work was stopped, once it was.
    pub fn stop_reason(&self) -> Option<ScopeStop> {
        self.stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Resolves once a call stopped the work ([`OnFault::Stop`]), or, for such a scope, once
    /// the invocation claimed its run again ([`ScopeStop::ClaimedAgain`]: an execution still
    /// running a step when an operator paused and resumed its run and the claim loop took it
    /// again, its lease renewals answered for the later claim's); never otherwise.
    pub async fn stopped(&self) -> ScopeStop {
        let claimed_again = self
            .run
            .as_ref()
            .filter(|_| self.on_fault == OnFault::Stop)
            .and_then(|k| k.holding.as_ref().map(|h| h.ended(k.run_id)));
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = cancelled(claimed_again) => self.stop(ScopeStop::ClaimedAgain),
        }
        self.stop_reason()
            .unwrap_or_else(|| ScopeStop::Fault(ApiFault::timeout("(unknown)", Duration::ZERO)))
    }
}

/// Until `token` is cancelled; forever without one.
async fn cancelled(token: Option<CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

/// A model call in flight, from just before its request leaves until its answer (an error
/// answer included) arrives: dropped without [`ModelCall::answered`] (its future was dropped at
/// the cutoff, or with the execution's task), it counts as cut in the execution scope it was
/// started in, with its input tokens estimated from `request_chars` at
/// [`CHARS_PER_TOKEN`] characters a token, and is logged. A call made outside an execution
/// scope (a branch of `ctx.parallel`, which the engine spawns as a task of its own) is logged
/// only.
#[derive(Debug)]
pub(crate) struct ModelCall {
    scope: Option<Arc<CallScope>>,
    estimated_input_tokens: u64,
    answered: bool,
}

impl ModelCall {
    /// A call whose request holds `request_chars` characters of text, about to be sent.
    pub(crate) fn start(request_chars: u64) -> Self {
        let scope = SCOPE
            .try_with(Arc::clone)
            .ok()
            .filter(|scope| scope.run.is_some());
        Self {
            scope,
            estimated_input_tokens: request_chars.div_ceil(CHARS_PER_TOKEN),
            answered: false,
        }
    }

    /// The call was answered.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for ModelCall {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        tracing::warn!(
            estimated_input_tokens = self.estimated_input_tokens,
            counted = self.scope.is_some(),
            "model call cut before its answer: its usage is unknown (input tokens estimated from \
             the request size)"
        );
        if let Some(scope) = &self.scope {
            scope.calls_cut.fetch_add(1, Ordering::Relaxed);
            scope
                .estimated_input_tokens
                .fetch_add(self.estimated_input_tokens, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_spawned_outside_the_execution_gets_the_earliest_cutoff_in_flight() {
        let outside = || async { tokio::spawn(async { CallScope::execution_cutoff() }).await };
        let now = Instant::now();
        let (early, late) = (
            later(now, Duration::from_secs(1)),
            later(now, Duration::from_secs(9)),
        );
        let first = InFlight::enter(late);
        let second = InFlight::enter(early);
        let also_early = InFlight::enter(early);
        assert_eq!(outside().await.ok().flatten(), Some(early));
        drop(second);
        assert_eq!(
            outside().await.ok().flatten(),
            Some(early),
            "one left at it"
        );
        drop(also_early);
        assert_eq!(outside().await.ok().flatten(), Some(late));
        drop(first);
        assert_eq!(outside().await.ok().flatten(), None);
    }

    #[tokio::test]
    async fn the_scope_travels_with_the_task_and_a_default_applies_outside() {
        let until = later(Instant::now(), Duration::from_secs(5));
        let scope = Arc::new(CallScope::returning(until, Arc::default()));
        let seen = scope
            .clone()
            .run(async { CallScope::current().end() })
            .await;
        assert_eq!(seen, until);
        let outside = CallScope::current();
        assert_eq!(outside.on_fault(), OnFault::Return);
        assert!(outside.end() > Instant::now() + Duration::from_secs(20));
    }

    #[tokio::test]
    async fn an_execution_scope_stops_when_the_invocation_claims_its_run_again() {
        use crate::store::claim_log::ClaimLog;

        let log = Arc::new(ClaimLog::default());
        let key = RunKey::claimed_in(&log);
        let run_id = key.run_id;
        let now = Instant::now();
        let lease = Arc::new(LeaseClock::new(now, Duration::from_secs(30)));
        let until = later(now, Duration::from_secs(60));
        let execution = Arc::new(CallScope::execution(
            key.clone(),
            until,
            lease,
            Arc::default(),
        ));
        let returning = CallScope::returning(until, Arc::default()).with_run(key);
        let stopped = tokio::spawn({
            let execution = execution.clone();
            async move { execution.stopped().await }
        });
        tokio::task::yield_now().await;
        assert!(!stopped.is_finished() && !execution.claimed_again());

        log.claimed(run_id);
        assert_eq!(stopped.await.ok(), Some(ScopeStop::ClaimedAgain));
        assert!(execution.claimed_again() && returning.claimed_again());
        let returned = tokio::time::timeout(Duration::from_millis(50), returning.stopped()).await;
        assert!(returned.is_err(), "a returning scope's work is not stopped");
    }

    #[tokio::test]
    async fn the_lease_bounds_an_execution_scope_and_the_first_stop_is_kept() {
        let now = Instant::now();
        let lease = Arc::new(LeaseClock::new(now, Duration::from_secs(1)));
        let key = RunKey {
            run_id: Uuid::nil(),
            worker_id: "w".into(),
            claimed_recoveries: None,
            holding: None,
        };
        let scope = CallScope::execution(
            key,
            later(now, Duration::from_secs(60)),
            lease,
            Arc::default(),
        );
        assert_eq!(scope.end(), now + Duration::from_secs(1));
        let first = ScopeStop::RunLeft {
            status: RunStatus::Cancelled,
            held_by: None,
        };
        scope.stop(first.clone());
        scope.stop(ScopeStop::Fault(ApiFault::timeout("x", Duration::ZERO)));
        assert_eq!(scope.stopped().await, first);
    }
}
