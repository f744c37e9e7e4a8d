//! The poison-pill table as one invocation sees it.
//!
//! Each workflow's counter is read at most once per invocation and cached (in defer mode, the
//! counters of every registered workflow in one batch read before the first claim); a success
//! writes only when a counter exists; failures update the cache with the count the table
//! returns, so later claims of the same invocation see it. The cache is the process's
//! ([`super::seen`]): invocations in flight at once in one process see each other's writes. A run claimed with
//! `lease_recoveries > 0` costs one conditional write (and a failure write when the count is
//! new); a run with `lease_recoveries == 0` costs nothing.
//!
//! Every table error fails open: the run executes, an error log names the table and the AWS
//! error, and [`PoisonGate::table_errors`] counts it (the invocation summary's
//! `poison_table_errors`, the hook for a metric). After [`MAX_TABLE_ERRORS`] errors, the first
//! call unanswered within [`CALL_BUDGET`], or [`SLOW_BUDGET`] spent on slow answers, the gate
//! stops calling the table for the rest of the invocation (its breaker opens), so a table that
//! is unreachable, hangs or crawls costs an invocation about a second, not seconds per run.
//!
//! An expected recovery ([`PoisonGate::expect_recovery`]) is kept in the process
//! ([`super::seen`]) before it is written, and stays there until a write lands: the gate's
//! next use in this process (this invocation's next settle or recovered claim, its end, or the
//! next invocation's, the warm process usually serving it) writes the ones a table error left
//! unwritten, and a claim of such a run by this process does not count its recovery.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_store::entities::{Run, Step, WorkerCapabilities};
use tokio::time::{Instant, timeout_at};
use tracing::{error, info, warn};

use super::recovery::dead_holder_step;
use super::seen::{Expected, SeenCounters};
use super::{FailureCounter, PoisonError, PoisonMode, PoisonPolicy, PoisonTable, now_ms};
use crate::report::{Outcome, RunReport};
use crate::store::holder::{holder, holder_claimed_recoveries};

/// Table errors after which an invocation stops calling the table (fails open for the rest of
/// it): 3.
pub const MAX_TABLE_ERRORS: u32 = 3;

/// The longest one gate call waits for the table: 1 s (less when the invocation's last write
/// comes first). Every gate call sits on the claim loop's path (a run's start waits for its
/// workflow's read, a settle for its write, a recovered claim for its note), so this, not the
/// SDK's 5 s operation timeout, is what a hanging table costs a healthy workflow. DynamoDB
/// answers in milliseconds in-region (tens with a new TLS connection); 1 s also leaves room for
/// the SDK's retry of one transient error (its jittered backoff is at most 1 s, usually much
/// less). A call cut there fails open, and the gate's breaker opens for the rest of the
/// invocation: one such wait per invocation at most.
pub const CALL_BUDGET: Duration = Duration::from_secs(1);

/// An answer slower than this (100 ms, ten times DynamoDB's usual in-region latency) is
/// *slow*: used, but its wait counts toward [`SLOW_BUDGET`].
pub const SLOW_CALL: Duration = Duration::from_millis(100);

/// Time one invocation's gate may spend waiting on slow answers ([`SLOW_CALL`]) before its
/// breaker opens: 2 s. With [`CALL_BUDGET`], a table that answers every call slowly costs an
/// invocation at most 3 s in all (healthy answers, under 100 ms, never count).
pub const SLOW_BUDGET: Duration = Duration::from_secs(2);

/// Unwritten expected recoveries one gate call writes at most (the rest wait for the next
/// call): 8, so that a backlog of them delays no claim by more than a few writes.
const EXPECTED_WRITES_PER_USE: usize = 8;

/// The poison-pill table as seen by one invocation: each workflow's counter is read at most
/// once, and a success writes only when a counter exists.
pub struct PoisonGate {
    table: Arc<dyn PoisonTable>,
    policy: PoisonPolicy,
    mode: PoisonMode,
    /// The counters this process knows (shared with its other invocations).
    seen: Arc<SeenCounters>,
    /// The workflows whose counter this invocation has read (at most once each).
    read: HashSet<String>,
    errors: u32,
    /// A call went unanswered within its budget (the breaker is open).
    timed_out: bool,
    /// Time spent on slow answers ([`SLOW_CALL`]) in this invocation.
    slow: Duration,
    /// New lease recoveries seen at claim.
    lease_recoveries: u32,
    /// No table call past this (the invocation's last write).
    until: Instant,
    /// The invocation's worker id: the failure id of the lease recoveries it sees.
    invocation: String,
}

impl PoisonGate {
    /// A gate over `table` for one invocation, whose table calls end by `until` (a call still
    /// unanswered then fails open). `mode` is the effective mode: the builder turns `defer`
    /// into `fail` when claims cannot filter by workflow.
    pub fn new(
        table: Arc<dyn PoisonTable>,
        policy: PoisonPolicy,
        mode: PoisonMode,
        until: Instant,
        invocation: &str,
    ) -> Self {
        Self {
            table,
            policy,
            mode,
            seen: Arc::default(),
            read: HashSet::new(),
            errors: 0,
            timed_out: false,
            slow: Duration::ZERO,
            lease_recoveries: 0,
            until,
            invocation: invocation.to_string(),
        }
    }

    /// Share the counters with the other invocations of this process (`seen` is the worker's);
    /// without it the gate keeps its own.
    pub fn sharing(mut self, seen: Arc<SeenCounters>) -> Self {
        self.seen = seen;
        self
    }

