//! Triggers and wake-ups through the handler, in-process, against the real ironflow API
//! (`LocalApi`) and moto's SQS (`IRONFLOW_TEST_MOTO_ENDPOINT`, started by `./scripts/test`).
//!
//! The sample events in `events/` are the inputs; responses are compared as exact JSON.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::QueueAttributeName;
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_lambda::TriggerError;
use ironflow_lambda::samples;
use ironflow_lambda::{HandlerError, Response};
use ironflow_lambda::{report::WakeTrigger, settings::WakeSettings, wake_ups::Waker};
use ironflow_local_api::{LocalApi, new_run};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::Store;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use uuid::Uuid;

use common::moto::{
    moto_endpoint, new_queue, sqs_client, sqs_event, take_visible, traced_sqs_client,
};

const TOKEN: &str = "triggers-test-token";

fn sample(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An event with a real deadline `left` from now.
fn event(payload: Value, left: Duration) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = Uuid::new_v4().to_string();
    context.deadline = epoch_ms() + left.as_millis() as u64;
    LambdaEvent::new(payload, context)
}

/// N = 2, as the samples assume.
fn builder(api_url: &str, token: &str) -> LambdaWorkerBuilder {
    LambdaWorkerBuilder::new(api_url, token)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .register(samples::MultiStep { step_secs: 30.0 })
        .max_runs_per_invocation(2)
        .concurrency(2)
        .function_timeout(Duration::from_secs(30))
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_secs(1))
}

async fn create(api: &LocalApi, workflow: &str, count: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(
            api.store()
                .create_run(new_run(workflow, 0))
                .await
                .unwrap()
                .into_run()
                .id,
        );
    }
    ids
}

async fn states(store: &Arc<dyn Store>, ids: &[Uuid]) -> Vec<RunStatus> {
    let mut out = Vec::new();
    for id in ids {
        out.push(store.get_run(*id).await.unwrap().unwrap().status.state);
    }
    out
}

/// A loopback URL nothing listens on.
async fn unreachable_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn failures(ids: &[&str]) -> Value {
    json!({"batchItemFailures": ids.iter().map(|id| json!({"itemIdentifier": id})).collect::<Vec<_>>()})
}

const WAKE_IDS: [&str; 3] = [
    "9a1b7c6e-0d2f-4c1e-9a55-000000000001",
    "9a1b7c6e-0d2f-4c1e-9a55-000000000002",
    "9a1b7c6e-0d2f-4c1e-9a55-000000000003",
];
const MALFORMED_ID: &str = "5c0ffee0-1111-4a2b-8c3d-000000000002";

// --- events in, responses out ------------------------------------------------------------

#[tokio::test]
async fn sqs_wake_ups_run_one_batch_and_answer_an_empty_failure_list() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    let runs = create(&api, "quick-shell", 2).await;

    let response = ironflow_lambda::handle_response(
        &worker,
        event(sample("sqs-wake-ups.json"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(response.to_json(), json!({"batchItemFailures": []}));
    let summary = response.summary().unwrap();
    assert_eq!(summary.claimed, 2, "{summary:?}");
    assert_eq!(
        states(api.store(), &runs).await,
        [RunStatus::Completed, RunStatus::Completed]
    );
}

#[tokio::test]
async fn a_malformed_body_fails_only_its_own_record() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    let runs = create(&api, "quick-shell", 1).await;

    let response = ironflow_lambda::handle(
        &worker,
        event(sample("sqs-one-malformed.json"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(response, failures(&[MALFORMED_ID]));
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Completed]);
}

#[tokio::test]
async fn only_malformed_records_run_no_batch() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    let runs = create(&api, "quick-shell", 1).await;
    let mut event_json = sample("sqs-one-malformed.json");
    event_json["Records"][0]["body"] = json!("[not, an, object]");
    let first = event_json["Records"][0]["messageId"]
        .as_str()
        .unwrap()
        .to_string();

    let response =
        ironflow_lambda::handle_response(&worker, event(event_json, Duration::from_secs(30)))
            .await
            .unwrap();
    assert_eq!(response.to_json(), failures(&[&first, MALFORMED_ID]));
    assert!(response.summary().is_none());
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);
}

