//! The providers that work inside a function (`ironflow_lambda::agents`), against the scripted
//! model server (`ironflow-model-server`, the real SDK clients talking to it) and, for the
//! Anthropic key, moto's Secrets Manager (`IRONFLOW_TEST_MOTO_ENDPOINT`).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_secretsmanager::config::Credentials;
use chrono::Utc;
use ironflow_core::error::AgentError;
use ironflow_core::provider::{AgentConfig, AgentProvider};
use ironflow_core::providers::http::tools::{Tool, ToolError, ToolOutput, ToolRegistry};
use ironflow_lambda::logging::{self, CaptureWriter};
use ironflow_lambda::{AnthropicSecretProvider, BedrockProvider, LambdaWorkerBuilder};
use ironflow_model_server::{Match, ModelServer, Outcome, Reply, Route, Script};
use serde_json::{Value, json};

use common::Harness;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::Outcome as RunOutcome;
use ironflow_store::entities::RunStatus;

/// A foundation model of the price table without native structured output.
const NOVA: &str = "us.amazon.nova-pro-v1:0";
/// A model with Converse's structured output format.
const SONNET: &str = "global.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// An AWS configuration pointing Bedrock Runtime at the model server.
fn bedrock_config(server: &ModelServer) -> SdkConfig {
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(
            aws_sdk_secretsmanager::config::SharedCredentialsProvider::new(Credentials::new(
                "testing", "testing", None, None, "test",
            )),
        )
        .endpoint_url(server.url())
        .build()
}

async fn provider(script: Script) -> (ModelServer, BedrockProvider) {
    let server = ModelServer::start(script).await.unwrap();
    let provider = BedrockProvider::new(&bedrock_config(&server));
    (server, provider)
}

fn step(prompt: &str, model: &str) -> AgentConfig {
    AgentConfig::new(prompt).model(model)
}

fn with_schema(mut config: AgentConfig, schema: &Value) -> AgentConfig {
    config.json_schema = Some(schema.to_string());
    config
}

fn count_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"count": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["count", "label"]
    })
}

/// The code of an `AgentError::Api`, `None` for any other error.
fn code_of(err: &AgentError) -> Option<&str> {
    match err {
        AgentError::Api { code, .. } => code.as_deref(),
        _ => None,
    }
}

/// `err` is a capacity wait of `kind` waking 120 to 150 s after `before` (a 120 s pause and its
/// jitter).
fn assert_waits_120_to_150_s(err: AgentError, kind: &str, before: chrono::DateTime<Utc>) {
    let AgentError::CapacityWait { kind: got, wake_at } = err else {
        panic!("expected a capacity wait, got {err}");
    };
    assert_eq!(got, kind);
    assert!(
        wake_at >= before + chrono::TimeDelta::seconds(120),
        "{wake_at}"
    );
    assert!(
        wake_at <= Utc::now() + chrono::TimeDelta::seconds(150),
        "{wake_at}"
    );
}
#[tokio::test]
async fn a_text_answer_is_returned_with_the_system_prompt_and_the_prompt_sent() {
    let (server, provider) =
        provider(Script::new().on(Match::model(NOVA), [Reply::text("Hello from Nova")])).await;
    let config = step("Say hello", NOVA)
        .system_prompt("You are terse.")
        .append_system_prompt("Answer in English.");
    let out = provider.invoke(&config).await.unwrap();
    assert_eq!(out.value, json!("Hello from Nova"));
    assert!(out.debug_messages.is_none(), "no trace unless verbose");
    assert_eq!(out.model.as_deref(), Some(NOVA));
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].route, Route::Converse);
    assert_eq!(requests[0].model, NOVA);
    assert_eq!(
        requests[0].system().as_deref(),
        Some("You are terse.\n\nAnswer in English.")
    );
    assert_eq!(requests[0].last_user_text(), "Say hello");
    assert!(requests[0].tool_names().is_empty());
}

#[tokio::test]
async fn ironflow_s_default_model_becomes_the_provider_s_default() {
    let (server, provider) = provider(Script::new()).await;
    let provider = provider.with_default_model("eu.amazon.nova-lite-v1:0");
    provider.invoke(&AgentConfig::new("hi")).await.unwrap();
    assert_eq!(server.requests()[0].model, "eu.amazon.nova-lite-v1:0");
}