    /// Claimed runs whose lease recovery was new (each counted as a failure of its workflow):
    /// the summary's `lease_recoveries`.
    pub fn lease_recoveries(&self) -> u32 {
        self.lease_recoveries
    }

    /// `call`, bounded by [`CALL_BUDGET`] and the gate's `until`. An answer later than that is
    /// an error and opens the breaker; a slow one ([`SLOW_CALL`]) counts toward
    /// [`SLOW_BUDGET`], whose exhaustion opens it too (counted as one table error, logged).
    async fn bounded<T>(
        &mut self,
        operation: &'static str,
        call: impl Future<Output = Result<T, PoisonError>>,
    ) -> Result<T, PoisonError> {
        let started = Instant::now();
        let budget_end = started.checked_add(CALL_BUDGET).unwrap_or(self.until);
        let end = budget_end.min(self.until);
        let Ok(result) = timeout_at(end, call).await else {
            self.timed_out = true;
            let cause = if end < self.until {
                format!(
                    "no answer within {} ms (the gate's budget per call): not calling the table \
                     again in this invocation",
                    CALL_BUDGET.as_millis()
                )
            } else {
                "no answer before the invocation's last write".to_string()
            };
            return Err(PoisonError {
                table: self.table.name().to_string(),
                operation,
                cause,
            });
        };
        let waited = started.elapsed();
        if waited >= SLOW_CALL && self.slow < SLOW_BUDGET {
            self.slow = self.slow.saturating_add(waited);
            if self.slow >= SLOW_BUDGET {
                self.errors = self.errors.saturating_add(1);
                error!(
                    table = %self.table.name(),
                    operation,
                    slow_ms = u64::try_from(self.slow.as_millis()).unwrap_or(u64::MAX),
                    poison_table_errors = self.errors,
                    "poison-pill table answering slowly: {} ms of this invocation spent on \
                     answers slower than {} ms; not calling it again in this invocation (every \
                     run executes)",
                    self.slow.as_millis(),
                    SLOW_CALL.as_millis()
                );
            }
        }
        result
    }

    /// The mode this gate applies.
    pub fn mode(&self) -> PoisonMode {
        self.mode
    }

    /// Table calls that failed in this invocation (each one failed open). The invocation
    /// summary reports it as `poison_table_errors`.
    pub fn table_errors(&self) -> u32 {
        self.errors
    }

    /// Whether the breaker is closed: fewer than [`MAX_TABLE_ERRORS`] errors, no call timed
    /// out, and [`SLOW_BUDGET`] not spent.
    fn table_usable(&self) -> bool {
        self.errors < MAX_TABLE_ERRORS && !self.timed_out && self.slow < SLOW_BUDGET
    }

    /// Log a failed table call (the table's name and the AWS error with its source chain are
    /// in `e`) and count it.
    fn table_error(&mut self, workflow: Option<&str>, e: &PoisonError, consequence: &str) {
        self.errors = self.errors.saturating_add(1);
        error!(
            table = %self.table.name(),
            workflow = workflow.unwrap_or(""),
            error = %e,
            poison_table_errors = self.errors,
            "poison-pill table call failed: {consequence}"
        );
        if !self.table_usable() {
            let why = if self.timed_out {
                "a poison-pill table call went unanswered in time".to_string()
            } else {
                format!("{} poison-pill table errors", self.errors)
            };
            error!(
                table = %self.table.name(),
                "{why}: not calling it again in this invocation (every run executes)"
            );
        }
    }

    async fn counter(&mut self, workflow: &str) -> Option<FailureCounter> {
        if self.read.contains(workflow) {
            return self.seen.get(workflow).flatten();
        }
        if !self.table_usable() {
            return None;
        }
        let table = self.table.clone();
        let start = self.seen.read_started();
        match self
            .bounded("read", table.counter(workflow, now_ms()))
            .await
        {
            Ok(counter) => self.seen.read(workflow, counter, start),
            // Fail open: an unreachable table must not stop the fleet. Unknown counts as
            // absent (unless another invocation here knows it), and no second read of this
            // workflow in this invocation.
            Err(e) => self.table_error(Some(workflow), &e, "executing the run anyway"),
        }
        self.read.insert(workflow.to_string());
        self.seen.get(workflow).flatten()
    }

    fn blocked_now(&self, workflow: &str, now: u64) -> bool {
        self.seen
            .get(workflow)
            .flatten()
            .is_some_and(|c| self.policy.is_blocked(&c, now))
    }

    /// Why `workflow` is blocked now, if it is.
    pub async fn blocked_reason(&mut self, workflow: &str) -> Option<String> {
        let counter = self.counter(workflow).await?;
        let now = now_ms();
        self.policy.is_blocked(&counter, now).then(|| {
            let left = Duration::from_millis(
                counter
                    .last_failure_ms
                    .saturating_add(super::duration_ms(self.policy.cooldown))
                    .saturating_sub(now),
            );
            format!(
                "workflow '{workflow}' is blocked as a poison pill: {} consecutive failures \
                 (threshold {}); blocked for another {}s",
                counter.consecutive_failures,
                self.policy.threshold,
                left.as_secs()
            )
        })
    }

