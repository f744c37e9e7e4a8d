//! What an operator sees: step logs and artifacts in the API, EMF metrics, JSON logs with the
//! request and run ids and no secret, the heartbeat.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Harness, ShellWorkflow};
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::Outcome;
use ironflow_lambda::logging::{self, CaptureWriter};
use ironflow_lambda::metrics;
use ironflow_local_api::LocalApi;
use ironflow_store::entities::{LogFilter, LogStream, RunStatus};
use tokio::net::TcpListener;

const LONG: Duration = Duration::from_secs(60);

fn chatty(h: &Harness) -> ShellWorkflow {
    ShellWorkflow {
        name: "chatty",
        steps: vec![
            (
                "count",
                "for i in $(seq 1 1200); do echo line-$i; done; echo oops >&2".into(),
            ),
            // Prints, then is cut at the cutoff: its partial output must reach the API too.
            (
                "cut",
                format!(
                    "echo before-the-cut; touch '{}'; sleep 600",
                    h.path("cut-started").display()
                ),
            ),
        ],
    }
}

#[tokio::test]
async fn step_logs_reach_the_api_before_the_handler_returns_even_for_a_handed_back_run() {
    let h = Harness::start().await;
    let worker = h.builder().register(chatty(&h)).build().unwrap();
    let id = h.create("chatty", 0).await;

    let summary = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(summary.runs[0].outcome, Outcome::HandedBack, "{summary:?}");
    // Read back at once: no waiting, everything was pushed before the handler returned.
    let stdout = h
        .api
        .store()
        .get_logs(
            id,
            LogFilter {
                step_id: None,
                stream: Some(LogStream::Stdout),
            },
            None,
            5000,
        )
        .await
        .unwrap();
    let lines: Vec<&str> = stdout.iter().map(|l| l.line.as_str()).collect();
    // One step's lines keep their order across the 1000-line batches (steps are pushed
    // concurrently, so lines of different steps may interleave).
    let counted: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("line-"))
        .collect();
    let expected: Vec<String> = (1..=1200).map(|i| format!("line-{i}")).collect();
    assert_eq!(counted, expected, "order kept across the 1000-line batches");
    assert!(
        lines.contains(&"before-the-cut"),
        "the handed-back step's partial output"
    );
    let stderr = h
        .api
        .store()
        .get_logs(
            id,
            LogFilter {
                step_id: None,
                stream: Some(LogStream::Stderr),
            },
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        stderr.iter().map(|l| l.line.as_str()).collect::<Vec<_>>(),
        ["oops"]
    );
    assert!(summary.logs.sent >= 1202, "{:?}", summary.logs);
    assert_eq!(summary.logs.dropped, 0);
}

#[tokio::test]
async fn a_steps_lines_reach_the_api_while_its_run_still_executes() {
    let h = Arc::new(Harness::start().await);
    let go = h.path("go");
    let cmd = until_file(&go, "echo early", "echo late");
    let worker = Arc::new(
        h.builder()
            .register(ShellWorkflow::one("live", &cmd))
            .build()
            .unwrap(),
    );
    let id = h.create("live", 0).await;
    // The step waits for `go`, which only this test creates once it has seen the first line.
    let invocation = invoke_until_printed(&h, &worker, id, "early").await;
    assert_eq!(
        h.status(id).await,
        RunStatus::Running,
        "pushed while it runs"
    );
    std::fs::write(&go, "").unwrap();

    let summary = invocation.await.unwrap();
    assert_eq!(summary.runs[0].outcome, Outcome::Completed, "{summary:?}");
    assert_eq!(stdout_of(&h, id).await, ["early", "late"]);
    assert_eq!(summary.logs.sent, 2);
}

