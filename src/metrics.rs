//! CloudWatch metrics in the embedded metric format (EMF), over the `metrics` facade that
//! ironflow's engine also records through.
//!
//! [`install`] sets the process-wide recorder at cold start (namespace `IRONFLOW_METRICS_NAMESPACE`,
//! default `ironflow-lambda`, dimension `function` = `AWS_LAMBDA_FUNCTION_NAME`); each invocation
//! records its summary with [`record`], and the function flushes the EMF document to stdout
//! before every response. CloudWatch Logs turns the document into metrics; no API call, no
//! extra latency.
//!
//! | metric | unit | dimensions |
//! |---|---|---|
//! | `RunsClaimed` | Count | function |
//! | `RunsCompleted`, `RunsSuspended`, `RunsFailed`, `RunsTimedOut`, `RunsPanicked`, `RunsCancelled`, `RunsHandedBack`, `RunsReleased`, `LeasesLost`, `PoisonPillSkips` | Count | function, workflow |
//! | `ApiErrors` | Count | function, route, kind (`connect`, `transport`, `timeout`, `server`, `unauthorized`, `throttled`; `failed` for log pushes) |
//! | `LeaseRecoveries` | Count | function |
//! | `RunsLeftToReaper` | Count | function |
//! | `StuckExecutions` | Count | function |
//! | `LogLinesDropped` | Count | function |
//! | `PoisonTableErrors` | Count | function |
//! | `TimeLeftAtExit` | Milliseconds | function |
//! | `Backlog` | Count | function (when the pending count is known) |
//! | `InputTokens`, `OutputTokens` | Count | function, workflow |
//! | `CostUsd` | None (US dollars; one value per run that spent, `Sum` is the total) | function, workflow |
//! | `StepsCutAtCutoff` | Count | function, workflow |
//!
//! The spend metrics are the recorded figures of [`crate::report::Spend`]: a model call cut at the cutoff
//! is in none of them (the summary's `calls_cut` and `estimated_input_tokens` report it).
//!
//! ironflow's own metrics (`ironflow_runs_total`, `ironflow_step_duration_seconds`, ...) go
//! through the same recorder.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_cloudwatch_embedded::Collector;
use tracing::warn;

use crate::report::{InvocationSummary, Outcome, Spend};

/// `RunsClaimed`: runs claimed by an invocation.
pub const RUNS_CLAIMED: &str = "RunsClaimed";
/// `ApiErrors`: infrastructure faults of calls to the ironflow API (each attempt that met one,
/// most retried and overcome), per route and kind; and failed log pushes.
pub const API_ERRORS: &str = "ApiErrors";
/// `LeaseRecoveries`: claimed runs the API's reaper had taken back since this function last saw
/// them (an invocation that died or could not hand them back, an outage longer than the TTL).
pub const LEASE_RECOVERIES: &str = "LeaseRecoveries";
/// `RunsLeftToReaper`: runs an invocation could not hand back, release or record, left Running
/// for the API's reaper.
pub const RUNS_LEFT_TO_REAPER: &str = "RunsLeftToReaper";
/// `StuckExecutions`: executions that did not stop when told to (workflow code blocking its
/// thread).
pub const STUCK_EXECUTIONS: &str = "StuckExecutions";
/// `LogLinesDropped`: step log lines the API did not receive.
pub const LOG_LINES_DROPPED: &str = "LogLinesDropped";
/// `PoisonTableErrors`: poison-pill table calls that failed (each failed open: the run
/// executed, the count was not updated).
pub const POISON_TABLE_ERRORS: &str = "PoisonTableErrors";
/// `TimeLeftAtExit`: milliseconds left before the invocation deadline when the batch ended.
pub const TIME_LEFT_AT_EXIT: &str = "TimeLeftAtExit";
/// `Backlog`: pending runs this worker can take, as the API counted them after the batch.
pub const BACKLOG: &str = "Backlog";

/// `InputTokens`: input tokens of the steps that ended, as their provider reported them.
pub const INPUT_TOKENS: &str = "InputTokens";
/// `OutputTokens`: output tokens of the steps that ended, as their provider reported them.
pub const OUTPUT_TOKENS: &str = "OutputTokens";
/// `CostUsd`: what those steps cost, in US dollars, one value per run that spent.
pub const COST_USD: &str = "CostUsd";
/// `StepsCutAtCutoff`: steps still running when their run was handed back (done again by the
/// next invocation).
pub const STEPS_CUT_AT_CUTOFF: &str = "StepsCutAtCutoff";

