//! The real aws-sdk-bedrockruntime client against the server: these prove the Converse wire
//! format (the SDK's serializers write what the server reads, its deserializers read what
//! the server writes, its error parser and retry classifiers see the service's errors).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::config::retry::RetryConfig;
use aws_sdk_bedrockruntime::config::timeout::TimeoutConfig;
use aws_sdk_bedrockruntime::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::operation::converse::{ConverseError, ConverseOutput};
use aws_sdk_bedrockruntime::types::{
    AutoToolChoice, ContentBlock, ConversationRole, InferenceConfiguration, JsonSchemaDefinition,
    Message, OutputConfig, OutputFormat, OutputFormatStructure, OutputFormatType,
    SpecificToolChoice, StopReason, SystemContentBlock, Tool, ToolChoice, ToolConfiguration,
    ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolSpecification, ToolUseBlock,
};
use aws_smithy_types::{Document, Number};
use ironflow_model_server::{Match, ModelServer, Outcome, Reply, Route, Script};
use serde_json::{Value, json};

const HAIKU_PROFILE: &str = "us.anthropic.claude-3-5-haiku-20241022-v1:0";
const SONNET: &str = "anthropic.claude-3-5-sonnet-20240620-v1:0";

async fn start(script: Script) -> ModelServer {
    ModelServer::start(script)
        .await
        .expect("the model server binds 127.0.0.1")
}

fn client(server: &ModelServer, retry: RetryConfig) -> Client {
    let config = aws_sdk_bedrockruntime::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "AKIDTESTING",
            "testing",
            None,
            None,
            "test",
        ))
        .endpoint_url(server.url())
        .retry_config(retry)
        .build();
    Client::from_conf(config)
}

fn user(text: &str) -> Message {
    Message::builder()
        .role(ConversationRole::User)
        .content(ContentBlock::Text(text.into()))
        .build()
        .expect("a message with a role and content")
}

