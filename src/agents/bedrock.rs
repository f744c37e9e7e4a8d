//! [`BedrockProvider`]: agent steps on Amazon Bedrock's Converse API, authenticated by the
//! function's role.

use std::fmt;
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::config::StalledStreamProtectionConfig;
use aws_sdk_bedrockruntime::config::retry::RetryConfig;
use aws_sdk_bedrockruntime::types::StopReason;
use ironflow_core::error::{AgentError, PartialUsage};
use ironflow_core::operations::agent::Model;
use ironflow_core::pricing::ModelPricing;
use ironflow_core::provider::{AgentConfig, AgentOutput, AgentProvider, InvokeFuture, ToolProfile};
use ironflow_core::providers::http::tools::ToolRegistry;
use serde_json::Value;
use tokio::sync::OnceCell;
use tracing::{info, warn};

use super::attempts::{self, Unrecorded};
use super::calls::{self, Limits};
use super::converse::{self, Answer, Request, Turn, has_native_structured_output};
use super::pricing::{self, Usage};
use super::schema::{AnswerSchema, mismatch};
use super::session;
use super::tools::{self, ToolProfiles};
use super::trace::Trace;

/// The model of a step that names none (ironflow's default, `sonnet`): Claude Sonnet 4.5 through
/// Bedrock's global cross-region inference profile.
pub const DEFAULT_BEDROCK_MODEL: &str = "global.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// The model of a step that names ironflow's alias `opus`: Claude Opus 4.5 through Bedrock's
/// global cross-region inference profile.
pub const BEDROCK_OPUS: &str = "global.anthropic.claude-opus-4-5-20251101-v1:0";

/// The model of a step that names ironflow's alias `haiku`: Claude Haiku 4.5 through Bedrock's
/// global cross-region inference profile.
pub const BEDROCK_HAIKU: &str = "global.anthropic.claude-haiku-4-5-20251001-v1:0";

/// Turns (model calls) of a step that sets no `max_turns`: 25, as ironflow's HTTP providers.
const DEFAULT_MAX_TURNS: u32 = 25;

