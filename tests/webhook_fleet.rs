//! The webhook receiver's wake-ups as a fleet sees them: receivers in separate processes
//! sharing the DynamoDB wake-up mark (moto's DynamoDB and SQS, `IRONFLOW_TEST_MOTO_ENDPOINT`),
//! the backlog counted without the workflows the poison pill blocks, and the events of the real
//! API's routes that make a run Pending (the embedded API's webhook, through the Function URL
//! stand-in).

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::HumanInputConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::DynamoPoisonTable;
use ironflow_lambda::poison::{PoisonMode, PoisonPolicy, PoisonTable, now_ms};
use ironflow_lambda::{
    LambdaWorker, LambdaWorkerBuilder, MemoryPoisonTable, samples, settings::WakeSettings,
    wake_ups::Waker,
};
use ironflow_local_api::{Backend, FunctionUrl, LocalApi, UrlHandler, Webhook, new_run};
use ironflow_store::entities::{RunStatus, StepKind, StepStatus};
use serde_json::{Value, json};
use uuid::Uuid;

use common::fault_proxy::FaultProxy;
use common::moto::{
    delayed, dynamodb_config, moto_endpoint, new_queue, poison_table, queued, sqs_client,
    sqs_event, take_visible,
};
use common::wait_until;
use common::webhook::{created, lambda_event, post, signed};
use common::{create_run, state_of};

const TOKEN: &str = "webhook-fleet-test-token";
const SECRET: &str = "a-webhook-secret-of-at-least-32-characters";
const LONG: Duration = Duration::from_secs(60);

// --- helpers (local to this file) ---------------------------------------------------------

/// A worker on `api` with `quick-shell` and the wake queue `queue` (N = `runs`, 10 wake-ups per
/// call at most), whose receiver has [`SECRET`].
fn builder(
    api_url: &str,
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    runs: usize,
) -> LambdaWorkerBuilder {
    let mut wake = WakeSettings::new(queue);
    wake.max_per_invocation = 10;
    LambdaWorkerBuilder::new(api_url, TOKEN)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .max_runs_per_invocation(runs)
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
        .webhook_secret(SECRET)
        .wake_ups(Waker::new(sqs.clone(), wake))
}

// --- item 3: coalescing across environments -----------------------------------------------

/// What a child receiver is told, through its environment.
const CHILD_DIR: &str = "WEBHOOK_FLEET_CHILD_DIR";
const CHILD_API: &str = "WEBHOOK_FLEET_CHILD_API";
const CHILD_QUEUE: &str = "WEBHOOK_FLEET_CHILD_QUEUE";
const CHILD_TABLE: &str = "WEBHOOK_FLEET_CHILD_TABLE";
const CHILD_NAMESPACE: &str = "WEBHOOK_FLEET_CHILD_NAMESPACE";
/// moto's DynamoDB, one request at a time (see [`FaultProxy::one_request_at_a_time`]).
const CHILD_DYNAMODB: &str = "WEBHOOK_FLEET_CHILD_DYNAMODB";
const RECEIVERS: usize = 8;

/// One receiver in an execution environment of its own: this test binary re-executed with
/// `fleet_child` as its filter. It builds its worker (cold start), says it is ready, waits for
/// the go, receives one `run_created` and prints its answer.
#[tokio::test]
#[ignore = "a child process of receivers_in_separate_processes_queue_what_the_backlog_needs_once"]
async fn fleet_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let sqs = sqs_client();
    let table = DynamoPoisonTable::connect_with(
        dynamodb_config(&var(CHILD_DYNAMODB)),
        &var(CHILD_TABLE),
        &var(CHILD_NAMESPACE),
        PoisonPolicy::default(),
    )
    .await
    .unwrap();
    let worker = builder(&var(CHILD_API), &sqs, &var(CHILD_QUEUE), 4)
        .dynamo_poison_table(table)
        .build()
        .unwrap();
    let dir = PathBuf::from(dir);
    std::fs::write(dir.join(format!("ready-{}", std::process::id())), "").unwrap();
    let go = dir.join("go");
    let end = tokio::time::Instant::now() + LONG;
    while !go.exists() {
        assert!(tokio::time::Instant::now() < end, "no go from the test");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (status, body) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    println!("\nANSWER {}", json!({"status": status, "body": body}));
}

fn ready_children(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("ready-"))
        })
        .count()
}

/// Each child's answer, from its output.
fn answers(output: &std::process::Output) -> Vec<Value> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "a child receiver failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once("ANSWER ").map(|(_, answer)| answer))
        .map(|a| serde_json::from_str(a).unwrap())
        .collect()
}