#[tokio::test]
async fn a_second_invocation_on_the_same_worker_waits_for_the_first_to_return() {
    let h = Arc::new(Harness::start().await);
    let go = h.path("go");
    let worker = waits_and_quick(&h, &go);
    let slow = h.create("waits", 0).await;
    let invoke = |h: Arc<Harness>| {
        let worker = worker.clone();
        tokio::spawn(async move {
            let one_run = serde_json::json!({"max_runs": 1});
            h.invoke_event(&worker, one_run, common::deadline_in(LONG))
                .await
        })
    };
    let first = invoke(h.clone());
    common::wait_until("the first invocation's run prints", LONG, || {
        let h = h.clone();
        async move { stdout_of(&h, slow).await == ["waiting"] }
    })
    .await;
    let quick = h.create("quick", 0).await;
    let second = invoke(h.clone());
    std::fs::write(&go, "").unwrap();

    let (first, second) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(first.runs[0].run_id, slow);
    assert_eq!(second.runs[0].run_id, quick);
    assert_eq!(
        first.logs.sent, 1,
        "each invocation sends its own run's lines"
    );
    assert_eq!(second.logs.sent, 1);
    let (slow, quick) = (h.run(slow).await, h.run(quick).await);
    assert_eq!(quick.status.state, RunStatus::Completed);
    assert!(
        quick.started_at >= slow.completed_at,
        "the second invocation claimed only once the first had returned: {:?} < {:?}",
        quick.started_at,
        slow.completed_at
    );
}

#[tokio::test]
async fn an_invocation_dropped_midway_leaves_the_log_channel_to_the_next_one() {
    let h = Arc::new(Harness::start().await);
    // `go` is never created: the step waits until its invocation is dropped.
    let worker = waits_and_quick(&h, &h.path("go"));
    let slow = h.create("waits", 0).await;
    let dropped = invoke_until_printed(&h, &worker, slow, "waiting").await;
    // As when the runtime drops a handler's future (a panic caught by lambda_runtime).
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());

    let quick = h.create("quick", 0).await;
    let event = serde_json::json!({"max_runs": 1});
    // A deadline beyond the test's limit: a last flush stuck until it would fail the test.
    let next = tokio::time::timeout(
        LONG,
        h.invoke_event(&worker, event, common::deadline_in(2 * LONG)),
    )
    .await
    .expect("the next invocation returns")
    .unwrap();
    assert_eq!(next.runs[0].run_id, quick);
    assert_eq!(next.runs[0].outcome, Outcome::Completed, "{next:?}");
    assert_eq!(next.logs.sent, 1, "its own pump sent its line: {next:?}");
    assert_eq!(stdout_of(&h, quick).await, ["quick"]);
}

/// Start an invocation in a task, and wait until `run`'s first stdout line, `line`, is in the
/// API (the run still executing).
async fn invoke_until_printed(
    h: &Arc<Harness>,
    worker: &Arc<ironflow_lambda::LambdaWorker>,
    run: uuid::Uuid,
    line: &'static str,
) -> tokio::task::JoinHandle<ironflow_lambda::InvocationSummary> {
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    common::wait_until("the run's first line is in the API", LONG, || {
        let h = h.clone();
        async move { stdout_of(&h, run).await == [line] }
    })
    .await;
    invocation
}

/// A worker with two workflows: `waits` prints `waiting` then waits for `go`; `quick` prints
/// `quick`.
fn waits_and_quick(h: &Harness, go: &std::path::Path) -> Arc<ironflow_lambda::LambdaWorker> {
    let waits = until_file(go, "echo waiting", "true");
    Arc::new(
        h.builder()
            .register(ShellWorkflow::one("waits", &waits))
            .register(ShellWorkflow::one("quick", "echo quick"))
            .build()
            .unwrap(),
    )
}

/// A shell command: `first`, then wait until the test creates `go`, then `last`.
fn until_file(go: &std::path::Path, first: &str, last: &str) -> String {
    format!(
        "{first}; while [ ! -f '{}' ]; do sleep 0.02; done; {last}",
        go.display()
    )
}

/// The stdout lines of `run` in the API, in order.
async fn stdout_of(h: &Harness, run: uuid::Uuid) -> Vec<String> {
    let filter = LogFilter {
        step_id: None,
        stream: Some(LogStream::Stdout),
    };
    let lines = h
        .api
        .store()
        .get_logs(run, filter, None, 100)
        .await
        .unwrap();
    lines.into_iter().map(|l| l.line).collect()
}

/// Uploads a report, then reads it back as a later step's input.
struct Reports {
    dir: std::path::PathBuf,
}

