//! ironflow-core's Anthropic Messages API provider (feature `provider-anthropic-api`, the
//! real client) against the server: these prove the `/v1/messages` wire format.

use std::future::Future;
use std::pin::Pin;

use ironflow_core::error::AgentError;
use ironflow_core::provider::{AgentConfig, AgentProvider};
use ironflow_core::providers::http::HttpAgentProvider;
use ironflow_core::providers::http::anthropic::adapter::AnthropicApiAdapter;
use ironflow_core::providers::http::tools::{Tool, ToolError, ToolOutput, ToolRegistry};
use ironflow_model_server::{Match, ModelServer, Outcome, Reply, Route, Script};
use serde_json::{Value, json};

const MODEL: &str = "claude-haiku-4-5-20251001";

async fn start(script: Script) -> ModelServer {
    ModelServer::start(script)
        .await
        .expect("the model server binds 127.0.0.1")
}

fn provider(server: &ModelServer, key: &str) -> HttpAgentProvider<AnthropicApiAdapter> {
    HttpAgentProvider::new(AnthropicApiAdapter::new(key.to_string()).with_base_url(server.url()))
}

fn config(prompt: &str) -> AgentConfig {
    AgentConfig::new(prompt)
        .model(MODEL)
        .system_prompt("Answer briefly.")
}

#[tokio::test]
async fn a_text_answer_reaches_the_provider_with_its_usage_and_the_key_is_recorded() {
    let server = start(Script::new().on(
        Match::model(MODEL).on(Route::Messages),
        [Reply::text("Paris").with_usage(21, 4)],
    ))
    .await;

    let out = provider(&server, "sk-test-1")
        .invoke(&config("Capital of France?"))
        .await
        .expect("a text answer");
    assert_eq!(out.value, json!("Paris"));
    assert_eq!((out.input_tokens, out.output_tokens), (Some(21), Some(4)));
    assert_eq!(out.model.as_deref(), Some(MODEL));

    let request = &server.requests()[0];
    assert_eq!(
        (request.route, request.model.as_str()),
        (Route::Messages, MODEL)
    );
    assert_eq!(request.api_key(), Some("sk-test-1"));
    assert_eq!(
        request.headers.get("anthropic-version").map(String::as_str),
        Some("2023-06-01")
    );
    assert_eq!(request.system().as_deref(), Some("Answer briefly."));
    assert_eq!(request.last_user_text(), "Capital of France?");
    assert_eq!(request.outcome, Outcome::Text);
    assert_eq!(server.calls().route(Route::Messages), 1);
}

#[tokio::test]
async fn the_same_answer_streams_as_server_sent_events() {
    let server =
        start(Script::new().on(Match::any(), [Reply::text("streamed").with_usage(5, 2)])).await;
    let out = provider(&server, "k")
        .invoke(&config("hi").verbose(true))
        .await
        .expect("a streamed answer");
    assert_eq!(out.value, json!("streamed"));
    assert_eq!((out.input_tokens, out.output_tokens), (Some(5), Some(2)));
    assert_eq!(server.requests()[0].body["stream"], true);
}

#[tokio::test]
async fn a_refused_key_is_a_401_and_a_rotated_one_is_accepted() {
    let server = start(Script::new().refuse_key("sk-old")).await;

    let err = provider(&server, "sk-old")
        .invoke(&config("hi"))
        .await
        .expect_err("refused");
    match err {
        AgentError::HttpProvider {
            status_code: 401,
            message,
            ..
        } => assert_eq!(message, "invalid x-api-key"),
        other => panic!("expected a 401, got {other:?}"),
    }
    let out = provider(&server, "sk-new")
        .invoke(&config("hi"))
        .await
        .expect("the rotated key is accepted");
    assert_eq!(out.value, json!(Script::DEFAULT_TEXT));
    let keys: Vec<Option<String>> = server
        .requests()
        .iter()
        .map(|r| r.api_key().map(String::from))
        .collect();
    assert_eq!(
        keys,
        [Some("sk-old".to_string()), Some("sk-new".to_string())]
    );
    assert_eq!(server.requests()[0].outcome, Outcome::Unauthorized);
}