/// ironflow's `opus` and `haiku` become Bedrock's Claude models, whitespace around an id is
/// dropped, and a name that is no Bedrock id (a Claude CLI name, an id with junk inside) fails
/// the step before any call, naming it.
#[tokio::test]
async fn model_aliases_and_names_that_are_no_bedrock_id() {
    let (server, provider) = provider(Script::new()).await;
    for (asked, sent) in [
        ("opus", "global.anthropic.claude-opus-4-5-20251101-v1:0"),
        ("haiku", "global.anthropic.claude-haiku-4-5-20251001-v1:0"),
        (" us.amazon.nova-pro-v1:0\n", NOVA),
    ] {
        provider.invoke(&step("hi", asked)).await.unwrap();
        assert_eq!(server.requests().last().unwrap().model, sent, "{asked:?}");
    }
    let calls = server.requests().len();
    for name in [
        "claude-opus-4-6",
        "us.amazon.nova-pro-v1:0 # the fast one",
        "us.amazon.nova-pro\tv1:0",
    ] {
        let err = provider.invoke(&step("hi", name)).await.unwrap_err();
        assert_eq!(code_of(&err), Some("InvalidModel"), "{err}");
        assert!(err.to_string().contains(&format!("'{name}'")), "{err}");
    }
    assert_eq!(server.requests().len(), calls, "no call was made");
}

#[tokio::test]
async fn structured_output_uses_the_output_format_where_the_model_has_it_else_a_forced_tool() {
    let answer = json!({"count": 3, "label": "three"});
    let (server, provider) = provider(
        Script::new()
            .on(Match::model(SONNET), [Reply::structured(answer.clone())])
            .on(Match::model(NOVA), [Reply::structured(answer.clone())]),
    )
    .await;
    let native = provider
        .invoke(&with_schema(step("count", SONNET), &count_schema()))
        .await
        .unwrap();
    assert_eq!(native.value, answer);
    let forced = provider
        .invoke(&with_schema(step("count", NOVA), &count_schema()))
        .await
        .unwrap();
    assert_eq!(forced.value, answer);

    let sonnet = &server.requests_for(SONNET)[0];
    assert_eq!(
        sonnet.body.pointer("/outputConfig/textFormat/type"),
        Some(&json!("json_schema"))
    );
    assert!(sonnet.tool_choice().is_none());
    let nova = &server.requests_for(NOVA)[0];
    assert!(nova.body.get("outputConfig").is_none());
    assert_eq!(nova.tool_names(), ["structured_output"]);
    assert_eq!(
        nova.tool_choice(),
        Some(&json!({"tool": {"name": "structured_output"}}))
    );
}

#[tokio::test]
async fn an_answer_that_does_not_match_the_schema_is_the_step_s_retryable_error() {
    let (_server, provider) = provider(
        Script::new()
            .on(
                Match::model(NOVA),
                [Reply::structured(json!({"count": "three"}))],
            )
            .on(Match::model(SONNET), [Reply::text("not json at all")]),
    )
    .await;
    for model in [NOVA, SONNET] {
        let err = provider
            .invoke(&with_schema(step("count", model), &count_schema()))
            .await
            .unwrap_err();
        let AgentError::SchemaValidation { expected, got, .. } = &err else {
            panic!("{model}: expected a schema validation error, got {err}");
        };
        assert!(expected.contains(model), "{expected}");
        assert!(!got.is_empty());
        assert!(
            ironflow_core::retry::is_retryable(&err.into()),
            "{model}: a mismatch must be retryable"
        );
    }
}

/// A tool that adds `a` and `b`, counting its calls.
struct Add(Arc<AtomicUsize>);

impl Tool for Add {
    fn name(&self) -> &str {
        "add"
    }
    fn description(&self) -> &str {
        "Adds two integers"
    }
    fn parameters_schema(&self) -> Value {
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
    }
    fn execute(
        &self,
        input: Value,
    ) -> Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + '_>> {
        Box::pin(async move {
            self.0.fetch_add(1, Ordering::SeqCst);
            let n = |k: &str| {
                input
                    .get(k)
                    .and_then(Value::as_i64)
                    .ok_or_else(|| ToolError::new(format!("missing {k}")))
            };
            Ok(ToolOutput::success(format!("sum={}", n("a")? + n("b")?)))
        })
    }
}

#[tokio::test]
async fn tools_run_between_turns_over_several_model_calls() {
    let (server, provider) = provider(Script::new().on(
        Match::model(NOVA),
        [
            Reply::tool_use("add", json!({"a": 2, "b": 3})),
            Reply::tool_use("add", json!({"a": 5, "b": 10})),
            Reply::text("The total is 15"),
        ],
    ))
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let provider = provider.with_tools(ToolRegistry::new().register(Add(runs.clone())));
    let out = provider
        .invoke(&step("add things", NOVA).verbose(true))
        .await
        .unwrap();
    assert_eq!(out.value, json!("The total is 15"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The verbose step's trace: each answer, its tool call and the result sent back.
    let trace = out.debug_messages.expect("a verbose step has its trace");
    assert_eq!(trace.len(), 3);
    assert_eq!(trace[0].tool_calls[0].name, "add");
    assert_eq!(trace[0].tool_results[0].content, json!("sum=5"));
    assert_eq!(trace[2].text.as_deref(), Some("The total is 15"));
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| r.tool_names() == ["add"]));
    // Each turn sends the previous tool call's result back.
    assert_eq!(requests[1].last_user_text(), "sum=5");
    assert_eq!(requests[2].last_user_text(), "sum=15");
    assert_eq!(requests[2].messages().len(), 5);
}

