//! The agent workflow the agent rows drain ([`AgentRun`]: three model calls), the provider its
//! steps call and the cutoff-aware switch: what the drains register, apart from the rows that
//! measure it.

use aws_sdk_dynamodb::config::{Credentials, Region, SharedCredentialsProvider};
use ironflow_engine::config::AgentStepConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::{BedrockProvider, LambdaWorkerBuilder};

/// The agent workflow's name.
pub const WORKFLOW: &str = "bench-agent-3";

/// The model id the steps ask for (any id: the script answers every one).
pub const MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// The step names, one model call each.
pub const STEPS: [&str; 3] = ["plan", "act", "answer"];

/// Three agent steps, one model call each, each answer the next prompt's input (the
/// `prompt-chaining` pattern's shape).
pub struct AgentRun;

impl WorkflowHandler for AgentRun {
    fn name(&self) -> &str {
        WORKFLOW
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let mut input = "a short report on the backlog".to_string();
            for step in STEPS {
                let prompt = format!("{step}: {input}");
                let answer = ctx
                    .agent(step, AgentStepConfig::new(&prompt).model(MODEL))
                    .await?;
                input = answer.text().raw().chars().take(200).collect();
            }
            Ok(())
        })
    }
}

/// The Bedrock provider pointed at the model server at `url` (any credentials: the server
/// verifies no signature).
pub fn provider(url: &str) -> BedrockProvider {
    let aws = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "bench", "bench", None, None, "bench",
        )))
        .endpoint_url(url)
        .build();
    BedrockProvider::new(&aws)
}

/// `builder` with cutoff-aware step starts on or off.
pub fn cutoff_aware(builder: LambdaWorkerBuilder, on: bool) -> LambdaWorkerBuilder {
    builder.cutoff_aware_starts(on)
}