#[tokio::test]
async fn sqs_batch_that_cannot_run_lists_every_record() {
    // The API unreachable.
    let worker = builder(&unreachable_url().await, TOKEN).build().unwrap();
    let response = ironflow_lambda::handle(
        &worker,
        event(sample("sqs-wake-ups.json"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(response, failures(&WAKE_IDS));

    // Auth refused: the record with a malformed body is listed as well, once.
    let api = LocalApi::start(TOKEN).await.unwrap();
    let runs = create(&api, "quick-shell", 1).await;
    let worker = builder(&api.url(), "wrong-token").build().unwrap();
    let response = ironflow_lambda::handle(
        &worker,
        event(sample("sqs-one-malformed.json"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(
        response,
        failures(&["5c0ffee0-1111-4a2b-8c3d-000000000001", MALFORMED_ID])
    );
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);
}

#[tokio::test]
async fn sqs_batch_without_time_left_lists_every_record_and_claims_nothing() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    let runs = create(&api, "quick-shell", 1).await;
    // 1 s left, below the 1.5 s margin: the cutoff has already passed.
    let response = ironflow_lambda::handle(
        &worker,
        event(sample("sqs-wake-ups.json"), Duration::from_secs(1)),
    )
    .await
    .unwrap();
    assert_eq!(response, failures(&WAKE_IDS));
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);
}

#[tokio::test]
async fn schedule_and_direct_batches_that_cannot_run_are_errors() {
    let worker = builder(&unreachable_url().await, TOKEN).build().unwrap();
    for name in [
        "schedule.json",
        "schedule-custom-input.json",
        "direct-empty.json",
    ] {
        let err = ironflow_lambda::handle(&worker, event(sample(name), Duration::from_secs(30)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, HandlerError::BatchNotRun { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("claim failed"), "{name}: {err}");
        let diagnostic = lambda_runtime::Diagnostic::from(err);
        assert_eq!(diagnostic.error_type, "BatchNotRun");
    }
}

#[tokio::test]
async fn invalid_events_are_refused_before_any_call_to_the_api() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    let runs = create(&api, "quick-shell", 1).await;
    let before = api.requests();

    for (name, kind) in [
        ("invalid-max-runs.json", "InvalidEvent"),
        ("invalid-not-an-object.json", "InvalidEvent"),
        ("invalid-s3-notification.json", "InvalidEvent"),
        (
            "invalid-sqs-without-message-id.json",
            "UnreportableSqsRecord",
        ),
    ] {
        let err = ironflow_lambda::handle(&worker, event(sample(name), Duration::from_secs(30)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, HandlerError::InvalidEvent(_)),
            "{name}: {err}"
        );
        assert_eq!(
            lambda_runtime::Diagnostic::from(err).error_type,
            kind,
            "{name}"
        );
    }
    let err = ironflow_lambda::handle(
        &worker,
        event(sample("invalid-max-runs.json"), Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    assert!(matches!(
        err,
        HandlerError::InvalidEvent(TriggerError::InvalidField {
            field: "max_runs",
            ..
        })
    ));
    assert!(err.to_string().contains("1 to 2"), "{err}");

    assert_eq!(api.requests(), before, "an invalid event reached the API");
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);
}

#[tokio::test]
async fn overrides_and_custom_inputs_size_the_batch() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN).build().unwrap();
    create(&api, "quick-shell", 6).await;

    for (name, claimed) in [
        ("direct-overrides.json", 1),
        ("schedule-custom-input.json", 2),
        ("schedule.json", 2),
        ("direct-empty.json", 1),
    ] {
        let response =
            ironflow_lambda::handle_response(&worker, event(sample(name), Duration::from_secs(30)))
                .await
                .unwrap();
        let Response::Summary(summary) = response else {
            panic!("{name}: not a summary")
        };
        assert_eq!(summary.claimed, claimed, "{name}: {summary:?}");
        assert!(summary.wake_ups.is_none(), "no wake queue configured");
    }
}

#[tokio::test]
async fn a_past_deadline_gets_the_emulated_invocation_only_when_configured() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let runs = create(&api, "quick-shell", 1).await;
    // cargo lambda watch sends Lambda-Runtime-Deadline-Ms: 600000 (1970).
    let emulated = || {
        let mut context = Context::default();
        context.request_id = "emulated".into();
        context.deadline = 600_000;
        LambdaEvent::new(json!({}), context)
    };

    let plain = builder(&api.url(), TOKEN).build().unwrap();
    let err = ironflow_lambda::handle(&plain, emulated())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no time left"), "{err}");
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);

    let emulator = builder(&api.url(), TOKEN)
        .emulated_invocation(Duration::from_secs(20))
        .build()
        .unwrap();
    let response = ironflow_lambda::handle(&emulator, emulated())
        .await
        .unwrap();
    assert_eq!(response["claimed"], 1, "{response}");
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Completed]);

    let too_short = builder(&api.url(), TOKEN)
        .emulated_invocation(Duration::from_secs(1))
        .build()
        .err()
        .unwrap();
    assert!(
        too_short
            .to_string()
            .contains("IRONFLOW_EMULATED_INVOCATION_SECS"),
        "{too_short}"
    );
}