/// Agent steps on Amazon Bedrock's Converse API, through the AWS SDK for Rust: no CLI, no
/// long-lived key. The function's role signs each call (the default credential chain), so the
/// role needs `bedrock:InvokeModel` on the models and inference profiles the steps use; the
/// endpoint is the region's, or `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` (which the SDK reads).
///
/// What a step's `AgentConfig` asks, and what this provider does with it:
///
/// - `model`: a foundation model id (`amazon.nova-pro-v1:0`), an inference profile id
///   (`us.…`, `global.…`) or an ARN; ironflow's default `sonnet` (a step that names no model)
///   becomes [`with_default_model`](Self::with_default_model)'s, `opus` and `haiku`
///   [`BEDROCK_OPUS`] and [`BEDROCK_HAIKU`]; whitespace around it is dropped, and a name that
///   is no Bedrock id (no `.`, not an ARN) fails the step before any call. An id Bedrock does
///   not know, or the role may not call, fails the step with an error naming the model (not
///   retried).
/// - `system_prompt` and `append_system_prompt` (after a blank line): the system prompt.
/// - `json_schema`: Converse's structured output format where the model has it, else a tool the
///   model must answer through; the answer is checked against the schema, and a mismatch is
///   `AgentError::SchemaValidation`, which ironflow retries.
/// - tools: the [`ToolRegistry`] of [`with_tools`](Self::with_tools) (or of the profile the step
///   selects, [`with_tool_profile`](Self::with_tool_profile)), run by this provider between
///   model calls, up to `max_turns` calls (default 25; reached with tool calls still pending,
///   the step fails with `AgentError::Api`, code `error_max_turns`, status 422: not retried,
///   a structured step's neither; its usage, which ironflow does not record for this error,
///   is in the message and a WARN line).
/// - `max_budget_usd`: past it no further turn is made (`AgentError::BudgetExceeded`). A
///   budget of zero or less, not finite, or on a model without a price fails the step before
///   any call (code `InvalidBudget`).
/// - an answer without text that Bedrock stopped for a guardrail, a content filter, the
///   context window or the output limit fails the step with the stop reason as its code
///   (status 422, not retried, its usage in the message); a
///   text cut at the output limit is returned, with a warning.
/// - `max_capacity_wait`: the budget of the capacity waits below.
///
/// Each call is bounded by the per-call limit ([`with_call_limit`](Self::with_call_limit)) and by
/// the invocation's cutoff. Throttling and 5xx are retried with jittered backoff within
/// [`with_retry_window`](Self::with_retry_window) and the time left; after that the step returns
/// `AgentError::CapacityWait`: the engine puts the run to sleep until a wake time this provider
/// picks ([`with_capacity_pause`](Self::with_capacity_pause); Bedrock gives no reset time), a
/// timer wake-up resumes it, and the step is called again. No invocation holds it meanwhile, and
/// it counts neither as a failure nor toward the poison pill. Past the step's capacity-wait
/// budget it fails with `AgentError::NoCapacity`.
///
/// The answer carries the tokens of every call and, for a model of the price table (or added
/// with [`with_price`](Self::with_price)), their cost; another model's has no cost.
/// A `verbose` step's answer carries its conversation trace (each answer's text, tool calls and
/// their results); `effort` and the Claude-CLI-only fields are ignored. A step the engine resumes
/// after an interruption (`resume_session_id`) is refused as a session that does not exist, so
/// that the engine asks the step's own prompt again (this provider keeps no session). See the
/// repository's `docs/agents.md`.
///
/// ```no_run
/// use std::sync::Arc;
/// use ironflow_lambda::BedrockProvider;
///
/// # fn example(builder: ironflow_lambda::LambdaWorkerBuilder) -> ironflow_lambda::LambdaWorkerBuilder {
/// builder.provider(Arc::new(
///     BedrockProvider::from_env().with_default_model("us.amazon.nova-pro-v1:0"),
/// ))
/// # }
/// ```
pub struct BedrockProvider {
    /// The client: built at construction, or at the first call by [`BedrockProvider::from_env`].
    client: OnceCell<Client>,
    default_model: String,
    limits: Limits,
    tools: ToolProfiles,
    prices: Vec<(String, ModelPricing)>,
    /// The usage of mismatched structured answers, for their step's next attempt.
    unrecorded: Unrecorded,
}

impl fmt::Debug for BedrockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BedrockProvider")
            .field("default_model", &self.default_model)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A Bedrock Runtime client from `aws`, without the SDK's own retries and stalled-stream check:
/// this provider bounds and retries each call itself.
fn client(aws: &SdkConfig) -> Client {
    let config = aws_sdk_bedrockruntime::config::Builder::from(aws)
        .retry_config(RetryConfig::disabled())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .build();
    Client::from_conf(config)
}

impl BedrockProvider {
    /// Per-call limit by default: 300 s. A call is also cut at the invocation's cutoff.
    pub const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(300);
    /// Retry window of throttling and 5xx by default: 20 s.
    pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(20);
    /// Capacity pause by default: 60 s (plus up to 15 s of jitter).
    pub const DEFAULT_CAPACITY_PAUSE: Duration = Duration::from_secs(60);

    /// A provider with the AWS configuration `aws` (region, credentials, endpoint).
    pub fn new(aws: &SdkConfig) -> Self {
        Self::with_client(OnceCell::new_with(Some(client(aws))))
    }

    /// A provider whose AWS configuration is loaded from the environment (the default chain:
    /// the function's role, `AWS_REGION`, `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`) at its first call.
    /// What a function's `main` registers, where no AWS configuration is at hand yet.
    pub fn from_env() -> Self {
        Self::with_client(OnceCell::new())
    }

    fn with_client(client: OnceCell<Client>) -> Self {
        Self {
            client,
            default_model: DEFAULT_BEDROCK_MODEL.to_string(),
            limits: Limits {
                call_limit: Self::DEFAULT_CALL_LIMIT,
                retry_window: Self::DEFAULT_RETRY_WINDOW,
                capacity_pause: Self::DEFAULT_CAPACITY_PAUSE,
                max_capacity_wait: ironflow_engine::accounts::DEFAULT_MAX_CAPACITY_WAIT,
            },
            tools: ToolProfiles::default(),
            prices: Vec::new(),
            unrecorded: Unrecorded::default(),
        }
    }

