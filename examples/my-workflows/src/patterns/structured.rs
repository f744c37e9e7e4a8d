//! `structured-output`: a typed answer. The provider validates the model's answer against the
//! JSON schema of [`Ticket`] (ranges included); an answer that does not match is the step's
//! retryable error, so the step asks again, at most [`RETRIES`] more times, and the run fails
//! only when every answer was invalid.

use ironflow_core::retry::RetryPolicy;
use ironflow_engine::config::{AgentAnswer, AgentText, Prompt};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::models::Models;
use super::{ask, required_text};

/// How many times an invalid answer is asked again.
pub const RETRIES: u32 = 2;

/// A support ticket, as `extract` answers it.
#[derive(Debug, Serialize, Deserialize, JsonSchema, AgentAnswer)]
pub struct Ticket {
    /// The customer's name.
    pub customer: AgentText,
    /// The product concerned.
    pub product: AgentText,
    /// 1 (lowest) to 5 (urgent).
    #[schemars(range(min = 1, max = 5))]
    pub priority: u8,
    /// A one-sentence summary.
    pub summary: AgentText,
}

/// `structured-output`: `{"message": "…"}` → output: the [`Ticket`].
pub struct StructuredOutput;

impl WorkflowHandler for StructuredOutput {
    fn name(&self) -> &str {
        "structured-output"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, message) = required_text(ctx, "message").await?;
            let model = Models::of(&payload).main;
            let prompt = Prompt::new()
                .text("Turn this customer message into a support ticket.")
                .untrusted(&message);
            let config = ask(&prompt.to_string(), &model)
                .output::<Ticket>()
                .retry_policy(RetryPolicy::new(RETRIES));
            let ticket: Ticket = ctx.agent("extract", config).await?;
            ctx.set_output(&ticket)
        })
    }
}
