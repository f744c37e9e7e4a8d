//! Anthropic's Messages API wire format, as ironflow-core's `AnthropicApiAdapter`
//! (feature `provider-anthropic-api`) writes the request and reads the answer:
//! `POST /v1/messages` with `x-api-key` and `anthropic-version`; content blocks `text` and
//! `tool_use`; with `"stream": true`, server-sent events. Errors are
//! `{"type":"error","error":{"type":…,"message":…},"request_id":…}`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::script::{ReplyKind, Usage};
use crate::wire::{Answer, Target, check_tool_pairs};

/// The path of the Messages API.
pub(crate) const PATH: &str = "/v1/messages";

/// The error types this server sends, with their HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    InvalidRequest,
    Authentication,
    Permission,
    NotFound,
    RateLimit,
    Api,
    Overloaded,
}

impl ErrorType {
    fn status_and_name(self) -> (u16, &'static str) {
        match self {
            Self::InvalidRequest => (400, "invalid_request_error"),
            Self::Authentication => (401, "authentication_error"),
            Self::Permission => (403, "permission_error"),
            Self::NotFound => (404, "not_found_error"),
            Self::RateLimit => (429, "rate_limit_error"),
            Self::Api => (500, "api_error"),
            Self::Overloaded => (529, "overloaded_error"),
        }
    }
}

/// The error answer of request number `seq`.
pub(crate) fn error(kind: ErrorType, message: &str, seq: u64) -> Answer {
    let (status, name) = kind.status_and_name();
    let request_id = format!("req_{seq:024}");
    Answer::json(
        status,
        json!({ "type": "error", "error": { "type": name, "message": message }, "request_id": request_id }),
    )
    .header("request-id", request_id)
}

/// The answer to an unknown model id.
pub(crate) fn unknown_model(model: &str, seq: u64) -> Answer {
    error(ErrorType::NotFound, &format!("model: {model}"), seq)
}

/// The key check: `None` if `api_key` is present and not refused, else the 401.
pub(crate) fn refuse(
    api_key: Option<&str>,
    refused: impl Fn(&str) -> bool,
    seq: u64,
) -> Option<Answer> {
    match api_key {
        None => Some(error(
            ErrorType::Authentication,
            "x-api-key header is required",
            seq,
        )),
        Some(key) if refused(key) => {
            Some(error(ErrorType::Authentication, "invalid x-api-key", seq))
        }
        Some(_) => None,
    }
}

/// Check a request as the API does (the rules a client can break): `anthropic-version`
/// sent, `model`, `max_tokens` (at least 1) and non-empty `messages` present, the first
/// message a user one, known content blocks, each tool_use answered by a tool_result in the
/// next message and each tool_result answering one, a forced tool among the tools.
pub(crate) fn validate(body: &Value, version: Option<&str>) -> Result<(), String> {
    if version.is_none() {
        return Err("anthropic-version: header is required".into());
    }
    if body
        .get("model")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err("model: Field required".into());
    }
    if body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .is_none_or(|n| n == 0)
    {
        return Err("max_tokens: Field required (an integer of at least 1)".into());
    }
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let mut pending: Vec<&str> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            ));
        }
        if i == 0 && role != "user" {
            return Err("messages: first message must use the \"user\" role".into());
        }
        let (uses, results) = tool_ids(i, message.get("content").unwrap_or(&Value::Null))?;
        check_tool_pairs(i, &pending, &results, "tool_use", "tool_result")?;
        pending = uses;
    }
    if let Some(choice) = body.get("tool_choice")
        && choice.get("type").and_then(Value::as_str) == Some("tool")
    {
        let forced = choice
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !declared_tools(body).iter().any(|t| t == forced) {
            return Err(format!(
                "tool_choice.name: {forced:?} is not one of the tools"
            ));
        }
    }
    Ok(())
}

/// The tool_use and tool_result ids of message `i`'s content, checking its blocks.
fn tool_ids(i: usize, content: &Value) -> Result<(Vec<&str>, Vec<&str>), String> {
    let blocks = match content {
        Value::String(s) if !s.is_empty() => return Ok((Vec::new(), Vec::new())),
        Value::Array(blocks) if !blocks.is_empty() => blocks,
        _ => {
            return Err(format!(
                "messages.{i}.content: a non-empty string or list of content blocks is required"
            ));
        }
    };
    let (mut uses, mut results) = (Vec::new(), Vec::new());
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text" | "image" | "document" | "thinking" | "redacted_thinking") => {}
            Some("tool_use") => {
                uses.push(block.get("id").and_then(Value::as_str).unwrap_or_default())
            }
            Some("tool_result") => results.push(
                block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            _ => {
                return Err(format!(
                    "messages.{i}.content: unknown content block {block}"
                ));
            }
        }
    }
    Ok((uses, results))
}