/// 20 runs, N = 4: the backlog needs 5 wake-ups. Eight receivers in eight processes (eight
/// execution environments), each receiving its event at once, queue those 5 and at most the
/// window's one tail wake-up, not 5 each.
#[tokio::test]
async fn receivers_in_separate_processes_queue_what_the_backlog_needs_once() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    for _ in 0..20 {
        create_run(&api, "quick-shell").await;
    }
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let table = poison_table().await;
    // The receivers' conditional writes reach moto one at a time, each applied whole, as
    // DynamoDB applies them (moto's own steps interleave).
    let dynamodb = FaultProxy::start(&moto_endpoint(), 24).await;
    dynamodb.one_request_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..RECEIVERS)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "fleet_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_DIR, dir.path())
                .env(CHILD_API, api.url())
                .env(CHILD_QUEUE, &queue)
                .env(CHILD_TABLE, &table)
                .env(CHILD_NAMESPACE, "fleet-test")
                .env(CHILD_DYNAMODB, dynamodb.url())
                .kill_on_drop(true)
                .output()
        })
        .collect();
    let outputs = tokio::spawn(futures_util::future::join_all(children));
    wait_until("every child receiver is ready", LONG, || async {
        ready_children(dir.path()) == RECEIVERS
    })
    .await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let outputs = outputs.await.unwrap();

    let (mut sent, mut tails) = (0, 0);
    for output in outputs {
        let output = output.unwrap();
        let answers = answers(&output);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(answers.len(), 1, "one answer per child: {stdout}");
        let answer = &answers[0];
        assert_eq!(answer["status"], 202, "{answer}");
        let errors = &answer["body"]["wake_ups"]["errors"];
        assert!(errors.as_array().is_none_or(Vec::is_empty), "{answer}");
        sent += answer["body"]["wake_ups"]["sent"].as_u64().unwrap_or(0);
        tails += u64::from(answer["body"]["wake_ups"]["tail"] == true);
    }
    // The tail wake-up (one for the window, delayed to its end) may be visible by now.
    let on_queue = queued(&sqs, &queue).await + delayed(&sqs, &queue).await;
    assert!(
        (5..=6).contains(&on_queue),
        "ceil(20 / 4) and at most one tail, not 5 per environment: {on_queue} queued"
    );
    assert!(tails <= 1, "one tail per window: {tails}");
    assert_eq!(sent, on_queue);
    assert_eq!(sent, 5 + tails, "the backlog's 5 and the tails");
}

/// A worker like [`builder`]'s (N = 4) whose receiver shares the wake-up mark in the DynamoDB
/// table `table` (namespace `fleet-test`), with a window of `window`: one execution
/// environment of the fleet.
async fn fleet_worker(
    api: &LocalApi,
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    table: &str,
    window: Duration,
) -> LambdaWorker {
    let table = DynamoPoisonTable::connect_with(
        dynamodb_config(&moto_endpoint()),
        table,
        "fleet-test",
        PoisonPolicy::default(),
    )
    .await
    .unwrap();
    builder(&api.url(), sqs, queue, 4)
        .dynamo_poison_table(table)
        .wake_mark_window(window)
        .build()
        .unwrap()
}

/// A trickle: a run's wake-up is taken and its run claimed, then, within the window of that
/// decision, a second run is created. Its push finds the mark covering a backlog of 1 and the
/// queue empty: it books the window's tail wake-up, delayed to the window's end (here the
/// window is a minute long, so that the second push falls within it whatever the machine's
/// load), instead of leaving the run to the schedule.
#[tokio::test]
async fn a_run_pushed_after_the_window_s_wake_ups_were_taken_gets_a_tail_wake_up() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let table = poison_table().await;
    let worker = fleet_worker(&api, &sqs, &queue, &table, LONG).await;

    let first = create_run(&api, "quick-shell").await;
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["wake_ups"]["sent"], 1, "{answer}");
    // Its wake-up is taken off the queue, and its invocation claims the run.
    let taken = take_visible(&sqs, &queue).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    let summary = ironflow_lambda::handle_summary(&worker, lambda_event(sqs_event(&taken)))
        .await
        .unwrap();
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert!(
        summary.runs.iter().any(|r| r.run_id == first),
        "{summary:?}"
    );
    assert_eq!(queued(&sqs, &queue).await + delayed(&sqs, &queue).await, 0);

    // A second run, within the window.
    create_run(&api, "quick-shell").await;
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        answer["woke"], true,
        "the run must not wait for the schedule: {answer}"
    );
    let wake_ups = &answer["wake_ups"];
    assert_eq!(
        (&wake_ups["sent"], &wake_ups["tail"]),
        (&json!(1), &json!(true)),
        "{answer}"
    );
    let delay = wake_ups["delay_secs"].as_u64().unwrap();
    assert!(
        (1..=LONG.as_secs()).contains(&delay),
        "to the window's end: {answer}"
    );
    assert_eq!(delayed(&sqs, &queue).await, 1, "the tail, delayed");
    assert_eq!(queued(&sqs, &queue).await, 0);
}

