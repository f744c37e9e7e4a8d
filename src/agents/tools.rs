//! The tools a step's model may call, from ironflow-core's [`ToolRegistry`]: offered in the
//! Converse request's tool configuration, run here between two model calls, their results sent
//! back in the next call.
//!
//! A step sees the provider's default registry, or the one registered under the
//! [`ToolProfile`] it selects (`AgentConfig::tool_profile`); an unknown profile fails the step
//! before any call (never another profile's tools). Calls run one after the other in the model's
//! order. An unknown tool, or a tool that fails, answers the model with an error result; it does
//! not end the step. A tool runs inside the provider's loop: it cannot suspend the run (a tool
//! that needs a human belongs between two steps, as `ctx.approval`).

use std::collections::BTreeMap;

use aws_sdk_bedrockruntime::types::{
    ContentBlock, Tool, ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolResultStatus,
    ToolSpecification, ToolUseBlock,
};
use ironflow_core::error::AgentError;
use ironflow_core::provider::ToolProfile;
use ironflow_core::providers::http::tools::ToolRegistry;
use ironflow_core::providers::http::tools::routing::route_tool_call;
use serde_json::Value;
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

/// Run the tool calls `calls` with `registry`, in order: one tool result block each.
pub(crate) async fn run(registry: &ToolRegistry, calls: &[&ToolUseBlock]) -> Vec<ContentBlock> {
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        let (content, is_error) = run_one(registry, call).await;
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
