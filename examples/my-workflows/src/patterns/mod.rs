//! The seven AI workflow patterns of AWS's sample of AI workflows on Lambda durable functions,
//! as ironflow workflows on Amazon Bedrock: every model call is an agent step, checkpointed by
//! the API, so a run handed back at the end of an invocation, or suspended for a human, resumes
//! without sending a completed call to the model again (docs/agents.md).
//!
//! | name | input | steps (model calls) |
//! |---|---|---|
//! | `prompt-chaining` | `{"topic": "…"}` | `outline`, `draft`, `polish` |
//! | `human-review` | `{"document": "…"}` | `extract`, `review` (an approval), `confirm` |
//! | `llm-as-judge` | `{"question": "…"}` | `candidate-main` and `candidate-second` in parallel, `judge` |
//! | `agent-with-tools` | `{"question": "…"}` | `turn-1`, `tool-1`, `turn-2`, … until an answer |
//! | `durable-agent` | `{"request": "…"}` | as above; a refund waits for `approve-refund-N` first |
//! | `parallel-invocation` | `{"reviews": ["…", …]}` (1 to 20) | `classify-0` … `classify-N` in parallel |
//! | `structured-output` | `{"message": "…"}` | `extract`, its answer checked against its schema |
//!
//! Each also takes `model` and `second_model` (see [`models`]). Each sets the run's output
//! (`ctx.set_output`) to what it produced.

mod agent_loop;
mod chaining;
mod durable_agent;
mod fan_out;
mod judge;
pub mod models;
mod review;
mod structured;
mod tools;

pub use agent_loop::{MAX_TURNS, ToolName, Turn};
pub use chaining::PromptChaining;
pub use durable_agent::DurableAgent;
pub use fan_out::{Label, MAX_REVIEWS, ParallelInvocation, Sentiment};
pub use judge::{LlmAsJudge, Verdict};
pub use review::{HumanReview, Invoice};
pub use structured::{RETRIES, StructuredOutput, Ticket};
pub use tools::AgentWithTools;

use ironflow_engine::config::AgentStepConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_lambda::LambdaWorkerBuilder;
use serde_json::Value;

/// Register the seven patterns on `worker`.
pub fn register(worker: LambdaWorkerBuilder) -> LambdaWorkerBuilder {
    worker
        .register(PromptChaining)
        .register(HumanReview)
        .register(LlmAsJudge)
        .register(AgentWithTools)
        .register(DurableAgent)
        .register(ParallelInvocation)
        .register(StructuredOutput)
}

/// An agent step asking `model` one `prompt`. A step interrupted by the end of an invocation is
/// asked the same prompt again by the next one (the providers keep no session to resume).
fn ask(prompt: &str, model: &str) -> AgentStepConfig {
    AgentStepConfig::new(prompt).model(model)
}

/// The string field `field` of the run's input, or a step error naming it.
async fn required_text(ctx: &WorkflowContext, field: &str) -> Result<(Value, String), EngineError> {
    let payload = ctx.payload().await?;
    let text = payload
        .get(field)
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .map(str::to_string)
        .ok_or_else(|| {
            EngineError::StepConfig(format!(
                "{}: the input needs a non-empty string \"{field}\"",
                ctx.workflow_name()
            ))
        })?;
    Ok((payload, text))
}
