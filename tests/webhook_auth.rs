//! The webhook receiver's guards, through the handler, in-process: replays (the replay window and
//! the record of bodies taken), the 401's answer, the trace header of pushed wake-ups, and the
//! secret's rotation (moto's Secrets Manager, with its version stages). The real API
//! (`LocalApi`) and moto (`IRONFLOW_TEST_MOTO_ENDPOINT`, started by `./scripts/test`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::{LambdaWorkerBuilder, samples, settings::WakeSettings, wake_ups::Waker};
use ironflow_local_api::LocalApi;
use serde_json::json;
use uuid::Uuid;

use common::create_run;
use common::moto::{
    moto_endpoint, new_queue, poison_table, queued, sqs_client, take_visible, traced_sqs_client,
};
use common::webhook::{by_token, created_at, post, post_traced, request, signed};

const TOKEN: &str = "webhook-auth-test-token";
const SECRET: &str = "a-webhook-secret-of-at-least-32-characters";

/// An event the receiver takes and ignores once the sender is proved (no API call).
fn ignored() -> String {
    json!({"type": "step_completed", "workflow_name": "quick-shell", "step_id": Uuid::new_v4(), "at": chrono::Utc::now()})
        .to_string()
}

fn builder(api_url: &str, sqs: &aws_sdk_sqs::Client, queue: &str) -> LambdaWorkerBuilder {
    LambdaWorkerBuilder::new(api_url, TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .webhook_secret(SECRET)
        .wake_ups(Waker::new(sqs.clone(), WakeSettings::new(queue)))
}

#[tokio::test]
async fn an_event_outside_the_replay_window_is_refused_in_both_modes() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let worker = builder(&api.url(), &sqs, &queue).build().unwrap();
    create_run(&api, "quick-shell").await;
    let no_at = json!({"type": "run_created", "workflow_name": "quick-shell"}).to_string();
    for (what, body) in [
        ("an hour old", created_at("quick-shell", -3600)),
        ("301 s old", created_at("quick-shell", -301)),
        ("301 s ahead", created_at("quick-shell", 301)),
        ("no at", no_at),
    ] {
        let (status, answer) = post(&worker, signed(SECRET, &body)).await;
        assert_eq!(status, 401, "{what}, signed: {answer}");
        let (status, answer) = post(&worker, by_token(SECRET, &body)).await;
        assert_eq!(status, 401, "{what}, by token: {answer}");
    }
    assert_eq!(queued(&sqs, &queue).await, 0, "a stale event sends nothing");
    // Within the window either way (the API's clock may run ahead): taken.
    let (status, answer) = post(&worker, signed(SECRET, &created_at("quick-shell", 240))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    // The window is a setting.
    let narrow = builder(&api.url(), &sqs, &queue)
        .webhook_replay_window(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(
        post(&narrow, signed(SECRET, &created_at("quick-shell", -60)))
            .await
            .0,
        401
    );
}

#[tokio::test]
async fn a_body_taken_once_is_not_taken_again_within_the_window_whatever_the_proof() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let worker = builder(&api.url(), &sqs, &queue).build().unwrap();
    create_run(&api, "quick-shell").await;
    let body = created_at("quick-shell", 0);
    let (status, answer) = post(&worker, signed(SECRET, &body)).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    // The wake-up is consumed (its invocation is under way): the run is still Pending, so a
    // replayed body would queue another wake-up.
    assert_eq!(take_visible(&sqs, &queue).await.len(), 1);
    for (what, replay) in [
        ("signed", signed(SECRET, &body)),
        ("by token", by_token(SECRET, &body)),
    ] {
        let (status, answer) = post(&worker, replay).await;
        assert_eq!(status, 202, "{what}: {answer}");
        assert_eq!(answer["duplicate"], true, "{what}: {answer}");
    }
    assert_eq!(queued(&sqs, &queue).await, 0, "a replay queues nothing");
    // Another event of the same run (another body) is served.
    let (status, answer) = post(&worker, signed(SECRET, &created_at("quick-shell", 0))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
}

#[tokio::test]
async fn a_re_send_of_a_body_answered_503_is_served() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    // A queue that does not exist yet: SQS refuses the wake-ups.
    let existing = new_queue(&sqs).await;
    let name = format!("wake-{}", Uuid::new_v4().simple());
    let (prefix, _) = existing.rsplit_once('/').unwrap();
    let queue = format!("{prefix}/{name}");
    let worker = builder(&api.url(), &sqs, &queue).build().unwrap();
    create_run(&api, "quick-shell").await;
    let body = created_at("quick-shell", 0);
    let (status, answer) = post(&worker, signed(SECRET, &body)).await;
    assert_eq!(status, 503, "{answer}");
    let created = sqs.create_queue().queue_name(&name).send().await.unwrap();
    assert_eq!(created.queue_url(), Some(queue.as_str()));
    // The API's webhook sends the same body again: its wake-ups go out this time.
    let (status, answer) = post(&worker, signed(SECRET, &body)).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(queued(&sqs, &queue).await, 1);
}

#[tokio::test]
async fn a_401_says_only_that_the_request_is_not_authenticated() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let worker = builder(&api.url(), &sqs, &queue).build().unwrap();
    let body = created_at("quick-shell", 0);
    let other = "another-secret-of-at-least-32-characters!!";
    for (what, event) in [
        ("missing", request(&body, json!({}), "")),
        ("wrong token", by_token(other, &body)),
        ("wrong signature", signed(other, &body)),
        (
            "malformed signature",
            request(&body, json!({"x-signature-256": "sha1=00"}), ""),
        ),
        // A request with a signature is judged by it alone: a good token does not save one
        // that is wrong, malformed, or not even text.
        (
            "wrong signature with the token",
            request(
                &body,
                json!({"x-signature-256": "sha256=00"}),
                &format!("token={SECRET}"),
            ),
        ),
        (
            "unreadable signature with the token",
            request(
                &body,
                json!({"x-signature-256": "sha256=\u{fc}"}),
                &format!("token={SECRET}"),
            ),
        ),
        ("stale", signed(SECRET, &created_at("quick-shell", -3600))),
    ] {
        let (status, answer) = post(&worker, event).await;
        assert_eq!(status, 401, "{what}");
        assert_eq!(answer, json!({"error": "not authenticated"}), "{what}");
    }
}