/// The metric counting runs that ended with `outcome`.
pub fn outcome_metric(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Completed => "RunsCompleted",
        Outcome::Suspended => "RunsSuspended",
        Outcome::Failed => "RunsFailed",
        Outcome::TimedOut => "RunsTimedOut",
        Outcome::Panicked => "RunsPanicked",
        Outcome::Cancelled => "RunsCancelled",
        Outcome::LeaseLost => "LeasesLost",
        Outcome::HandedBack => "RunsHandedBack",
        Outcome::Released => "RunsReleased",
        Outcome::PoisonBlocked => "PoisonPillSkips",
    }
}

/// Set the process-wide EMF recorder. `None` (with a warning) if a recorder is already set.
pub fn install(namespace: &str, function: &str) -> Option<&'static Collector> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_string())
        .with_dimension("function", function.to_string())
        .init();
    match collector {
        Ok(collector) => {
            describe_counter!(RUNS_CLAIMED, Unit::Count, "runs claimed");
            describe_counter!(API_ERRORS, Unit::Count, "API faults");
            describe_counter!(
                LEASE_RECOVERIES,
                Unit::Count,
                "lease recoveries seen at claim"
            );
            describe_counter!(RUNS_LEFT_TO_REAPER, Unit::Count, "runs left to the reaper");
            describe_counter!(
                STUCK_EXECUTIONS,
                Unit::Count,
                "executions that did not stop"
            );
            describe_counter!(LOG_LINES_DROPPED, Unit::Count, "step log lines lost");
            describe_counter!(
                POISON_TABLE_ERRORS,
                Unit::Count,
                "failed poison-pill table calls"
            );
            describe_gauge!(TIME_LEFT_AT_EXIT, Unit::Milliseconds, "time left at exit");
            describe_gauge!(BACKLOG, Unit::Count, "pending runs");
            describe_counter!(INPUT_TOKENS, Unit::Count, "model input tokens");
            describe_counter!(OUTPUT_TOKENS, Unit::Count, "model output tokens");
            describe_histogram!(COST_USD, "model cost in US dollars");
            describe_counter!(STEPS_CUT_AT_CUTOFF, Unit::Count, "steps cut by a handback");
            Some(collector)
        }
        Err(e) => {
            warn!(error = %e, "metrics recorder not installed");
            None
        }
    }
}

/// Record one invocation's summary through the `metrics` facade (a no-op without recorder).
pub fn record(summary: &InvocationSummary) {
    counter!(RUNS_CLAIMED).increment(summary.claimed as u64);
    for run in &summary.runs {
        counter!(outcome_metric(run.outcome), "workflow" => run.workflow.clone()).increment(1);
        record_spend(&run.workflow, &run.spend);
    }
    for fault in &summary.api_errors {
        counter!(API_ERRORS, "route" => fault.route, "kind" => fault.kind.as_str())
            .increment(u64::from(fault.count));
    }
    if summary.logs.failed_calls > 0 {
        counter!(API_ERRORS, "route" => "POST /runs/{id}/logs", "kind" => "failed")
            .increment(summary.logs.failed_calls as u64);
    }
    counter!(LEASE_RECOVERIES).increment(u64::from(summary.lease_recoveries));
    let left = summary.runs.iter().filter(|r| r.left_to_reaper).count();
    counter!(RUNS_LEFT_TO_REAPER).increment(left as u64);
    let stuck = summary.runs.iter().filter(|r| r.stuck).count();
    counter!(STUCK_EXECUTIONS).increment(stuck as u64);
    counter!(LOG_LINES_DROPPED).increment(summary.logs.dropped as u64);
    counter!(POISON_TABLE_ERRORS).increment(u64::from(summary.poison_table_errors));
    gauge!(TIME_LEFT_AT_EXIT).set(summary.time_left_ms as f64);
    // Known when the wake-up step counted the pending runs (`IRONFLOW_WAKE_QUEUE_URL` set).
    if let Some(pending) = summary.wake_ups.as_ref().and_then(|w| w.pending_runs) {
        gauge!(BACKLOG).set(pending as f64);
    }
}

/// Record what one run's model calls used (zero counts are left out of the document).
fn record_spend(workflow: &str, spend: &Spend) {
    let workflow = workflow.to_string();
    counter!(INPUT_TOKENS, "workflow" => workflow.clone()).increment(spend.input_tokens);
    counter!(OUTPUT_TOKENS, "workflow" => workflow.clone()).increment(spend.output_tokens);
    counter!(STEPS_CUT_AT_CUTOFF, "workflow" => workflow.clone())
        .increment(u64::from(spend.steps_cut));
    if spend.cost_usd > 0.0 {
        histogram!(COST_USD, "workflow" => workflow).record(spend.cost_usd);
    }
}

/// Write the EMF document of everything recorded since the last flush to `writer` (stdout on
/// Lambda, where CloudWatch Logs picks it up).
pub fn flush(collector: &Collector, writer: impl std::io::Write) {
    if let Err(e) = collector.flush(writer) {
        warn!(error = %e, "could not write the metrics document");
    }
}