    async fn record_failure(&mut self, workflow: &str, failure_id: &str) {
        if !self.table_usable() {
            return;
        }
        let table = self.table.clone();
        match self
            .bounded(
                "record failure",
                table.record_failure(workflow, failure_id, now_ms()),
            )
            .await
        {
            Ok(counter) => {
                info!(
                    workflow,
                    failure_id,
                    consecutive_failures = counter.consecutive_failures,
                    "counted a failure of its workflow"
                );
                if counter.consecutive_failures >= self.policy.threshold {
                    warn!(
                        workflow,
                        consecutive_failures = counter.consecutive_failures,
                        "workflow flagged as poison pill"
                    );
                }
                self.seen.wrote(workflow, Some(counter));
            }
            Err(e) => self.table_error(Some(workflow), &e, "the failure is not counted"),
        }
    }

    /// Count a finished run's outcome: failures increment; a success resets, as does a run
    /// suspended by its handler (it ran without failing, as the reference worker counts any
    /// handler that returned) or handed back cleanly at the cutoff (it executed without
    /// failing, for as long as the invocation lasted). A run an operator paused (suspended
    /// with that reason, whichever part of the worker saw the pause first: a timeout found
    /// paused is no success) neither counts nor resets. A run this invocation left to the API's
    /// reaper, or whose lease it lost (expired unconfirmed, or taken over by another worker, which
    /// may leave a step of this invocation Running for the reaper to interrupt), is noted as
    /// expected to come back with one more lease recovery, which then does not count as a dead
    /// invocation: this invocation returned, only its lease or its write to the API failed.
    pub async fn record(&mut self, report: &RunReport) {
        let workflow = report.workflow.as_str();
        self.expect_recovery(report).await;
        if report.outcome.is_workflow_failure() {
            let failure_id = format!("{}/{}", report.run_id, report.retry_count);
            self.record_failure(workflow, &failure_id).await;
        } else if (report.outcome == Outcome::Completed
            || (matches!(report.outcome, Outcome::Suspended | Outcome::HandedBack)
                && report.error.is_none()))
            && self.counter(workflow).await.is_some()
        {
            if !self.table_usable() {
                return;
            }
            let table = self.table.clone();
            match self.bounded("reset", table.reset(workflow)).await {
                Ok(()) => {
                    self.seen.wrote(workflow, None);
                }
                Err(e) => self.table_error(Some(workflow), &e, "the counter is not reset"),
            }
        }
    }

    /// Note the next lease recovery of `report`'s run as expected when this invocation left
    /// the run to the API's reaper or lost its lease, executed or not (a claim released
    /// unexecuted whose write-back failed leaves it Running too): that recovery is no death,
    /// and the step an earlier holder left interrupted, still the run's newest, must not count
    /// again as one. Part of [`PoisonGate::record`]; called alone for the runs this invocation
    /// did not execute.
    ///
    /// The expectation is kept in the process first, then written with the others a table
    /// error left unwritten (at most [`EXPECTED_WRITES_PER_USE`] per call); one that cannot be
    /// written now (a table error, or the error cap reached: a warning names the run) stays in
    /// the process for the gate's next use, and a claim of the run by this process does not
    /// count its recovery meanwhile ([`PoisonGate::on_claim`]). Only another process claiming
    /// the run before any write lands can still count it.
    pub async fn expect_recovery(&mut self, report: &RunReport) {
        if report.left_to_reaper || report.outcome == Outcome::LeaseLost {
            let expected = Expected {
                run_id: report.run_id,
                workflow: report.workflow.clone(),
                lease_recoveries: report.lease_recoveries.saturating_add(1),
            };
            if !self.seen.keep_expected(expected) {
                warn!(
                    run_id = %report.run_id,
                    workflow = report.workflow.as_str(),
                    "expected lease recovery not kept in this process ({} unwritten already): \
                     written now or never, its recovery may count as a failure",
                    super::seen::MAX_UNWRITTEN_EXPECTED
                );
            }
            if !self.table_usable() {
                warn!(
                    table = %self.table.name(),
                    run_id = %report.run_id,
                    workflow = report.workflow.as_str(),
                    "expected lease recovery not written (the poison-pill table is not called \
                     again in this invocation: errors, or no answer in time): kept in this \
                     process, written at the table's next use here; meanwhile only a claim by \
                     another process would count it"
                );
                return;
            }
        }
        self.write_expected().await;
    }

    /// Write the expected recoveries this process keeps unwritten (at most
    /// [`EXPECTED_WRITES_PER_USE`]), stopping at the first table error. Also called once at
    /// the end of an invocation, so that a note a table error left unwritten does not wait for
    /// this process's next invocation (another process may claim the run first).
    pub async fn write_expected(&mut self) {
        for expected in self.seen.unwritten(EXPECTED_WRITES_PER_USE) {
            if !self.table_usable() {
                return;
            }
            let table = self.table.clone();
            let note = table.observe_lease_recoveries(
                expected.run_id,
                expected.lease_recoveries,
                now_ms(),
            );
            match self.bounded("observe lease recoveries", note).await {
                // `false`: the table knew it already (a recovery observed since, or this
                // process's write retried): written all the same.
                Ok(_) => self.seen.expected_written(&expected),
                Err(e) => {
                    let consequence = format!(
                        "the expected recovery of run {} stays in this process, to write at the \
                         table's next use (a claim by another process before then would count \
                         it)",
                        expected.run_id
                    );
                    self.table_error(Some(&expected.workflow), &e, &consequence);
                    return;
                }
            }
        }
    }