// --- wake-ups (moto's SQS) ----------------------------------------------------------------

async fn queue_depth(sqs: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap();
    let get = |name| {
        out.attributes()
            .and_then(|a| a.get(&name))
            .map_or(0, |v| v.parse().unwrap())
    };
    (
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
    )
}

/// Receive (and delete) every visible message, waiting for `expected` of them.
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str, expected: usize) -> Vec<Value> {
    let mut bodies = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while bodies.len() < expected && tokio::time::Instant::now() < deadline {
        for m in take_visible(sqs, url).await {
            bodies.push(serde_json::from_str(m.body().unwrap()).unwrap());
        }
    }
    bodies
}

fn waker(sqs: &aws_sdk_sqs::Client, url: &str, max: usize, delay_secs: u64) -> Waker {
    let mut settings = WakeSettings::new(url);
    settings.max_per_invocation = max;
    settings.handback_delay = Duration::from_secs(delay_secs);
    Waker::new(sqs.clone(), settings)
}

#[tokio::test]
async fn a_filled_batch_sends_what_the_backlog_needs_minus_what_is_queued() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    create(&api, "quick-shell", 5).await;

    // Claims 2 of 5: 3 pending → ceil(3 / 2) = 2 wake-ups.
    let response = ironflow_lambda::handle(&worker, event(json!({}), Duration::from_secs(30)))
        .await
        .unwrap();
    let wake = &response["wake_ups"];
    assert_eq!(
        (
            wake["trigger"].clone(),
            wake["pending_runs"].clone(),
            wake["queued"].clone(),
            wake["sent"].clone()
        ),
        (json!("backlog"), json!(3), json!(0), json!(2)),
        "{response}"
    );
    assert_eq!(queue_depth(&sqs, &url).await, (2, 0));

    // Claims 2 more: 1 pending → 1 wake-up needed, 2 already queued → none sent.
    let response = ironflow_lambda::handle(&worker, event(json!({}), Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(response["wake_ups"]["sent"], 0, "{response}");
    assert_eq!(response["wake_ups"]["queued"], 2, "{response}");

    let bodies = drain(&sqs, &url, 2).await;
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        assert_eq!(body["reason"], "backlog");
        assert_eq!(body["pending_runs"], 3);
    }
    // Each wake-up is a valid wake-up for the queue-triggered function.
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| json!({"messageId": format!("w{i}"), "body": b.to_string(), "eventSource": "aws:sqs"}))
        .collect();
    let response = ironflow_lambda::handle(
        &worker,
        event(json!({"Records": records}), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(response, json!({"batchItemFailures": []}));
}

#[tokio::test]
async fn wake_ups_are_capped_per_invocation() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .max_runs_per_invocation(1)
        .wake_ups(waker(&sqs, &url, 2, 0))
        .build()
        .unwrap();
    create(&api, "quick-shell", 7).await;

    let response = ironflow_lambda::handle(&worker, event(json!({}), Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(response["wake_ups"]["pending_runs"], 6, "{response}");
    assert_eq!(response["wake_ups"]["sent"], 2, "{response}");
    assert_eq!(queue_depth(&sqs, &url).await, (2, 0));
}

#[tokio::test]
async fn no_backlog_no_wake_up() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    create(&api, "quick-shell", 1).await;

    let response = ironflow_lambda::handle(&worker, event(json!({}), Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(response["stop_reason"], "no_pending_run", "{response}");
    assert_eq!(
        response["wake_ups"],
        json!({"trigger": null, "pending_runs": null, "queued": null, "sent": 0, "delay_secs": 0, "errors": []})
    );
    assert_eq!(queue_depth(&sqs, &url).await, (0, 0));
}

#[tokio::test]
async fn a_handback_sends_a_delayed_wake_up() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    // A delay far longer than the test: the message is still delayed when we look.
    let worker = builder(&api.url(), TOKEN)
        .wake_ups(waker(&sqs, &url, 3, 600))
        .build()
        .unwrap();
    let runs = create(&api, "multi-step", 1).await;

    // 4 s left, 1.5 s margin: the 30 s step is handed back at the cutoff.
    let response =
        ironflow_lambda::handle_response(&worker, event(json!({}), Duration::from_secs(4)))
            .await
            .unwrap();
    let summary = response.summary().unwrap();
    let wake = summary.wake_ups.as_ref().unwrap();
    assert_eq!(wake.trigger, Some(WakeTrigger::HandedBack), "{summary:?}");
    assert_eq!(
        (wake.pending_runs, wake.sent, wake.delay_secs),
        (Some(1), 1, 600)
    );
    assert_eq!(states(api.store(), &runs).await, [RunStatus::Pending]);
    assert_eq!(queue_depth(&sqs, &url).await, (0, 1));
}

#[tokio::test]
async fn a_failed_send_is_reported_and_does_not_fail_the_batch() {
    let sqs = sqs_client();
    let missing = format!(
        "{}/000000000000/no-such-queue-{}",
        moto_endpoint(),
        Uuid::new_v4().simple()
    );
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .wake_ups(waker(&sqs, &missing, 3, 0))
        .build()
        .unwrap();
    let runs = create(&api, "quick-shell", 3).await;

    let response =
        ironflow_lambda::handle_response(&worker, event(json!({}), Duration::from_secs(30)))
            .await
            .unwrap();
    let summary = response.summary().unwrap();
    assert_eq!(summary.claimed, 2);
    let wake = summary.wake_ups.as_ref().unwrap();
    assert_eq!(wake.sent, 0);
    assert!(
        wake.errors
            .iter()
            .any(|e| e.contains("sending wake-ups failed")),
        "{wake:?}"
    );
    let done = states(api.store(), &runs).await;
    assert_eq!(
        done.iter().filter(|s| **s == RunStatus::Completed).count(),
        2
    );
}

#[tokio::test]
async fn concurrent_invocations_carry_their_own_trace_header_on_their_wake_ups() {
    let (sqs, recorded) = traced_sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    // Two invocations at once in one worker, as on a managed instance, where lambda_runtime
    // sets no `_X_AMZN_TRACE_ID` per invocation (and this test process has none).
    assert!(std::env::var_os("_X_AMZN_TRACE_ID").is_none());
    let worker = builder(&api.url(), TOKEN)
        .concurrent_invocations(2)
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    // Each fills its batch of 2 and leaves a backlog that needs more wake-ups than the
    // other one queues (at most 3 each): both send.
    create(&api, "quick-shell", 20).await;
    let traced = |trace: &str| {
        let mut e = event(json!({}), Duration::from_secs(30));
        e.context.xray_trace_id = Some(trace.to_string());
        e
    };
    let (a, b) = (
        "Root=1-67891233-abcdef012345678912345678;Parent=53995c3f42cd8ad8;Sampled=1",
        "Root=1-67891233-111111111111111111111111;Parent=1111111111111111;Sampled=0",
    );
    let (ra, rb) = tokio::join!(
        ironflow_lambda::handle_response(&worker, traced(a)),
        ironflow_lambda::handle_response(&worker, traced(b)),
    );
    for r in [&ra, &rb] {
        let wake = r
            .as_ref()
            .unwrap()
            .summary()
            .unwrap()
            .wake_ups
            .clone()
            .unwrap();
        assert!(wake.sent > 0, "{wake:?}");
    }
    let mut seen = recorded.recorded();
    seen.sort();
    let mut expected = vec![Some(a.to_string()), Some(b.to_string())];
    expected.sort();
    assert_eq!(
        seen, expected,
        "one send each, with its own invocation's header"
    );
}

/// A workflow whose one step runs past its own 1 s timeout: a retryable failure.
struct StepTimesOut;

impl ironflow_engine::handler::WorkflowHandler for StepTimesOut {
    fn name(&self) -> &str {
        "step-times-out"
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a mut ironflow_engine::context::WorkflowContext,
    ) -> ironflow_engine::handler::HandlerFuture<'a> {
        Box::pin(async move {
            let slow = ironflow_engine::config::ShellConfig::new("sleep 30").timeout_secs(1);
            ctx.shell("slow", slow).await?;
            Ok(())
        })
    }
}

/// A workflow that sleeps `secs` in a `ctx.delay` step.
struct Sleeps(u64);

impl ironflow_engine::handler::WorkflowHandler for Sleeps {
    fn name(&self) -> &str {
        "sleeps"
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a mut ironflow_engine::context::WorkflowContext,
    ) -> ironflow_engine::handler::HandlerFuture<'a> {
        Box::pin(async move {
            ctx.delay(
                "nap",
                ironflow_engine::config::delay::DelayConfig::from_secs(self.0),
            )
            .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn runs_left_retrying_or_sleeping_get_a_wake_up_delayed_until_they_are_due() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .register(StepTimesOut)
        .register(Sleeps(60))
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    // One retry left: the engine schedules it after its backoff (30 s ± 20 %).
    let failing = api
        .store()
        .create_run(new_run("step-times-out", 1))
        .await
        .unwrap()
        .into_run()
        .id;
    let sleeping = create(&api, "sleeps", 1).await[0];

    let response =
        ironflow_lambda::handle_response(&worker, event(json!({}), Duration::from_secs(30)))
            .await
            .unwrap();
    let summary = response.summary().unwrap();
    let report = |id| summary.runs.iter().find(|r| r.run_id == id).unwrap();
    let (retry, sleep) = (report(failing), report(sleeping));
    let retry_due = retry.due.expect("the retry's due time");
    let sleep_due = sleep.due.expect("the sleep's wake time");
    assert_eq!(retry_due.status, RunStatus::Retrying, "{retry:?}");
    assert_eq!(sleep_due.status, RunStatus::Sleeping, "{sleep:?}");
    // The times the API has.
    let store = api.store();
    let stored_failing = store.get_run(failing).await.unwrap().unwrap();
    let stored_sleeping = store.get_run(sleeping).await.unwrap().unwrap();
    assert_eq!(stored_failing.status.state, RunStatus::Retrying);
    assert_eq!(stored_failing.scheduled_at, Some(retry_due.at));
    assert_eq!(stored_sleeping.scheduled_at, Some(sleep_due.at));

    let timers = &summary.wake_ups.as_ref().unwrap().timers;
    let now = chrono::Utc::now();
    let secs_until = |at: chrono::DateTime<chrono::Utc>| (at - now).num_seconds();
    // Each 1 s after it is due (the sleep's wake-up then watches it until the API's waker has
    // made it Pending).
    let expected = [secs_until(retry_due.at) + 1, secs_until(sleep_due.at) + 1];
    assert_eq!(timers.len(), 2, "{timers:?}");
    for (timer, want) in timers.iter().zip(expected) {
        let delay = i64::try_from(timer.delay_secs).unwrap();
        assert!(
            (want - 2..=want + 2).contains(&delay),
            "{timers:?} vs {expected:?}"
        );
        assert_eq!(timer.sent, 1);
    }
    assert_eq!(
        queue_depth(&sqs, &url).await,
        (0, 2),
        "two delayed wake-ups"
    );
}

/// Take every visible message of the queue as one SQS event, waiting up to `within` for the
/// first.
async fn next_wake_ups(sqs: &aws_sdk_sqs::Client, url: &str, within: Duration) -> Value {
    let end = tokio::time::Instant::now() + within;
    loop {
        let messages = take_visible(sqs, url).await;
        if !messages.is_empty() {
            return sqs_event(&messages);
        }
        assert!(tokio::time::Instant::now() < end, "no wake-up came");
    }
}

/// A sleep's timer wake-up watches the run: each woken invocation that finds it still Sleeping
/// (the API's waker looks every 10 s) books the next look a second later, and the one after the
/// waker's tick claims it. Served as Lambda's event source mapping would, from moto's queue.
#[tokio::test]
async fn a_sleeping_run_s_wake_ups_look_again_until_the_api_s_waker_woke_it_then_claim_it() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .register(Sleeps(1))
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    let run = create(&api, "sleeps", 1).await[0];
    let first =
        ironflow_lambda::handle_response(&worker, event(json!({}), Duration::from_secs(30)))
            .await
            .unwrap();
    let first = first.summary().unwrap();
    assert_eq!(first.runs[0].due.unwrap().status, RunStatus::Sleeping);
    let timers = &first.wake_ups.as_ref().unwrap().timers;
    assert_eq!(timers.len(), 1, "{timers:?}");
    assert!(timers[0].delay_secs <= 2, "{timers:?}");

    // Serve each wake-up as it comes, until one claims the run: the looks in between find it
    // still sleeping and book the next one.
    let mut looks_still_sleeping = 0;
    let claimed = loop {
        let records = next_wake_ups(&sqs, &url, Duration::from_secs(30)).await;
        let bodies: Vec<Value> = records["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
            .collect();
        assert!(
            bodies
                .iter()
                .any(|b| b["sleeping"] == json!([run.to_string()])),
            "a wake-up watching the run: {bodies:?}"
        );
        let response =
            ironflow_lambda::handle_response(&worker, event(records, Duration::from_secs(30)))
                .await
                .unwrap();
        let summary = response.summary().unwrap().clone();
        let wake = summary.wake_ups.clone().unwrap();
        if summary.runs.iter().any(|r| r.run_id == run) {
            break summary;
        }
        let watched = wake.watched.expect("the watched run was read");
        assert_eq!(watched.runs, 1, "{wake:?}");
        if watched.woken == 1 {
            // Woken after this batch's claim: a wake-up for now claims it.
            assert_eq!(wake.trigger, Some(WakeTrigger::Due), "{wake:?}");
            assert!(wake.sent >= 1, "{wake:?}");
            continue;
        }
        assert_eq!(watched.still_sleeping, 1, "{wake:?}");
        assert_eq!((watched.gave_up, watched.unbooked), (0, 0), "{wake:?}");
        assert_eq!(wake.timers.len(), 1, "{wake:?}");
        assert_eq!(wake.timers[0].delay_secs, 1, "the next look a second later");
        looks_still_sleeping += 1;
        assert!(
            looks_still_sleeping <= 12,
            "the API's waker never woke the run"
        );
    };
    assert_eq!(claimed.runs.len(), 1, "{claimed:?}");
    assert_eq!(
        api.store()
            .get_run(run)
            .await
            .unwrap()
            .unwrap()
            .status
            .state,
        RunStatus::Completed
    );
}

/// A run whose execution panics: the retry the worker records for it gets its timer wake-up.
struct Panics;

impl ironflow_engine::handler::WorkflowHandler for Panics {
    fn name(&self) -> &str {
        "panics"
    }

    fn execute<'a>(
        &'a self,
        _ctx: &'a mut ironflow_engine::context::WorkflowContext,
    ) -> ironflow_engine::handler::HandlerFuture<'a> {
        Box::pin(async move { panic!("the workflow's own bug") })
    }
}

/// A run whose one step outlasts the worker's run timeout.
struct Outlasts;

impl ironflow_engine::handler::WorkflowHandler for Outlasts {
    fn name(&self) -> &str {
        "outlasts"
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a mut ironflow_engine::context::WorkflowContext,
    ) -> ironflow_engine::handler::HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell(
                "long",
                ironflow_engine::config::ShellConfig::new("sleep 30"),
            )
            .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_retry_recorded_for_a_panic_or_a_run_timeout_gets_its_wake_up() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let worker = builder(&api.url(), TOKEN)
        .register(Panics)
        .register(Outlasts)
        .run_timeout(Duration::from_secs(1))
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    // One retry left each.
    let mut ids = Vec::new();
    for workflow in ["panics", "outlasts"] {
        let created = api.store().create_run(new_run(workflow, 1)).await.unwrap();
        ids.push(created.into_run().id);
    }
    let (panicking, outlasting) = (ids[0], ids[1]);
    let response =
        ironflow_lambda::handle_response(&worker, event(json!({}), Duration::from_secs(30)))
            .await
            .unwrap();
    let summary = response.summary().unwrap();
    for (run, outcome) in [
        (panicking, ironflow_lambda::Outcome::Panicked),
        (outlasting, ironflow_lambda::Outcome::TimedOut),
    ] {
        let report = summary.runs.iter().find(|r| r.run_id == run).unwrap();
        assert_eq!(report.outcome, outcome, "{report:?}");
        let due = report.due.expect("the retry's due time");
        assert_eq!(due.status, RunStatus::Retrying);
        let stored = api.store().get_run(run).await.unwrap().unwrap();
        assert_eq!(stored.status.state, RunStatus::Retrying);
        assert_eq!(stored.scheduled_at, Some(due.at));
    }
    let timers = &summary.wake_ups.as_ref().unwrap().timers;
    let booked: usize = timers.iter().map(|t| t.sent).sum();
    assert!((1..=2).contains(&booked), "{timers:?}");
}

fn watch_record(id: &str, runs: &[Uuid]) -> Value {
    let until = chrono::Utc::now() + chrono::TimeDelta::seconds(10);
    let body = json!({"reason": "due", "sleeping": runs, "watch_until": until.to_rfc3339()});
    json!({"messageId": id, "body": body.to_string(), "eventSource": "aws:sqs"})
}

/// A batch that could not run sends its records back to the queue for a retry: the watches
/// they carry come again with them, so none is booked beside them (it would double the watch).
#[tokio::test]
async fn a_watch_whose_record_goes_back_to_the_queue_books_no_look() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let worker = builder(&unreachable_url().await, TOKEN)
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    let records = json!({"Records": [watch_record("m0", &[Uuid::now_v7()])]});
    let response =
        ironflow_lambda::handle_response(&worker, event(records, Duration::from_secs(20)))
            .await
            .unwrap();
    let Response::Sqs {
        batch_response,
        summary,
    } = response
    else {
        panic!("an SQS response");
    };
    assert_eq!(
        serde_json::to_value(&batch_response).unwrap(),
        failures(&["m0"])
    );
    let wake = summary.unwrap().wake_ups.unwrap();
    assert!(wake.watched.is_none(), "{wake:?}");
    assert!(wake.timers.is_empty(), "{wake:?}");
    assert_eq!(queue_depth(&sqs, &url).await, (0, 0));
}