/// However many decisions of one window find the mark covering their backlog, in however many
/// environments, one of them books the window's tail.
#[tokio::test]
async fn the_tail_is_booked_once_per_window() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let table = poison_table().await;
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(fleet_worker(&api, &sqs, &queue, &table, LONG).await);
    }
    create_run(&api, "quick-shell").await;
    let (status, answer) = post(&workers[0], signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(
        (status, &answer["wake_ups"]["sent"]),
        (202, &json!(1)),
        "{answer}"
    );
    // Its wake-up is taken: the queue no longer shows it.
    assert_eq!(take_visible(&sqs, &queue).await.len(), 1);

    // Four environments decide at once for three more runs (a backlog still needing one).
    for _ in 0..3 {
        create_run(&api, "quick-shell").await;
    }
    let bodies: Vec<String> = (0..workers.len()).map(|_| created("quick-shell")).collect();
    let pushes = workers
        .iter()
        .zip(&bodies)
        .map(|(worker, body)| post(worker, signed(SECRET, body)));
    let mut answers = futures_util::future::join_all(pushes).await;
    // And more decisions after them, in the same window.
    for worker in &workers {
        answers.push(post(worker, signed(SECRET, &created("quick-shell"))).await);
    }
    let mut sent = 0;
    for (status, answer) in &answers {
        assert_eq!(*status, 202, "{answer}");
        let errors = &answer["wake_ups"]["errors"];
        assert!(errors.as_array().is_none_or(Vec::is_empty), "{answer}");
        sent += answer["wake_ups"]["sent"].as_u64().unwrap_or(0);
    }
    let tails = answers
        .iter()
        .filter(|(_, answer)| answer["wake_ups"]["tail"] == true)
        .count();
    assert_eq!((sent, tails), (1, 1), "{answers:?}");
    assert_eq!(delayed(&sqs, &queue).await, 1, "one tail for the window");
    assert_eq!(queued(&sqs, &queue).await, 0);
}

/// A tail SQS refused is un-booked and its push answered 503, for the API to re-send it: the
/// next decision the mark covers books it again.
#[tokio::test]
async fn a_tail_sqs_refused_is_booked_again_by_the_next_decision() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let table = poison_table().await;
    let worker = fleet_worker(&api, &sqs, &queue, &table, LONG).await;
    // An environment whose sends SQS refuses: its queue is gone.
    let gone = new_queue(&sqs).await;
    sqs.delete_queue().queue_url(&gone).send().await.unwrap();
    let refused = fleet_worker(&api, &sqs, &gone, &table, LONG).await;

    create_run(&api, "quick-shell").await;
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(
        (status, &answer["wake_ups"]["sent"]),
        (202, &json!(1)),
        "{answer}"
    );
    assert_eq!(take_visible(&sqs, &queue).await.len(), 1);

    let (status, answer) = post(&refused, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(status, 503, "for the API to re-send: {answer}");
    let wake_ups = &answer["wake_ups"];
    assert_eq!(
        (&wake_ups["sent"], &wake_ups["tail"]),
        (&json!(0), &json!(true)),
        "{answer}"
    );

    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!(status, 202, "{answer}");
    let wake_ups = &answer["wake_ups"];
    assert_eq!(
        (&wake_ups["sent"], &wake_ups["tail"]),
        (&json!(1), &json!(true)),
        "{answer}"
    );
    assert_eq!(delayed(&sqs, &queue).await, 1);
}