    /// The model of a step that names none (ironflow's default model, `sonnet`). Default
    /// [`DEFAULT_BEDROCK_MODEL`].
    pub fn with_default_model(mut self, model: &str) -> Self {
        self.default_model = model.to_string();
        self
    }

    /// The longest one Converse call may take; a call is also cut at the invocation's cutoff. A
    /// call past it fails the step with `AgentError::Timeout` (retried by a step's retry policy).
    /// Default [`Self::DEFAULT_CALL_LIMIT`], 300 s.
    pub fn with_call_limit(mut self, limit: Duration) -> Self {
        self.limits.call_limit = limit;
        self
    }

    /// How long throttling, 5xx and cut connections are retried within one call (jittered
    /// backoff from 0.2 s to 5 s), from its first failure, and never past the invocation's
    /// cutoff. Default [`Self::DEFAULT_RETRY_WINDOW`], 20 s.
    pub fn with_retry_window(mut self, window: Duration) -> Self {
        self.limits.retry_window = window;
        self
    }

    /// How long a throttled step's run sleeps before the step is tried again (plus up to a
    /// quarter of it, at random). Default [`Self::DEFAULT_CAPACITY_PAUSE`], 60 s.
    pub fn with_capacity_pause(mut self, pause: Duration) -> Self {
        self.limits.capacity_pause = pause;
        self
    }

    /// The capacity-wait budget of a step that sets no `max_capacity_wait`: the longest a step
    /// may sleep for capacity in all, across wake-ups. Default ironflow's, 6 hours; zero fails
    /// a throttled step at once. Under a [`crate::LambdaWorker`] a step without a budget gets the
    /// worker's (`IRONFLOW_MAX_CAPACITY_WAIT_SECS`), so this one applies outside a worker only.
    pub fn with_max_capacity_wait(mut self, wait: Duration) -> Self {
        self.limits.max_capacity_wait = wait;
        self
    }

    /// The tools of every step that selects no tool profile.
    pub fn with_tools(mut self, registry: ToolRegistry) -> Self {
        self.tools.default = Some(registry);
        self
    }

    /// The tools of the steps that select `profile` (`AgentConfig::tool_profile`). A step
    /// selecting a profile that is not registered fails before any call.
    pub fn with_tool_profile(mut self, profile: ToolProfile, registry: ToolRegistry) -> Self {
        self.tools.named.insert(profile, registry);
        self
    }

    /// The price of `model` (a foundation model id, or its prefix), used before the built-in
    /// table (`BEDROCK_PRICES`, `src/agents/pricing.rs`): for a model the table lacks, or a
    /// price that changed.
    pub fn with_price(mut self, model: &str, rates: ModelPricing) -> Self {
        self.prices.push((model.to_string(), rates));
        self
    }