fn declared_tools(body: &Value) -> Vec<String> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Where a structured answer goes (see [`ReplyKind::Structured`]).
pub(crate) fn structured_target(body: &Value) -> Target {
    if body.pointer("/output_config/format").is_some() {
        return Target::Text;
    }
    if let Some(choice) = body.get("tool_choice")
        && choice.get("type").and_then(Value::as_str) == Some("tool")
        && let Some(name) = choice.get("name").and_then(Value::as_str)
    {
        return Target::Tool(name.to_string());
    }
    Target::from_tools(declared_tools(body))
}

/// The answer to a scripted reply for request number `seq`. `next_id` numbers tool calls.
pub(crate) fn reply(
    kind: &ReplyKind,
    body: &Value,
    usage: Usage,
    seq: u64,
    next_id: &mut u64,
) -> Answer {
    let mut tool_use = |name: &str, input: &Value| {
        *next_id += 1;
        json!({ "type": "tool_use", "id": format!("toolu_{next_id:024}"), "name": name, "input": input })
    };
    let (content, stop_reason) = match kind {
        ReplyKind::Text(text) => (vec![json!({ "type": "text", "text": text })], "end_turn"),
        ReplyKind::Truncated(text) => (vec![json!({ "type": "text", "text": text })], "max_tokens"),
        ReplyKind::ToolUse { text, calls } => {
            let mut content: Vec<Value> = text
                .iter()
                .map(|t| json!({ "type": "text", "text": t }))
                .collect();
            content.extend(calls.iter().map(|c| tool_use(&c.name, &c.input)));
            (content, "tool_use")
        }
        ReplyKind::Structured(value) => match structured_target(body) {
            Target::Text => (
                vec![json!({ "type": "text", "text": value.to_string() })],
                "end_turn",
            ),
            Target::Tool(name) => (vec![tool_use(&name, value)], "tool_use"),
        },
        ReplyKind::Throttle { retry_after } => {
            let answer = error(
                ErrorType::RateLimit,
                "This request would exceed your organization's rate limit. Please try again later.",
                seq,
            );
            return match retry_after {
                Some(after) => answer.header("retry-after", retry_after_secs(*after).to_string()),
                None => answer,
            };
        }
        ReplyKind::ServerError => return error(ErrorType::Api, "Internal server error", seq),
        ReplyKind::Unavailable => return error(ErrorType::Overloaded, "Overloaded", seq),
        ReplyKind::AccessDenied => {
            return error(
                ErrorType::Permission,
                "Your API key does not have permission to use the specified resource.",
                seq,
            );
        }
        ReplyKind::Cut => return Answer::Cut,
        ReplyKind::Raw {
            status,
            content_type,
            body,
        } => return Answer::raw(*status, content_type, body.clone()),
    };
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    let message = json!({
        "id": format!("msg_{seq:024}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": { "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens },
    });
    let answer = if body.get("stream").and_then(Value::as_bool) == Some(true) {
        stream(message)
    } else {
        Answer::json(200, message)
    };
    answer.header("request-id", format!("req_{seq:024}"))
}

/// Whole seconds, rounded up.
fn retry_after_secs(after: Duration) -> u64 {
    after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0))
}

/// A complete message as the API streams it: `message_start` (input tokens, no content),
/// per block `content_block_start`, one delta (`text_delta` or `input_json_delta`) and
/// `content_block_stop`, then `message_delta` (stop reason, output tokens), `message_stop`.
fn stream(message: Value) -> Answer {
    let mut events: Vec<(&str, Value)> = Vec::new();
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(0);
    events.push((
        "message_start",
        json!({ "type": "message_start", "message": start }),
    ));
    for (index, block) in message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let (empty, delta) = if block["type"] == "tool_use" {
            let mut empty = block.clone();
            empty["input"] = json!({});
            (
                empty,
                json!({ "type": "input_json_delta", "partial_json": block["input"].to_string() }),
            )
        } else {
            (
                json!({ "type": "text", "text": "" }),
                json!({ "type": "text_delta", "text": block["text"] }),
            )
        };
        events.push((
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": empty }),
        ));
        events.push((
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        ));
        events.push((
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        ));
    }
    events.push((
        "message_delta",
        json!({
            "type": "message_delta",
            "delta": { "stop_reason": message["stop_reason"], "stop_sequence": null },
            "usage": { "output_tokens": message["usage"]["output_tokens"] },
        }),
    ));
    events.push(("message_stop", json!({ "type": "message_stop" })));
    let body = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    Answer::Body {
        status: 200,
        headers: Vec::new(),
        content_type: "text/event-stream",
        body,
    }
}