/// Reads of watched runs that get no answer end halfway through the wake-up phase: the next
/// look (and any timer) is still booked, the runs looked at again.
#[tokio::test]
async fn watched_runs_whose_reads_hang_are_looked_at_again_in_time() {
    let sqs = sqs_client();
    let url = new_queue(&sqs).await;
    let api = LocalApi::start(TOKEN).await.unwrap();
    let proxy = common::fault_proxy::FaultProxy::start(&api.url(), 7).await;
    proxy.black_hole("GET /runs/{id}");
    let worker = builder(&proxy.url(), TOKEN)
        .wake_ups(waker(&sqs, &url, 3, 0))
        .build()
        .unwrap();
    let runs: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let records =
        json!({"Records": [watch_record("m0", &runs[..2]), watch_record("m1", &runs[1..])]});
    let summary = ironflow_lambda::handle_summary(&worker, event(records, Duration::from_secs(20)))
        .await
        .unwrap();
    proxy.lift_black_holes();
    let wake = summary.wake_ups.clone().unwrap();
    let watched = wake.watched.unwrap();
    assert_eq!(
        (watched.runs, watched.still_sleeping),
        (3, 3),
        "each run read once: {wake:?}"
    );
    assert!(
        wake.errors.len() == 1 && wake.errors[0].contains("reading 3 watched run(s) failed"),
        "{wake:?}"
    );
    assert_eq!(wake.timers.len(), 1, "{wake:?}");
    assert_eq!((wake.timers[0].delay_secs, wake.timers[0].sent), (1, 1));
    let bodies = drain(&sqs, &url, 1).await;
    let mut again: Vec<Uuid> = serde_json::from_value(bodies[0]["sleeping"].clone()).unwrap();
    again.sort();
    let mut want = runs.clone();
    want.sort();
    assert_eq!(again, want, "the three runs, in one look");
    assert!(summary.time_left_ms >= 400, "{summary:?}");
}
