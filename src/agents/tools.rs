//! The tools a step's model may call, from ironflow-core's [`ToolRegistry`]: offered in the
//! Converse request's tool configuration, run here between two model calls, their results sent
//! back in the next call.
//!
//! A step sees the provider's default registry, or the one registered under the
//! [`ToolProfile`] it selects (`AgentConfig::tool_profile`); an unknown profile fails the step
//! before any call (never another profile's tools). Calls run in the model's order, as ironflow's
//! HTTP providers run them: a run of consecutive read-only tools (`Tool::read_only`) at once, at
//! most `AgentConfig::max_parallel_tools` (default 4) together; any other tool alone, after the
//! previous ones ended. An unknown tool, or a tool that fails, answers the model with an error result; it does
//! not end the step. A tool runs inside the provider's loop: it cannot suspend the run (a tool
//! that needs a human belongs between two steps, as `ctx.approval`).

use std::collections::BTreeMap;

use aws_sdk_bedrockruntime::types::{
    ContentBlock, Tool, ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolResultStatus,
    ToolSpecification, ToolUseBlock,
};
use futures_util::future::join_all;
use ironflow_core::error::AgentError;
use ironflow_core::provider::ToolProfile;
use ironflow_core::providers::http::tools::ToolRegistry;
use ironflow_core::providers::http::tools::routing::route_tool_call;
use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::debug;

use super::calls::refused;
use super::document::{to_document, to_value};

/// The name of the tool a model without native structured output answers through.
pub(crate) const ANSWER_TOOL: &str = "structured_output";

/// The registries a provider offers: its default one and its named profiles.
#[derive(Default)]
pub(crate) struct ToolProfiles {
    pub default: Option<ToolRegistry>,
    pub named: BTreeMap<ToolProfile, ToolRegistry>,
}

impl ToolProfiles {
    /// The registry of a step selecting `profile` (`None`: the default one, if any).
    ///
    /// # Errors
    ///
    /// [`AgentError::UnknownToolProfile`] when no profile has that name.
    pub fn select(
        &self,
        profile: Option<&ToolProfile>,
    ) -> Result<Option<&ToolRegistry>, AgentError> {
        match profile {
            None => Ok(self.default.as_ref().filter(|r| !r.is_empty())),
            Some(name) => {
                self.named
                    .get(name)
                    .map(Some)
                    .ok_or_else(|| AgentError::UnknownToolProfile {
                        profile: name.to_string(),
                        available: self.named.keys().map(ToolProfile::to_string).collect(),
                    })
            }
        }
    }
}

/// A tool specification for Converse.
fn spec(name: &str, description: &str, schema: &Value, model: &str) -> Result<Tool, AgentError> {
    ToolSpecification::builder()
        .name(name)
        .description(description)
        .input_schema(ToolInputSchema::Json(to_document(schema)))
        .build()
        .map(Tool::ToolSpec)
        .map_err(|e| {
            refused(
                400,
                "InvalidTool",
                format!("tool '{name}' for Bedrock model '{model}': {e}"),
            )
        })
}

/// The specifications of `registry`'s tools.
pub(crate) fn specs(registry: &ToolRegistry, model: &str) -> Result<Vec<Tool>, AgentError> {
    registry
        .to_anthropic_tools()
        .iter()
        .map(|t| {
            let text = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or_default();
            spec(text("name"), text("description"), &t["input_schema"], model)
        })
        .collect()
}

/// The tool the model answers through when it has no native structured output.
pub(crate) fn answer_spec(schema: &Value, model: &str) -> Result<Tool, AgentError> {
    spec(
        ANSWER_TOOL,
        "Give the final answer, in the requested JSON schema.",
        schema,
        model,
    )
}

