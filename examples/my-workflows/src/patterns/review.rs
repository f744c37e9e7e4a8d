//! `human-review`: a model extracts an invoice's fields, a human approves them
//! (`ctx.approval`), then a model writes the confirmation.
//!
//! While the approval is pending the run is `AwaitingApproval`: no invocation holds it and
//! nothing is billed. Approving it (`POST /api/v1/runs/{id}/approve`) moves it back to
//! `Pending`; with the webhook receiver an invocation claims it within about a second
//! (docs/push.md), otherwise at the next schedule tick. The resumed run replays `extract` from
//! the store: the model is not asked again.

use ironflow_engine::config::{AgentAnswer, AgentText, ApprovalConfig, Prompt};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::models::Models;
use super::{ask, required_text};

/// The fields `extract` answers with (a schema-checked answer, see `structured-output`).
#[derive(Debug, Serialize, Deserialize, JsonSchema, AgentAnswer)]
pub struct Invoice {
    /// Who sent the invoice.
    pub vendor: AgentText,
    /// The amount due, in cents.
    pub total_cents: u64,
    /// The due date, as written on the invoice.
    pub due: AgentText,
}

/// `human-review`: `{"document": "…"}` → output `{"invoice", "confirmation"}`.
pub struct HumanReview;

impl WorkflowHandler for HumanReview {
    fn name(&self) -> &str {
        "human-review"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, document) = required_text(ctx, "document").await?;
            let model = Models::of(&payload).main;
            let prompt = Prompt::new()
                .text("Extract the vendor, the total in cents and the due date of this invoice.")
                .untrusted(&document);
            let invoice: Invoice = ctx
                .agent(
                    "extract",
                    ask(&prompt.to_string(), &model).output::<Invoice>(),
                )
                .await?;
            // Suspends the run until a human approves; a rejection fails it.
            let message = format!(
                "Pay {} cents by {} to {}?",
                invoice.total_cents,
                invoice.due.raw(),
                invoice.vendor.raw()
            );
            ctx.approval("review", ApprovalConfig::new(&message))
                .await?;
            let prompt = Prompt::new()
                .text(
                    "Write a one-line note to accounting that this approved invoice is to be paid.",
                )
                .untrusted(invoice.vendor.raw());
            let confirmation = ctx
                .agent("confirm", ask(&prompt.to_string(), &model))
                .await?;
            ctx.set_output(&json!({
                "invoice": invoice,
                "confirmation": confirmation.text().raw(),
            }))
        })
    }
}
