//! No secret in any log line at any level (docs/push.md, "Secrets and logs"): the deployable
//! binary (`src/bin/ironflow-lambda.rs`, the one `sam build` ships) runs at `RUST_LOG=trace`
//! under a Runtime API stand-in served here (the routes lambda_runtime polls and answers), with
//! the real ironflow API (`LocalApi`) and moto's SQS and Secrets Manager
//! (`IRONFLOW_TEST_MOTO_ENDPOINT`). It serves every kind of event (a Function URL request with
//! `?token=` and one with `X-Signature-256`, an SQS wake-up, a schedule tick, a direct
//! invocation), with the worker token and the webhook secret given directly and read from
//! Secrets Manager, in the worker's role and in the webhook receiver's, and a heartbeat URL
//! whose path holds a key; then neither the secret, the token, the key nor a signature is
//! anywhere in what it wrote (stdout and stderr).

mod common;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::routing::{get, post};
use ironflow_lambda::settings::WebhookSecret;
use ironflow_lambda::webhook::auth;
use ironflow_local_api::{LocalApi, new_run};
use serde_json::{Value, json};
use tokio::sync::Notify;
use uuid::Uuid;

use common::moto::{
    dynamodb_config, moto_endpoint, new_queue, poison_table, sqs_client, take_visible,
};

const TOKEN: &str = "trace-test-worker-token-4f8a1c";
const SECRET: &str = "trace-test-webhook-secret-0123456789-abcdef";
/// The secret part of a heartbeat URL (Healthchecks.io's ping URLs are `/ping/<uuid>`): the
/// URL points at the discard port on loopback, so every ping fails and is logged.
const HEARTBEAT_KEY: &str = "hb-trace-7f3a9c2e1b5d";

/// The events left to hand out, and the answers the function sent back.
#[derive(Default)]
struct Runtime {
    events: Mutex<VecDeque<(String, Value)>>,
    answers: Mutex<Vec<(String, String, Value)>>,
    answered: Notify,
}

async fn next(State(rt): State<Arc<Runtime>>) -> (HeaderMap, String) {
    loop {
        let event = rt.events.lock().unwrap().pop_front();
        if let Some((id, event)) = event {
            let deadline =
                SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(60);
            let mut headers = HeaderMap::new();
            let mut set = |name: &'static str, value: String| {
                headers.insert(name, HeaderValue::from_str(&value).unwrap());
            };
            set("lambda-runtime-aws-request-id", id);
            set(
                "lambda-runtime-deadline-ms",
                deadline.as_millis().to_string(),
            );
            set(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:trace".into(),
            );
            return (headers, event.to_string());
        }
        // Nothing left: this poll stays open until the process is stopped.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn answered(
    State(rt): State<Arc<Runtime>>,
    Path((id, kind)): Path<(String, String)>,
    body: String,
) -> &'static str {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    rt.answers.lock().unwrap().push((id, kind, value));
    rt.answered.notify_waiters();
    "{}"
}

/// The Runtime API stand-in on a free port: its address (`AWS_LAMBDA_RUNTIME_API`).
async fn start_runtime(rt: Arc<Runtime>) -> String {
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(answered))
        .with_state(rt);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr.to_string()
}

/// A Function URL request posting `body`, with `token` in its URL and `signature` in its
/// headers when given.
fn url_request(body: &str, token: Option<&str>, signature: Option<&str>) -> Value {
    let query = token.map(|t| format!("token={t}")).unwrap_or_default();
    let mut headers = json!({"content-type": "application/json", "user-agent": "ironflow"});
    let mut parameters = json!({});
    if let Some(signature) = signature {
        headers[auth::SIGNATURE_HEADER] = json!(signature);
    }
    if let Some(token) = token {
        parameters["token"] = json!(token);
    }
    json!({
        "version": "2.0", "routeKey": "$default", "rawPath": "/", "rawQueryString": query,
        "headers": headers, "queryStringParameters": parameters,
        "requestContext": {"http": {"method": "POST", "path": "/", "protocol": "HTTP/1.1",
            "sourceIp": "203.0.113.9", "userAgent": "ironflow"}, "domainName": "localhost",
            "timeEpoch": 0},
        "body": body, "isBase64Encoded": false,
    })
}

fn run_created() -> String {
    json!({"type": "run_created", "run_id": Uuid::new_v4(), "workflow_name": "quick-shell",
        "at": chrono::Utc::now().to_rfc3339()})
    .to_string()
}

/// A secret of moto's Secrets Manager holding `value`: its ARN.
async fn moto_secret(value: &str) -> String {
    let config = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(aws_sdk_secretsmanager::config::BehaviorVersion::latest())
        .region(aws_sdk_secretsmanager::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .endpoint_url(moto_endpoint())
        .build();
    aws_sdk_secretsmanager::Client::from_conf(config)
        .create_secret()
        .name(format!("trace/{}", Uuid::new_v4().simple()))
        .secret_string(value)
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_string()
}

/// The function's process; killed when dropped.
struct Function(Child);

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "trace-secrets-{name}-{}.log",
        Uuid::new_v4().simple()
    ))
}

