//! The Lambda function handler: the one code path both the Lambda runtime
//! (`src/bin/ironflow-lambda.rs`) and the local runner drive.
//!
//! ```text
//! event ──trigger──▶ Schedule │ Direct            ──▶ one batch ──▶ summary JSON
//!                    Sqs (wake-ups, rejected)     ──▶ one batch ──▶ {"batchItemFailures": [...]}
//!                    Webhook (Function URL)       ──▶ wake-ups  ──▶ {"statusCode": 202, ...}
//!                    invalid                      ──▶ error, nothing claimed
//! ```
//!
//! When the handler returns an error: [`HandlerError`].
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use aws_lambda_events::event::sqs::SqsBatchResponse;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::Value;
use tracing::{info, trace, warn};

use crate::deadline::{self, Budget};
use crate::invocation::{self, Invoked};
use crate::report::{BatchRequest, InvocationSummary, StopReason};
use crate::settings::FunctionRole;
use crate::trigger::{self, SqsWakeUps, Trigger, TriggerError};
use crate::webhook::{self, Answer};
use crate::worker::LambdaWorker;

/// What the handler answers.
#[derive(Debug, Clone)]
pub enum Response {
    /// A schedule tick or a direct invocation: the batch's summary.
    Summary(InvocationSummary),
    /// An SQS event: the partial batch response, and the summary of the batch (`None` when no
    /// record was a valid wake-up, so no batch ran).
    Sqs {
        /// `{"batchItemFailures": [{"itemIdentifier": "<messageId>"}]}`.
        batch_response: SqsBatchResponse,
        /// The batch's summary, logged.
        summary: Option<InvocationSummary>,
    },
    /// A Function URL request (the ironflow API's webhook): the receiver's answer
    /// ([`WebhookAnswer`](crate::WebhookAnswer)), no batch.
    Webhook(Answer),
}

impl Response {
    /// The JSON returned to Lambda: the summary, or exactly the partial batch response.
    pub fn to_json(&self) -> Value {
        let json = match self {
            Self::Summary(summary) => serde_json::to_value(summary),
            Self::Sqs { batch_response, .. } => serde_json::to_value(batch_response),
            Self::Webhook(answer) => serde_json::to_value(answer.to_response()),
        };
        json.unwrap_or(Value::Null)
    }

    /// The batch's summary, when a batch ran.
    pub fn summary(&self) -> Option<&InvocationSummary> {
        match self {
            Self::Summary(summary) => Some(summary),
            Self::Sqs { summary, .. } => summary.as_ref(),
            Self::Webhook(_) => None,
        }
    }
}

/// The invocation fails.
///
/// **When the handler returns an error.** An invalid event (nothing claimed), an event the
/// function's role does not serve ([`NotForThisRole`](Self::NotForThisRole): the webhook receiver,
/// `IRONFLOW_FUNCTION_ROLE=webhook-receiver`, serves Function URL requests only), an SQS record
/// without a message id (on purpose: it cannot be reported, so SQS retries the whole batch), and
/// a schedule or direct invocation whose batch could not run at all: nothing was claimed because
/// a claim failed (API unreachable, auth refused) or no time was left. Such an error shows in the
/// function's `Errors` metric and reaches an asynchronous invocation's on-failure destination.
/// A batch that ran is never an error, whatever became of its runs (failed runs, a claim error
/// after some claims, a wake-up that could not be sent): the summary reports them, and a retry
/// by Lambda would only claim more runs. For SQS, a batch that could not run lists every record
/// in `batchItemFailures` (SQS retries them) instead of failing the invocation.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The event cannot start a batch; nothing was claimed.
    #[error(transparent)]
    InvalidEvent(#[from] TriggerError),
    /// An event this function's role does not serve: the webhook receiver
    /// (`IRONFLOW_FUNCTION_ROLE=webhook-receiver`) answers Function URL requests only.
    #[error(
        "this function is the webhook receiver (IRONFLOW_FUNCTION_ROLE={role}): it answers \
         Function URL requests only, and this event is {what}; schedule ticks, wake-ups and \
         direct invocations go to the worker function"
    )]
    NotForThisRole {
        /// The function's role.
        role: FunctionRole,
        /// What the event looks like.
        what: &'static str,
    },
    /// A schedule or direct invocation whose batch could not run at all.
    #[error("the batch could not run: {reason} (request {request_id}; its summary is in the log)")]
    BatchNotRun {
        /// Lambda's request id.
        request_id: String,
        /// Why (the claim error, or the lack of time).
        reason: String,
        /// The batch's summary (nothing claimed, `stop_reason` `claim_error` or `cutoff`).
        summary: Box<InvocationSummary>,
    },
}