    /// The client, loading the AWS configuration from the environment at the first call of a
    /// provider made by [`BedrockProvider::from_env`].
    async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                client(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await)
            })
            .await
    }

    /// The model the step `config` calls: its `model` without surrounding whitespace;
    /// ironflow's aliases `sonnet` (and no model) as the default model, `opus` and `haiku` as
    /// [`BEDROCK_OPUS`] and [`BEDROCK_HAIKU`].
    ///
    /// # Errors
    ///
    /// A non-retryable [`AgentError::Api`] (code `InvalidModel`) for a name that is no Bedrock
    /// model id: one without a `.` and not an ARN (a Claude CLI name such as
    /// `claude-opus-4-6`), or one with whitespace or a control character inside (no Bedrock id
    /// or ARN has any).
    fn model_for<'a>(&'a self, config: &'a AgentConfig) -> Result<&'a str, AgentError> {
        let model = config.model.trim();
        Ok(match model {
            "" | Model::SONNET => &self.default_model,
            Model::OPUS => BEDROCK_OPUS,
            Model::HAIKU => BEDROCK_HAIKU,
            id if (id.contains('.') || id.starts_with("arn:"))
                && !id.chars().any(|c| c.is_whitespace() || c.is_control()) =>
            {
                id
            }
            other => {
                return Err(calls::refused(
                    400,
                    "InvalidModel",
                    format!(
                        "model '{other}' is not a Bedrock model id: name a foundation model, an \
                         inference profile or an ARN (e.g. {DEFAULT_BEDROCK_MODEL}), or one of \
                         ironflow's aliases sonnet, opus, haiku"
                    ),
                ));
            }
        })
    }

    /// The step `config`: [`Self::turns`], its usage counting that of the step's earlier
    /// attempts that ended in a schema mismatch ([`Unrecorded`]), and kept for the next one
    /// when this one ends in a mismatch too.
    async fn run(&self, config: &AgentConfig) -> Result<AgentOutput, AgentError> {
        let key = attempts::key(config);
        let earlier = self.unrecorded.take(key);
        let result = self.turns(config, earlier).await;
        match &result {
            Err(AgentError::SchemaValidation { partial_usage, .. }) => {
                self.unrecorded.keep(key, Usage::of(partial_usage));
            }
            // Another error: a next attempt may come (its usage, if any, is not counted).
            Err(_) => self.unrecorded.keep(key, earlier),
            Ok(_) => {}
        }
        result
    }

    /// The step `config`, turn by turn, its usage starting at `earlier`.
    async fn turns(&self, config: &AgentConfig, earlier: Usage) -> Result<AgentOutput, AgentError> {
        session::no_session_to_resume(config, "Bedrock")?;
        let started = Instant::now();
        let model = self.model_for(config)?;
        let registry = self.tools.select(config.tool_profile.as_ref())?;
        let answer = match &config.json_schema {
            None => Answer::Text,
            Some(text) => {
                let schema = AnswerSchema::parse(model, text)?;
                if has_native_structured_output(model) {
                    Answer::Native(schema)
                } else {
                    Answer::Tool(schema)
                }
            }
        };
        check_budget(config, model, &self.prices)?;
        let mut request = Request::new(config, model, registry, &answer)?;
        let client = self.client().await;
        let max_turns = config.max_turns.unwrap_or(DEFAULT_MAX_TURNS).max(1);
        let mut spent = Spent::new(model, &self.prices);
        spent.add(earlier);
        // The earlier attempts may have spent the budget already.
        budget_left(config, &spent, started)?;
        let mut trace = Trace::new(config.verbose);
        for turn_no in 1..=max_turns {
            let output = calls::converse(
                || request.call(client),
                request.chars(),
                model,
                config,
                &self.limits,
            )
            .await?;
            let turn = converse::read(output);
            spent.add(turn.usage);
            trace.answer(&turn);
            if let Some(value) =
                final_answer(&turn, &answer, registry.is_some(), model, (&spent, started))?
            {
                info!(
                    model,
                    turns = turn_no,
                    input_tokens = spent.usage.input,
                    output_tokens = spent.usage.output,
                    cost_usd = spent.cost,
                    "Bedrock step answered"
                );
                let mut output = spent.output(value, started);
                output.debug_messages = trace.messages();
                return Ok(output);
            }
            budget_left(config, &spent, started)?;
            let (Some(registry), Some(message)) = (registry, turn.message) else {
                // `final_answer` answers every turn without tool calls or registry.
                break;
            };
            let calls: Vec<_> = turn.calls.iter().collect();
            let results = tools::run(registry, &calls, config.max_parallel_tools).await;
            trace.results(&results);
            request.push_turn(message, results)?;
        }
        // Not a schema mismatch, even for a structured step, and not retryable: ironflow asks
        // those again (a mismatch twice by default), which would run every tool and call the
        // model max_turns times more each time.
        Err(unrecorded_failure(
            "error_max_turns",
            format!(
                "Bedrock model '{model}' still called tools after max_turns ({max_turns}) turns"
            ),
            &spent,
        ))
    }
}

/// A step's `max_budget_usd` that can be kept: a finite amount above zero, on a model with a
/// price (the table's, or [`BedrockProvider::with_price`]'s). Checked before any call: a
/// budget of zero or less would still pay for one call, and a model without a price would
/// never meet it.
///
/// # Errors
///
/// A non-retryable [`AgentError::Api`] (code `InvalidBudget`) naming the step's budget and the
/// model.
fn check_budget(
    config: &AgentConfig,
    model: &str,
    prices: &[(String, ModelPricing)],
) -> Result<(), AgentError> {
    let Some(limit) = config.max_budget_usd else {
        return Ok(());
    };
    let why = if !(limit.is_finite() && limit > 0.0) {
        format!("max_budget_usd must be a finite amount above 0 USD, found {limit}")
    } else if pricing::cost(model, Usage::default(), prices).is_none() {
        format!(
            "max_budget_usd is {limit} USD, but Bedrock model '{model}' has no price to keep \
             it with: add one with BedrockProvider::with_price, or drop the budget"
        )
    } else {
        return Ok(());
    };
    Err(calls::refused(400, "InvalidBudget", why))
}

