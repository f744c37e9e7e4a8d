//! `llm-as-judge`: two models answer the same question in parallel (one wave of two agent
//! steps), then a judge picks the better answer. A run handed back during the wave replays the
//! candidate that completed and asks again only the one that did not.

use ironflow_engine::config::{AgentAnswer, AgentText, Prompt, StepConfig};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::models::Models;
use super::{ask, required_text};

/// The judge's answer.
#[derive(Debug, Deserialize, JsonSchema, AgentAnswer)]
pub struct Verdict {
    /// The better answer: 1 or 2.
    #[schemars(range(min = 1, max = 2))]
    pub best: u8,
    /// Why, in one sentence.
    pub reason: AgentText,
}

/// `llm-as-judge`: `{"question": "…"}` → output `{"answers", "best", "model", "reason"}`.
pub struct LlmAsJudge;

impl WorkflowHandler for LlmAsJudge {
    fn name(&self) -> &str {
        "llm-as-judge"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, question) = required_text(ctx, "question").await?;
            let models = Models::of(&payload);
            let prompt = Prompt::new()
                .text("Answer this question in at most 100 words.")
                .untrusted(&question)
                .to_string();
            let candidates = [&models.main, &models.second];
            let wave = ctx
                .parallel(
                    vec![
                        (
                            "candidate-main",
                            StepConfig::Agent(ask(&prompt, candidates[0])),
                        ),
                        (
                            "candidate-second",
                            StepConfig::Agent(ask(&prompt, candidates[1])),
                        ),
                    ],
                    true,
                )
                .await?;
            let answers: Vec<AgentText> = wave.iter().map(|r| r.output.text()).collect();
            let prompt = Prompt::new()
                .text("Which answer to the question is more accurate and clearer? Question:")
                .untrusted(&question)
                .text("Answer 1:")
                .untrusted(&answers[0])
                .text("Answer 2:")
                .untrusted(&answers[1])
                .to_string();
            let verdict: Verdict = ctx
                .agent("judge", ask(&prompt, &models.main).output::<Verdict>())
                .await?;
            let index = usize::from(verdict.best).checked_sub(1).filter(|i| *i < 2);
            let index = index.ok_or_else(|| {
                EngineError::StepConfig(format!("judge: answer {} does not exist", verdict.best))
            })?;
            ctx.set_output(&json!({
                "answers": answers.iter().map(AgentText::raw).collect::<Vec<_>>(),
                "best": verdict.best,
                "model": candidates[index],
                "reason": verdict.reason.raw(),
            }))
        })
    }
}
