//! What both wire formats share: an answer before it is written, where a structured answer
//! goes, the pairing of tool calls with their results, the usage estimate.

use serde_json::Value;

use crate::script::{ReplyKind, Usage};

/// An answer before it is written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// A response with a body (JSON, or server-sent events for a streamed Messages answer).
    Body {
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_type: &'static str,
        body: String,
    },
    /// Close the connection without an answer.
    Cut,
}

impl Answer {
    /// `status` with `body` of `content_type`, verbatim.
    pub(crate) fn raw(status: u16, content_type: &'static str, body: String) -> Self {
        Self::Body {
            status,
            headers: Vec::new(),
            content_type,
            body,
        }
    }

    pub(crate) fn json(status: u16, body: Value) -> Self {
        Self::Body {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: body.to_string(),
        }
    }

    pub(crate) fn header(mut self, name: &'static str, value: String) -> Self {
        if let Self::Body { headers, .. } = &mut self {
            headers.push((name, value));
        }
        self
    }
}

/// Where a structured answer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// Text JSON.
    Text,
    /// The input of this tool.
    Tool(String),
}

impl Target {
    /// Without an output format or a forced tool: the only tool, else `structured_output`,
    /// else text.
    pub(crate) fn from_tools(tools: Vec<String>) -> Self {
        if tools.len() == 1 {
            return tools.into_iter().next().map_or(Self::Text, Self::Tool);
        }
        if tools.iter().any(|t| t == "structured_output") {
            return Self::Tool("structured_output".into());
        }
        Self::Text
    }
}

/// Message `i` must answer every tool call of the previous message (`pending`) with one
/// result each, and its results must answer only those.
pub(crate) fn check_tool_pairs(
    i: usize,
    pending: &[&str],
    results: &[&str],
    use_name: &str,
    result_name: &str,
) -> Result<(), String> {
    let missing: Vec<&str> = pending
        .iter()
        .copied()
        .filter(|id| !results.contains(id))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "messages.{i}: expected {result_name} blocks for the {use_name} ids of the previous message: {}",
            missing.join(", ")
        ));
    }
    if let Some(stray) = results.iter().find(|id| !pending.contains(id)) {
        return Err(format!(
            "messages.{i}: the {result_name} for {stray:?} answers no {use_name} of the previous message"
        ));
    }
    Ok(())
}

/// The usage reported when a reply sets none: a quarter of the characters, rounded up, at
/// least 1, of the request's `system` and `messages` strings (input) and of the answer's
/// text or tool input (output).
pub(crate) fn estimate_usage(body: &Value, kind: &ReplyKind) -> Usage {
    let input: usize = ["system", "messages"]
        .iter()
        .filter_map(|k| body.get(*k))
        .map(string_chars)
        .sum();
    let output = match kind {
        ReplyKind::Text(text) | ReplyKind::Truncated(text) => text.chars().count(),
        ReplyKind::ToolUse { text, calls } => {
            text.as_deref().map_or(0, |t| t.chars().count())
                + calls
                    .iter()
                    .map(|c| c.input.to_string().chars().count())
                    .sum::<usize>()
        }
        ReplyKind::Structured(value) => value.to_string().chars().count(),
        _ => 0,
    };
    let tokens = |chars: usize| (chars.div_ceil(4)).max(1) as u64;
    Usage {
        input_tokens: tokens(input),
        output_tokens: tokens(output),
    }
}

fn string_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(string_chars).sum(),
        Value::Object(map) => map.values().map(string_chars).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structured_answer_goes_to_the_only_tool_else_to_structured_output_else_to_text() {
        let tools = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Target::from_tools(tools(&["answer"])),
            Target::Tool("answer".into())
        );
        assert_eq!(
            Target::from_tools(tools(&["lookup", "structured_output"])),
            Target::Tool("structured_output".into())
        );
        assert_eq!(
            Target::from_tools(tools(&["lookup", "refund"])),
            Target::Text
        );
        assert_eq!(Target::from_tools(Vec::new()), Target::Text);
    }
}
