//! What the server answers: a [`Script`] of [`Rule`]s, each a [`Match`] and a queue of
//! [`Reply`]s given in order, and a default reply once no rule has one left.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::Value;

use crate::record::Route;

/// Which requests a rule answers. Every condition set must hold; [`Match::any`] sets none.
///
/// Model ids compare exactly with the id the client sent: Converse's `{modelId}` path label
/// (percent-decoded: `anthropic.claude-3-5-haiku-20241022-v1:0`, an inference profile such as
/// `us.anthropic.claude-3-5-haiku-20241022-v1:0`, or an ARN), the Messages API's `model` field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    model: Option<String>,
    route: Option<Route>,
    last_user_contains: Option<String>,
    system_contains: Option<String>,
}

impl Match {
    /// Every request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Requests for this model id (exact comparison).
    pub fn model(model_id: impl Into<String>) -> Self {
        Self::default().and_model(model_id)
    }

    /// Also require this model id (exact comparison).
    pub fn and_model(mut self, model_id: impl Into<String>) -> Self {
        self.model = Some(model_id.into());
        self
    }

    /// Also require this API ([`Route::Converse`] or [`Route::Messages`]).
    pub fn on(mut self, route: Route) -> Self {
        self.route = Some(route);
        self
    }

    /// Also require the last user message's text to contain `needle` (case-sensitive). That
    /// text is its text blocks joined, or, for a message of tool results only, their contents
    /// (see [`crate::Request::last_user_text`]).
    pub fn containing(mut self, needle: impl Into<String>) -> Self {
        self.last_user_contains = Some(needle.into());
        self
    }

    /// Also require the system prompt to contain `needle` (case-sensitive; a request without
    /// a system prompt does not match).
    pub fn system_containing(mut self, needle: impl Into<String>) -> Self {
        self.system_contains = Some(needle.into());
        self
    }

    pub(crate) fn matches(
        &self,
        route: Route,
        model: &str,
        last_user: &str,
        system: Option<&str>,
    ) -> bool {
        self.model.as_deref().is_none_or(|m| m == model)
            && self.route.is_none_or(|r| r == route)
            && self
                .last_user_contains
                .as_deref()
                .is_none_or(|n| last_user.contains(n))
            && self
                .system_contains
                .as_deref()
                .is_none_or(|n| system.is_some_and(|s| s.contains(n)))
    }
}

/// One tool call of a [`ReplyKind::ToolUse`] answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name, as declared in the request's tools.
    pub name: String,
    /// Its input, a JSON object.
    pub input: Value,
}

/// Token counts reported in an answer's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
}

/// What one answer is.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ReplyKind {
    /// A text answer (stop reason `end_turn`).
    Text(String),
    /// A text answer cut at the output token limit (stop reason `max_tokens`): a structured
    /// answer that does not parse, a summary that stops mid-sentence.
    Truncated(String),
    /// One or more tool calls, optionally after some text (stop reason `tool_use`). Each call
    /// gets a fresh id (`tooluse_N` on Converse, `toolu_N` on the Messages API).
    ToolUse {
        /// Text before the calls (a text block), if any.
        text: Option<String>,
        /// The calls, in order.
        calls: Vec<ToolCall>,
    },
    /// A structured answer, delivered the way the request asked for structured output: as
    /// text JSON when the request sets an output format (Converse's
    /// `outputConfig.textFormat`, the Messages API's `output_config.format`), else as the
    /// input of the tool the request forces (`toolChoice.tool` / `tool_choice` of type
    /// `tool`), else of its only tool, else of a tool named `structured_output`, else as
    /// text JSON.
    Structured(Value),
    /// Throttled: Converse `429 ThrottlingException`, Messages `429 rate_limit_error`.
    Throttle {
        /// The Messages API's `retry-after` header, in whole seconds (Converse sends none:
        /// Bedrock gives no reset time).
        retry_after: Option<Duration>,
    },
    /// An internal error: Converse `500 InternalServerException`, Messages `500 api_error`.
    ServerError,
    /// Unavailable or overloaded: Converse `503 ServiceUnavailableException`, Messages
    /// `529 overloaded_error`.
    Unavailable,
    /// Not permitted: Converse `403 AccessDeniedException`, Messages `403 permission_error`.
    AccessDenied,
    /// The connection is closed without an answer (after the reply's delay).
    Cut,
    /// FAULT INJECTION, not a model's answer: this status, content type and body as they are,
    /// on either API. What a proxy or a load balancer answers on the way (a 502 HTML page), an
    /// error the service's SDK does not model (a 429 without an error type), or a success
    /// whose body is garbled.
    Raw {
        /// The HTTP status.
        status: u16,
        /// The `content-type`.
        content_type: &'static str,
        /// The body, verbatim.
        body: String,
    },
}

