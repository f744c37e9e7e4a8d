//! The last phases of an invocation: the flush and cleanup once every run has stopped (step
//! logs, leftover processes, heartbeat), and the summary with the wake-ups.
//!
//! Invariant: they start once every execution has ended, and each call they make ends by the
//! invocation's last write (logs, heartbeat) or the wake-up phase's end ([`crate::deadline`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::info;

use super::{Batch, claims};
use crate::api::logs::LogInbox;
use crate::orphans::InvocationGuard;
use crate::report::{
    Due, FlushReport, InvocationSummary, Outcome, RunReport, Spend, StopReason, WakeReport,
};
use crate::wake::{self, BatchEnd};
use crate::worker::LambdaWorker;
use crate::{heartbeat, metrics, process_mark};

/// What the flush and cleanup phase measured.
pub(super) struct Cleanup {
    logs: FlushReport,
    orphans_killed: usize,
    heartbeat: Option<bool>,
}

impl Batch<'_> {
    /// Phase 6: every run has stopped; what they printed is sent, the processes they left are
    /// killed, the heartbeat pinged after a batch without errors.
    pub(super) async fn flush_and_clean_up(
        &self,
        logs: LogPump,
        processes: InvocationGuard,
        stop_reason: StopReason,
    ) -> Cleanup {
        let w = self.worker;
        let last_write = self.ctx.budget.last_write();
        let logs = logs.finish(w, last_write).await;
        // Each run's own processes were killed at its end; the sweep takes what is left.
        let orphans_killed = processes.finish(process_mark::belongs_to_a_live_run).await
            + self.ctx.processes_killed.load(Ordering::Relaxed);
        let heartbeat = match &w.settings.heartbeat_url {
            Some(url) if self.errors.is_empty() => {
                Some(heartbeat::ping(w.api.http(), url, last_write).await)
            }
            _ => None,
        };
        w.pool.after_invocation();
        w.pace.record_batch_end(stop_reason == StopReason::MaxRuns);
        Cleanup {
            logs,
            orphans_killed,
            heartbeat,
        }
    }

    /// Phase 7: the wake-ups ([`crate::wake`]) and the summary, recorded in the metrics.
    pub(super) async fn summary(
        mut self,
        stop_reason: StopReason,
        cleanup: Cleanup,
    ) -> InvocationSummary {
        let runs: Vec<RunReport> = self
            .order
            .iter()
            .filter_map(|id| self.reports.get_mut(id).and_then(VecDeque::pop_front))
            .collect();
        let mut outcomes = BTreeMap::new();
        for r in &runs {
            *outcomes.entry(r.outcome).or_insert(0) += 1;
        }
        // Expected recoveries a table error left unwritten: before another process claims
        // their runs (bounded by the gate's budget and the last write).
        self.poison.write_expected().await;
        let wake_ups = self.wake_ups(&runs, &outcomes, stop_reason).await;
        let mut spend = Spend::default();
        for r in &runs {
            spend += r.spend;
        }
        let api_errors = self.ctx.calls.faults.snapshot();
        let (worker_id, ttl) = (&self.ctx.lease.worker_id, self.ctx.lease.ttl);
        if let Some(lost) = claims::lost_answers(&api_errors, worker_id, ttl) {
            self.errors.push(lost);
        }
        let summary = InvocationSummary {
            request_id: self.invoked.request_id.to_string(),
            worker_id: self.ctx.lease.worker_id.clone(),
            claimed: self.order.len(),
            outcomes,
            runs,
            stop_reason,
            errors: self.errors,
            spend,
            api_errors,
            lease_recoveries: self.poison.lease_recoveries(),
            time_left_ms: u64::try_from(self.ctx.budget.until_deadline().as_millis())
                .unwrap_or(u64::MAX),
            orphans_killed: cleanup.orphans_killed,
            logs: cleanup.logs,
            heartbeat: cleanup.heartbeat,
            poison_table_errors: self.poison.table_errors(),
            wake_ups,
        };
        metrics::record(&summary);
        info!(
            claimed = summary.claimed,
            stop_reason = summary.stop_reason.as_str(),
            time_left_ms = summary.time_left_ms,
            input_tokens = spend.input_tokens,
            output_tokens = spend.output_tokens,
            cost_usd = spend.cost_usd,
            calls_cut = spend.calls_cut,
            estimated_input_tokens = spend.estimated_input_tokens,
            "invocation finished"
        );
        summary
    }
}

impl Batch<'_> {
    /// The wake-ups after the batch ([`crate::wake`]), `None` without a wake queue.
    async fn wake_ups(
        &mut self,
        runs: &[RunReport],
        outcomes: &BTreeMap<Outcome, usize>,
        stop_reason: StopReason,
    ) -> Option<WakeReport> {
        let w = self.worker;
        let waker = w.wake.as_ref()?;
        // The backlog is counted with what the next claim would ask for (defer mode leaves
        // out the workflows the poison-pill table blocks: their runs wake nobody).
        let capabilities = self.unblocked_capabilities().await;
        let end = BatchEnd {
            request_id: self.invoked.request_id,
            trace_id: self.invoked.trace_id,
            handed_back: [Outcome::HandedBack, Outcome::Released]
                .iter()
                .filter_map(|o| outcomes.get(o))
                .sum(),
            filled: stop_reason == StopReason::MaxRuns,
            capabilities: &capabilities,
            budget: self.ctx.budget,
            // A run of a workflow blocked in defer mode is woken when claims take it
            // again, not when it is due.
            due: runs
                .iter()
                .filter_map(|r| {
                    let d = r.due?;
                    let at = self.poison.claimable_at(&r.workflow, d.at);
                    Some((r.run_id, Due { at, ..d }))
                })
                .collect(),
            // A batch that could not run sends its records back: the watches they
            // carry come again with them.
            watch: if self.order.is_empty() && stop_reason.could_not_run() {
                &[]
            } else {
                &self.watch
            },
            calls: &self.ctx.calls,
        };
        wake::after_batch(waker, &w.api, w.settings.max_runs_per_invocation, end).await
    }
}

/// The step-log pump of one invocation: it sends the lines of the invocation's runs as they
/// come, and stops (letting go of the engine's log channel, which another invocation's pump
/// may hold next) when it is finished or, should the invocation be dropped or panic first, when
/// it is dropped.
pub(super) struct LogPump {
    stop: CancellationToken,
    task: JoinHandle<(FlushReport, LogInbox)>,
    _stop_on_drop: DropGuard,
}

impl LogPump {
    pub(super) fn start(worker: &LambdaWorker, mut inbox: LogInbox, until: Instant) -> Self {
        let stop = CancellationToken::new();
        let (logs, pump_stop) = (worker.logs.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let sent = logs.pump(&mut inbox, pump_stop, until).await;
            (sent, inbox)
        });
        Self {
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            task,
        }
    }

    /// Stop the pump and send whatever the invocation's runs printed that is not out yet,
    /// before `until`.
    async fn finish(self, worker: &LambdaWorker, until: Instant) -> FlushReport {
        self.stop.cancel();
        // The pump does not panic; were it to, its lines would be lost, not the invocation.
        let Ok((mut logs, mut inbox)) = self.task.await else {
            return FlushReport::default();
        };
        logs += worker.logs.flush(&mut inbox, until).await;
        logs
    }
}
