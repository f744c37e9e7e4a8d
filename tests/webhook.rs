//! The webhook receiver through the handler, in-process: Function URL requests (built here, or
//! sent by the real embedded API's webhook through the Function URL stand-in), the real API
//! (`LocalApi`) and moto's SQS (`IRONFLOW_TEST_MOTO_ENDPOINT`, started by `./scripts/test`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::webhook::auth;
use ironflow_lambda::{
    LambdaWorker, LambdaWorkerBuilder, samples, settings::WakeSettings, wake_ups::Waker,
};
use ironflow_local_api::{Backend, FunctionUrl, LocalApi, UrlHandler, Webhook, new_run};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::RunStore;
use serde_json::{Value, json};

use common::fault_proxy::FaultProxy;
use common::moto::{new_queue, queued, sqs_client, sqs_event, take_visible};
use common::webhook::{by_token, created, lambda_event, post, post_within, request, signed};
use common::{create_run, state_of};

const TOKEN: &str = "webhook-test-token";
const SECRET: &str = "a-webhook-secret-of-at-least-32-characters";
const LONG: Duration = Duration::from_secs(60);

/// The API, a wake queue, and a worker (N = `runs`, 3 wake-ups per call at most) whose
/// receiver has [`SECRET`].
struct Setup {
    api: LocalApi,
    sqs: aws_sdk_sqs::Client,
    queue: String,
    worker: Arc<LambdaWorker>,
}

async fn setup(api: LocalApi, runs: usize) -> Setup {
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let worker = worker(&api, &sqs, &queue, runs).webhook_secret(SECRET);
    Setup {
        worker: Arc::new(worker.build().unwrap()),
        api,
        sqs,
        queue,
    }
}

fn worker(
    api: &LocalApi,
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    runs: usize,
) -> LambdaWorkerBuilder {
    let mut wake = WakeSettings::new(queue);
    wake.max_per_invocation = 3;
    LambdaWorkerBuilder::new(&api.url(), TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .max_runs_per_invocation(runs)
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
        .wake_ups(Waker::new(sqs.clone(), wake))
}

#[tokio::test]
async fn only_a_valid_signature_or_token_wakes_and_bad_requests_get_their_answer() {
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 8).await;
    create_run(&s.api, "quick-shell").await;
    let body = created("quick-shell");

    // Refused, and nothing queued: missing, wrong secret, altered body, wrong token.
    let unsigned = request(&body, json!({}), "");
    let wrong_secret = {
        let other =
            ironflow_lambda::settings::WebhookSecret::new("another-secret-of-at-least-32-chars!!");
        request(
            &body,
            json!({"x-signature-256": auth::sign(&other, body.as_bytes())}),
            "",
        )
    };
    let altered = {
        let mut e = signed(SECRET, &body);
        e["body"] = json!(body.replace("quick-shell", "quick-shel1"));
        e
    };
    let wrong_token = request(
        &body,
        json!({}),
        "token=not-the-secret-but-as-long-as-it-is!!",
    );
    for (what, event) in [
        ("missing", unsigned),
        ("wrong secret", wrong_secret),
        ("altered body", altered),
        ("wrong token", wrong_token),
    ] {
        let (status, answer) = post(&s.worker, event).await;
        assert_eq!(status, 401, "{what}: {answer}");
        assert!(!answer.to_string().contains(SECRET));
    }
    assert_eq!(
        queued(&s.sqs, &s.queue).await,
        0,
        "a refused request sends nothing"
    );

    // Malformed JSON, an oversized body, a GET.
    let (status, _) = post(&s.worker, signed(SECRET, "{not json")).await;
    assert_eq!(status, 400);
    let huge = format!(
        "{{\"type\":\"run_created\",\"pad\":\"{}\"}}",
        "x".repeat(70_000)
    );
    assert_eq!(post(&s.worker, signed(SECRET, &huge)).await.0, 413);
    let mut get = signed(SECRET, &body);
    get["requestContext"]["http"]["method"] = json!("GET");
    assert_eq!(post(&s.worker, get).await.0, 405);
    let mut bad_base64 = signed(SECRET, &body);
    bad_base64["isBase64Encoded"] = json!(true);
    bad_base64["body"] = json!("%%%");
    assert_eq!(post(&s.worker, bad_base64).await.0, 400);
    assert_eq!(queued(&s.sqs, &s.queue).await, 0);

    // The signature, a base64-encoded body, and the token in the URL each wake.
    let (status, answer) = post(&s.worker, signed(SECRET, &body)).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(answer["wake_ups"]["trigger"], "pushed");
    assert_eq!(queued(&s.sqs, &s.queue).await, 1);
    // (Each a body of its own: the same body again is a replay, taken once.)
    let other = created("quick-shell");
    let mut encoded = signed(SECRET, &other);
    encoded["isBase64Encoded"] = json!(true);
    encoded["body"] = json!(base64::engine::general_purpose::STANDARD.encode(&other));
    let (status, answer) = post(&s.worker, encoded).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["wake_ups"]["queued"], 1, "already queued: {answer}");
    let token = by_token(SECRET, &created("quick-shell"));
    assert_eq!(post(&s.worker, token).await.0, 202);
    assert_eq!(
        queued(&s.sqs, &s.queue).await,
        1,
        "one run needs one wake-up, whatever the events"
    );
}