impl From<HandlerError> for lambda_runtime::Diagnostic {
    fn from(e: HandlerError) -> Self {
        match e {
            HandlerError::InvalidEvent(e) => e.into(),
            e @ HandlerError::NotForThisRole { .. } => Self {
                error_type: "NotForThisRole".to_string(),
                error_message: e.to_string(),
            },
            e @ HandlerError::BatchNotRun { .. } => Self {
                error_type: "BatchNotRun".to_string(),
                error_message: e.to_string(),
            },
        }
    }
}

/// Handle one invocation event and return the JSON Lambda sends back: the summary for a
/// schedule or direct invocation, the partial batch response for SQS.
///
/// # Errors
///
/// [`HandlerError`], which says when.
pub async fn handle(
    worker: &LambdaWorker,
    event: LambdaEvent<Value>,
) -> Result<Value, HandlerError> {
    handle_response(worker, event)
        .await
        .map(|response| response.to_json())
}

/// [`handle`], returning the typed response.
///
/// # Errors
///
/// [`HandlerError`], which says when.
pub async fn handle_response(
    worker: &LambdaWorker,
    event: LambdaEvent<Value>,
) -> Result<Response, HandlerError> {
    let (payload, context) = event.into_parts();
    refuse_outside_role(
        worker.settings().function_role,
        &payload,
        &context.request_id,
    )?;
    let trigger = match trigger::parse_event(&payload, worker.settings().max_runs_per_invocation) {
        Ok(trigger) => trigger,
        Err(e) => {
            warn!(request_id = %context.request_id, error = %e, "invalid event: nothing claimed");
            return Err(e.into());
        }
    };
    let kind = match &trigger {
        Trigger::Webhook(_) => "function_url",
        Trigger::Schedule(_) => "schedule",
        Trigger::Direct(_) => "direct",
        Trigger::Sqs(_) => "sqs",
    };
    // Never the event itself: it may carry the webhook's token or signature.
    trace!(request_id = %context.request_id, kind, "event parsed");
    match trigger {
        Trigger::Webhook(request) => {
            // Counted in flight until answered: a retiring process does not end under it
            // (crate::layers::ExitWhenStuck).
            let _held = worker.admission.hold_request();
            let invocation = webhook::Invocation {
                request_id: &context.request_id,
                trace_id: context.xray_trace_id.as_deref(),
                // Answered within milliseconds: its calls end well before the deadline.
                until: deadline::webhook_until(context.deadline),
            };
            let answer = webhook::receive(worker.webhook(), &request, invocation).await;
            Ok(Response::Webhook(answer))
        }
        Trigger::Schedule(tick) => {
            info!(time = %tick.time, rule = tick.rule.as_deref().unwrap_or(""), "schedule tick");
            one_batch(worker, &context, &BatchRequest::default()).await
        }
        Trigger::Direct(direct) => {
            info!(
                max_runs = direct.request.max_runs,
                reason = direct.reason.as_deref().unwrap_or(""),
                "direct invocation"
            );
            one_batch(worker, &context, &direct.request).await
        }
        Trigger::Sqs(wake_ups) => Ok(sqs_batch(worker, &context, &wake_ups).await),
    }
}