#[tokio::test]
async fn throttling_overload_and_unknown_models_are_the_apis_errors() {
    const BAD: &str = "claude-nonexistent";
    let server = start(Script::new().unknown_model(BAD).on(
        Match::model(MODEL),
        [
            Reply::throttle_retry_after(std::time::Duration::from_millis(1500)),
            Reply::unavailable(),
            Reply::server_error(),
        ],
    ))
    .await;
    let provider = provider(&server, "k");

    match provider.invoke(&config("hi")).await.expect_err("throttled") {
        AgentError::RateLimited {
            retry_after_secs, ..
        } => assert_eq!(retry_after_secs, Some(2)),
        other => panic!("expected RateLimited, got {other:?}"),
    }
    match provider
        .invoke(&config("hi"))
        .await
        .expect_err("overloaded")
    {
        AgentError::HttpProvider {
            status_code: 529,
            message,
            ..
        } => assert_eq!(message, "Overloaded"),
        other => panic!("expected a 529, got {other:?}"),
    }
    match provider.invoke(&config("hi")).await.expect_err("500") {
        AgentError::HttpProvider {
            status_code: 500,
            message,
            ..
        } => assert_eq!(message, "Internal server error"),
        other => panic!("expected a 500, got {other:?}"),
    }
    match provider
        .invoke(&config("hi").model(BAD))
        .await
        .expect_err("unknown model")
    {
        AgentError::HttpProvider {
            status_code: 404,
            message,
            ..
        } => assert_eq!(message, format!("model: {BAD}")),
        other => panic!("expected a 404, got {other:?}"),
    }
}

#[tokio::test]
async fn a_structured_answer_is_the_forced_tools_input() {
    let answer = json!({ "verdict": "approve" });
    let server = start(Script::new().on(Match::any(), [Reply::structured(answer.clone())])).await;
    let mut config = config("judge");
    config.json_schema =
        Some(r#"{"type":"object","properties":{"verdict":{"type":"string"}}}"#.to_string());

    let out = provider(&server, "k")
        .invoke(&config)
        .await
        .expect("a structured answer");
    assert_eq!(out.value, answer);
    let request = &server.requests()[0];
    assert_eq!(
        request.tool_choice(),
        Some(&json!({ "type": "tool", "name": "structured_output" }))
    );
    assert_eq!(request.outcome, Outcome::Structured);
}

struct Lookup;

impl Tool for Lookup {
    fn name(&self) -> &str {
        "lookup"
    }

    fn description(&self) -> &str {
        "Look an order up."
    }

    fn parameters_schema(&self) -> Value {
        json!({ "type": "object", "properties": { "id": { "type": "integer" } } })
    }

    fn execute(
        &self,
        input: Value,
    ) -> Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + '_>> {
        Box::pin(async move {
            Ok(ToolOutput::success(format!(
                "order {} shipped",
                input["id"]
            )))
        })
    }
}

#[tokio::test]
async fn the_providers_tool_loop_gets_its_results_paired_with_its_calls() {
    let server = start(Script::new().on(
        Match::any(),
        [
            Reply::tool_use("lookup", json!({ "id": 7 })),
            Reply::text("Order 7 shipped."),
        ],
    ))
    .await;
    let provider = provider(&server, "k").with_tools(ToolRegistry::new().register(Lookup));

    let out = provider
        .invoke(&config("Where is order 7?"))
        .await
        .expect("an answer after one tool call");
    assert_eq!(out.value, json!("Order 7 shipped."));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].tool_names(), ["lookup"]);
    assert_eq!(requests[1].last_user_text(), "order 7 shipped");
    assert_eq!(requests[1].outcome, Outcome::Text);
}

#[tokio::test]
async fn a_structured_answer_is_text_json_for_a_model_with_an_output_format() {
    // ironflow-core asks these models for `output_config.format` instead of a forced tool,
    // and reads the answer's text as JSON when the answer's `model` is one of them.
    const OUTPUT_FORMAT_MODEL: &str = "claude-sonnet-5-5";
    let answer = json!({ "verdict": "reject", "reasons": ["too long"] });
    let server = start(Script::new().on(
        Match::model(OUTPUT_FORMAT_MODEL),
        [Reply::structured(answer.clone())],
    ))
    .await;
    let mut config = config("judge").model(OUTPUT_FORMAT_MODEL);
    config.json_schema = Some(r#"{"type":"object"}"#.to_string());

    let out = provider(&server, "k")
        .invoke(&config)
        .await
        .expect("a structured answer");
    assert_eq!(out.value, answer);
    let request = &server.requests()[0];
    assert!(
        request
            .body
            .pointer("/output_config/format/schema")
            .is_some(),
        "{}",
        request.body
    );
    assert_eq!(request.tool_choice(), None);
}