impl WorkflowHandler for Reports {
    fn name(&self) -> &str {
        "reports"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let dir = self.dir.display().to_string();
            let made = ctx
                .shell(
                    "make",
                    ShellConfig::new("echo 'hello report' > report.txt")
                        .dir(&dir)
                        .output_typed("report.txt", "text/plain"),
                )
                .await?;
            let report = made.artifact("report.txt")?;
            ctx.shell(
                "read",
                ShellConfig::new("cat report.txt").dir(&dir).input(&report),
            )
            .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn artifacts_upload_through_the_api_and_downloads_fail_with_a_clear_error() {
    let blobs = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let token = "artifact-test-token";
    let api = LocalApi::start_with_artifacts(token, blobs.path())
        .await
        .unwrap();
    let worker = ironflow_lambda::LambdaWorkerBuilder::new(&api.url(), token)
        .provider(Arc::new(
            ironflow_core::providers::claude::ClaudeCodeProvider::new(),
        ))
        .register(Reports {
            dir: work.path().to_path_buf(),
        })
        .build()
        .unwrap();
    let client = ironflow_worker::ApiRunStore::new(&api.url(), token);
    let id = ironflow_store::store::RunStore::create_run(
        &client,
        ironflow_local_api::new_run("reports", 0),
    )
    .await
    .unwrap()
    .into_run()
    .id;

    let mut context = lambda_runtime::Context::default();
    context.deadline = common::deadline_in(LONG);
    let summary = ironflow_lambda::handle_summary(
        &worker,
        lambda_runtime::LambdaEvent::new(serde_json::json!({}), context),
    )
    .await
    .unwrap();

    // Upload: the artifact is recorded by the API with its content type.
    let artifacts = api.store().list_artifacts_for_run(id).await.unwrap();
    assert_eq!(artifacts.len(), 1, "{summary:?}");
    assert_eq!(artifacts[0].name, "report.txt");
    assert_eq!(artifacts[0].content_type, "text/plain");
    assert_eq!(artifacts[0].size_bytes, "hello report\n".len() as u64);
    // Download: ironflow-api 3.1 serves no GET on the internal artifact route, so the step
    // that needs the artifact as input fails with an error that says so.
    assert_eq!(summary.runs[0].outcome, Outcome::Failed);
    let run = api.store().get_run(id).await.unwrap().unwrap();
    assert_eq!(run.status.state, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(
        error.contains("does not serve artifact downloads") && error.contains("405"),
        "{error}"
    );
}

#[tokio::test]
async fn an_api_without_artifact_storage_fails_the_step_clearly() {
    let h = Harness::start().await;
    let work = tempfile::tempdir().unwrap();
    let worker = h
        .builder()
        .register(Reports {
            dir: work.path().to_path_buf(),
        })
        .build()
        .unwrap();
    let id = h.create("reports", 0).await;

    h.invoke(&worker, LONG).await;

    let error = h.run(id).await.error.unwrap_or_default();
    assert!(error.contains("no artifact storage configured"), "{error}");
}

#[tokio::test]
async fn metrics_are_recorded_in_embedded_metric_format() {
    let collector =
        metrics::install("ironflow-lambda-test", "fn-under-test").expect("first recorder");
    let h = Harness::start().await;
    let worker = h
        .builder()
        .register(ShellWorkflow::one("ok", "true"))
        .register(ShellWorkflow::one("ko", "false"))
        .build()
        .unwrap();
    h.create("ok", 0).await;
    h.create("ko", 0).await;

    let summary = h.invoke(&worker, LONG).await;
    assert_eq!(summary.claimed, 2);
    let emf = common::Emf::flush(collector);
    let find = |name: &str| emf.find(name);
    assert_eq!(find("RunsClaimed")["RunsClaimed"], 2);
    assert_eq!(find("RunsCompleted")["workflow"], "ok");
    assert_eq!(find("RunsFailed")["workflow"], "ko");
    assert_eq!(find("RunsClaimed")["function"], "fn-under-test");
    assert!(find("TimeLeftAtExit")["_aws"]["CloudWatchMetrics"].is_array());
    let (units, text) = (emf.text.contains("\"Unit\":\"Milliseconds\""), &emf.text);
    assert!(units, "TimeLeftAtExit carries its unit: {text}");
}

#[tokio::test]
async fn json_logs_carry_request_and_run_ids_and_never_the_token() {
    let capture = CaptureWriter::default();
    assert!(logging::init(
        tracing_subscriber::EnvFilter::new("trace"),
        capture.clone()
    ));
    let h = Harness::start().await;
    let heartbeat_secret = "hb-secret-path-1234";
    let worker = h
        .builder()
        .register(ShellWorkflow::one("stuck", "echo hi; sleep 600"))
        .register(ShellWorkflow::one("ko", "false"))
        .heartbeat_url(&format!("http://127.0.0.1:9/{heartbeat_secret}"))
        .build()
        .unwrap();
    let stuck = h.create("stuck", 0).await;
    let ko = h.create("ko", 0).await;

    let summary = h.invoke(&worker, Duration::from_secs(3)).await;
    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");

    let logs = capture.contents();
    assert!(
        !logs.contains(h.api.token()),
        "the worker token leaked into the logs"
    );
    assert!(
        !logs.contains(heartbeat_secret),
        "the heartbeat URL leaked into the logs"
    );
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    let handback = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("run handed back"))
        })
        .expect("a handback line");
    // Flat: the invocation's and the run's span fields at the top level, each once.
    assert_eq!(handback["request_id"], summary.request_id.as_str());
    assert_eq!(handback["run_id"], stuck.to_string());
    assert_eq!(handback["workflow"], "stuck");
    assert!(handback.get("spans").is_none(), "{handback}");
    // The engine's own lines about a run carry the run's span too (the engine executes on
    // its own runtime, crate::runtime): its `workflow` comes from that span only.
    assert!(lines.iter().any(|l| {
        l["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("ironflow_engine"))
            && l["run_id"] == ko.to_string()
            && l["workflow"] == "ko"
            && l["request_id"] == summary.request_id.as_str()
    }));
}

#[tokio::test]
async fn the_heartbeat_is_pinged_once_per_completed_batch_and_a_failed_ping_is_harmless() {
    let pings = Arc::new(AtomicUsize::new(0));
    let counter = pings.clone();
    let app = axum::Router::new().route(
        "/ping/{secret}",
        axum::routing::head(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let h = Harness::start().await;
    let quick = || ShellWorkflow::one("quick", "true");
    let worker = h
        .builder()
        .register(quick())
        .heartbeat_url(&format!("http://{addr}/ping/abc"))
        .build()
        .unwrap();
    h.create("quick", 0).await;
    let summary = h.invoke(&worker, LONG).await;
    assert_eq!(summary.heartbeat, Some(true));
    assert_eq!(pings.load(Ordering::SeqCst), 1);

    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let unreachable = h
        .builder()
        .register(quick())
        .heartbeat_url(&format!("http://{closed}/x"))
        .build()
        .unwrap();
    h.create("quick", 0).await;
    let summary = h.invoke(&unreachable, LONG).await;
    assert_eq!(summary.heartbeat, Some(false));
    assert_eq!(
        summary.count(Outcome::Completed),
        1,
        "the batch is unaffected"
    );
}

/// A panic is written as one redacted JSON line of the log (the hook `run` installs), not as
/// Rust's default text on stderr, which Lambda sends to the same log group unredacted: a secret
/// in a panic's message (a `configure` closure's, a step's) is withheld, and where it was raised
/// is kept.
#[test]
fn a_panic_is_one_redacted_json_line() {
    let capture = CaptureWriter::default();
    assert!(logging::init(
        tracing_subscriber::EnvFilter::new("info"),
        capture.clone()
    ));
    let secret = "panic-test-worker-token-9c2e4a";
    logging::redact(secret);
    logging::log_panics();
    let panicked = std::thread::Builder::new()
        .name("configure".into())
        .spawn(move || panic!("bad token={secret} in the configuration"))
        .unwrap()
        .join();
    assert!(panicked.is_err());

    let written = capture.contents();
    assert!(!written.contains(secret), "{written}");
    let line: serde_json::Value = written
        .lines()
        .find(|l| l.contains("a thread panicked"))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap_or_else(|| panic!("no panic line in {written}"));
    assert_eq!(line["level"], "ERROR");
    assert_eq!(line["thread"], "configure");
    assert!(
        line["panic"]
            .as_str()
            .unwrap()
            .starts_with("bad token=[redacted]"),
        "{line}"
    );
    assert!(
        line["location"]
            .as_str()
            .unwrap()
            .contains("observability.rs"),
        "{line}"
    );
}