/// Serve every kind of event with the binary at trace level, the secrets set by `secrets`:
/// everything it wrote (stdout and stderr), its answers, and the signature it was sent.
async fn serve_every_event(
    secrets: &[(&str, String)],
) -> (String, Vec<(String, String, Value)>, String) {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let queue = new_queue(&sqs_client()).await;
    for _ in 0..2 {
        api.store()
            .create_run(new_run("quick-shell", 0))
            .await
            .unwrap();
    }
    let body = run_created();
    let signature = auth::sign(&WebhookSecret::new(SECRET), body.as_bytes());
    let events = [
        ("url-token", url_request(&body, Some(SECRET), None)),
        ("url-signature", url_request(&body, None, Some(&signature))),
        (
            "sqs",
            json!({"Records": [{"messageId": "m-1", "body": "{}", "eventSource": "aws:sqs"}]}),
        ),
        (
            "schedule",
            serde_json::from_str(include_str!("../events/schedule.json")).unwrap(),
        ),
        ("direct", json!({"reason": "trace test"})),
    ];
    let events = events.map(|(id, e)| (id.to_string(), e));
    let env: Vec<(&str, String)> = [
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WAKE_QUEUE_URL", queue),
    ]
    .into_iter()
    .chain(secrets.iter().cloned())
    .collect();
    let (output, answers) = serve(events.into(), &env).await;
    (output, answers, signature)
}