#[tokio::test]
async fn max_turns_reached_with_tool_calls_pending_fails_the_step() {
    let (server, provider) = provider(Script::new().always(
        Match::model(NOVA),
        Reply::tool_use("add", json!({"a": 1, "b": 1})),
    ))
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let provider = provider.with_tools(ToolRegistry::new().register(Add(runs.clone())));
    let err = provider
        .invoke(&step("loop", NOVA).max_turns(3))
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some("error_max_turns"), "{err}");
    assert!(err.to_string().contains(NOVA), "{err}");
    assert_eq!(server.calls().model(NOVA), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // A structured step too: not a schema mismatch, which ironflow would ask again (and run
    // every tool again) twice.
    let err = provider
        .invoke(&with_schema(step("loop", NOVA), &count_schema()).max_turns(3))
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some("error_max_turns"), "{err}");
    assert!(
        err.to_string().contains("not in the step's record"),
        "its usage is said: {err}"
    );
    // ironflow would ask a retryable error again, tools and all.
    assert!(!ironflow_core::retry::is_retryable(&err.into()));
    assert_eq!(server.calls().model(NOVA), 6);
    assert_eq!(runs.load(Ordering::SeqCst), 6);
}

/// The credential chain that finds nothing, as on a machine without a role or keys.
#[derive(Debug)]
struct NoCredentials;

impl aws_credential_types::provider::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no providers in chain provided credentials",
            ),
        ))
    }
}

/// A call that cannot be signed (no credentials) fails the step at once, naming them: no
/// retries for the window, as a network fault would get.
#[tokio::test]
async fn a_call_without_aws_credentials_fails_at_once_naming_them() {
    let server = ModelServer::start(Script::new()).await.unwrap();
    let aws = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(
            aws_sdk_secretsmanager::config::SharedCredentialsProvider::new(NoCredentials),
        )
        .endpoint_url(server.url())
        .build();
    let provider = BedrockProvider::new(&aws).with_retry_window(Duration::from_secs(60));
    let started = std::time::Instant::now();
    let err = provider.invoke(&step("hi", NOVA)).await.unwrap_err();
    assert_eq!(code_of(&err), Some("NoCredentials"), "{err}");
    assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not retried for the window: {:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 0);
    assert!(!ironflow_core::retry::is_retryable(&err.into()));
}

/// ironflow asks a structured step again after a mismatch and records only the last attempt:
/// the provider carries each mismatched attempt's usage to the step's next attempt (by the
/// session id the engine gives each agent step), so the answer, or the last mismatch, counts
/// every paid call. Another step's session starts from zero.
#[tokio::test]
async fn the_usage_of_mismatched_attempts_is_carried_to_the_step_s_answer() {
    let bad = json!({"count": "three", "label": "x"});
    let good = json!({"count": 3, "label": "three"});
    let (_server, provider) = provider(Script::new().on(
        Match::model(NOVA),
        [
            Reply::structured(bad.clone()).with_usage(1_000_000, 0),
            Reply::structured(bad.clone()).with_usage(1_000_000, 0),
            Reply::structured(good.clone()).with_usage(1_000_000, 0),
            Reply::structured(good).with_usage(1_000_000, 0),
        ],
    ))
    .await;
    let mut config = with_schema(step("count", NOVA), &count_schema());
    config.session_id = Some("step-1".into());
    for attempt in 1..=2u64 {
        let err = provider.invoke(&config).await.unwrap_err();
        let AgentError::SchemaValidation { partial_usage, .. } = err else {
            panic!("expected a mismatch, got {err}");
        };
        assert_eq!(partial_usage.input_tokens, Some(attempt * 1_000_000));
        assert!(partial_usage.duration_ms.is_some());
    }
    let out = provider.invoke(&config).await.unwrap();
    assert_eq!(out.input_tokens, Some(3_000_000), "three paid calls");
    assert!(
        (out.cost_usd.unwrap() - 2.4).abs() < 1e-9,
        "{:?}",
        out.cost_usd
    );
    // The step's carry was taken: its next execution (a new session) starts from zero.
    config.session_id = Some("step-2".into());
    let out = provider.invoke(&config).await.unwrap();
    assert_eq!(out.input_tokens, Some(1_000_000));
}