/// The mark costs one conditional write per decision that sends, none when the queue already
/// holds what the backlog needs.
#[tokio::test]
async fn the_mark_costs_one_write_per_decision_that_sends() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    for _ in 0..20 {
        create_run(&api, "quick-shell").await;
    }
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let name = poison_table().await;
    let table = DynamoPoisonTable::new(
        dynamodb_config(&moto_endpoint()),
        &name,
        "fleet-test",
        PoisonPolicy::default(),
    );
    let calls = table.calls().clone();
    let worker = builder(&api.url(), &sqs, &queue, 4)
        .dynamo_poison_table(table)
        .build()
        .unwrap();
    for _ in 0..3 {
        let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
        assert_eq!(status, 202, "{answer}");
    }
    assert_eq!(queued(&sqs, &queue).await, 5);
    assert_eq!(calls.get("UpdateItem"), 1, "{:?}", calls.snapshot());
    assert_eq!(calls.total(), 1, "{:?}", calls.snapshot());
}

/// An unreachable table costs no push: the decision falls back to this environment's own, and
/// says so in the answer.
#[tokio::test]
async fn a_table_error_falls_back_to_the_environment_s_own_decision() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    create_run(&api, "quick-shell").await;
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    // A table that does not exist: every write fails.
    let table = DynamoPoisonTable::new(
        dynamodb_config(&moto_endpoint()),
        "no-such-table",
        "fleet-test",
        PoisonPolicy::default(),
    );
    let worker = builder(&api.url(), &sqs, &queue, 4)
        .dynamo_poison_table(table)
        .build()
        .unwrap();
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    let errors = answer["wake_ups"]["errors"].to_string();
    assert!(errors.contains("no-such-table"), "{answer}");
    assert_eq!(queued(&sqs, &queue).await, 1);
}

// --- item 5: wake-ups nobody can use -------------------------------------------------------

/// In defer mode, a workflow the poison pill blocks is left out of the claims: its new runs
/// queue no wake-up; another workflow's still do.
#[tokio::test]
async fn a_blocked_workflow_s_new_runs_queue_no_wake_up_in_defer_mode() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let policy = PoisonPolicy::default();
    let table = Arc::new(MemoryPoisonTable::new(policy));
    for _ in 0..policy.threshold {
        let id = format!("{}/0", Uuid::new_v4());
        table
            .record_failure("always-fails", &id, now_ms())
            .await
            .unwrap();
    }
    let worker = builder(&api.url(), &sqs, &queue, 4)
        .register(samples::AlwaysFails)
        .poison_mode(PoisonMode::Defer)
        .poison_table(table)
        .build()
        .unwrap();

    create_run(&api, "always-fails").await;
    let (status, answer) = post(&worker, signed(SECRET, &created("always-fails"))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(false)), "{answer}");
    assert_eq!(
        queued(&sqs, &queue).await,
        0,
        "a blocked workflow's run wakes nobody"
    );

    create_run(&api, "quick-shell").await;
    let (status, answer) = post(&worker, signed(SECRET, &created("quick-shell"))).await;
    assert_eq!((status, &answer["woke"]), (202, &json!(true)), "{answer}");
    assert_eq!(
        answer["wake_ups"]["pending_runs"], 1,
        "the blocked run is not counted: {answer}"
    );
    assert_eq!(queued(&sqs, &queue).await, 1);
}

// --- item 6: events that should wake -------------------------------------------------------

/// Asks a human for an answer, then ends.
struct AsksAHuman;

impl WorkflowHandler for AsksAHuman {
    fn name(&self) -> &str {
        "asks-a-human"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let config = HumanInputConfig::new("Anything to add?");
            let _answer: Value = ctx.human_input("answer", config).await?;
            Ok(())
        })
    }
}

/// The answers the receiver gave, by event type.
type Answers = Arc<Mutex<Vec<(String, Value)>>>;

/// The Function URL stand-in in front of `worker` (once set), recording each answer.
async fn front_door(
    worker: Arc<std::sync::OnceLock<Arc<LambdaWorker>>>,
    answers: Answers,
) -> FunctionUrl {
    let handler: UrlHandler = Arc::new(move |event: Value| {
        let (worker, answers) = (worker.get().cloned(), answers.clone());
        Box::pin(async move {
            let Some(worker) = worker else {
                return json!({"statusCode": 503, "body": "{}"});
            };
            let kind = event["body"]
                .as_str()
                .and_then(|b| serde_json::from_str::<Value>(b).ok())
                .and_then(|b| b["type"].as_str().map(str::to_string))
                .unwrap_or_default();
            let answer = ironflow_lambda::handle(&worker, lambda_event(event))
                .await
                .unwrap();
            answers.lock().unwrap().push((kind, answer.clone()));
            answer
        })
    });
    FunctionUrl::start(handler).await.unwrap()
}

