//! Bedrock Runtime's Converse wire format (restJson1), as aws-sdk-bedrockruntime's
//! serializers write the request and its deserializers read the answer:
//! `POST /model/{modelId}/converse`, the model id a percent-encoded path label; errors carry
//! their code in `x-amzn-errortype` (the SDK drops a `:…` suffix) and `{"message":…}`.

use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

use crate::script::{ReplyKind, Usage};
use crate::wire::{Answer, Target, check_tool_pairs};

/// The service's error codes this server sends, with their HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    Validation,
    Throttling,
    InternalServer,
    ServiceUnavailable,
    AccessDenied,
}

impl ErrorCode {
    fn status_and_name(self) -> (u16, &'static str) {
        match self {
            Self::Validation => (400, "ValidationException"),
            Self::Throttling => (429, "ThrottlingException"),
            Self::InternalServer => (500, "InternalServerException"),
            Self::ServiceUnavailable => (503, "ServiceUnavailableException"),
            Self::AccessDenied => (403, "AccessDeniedException"),
        }
    }
}

/// The model id of a Converse path, percent-decoded; `None` if the path is not
/// `/model/{modelId}/converse` or the label is empty or not UTF-8.
pub(crate) fn model_id(path: &str) -> Option<String> {
    let label = path.strip_prefix("/model/")?.strip_suffix("/converse")?;
    if label.is_empty() || label.contains('/') {
        return None;
    }
    percent_decode_str(label)
        .decode_utf8()
        .ok()
        .map(|m| m.into_owned())
}

/// The error answer: status, `x-amzn-errortype` as the service sends it and the message.
pub(crate) fn error(code: ErrorCode, message: &str) -> Answer {
    let (status, name) = code.status_and_name();
    Answer::json(status, json!({ "message": message })).header(
        "x-amzn-errortype",
        format!("{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
    )
}

/// The answer to an unknown model id.
pub(crate) fn unknown_model(model: &str) -> Answer {
    error(
        ErrorCode::Validation,
        &format!("The provided model identifier is invalid: {model}"),
    )
}

/// Check a request body as the service does (the rules a client can break): `messages`
/// non-empty, starting with a user message, roles alternating, known content blocks, tool
/// blocks only with a `toolConfig`, each toolUse answered by a toolResult in the next
/// message and each toolResult answering one, a forced tool among the tools.
pub(crate) fn validate(body: &Value) -> Result<(), String> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let tools = declared_tools(body);
    let mut previous_role = "";
    let mut pending_tool_uses: Vec<&str> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(format!(
                "messages.{i}.role: expected `user` or `assistant`, got {role:?}"
            ));
        }
        if i == 0 && role != "user" {
            return Err("A conversation must start with a user message. Try again with a conversation that starts with a user message.".into());
        }
        if role == previous_role {
            return Err("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.".into());
        }
        previous_role = role;
        let blocks = message
            .get("content")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                format!("messages.{i}.content: at least one content block is required")
            })?;
        let mut uses = Vec::new();
        let mut results = Vec::new();
        for block in blocks {
            let key = block
                .as_object()
                .filter(|o| o.len() == 1)
                .and_then(|o| o.keys().next());
            match key.map(String::as_str) {
                Some(
                    "text" | "image" | "document" | "video" | "cachePoint" | "reasoningContent"
                    | "guardContent",
                ) => {}
                Some("toolUse") => uses.push(
                    block
                        .pointer("/toolUse/toolUseId")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
                Some("toolResult") => results.push(
                    block
                        .pointer("/toolResult/toolUseId")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
                _ => {
                    return Err(format!(
                        "messages.{i}.content: a content block must have exactly one known member, got {block}"
                    ));
                }
            }
        }
        if (!uses.is_empty() || !results.is_empty()) && tools.is_none() {
            return Err("The toolConfig field must be defined when using toolUse and toolResult content blocks.".into());
        }
        check_tool_pairs(i, &pending_tool_uses, &results, "toolUse", "toolResult")?;
        pending_tool_uses = uses;
    }
    if let Some(forced) = body
        .pointer("/toolConfig/toolChoice/tool/name")
        .and_then(Value::as_str)
        && !tools
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|t| t == forced)
    {
        return Err(format!(
            "toolConfig.toolChoice.tool.name: {forced:?} is not one of the tools"
        ));
    }
    if body.pointer("/toolConfig/toolChoice").is_some()
        && tools.as_deref().unwrap_or_default().is_empty()
    {
        return Err("toolConfig.tools: at least one tool is required with a toolChoice".into());
    }
    Ok(())
}