    /// The capabilities to claim with; called before every claim (free after the first: the
    /// counters are cached).
    ///
    /// Fail mode (the default) claims every registered workflow and fails runs of blocked
    /// ones. Defer mode reads the counters of every registered workflow in one batch (once
    /// per invocation) and leaves the blocked ones out, so their runs stay Pending. If every
    /// registered workflow is blocked, the list is empty and the claim finds nothing.
    pub async fn capabilities_for_claim(
        &mut self,
        registered: &WorkerCapabilities,
    ) -> WorkerCapabilities {
        if self.mode == PoisonMode::Fail {
            return registered.clone();
        }
        // The builder never hands defer mode a worker without a workflow list.
        let Some(workflows) = registered.workflows.as_ref() else {
            return registered.clone();
        };
        let missing: Vec<String> = workflows
            .iter()
            .filter(|w| !self.read.contains(*w))
            .cloned()
            .collect();
        if !missing.is_empty() {
            let start = self.seen.read_started();
            let found = if self.table_usable() {
                let table = self.table.clone();
                match self
                    .bounded("batch read", table.counters(&missing, now_ms()))
                    .await
                {
                    Ok(found) => Some(found),
                    Err(e) => {
                        self.table_error(None, &e, "claiming every registered workflow");
                        None
                    }
                }
            } else {
                None
            };
            for w in missing {
                // Not read (a table error): unknown counts as absent, as for one workflow.
                if let Some(found) = &found {
                    self.seen.read(&w, found.get(&w).copied(), start);
                }
                self.read.insert(w);
            }
        }
        let now = now_ms();
        let (allowed, blocked): (Vec<String>, Vec<String>) = workflows
            .iter()
            .cloned()
            .partition(|w| !self.blocked_now(w, now));
        if !blocked.is_empty() {
            info!(blocked = %blocked.join(","), "defer mode: not claiming runs of blocked workflows");
        }
        WorkerCapabilities::new(Some(allowed), registered.tags.clone())
    }

    /// When a run of `workflow` due at `at` (a retry's backoff, a sleep's end) can be claimed:
    /// `at`, or in defer mode the end of the workflow's block (last failure + cooldown) when
    /// this process knows the workflow blocked then, since claims leave its runs out until
    /// then. What the run's timer wake-up is booked for: one due earlier would claim nothing.
    /// No table call.
    pub fn claimable_at(&self, workflow: &str, at: DateTime<Utc>) -> DateTime<Utc> {
        if self.mode != PoisonMode::Defer {
            return at;
        }
        let Some(counter) = self.seen.get(workflow).flatten() else {
            return at;
        };
        let ends_ms = counter
            .last_failure_ms
            .saturating_add(super::duration_ms(self.policy.cooldown));
        // Judged no earlier than now: a counter dated ahead of a due time already past is no
        // future-dated item (that is judged against the clock, CLOCK_SKEW_ALLOWANCE).
        let due_ms = u64::try_from(at.timestamp_millis())
            .unwrap_or(0)
            .max(now_ms());
        if !self.policy.is_blocked(&counter, due_ms) {
            return at;
        }
        i64::try_from(ends_ms)
            .ok()
            .and_then(DateTime::<Utc>::from_timestamp_millis)
            .map_or(at, |ends| ends.max(at))
    }