/// `Ok` while the step's spend is below its `max_budget_usd` (or it has none, or no price).
///
/// # Errors
///
/// [`AgentError::BudgetExceeded`] with the spend so far.
fn budget_left(
    config: &AgentConfig,
    spent: &Spent<'_>,
    started: Instant,
) -> Result<(), AgentError> {
    match (config.max_budget_usd, spent.cost) {
        (Some(limit), Some(cost)) if cost >= limit => Err(AgentError::BudgetExceeded {
            spent_usd: cost,
            limit_usd: limit,
            debug_messages: Vec::new(),
            partial_usage: Box::new(spent.partial(started)),
        }),
        _ => Ok(()),
    }
}

/// An answer Bedrock stopped without text for a reason other than the model's own end (a
/// guardrail, a content filter, a conversation over the context window, the output limit):
/// the error naming the reason. `None` for any other turn.
fn withheld(turn: &Turn, model: &str, spent: &Spent<'_>) -> Option<AgentError> {
    let why = match turn.stop {
        StopReason::GuardrailIntervened => "a guardrail intervened",
        StopReason::ContentFiltered => "the content was filtered",
        StopReason::ModelContextWindowExceeded => "the conversation exceeds its context window",
        StopReason::MaxTokens => "the output token limit was reached before any text",
        _ => return None,
    };
    if !turn.text.trim().is_empty() {
        return None;
    }
    Some(unrecorded_failure(
        turn.stop.as_str(),
        format!("Bedrock model '{model}' gave no answer: {why}"),
        spent,
    ))
}

/// A step's failure that no attempt again can fix (ironflow retries an `Api` error only with a
/// status of 429, 5xx or none: this one has 422), `what` happened, with the usage `spent` so far
/// in its message and in a WARN line: ironflow records a failed step's usage only from a schema
/// mismatch, so these paid calls are not in the step's record.
fn unrecorded_failure(code: &str, what: String, spent: &Spent<'_>) -> AgentError {
    let usage = format!(
        "{} input and {} output tokens, {} USD, not in the step's record",
        spent.usage.input,
        spent.usage.output,
        spent
            .cost
            .map_or_else(|| "an unknown cost in".to_string(), |c| format!("{c:.6}"))
    );
    warn!(
        model = spent.model,
        code,
        input_tokens = spent.usage.input,
        output_tokens = spent.usage.output,
        cost_usd = spent.cost,
        "the step failed after paid calls ironflow does not record"
    );
    AgentError::Api {
        status: Some(422),
        code: Some(code.to_string()),
        message: format!("{what} ({usage})"),
    }
}

/// What a step's calls cost so far.
struct Spent<'a> {
    model: &'a str,
    prices: &'a [(String, ModelPricing)],
    usage: Usage,
    cost: Option<f64>,
}

impl<'a> Spent<'a> {
    fn new(model: &'a str, prices: &'a [(String, ModelPricing)]) -> Self {
        Self {
            model,
            prices,
            usage: Usage::default(),
            cost: None,
        }
    }

    fn add(&mut self, usage: Usage) {
        self.usage.add(usage);
        self.cost = pricing::cost(self.model, self.usage, self.prices);
    }

    fn partial(&self, started: Instant) -> PartialUsage {
        PartialUsage {
            cost_usd: self.cost,
            duration_ms: Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)),
            input_tokens: Some(self.usage.input),
            cache_read_input_tokens: Some(self.usage.cache_read),
            cache_creation_input_tokens: Some(self.usage.cache_write),
            output_tokens: Some(self.usage.output),
        }
    }

    fn output(&self, value: Value, started: Instant) -> AgentOutput {
        let mut output = AgentOutput::new(value);
        output.cost_usd = self.cost;
        output.input_tokens = Some(self.usage.input);
        output.cache_read_input_tokens = Some(self.usage.cache_read);
        output.cache_creation_input_tokens = Some(self.usage.cache_write);
        output.output_tokens = Some(self.usage.output);
        output.model = Some(self.model.to_string());
        output.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        output
    }
}

