//! The webhook receiver's role (`IRONFLOW_FUNCTION_ROLE=webhook-receiver`, docs/push.md,
//! "Denial of service"): through the handler, in-process, with the real API (`LocalApi`) and
//! moto's SQS. The receiver serves Function URL requests only, refuses every other event with
//! an error naming its role and without a call, and refuses bad requests before any call.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::{
    HandlerError, LambdaWorker, LambdaWorkerBuilder, Response, samples, settings::FunctionRole,
    settings::WakeSettings, wake_ups::Waker,
};
use ironflow_local_api::LocalApi;
use ironflow_store::entities::RunStatus;
use serde_json::{Value, json};

use common::moto::{new_queue, sqs_client, take_visible};
use common::webhook::{event, lambda_event, request, signed};
use common::{create_run, state_of};

const TOKEN: &str = "receiver-role-test-token";
const SECRET: &str = "a-receiver-role-secret-of-at-least-32-characters";

async fn worker(api: &LocalApi, queue: &str, role: FunctionRole) -> Arc<LambdaWorker> {
    let worker = LambdaWorkerBuilder::new(&api.url(), TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .webhook_secret(SECRET)
        .function_role(role)
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
        .wake_ups(Waker::new(sqs_client(), WakeSettings::new(queue)))
        .build()
        .unwrap();
    Arc::new(worker)
}

fn created() -> String {
    event("run_created", "quick-shell")
}

async fn status_of(worker: &LambdaWorker, event: Value) -> u16 {
    match ironflow_lambda::handle_response(worker, lambda_event(event)).await {
        Ok(Response::Webhook(answer)) => answer.status,
        other => panic!("not a webhook answer: {other:?}"),
    }
}

/// A schedule tick, an SQS wake-up and a direct invocation reach the receiver: each is refused
/// with an error naming the role, nothing is claimed and no call is made.
#[tokio::test]
async fn the_receiver_refuses_every_event_but_a_function_url_request() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let queue = new_queue(&sqs_client()).await;
    let receiver = worker(&api, &queue, FunctionRole::WebhookReceiver).await;
    let run = create_run(&api, "quick-shell").await;
    let before = api.requests();
    let schedule: Value = serde_json::from_str(include_str!("../events/schedule.json")).unwrap();
    let sqs = json!({"Records": [{"messageId": "m-1", "body": "{}", "eventSource": "aws:sqs"}]});
    for (what, event) in [("schedule", schedule), ("sqs", sqs), ("direct", json!({}))] {
        let e = ironflow_lambda::handle_response(&receiver, lambda_event(event))
            .await
            .expect_err(what);
        assert!(
            matches!(e, HandlerError::NotForThisRole { .. }),
            "{what}: {e:?}"
        );
        let message = e.to_string();
        assert!(
            message.contains("IRONFLOW_FUNCTION_ROLE=webhook-receiver"),
            "{what}: {message}"
        );
        let diagnostic = lambda_runtime::Diagnostic::from(e);
        assert_eq!(diagnostic.error_type, "NotForThisRole");
    }
    assert_eq!(api.requests(), before, "a refused event makes no API call");
    let status = state_of(&api, run).await;
    assert_eq!(status, RunStatus::Pending, "nothing claimed");
    // Its own events it serves: an authenticated run_created wakes the fleet.
    assert_eq!(status_of(&receiver, signed(SECRET, &created())).await, 202);
    assert!(!take_visible(&sqs_client(), &queue).await.is_empty());
}

/// Every refusal comes before the receiver's first call (the pending count through the API):
/// off-method, oversized (plain and base64, measured before decoding), unauthenticated,
/// malformed, and events that wake nothing.
#[tokio::test]
async fn the_receiver_refuses_before_any_call() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    create_run(&api, "quick-shell").await;
    let receiver = worker(&api, &queue, FunctionRole::WebhookReceiver).await;
    let body = created();
    let mut get = signed(SECRET, &body);
    get["requestContext"]["http"]["method"] = json!("GET");
    let huge = "x".repeat(200_000);
    let mut huge_base64 = signed(SECRET, &huge);
    huge_base64["isBase64Encoded"] = json!(true);
    let cases = [
        ("GET", get, 405),
        ("oversized", signed(SECRET, &huge), 413),
        ("oversized base64", huge_base64, 413),
        ("no proof", request(&body, json!({}), ""), 401),
        (
            "wrong token",
            request(&body, json!({}), "token=wrong-token-of-no-use-at-all!!"),
            401,
        ),
        (
            "malformed signature",
            request(&body, json!({"x-signature-256": "sha256=00"}), ""),
            401,
        ),
        ("not an event", signed(SECRET, "{not json"), 400),
        (
            "ignored type",
            signed(SECRET, &event("run_completed", "quick-shell")),
            202,
        ),
        (
            "unregistered workflow",
            signed(SECRET, &event("run_created", "other")),
            202,
        ),
    ];
    let before = api.requests();
    for (what, event, expected) in cases {
        assert_eq!(status_of(&receiver, event).await, expected, "{what}");
        assert_eq!(api.requests(), before, "{what}: a call before the refusal");
    }
    assert!(
        take_visible(&sqs, &queue).await.is_empty(),
        "nothing queued"
    );
}

/// In the worker's role (the default) a Function URL request is answered as before: local runs
/// and tests use it.
#[tokio::test]
async fn the_worker_role_still_answers_function_url_requests() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let queue = new_queue(&sqs_client()).await;
    create_run(&api, "quick-shell").await;
    let worker = worker(&api, &queue, FunctionRole::Worker).await;
    assert_eq!(status_of(&worker, signed(SECRET, &created())).await, 202);
    assert!(!take_visible(&sqs_client(), &queue).await.is_empty());
}
