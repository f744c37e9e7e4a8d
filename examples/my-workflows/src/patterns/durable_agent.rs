//! `durable-agent`: a support agent over several turns (the [agent loop](super::agent_loop))
//! whose `refund` tool runs only after a human approves it: the run suspends between two turns
//! (`approve-refund-N`), holds no invocation while it waits, and resumes by replay, the turns
//! before the approval not sent to the model again.

use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use serde_json::json;

use super::agent_loop::{self, ToolName, Toolbox};
use super::models::Models;
use super::required_text;

/// `durable-agent`: `{"request": "…"}` → output `{"answer", "turns"}`.
pub struct DurableAgent;

impl WorkflowHandler for DurableAgent {
    fn name(&self) -> &str {
        "durable-agent"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, request) = required_text(ctx, "request").await?;
            let model = Models::of(&payload).main;
            let (answer, turns) = agent_loop::run(ctx, &model, &request, &Orders).await?;
            ctx.set_output(&json!({"answer": answer.raw(), "turns": turns}))
        })
    }
}

/// Canned orders: (id, status, amount in cents).
const ORDERS: &[(&str, &str, u64)] = &[
    ("A-100", "delivered", 4200),
    ("A-200", "delivered damaged", 1999),
];

struct Orders;

impl Toolbox for Orders {
    fn describe(&self) -> &'static str {
        "lookup_order (argument: an order id; answers its status and amount), \
         refund (argument: an order id; refunds it in full after a human approves)"
    }

    fn needs_approval(&self, tool: ToolName) -> bool {
        tool == ToolName::Refund
    }

    fn run(&self, tool: ToolName, argument: &str) -> Result<String, String> {
        let order = ORDERS
            .iter()
            .find(|(id, _, _)| argument.trim().eq_ignore_ascii_case(id))
            .ok_or_else(|| format!("no order {argument:?}"));
        match tool {
            ToolName::LookupOrder => {
                order.map(|(id, status, cents)| format!("{id}: {status}, {cents} cents"))
            }
            ToolName::Refund => order.map(|(id, _, cents)| format!("{id}: refunded {cents} cents")),
            other => Err(format!("this agent has no tool {}", other.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_refund_waits_for_a_human() {
        assert!(Orders.needs_approval(ToolName::Refund));
        assert!(!Orders.needs_approval(ToolName::LookupOrder));
        assert_eq!(
            Orders.run(ToolName::LookupOrder, "a-200"),
            Ok("A-200: delivered damaged, 1999 cents".into())
        );
        assert!(Orders.run(ToolName::Refund, "B-1").is_err());
        assert!(Orders.run(ToolName::Weather, "A-100").is_err());
    }
}