/// A human input rejected through the API's route sends its run back to Pending and publishes
/// `approval_rejected`: the receiver wakes the fleet for it.
#[tokio::test]
async fn a_rejected_human_input_wakes_the_fleet() {
    let serving: Arc<std::sync::OnceLock<Arc<LambdaWorker>>> = Arc::default();
    let answers: Answers = Arc::default();
    let front = front_door(serving.clone(), answers.clone()).await;
    let webhook = Webhook {
        url: front.url(),
        signing_secret: Some(SECRET.to_string()),
    };
    let api = LocalApi::start_with_webhook(TOKEN, &Backend::Memory, webhook)
        .await
        .unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let worker = builder(&api.url(), &sqs, &queue, 4)
        .register(AsksAHuman)
        .build()
        .unwrap();
    let worker = Arc::new(worker);
    assert!(serving.set(worker.clone()).is_ok());

    // The run waits for its human.
    let run = create_run(&api, "asks-a-human").await;
    let summary = ironflow_lambda::handle_summary(&worker, lambda_event(json!({})))
        .await
        .unwrap();
    assert_eq!(summary.claimed, 1, "{summary:?}");
    let steps = api.store().list_steps(run).await.unwrap();
    let step = steps
        .iter()
        .find(|s| s.kind == StepKind::HumanInput && s.status.state == StepStatus::AwaitingApproval)
        .unwrap_or_else(|| panic!("no human input awaited: {steps:?}"));

    assert_eq!(
        queued(&sqs, &queue).await,
        0,
        "nothing wakes while the run waits"
    );

    // Rejected through the API's route, as an operator does.
    let rejected = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/runs/{run}/steps/{}/reject",
            api.url(),
            step.id
        ))
        .header("authorization", api.admin_bearer().await.unwrap())
        .json(&json!({"reason": "not now"}))
        .send()
        .await
        .unwrap();
    assert!(
        rejected.status().is_success(),
        "{}",
        rejected.text().await.unwrap()
    );
    let state = state_of(&api, run).await;
    assert_eq!(state, RunStatus::Pending);

    wait_until("the receiver answered approval_rejected", LONG, || async {
        answers
            .lock()
            .unwrap()
            .iter()
            .any(|(kind, _)| kind == "approval_rejected")
    })
    .await;
    let answer = answers
        .lock()
        .unwrap()
        .iter()
        .find(|(kind, _)| kind == "approval_rejected")
        .map(|(_, a)| a.clone())
        .unwrap();
    assert_eq!(answer["statusCode"], 202, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["woke"], true, "{body}");
    assert_eq!(queued(&sqs, &queue).await, 1);
}

/// A step that times out: a failure the engine retries.
struct StepTimesOut;

impl WorkflowHandler for StepTimesOut {
    fn name(&self) -> &str {
        "step-times-out"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let slow = ironflow_engine::config::ShellConfig::new("sleep 30").timeout_secs(1);
            ctx.shell("slow", slow).await?;
            Ok(())
        })
    }
}

/// The retry of a run whose failure blocked its workflow in defer mode: its timer wake-up comes
/// when the block ends (claims leave the workflow out until then), not when its backoff ends.
#[tokio::test]
async fn a_blocked_workflow_s_retry_is_woken_when_its_block_ends() {
    let api = LocalApi::start(TOKEN).await.unwrap();
    let sqs = sqs_client();
    let queue = new_queue(&sqs).await;
    let cooldown = Duration::from_secs(600);
    let worker = builder(&api.url(), &sqs, &queue, 4)
        .register(StepTimesOut)
        .poison_mode(PoisonMode::Defer)
        .poison_threshold(1)
        .poison_cooldown(cooldown)
        .build()
        .unwrap();
    // One retry left: the engine schedules it after its backoff (30 s ± 20 %).
    let run = api
        .store()
        .create_run(new_run("step-times-out", 1))
        .await
        .unwrap()
        .into_run()
        .id;
    let summary = ironflow_lambda::handle_summary(&worker, lambda_event(json!({})))
        .await
        .unwrap();
    let report = summary.runs.iter().find(|r| r.run_id == run).unwrap();
    let due = report
        .due
        .unwrap_or_else(|| panic!("no retry due: {report:?}"));
    assert_eq!(due.status, RunStatus::Retrying, "{report:?}");
    let timers = &summary.wake_ups.as_ref().unwrap().timers;
    assert_eq!(timers.len(), 1, "{timers:?}");
    // The block ends 600 s after the failure; the backoff, within 36 s.
    let delay = timers[0].delay_secs;
    assert!(delay >= cooldown.as_secs() - 30, "{timers:?}");
}