/// The step's answer when `turn` ends it: `None` when it called tools the step has
/// (`has_tools`) and did not answer, so the loop goes on.
///
/// # Errors
///
/// The schema's mismatch error when the answer does not match, is not JSON, or never came
/// (the model stopped without calling the answer tool).
fn final_answer(
    turn: &Turn,
    answer: &Answer,
    has_tools: bool,
    model: &str,
    (spent, started): (&Spent<'_>, Instant),
) -> Result<Option<Value>, AgentError> {
    // With its duration: the engine keeps a failed step's usage only when it has a cost or a
    // duration, and an unpriced model's has no cost.
    let partial = || spent.partial(started);
    if let (Answer::Tool(schema), Some(value)) = (answer, &turn.answered) {
        return schema.check(model, value.clone(), partial()).map(Some);
    }
    if has_tools && !turn.calls.is_empty() && turn.message.is_some() {
        return Ok(None);
    }
    if let Some(err) = withheld(turn, model, spent) {
        return Err(err);
    }
    match answer {
        Answer::Text => {
            if turn.stop == StopReason::MaxTokens {
                warn!(
                    model,
                    "the answer was cut at the output token limit (stop reason max_tokens)"
                );
            }
            Ok(Some(Value::String(turn.text.clone())))
        }
        Answer::Native(schema) => match serde_json::from_str::<Value>(turn.text.trim()) {
            Ok(value) => schema.check(model, value, partial()).map(Some),
            Err(e) => Err(mismatch(
                model,
                format!(
                    "an answer that is not JSON ({e}; stop reason {})",
                    turn.stop.as_str()
                ),
                Some(turn.text.clone()),
                partial(),
            )),
        },
        Answer::Tool(_) => Err(mismatch(
            model,
            format!(
                "no call of the {} tool (stop reason {})",
                tools::ANSWER_TOOL,
                turn.stop.as_str()
            ),
            Some(turn.text.clone()),
            partial(),
        )),
    }
}

impl AgentProvider for BedrockProvider {
    fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
        Box::pin(self.run(config))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aws_sdk_bedrockruntime::config::{Credentials, Region, SharedCredentialsProvider};
    use ironflow_model_server::{Match, ModelServer, Reply, Script};

    use super::*;
    use crate::deadline::{LeaseClock, later};
    use crate::store::scope::{CallScope, RunKey};

    /// Throttled past the invocation's time left: the retries stop before the cutoff (not at the
    /// end of an hour-long retry window) and the step asks for a capacity wait.
    #[tokio::test]
    async fn throttling_until_the_cutoff_is_a_capacity_wait_before_it() {
        let server = ModelServer::start(Script::new().always(Match::any(), Reply::throttle()))
            .await
            .unwrap();
        let aws = SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "testing", "testing", None, None, "test",
            )))
            .endpoint_url(server.url())
            .build();
        let provider = BedrockProvider::new(&aws).with_retry_window(Duration::from_secs(3600));
        let now = tokio::time::Instant::now();
        let scope = Arc::new(CallScope::execution(
            RunKey {
                run_id: uuid::Uuid::nil(),
                worker_id: "w".into(),
                claimed_recoveries: None,
                holding: None,
            },
            later(now, Duration::from_millis(1500)),
            Arc::new(LeaseClock::new(now, Duration::from_secs(3600))),
            Arc::default(),
        ));
        let config = AgentConfig::new("hi").model("amazon.nova-pro-v1:0");
        let result =
            tokio::time::timeout(Duration::from_secs(60), scope.run(provider.invoke(&config)))
                .await
                .expect(
                    "the retries stop at the invocation's cutoff, not at the retry window's end",
                );
        assert!(
            matches!(result, Err(AgentError::CapacityWait { .. })),
            "{result:?}"
        );
        assert!(server.calls().total >= 2, "retried within the time left");
    }
}