#[tokio::test]
async fn pushed_wake_ups_carry_the_invocation_s_trace_header() {
    let (sqs, recorded) = traced_sqs_client();
    let queue = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), &sqs, &queue).build().unwrap();
    assert!(std::env::var_os("_X_AMZN_TRACE_ID").is_none());
    create_run(&api, "quick-shell").await;
    let trace = "Root=1-67891233-abcdef012345678912345678;Parent=53995c3f42cd8ad8;Sampled=1";
    let (status, answer) = post_traced(
        &worker,
        signed(SECRET, &created_at("quick-shell", 0)),
        Some(trace),
    )
    .await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(
        recorded.recorded(),
        vec![Some(trace.to_string())],
        "the wake-up carries the invocation's trace header"
    );
}

async fn moto_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(moto_endpoint())
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
            "testing", "testing", None, None, "moto",
        ))
        .load()
        .await
}

/// A version of the secret: 40 characters of `c`.
fn version(c: char) -> String {
    c.to_string().repeat(40)
}

#[tokio::test]
async fn a_warm_receiver_takes_a_rotated_secret_and_its_previous_version_and_no_older_one() {
    let capture = ironflow_lambda::logging::CaptureWriter::default();
    assert!(ironflow_lambda::logging::init(
        tracing_subscriber::EnvFilter::new("trace"),
        capture.clone()
    ));
    let aws = moto_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&aws);
    let created = secrets
        .create_secret()
        .name(format!("ironflow/webhook-{}", Uuid::new_v4()))
        .secret_string(version('a'))
        .send()
        .await
        .unwrap();
    let arn = created.arn().unwrap().to_string();
    let rotate = |value: String| {
        let (secrets, arn) = (secrets.clone(), arn.clone());
        async move {
            secrets
                .put_secret_value()
                .secret_id(arn)
                .secret_string(value)
                .send()
                .await
                .unwrap();
        }
    };
    // a, then b: b is AWSCURRENT, a AWSPREVIOUS.
    rotate(version('b')).await;
    let queue = new_queue(&sqs_client()).await;
    let vars = [
        ("IRONFLOW_API_URL", "http://127.0.0.1:1".to_string()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_WEBHOOK_SECRET_ARN", arn.clone()),
        ("IRONFLOW_WAKE_QUEUE_URL", queue),
    ];
    let lookup = move |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    };
    let worker = LambdaWorkerBuilder::from_lookup_and_secrets(lookup, &aws)
        .await
        .unwrap()
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .build()
        .unwrap();
    let status = |c: char, by_signature: bool| {
        let worker = &worker;
        async move {
            let event = if by_signature {
                signed(&version(c), &ignored())
            } else {
                by_token(&version(c), &ignored())
            };
            post(worker, event).await.0
        }
    };
    assert_eq!(status('b', true).await, 202, "the current version");
    assert_eq!(status('a', false).await, 202, "the previous version");
    // Rotated while warm: c is current, b previous; a is older.
    rotate(version('c')).await;
    assert_eq!(status('c', false).await, 202, "the new version, re-read");
    assert_eq!(status('b', true).await, 202, "the version before it");
    assert_eq!(status('a', false).await, 401, "an older version");
    assert_eq!(status('a', true).await, 401, "an older version, signed");
    // Rotated again at once: the next re-read is over a minute away (an attacker makes
    // mismatches at will), so the newest version waits for it.
    rotate(version('d')).await;
    assert_eq!(status('d', false).await, 401, "re-reads are rate-limited");
    assert_eq!(status('c', false).await, 202);
    let logs = capture.contents();
    assert!(logs.contains("the webhook secret was rotated"), "{logs}");
    for c in ['a', 'b', 'c', 'd'] {
        assert!(
            !logs.contains(&version(c)),
            "a version of the webhook secret is in the logs"
        );
    }
}