/// The names in `toolConfig.tools[].toolSpec.name`; `None` without a `toolConfig`.
fn declared_tools(body: &Value) -> Option<Vec<String>> {
    let config = body.get("toolConfig")?;
    Some(
        config
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.pointer("/toolSpec/name").and_then(Value::as_str))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// Where a structured answer goes (see [`ReplyKind::Structured`]).
pub(crate) fn structured_target(body: &Value) -> Target {
    if body.pointer("/outputConfig/textFormat").is_some() {
        return Target::Text;
    }
    if let Some(forced) = body
        .pointer("/toolConfig/toolChoice/tool/name")
        .and_then(Value::as_str)
    {
        return Target::Tool(forced.to_string());
    }
    Target::from_tools(declared_tools(body).unwrap_or_default())
}

/// The answer to a scripted reply. `next_id` numbers tool calls.
pub(crate) fn reply(
    kind: &ReplyKind,
    body: &Value,
    usage: Usage,
    latency_ms: u64,
    next_id: &mut u64,
) -> Answer {
    let (content, stop_reason) = match kind {
        ReplyKind::Text(text) => (vec![json!({ "text": text })], "end_turn"),
        ReplyKind::Truncated(text) => (vec![json!({ "text": text })], "max_tokens"),
        ReplyKind::ToolUse { text, calls } => {
            let mut content: Vec<Value> = text.iter().map(|t| json!({ "text": t })).collect();
            for call in calls {
                *next_id += 1;
                content.push(json!({ "toolUse": { "toolUseId": format!("tooluse_{next_id}"), "name": call.name, "input": call.input } }));
            }
            (content, "tool_use")
        }
        ReplyKind::Structured(value) => match structured_target(body) {
            Target::Text => (vec![json!({ "text": value.to_string() })], "end_turn"),
            Target::Tool(name) => {
                *next_id += 1;
                (
                    vec![
                        json!({ "toolUse": { "toolUseId": format!("tooluse_{next_id}"), "name": name, "input": value } }),
                    ],
                    "tool_use",
                )
            }
        },
        ReplyKind::Throttle { .. } => {
            return error(
                ErrorCode::Throttling,
                "Too many requests, please wait before trying again.",
            );
        }
        ReplyKind::ServerError => {
            return error(
                ErrorCode::InternalServer,
                "The system encountered an unexpected error during processing. Try your request again.",
            );
        }
        ReplyKind::Unavailable => {
            return error(
                ErrorCode::ServiceUnavailable,
                "Bedrock is unable to process your request.",
            );
        }
        ReplyKind::AccessDenied => {
            return error(
                ErrorCode::AccessDenied,
                "You don't have access to the model with the specified model ID.",
            );
        }
        ReplyKind::Cut => return Answer::Cut,
        ReplyKind::Raw {
            status,
            content_type,
            body,
        } => return Answer::raw(*status, content_type, body.clone()),
    };
    Answer::json(
        200,
        json!({
            "output": { "message": { "role": "assistant", "content": content } },
            "stopReason": stop_reason,
            "usage": {
                "inputTokens": usage.input_tokens,
                "outputTokens": usage.output_tokens,
                "totalTokens": usage.input_tokens.saturating_add(usage.output_tokens),
            },
            "metrics": { "latencyMs": latency_ms },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_id_is_the_decoded_label() {
        assert_eq!(
            model_id("/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse").as_deref(),
            Some("us.anthropic.claude-3-5-haiku-20241022-v1:0")
        );
        assert_eq!(
            model_id(
                "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.x/converse"
            )
            .as_deref(),
            Some("arn:aws:bedrock:us-east-1:1:inference-profile/us.x")
        );
        assert_eq!(model_id("/model//converse"), None);
        assert_eq!(model_id("/model/a/b/converse"), None);
        assert_eq!(model_id("/model/a/converse-stream"), None);
    }

    #[test]
    fn a_tool_use_must_be_answered_in_the_next_message() {
        let tool_config =
            json!({ "tools": [{ "toolSpec": { "name": "t", "inputSchema": { "json": {} } } }] });
        let mut body = json!({
            "toolConfig": tool_config,
            "messages": [
                { "role": "user", "content": [{ "text": "hi" }] },
                { "role": "assistant", "content": [{ "toolUse": { "toolUseId": "a", "name": "t", "input": {} } }] },
                { "role": "user", "content": [{ "text": "no result" }] },
            ]
        });
        assert!(validate(&body).unwrap_err().contains("toolResult"));
        body["messages"][2]["content"] =
            json!([{ "toolResult": { "toolUseId": "a", "content": [{ "text": "r" }] } }]);
        assert_eq!(validate(&body), Ok(()));
        body.as_object_mut().map(|b| b.remove("toolConfig"));
        assert!(validate(&body).unwrap_err().contains("toolConfig"));
    }
}