/// A budget that cannot be kept fails the step before any call: zero, negative, not finite,
/// or on a model without a price.
#[tokio::test]
async fn a_budget_that_cannot_be_kept_fails_before_any_call() {
    let (server, provider) = provider(Script::new()).await;
    for (model, budget) in [
        (NOVA, 0.0),
        (NOVA, -1.0),
        (NOVA, f64::NAN),
        (NOVA, f64::INFINITY),
        ("acme.unpriced-v1:0", 0.01),
    ] {
        let err = provider
            .invoke(&step("hi", model).max_budget_usd(budget))
            .await
            .unwrap_err();
        assert_eq!(code_of(&err), Some("InvalidBudget"), "{budget}: {err}");
        assert!(err.to_string().contains("max_budget_usd"), "{err}");
    }
    assert_eq!(server.requests().len(), 0, "no call was made");
    // A priced model with a budget above zero is called.
    provider
        .invoke(&step("hi", NOVA).max_budget_usd(1.0))
        .await
        .unwrap();
    assert_eq!(server.calls().model(NOVA), 1);
}

/// An answer Bedrock withheld (empty, for a guardrail, a filter, the context window, the
/// output limit) fails the step naming the stop reason; it is not an empty success.
#[tokio::test]
async fn an_answer_withheld_by_a_guardrail_or_a_filter_fails_naming_the_stop_reason() {
    let withheld = |stop: &str| {
        Reply::raw(
            200,
            "application/json",
            json!({
                "output": {"message": {"role": "assistant", "content": []}},
                "stopReason": stop,
                "usage": {"inputTokens": 10, "outputTokens": 0, "totalTokens": 10},
                "metrics": {"latencyMs": 5}
            })
            .to_string(),
        )
    };
    let stops = [
        "guardrail_intervened",
        "content_filtered",
        "model_context_window_exceeded",
        "max_tokens",
    ];
    let (_server, provider) =
        provider(Script::new().on(Match::model(NOVA), stops.iter().map(|s| withheld(s)))).await;
    for stop in stops {
        let err = provider.invoke(&step("hi", NOVA)).await.unwrap_err();
        assert_eq!(code_of(&err), Some(stop), "{stop}: {err}");
        assert!(!ironflow_core::retry::is_retryable(&err.into()), "{stop}");
    }
}

#[tokio::test]
async fn throttling_and_5xx_are_retried_then_the_answer_is_returned() {
    let (server, provider) = provider(Script::new().on(
        Match::model(NOVA),
        [
            Reply::throttle(),
            Reply::server_error(),
            Reply::unavailable(),
            Reply::cut(),
            Reply::text("finally"),
        ],
    ))
    .await;
    let out = provider.invoke(&step("hi", NOVA)).await.unwrap();
    assert_eq!(out.value, json!("finally"));
    assert_eq!(server.calls().model(NOVA), 5);
}

/// Errors the SDK does not model are judged by their HTTP status: a proxy's 502 page, a 429
/// without an error type, AWS's `InternalFailure` and a success whose body is garbled are
/// retried like throttling, not taken for a refusal; a 4xx the SDK does not model is refused
/// with its own status.
#[tokio::test]
async fn unmodelled_errors_are_judged_by_their_http_status() {
    let (server, provider) = provider(Script::new().on(
        Match::model(NOVA),
        [
            Reply::raw(
                502,
                "text/html",
                "<html><body>502 Bad Gateway</body></html>",
            ),
            Reply::raw(429, "application/json", "{}"),
            Reply::raw(
                500,
                "application/json",
                r#"{"__type":"InternalFailure","message":"internal"}"#,
            ),
            Reply::raw(200, "application/json", r#"{"output": {"mess"#),
            Reply::text("through"),
        ],
    ))
    .await;
    let out = provider.invoke(&step("hi", NOVA)).await.unwrap();
    assert_eq!(out.value, json!("through"));
    assert_eq!(server.calls().model(NOVA), 5);

    server.push_always(
        Match::model(NOVA),
        Reply::raw(
            418,
            "application/json",
            r#"{"__type":"TeapotException","message":"short and stout"}"#,
        ),
    );
    let err = provider.invoke(&step("hi", NOVA)).await.unwrap_err();
    let AgentError::Api { status, code, .. } = &err else {
        panic!("expected a refusal, got {err}");
    };
    assert_eq!(*status, Some(418), "{err}");
    assert_eq!(code.as_deref(), Some("TeapotException"), "{err}");
    assert_eq!(server.calls().model(NOVA), 6, "a refusal is not retried");
}

#[tokio::test]
async fn a_call_longer_than_the_per_call_limit_is_dropped_as_a_timeout() {
    let (server, provider) = provider(Script::new().on(
        Match::model(NOVA),
        [Reply::text("too late").delayed(Duration::from_secs(30))],
    ))
    .await;
    let provider = provider.with_call_limit(Duration::from_millis(300));
    let err = tokio::time::timeout(Duration::from_secs(20), provider.invoke(&step("hi", NOVA)))
        .await
        .expect("the call is dropped at its limit")
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Timeout { limit } if limit == Duration::from_millis(300)),
        "{err}"
    );
    assert_eq!(
        server.calls().model(NOVA),
        1,
        "a slow answer is not retried"
    );
}