#[tokio::test]
async fn events_that_make_no_pending_run_here_are_acknowledged_and_ignored() {
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 8).await;
    create_run(&s.api, "quick-shell").await;
    for body in [
        created("not-registered-here"),
        json!({"type": "run_status_changed", "workflow_name": "quick-shell", "from": "running", "to": "completed", "at": chrono::Utc::now()}).to_string(),
        json!({"type": "step_completed", "workflow_name": "quick-shell", "at": chrono::Utc::now()}).to_string(),
        json!({"type": "user_signed_in", "user_id": 1, "at": chrono::Utc::now()}).to_string(),
    ] {
        let (status, answer) = post(&s.worker, signed(SECRET, &body)).await;
        assert_eq!(status, 202, "{body}: {answer}");
        assert_eq!(answer["woke"], false, "{answer}");
        assert!(answer["ignored"].is_string(), "{answer}");
    }
    assert_eq!(queued(&s.sqs, &s.queue).await, 0);
    let requeued = json!({"type": "run_status_changed", "workflow_name": "quick-shell", "from": "running", "to": "pending", "at": chrono::Utc::now()}).to_string();
    assert_eq!(
        post(&s.worker, signed(SECRET, &requeued)).await.1["woke"],
        true
    );
}

#[tokio::test]
async fn a_burst_of_events_queues_what_the_backlog_needs_not_one_per_event() {
    // N = 4: 20 runs need 5 invocations.
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 4).await;
    for _ in 0..20 {
        create_run(&s.api, "quick-shell").await;
    }
    for _ in 0..20 {
        let (status, _) = post(&s.worker, signed(SECRET, &created("quick-shell"))).await;
        assert_eq!(status, 202);
    }
    assert_eq!(queued(&s.sqs, &s.queue).await, 5);
}

#[tokio::test]
async fn a_timer_wake_up_waiting_on_the_queue_holds_back_no_push() {
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 8).await;
    // A timer wake-up booked for a sleep due in ten minutes.
    s.sqs
        .send_message()
        .queue_url(&s.queue)
        .message_body(r#"{"reason":"due"}"#)
        .delay_seconds(600)
        .send()
        .await
        .unwrap();
    create_run(&s.api, "quick-shell").await;
    let (status, answer) = post(&s.worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(
        queued(&s.sqs, &s.queue).await,
        1,
        "a wake-up for now, beside the delayed one"
    );
}

#[tokio::test]
async fn events_arriving_together_queue_what_the_backlog_needs_and_are_all_acknowledged() {
    // The API's publisher posts each event in a task of its own: a burst arrives at once.
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 4).await;
    for _ in 0..20 {
        create_run(&s.api, "quick-shell").await;
    }
    let bodies: Vec<String> = (0..40).map(|_| created("quick-shell")).collect();
    let answers = futures_util::future::join_all(
        bodies
            .iter()
            .map(|body| post(&s.worker, signed(SECRET, body))),
    )
    .await;
    for (status, answer) in &answers {
        assert_eq!(*status, 202, "{answer}");
    }
    assert_eq!(
        queued(&s.sqs, &s.queue).await,
        5,
        "ceil(20 / 4), not one per event"
    );
}