fn doc(value: &Value) -> Document {
    match value {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (_, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or_default()),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(items) => Document::Array(items.iter().map(doc).collect()),
        Value::Object(map) => Document::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), doc(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn tool_config(names: &[&str], choice: ToolChoice) -> ToolConfiguration {
    let schema = doc(&json!({ "type": "object", "properties": { "id": { "type": "integer" } } }));
    let mut builder = ToolConfiguration::builder().tool_choice(choice);
    for name in names {
        let spec = ToolSpecification::builder()
            .name(*name)
            .description("a tool")
            .input_schema(ToolInputSchema::Json(schema.clone()))
            .build()
            .expect("a tool with a name and schema");
        builder = builder.tools(Tool::ToolSpec(spec));
    }
    builder.build().expect("a tool configuration with tools")
}

/// The first content block of `output`'s answer, if it is text.
fn first_text(output: &ConverseOutput) -> Option<&str> {
    message(output)
        .content()
        .first()?
        .as_text()
        .ok()
        .map(String::as_str)
}

/// Ask `model` one user `prompt`, nothing else.
async fn ask(
    client: &Client,
    model: &str,
    prompt: &str,
) -> Result<ConverseOutput, SdkError<ConverseError>> {
    client
        .converse()
        .model_id(model)
        .messages(user(prompt))
        .send()
        .await
}

fn message(output: &ConverseOutput) -> &Message {
    output
        .output()
        .and_then(|o| o.as_message().ok())
        .expect("the answer is a message")
}

fn service_error(err: SdkError<ConverseError>) -> ConverseError {
    match err {
        SdkError::ServiceError(e) => e.into_err(),
        other => panic!("expected a service error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_text_answer_reaches_the_sdk_with_its_stop_reason_and_usage() {
    let server = start(Script::new().on(
        Match::model(HAIKU_PROFILE),
        [Reply::text("Paris").with_usage(12, 3)],
    ))
    .await;

    let out = client(&server, RetryConfig::disabled())
        .converse()
        .model_id(HAIKU_PROFILE)
        .system(SystemContentBlock::Text("Answer in one word.".into()))
        .messages(user("Capital of France?"))
        .inference_config(InferenceConfiguration::builder().max_tokens(64).build())
        .send()
        .await
        .expect("a text answer");

    let answer = message(&out);
    assert_eq!(answer.role(), &ConversationRole::Assistant);
    assert_eq!(answer.content().len(), 1);
    assert_eq!(
        answer.content()[0].as_text().ok().map(String::as_str),
        Some("Paris")
    );
    assert_eq!(out.stop_reason(), &StopReason::EndTurn);
    let usage = out.usage().expect("usage");
    assert_eq!(
        (
            usage.input_tokens(),
            usage.output_tokens(),
            usage.total_tokens()
        ),
        (12, 3, 15)
    );
    assert!(out.metrics().is_some(), "metrics.latencyMs is read");
    assert_eq!(
        aws_sdk_bedrockruntime::operation::RequestId::request_id(&out),
        Some("00000000-0000-4000-8000-000000000001")
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.route, Route::Converse);
    // The SDK percent-encodes the ':' of the label; the server decodes it.
    assert_eq!(request.model, HAIKU_PROFILE);
    assert_eq!(request.system().as_deref(), Some("Answer in one word."));
    assert_eq!(request.last_user_text(), "Capital of France?");
    assert_eq!(request.body["inferenceConfig"]["maxTokens"], 64);
    assert!(
        request.headers["authorization"].starts_with("AWS4-HMAC-SHA256 Credential=AKIDTESTING/")
    );
    assert_eq!(request.outcome, Outcome::Text);
    let calls = server.calls();
    assert_eq!(
        (
            calls.total,
            calls.model(HAIKU_PROFILE),
            calls.route(Route::Converse)
        ),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_tool_use_round_trip_goes_over_two_turns() {
    let server = start(Script::new().on(
        Match::model(SONNET),
        [
            Reply::tool_use("lookup", json!({ "id": 7 })).with_text("Let me look."),
            Reply::text("Order 7 shipped."),
        ],
    ))
    .await;
    let client = client(&server, RetryConfig::disabled());
    let tools = tool_config(
        &["lookup", "cancel"],
        ToolChoice::Auto(AutoToolChoice::builder().build()),
    );

    let first = client
        .converse()
        .model_id(SONNET)
        .messages(user("Where is order 7?"))
        .tool_config(tools.clone())
        .send()
        .await
        .expect("a tool use");
    assert_eq!(first.stop_reason(), &StopReason::ToolUse);
    let assistant = message(&first).clone();
    assert_eq!(
        assistant.content()[0].as_text().ok().map(String::as_str),
        Some("Let me look.")
    );
    let call: &ToolUseBlock = assistant.content()[1]
        .as_tool_use()
        .expect("a toolUse block");
    assert_eq!(call.name(), "lookup");
    assert_eq!(call.input(), &doc(&json!({ "id": 7 })));
    assert!(!call.tool_use_id().is_empty());

    let result = ToolResultBlock::builder()
        .tool_use_id(call.tool_use_id())
        .content(ToolResultContentBlock::Json(doc(
            &json!({ "status": "shipped" }),
        )))
        .build()
        .expect("a tool result");
    let results = Message::builder()
        .role(ConversationRole::User)
        .content(ContentBlock::ToolResult(result))
        .build();
    let second = client
        .converse()
        .model_id(SONNET)
        .messages(user("Where is order 7?"))
        .messages(assistant)
        .messages(results.expect("a tool result message"))
        .tool_config(tools)
        .send()
        .await
        .expect("the final answer");
    assert_eq!(first_text(&second), Some("Order 7 shipped."));
    assert_eq!(second.stop_reason(), &StopReason::EndTurn);

    let requests = server.requests();
    assert_eq!(requests[0].tool_names(), ["lookup", "cancel"]);
    assert_eq!(requests[0].tool_choice(), Some(&json!({ "auto": {} })));
    assert_eq!(requests[1].messages().len(), 3);
    assert_eq!(requests[1].last_user_text(), r#"{"status":"shipped"}"#);
    assert_eq!(requests[1].outcome, Outcome::Text);
}

#[tokio::test]
async fn a_throttling_error_is_the_sdks_throttling_exception_and_is_retried() {
    let server = start(Script::new().on(Match::model(HAIKU_PROFILE), [Reply::throttle()])).await;

    let err = client(&server, RetryConfig::disabled())
        .converse()
        .model_id(HAIKU_PROFILE)
        .messages(user("hi"))
        .send()
        .await
        .expect_err("throttled");
    let err = service_error(err);
    assert!(err.is_throttling_exception(), "{err:?}");
    assert_eq!(err.code(), Some("ThrottlingException"));
    assert_eq!(
        err.message(),
        Some("Too many requests, please wait before trying again.")
    );
    assert_eq!(server.requests()[0].outcome, Outcome::Throttled);

    // With the SDK's standard retries, two throttles then an answer: classified retryable.
    server.push(
        Match::model(HAIKU_PROFILE),
        [Reply::throttle(), Reply::throttle()],
    );
    let retrying = RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(1));
    let out = client(&server, retrying)
        .converse()
        .model_id(HAIKU_PROFILE)
        .messages(user("hi"))
        .send()
        .await
        .expect("answered on the third attempt");
    assert_eq!(first_text(&out), Some(Script::DEFAULT_TEXT));
    assert_eq!(server.calls().model(HAIKU_PROFILE), 4);
}

#[tokio::test]
async fn server_errors_and_access_denied_are_the_sdks_typed_errors() {
    let server = start(Script::new().on(
        Match::any(),
        [
            Reply::server_error(),
            Reply::unavailable(),
            Reply::access_denied(),
            Reply::server_error(),
        ],
    ))
    .await;
    let once = client(&server, RetryConfig::disabled());
    let call = || once.converse().model_id(SONNET).messages(user("hi")).send();

    let internal = service_error(call().await.expect_err("500"));
    assert!(internal.is_internal_server_exception(), "{internal:?}");
    let unavailable = service_error(call().await.expect_err("503"));
    assert!(
        unavailable.is_service_unavailable_exception(),
        "{unavailable:?}"
    );
    let denied = service_error(call().await.expect_err("403"));
    assert!(denied.is_access_denied_exception(), "{denied:?}");

    // A 500 and a 503 are retried by the SDK (transient); a 403 is not.
    let retrying = RetryConfig::standard()
        .with_max_attempts(2)
        .with_initial_backoff(Duration::from_millis(1));
    let retrying = client(&server, retrying);
    let call = || {
        retrying
            .converse()
            .model_id(SONNET)
            .messages(user("hi"))
            .send()
    };
    call().await.expect("answered after the 500");
    server.push(Match::any(), [Reply::unavailable()]);
    call().await.expect("answered after the 503");
    server.push(Match::any(), [Reply::access_denied()]);
    let denied = service_error(call().await.expect_err("403, not retried"));
    assert!(denied.is_access_denied_exception(), "{denied:?}");
    assert_eq!(server.calls().total, 8);
    let outcomes: Vec<Outcome> = server.requests().into_iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::ServerError,
            Outcome::Unavailable,
            Outcome::AccessDenied,
            Outcome::ServerError,
            Outcome::Text,
            Outcome::Unavailable,
            Outcome::Text,
            Outcome::AccessDenied,
        ]
    );
}

#[tokio::test]
async fn an_unknown_model_is_a_validation_exception_naming_it_and_consumes_no_reply() {
    const BAD: &str = "anthropic.claude-nonexistent-v1:0";
    let server = start(
        Script::new()
            .unknown_model(BAD)
            .on(Match::any(), [Reply::text("kept")]),
    )
    .await;
    let client = client(&server, RetryConfig::disabled());

    let err = service_error(ask(&client, BAD, "hi").await.expect_err("unknown"));
    assert!(err.is_validation_exception(), "{err:?}");
    assert!(err.message().is_some_and(|m| m.contains(BAD)), "{err:?}");
    assert_eq!(server.requests()[0].outcome, Outcome::UnknownModel);

    let out = ask(&client, SONNET, "hi").await.expect("answered");
    assert_eq!(first_text(&out), Some("kept"));
    assert_eq!(server.calls().model(BAD), 1);
}

#[tokio::test]
async fn a_malformed_conversation_is_a_validation_exception() {
    let server = start(Script::new()).await;
    let client = client(&server, RetryConfig::disabled());

    let err = client
        .converse()
        .model_id(SONNET)
        .messages(user("one"))
        .messages(user("two"))
        .send()
        .await;
    let err = service_error(err.expect_err("two user messages in a row"));
    assert!(
        err.is_validation_exception() && err.message().is_some_and(|m| m.contains("alternate")),
        "{err:?}"
    );

    let call = ToolUseBlock::builder()
        .tool_use_id("t1")
        .name("lookup")
        .input(doc(&json!({})))
        .build();
    let assistant = Message::builder()
        .role(ConversationRole::Assistant)
        .content(ContentBlock::ToolUse(call.expect("a call")))
        .build();
    let err = client
        .converse()
        .model_id(SONNET)
        .messages(user("go"))
        .messages(assistant.expect("an assistant message"))
        .messages(user("no result"))
        .send()
        .await;
    let err = service_error(err.expect_err("a toolUse without toolConfig"));
    assert!(
        err.message().is_some_and(|m| m.contains("toolConfig")),
        "{err:?}"
    );
    assert!(matches!(server.requests()[1].outcome, Outcome::Invalid(_)));
}

#[tokio::test]
async fn a_structured_answer_is_the_forced_tools_input_or_text_json_with_an_output_format() {
    let answer = json!({ "verdict": "approve", "score": 9 });
    let server = start(Script::new().on(
        Match::any(),
        [
            Reply::structured(answer.clone()),
            Reply::structured(answer.clone()),
        ],
    ))
    .await;
    let client = client(&server, RetryConfig::disabled());

    let forced = ToolChoice::Tool(
        SpecificToolChoice::builder()
            .name("answer")
            .build()
            .expect("a tool name"),
    );
    let out = client
        .converse()
        .model_id(SONNET)
        .messages(user("judge"))
        .tool_config(tool_config(&["lookup", "answer"], forced))
        .send()
        .await
        .expect("a forced tool use");
    let call = message(&out).content()[0]
        .as_tool_use()
        .expect("a toolUse block");
    assert_eq!((call.name(), call.input()), ("answer", &doc(&answer)));
    assert_eq!(out.stop_reason(), &StopReason::ToolUse);

    let schema = JsonSchemaDefinition::builder()
        .schema(r#"{"type":"object"}"#)
        .name("verdict")
        .build();
    let format = OutputFormat::builder()
        .r#type(OutputFormatType::JsonSchema)
        .structure(OutputFormatStructure::JsonSchema(schema.expect("a schema")))
        .build()
        .expect("an output format");
    let out = client
        .converse()
        .model_id(SONNET)
        .messages(user("judge"))
        .output_config(OutputConfig::builder().text_format(format).build())
        .send()
        .await
        .expect("a text JSON answer");
    let text = message(&out).content()[0].as_text().expect("a text block");
    assert_eq!(
        serde_json::from_str::<Value>(text).expect("JSON text"),
        answer
    );
    assert!(
        server.requests()[1]
            .body
            .pointer("/outputConfig/textFormat/structure/jsonSchema/schema")
            .is_some()
    );
}

#[tokio::test]
async fn a_cut_connection_is_a_dispatch_failure_and_a_slow_answer_a_timeout() {
    let server = start(Script::new().on(
        Match::any(),
        [
            Reply::cut(),
            Reply::text("late").delayed(Duration::from_secs(120)),
            Reply::text("next"),
        ],
    ))
    .await;
    let client = client(&server, RetryConfig::disabled());

    let err = ask(&client, SONNET, "hi").await.expect_err("cut");
    assert!(
        matches!(
            err,
            SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
        ),
        "{err:?}"
    );

    let timeouts = TimeoutConfig::builder()
        .operation_attempt_timeout(Duration::from_millis(300))
        .build();
    let err = client
        .converse()
        .model_id(SONNET)
        .messages(user("hi"))
        .customize()
        .config_override(aws_sdk_bedrockruntime::Config::builder().timeout_config(timeouts))
        .send()
        .await
        .expect_err("too slow");
    assert!(matches!(err, SdkError::TimeoutError(_)), "{err:?}");

    // The slow answer holds only its own connection.
    let out = ask(&client, SONNET, "hi").await.expect("answered");
    assert_eq!(first_text(&out), Some("next"));
    let outcomes: Vec<Outcome> = server.requests().into_iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Cut, Outcome::Text, Outcome::Text]);
}

#[tokio::test]
async fn rules_match_on_the_last_user_message_and_can_be_added_while_running() {
    let server = start(Script::new().default_reply(Reply::text("default"))).await;
    let client = client(&server, RetryConfig::disabled());
    server.push(
        Match::model(SONNET).containing("extract"),
        [Reply::text("extracted")],
    );
    server.push(
        Match::any().on(Route::Converse).system_containing("judge"),
        [Reply::text("judged")],
    );

    let ask = |prompt: &'static str, system: &'static str| {
        client
            .converse()
            .model_id(SONNET)
            .system(SystemContentBlock::Text(system.into()))
            .messages(user(prompt))
            .send()
    };
    let text = |out: ConverseOutput| message(&out).content()[0].as_text().cloned().expect("text");
    assert_eq!(
        text(ask("summarise", "be brief").await.expect("answered")),
        "default"
    );
    assert_eq!(
        text(
            ask("please extract the fields", "be brief")
                .await
                .expect("answered")
        ),
        "extracted"
    );
    assert_eq!(
        text(
            ask("please extract the fields", "you judge")
                .await
                .expect("answered")
        ),
        "judged"
    );
    assert_eq!(
        text(
            ask("please extract the fields", "you judge")
                .await
                .expect("answered")
        ),
        "default"
    );

    tokio::time::timeout(Duration::from_secs(30), server.wait_for_calls(4))
        .await
        .expect("four calls counted");
    assert!(server.pending().is_empty());
    assert_eq!(server.take_requests().len(), 4);
    assert!(server.requests().is_empty());
    assert_eq!(server.calls().total, 4);
}

#[tokio::test]
async fn the_server_stops_when_dropped() {
    let server = start(Script::new()).await;
    let addr = server.addr();
    tokio::net::TcpStream::connect(addr)
        .await
        .expect("listening while running");
    drop(server);
    tokio::time::timeout(Duration::from_secs(30), async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the port refuses connections once the server is dropped");
}

#[tokio::test]
async fn a_standing_reply_answers_once_the_rules_are_spent() {
    let server = start(
        Script::new()
            .on(Match::model(SONNET), [Reply::text("first")])
            .always(Match::model(SONNET), Reply::text("again"))
            .always(Match::any().containing("judge"), Reply::text("judged")),
    )
    .await;
    let client = client(&server, RetryConfig::disabled());
    let mut answers = Vec::new();
    for (model, prompt) in [
        (SONNET, "a"),
        (SONNET, "b"),
        (SONNET, "c"),
        (HAIKU_PROFILE, "judge it"),
        (HAIKU_PROFILE, "x"),
    ] {
        let out = ask(&client, model, prompt).await.expect("answered");
        answers.push(message(&out).content()[0].as_text().cloned().expect("text"));
    }
    assert_eq!(
        answers,
        ["first", "again", "again", "judged", Script::DEFAULT_TEXT]
    );
}

#[test]
fn a_server_on_its_own_thread_outlives_the_callers_runtimes() {
    let server = ModelServer::start_on_own_thread(
        Script::new().on(Match::any(), [Reply::text("one"), Reply::text("two")]),
    )
    .expect("the model server starts on its own thread");
    let mut answers = Vec::new();
    for _ in 0..2 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let out = runtime.block_on(
            client(&server, RetryConfig::disabled())
                .converse()
                .model_id(SONNET)
                .messages(user("hi"))
                .send(),
        );
        answers.push(
            message(&out.expect("answered")).content()[0]
                .as_text()
                .cloned()
                .expect("text"),
        );
    }
    assert_eq!(answers, ["one", "two"]);

    let addr = server.addr();
    drop(server);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the port still accepts 30 s after the drop"
        );
        std::thread::yield_now();
    }
}

#[tokio::test]
async fn a_strict_script_refuses_what_it_did_not_foresee_and_waits_see_each_arrival() {
    let server = start(Script::new().strict().always(
        Match::model(SONNET).containing("outline"),
        Reply::text("1. 2. 3."),
    ))
    .await;
    let client = client(&server, RetryConfig::disabled());

    let out = ask(&client, SONNET, "an outline please").await;
    assert_eq!(
        message(&out.expect("scripted")).content()[0]
            .as_text()
            .ok()
            .map(String::as_str),
        Some("1. 2. 3.")
    );
    let err = ask(&client, SONNET, "a poem please").await;
    let err = service_error(err.expect_err("unscripted"));
    assert!(err.is_validation_exception(), "{err:?}");
    assert_eq!(
        err.message(),
        Some(format!("unscripted request for model {SONNET}: a poem please").as_str())
    );

    let waiting = server.wait_until(|calls| calls.model(HAIKU_PROFILE) >= 1);
    let calling = async {
        // Both answers are errors (strict): only their arrival matters here.
        let _ = ask(&client, SONNET, "x").await;
        let _ = ask(&client, HAIKU_PROFILE, "y").await;
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(waiting, calling)
    })
    .await
    .expect("the wait sees the arrival of the Haiku call");
    assert_eq!(server.calls().total, 4);
}