/// Two execution environments (two workers, each with its own memory) sharing the DynamoDB
/// poison-pill table: a body taken by one is not taken again by the other.
#[tokio::test]
async fn a_body_taken_in_one_environment_is_not_taken_again_in_another_with_the_table() {
    let aws = moto_config().await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let table = poison_table().await;
    let vars = vec![
        ("IRONFLOW_API_URL", api.url()),
        ("IRONFLOW_WORKER_TOKEN", TOKEN.to_string()),
        ("IRONFLOW_WEBHOOK_SECRET", SECRET.to_string()),
        ("IRONFLOW_WAKE_QUEUE_URL", queue.clone()),
        ("IRONFLOW_POISON_TABLE", table),
    ];
    let environment = || async {
        let vars = vars.clone();
        let lookup = move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        };
        LambdaWorkerBuilder::from_lookup_and_secrets(lookup, &aws)
            .await
            .unwrap()
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(samples::QuickShell)
            .connect_poison_table()
            .await
            .unwrap()
            .build()
            .unwrap()
    };
    let (first, second) = (environment().await, environment().await);
    create_run(&api, "quick-shell").await;
    let body = created_at("quick-shell", 0);
    let (status, answer) = post(&first, signed(SECRET, &body)).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(take_visible(&sqs, &queue).await.len(), 1);
    let (status, answer) = post(&second, by_token(SECRET, &body)).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["duplicate"], true, "{answer}");
    assert_eq!(queued(&sqs, &queue).await, 0, "the replay queued nothing");
    // Another body is served by either.
    let (status, answer) = post(&second, signed(SECRET, &created_at("quick-shell", 0))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
}