    /// Called with every claimed run, before [`PoisonGate::blocked_reason`]: a run whose
    /// `lease_recoveries` is above what this function last saw for it was recovered by the
    /// API's reaper. When its `steps` (read only then: `None` when they could not be read)
    /// show that the holder had started a step (`src/poison/recovery.rs`), that holder was an
    /// invocation that died executing it (function timeout, out of memory), and that counts as
    /// one failure of its workflow, once per dead invocation: id `lease-recovery/<the worker id
    /// the step names>` (`src/store/holder.rs`), so the runs one dead invocation held count
    /// as one death of each of their workflows, however many invocations recover them; a step
    /// that names no holder (a parallel branch's) is counted under this invocation's worker id
    /// instead. A recovery of a claim whose answer was lost, or of steps unreadable (an
    /// infrastructure error), does not count. A run never recovered costs nothing.
    ///
    /// A recovery this process expected and has not written to the table yet
    /// ([`PoisonGate::expect_recovery`]) is not counted either; the unwritten expectations are
    /// written first.
    pub async fn on_claim(&mut self, run: &Run, steps: impl Future<Output = Option<Vec<Step>>>) {
        let recoveries = run.lease_recoveries;
        if recoveries == 0 {
            return;
        }
        let workflow = run.workflow_name.as_str();
        if self.seen.expected(run.id).is_some_and(|e| recoveries <= e) {
            info!(
                run_id = %run.id,
                workflow,
                lease_recoveries = recoveries,
                "run recovered after its lease expired, a recovery this process expected (its \
                 note to the poison-pill table is not written yet): not counted"
            );
            self.write_expected().await;
            return;
        }
        self.write_expected().await;
        if !self.table_usable() {
            return;
        }
        let table = self.table.clone();
        let observed = table.observe_lease_recoveries(run.id, recoveries, now_ms());
        match self.bounded("observe lease recoveries", observed).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                return self.table_error(Some(workflow), &e, "the lease recovery is not counted");
            }
        }
        let steps = steps.await;
        let Some(marked) = steps.as_deref().and_then(dead_holder_step) else {
            info!(
                run_id = %run.id,
                workflow,
                lease_recoveries = recoveries,
                "run recovered after its lease expired, its holder had started no step (a \
                 lost claim, a lease taken over, or steps unreadable): not counted"
            );
            return;
        };
        // The holder's own death is the run's recovery n + 1 (n: the recoveries when it claimed
        // the run). A later one is another holder's that started no step (a lease taken over,
        // a lost claim), after the marked holder lived on or its death was counted already.
        if let Some(n) = marked.and_then(holder_claimed_recoveries)
            && recoveries > n.saturating_add(1)
        {
            info!(
                run_id = %run.id,
                workflow,
                lease_recoveries = recoveries,
                holder_claimed_at = n,
                "run recovered after its lease expired, a later holder had started no step (a \
                 lease taken over or a lost claim after the marked holder's): not counted"
            );
            return;
        }
        let holder = marked
            .and_then(holder)
            .unwrap_or(&self.invocation)
            .to_string();
        self.lease_recoveries = self.lease_recoveries.saturating_add(1);
        warn!(
            run_id = %run.id,
            workflow,
            lease_recoveries = recoveries,
            holder,
            "run recovered after its lease expired: the invocation that held it died \
             executing a step; counting a failure of its workflow"
        );
        let failure_id = format!("lease-recovery/{holder}");
        self.record_failure(workflow, &failure_id).await;
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use uuid::Uuid;

    use super::*;
    use crate::poison::memory::MemoryPoisonTable;

    fn policy() -> PoisonPolicy {
        PoisonPolicy {
            threshold: 2,
            cooldown: Duration::from_secs(60),
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn report(workflow: &str, outcome: Outcome) -> RunReport {
        RunReport {
            run_id: Uuid::new_v4(),
            workflow: workflow.into(),
            outcome,
            executed: Duration::from_millis(1),
            error: None,
            left_to_reaper: false,
            stuck: false,
            due: None,
            spend: crate::report::Spend::default(),
            retry_count: 0,
            lease_recoveries: 0,
        }
    }

    /// Fault injection: a table that always fails, counting the calls it receives (a stub on
    /// purpose, the DynamoDB table is tested against moto in tests/poison_dynamodb.rs).
    #[derive(Default)]
    struct Broken {
        calls: std::sync::atomic::AtomicU32,
    }

    impl Broken {
        fn fail<T>(&self) -> Result<T, PoisonError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(PoisonError {
                table: "broken".into(),
                operation: "read",
                cause: "unreachable".into(),
            })
        }
    }

    #[async_trait]
    impl PoisonTable for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        async fn counter(&self, _: &str, _: u64) -> Result<Option<FailureCounter>, PoisonError> {
            self.fail()
        }
        async fn record_failure(
            &self,
            _: &str,
            _: &str,
            _: u64,
        ) -> Result<FailureCounter, PoisonError> {
            self.fail()
        }
        async fn reset(&self, _: &str) -> Result<(), PoisonError> {
            self.fail()
        }
        async fn observe_lease_recoveries(
            &self,
            _: Uuid,
            _: u32,
            _: u64,
        ) -> Result<bool, PoisonError> {
            self.fail()
        }
    }

    #[tokio::test]
    async fn defer_mode_leaves_blocked_workflows_out_of_the_claim() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        for id in ["a", "b"] {
            table.record_failure("bad", id, now_ms()).await.unwrap();
        }
        let registered =
            WorkerCapabilities::new(Some(vec!["bad".into(), "good".into()]), vec!["gpu".into()]);
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Defer, later(), "w");
        let caps = gate.capabilities_for_claim(&registered).await;
        assert_eq!(caps.workflows, Some(vec!["good".to_string()]));
        assert_eq!(caps.tags, vec!["gpu".to_string()]);

        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "w");
        assert_eq!(gate.capabilities_for_claim(&registered).await, registered);
    }

    #[tokio::test]
    async fn a_failure_in_the_invocation_blocks_the_next_claim_in_defer_mode() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let registered = WorkerCapabilities::new(Some(vec!["wf".into()]), vec![]);
        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Defer, later(), "w");
        assert_eq!(
            gate.capabilities_for_claim(&registered).await.workflows,
            Some(vec!["wf".to_string()])
        );
        gate.record(&report("wf", Outcome::Failed)).await;
        gate.record(&report("wf", Outcome::TimedOut)).await;
        assert_eq!(
            gate.capabilities_for_claim(&registered).await.workflows,
            Some(vec![])
        );
        assert!(gate.blocked_reason("wf").await.is_some());
    }

    #[tokio::test]
    async fn invocations_of_one_process_see_each_other_s_outcomes_at_once() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let seen = Arc::new(super::super::seen::SeenCounters::default());
        let gate = |id| {
            PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), id)
                .sharing(seen.clone())
        };
        let (mut a, mut b) = (gate("a"), gate("b"));
        // Both read the workflow's counter once (none yet), then `a` records failures.
        assert_eq!(a.blocked_reason("wf").await, None);
        assert_eq!(b.blocked_reason("wf").await, None);
        a.record(&report("wf", Outcome::Failed)).await;
        a.record(&report("wf", Outcome::Failed)).await;
        assert!(
            b.blocked_reason("wf").await.is_some(),
            "b sees a's failures without reading the table again"
        );
        // A success `b` records resets the counter for `a` too (b knows a counter exists).
        b.record(&report("wf", Outcome::Completed)).await;
        assert_eq!(a.blocked_reason("wf").await, None);
        assert!(table.counter("wf", now_ms()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_suspended_run_ends_a_failure_streak_as_a_completed_one_does() {
        for ending in [Outcome::Completed, Outcome::Suspended] {
            let table = Arc::new(MemoryPoisonTable::new(policy()));
            let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "w");
            gate.record(&report("wf", Outcome::Failed)).await;
            gate.record(&report("wf", ending)).await;
            gate.record(&report("wf", Outcome::Failed)).await;
            assert_eq!(gate.blocked_reason("wf").await, None, "{ending:?}");
        }
    }

    #[tokio::test]
    async fn a_run_abandoned_to_an_operator_s_pause_neither_counts_nor_resets() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "w");
        gate.record(&report("wf", Outcome::Failed)).await;
        let mut paused = report("wf", Outcome::Suspended);
        paused.error = Some("the run was paused by an operator".into());
        gate.record(&paused).await;
        assert_eq!(gate.blocked_reason("wf").await, None, "not counted");
        gate.record(&report("wf", Outcome::Failed)).await;
        assert!(
            gate.blocked_reason("wf").await.is_some(),
            "the streak goes on across the pause"
        );
    }

    #[tokio::test]
    async fn the_runs_of_one_dead_invocation_count_once_and_a_clean_handback_resets() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "inv-1");
        gate.record_failure("wf", "lease-recovery/inv-1").await;
        gate.record_failure("wf", "lease-recovery/inv-1").await;
        assert_eq!(
            gate.blocked_reason("wf").await,
            None,
            "one death, threshold 2"
        );
        gate.record_failure("wf", "lease-recovery/inv-2").await;
        assert!(gate.blocked_reason("wf").await.is_some());

        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "inv-3");
        gate.record(&report("wf", Outcome::HandedBack)).await;
        assert_eq!(
            gate.blocked_reason("wf").await,
            None,
            "reset by a clean handback"
        );
    }

    /// A run of `workflow` the reaper recovered once, and its one step, left Running by
    /// `holder` (named in the step's mark, as the worker's store writes it, when `Some`).
    async fn recovered(workflow: &str, holder: Option<&str>) -> (Run, Vec<Step>) {
        use ironflow_store::memory::InMemoryStore;
        use ironflow_store::store::RunStore;

        let store = InMemoryStore::new();
        let id = crate::poison::recovery::tests::run(&store, workflow).await;
        crate::poison::recovery::tests::started_by(&store, id, 0, holder, None).await;
        let mut run = store.get_run(id).await.unwrap().unwrap();
        run.lease_recoveries = 1;
        let steps = store.list_steps(id).await.unwrap();
        (run, steps)
    }

    #[tokio::test]
    async fn one_dead_invocation_counts_once_however_many_invocations_recover_its_runs() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        for claimer in ["inv-a", "inv-b", "inv-c"] {
            let mut gate =
                PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), claimer);
            let (run, steps) = recovered("wf", Some("dead-1")).await;
            gate.on_claim(&run, async { Some(steps) }).await;
            assert_eq!(gate.lease_recoveries(), 1, "{claimer} saw a death");
            assert_eq!(
                gate.blocked_reason("wf").await,
                None,
                "{claimer}: one death of dead-1, threshold 2"
            );
        }

        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "inv-d");
        let (run, steps) = recovered("wf", Some("dead-2")).await;
        gate.on_claim(&run, async { Some(steps) }).await;
        assert!(gate.blocked_reason("wf").await.is_some(), "a second death");

        // Without a mark, each claiming invocation counts the death it recovers once.
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "inv-e");
        for _ in 0..2 {
            let (run, steps) = recovered("wf", None).await;
            gate.on_claim(&run, async { Some(steps) }).await;
        }
        assert_eq!(gate.lease_recoveries(), 2);
        assert_eq!(gate.blocked_reason("wf").await, None);
    }

    #[tokio::test]
    async fn a_recovery_after_the_marked_holder_s_own_is_not_counted_as_its_death() {
        use crate::store::holder::{HOLDER_KEY, RECOVERIES_KEY};
        // `lost-1` claimed the run at 0 recoveries and lost its lease mid-step (taken over);
        // the taker let it expire twice: recovery 2 cannot be `lost-1`'s death.
        let (mut run, mut steps) = recovered("wf", Some("lost-1")).await;
        steps[0].debug_messages =
            Some(serde_json::json!([{ HOLDER_KEY: "lost-1", RECOVERIES_KEY: 0 }]));
        run.lease_recoveries = 2;
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "a");
        gate.on_claim(&run, async { Some(steps.clone()) }).await;
        assert_eq!(gate.lease_recoveries(), 0, "a later holder's recovery");
        // Its own recovery (1) is its death.
        run.lease_recoveries = 1;
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        let mut gate = PoisonGate::new(table, policy(), PoisonMode::Fail, later(), "b");
        gate.on_claim(&run, async { Some(steps) }).await;
        assert_eq!(gate.lease_recoveries(), 1, "the holder's own recovery");
    }

    #[tokio::test]
    async fn a_run_left_to_the_reaper_unexecuted_does_not_count_its_old_holder_s_step_again() {
        let table = Arc::new(MemoryPoisonTable::new(policy()));
        // Recovered once: the claimer counts the death of `dead-1`, whose step is the newest.
        let (mut run, steps) = recovered("wf", Some("dead-1")).await;
        let mut first = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "a");
        first.on_claim(&run, async { Some(steps.clone()) }).await;
        assert_eq!(first.lease_recoveries(), 1);
        // `a` releases it unexecuted, its write-back fails: left to the reaper, which recovers
        // it a second time with the same newest step.
        let mut released = report("wf", Outcome::Released);
        (
            released.run_id,
            released.left_to_reaper,
            released.lease_recoveries,
        ) = (run.id, true, run.lease_recoveries);
        first.expect_recovery(&released).await;
        run.lease_recoveries = 2;
        let mut next = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "b");
        next.on_claim(&run, async { Some(steps) }).await;
        assert_eq!(
            next.lease_recoveries(),
            0,
            "an expected recovery is no death"
        );
    }

    /// Fault injection: the memory table, each call counted, then answered after `delay`
    /// (`Some(None)`: never, a DynamoDB that accepts the request and hangs) and failed while
    /// `down` is set (a throttled or unreachable DynamoDB).
    struct Faulty {
        inner: MemoryPoisonTable,
        down: std::sync::atomic::AtomicBool,
        delay: Option<Option<Duration>>,
        calls: std::sync::atomic::AtomicU32,
    }

    impl Faulty {
        /// Failing every call until `down` is cleared.
        fn switch(policy: PoisonPolicy) -> Self {
            Self {
                inner: MemoryPoisonTable::new(policy),
                down: true.into(),
                delay: None,
                calls: 0.into(),
            }
        }

        /// Answering every call after `delay`, or never.
        fn slow(delay: Option<Duration>) -> Self {
            Self {
                inner: MemoryPoisonTable::new(policy()),
                down: false.into(),
                delay: Some(delay),
                calls: 0.into(),
            }
        }

        async fn before(&self) -> Result<(), PoisonError> {
            use std::sync::atomic::Ordering::SeqCst;
            self.calls.fetch_add(1, SeqCst);
            match self.delay {
                Some(Some(delay)) => tokio::time::sleep(delay).await,
                Some(None) => std::future::pending().await,
                None => {}
            }
            if self.down.load(SeqCst) {
                return Err(PoisonError {
                    table: "faulty".into(),
                    operation: "any",
                    cause: "ThrottlingException (injected)".into(),
                });
            }
            Ok(())
        }

        fn calls(&self) -> u32 {
            self.calls.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl PoisonTable for Faulty {
        fn name(&self) -> &str {
            "faulty"
        }
        async fn counter(&self, w: &str, now: u64) -> Result<Option<FailureCounter>, PoisonError> {
            self.before().await?;
            self.inner.counter(w, now).await
        }
        async fn record_failure(
            &self,
            w: &str,
            id: &str,
            now: u64,
        ) -> Result<FailureCounter, PoisonError> {
            self.before().await?;
            self.inner.record_failure(w, id, now).await
        }
        async fn reset(&self, w: &str) -> Result<(), PoisonError> {
            self.before().await?;
            self.inner.reset(w).await
        }
        async fn observe_lease_recoveries(
            &self,
            run: Uuid,
            n: u32,
            now: u64,
        ) -> Result<bool, PoisonError> {
            self.before().await?;
            self.inner.observe_lease_recoveries(run, n, now).await
        }
    }

    /// The hostile review h4's D4: a run whose lease this invocation lost, while the table
    /// refused the expected recovery's note (one error; another run's note skipped once the
    /// error cap was reached), came back from the reaper and was counted as a death of its
    /// healthy workflow. Now the process keeps both notes, does not count the recoveries it
    /// expected, and writes the notes at the table's next use, so another process does not
    /// count them either.
    #[tokio::test]
    async fn an_expected_recovery_the_table_refused_is_kept_written_later_and_never_counted() {
        use std::sync::atomic::Ordering::SeqCst;
        let strict = PoisonPolicy {
            threshold: 1,
            cooldown: Duration::from_secs(60),
        };
        let table = Arc::new(Faulty::switch(strict));
        let seen = Arc::new(super::super::seen::SeenCounters::default());
        let gate = |id: &str| {
            PoisonGate::new(table.clone(), strict, PoisonMode::Fail, later(), id)
                .sharing(seen.clone())
        };
        let (mut first_run, first_steps) = recovered("wf", Some("inv-1")).await;
        let (mut second_run, second_steps) = recovered("wf", Some("inv-1")).await;
        let lost = |run: &Run| {
            let mut r = report("wf", Outcome::LeaseLost);
            (r.run_id, r.lease_recoveries) = (run.id, 0);
            r
        };

        let mut one = gate("inv-1");
        one.expect_recovery(&lost(&first_run)).await;
        assert_eq!(one.table_errors(), 1, "the note failed");
        one.record(&report("other", Outcome::Failed)).await;
        one.record(&report("other", Outcome::Failed)).await;
        assert_eq!(one.table_errors(), MAX_TABLE_ERRORS);
        let calls = table.calls.load(SeqCst);
        one.expect_recovery(&lost(&second_run)).await;
        assert_eq!(table.calls.load(SeqCst), calls, "past the cap: no call");
        assert_eq!(seen.expected(first_run.id), Some(1), "kept");
        assert_eq!(seen.expected(second_run.id), Some(1), "kept");

        // The reaper recovers both. This process's next invocation claims the first while the
        // table still fails: expected here, not counted.
        (first_run.lease_recoveries, second_run.lease_recoveries) = (1, 1);
        let mut two = gate("inv-2");
        two.on_claim(&first_run, async { Some(first_steps) }).await;
        assert_eq!(
            two.lease_recoveries(),
            0,
            "an expected recovery is no death"
        );
        assert_eq!(two.blocked_reason("wf").await, None);

        // The table is back: the process's next gate call writes both notes.
        table.down.store(false, SeqCst);
        let mut three = gate("inv-3");
        three.record(&report("wf", Outcome::Completed)).await;
        assert_eq!(three.table_errors(), 0);
        assert_eq!(seen.expected(first_run.id), None, "written");
        assert_eq!(seen.expected(second_run.id), None, "written");

        // Another process (its own counters) claims the second: the table knew to expect it.
        let mut elsewhere = PoisonGate::new(table.clone(), strict, PoisonMode::Fail, later(), "b");
        elsewhere
            .on_claim(&second_run, async { Some(second_steps) })
            .await;
        assert_eq!(elsewhere.lease_recoveries(), 0);
        assert_eq!(elsewhere.blocked_reason("wf").await, None);
        assert!(table.inner.counter("wf", now_ms()).await.unwrap().is_none());
    }

    /// The hostile review h4's D6: a hanging DynamoDB cost each gate call the SDK's 5 s
    /// operation timeout, three times per invocation (15 s). Now the first call waits
    /// CALL_BUDGET at most, and opens the breaker: the rest of the invocation calls nothing.
    /// (Tokio's clock is paused: the waits are exact, and instant.)
    #[tokio::test(start_paused = true)]
    async fn a_hanging_table_costs_an_invocation_one_call_budget_at_most() {
        let table = Arc::new(Faulty::slow(None));
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "w");
        let start = Instant::now();
        assert_eq!(gate.blocked_reason("a").await, None, "fails open");
        assert_eq!(start.elapsed(), CALL_BUDGET);
        assert_eq!(gate.blocked_reason("b").await, None);
        gate.record(&report("a", Outcome::Failed)).await;
        let mut lost = report("b", Outcome::LeaseLost);
        lost.left_to_reaper = true;
        gate.record(&lost).await;
        let (run, steps) = recovered("c", Some("dead")).await;
        gate.on_claim(&run, async { Some(steps) }).await;
        assert_eq!(start.elapsed(), CALL_BUDGET, "no second wait");
        assert_eq!(table.calls(), 1);
        assert_eq!(gate.table_errors(), 1);

        // The invocation's last write sooner than the budget bounds the call instead.
        let until = Instant::now() + Duration::from_millis(200);
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, until, "w");
        let start = Instant::now();
        assert_eq!(gate.blocked_reason("a").await, None);
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        // Defer mode's batch read before the first claim: bounded alike.
        let registered = WorkerCapabilities::new(Some(vec!["a".into(), "b".into()]), vec![]);
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Defer, later(), "w");
        let start = Instant::now();
        assert_eq!(gate.capabilities_for_claim(&registered).await, registered);
        assert_eq!(start.elapsed(), CALL_BUDGET);
    }

    /// Slow answers that succeed (under CALL_BUDGET) were never cut: each workflow's first run
    /// waited for its read. Now the gate spends at most SLOW_BUDGET on slow answers (plus the
    /// one that crosses it) per invocation; healthy answers never count.
    #[tokio::test(start_paused = true)]
    async fn slow_answers_cost_an_invocation_the_slow_budget_at_most() {
        let crawl = Duration::from_millis(900);
        let table = Arc::new(Faulty::slow(Some(crawl)));
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "w");
        let start = Instant::now();
        for w in ["a", "b", "c", "d", "e", "f"] {
            assert_eq!(gate.blocked_reason(w).await, None);
        }
        assert_eq!(table.calls(), 3, "2.7 s of slow answers spend the budget");
        assert_eq!(start.elapsed(), crawl * 3);
        assert!(start.elapsed() <= SLOW_BUDGET + CALL_BUDGET);
        assert_eq!(
            gate.table_errors(),
            1,
            "the breaker's opening is counted once"
        );

        let table = Arc::new(Faulty::slow(Some(Duration::from_millis(20))));
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "w");
        for i in 0..200 {
            gate.record(&report(&format!("w{i}"), Outcome::Failed))
                .await;
        }
        assert_eq!(table.calls(), 200, "answers in 20 ms are healthy");
        assert_eq!(gate.table_errors(), 0);
    }

    #[tokio::test]
    async fn table_errors_fail_open_and_stop_after_the_limit() {
        let table = Arc::new(Broken::default());
        let mut gate = PoisonGate::new(table.clone(), policy(), PoisonMode::Fail, later(), "w");
        assert_eq!(gate.blocked_reason("a").await, None);
        // Cached: the same workflow is not read again.
        assert_eq!(gate.blocked_reason("a").await, None);
        gate.record(&report("a", Outcome::Failed)).await;
        gate.record(&report("b", Outcome::Failed)).await;
        gate.record(&report("c", Outcome::Failed)).await;
        assert_eq!(gate.blocked_reason("d").await, None);
        assert_eq!(gate.table_errors(), MAX_TABLE_ERRORS);
        assert_eq!(
            table.calls.load(std::sync::atomic::Ordering::SeqCst),
            MAX_TABLE_ERRORS
        );
    }
}