#[tokio::test]
async fn a_receiver_without_its_secret_is_off_and_says_which_variable() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let worker = worker(&api, &sqs, "http://127.0.0.1:1/000000000000/none", 8)
        .build()
        .unwrap();
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(status, 503);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("IRONFLOW_WEBHOOK_SECRET_ARN")
    );
    // And a receiver needs a wake queue to wake anything.
    let no_queue = LambdaWorkerBuilder::new(&api.url(), TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .webhook_secret(SECRET)
        .build();
    let err = no_queue.err().unwrap().to_string();
    assert!(err.contains("IRONFLOW_WAKE_QUEUE_URL"), "{err}");
    let short = LambdaWorkerBuilder::new(&api.url(), TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .webhook_secret("short")
        .wake_ups(Waker::new(sqs, WakeSettings::new("http://127.0.0.1:1/q")))
        .build();
    let err = short.err().unwrap().to_string();
    assert!(
        err.contains("IRONFLOW_WEBHOOK_SECRET") && !err.contains("short"),
        "{err}"
    );
}

/// The embedded API's own webhook, signed, through the Function URL stand-in, to the receiver;
/// its wake-up, taken from moto's queue as Lambda's event source mapping would, starts an
/// invocation that claims the run.
#[tokio::test]
async fn a_run_created_while_idle_is_claimed_through_the_push_path() {
    // The front door first: the API's webhook needs its URL; the worker needs the API's.
    let handler: Arc<std::sync::OnceLock<Arc<LambdaWorker>>> = Arc::default();
    let serving = handler.clone();
    let url_handler: UrlHandler = Arc::new(move |event| {
        let worker = serving.get().cloned();
        Box::pin(async move {
            let Some(worker) = worker else {
                return json!({"statusCode": 503, "body": "{}"});
            };
            match ironflow_lambda::handle(&worker, lambda_event(event)).await {
                Ok(answer) => answer,
                Err(e) => json!({"statusCode": 500, "body": e.to_string()}),
            }
        })
    });
    let front = FunctionUrl::start(url_handler).await.unwrap();
    let webhook = Webhook {
        url: front.url(),
        signing_secret: Some(SECRET.to_string()),
    };
    let api = LocalApi::start_with_webhook(TOKEN, &Backend::Memory, webhook)
        .await
        .unwrap();
    let s = setup(api, 8).await;
    assert!(handler.set(s.worker.clone()).is_ok());

    // Created through the API's route, which publishes `run_created` to the webhook.
    let client = ironflow_worker::ApiRunStore::new(&s.api.url(), TOKEN);
    let run = client
        .create_run(new_run("quick-shell", 0))
        .await
        .unwrap()
        .into_run()
        .id;
    let end = tokio::time::Instant::now() + LONG;
    let messages = loop {
        let messages = take_visible(&s.sqs, &s.queue).await;
        if !messages.is_empty() {
            break messages;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no wake-up reached the queue"
        );
    };
    let body: Value = serde_json::from_str(messages[0].body().unwrap()).unwrap();
    assert_eq!(body["reason"], "pushed", "{body}");
    let response = ironflow_lambda::handle_response(&s.worker, lambda_event(sqs_event(&messages)))
        .await
        .unwrap();
    let summary = response.summary().unwrap();
    assert_eq!(summary.runs.len(), 1, "{summary:?}");
    assert_eq!(summary.runs[0].run_id, run);
    let state = state_of(&s.api, run).await;
    assert_eq!(state, RunStatus::Completed);
}

/// A push whose request leaves no time to send its wake-up is answered 503 with nothing sent,
/// and the body is not taken: the API's webhook sends it again, and that one wakes.
#[tokio::test]
async fn a_push_with_no_time_left_to_send_is_answered_503_and_wakes_when_sent_again() {
    let s = setup(LocalApi::start(TOKEN).await.unwrap(), 8).await;
    create_run(&s.api, "quick-shell").await;
    let body = created("quick-shell");
    // 50 ms to the deadline: less than the reserve kept for the answer, so no time for calls.
    let (status, answer) =
        post_within(&s.worker, signed(SECRET, &body), Duration::from_millis(50)).await;
    assert_eq!(status, 503, "nothing surely reached the queue: {answer}");
    assert_eq!(answer["woke"], false, "{answer}");
    assert_eq!(answer["wake_ups"]["sent"], 0, "{answer}");
    let errors = answer["wake_ups"]["errors"].to_string();
    assert!(errors.contains("none sent"), "{answer}");
    assert_eq!(queued(&s.sqs, &s.queue).await, 0, "no send was started");
    // The API's re-send of the same body is not a duplicate: it wakes.
    let (status, answer) = post(&s.worker, signed(SECRET, &body)).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(queued(&s.sqs, &s.queue).await, 1);
}

/// A backlog read that never answers ends before the request's time does: the send keeps its
/// share of the time and the wake-up is sent.
#[tokio::test]
async fn a_backlog_read_that_never_answers_leaves_the_send_its_time() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    create_run(&api, "quick-shell").await;
    let proxy = FaultProxy::start(&api.url(), 1).await;
    proxy.black_hole("GET /runs/pending-count");
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let mut wake = WakeSettings::new(&queue);
    wake.max_per_invocation = 3;
    let worker = LambdaWorkerBuilder::new(&proxy.url(), TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .webhook_secret(SECRET)
        .wake_ups(Waker::new(sqs.clone(), wake))
        .build()
        .unwrap();
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(proxy.stats().total("black_hole"), 1, "the read was held");
    let errors = answer["wake_ups"]["errors"].to_string();
    assert!(
        errors.contains("pending count ran into the deadline"),
        "{answer}"
    );
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(answer["wake_ups"]["sent"], 1, "{answer}");
    assert_eq!(queued(&sqs, &queue).await, 1);
}