#[tokio::test]
async fn a_priced_step_past_its_budget_makes_no_further_turn() {
    let (server, provider) = provider(Script::new().always(
        Match::model(NOVA),
        Reply::tool_use("add", json!({"a": 1, "b": 2})).with_usage(1_000_000, 0),
    ))
    .await;
    let provider =
        provider.with_tools(ToolRegistry::new().register(Add(Arc::new(AtomicUsize::new(0)))));
    let err = provider
        .invoke(&step("add", NOVA).max_budget_usd(1.0))
        .await
        .unwrap_err();
    let AgentError::BudgetExceeded { spent_usd, .. } = err else {
        panic!("expected the budget exceeded, got {err}");
    };
    // $0.80 after the first turn, $1.60 after the second: no third.
    assert_eq!(spent_usd, 1.6);
    assert_eq!(server.calls().model(NOVA), 2);
}

#[tokio::test]
async fn throttling_beyond_the_retry_window_is_a_capacity_wait_within_the_step_s_budget() {
    let (server, provider) =
        provider(Script::new().always(Match::model(NOVA), Reply::throttle())).await;
    let provider = provider
        .with_retry_window(Duration::from_millis(600))
        .with_capacity_pause(Duration::from_secs(120));
    let before = Utc::now();
    let err = provider.invoke(&step("hi", NOVA)).await.unwrap_err();
    assert_waits_120_to_150_s(err, "bedrock", before);
    assert!(server.calls().model(NOVA) >= 2, "retried before waiting");
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.outcome == Outcome::Throttled)
    );

    // A step that may not wait fails at once with no capacity; one past its budget too.
    let err = provider
        .invoke(&step("hi", NOVA).max_capacity_wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::NoCapacity { .. }), "{err}");
    let spent = step("hi", NOVA)
        .max_capacity_wait(Duration::from_secs(60))
        .capacity_wait_since(Utc::now() - chrono::TimeDelta::seconds(61));
    let err = provider.invoke(&spent).await.unwrap_err();
    assert!(matches!(err, AgentError::NoCapacity { .. }), "{err}");
}

#[tokio::test]
async fn an_unknown_model_or_a_refused_permission_fails_naming_the_model_without_retries() {
    let (server, provider) = provider(
        Script::new()
            .unknown_model("acme.no-such-model-v1:0")
            .on(Match::model(NOVA), [Reply::access_denied()]),
    )
    .await;
    for (model, status) in [("acme.no-such-model-v1:0", 400), (NOVA, 403)] {
        let err = provider.invoke(&step("hi", model)).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::Api { status: Some(s), .. } if *s == status),
            "{err}"
        );
        assert!(err.to_string().contains(model), "{err}");
        assert!(!ironflow_core::retry::is_retryable(&err.into()));
        assert_eq!(server.calls().model(model), 1, "not retried");
    }
    // A schema that is not JSON Schema fails before any call, naming the model.
    let err = provider
        .invoke(&with_schema(step("hi", NOVA), &json!({"type": 7})))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(NOVA), "{err}");
    assert_eq!(server.calls().model(NOVA), 1);
}

#[tokio::test]
async fn usage_is_summed_over_turns_and_priced_for_a_model_of_the_table_only() {
    let script = Script::new()
        .on(
            Match::model(NOVA),
            [
                Reply::tool_use("add", json!({"a": 1, "b": 2})).with_usage(600_000, 100_000),
                Reply::text("3").with_usage(400_000, 900_000),
            ],
        )
        .on(
            Match::model("acme.custom-v1:0"),
            [Reply::text("x").with_usage(1_000, 2_000)],
        );
    let (_server, provider) = provider(script).await;
    let provider =
        provider.with_tools(ToolRegistry::new().register(Add(Arc::new(AtomicUsize::new(0)))));
    let out = provider.invoke(&step("add", NOVA)).await.unwrap();
    assert_eq!(out.input_tokens, Some(1_000_000));
    assert_eq!(out.output_tokens, Some(1_000_000));
    // Nova Pro: $0.80 per million input tokens, $3.20 per million output tokens.
    assert_eq!(out.cost_usd, Some(4.0));
    let out = provider
        .invoke(&step("x", "acme.custom-v1:0"))
        .await
        .unwrap();
    assert_eq!(out.input_tokens, Some(1_000));
    assert_eq!(out.output_tokens, Some(2_000));
    assert_eq!(out.cost_usd, None);
}

