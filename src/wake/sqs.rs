//! The SQS wake queue: the deployed function's ([`WakeQueue`] over `aws_sdk_sqs`).

use async_trait::async_trait;
use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};

use super::WakeQueue;
use crate::settings::MAX_WAKEUPS_PER_INVOCATION_LIMIT;

/// The header that carries an invocation's X-Ray trace id on its wake-ups.
const TRACE_HEADER: &str = "x-amzn-trace-id";

/// An SQS queue (`IRONFLOW_WAKE_QUEUE_URL`) reached with one client.
#[derive(Debug, Clone)]
pub struct SqsWakeQueue {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsWakeQueue {
    /// The queue at `queue_url`, through `sqs`.
    pub fn new(sqs: aws_sdk_sqs::Client, queue_url: &str) -> Self {
        Self {
            sqs,
            queue_url: queue_url.to_string(),
        }
    }
}

#[async_trait]
impl WakeQueue for SqsWakeQueue {
    /// `ApproximateNumberOfMessages`: the visible ones.
    async fn depth(&self) -> Result<u64, String> {
        // The SDK's futures are deep: boxed, they keep the handler's future within the
        // compiler's layout depth.
        let output = Box::pin(
            self.sqs
                .get_queue_attributes()
                .queue_url(&self.queue_url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .send(),
        )
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
        Ok(output
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0))
    }

    /// One `SendMessageBatch`; the trace header set on the request (the SDK's
    /// recursion-detection interceptor leaves a header that is already there).
    async fn send(
        &self,
        count: usize,
        body: &str,
        delay_secs: u64,
        trace_id: Option<&str>,
    ) -> (usize, Vec<String>) {
        let delay = i32::try_from(delay_secs).unwrap_or(0);
        let mut entries = Vec::with_capacity(count);
        for i in 0..count.min(MAX_WAKEUPS_PER_INVOCATION_LIMIT) {
            match SendMessageBatchRequestEntry::builder()
                .id(format!("wake-{i}"))
                .message_body(body)
                .delay_seconds(delay)
                .build()
            {
                Ok(entry) => entries.push(entry),
                Err(e) => return (0, vec![format!("building a wake-up failed: {e}")]),
            }
        }
        let trace = trace_id.map(str::to_string);
        let sent = self
            .sqs
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .customize()
            .mutate_request(move |request| {
                // A value that cannot be a header (Lambda's never is) is left out.
                if let Some(trace) = &trace {
                    let _ = request
                        .headers_mut()
                        .try_insert(TRACE_HEADER, trace.clone());
                }
            })
            .send();
        let output = match Box::pin(sent).await {
            Ok(output) => output,
            Err(e) => {
                return (
                    0,
                    vec![format!(
                        "sending wake-ups failed: {}",
                        aws_sdk_sqs::error::DisplayErrorContext(e)
                    )],
                );
            }
        };
        let errors = output
            .failed()
            .iter()
            .map(|f| {
                format!(
                    "wake-up {} refused: {} {}",
                    f.id(),
                    f.code(),
                    f.message().unwrap_or("")
                )
            })
            .collect();
        (output.successful().len(), errors)
    }
}