/// One scripted answer: what it is, how long it waits before answering and, optionally,
/// the usage it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// What is answered.
    pub kind: ReplyKind,
    /// Waited before answering, on top of the script's latency (default zero).
    pub delay: Duration,
    /// Reported usage; `None` (the default) reports an estimate: a quarter of the characters
    /// of the request's message and system text, and of the answer's text or tool input,
    /// rounded up, at least 1 each.
    pub usage: Option<Usage>,
}

impl Reply {
    fn of(kind: ReplyKind) -> Self {
        Self {
            kind,
            delay: Duration::ZERO,
            usage: None,
        }
    }

    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self::of(ReplyKind::Text(text.into()))
    }

    /// A text answer cut at the output token limit (stop reason `max_tokens`).
    pub fn truncated(text: impl Into<String>) -> Self {
        Self::of(ReplyKind::Truncated(text.into()))
    }

    /// A call of one tool with a JSON input.
    pub fn tool_use(name: impl Into<String>, input: Value) -> Self {
        Self::of(ReplyKind::ToolUse {
            text: None,
            calls: vec![ToolCall {
                name: name.into(),
                input,
            }],
        })
    }

    /// Calls of several tools in one answer, in order.
    pub fn tool_uses(calls: impl IntoIterator<Item = (String, Value)>) -> Self {
        let calls = calls
            .into_iter()
            .map(|(name, input)| ToolCall { name, input })
            .collect();
        Self::of(ReplyKind::ToolUse { text: None, calls })
    }

    /// A structured answer (see [`ReplyKind::Structured`] for how it is delivered).
    pub fn structured(value: Value) -> Self {
        Self::of(ReplyKind::Structured(value))
    }

    /// A throttling error without a reset time.
    pub fn throttle() -> Self {
        Self::of(ReplyKind::Throttle { retry_after: None })
    }

    /// A throttling error; the Messages API's answer carries `retry-after` (whole seconds).
    pub fn throttle_retry_after(retry_after: Duration) -> Self {
        Self::of(ReplyKind::Throttle {
            retry_after: Some(retry_after),
        })
    }

    /// An internal server error (500).
    pub fn server_error() -> Self {
        Self::of(ReplyKind::ServerError)
    }

    /// Unavailable (Converse 503) or overloaded (Messages 529).
    pub fn unavailable() -> Self {
        Self::of(ReplyKind::Unavailable)
    }

    /// Access denied (403).
    pub fn access_denied() -> Self {
        Self::of(ReplyKind::AccessDenied)
    }

    /// The connection closed without an answer.
    pub fn cut() -> Self {
        Self::of(ReplyKind::Cut)
    }

    /// FAULT INJECTION: `status` with `body` of `content_type`, verbatim
    /// ([`ReplyKind::Raw`]).
    pub fn raw(status: u16, content_type: &'static str, body: impl Into<String>) -> Self {
        Self::of(ReplyKind::Raw {
            status,
            content_type,
            body: body.into(),
        })
    }

    /// This answer waits `delay` more before it is given (a slow model).
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// This answer reports these token counts.
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.usage = Some(Usage {
            input_tokens,
            output_tokens,
        });
        self
    }

    /// Text before this answer's tool calls (no effect on other kinds).
    pub fn with_text(mut self, preface: impl Into<String>) -> Self {
        if let ReplyKind::ToolUse { text, .. } = &mut self.kind {
            *text = Some(preface.into());
        }
        self
    }
}

/// A rule: which requests it answers and the replies left, given in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The requests it answers.
    pub when: Match,
    /// The replies not given yet.
    pub replies: VecDeque<Reply>,
}