#[tokio::test]
async fn from_env_reaches_the_endpoint_aws_endpoint_url_bedrock_runtime_names() {
    let server = ModelServer::start(Script::new().on(Match::model(NOVA), [Reply::text("via env")]))
        .await
        .unwrap();
    // SAFETY: nextest runs each test in its own process, and this test's runtime has one
    // thread: nothing reads the environment concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.url());
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::remove_var("AWS_ENDPOINT_URL");
    }
    let out = BedrockProvider::from_env()
        .invoke(&step("hi", NOVA))
        .await
        .unwrap();
    assert_eq!(out.value, json!("via env"));
    assert_eq!(server.calls().model(NOVA), 1);
}

/// The Anthropic API key comes from moto's Secrets Manager at cold start (the builder, as the
/// function's cold start does); a refused key is read again once and the new one used; a
/// second refusal within the minute does not read it again; and no key is in any log line,
/// at TRACE, even one the test itself logs.
#[tokio::test]
async fn the_anthropic_key_comes_from_secrets_manager_is_re_read_once_when_refused_and_never_logged()
 {
    let capture = CaptureWriter::default();
    assert!(logging::init(
        tracing_subscriber::EnvFilter::new("trace"),
        capture.clone()
    ));
    let first = format!("sk-ant-first-{}", uuid::Uuid::new_v4());
    let second = format!("sk-ant-second-{}", uuid::Uuid::new_v4());
    let third = format!("sk-ant-third-{}", uuid::Uuid::new_v4());
    let aws = common::moto::aws_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&aws);
    let arn = secrets
        .create_secret()
        .name(format!("ironflow/anthropic-{}", uuid::Uuid::new_v4()))
        .secret_string(json!({ "api_key": first }).to_string())
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_string();
    let lookup = |name: &str| match name {
        "IRONFLOW_API_URL" => Some("http://127.0.0.1:1".to_string()),
        "IRONFLOW_WORKER_TOKEN" => Some("test-worker-token".to_string()),
        "IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN" => Some(arn.clone()),
        _ => None,
    };
    let builder = LambdaWorkerBuilder::from_lookup_and_secrets(lookup, &aws)
        .await
        .unwrap();
    let server = ModelServer::start(Script::new().on(
        Match::any().on(Route::Messages),
        [Reply::text("hello"), Reply::text("again")],
    ))
    .await
    .unwrap();
    let anthropic: AnthropicSecretProvider = builder
        .anthropic_provider()
        .expect("the variable is set")
        .with_base_url(&server.url());
    let config = AgentConfig::new("hi").model("claude-sonnet-4-5");

    // The key read at cold start.
    assert_eq!(
        anthropic.invoke(&config).await.unwrap().value,
        json!("hello")
    );
    // Rotated: the old key is refused, the secret read again, the call made once more.
    server.refuse_key(first.clone());
    let rotate = |key: String| {
        let (secrets, arn) = (secrets.clone(), arn.clone());
        async move {
            secrets
                .put_secret_value()
                .secret_id(arn)
                .secret_string(key)
                .send()
                .await
                .unwrap();
        }
    };
    rotate(second.clone()).await;
    assert_eq!(
        anthropic.invoke(&config).await.unwrap().value,
        json!("again")
    );
    // Refused again within the minute: not read again, the 401 fails the step.
    server.refuse_key(second.clone());
    rotate(third.clone()).await;
    let err = anthropic.invoke(&config).await.unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::HttpProvider {
                status_code: 401,
                ..
            }
        ),
        "{err}"
    );
    let keys: Vec<Option<String>> = server
        .requests()
        .iter()
        .map(|r| r.api_key().map(String::from))
        .collect();
    assert_eq!(
        keys,
        [&first, &first, &second, &second].map(|k| Some(k.clone()))
    );

    // Whatever reaches a log line, the keys do not (one logged here on purpose).
    tracing::error!("a careless line: {first} {second}");
    let logs = capture.contents();
    assert!(logs.contains("a careless line"), "the capture works");
    assert!(
        logs.contains("refused its key"),
        "the refusal is logged (without the key)"
    );
    for key in [&first, &second] {
        assert!(!logs.contains(key.as_str()), "a key is in the logs");
    }
    assert!(!logs.contains(&third), "the unread key is nowhere either");
}

/// One agent step on Nova, its answer kept in a file.
struct AskNova;

impl WorkflowHandler for AskNova {
    fn name(&self) -> &str {
        "ask-nova"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let answer = ctx.agent("ask", AgentConfig::new("hi").model(NOVA)).await?;
            ctx.shell(
                "after",
                ironflow_engine::config::ShellConfig::new(&format!("echo {}", answer.output)),
            )
            .await?;
            Ok(())
        })
    }
}

