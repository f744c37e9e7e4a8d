//! The Lambda function handler: the one code path both the Lambda runtime
//! (`src/bin/ironflow-lambda.rs`) and the local runner drive.

use lambda_runtime::LambdaEvent;
use serde_json::Value;
use tracing::info;

use crate::builder::LambdaWorker;
use crate::deadline::Budget;
use crate::invocation::{self, InvocationSummary};
use crate::trigger::{self, TriggerError};

/// Handle one invocation event: parse the trigger, run the batch against the invocation
/// deadline (`Context.deadline`, ms since the epoch), and return the summary as JSON.
///
/// # Errors
///
/// [`TriggerError`] when the event cannot start a batch; nothing is claimed then. A batch
/// whose runs failed is not an error: the summary reports each run.
pub async fn handle(
    worker: &LambdaWorker,
    event: LambdaEvent<Value>,
) -> Result<Value, TriggerError> {
    let summary = handle_summary(worker, event).await?;
    Ok(serde_json::to_value(&summary).unwrap_or(Value::Null))
}

/// [`handle`], returning the typed summary.
///
/// # Errors
///
/// [`TriggerError`] when the event cannot start a batch.
pub async fn handle_summary(
    worker: &LambdaWorker,
    event: LambdaEvent<Value>,
) -> Result<InvocationSummary, TriggerError> {
    let (payload, context) = event.into_parts();
    let request = trigger::parse_event(&payload, worker.settings().max_runs_per_invocation)?;
    let budget = Budget::from_epoch_ms(context.deadline, worker.settings().deadline_margin);
    let summary = invocation::run(worker, &context.request_id, budget, &request).await;
    info!(summary = %serde_json::to_string(&summary).unwrap_or_default(), "invocation summary");
    Ok(summary)
}