/// Run the tool calls `calls` with `registry` (see the module docs; at most `max_parallel`
/// read-only ones at once): one tool result block each, in the calls' order.
pub(crate) async fn run(
    registry: &ToolRegistry,
    calls: &[&ToolUseBlock],
    max_parallel: usize,
) -> Vec<ContentBlock> {
    let mut outcomes = Vec::with_capacity(calls.len());
    let mut rest = calls;
    while let Some(first) = rest.first() {
        let group = if registry.is_read_only(first.name()) {
            rest.iter()
                .take_while(|c| registry.is_read_only(c.name()))
                .count()
        } else {
            1
        };
        let (now, later) = rest.split_at(group);
        let permits = Semaphore::new(max_parallel.max(1));
        outcomes.extend(
            join_all(now.iter().map(|call| async {
                // The semaphore is never closed: a permit always comes.
                let _permit = permits.acquire().await.ok();
                run_one(registry, call).await
            }))
            .await,
        );
        rest = later;
    }
    let mut results = Vec::with_capacity(calls.len());
    for (call, (content, is_error)) in calls.iter().zip(outcomes) {
        let block = ToolResultBlock::builder()
            .tool_use_id(call.tool_use_id())
            .content(ToolResultContentBlock::Text(content))
            .status(if is_error {
                ToolResultStatus::Error
            } else {
                ToolResultStatus::Success
            })
            .build();
        // Only a missing tool use id fails the build, and the model gave one.
        if let Ok(block) = block {
            results.push(ContentBlock::ToolResult(block));
        }
    }
    results
}

/// One tool call's `(content, is_error)`, routed as ironflow's HTTP providers route it (an MCP
/// connector's `connector__tool` names).
async fn run_one(registry: &ToolRegistry, call: &ToolUseBlock) -> (String, bool) {
    let name = call.name();
    debug!(
        tool = name,
        call_id = call.tool_use_id(),
        "running a tool the model called"
    );
    let key = if registry.connectors().is_empty() {
        name.to_string()
    } else {
        match route_tool_call(name, registry.connectors()) {
            Ok(routed) => routed.registry_key,
            Err(e) => return (e.to_string(), true),
        }
    };
    match registry.execute(&key, to_value(call.input())).await {
        Some(Ok(output)) => (output.content, output.is_error),
        Some(Err(e)) => (format!("Tool execution error: {e}"), true),
        None => (format!("Unknown tool: {name}"), true),
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::time::Duration;

    use aws_smithy_types::Document;
    use ironflow_core::providers::http::tools::{Tool, ToolError, ToolOutput};
    use tokio::sync::Barrier;

    use super::*;

    /// A read-only tool that waits until `n` of its kind are running at once.
    struct Meet(&'static str, Arc<Barrier>);

    impl Tool for Meet {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "waits for the others"
        }
        fn parameters_schema(&self) -> Value {
            serde_json::json!({"type": "object"})
        }
        fn read_only(&self) -> bool {
            true
        }
        fn execute(
            &self,
            _input: Value,
        ) -> Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + '_>> {
            Box::pin(async move {
                self.1.wait().await;
                Ok(ToolOutput::success(self.0))
            })
        }
    }

    fn call(id: &str, name: &str) -> ToolUseBlock {
        ToolUseBlock::builder()
            .tool_use_id(id)
            .name(name)
            .input(Document::Object(Default::default()))
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn consecutive_read_only_tools_run_together_and_results_keep_the_calls_order() {
        let barrier = Arc::new(Barrier::new(2));
        let registry = ToolRegistry::new()
            .register(Meet("a", barrier.clone()))
            .register(Meet("b", barrier));
        let calls = [call("1", "a"), call("2", "b"), call("3", "nope")];
        let refs: Vec<&ToolUseBlock> = calls.iter().collect();
        // Run one after the other, each would wait for the other forever.
        let results = tokio::time::timeout(Duration::from_secs(30), run(&registry, &refs, 4))
            .await
            .expect("the two read-only tools ran at once");
        let ids: Vec<_> = results
            .iter()
            .filter_map(|b| b.as_tool_result().ok())
            .map(|r| (r.tool_use_id().to_string(), r.status().cloned()))
            .collect();
        assert_eq!(
            ids,
            [
                ("1".to_string(), Some(ToolResultStatus::Success)),
                ("2".to_string(), Some(ToolResultStatus::Success)),
                ("3".to_string(), Some(ToolResultStatus::Error)),
            ]
        );
    }
}