/// An SQS event (wake-ups): one batch for its valid records, and the partial batch response.
async fn sqs_batch(worker: &LambdaWorker, context: &Context, wake_ups: &SqsWakeUps) -> Response {
    for rejected in &wake_ups.rejected {
        warn!(message_id = %rejected.message_id, error = %rejected.error,
            "malformed wake-up: reported as a batch item failure");
    }
    for w in &wake_ups.accepted {
        info!(message_id = %w.message_id, max_runs = w.max_runs,
            reason = w.reason.as_deref().unwrap_or(""), "wake-up");
    }
    let mut batch_response = SqsBatchResponse::default();
    let Some(request) = wake_ups.batch_request() else {
        batch_response.set_failures(wake_ups.rejected.iter().map(|r| &r.message_id));
        return Response::Sqs {
            batch_response,
            summary: None,
        };
    };
    let summary = run_batch(worker, context, &request).await;
    match could_not_run(&summary) {
        Some(reason) => {
            warn!(error = %reason, records = wake_ups.accepted.len() + wake_ups.rejected.len(),
                "the batch could not run: every record is reported for SQS to retry");
            batch_response.set_failures(wake_ups.all_message_ids());
        }
        None => {
            batch_response.set_failures(wake_ups.rejected.iter().map(|r| &r.message_id));
        }
    }
    Response::Sqs {
        batch_response,
        summary: Some(summary),
    }
}

/// The summary of the event's batch, whatever became of it: a batch that could not run is a
/// summary here, not an error (that is [`handle`]'s response policy). For tests and tools that
/// look at the batch rather than at Lambda's response.
///
/// # Errors
///
/// [`TriggerError`] when the event cannot start a batch, including an SQS event none of whose
/// records is a valid wake-up (no batch runs).
pub async fn handle_summary(
    worker: &LambdaWorker,
    event: LambdaEvent<Value>,
) -> Result<InvocationSummary, TriggerError> {
    match handle_response(worker, event).await {
        Ok(response) => response
            .summary()
            .cloned()
            .ok_or_else(|| TriggerError::Unsupported {
                what: match response {
                    Response::Webhook(_) => {
                        "a webhook request: the receiver answers it, no batch runs"
                    }
                    _ => "no record of this SQS event is a valid wake-up: no batch ran",
                }
                .into(),
            }),
        Err(HandlerError::BatchNotRun { summary, .. }) => Ok(*summary),
        Err(HandlerError::InvalidEvent(e)) => Err(e),
        Err(e @ HandlerError::NotForThisRole { .. }) => Err(TriggerError::Unsupported {
            what: e.to_string(),
        }),
    }
}

/// The webhook receiver's role serves Function URL requests only: anything else is refused
/// here, before the event is parsed or any call is made.
fn refuse_outside_role(
    role: FunctionRole,
    payload: &Value,
    request_id: &str,
) -> Result<(), HandlerError> {
    if role != FunctionRole::WebhookReceiver || trigger::is_function_url_request(payload) {
        return Ok(());
    }
    let what = match payload {
        Value::Object(o) if o.contains_key("Records") => "an SQS event (wake-ups)",
        Value::Object(o) if o.contains_key("detail-type") => "an EventBridge event (schedule)",
        Value::Object(_) => "a direct invocation",
        _ => "not a JSON object",
    };
    let e = HandlerError::NotForThisRole { role, what };
    warn!(request_id, error = %e, "event refused: not for this function's role");
    Err(e)
}

/// A schedule tick or direct invocation: the batch, and an error when it could not run.
async fn one_batch(
    worker: &LambdaWorker,
    context: &Context,
    request: &BatchRequest,
) -> Result<Response, HandlerError> {
    let summary = run_batch(worker, context, request).await;
    match could_not_run(&summary) {
        Some(reason) => Err(HandlerError::BatchNotRun {
            request_id: context.request_id.clone(),
            reason,
            summary: Box::new(summary),
        }),
        None => Ok(Response::Summary(summary)),
    }
}

