//! The agent loop of `agent-with-tools` and `durable-agent`, written in the workflow: one agent
//! step per turn (`turn-N`), whose typed answer ([`Turn`]) asks for a tool or gives the final
//! answer; each tool call is a step of its own (`tool-N`); a tool that needs a human is preceded
//! by an approval (`approve-<tool>-N`).
//!
//! So every turn and every tool result is checkpointed by the API: a run handed back, or
//! suspended for the approval, resumes by replaying the completed turns from the store, and a
//! turn completed before that is never sent to the model again. A tool run inside the
//! provider's own loop (`AgentConfig::allow_tool`) could not do that, nor suspend the run for a
//! human: the provider's loop is one step.

use async_trait::async_trait;
use ironflow_core::error::OperationError;
use ironflow_core::operation::OperationContext;
use ironflow_core::retry::RetryPolicy;
use ironflow_engine::config::{AgentAnswer, AgentText, ApprovalConfig, Prompt};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_engine::operation::Operation;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ask;

/// Most turns (model calls) one run of an agent makes before failing.
pub const MAX_TURNS: u32 = 8;

/// What the model answers at each turn.
#[derive(Debug, Serialize, Deserialize, JsonSchema, AgentAnswer)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Turn {
    /// Call `tool` with `argument`; its result comes with the next turn's prompt.
    Tool {
        /// The tool to call.
        tool: ToolName,
        /// Its one argument.
        argument: AgentText,
    },
    /// The final answer: the loop ends.
    Answer {
        /// The answer to the user.
        text: AgentText,
    },
}

/// The example tools (each agent offers some of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, AgentAnswer)]
#[serde(rename_all = "snake_case")]
pub enum ToolName {
    /// Today's forecast for a city.
    Weather,
    /// A temperature in °C or °F converted to the other scale (`"21 c"`).
    Convert,
    /// An order's status and amount, by order id.
    LookupOrder,
    /// Refund an order in full, by order id: needs a human's approval.
    Refund,
}

impl ToolName {
    /// The name the model uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weather => "weather",
            Self::Convert => "convert",
            Self::LookupOrder => "lookup_order",
            Self::Refund => "refund",
        }
    }
}

/// The tools one agent offers. Implementations are deterministic example tools; a real one
/// would call a service (a tool step may also be `ctx.http` or a sub-workflow).
pub(super) trait Toolbox: Send + Sync {
    /// The tools offered, as the prompt lists them.
    fn describe(&self) -> &'static str;

    /// Whether `tool` runs only after a human approves it.
    fn needs_approval(&self, tool: ToolName) -> bool;

    /// The tool's result, or an error the model reads (not a step failure: the model may
    /// recover, e.g. by asking with another argument).
    fn run(&self, tool: ToolName, argument: &str) -> Result<String, String>;
}

/// Run the loop until the model answers: the answer and the number of turns it took.
///
/// # Errors
///
/// A step's error (the model call, the store), an approval still pending (the run suspends) or
/// refused, or [`EngineError::StepConfig`] when the model gives no answer in [`MAX_TURNS`].
pub(super) async fn run(
    ctx: &mut WorkflowContext,
    model: &str,
    task: &str,
    toolbox: &dyn Toolbox,
) -> Result<(AgentText, u32), EngineError> {
    let mut transcript = Prompt::new()
        .text("Work in turns. Each turn, answer with one JSON object: either")
        .text(r#"{"kind": "tool", "tool": <name>, "argument": <string>} to call one tool,"#)
        .text(r#"or {"kind": "answer", "text": <your final answer>}. The tools:"#)
        .text(toolbox.describe())
        .text("The task:")
        .untrusted(task);
    for turn in 1..=MAX_TURNS {
        let config = ask(&transcript.to_string(), model)
            .output::<Turn>()
            .retry_policy(RetryPolicy::new(2));
        match ctx.agent(&format!("turn-{turn}"), config).await? {
            Turn::Answer { text } => return Ok((text, turn)),
            Turn::Tool { tool, argument } => {
                if toolbox.needs_approval(tool) {
                    let message =
                        format!("Run {} with argument {:?}?", tool.as_str(), argument.raw());
                    let gate = format!("approve-{}-{turn}", tool.as_str());
                    ctx.approval(&gate, ApprovalConfig::new(&message)).await?;
                }
                let call = ToolCall {
                    toolbox,
                    tool,
                    argument: argument.raw(),
                };
                let result = ctx.operation(&format!("tool-{turn}"), &call).await?;
                let result = result
                    .output
                    .get("result")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                transcript = transcript
                    .text(&format!("Turn {turn}: you called {} with", tool.as_str()))
                    .untrusted(argument.raw())
                    .text("It returned:")
                    .untrusted(result);
            }
        }
    }
    Err(EngineError::StepConfig(format!(
        "{}: the model gave no answer in {MAX_TURNS} turns",
        ctx.workflow_name()
    )))
}

/// One tool call, as a step: its output `{"tool", "ok", "result"}` is stored, and replayed.
struct ToolCall<'a> {
    toolbox: &'a dyn Toolbox,
    tool: ToolName,
    argument: &'a str,
}

#[async_trait]
impl Operation for ToolCall<'_> {
    fn kind(&self) -> &str {
        "tool"
    }

    async fn execute(&self, _ctx: &OperationContext) -> Result<Value, OperationError> {
        let (ok, result) = match self.toolbox.run(self.tool, self.argument) {
            Ok(result) => (true, result),
            Err(error) => (false, format!("error: {error}")),
        };
        Ok(json!({"tool": self.tool.as_str(), "ok": ok, "result": result}))
    }

    fn input(&self) -> Option<Value> {
        Some(json!({"tool": self.tool.as_str(), "argument": self.argument}))
    }
}