#[tokio::test]
async fn a_truncated_answer_stops_at_max_tokens() {
    let server =
        start(Script::new().on(Match::any(), [Reply::truncated(r#"{"verdict": "app"#)])).await;
    let out = client(&server, RetryConfig::disabled())
        .converse()
        .model_id(SONNET)
        .messages(user("judge"))
        .send()
        .await
        .expect("a truncated answer");
    assert_eq!(out.stop_reason(), &StopReason::MaxTokens);
    assert_eq!(first_text(&out), Some(r#"{"verdict": "app"#));
    assert_eq!(server.requests()[0].outcome, Outcome::Truncated);
}

#[tokio::test]
async fn a_call_its_client_gives_up_is_counted_abandoned_with_the_tokens_it_would_have_cost() {
    let server = start(
        Script::new().on(
            Match::any(),
            [
                Reply::text("late")
                    .delayed(Duration::from_secs(120))
                    .with_usage(700, 300),
                Reply::text("next").with_usage(11, 5),
            ],
        ),
    )
    .await;
    let client = client(&server, RetryConfig::disabled());

    // The client drops the call before its answer, as a step stopped at the cutoff does.
    let asked = ask(&client, SONNET, "hi");
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            _ = asked => panic!("answered before its delay"),
            _ = server.wait_for_calls(1) => {}
        }
    });
    waited.await.expect("the call arrives");
    let ended = |calls: &ironflow_model_server::Calls| calls.answered + calls.abandoned;
    // Dropped: the connection closes, the server sees it and stops waiting.
    tokio::time::timeout(Duration::from_secs(60), async {
        while ended(&server.calls()) < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the abandoned call is counted");
    let out = ask(&client, SONNET, "hi").await.expect("answered");
    assert_eq!(first_text(&out), Some("next"));

    let calls = server.calls();
    assert_eq!((calls.total, calls.answered, calls.abandoned), (2, 1, 1));
    assert_eq!(
        (calls.abandoned_tokens.input, calls.abandoned_tokens.output),
        (700, 300)
    );
    assert_eq!(
        (calls.answered_tokens.input, calls.answered_tokens.output),
        (11, 5)
    );
}