async fn run_batch(
    worker: &LambdaWorker,
    context: &Context,
    request: &BatchRequest,
) -> InvocationSummary {
    let settings = worker.settings();
    let budget = Budget::for_context(
        context.deadline,
        settings.deadline_margin,
        settings.min_claim_budget,
        settings.emulated_invocation,
    );
    let invoked = Invoked {
        request_id: &context.request_id,
        trace_id: context.xray_trace_id.as_deref(),
    };
    let summary = invocation::run(worker, invoked, budget, request).await;
    info!(summary = %serde_json::to_string(&summary).unwrap_or_default(), "invocation summary");
    summary
}

/// Why the batch could not run at all, if it could not: nothing claimed, and the claim loop
/// stopped on a claim error (API unreachable, auth refused) or for lack of time.
pub fn could_not_run(summary: &InvocationSummary) -> Option<String> {
    if summary.claimed > 0 || !summary.stop_reason.could_not_run() {
        return None;
    }
    match summary.stop_reason {
        StopReason::ClaimError => Some(if summary.errors.is_empty() {
            "a claim failed".to_string()
        } else {
            summary.errors.join("; ")
        }),
        StopReason::Cutoff => Some(
            "no time left to claim a run before the cutoff (deadline − IRONFLOW_DEADLINE_MARGIN_MS − IRONFLOW_MIN_CLAIM_BUDGET_MS)"
                .to_string(),
        ),
        StopReason::Retiring => Some(
            "the process is retiring (an execution is stuck in workflow code): nothing claimed; \
             Lambda retries the event in another execution environment"
                .to_string(),
        ),
        StopReason::MaxRuns | StopReason::NoPendingRun => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Poll;

    use ironflow_core::providers::claude::ClaudeCodeProvider;
    use serde_json::json;

    use super::*;
    use crate::settings::{WakeSettings, WebhookSecret};
    use crate::wake::{LocalWakeQueue, Waker};

    const SECRET: &str = "a-webhook-secret-of-at-least-32-characters";

    /// A webhook request whose pending count hangs (an API that takes connections and never
    /// answers) is in flight: a process retiring meanwhile counts it, and ends only once it is
    /// answered (`crate::layers::ExitWhenStuck`).
    #[tokio::test]
    async fn a_webhook_request_in_flight_holds_a_retiring_process() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api_url = format!("http://{}", silent.local_addr().unwrap());
        let worker = crate::LambdaWorkerBuilder::new(&api_url, "token")
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(crate::samples::QuickShell)
            .webhook_secret(SECRET)
            .wake_ups(Waker::to_queue(
                Arc::new(LocalWakeQueue::new()),
                WakeSettings::new("local"),
            ))
            .build()
            .unwrap();
        let body = json!({"type": "run_created", "workflow_name": "quick-shell", "at": chrono::Utc::now()})
            .to_string();
        let signature = crate::webhook::auth::sign(&WebhookSecret::new(SECRET), body.as_bytes());
        let request = json!({
            "version": "2.0", "rawPath": "/", "rawQueryString": "",
            "headers": {"x-signature-256": signature}, "queryStringParameters": {},
            "requestContext": {"http": {"method": "POST", "path": "/"}, "timeEpoch": 0},
            "body": body, "isBase64Encoded": false,
        });
        let mut context = Context::default();
        context.deadline = u64::MAX;
        let mut answering = Box::pin(handle_response(&worker, LambdaEvent::new(request, context)));
        // One poll: the request is under way, waiting for the API.
        std::future::poll_fn(|cx| {
            assert!(
                answering.as_mut().poll(cx).is_pending(),
                "the API never answers"
            );
            Poll::Ready(())
        })
        .await;
        assert_eq!(
            worker.admission.retire(),
            1,
            "the request holds the process"
        );
        drop(answering);
        assert_eq!(
            worker.admission.retire(),
            0,
            "answered (or dropped): none left"
        );
    }
}
