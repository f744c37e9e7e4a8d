//! The conversation trace of a `verbose` step (`AgentOutput::debug_messages`): one entry per
//! model answer, its text, the tools it called and their results, its stop reason and tokens.

use aws_sdk_bedrockruntime::types::{ContentBlock, ToolResultContentBlock, ToolResultStatus};
use ironflow_core::provider::DebugMessage;
use serde_json::{Value, json};

use super::converse::Turn;
use super::document::to_value;

/// The trace so far (kept only when the step asks for it).
#[derive(Debug, Default)]
pub(crate) struct Trace {
    on: bool,
    turns: Vec<Value>,
}

impl Trace {
    /// A trace that records only when `verbose`.
    pub fn new(verbose: bool) -> Self {
        Self {
            on: verbose,
            turns: Vec::new(),
        }
    }

    /// Record the model's answer `turn`.
    pub fn answer(&mut self, turn: &Turn) {
        if !self.on {
            return;
        }
        let calls: Vec<Value> = turn
            .calls
            .iter()
            .map(|c| json!({"id": c.tool_use_id(), "name": c.name(), "input": to_value(c.input())}))
            .collect();
        self.turns.push(json!({
            "text": (!turn.text.is_empty()).then_some(&turn.text),
            "tool_calls": calls,
            "stop_reason": turn.stop.as_str(),
            "input_tokens": turn.usage.input,
            "output_tokens": turn.usage.output,
        }));
    }

    /// Record the results `results` of the last answer's tool calls.
    pub fn results(&mut self, results: &[ContentBlock]) {
        let Some(last) = self.turns.last_mut().filter(|_| self.on) else {
            return;
        };
        let results: Vec<Value> = results
            .iter()
            .filter_map(|b| b.as_tool_result().ok())
            .map(|r| {
                let text: String = r
                    .content()
                    .iter()
                    .filter_map(|c| match c {
                        ToolResultContentBlock::Text(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                json!({
                    "tool_use_id": r.tool_use_id(),
                    "content": text,
                    "is_error": r.status() == Some(&ToolResultStatus::Error),
                })
            })
            .collect();
        last["tool_results"] = Value::Array(results);
    }

    /// The trace as ironflow's debug messages, `None` when not recorded.
    pub fn messages(&self) -> Option<Vec<DebugMessage>> {
        if !self.on {
            return None;
        }
        serde_json::from_value(Value::Array(self.turns.clone())).ok()
    }
}
