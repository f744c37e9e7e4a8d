//! `parallel-invocation`: one agent step per item, all in one parallel wave (`ctx.parallel`),
//! joined in the workflow. On resume, the wave's completed steps are replayed from the store
//! and only the others are sent to the model. For larger fan-outs, one sub-workflow per chunk
//! (`ctx.workflow`) keeps each run's step count bounded.

use std::collections::BTreeMap;

use ironflow_engine::config::{AgentAnswer, AgentStep, Prompt, StepConfig};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ask;
use super::models::Models;

/// Most items one run classifies (one agent step each, all at once).
pub const MAX_REVIEWS: usize = 20;

/// What each `classify-N` step answers.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    AgentAnswer,
)]
#[serde(rename_all = "snake_case")]
pub enum Sentiment {
    /// Satisfied.
    Positive,
    /// Neither.
    Neutral,
    /// Dissatisfied.
    Negative,
}

/// The answer's shape: an object, as Converse's structured output asks for.
#[derive(Debug, Deserialize, JsonSchema, AgentAnswer)]
pub struct Label {
    /// The review's sentiment.
    pub sentiment: Sentiment,
}

/// `parallel-invocation`: `{"reviews": ["…", …]}` → output `{"labels", "counts"}`.
pub struct ParallelInvocation;

impl WorkflowHandler for ParallelInvocation {
    fn name(&self) -> &str {
        "parallel-invocation"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let payload = ctx.payload().await?;
            let reviews = reviews(&payload)?;
            let model = Models::of(&payload).second;
            let names: Vec<String> = (0..reviews.len())
                .map(|i| format!("classify-{i}"))
                .collect();
            let steps = names
                .iter()
                .zip(&reviews)
                .map(|(name, review)| {
                    let prompt = Prompt::new()
                        .text("Classify the sentiment of this product review.")
                        .untrusted(review.as_str());
                    let config = ask(&prompt.to_string(), &model).output::<Label>();
                    (name.as_str(), StepConfig::Agent(config.into_config()))
                })
                .collect();
            let wave = ctx.parallel(steps, true).await?;
            let mut labels = Vec::with_capacity(wave.len());
            let mut counts = BTreeMap::new();
            for result in &wave {
                let label: Label = result.output.json()?;
                *counts.entry(label.sentiment).or_insert(0_u32) += 1;
                labels.push(label.sentiment);
            }
            ctx.set_output(&json!({"labels": labels, "counts": counts}))
        })
    }
}

/// The input's `reviews`: 1 to [`MAX_REVIEWS`] strings.
fn reviews(payload: &Value) -> Result<Vec<String>, EngineError> {
    let bad = || {
        EngineError::StepConfig(format!(
            "parallel-invocation: the input needs \"reviews\", a list of 1 to {MAX_REVIEWS} strings"
        ))
    };
    let items = payload
        .get("reviews")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    if items.is_empty() || items.len() > MAX_REVIEWS {
        return Err(bad());
    }
    items
        .iter()
        .map(|item| item.as_str().map(str::to_string).ok_or_else(bad))
        .collect()
}
