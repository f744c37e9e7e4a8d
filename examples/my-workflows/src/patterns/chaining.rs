//! `prompt-chaining`: each call's answer is the next call's input (outline → draft → polish).

use ironflow_engine::config::{AgentStepConfig, Prompt};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use serde_json::json;

use super::models::Models;
use super::required_text;

/// `prompt-chaining`: `{"topic": "…"}` → output `{"outline", "draft", "final"}`.
pub struct PromptChaining;

impl WorkflowHandler for PromptChaining {
    fn name(&self) -> &str {
        "prompt-chaining"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let (payload, topic) = required_text(ctx, "topic").await?;
            let model = Models::of(&payload).main;
            // The topic comes from whoever created the run: it enters prompts as data.
            let prompt = Prompt::new()
                .text("Write a three-point outline of a short article on this topic.")
                .untrusted(&topic);
            // One model call, stored as a step: a resumed run never sends it again.
            let step = |prompt: Prompt| AgentStepConfig::new(&prompt.to_string()).model(&model);
            let outline = ctx.agent("outline", step(prompt)).await?;
            // A model's answer is untrusted too (it may repeat text planted in its input).
            let prompt = Prompt::new()
                .text("Write the article this outline describes, in at most 200 words.")
                .untrusted(outline.text());
            let draft = ctx.agent("draft", step(prompt)).await?;
            let prompt = Prompt::new()
                .text("Tighten this article: same content, plainer words, at most 150 words.")
                .untrusted(draft.text());
            let polished = ctx.agent("polish", step(prompt)).await?;
            ctx.set_output(&json!({
                "outline": outline.text().raw(),
                "draft": draft.text().raw(),
                "final": polished.text().raw(),
            }))
        })
    }
}