/// Through the Lambda handler on the real API: a step Bedrock throttles through its retries
/// puts the run to sleep (Suspended, due at the provider's wake time) twice in a row, with a
/// poison-pill threshold of 1, and neither sleep counts: the wake-up (the API's timer) resumes it
/// and it completes once Bedrock answers.
#[tokio::test]
async fn a_throttled_step_sleeps_and_wakes_and_no_sleep_counts_toward_the_poison_pill() {
    let server = ModelServer::start(Script::new().always(Match::model(NOVA), Reply::throttle()))
        .await
        .unwrap();
    let h = Arc::new(Harness::start().await);
    let provider = BedrockProvider::new(&bedrock_config(&server))
        .with_retry_window(Duration::from_millis(300))
        .with_capacity_pause(Duration::from_secs(1));
    let worker = h
        .builder()
        .provider(Arc::new(provider))
        .poison_threshold(1)
        .register(AskNova)
        .build()
        .unwrap();
    let id = h.create("ask-nova", 0).await;
    for round in 0..2 {
        let before = Utc::now();
        let summary = h.invoke(&worker, Duration::from_secs(60)).await;
        assert_eq!(summary.runs.len(), 1, "round {round}: {summary:?}");
        let report = &summary.runs[0];
        assert_eq!(
            report.outcome,
            RunOutcome::Suspended,
            "round {round}: {summary:?}"
        );
        let due = report.due.expect("a sleeping run is due at its wake time");
        assert!(due.at >= before + chrono::TimeDelta::seconds(1), "{due:?}");
        let run = h.run(id).await;
        assert_eq!(run.status.state, RunStatus::Sleeping);
        assert_eq!(
            run.capacity_wait_kind.map(|k| k.to_string()).as_deref(),
            Some("bedrock")
        );
        common::wait_until(
            "the API's timer wakes the run",
            Duration::from_secs(60),
            || {
                let h = h.clone();
                async move { h.status(id).await == RunStatus::Pending }
            },
        )
        .await;
    }
    server.push(Match::model(NOVA), [Reply::text("capacity-is-back")]);
    let summary = h.invoke(&worker, Duration::from_secs(60)).await;
    assert_eq!(
        summary.runs[0].outcome,
        RunOutcome::Completed,
        "{summary:?}"
    );
    assert_eq!(h.status(id).await, RunStatus::Completed);
    let ask = h
        .steps(id)
        .await
        .into_iter()
        .rfind(|s| s.name == "ask")
        .unwrap();
    assert_eq!(ask.output, Some(json!("capacity-is-back")));
}

/// The worker's budget (`IRONFLOW_MAX_CAPACITY_WAIT_SECS`) reaches a step that sets none: at
/// zero, a step Bedrock throttles through its retries fails at once instead of sleeping.
#[tokio::test]
async fn the_worker_s_capacity_wait_budget_reaches_a_bedrock_step() {
    let server = ModelServer::start(Script::new().always(Match::model(NOVA), Reply::throttle()))
        .await
        .unwrap();
    let h = Harness::start().await;
    let provider = BedrockProvider::new(&bedrock_config(&server))
        .with_retry_window(Duration::from_millis(300));
    let worker = h
        .builder()
        .provider(Arc::new(provider))
        .max_capacity_wait(Duration::ZERO)
        .register(AskNova)
        .build()
        .unwrap();
    let id = h.create("ask-nova", 0).await;
    let summary = h.invoke(&worker, Duration::from_secs(60)).await;
    assert_eq!(summary.runs[0].outcome, RunOutcome::Failed, "{summary:?}");
    let error = h.run(id).await.error.unwrap_or_default();
    assert!(error.contains("no capacity for bedrock"), "{error}");
}

/// An Anthropic provider of `server` whose key is a fresh moto secret.
async fn anthropic(server: &ModelServer) -> AnthropicSecretProvider {
    let aws = common::moto::aws_config().await;
    let arn = aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(format!("ironflow/anthropic-{}", uuid::Uuid::new_v4()))
        .secret_string(format!("sk-ant-{}", uuid::Uuid::new_v4()))
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_string();
    AnthropicSecretProvider::from_secret(&aws, &arn)
        .await
        .unwrap()
        .with_base_url(&server.url())
}

/// Anthropic's throttling is retried (after its `retry-after`) within the retry window, and past
/// it the run sleeps until the `retry-after` (else the capacity pause), as Bedrock's does.
#[tokio::test]
async fn anthropic_throttling_is_retried_then_a_capacity_wait_until_its_retry_after() {
    let messages = || Match::any().on(Route::Messages);
    let server = ModelServer::start(Script::new().on(
        messages(),
        [
            Reply::throttle_retry_after(Duration::from_secs(1)),
            Reply::unavailable(),
            Reply::text("after"),
        ],
    ))
    .await
    .unwrap();
    let provider = anthropic(&server).await;
    let config = AgentConfig::new("hi").model("claude-sonnet-4-5");
    assert_eq!(
        provider.invoke(&config).await.unwrap().value,
        json!("after")
    );
    assert_eq!(server.calls().route(Route::Messages), 3);

    server.push_always(
        messages(),
        Reply::throttle_retry_after(Duration::from_secs(120)),
    );
    let before = Utc::now();
    let err = provider.invoke(&config).await.unwrap_err();
    assert_waits_120_to_150_s(err, "anthropic", before);
    assert_eq!(
        server.calls().route(Route::Messages),
        4,
        "a retry-after beyond the window is not waited for in the invocation"
    );
}