/// The whole script. Build it with its methods, then give it to
/// [`crate::ModelServer::start`]; the server's own methods change it while it runs.
///
/// A request is answered by the first rule (in the order added) that matches it and still
/// has a reply; with none, by the first matching standing reply ([`Script::always`]); with
/// none, by the default reply, [`Script::DEFAULT_TEXT`] as text unless
/// set. Before a rule is consulted: a Messages request without a key or with a refused key
/// is answered 401; a request for an unknown model is answered as the service answers an
/// invalid model id; a malformed request gets the service's validation error. Neither
/// consumes a reply.
///
/// Replies are taken in arrival order: when concurrent requests (a fan-out) can match the
/// same rule, script them per model or per prompt so that the order does not matter.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub(crate) rules: Vec<Rule>,
    pub(crate) always: Vec<(Match, Reply)>,
    pub(crate) default: Reply,
    pub(crate) strict: bool,
    pub(crate) latency: Duration,
    pub(crate) unknown_models: BTreeSet<String>,
    pub(crate) refused_keys: BTreeSet<String>,
}

impl Default for Script {
    fn default() -> Self {
        Self::new()
    }
}

impl Script {
    /// The default reply's text when none is set.
    pub const DEFAULT_TEXT: &'static str = "ok";

    /// An empty script: every request gets [`Script::DEFAULT_TEXT`], no latency, every model
    /// known, every key accepted.
    pub fn new() -> Self {
        Self {
            rules: Vec::new(),
            always: Vec::new(),
            strict: false,
            default: Reply::text(Self::DEFAULT_TEXT),
            latency: Duration::ZERO,
            unknown_models: BTreeSet::new(),
            refused_keys: BTreeSet::new(),
        }
    }

    /// Add a rule: requests matching `when` get `replies` in order.
    pub fn on(mut self, when: Match, replies: impl IntoIterator<Item = Reply>) -> Self {
        self.push(when, replies);
        self
    }

    /// Requests matching `when` that no rule answers (none matches with a reply left) get
    /// `reply`, every time: a standing answer per model or prompt, for runs of any length.
    /// Consulted in the order added, after the rules and before the default reply.
    pub fn always(mut self, when: Match, reply: Reply) -> Self {
        self.always.push((when, reply));
        self
    }

    /// Strict: a request that no rule and no standing reply answers gets the service's
    /// validation error (Converse `400 ValidationException`, Messages
    /// `400 invalid_request_error`) `unscripted request for model M: TEXT` (the last user
    /// text, at most 200 characters) instead of the default reply, so that a prompt the
    /// script did not foresee fails loudly. Off by default.
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// The reply once no rule has one left.
    pub fn default_reply(mut self, reply: Reply) -> Self {
        self.default = reply;
        self
    }

    /// Every answer (errors and cuts included, not the 401s and validation errors) waits
    /// this long first (default zero).
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Requests for this model id are answered as an invalid model id: Converse
    /// `400 ValidationException`, Messages `404 not_found_error`, each naming it.
    pub fn unknown_model(mut self, model_id: impl Into<String>) -> Self {
        self.unknown_models.insert(model_id.into());
        self
    }

    /// Messages requests with this `x-api-key` are answered `401 authentication_error`.
    pub fn refuse_key(mut self, api_key: impl Into<String>) -> Self {
        self.refused_keys.insert(api_key.into());
        self
    }

    pub(crate) fn push(&mut self, when: Match, replies: impl IntoIterator<Item = Reply>) {
        self.rules.push(Rule {
            when,
            replies: replies.into_iter().collect(),
        });
    }

    /// Take the reply for a request; `None` when nothing scripted answers it and the script
    /// is strict.
    pub(crate) fn next_reply(
        &mut self,
        route: Route,
        model: &str,
        last_user: &str,
        system: Option<&str>,
    ) -> Option<Reply> {
        self.rules
            .iter_mut()
            .filter(|rule| !rule.replies.is_empty())
            .find(|rule| rule.when.matches(route, model, last_user, system))
            .and_then(|rule| rule.replies.pop_front())
            .or_else(|| {
                self.always
                    .iter()
                    .find(|(when, _)| when.matches(route, model, last_user, system))
                    .map(|(_, reply)| reply.clone())
            })
            .or_else(|| (!self.strict).then(|| self.default.clone()))
    }
}
