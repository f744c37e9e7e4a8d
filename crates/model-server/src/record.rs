//! What the server received: each request ([`Request`]) and the call counts ([`Calls`]).

use std::collections::BTreeMap;

use serde_json::Value;

/// The API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// Bedrock Runtime's Converse: `POST /model/{modelId}/converse`.
    Converse,
    /// Anthropic's Messages API: `POST /v1/messages`.
    Messages,
}

/// How a request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// A text answer.
    Text,
    /// A text answer cut at the output limit (stop reason `max_tokens`).
    Truncated,
    /// One or more tool calls.
    ToolUse,
    /// A structured answer (as text JSON or a tool's input).
    Structured,
    /// 429.
    Throttled,
    /// 500.
    ServerError,
    /// Converse 503, Messages 529.
    Unavailable,
    /// 403.
    AccessDenied,
    /// Closed without an answer.
    Cut,
    /// A raw answer (fault injection), with its status.
    Raw(u16),
    /// Messages 401: no key, or a refused one.
    Unauthorized,
    /// The model id is declared unknown.
    UnknownModel,
    /// Malformed: the service's validation error, with its message.
    Invalid(String),
}

/// One request as received, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Its arrival number, from 1.
    pub seq: u64,
    /// The API it came in on.
    pub route: Route,
    /// The model id: Converse's path label percent-decoded, the Messages API's `model` field
    /// (empty if absent).
    pub model: String,
    /// Its headers, names lower-case (a repeated header keeps its last value). Holds the
    /// `x-api-key` of a Messages request and the signed `authorization` of a Converse one.
    pub headers: BTreeMap<String, String>,
    /// Its JSON body (`Value::Null` if it was not JSON).
    pub body: Value,
    /// How it was answered.
    pub outcome: Outcome,
}

impl Request {
    /// The `x-api-key` header (Messages API), if sent.
    pub fn api_key(&self) -> Option<&str> {
        self.headers.get("x-api-key").map(String::as_str)
    }

    /// The system prompt: Converse's `system` text blocks joined with `\n`; the Messages
    /// API's `system` string, or its text blocks joined with `\n`. `None` if absent.
    pub fn system(&self) -> Option<String> {
        match self.body.get("system")? {
            Value::String(s) => Some(s.clone()),
            Value::Array(blocks) => Some(join_texts(blocks.iter(), "\n")),
            _ => None,
        }
    }

    /// The conversation: the body's `messages` (empty if absent).
    pub fn messages(&self) -> &[Value] {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The text of the last user message: its text blocks joined (a Messages string content
    /// as is); for a message of tool results only, their text (JSON contents serialized).
    pub fn last_user_text(&self) -> String {
        self.messages()
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map(|m| message_text(m.get("content").unwrap_or(&Value::Null)))
            .unwrap_or_default()
    }

    /// The names of the tools the request declares: Converse's
    /// `toolConfig.tools[].toolSpec.name`, the Messages API's `tools[].name`.
    pub fn tool_names(&self) -> Vec<String> {
        let tools = match self.route {
            Route::Converse => self.body.pointer("/toolConfig/tools"),
            Route::Messages => self.body.get("tools"),
        };
        tools
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.pointer("/toolSpec/name").or_else(|| t.get("name")))
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tool choice as sent: Converse's `toolConfig.toolChoice` (`{"auto":{}}`,
    /// `{"any":{}}`, `{"tool":{"name":…}}`), the Messages API's `tool_choice`.
    pub fn tool_choice(&self) -> Option<&Value> {
        match self.route {
            Route::Converse => self.body.pointer("/toolConfig/toolChoice"),
            Route::Messages => self.body.get("tool_choice"),
        }
    }
}

/// The text of a message's content (see [`Request::last_user_text`]).
pub(crate) fn message_text(content: &Value) -> String {
    let blocks = match content {
        Value::String(s) => return s.clone(),
        Value::Array(blocks) => blocks,
        _ => return String::new(),
    };
    let text = join_texts(blocks.iter(), "");
    if !text.is_empty() {
        return text;
    }
    // Tool results only: Converse `{"toolResult":{"content":[…]}}`, Messages
    // `{"type":"tool_result","content":"…" or […]}`.
    blocks
        .iter()
        .filter_map(|b| {
            b.pointer("/toolResult/content")
                .or_else(|| b.get("content"))
        })
        .map(|c| match c {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .map(|p| match (p.get("text"), p.get("json")) {
                    (Some(Value::String(t)), _) => t.clone(),
                    (_, Some(json)) => json.to_string(),
                    _ => String::new(),
                })
                .collect(),
            _ => String::new(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn join_texts<'a>(blocks: impl Iterator<Item = &'a Value>, sep: &str) -> String {
    blocks
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(sep)
}

/// Call counts: every request to either route is counted when it arrives, whatever its
/// answer (errors, cuts, 401s and validation errors included).
///
/// Each request also ends one of two ways, counted once it has: its answer was handed to the
/// connection after its delay ([`Calls::answered`]), or its client closed the connection
/// before that, so no answer was written ([`Calls::abandoned`]: a call cut by the client, e.g.
/// a step stopped at an invocation's cutoff). A request still waiting is in neither. An
/// answer handed over as the client closes the connection is counted answered (the server
/// cannot know whether its bytes arrived).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calls {
    /// All requests.
    pub total: u64,
    /// Per model id (as in [`Request::model`]).
    pub by_model: BTreeMap<String, u64>,
    /// Per API.
    pub by_route: BTreeMap<Route, u64>,
    /// Requests answered (a scripted cut included: the server closed the connection itself).
    pub answered: u64,
    /// Requests whose client closed the connection before the answer was written.
    pub abandoned: u64,
    /// The tokens the answered requests reported in their usage (input + output; zero for an
    /// error, which reports none).
    pub answered_tokens: TokenCount,
    /// The tokens the abandoned requests' answers would have reported: what a model would
    /// have processed for a call its client gave up (the whole prompt and the whole answer,
    /// as scripted or estimated: see [`crate::Reply::usage`]).
    pub abandoned_tokens: TokenCount,
}

/// Input and output tokens, summed over requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCount {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

impl TokenCount {
    pub(crate) fn add(&mut self, input: u64, output: u64) {
        self.input = self.input.saturating_add(input);
        self.output = self.output.saturating_add(output);
    }
}

impl Calls {
    /// Requests for this model id (0 if none).
    pub fn model(&self, model_id: &str) -> u64 {
        self.by_model.get(model_id).copied().unwrap_or(0)
    }

    /// Requests on this API (0 if none).
    pub fn route(&self, route: Route) -> u64 {
        self.by_route.get(&route).copied().unwrap_or(0)
    }

    pub(crate) fn count(&mut self, route: Route, model: &str) {
        self.total += 1;
        *self.by_model.entry(model.to_string()).or_default() += 1;
        *self.by_route.entry(route).or_default() += 1;
    }
}