/// Anthropic: a cut connection is retried within the window like throttling (a garbled answer,
/// billed, is not); a `retry-after` of 0 still backs off; one of centuries is a capacity wait of
/// at most a day, not a panic.
#[tokio::test]
async fn anthropic_cut_connections_and_extreme_retry_after_values_are_retried_and_bounded() {
    let messages = || Match::any().on(Route::Messages);
    let server = ModelServer::start(Script::new().on(
        messages(),
        [
            Reply::cut(),
            Reply::cut(),
            Reply::throttle_retry_after(Duration::ZERO),
            Reply::throttle_retry_after(Duration::ZERO),
            Reply::text("after"),
        ],
    ))
    .await
    .unwrap();
    let provider = anthropic(&server).await;
    let config = AgentConfig::new("hi").model("claude-sonnet-4-5");
    let started = std::time::Instant::now();
    assert_eq!(
        provider.invoke(&config).await.unwrap().value,
        json!("after")
    );
    assert_eq!(server.calls().route(Route::Messages), 5);
    // Four backoffs of at least 0.1, 0.2, 0.4 and 0.8 s (half of 0.2 s doubling).
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "a retry-after of 0 backs off: {:?}",
        started.elapsed()
    );

    server.push_always(
        messages(),
        Reply::throttle_retry_after(Duration::from_secs(u64::MAX / 2)),
    );
    let err = provider.invoke(&config).await.unwrap_err();
    let AgentError::CapacityWait { wake_at, .. } = err else {
        panic!("expected a capacity wait, got {err}");
    };
    assert!(
        wake_at <= Utc::now() + chrono::TimeDelta::hours(30),
        "{wake_at}"
    );

    // A 200 whose body cannot be read was billed: not asked again.
    server.push(
        messages(),
        [Reply::raw(200, "application/json", r#"{"content": [{"ty"#)],
    );
    let before = server.calls().route(Route::Messages);
    let err = provider.invoke(&config).await.unwrap_err();
    assert!(
        matches!(&err, AgentError::HttpProvider { status_code: 0, .. }),
        "{err}"
    );
    assert_eq!(server.calls().route(Route::Messages), before + 1);
}

/// A `retry-after` of 0 says nothing of when capacity returns: past the window, the run sleeps
/// the capacity pause, not zero (it would wake at once, to be throttled again).
#[tokio::test]
async fn anthropic_throttling_with_a_zero_retry_after_sleeps_the_capacity_pause() {
    let server = ModelServer::start(Script::new().always(
        Match::any().on(Route::Messages),
        Reply::throttle_retry_after(Duration::ZERO),
    ))
    .await
    .unwrap();
    let provider = anthropic(&server)
        .await
        .with_retry_window(Duration::ZERO)
        .with_capacity_pause(Duration::from_secs(120));
    let before = Utc::now();
    let err = provider
        .invoke(&AgentConfig::new("hi").model("claude-sonnet-4-5"))
        .await
        .unwrap_err();
    assert_waits_120_to_150_s(err, "anthropic", before);
}

/// An Anthropic key secret that cannot serve stops the cold start, naming the variable and the
/// ARN, never the value (a value with a space in it would break every request's header).
#[tokio::test]
async fn an_anthropic_key_secret_that_cannot_serve_fails_the_cold_start_naming_it() {
    let aws = common::moto::aws_config().await;
    let unusable = aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(format!("ironflow/anthropic-{}", uuid::Uuid::new_v4()))
        .secret_string("sk-ant with-a-space-s3cret")
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_string();
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ironflow/missing-AbC123";
    for (arn, expected) in [
        (unusable.as_str(), "cannot serve"),
        (missing, "ResourceNotFound"),
    ] {
        let lookup = |name: &str| match name {
            "IRONFLOW_API_URL" => Some("http://127.0.0.1:1".to_string()),
            "IRONFLOW_WORKER_TOKEN" => Some("test-worker-token".to_string()),
            "IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN" => Some(arn.to_string()),
            _ => None,
        };
        let err = LambdaWorkerBuilder::from_lookup_and_secrets(lookup, &aws)
            .await
            .err()
            .expect("the cold start fails");
        let message = err.to_string();
        assert!(
            message.contains("IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN")
                && message.contains(arn)
                && message.contains(expected),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "the value leaked: {message}");
    }
}