/// Serve `events` with the deployable binary at trace level under the Runtime API stand-in,
/// with moto's endpoint and test credentials and the variables `env`: everything it wrote
/// (stdout and stderr) and its answers, once every event is answered.
async fn serve(
    events: VecDeque<(String, Value)>,
    env: &[(&str, String)],
) -> (String, Vec<(String, String, Value)>) {
    let count = events.len();
    let rt = Arc::new(Runtime::default());
    *rt.events.lock().unwrap() = events;
    let address = start_runtime(rt.clone()).await;
    let (stdout, stderr) = (log_file("stdout"), log_file("stderr"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_ironflow-lambda"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "trace")
        .env("AWS_LAMBDA_RUNTIME_API", &address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "trace")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_ENDPOINT_URL", moto_endpoint())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap());
    let mut function = Function(command.spawn().unwrap());
    let read =
        || std::fs::read_to_string(&stdout).unwrap() + &std::fs::read_to_string(&stderr).unwrap();
    // Every event answered (a condition, polled; the bound only stops a hung run).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(300);
    while rt.answers.lock().unwrap().len() < count {
        let waiting = rt.answered.notified();
        if let Ok(Some(status)) = function.0.try_wait() {
            panic!("the function exited ({status}):\n{}", read());
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the function did not answer every event:\n{}",
            read()
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), waiting).await;
    }
    drop(function);
    let answers = rt.answers.lock().unwrap().clone();
    (read(), answers)
}

/// What must never be printed: the secret, the token, the heartbeat URL's key, the signature
/// (and its digest alone).
fn assert_no_secret(output: &str, signature_digests: &[String]) {
    for (what, value) in [
        ("the webhook secret", SECRET),
        ("the worker token", TOKEN),
        ("the heartbeat URL's key", HEARTBEAT_KEY),
    ] {
        if let Some(line) = output.lines().find(|l| l.contains(value)) {
            panic!("{what} is in the function's output: {line}");
        }
    }
    for digest in signature_digests {
        if let Some(line) = output.lines().find(|l| l.contains(digest.as_str())) {
            panic!("a signature is in the function's output: {line}");
        }
    }
}

/// Every event was served and none refused (both webhook requests authenticated: 202), or, in
/// the receiver's role, every event but the two Function URL requests refused with
/// `NotForThisRole`; trace level was on, and nothing secret was printed.
fn check(output: &str, answers: &[(String, String, Value)], signature: &str, receiver: bool) {
    for (id, kind, answer) in answers {
        let url = id.starts_with("url-");
        if receiver && !url {
            assert_eq!(kind, "error", "{id} answered {kind}: {answer}");
            assert_eq!(answer["errorType"], "NotForThisRole", "{id}: {answer}");
            continue;
        }
        assert_eq!(kind, "response", "{id} answered {kind}: {answer}\n{output}");
        if url {
            assert_eq!(answer["statusCode"], 202, "{id}: {answer}");
        }
    }
    // Trace level was on: this crate's TRACE lines, one per event parsed (the receiver refuses
    // the others before parsing them).
    let traced = output
        .lines()
        .filter(|l| l.contains("\"level\":\"TRACE\"") && l.contains("event parsed"))
        .count();
    assert_eq!(traced, if receiver { 2 } else { answers.len() }, "{output}");
    assert!(output.contains("webhook event"), "{output}");
    let digest = signature.trim_start_matches("sha256=").to_string();
    assert_no_secret(output, &[digest]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_logged_at_trace_level_with_secrets_given_directly() {
    let (output, answers, signature) = serve_every_event(&[
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_WEBHOOK_SECRET", SECRET.to_string()),
        (
            "IRONFLOW_HEARTBEAT_URL",
            format!("http://127.0.0.1:9/ping/{HEARTBEAT_KEY}"),
        ),
    ])
    .await;
    check(&output, &answers, &signature, false);
    // The heartbeat URL was used (its pings failed, and said so by the host alone).
    let failed = output
        .lines()
        .filter(|l| l.contains("heartbeat ping failed") && l.contains("\"host\":\"127.0.0.1\""))
        .count();
    assert!(failed >= 1, "no heartbeat ping was logged:\n{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_logged_at_trace_level_with_secrets_from_secrets_manager() {
    let (output, answers, signature) = serve_every_event(&[
        ("IRONFLOW_WORKER_TOKEN_SECRET_ARN", moto_secret(TOKEN).await),
        ("IRONFLOW_WEBHOOK_SECRET_ARN", moto_secret(SECRET).await),
    ])
    .await;
    check(&output, &answers, &signature, false);
}

/// The same binary in the webhook receiver's role (as the template deploys it): its two
/// Function URL requests are served, the other events refused, and nothing secret is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_logged_at_trace_level_in_the_receivers_role() {
    let (output, answers, signature) = serve_every_event(&[
        ("IRONFLOW_FUNCTION_ROLE", "webhook-receiver".to_string()),
        ("IRONFLOW_WORKER_TOKEN_SECRET_ARN", moto_secret(TOKEN).await),
        ("IRONFLOW_WEBHOOK_SECRET_ARN", moto_secret(SECRET).await),
    ])
    .await;
    check(&output, &answers, &signature, true);
}

/// A poison-pill table of moto's (`common::moto::poison_table`) and a client of it.
async fn moto_table() -> (aws_sdk_dynamodb::Client, String) {
    let client = aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&moto_endpoint()));
    (client, poison_table().await)
}

/// The deployed receiver's cold start (`IRONFLOW_FUNCTION_ROLE=webhook-receiver` with
/// `IRONFLOW_POISON_TABLE`) connects the table's fleet-wide parts: a signed `run_created` writes
/// the wake-up mark (`<ns>#wake#pushed`, docs/push.md "Coalescing") and the body's record
/// (`<ns>#webhook-body#...`, "Replays"), and the same body sent to a second environment (another
/// process) is answered as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_binary_uses_the_fleet_wide_mark_and_replay_record() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    for _ in 0..20 {
        api.store()
            .create_run(new_run("quick-shell", 0))
            .await
            .unwrap();
    }
    let (dynamo, table) = moto_table().await;
    let namespace = format!("rcv{}", Uuid::new_v4().simple());
    let env = [
        ("IRONFLOW_FUNCTION_ROLE", "webhook-receiver".to_string()),
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_WEBHOOK_SECRET", SECRET.to_string()),
        ("IRONFLOW_WAKE_QUEUE_URL", queue.clone()),
        ("IRONFLOW_POISON_TABLE", table.clone()),
        ("IRONFLOW_POISON_NAMESPACE", namespace.clone()),
    ];
    let body = run_created();
    let signature = auth::sign(&WebhookSecret::new(SECRET), body.as_bytes());
    let push = || {
        let event = url_request(&body, None, Some(&signature));
        VecDeque::from([("push".to_string(), event)])
    };
    // The answer's JSON body, after checking it was a 202.
    let answer_of = |output: &str, answers: &[(String, String, Value)]| -> Value {
        let (_, kind, answer) = &answers[0];
        assert_eq!(kind, "response", "{answer}\n{output}");
        assert_eq!(answer["statusCode"], 202, "{answer}\n{output}");
        serde_json::from_str(answer["body"].as_str().unwrap()).unwrap()
    };
    let (output, answers) = serve(push(), &env).await;
    let first = answer_of(&output, &answers);
    assert_eq!(first["woke"], true, "{first}\n{output}");
    assert!(!take_visible(&sqs, &queue).await.is_empty(), "{first}");
    let items = dynamo
        .scan()
        .table_name(&table)
        .send()
        .await
        .unwrap()
        .items()
        .to_vec();
    let keys: Vec<&str> = items
        .iter()
        .filter_map(|i| i.get(ironflow_lambda::poison::dynamodb::PARTITION_KEY))
        .filter_map(|v| v.as_s().ok())
        .map(String::as_str)
        .collect();
    assert!(
        keys.contains(&format!("{namespace}#wake#pushed").as_str()),
        "no fleet-wide wake-up mark in {keys:?}\n{output}"
    );
    assert!(
        keys.iter()
            .any(|k| k.starts_with(&format!("{namespace}#webhook-body#"))),
        "no record of the body in {keys:?}\n{output}"
    );
    // Another environment (a second process) is sent the same body: the table's record
    // answers it.
    let (output, answers) = serve(push(), &env).await;
    let second = answer_of(&output, &answers);
    assert_eq!(second["duplicate"], true, "{second}\n{output}");
}
