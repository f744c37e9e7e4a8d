//! Production faults, one at a time, through a fault-injecting proxy in front of the real API
//! (tests/common/fault_proxy.rs): an API blip is never a workflow failure, a lease is only as
//! good as its last confirmed refresh, blocking steps do not starve supervision, and nothing is
//! left Running without a lease when it can be written. The chaos suite (tests/chaos.rs) mixes
//! them at random.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fault_proxy::{Fault, FaultProxy, Faults};
use common::{Harness, ShellWorkflow, executions, outcomes_of, wait_until};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::Outcome;
use ironflow_lambda::report::FaultKind;
use ironflow_lambda::{LambdaWorker, LambdaWorkerBuilder};
use ironflow_store::entities::RunStatus;

/// A worker of the harness's API reached through `proxy`, with test-sized settings.
fn through(h: &Harness, proxy: &FaultProxy) -> LambdaWorkerBuilder {
    LambdaWorkerBuilder::new(&proxy.url(), h.api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_millis(500))
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
}

/// Three shell steps, each appending a line to `<dir>/<step>` when it really executes.
fn three_steps(h: &Harness, name: &'static str) -> ShellWorkflow {
    let step = |n: &str| {
        let file = h.path(&format!("{name}-{n}"));
        format!("echo x >> {}", file.display())
    };
    ShellWorkflow {
        name,
        steps: vec![
            ("one", step("one")),
            ("two", step("two")),
            ("three", step("three")),
        ],
    }
}

fn step_executions(h: &Harness, name: &str) -> [usize; 3] {
    ["one", "two", "three"].map(|s| executions(&h.path(&format!("{name}-{s}"))))
}

async fn proxy_for(h: &Harness) -> FaultProxy {
    FaultProxy::start(&h.api.url(), 7).await
}

#[tokio::test]
async fn transient_errors_on_reads_and_step_writes_are_retried_and_the_run_completes() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .register(three_steps(&h, "three"))
        .build()
        .unwrap();
    let id = h.create("three", 0).await;
    proxy.next("PUT /steps/{id}", Fault::ServerError);
    proxy.next("PUT /steps/{id}", Fault::Reset);
    proxy.next("POST /steps", Fault::Reset);
    proxy.next("POST /steps", Fault::LostAnswer);
    proxy.next("GET /runs/{id}", Fault::ServerError);

    let summary = h.invoke(&worker, Duration::from_secs(30)).await;

    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(
        step_executions(&h, "three"),
        [1, 1, 1],
        "each step ran once"
    );
    let steps = h.steps(id).await;
    assert_eq!(
        steps.len(),
        3,
        "a lost step creation was found, not created twice: {steps:?}"
    );
    let kinds: Vec<(&str, FaultKind)> = summary
        .api_errors
        .iter()
        .map(|e| (e.route, e.kind))
        .collect();
    for route in ["PUT /steps/{id}", "POST /steps", "GET /runs/{id}"] {
        assert!(kinds.iter().any(|(r, _)| *r == route), "{route}: {kinds:?}");
    }
    assert!(
        kinds.contains(&("POST /steps", FaultKind::Transport)),
        "{kinds:?}"
    );
    assert!(
        h.run(id).await.retry_count == 0,
        "no workflow retry consumed"
    );
}

/// No step: the run's one write is its final status.
struct NoOp;

impl WorkflowHandler for NoOp {
    fn name(&self) -> &str {
        "noop"
    }
    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_status_write_whose_answer_was_lost_is_read_back_not_failed() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy).register(NoOp).build().unwrap();
    let id = h.create("noop", 0).await;
    // The final Completed write lands, its answer is lost: read back, not sent again (it would
    // meet the API's illegal-transition 500, Completed → Completed).
    proxy.next("PUT /runs/{id}", Fault::LostAnswer);

    let summary = h.invoke(&worker, Duration::from_secs(30)).await;

    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert!(
        summary.runs[0].executed < Duration::from_secs(6),
        "read back after one bounded attempt, not after ApiRunStore's 7 s of retries: {summary:?}"
    );
}

#[tokio::test]
async fn a_handback_whose_answer_was_lost_meets_the_illegal_transition_and_is_read_back() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .register(ShellWorkflow::one("slow", "sleep 30"))
        .build()
        .unwrap();
    let id = h.create("slow", 0).await;
    // The handback's Pending lands, its answer is lost: read back, not sent again (it would
    // meet the API's illegal-transition 500, Pending → Pending; tests/api_faults.rs counts).
    proxy.next("PUT /runs/{id}", Fault::LostAnswer);

    let summary = h.invoke(&worker, Duration::from_secs(6)).await;

    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    let report = &summary.runs[0];
    assert!(
        !report.left_to_reaper && report.error.is_none(),
        "{report:?}"
    );
    assert_eq!(h.status(id).await, RunStatus::Pending);
    assert!(
        summary
            .api_errors
            .iter()
            .any(|e| e.route == "PUT /runs/{id}"),
        "{summary:?}"
    );
}

/// Sends a signal (a call that cannot be read back), then a step.
struct Signals;

impl WorkflowHandler for Signals {
    fn name(&self) -> &str {
        "signals"
    }
    fn sent_signals(&self) -> ironflow_engine::signal::SentSignals {
        ironflow_engine::signal::SentSignals::new().allow::<Ping>()
    }
    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("before", ironflow_engine::config::ShellConfig::new("true"))
                .await?;
            ctx.send_signal("ping", &Ping {}, "k").await?;
            Ok(())
        })
    }
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Ping {}

impl ironflow_engine::signal::Signal for Ping {
    const NAME: &'static str = "test.ping";
}

#[tokio::test]
async fn an_api_fault_that_cannot_be_retried_hands_the_run_back_without_a_workflow_retry() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy).register(Signals).build().unwrap();
    let id = h.create("signals", 0).await;
    // Lost after the API may have applied it: not sent again, the attempt stops.
    proxy.next("POST /signals", Fault::Reset);

    let first = h.invoke(&worker, Duration::from_secs(30)).await;

    assert_eq!(first.count(Outcome::HandedBack), 1, "{first:?}");
    let error = first.runs[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("API fault") && error.contains("POST /signals"),
        "{error}"
    );
    let run = h.run(id).await;
    assert_eq!(
        run.status.state,
        RunStatus::Pending,
        "handed back, not Failed"
    );
    assert_eq!(run.retry_count, 0, "no workflow retry consumed");
    assert_eq!(run.error, None);

    let second = h.invoke(&worker, Duration::from_secs(30)).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    let before: Vec<_> = h
        .steps(id)
        .await
        .into_iter()
        .filter(|s| s.name == "before")
        .collect();
    assert_eq!(
        before.len(),
        1,
        "the completed step was replayed, not run again"
    );
}

/// Sends a signal first, then runs a step that appends a line to `file`.
struct SignalFirst {
    file: std::path::PathBuf,
}

impl WorkflowHandler for SignalFirst {
    fn name(&self) -> &str {
        "signal-first"
    }
    fn sent_signals(&self) -> ironflow_engine::signal::SentSignals {
        ironflow_engine::signal::SentSignals::new().allow::<Ping>()
    }
    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.send_signal("ping", &Ping {}, "k").await?;
            let cmd = format!("echo x >> {}", self.file.display());
            ctx.shell("after", ironflow_engine::config::ShellConfig::new(&cmd))
                .await?;
            Ok(())
        })
    }
}

/// All claims of one invocation share its worker id. A handback whose Pending landed but whose
/// answer was lost, read back after the same invocation claimed the run again, finds the run
/// Running under "its" worker id: the write landed (the run went through Pending to be
/// claimed), and sending it again would take the run from the execution that claimed it.
#[tokio::test]
async fn a_lost_handback_answer_read_back_after_the_same_invocation_claimed_the_run_again_is_not_sent_again()
 {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let after = h.path("signal-first-after");
    let gate = h.path("gate");
    let worker = through(&h, &proxy)
        .concurrency(2)
        .register(SignalFirst {
            file: after.clone(),
        })
        .register(ShellWorkflow::one(
            "gated",
            &format!("while [ ! -e {} ]; do sleep 0.02; done", gate.display()),
        ))
        .register(ShellWorkflow::one("quick", "true"))
        .build()
        .unwrap();
    // The oldest first: the run handed back is the one the next claim takes.
    let id = h.create("signal-first", 0).await;
    let gated = h.create("gated", 0).await;
    let quick = h.create("quick", 0).await;
    // Its signal's answer is lost (a call that cannot be read back): handed back at once. The
    // handback's Pending lands, its answer is lost, and its read-back gets no answer until the
    // run was claimed again.
    proxy.next("POST /signals", Fault::Reset);
    proxy.next("PUT /runs/{id}", Fault::LostAnswer);
    proxy.hold_after_a_lost_answer(&format!("GET /api/v1/internal/runs/{id}"));
    let drive = async {
        wait_until(
            "the handback's Pending lands",
            Duration::from_secs(20),
            || async {
                proxy.stats().total("lost_answer") == 1 && h.status(id).await == RunStatus::Pending
            },
        )
        .await;

        // The gated run ends, freeing a slot: the claim loop claims the oldest Pending run.
        std::fs::write(&gate, "").unwrap();
        wait_until(
            "the run is claimed again",
            Duration::from_secs(20),
            || async { h.status(id).await == RunStatus::Running },
        )
        .await;
        proxy.lift_black_holes();
    };

    let (summary, ()) = tokio::join!(h.invoke(&worker, Duration::from_secs(30)), drive);

    // Each claim has its report, in the order they ended (the handback's read-back may end
    // after the later claim's execution).
    let outcomes = outcomes_of(&summary, id);
    assert_eq!(
        outcomes,
        [Outcome::Completed, Outcome::HandedBack],
        "handed back, then claimed again and completed in the same invocation, not taken from \
         the later claim by the handback sent again: {summary:?}"
    );
    assert_eq!(summary.claimed, 4, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(executions(&after), 1, "its step ran once");
    assert_eq!(
        proxy.stats().total("lost_answer"),
        1,
        "the handback's Pending was the one write whose answer was lost"
    );
    for other in [gated, quick] {
        assert_eq!(h.status(other).await, RunStatus::Completed);
    }
}

#[tokio::test]
async fn a_handback_whose_lease_confirmation_meets_server_errors_is_retried_and_written() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .lease_refresh_interval(Duration::from_secs(8))
        .register(ShellWorkflow::one("slow", "sleep 30"))
        .build()
        .unwrap();
    let id = h.create("slow", 0).await;
    proxy.next("POST /runs/{id}/lease", Fault::ServerError);
    proxy.next("POST /runs/{id}/lease", Fault::ServerError);

    let summary = h.invoke(&worker, Duration::from_secs(4)).await;

    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    assert!(!summary.runs[0].left_to_reaper, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    let lease_faults: u32 = summary
        .api_errors
        .iter()
        .filter(|e| e.route == "POST /runs/{id}/lease")
        .map(|e| e.count)
        .sum();
    assert_eq!(lease_faults, 2, "{summary:?}");
}

#[tokio::test]
async fn a_black_holed_lease_refresh_stops_the_run_at_its_lease_expiry() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let ttl = Duration::from_secs(2);
    let marker = h.path("alive");
    let worker = through(&h, &proxy)
        .lease_ttl(ttl)
        .lease_refresh_interval(Duration::from_millis(400))
        .register(ShellWorkflow::one(
            "long",
            &format!(
                "while true; do date +%s%N >> {}; sleep 0.05; done",
                marker.display()
            ),
        ))
        .build()
        .unwrap();
    let id = h.create("long", 1).await;
    proxy.black_hole("POST /runs/{id}/lease");

    let summary = h.invoke(&worker, Duration::from_secs(20)).await;

    assert_eq!(summary.count(Outcome::LeaseLost), 1, "{summary:?}");
    let report = &summary.runs[0];
    assert!(
        report.left_to_reaper,
        "its lease could not be confirmed: {report:?}"
    );
    assert!(
        report
            .error
            .as_deref()
            .unwrap_or("")
            .contains("lease expired"),
        "{report:?}"
    );
    // It stopped executing when its lease expired (counted from the claim's send time), not
    // when an HTTP timeout ran out.
    assert!(report.executed < ttl + Duration::from_secs(1), "{report:?}");
    assert!(
        summary.time_left_ms > 0,
        "returned before its deadline: {summary:?}"
    );
    let lines = executions(&marker);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(executions(&marker), lines, "the step's process was stopped");

    // The reaper takes it back; its lease recovery is the one this invocation expected.
    proxy.restore();
    wait_until("the API reaps the run", Duration::from_secs(10), || async {
        h.api.reap().await;
        h.status(id).await == RunStatus::Pending
    })
    .await;
    let worker = through(&h, &proxy)
        .register(ShellWorkflow::one("long", "true"))
        .build()
        .unwrap();
    let next = h.invoke(&worker, Duration::from_secs(20)).await;
    assert_eq!(next.count(Outcome::Completed), 1, "{next:?}");
    assert_eq!(h.run(id).await.lease_recoveries, 1);
}

/// A first step that really executes once, then one that waits for `<dir>/go` (endless until
/// the test creates it) and records its end.
fn first_then_gate(h: &Harness) -> ShellWorkflow {
    let (first, go, second) = (h.path("first"), h.path("go"), h.path("second"));
    ShellWorkflow {
        name: "gated",
        steps: vec![
            ("first", format!("echo x >> {}", first.display())),
            (
                "second",
                format!(
                    "while [ ! -e {} ]; do sleep 0.05; done; echo x >> {}",
                    go.display(),
                    second.display()
                ),
            ),
        ],
    }
}

#[tokio::test]
async fn a_lease_known_lost_lets_the_invocation_return_with_most_of_its_time_left() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .lease_ttl(Duration::from_secs(2))
        .lease_refresh_interval(Duration::from_millis(400))
        .register(first_then_gate(&h))
        .build()
        .unwrap();
    let id = h.create("gated", 1).await;
    proxy.black_hole("POST /runs/{id}/lease");

    // A long invocation: its lease is lost 2 s in, and it has nothing else to do.
    let left = Duration::from_secs(60);
    let summary = h.invoke(&worker, left).await;

    assert_eq!(summary.count(Outcome::LeaseLost), 1, "{summary:?}");
    assert!(summary.runs[0].left_to_reaper, "{summary:?}");
    // Returned within a few seconds of the expiry, not at its deadline: the lease's
    // confirmation was given one attempt (docs/faults.md), not the invocation's time.
    let time_left = Duration::from_millis(summary.time_left_ms);
    assert!(time_left > left - Duration::from_secs(20), "{summary:?}");
    // Nothing was written as if the run were still held: Running, for the reaper.
    assert_eq!(h.status(id).await, RunStatus::Running);

    // The reaper takes it back, and the next invocation completes it: the first step is not
    // executed again, the second once.
    proxy.restore();
    std::fs::write(h.path("go"), "").unwrap();
    wait_until("the API reaps the run", Duration::from_secs(20), || async {
        h.api.reap().await;
        h.status(id).await == RunStatus::Pending
    })
    .await;
    let next = h.invoke(&worker, Duration::from_secs(20)).await;
    assert_eq!(next.count(Outcome::Completed), 1, "{next:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(executions(&h.path("first")), 1, "not doubled");
    assert_eq!(executions(&h.path("second")), 1, "not lost");
}

/// Blocks its thread (not a step: synchronous code in the handler), then one step.
struct Blocking;

impl WorkflowHandler for Blocking {
    fn name(&self) -> &str {
        "blocking"
    }
    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            std::thread::sleep(Duration::from_secs(8));
            ctx.shell("after", ironflow_engine::config::ShellConfig::new("true"))
                .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_step_that_blocks_its_thread_starves_neither_the_leases_nor_the_cutoff() {
    let h = Harness::start().await;
    // A lease that expires unless refreshed every few hundred ms.
    let worker: LambdaWorker = h
        .builder()
        .lease_ttl(Duration::from_secs(1))
        .lease_refresh_interval(Duration::from_millis(200))
        .concurrency(2)
        .register(Blocking)
        .register(ShellWorkflow::one("quick", "true"))
        .build()
        .unwrap();
    let blocking = h.create("blocking", 0).await;
    let quick = h.create("quick", 0).await;

    let summary = h.invoke(&worker, Duration::from_secs(4)).await;

    let report = |id| summary.runs.iter().find(|r| r.run_id == id).unwrap();
    assert_eq!(report(quick).outcome, Outcome::Completed, "{summary:?}");
    let blocked = report(blocking);
    assert_eq!(blocked.outcome, Outcome::HandedBack, "{summary:?}");
    assert!(blocked.stuck, "{blocked:?}");
    assert!(
        summary.time_left_ms > 0,
        "answered before the deadline: {summary:?}"
    );
    assert_eq!(
        h.status(blocking).await,
        RunStatus::Pending,
        "not left Running"
    );
    assert_eq!(worker.stuck_executions(), 1);

    // Once the blocked code goes on, nothing it sends reaches the API.
    wait_until(
        "the blocked code returns",
        Duration::from_secs(20),
        || async { worker.stuck_executions() == 0 },
    )
    .await;
    assert_eq!(h.status(blocking).await, RunStatus::Pending);
    assert!(
        h.steps(blocking).await.is_empty(),
        "its step was never created"
    );
}

#[tokio::test]
async fn a_run_cancelled_through_the_api_is_reported_as_cancelled() {
    let h = Harness::start().await;
    let worker = h
        .builder()
        .register(ShellWorkflow::one("long", "sleep 30"))
        .build()
        .unwrap();
    let id = h.create("long", 0).await;
    let cancel = async {
        wait_until("the run executes", Duration::from_secs(10), || async {
            h.status(id).await == RunStatus::Running && !h.steps(id).await.is_empty()
        })
        .await;
        h.api
            .store()
            .update_run_status(id, RunStatus::Cancelled)
            .await
            .unwrap();
    };

    let (summary, ()) = tokio::join!(h.invoke(&worker, Duration::from_secs(20)), cancel);

    assert_eq!(summary.count(Outcome::Cancelled), 1, "{summary:?}");
    let error = summary.runs[0].error.clone().unwrap_or_default();
    assert!(error.contains("cancelled"), "{error}");
    assert!(!error.contains("another worker"), "{error}");
    assert_eq!(h.status(id).await, RunStatus::Cancelled);
}

#[tokio::test]
async fn a_handback_that_cannot_be_written_is_left_to_the_reaper_and_not_counted_as_a_death() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .lease_ttl(Duration::from_secs(2))
        .lease_refresh_interval(Duration::from_millis(500))
        .poison_threshold(1)
        .register(ShellWorkflow::one("slow", "sleep 30"))
        .build()
        .unwrap();
    let id = h.create("slow", 1).await;
    let fail_writes = async {
        wait_until("the step runs", Duration::from_secs(10), || async {
            !h.steps(id).await.is_empty()
        })
        .await;
        proxy.set(Faults {
            server_error: 1.0,
            routes: vec!["PUT /runs/{id}".into()],
            ..Faults::default()
        });
    };

    let (summary, ()) = tokio::join!(h.invoke(&worker, Duration::from_secs(5)), fail_writes);

    let report = &summary.runs[0];
    assert!(report.left_to_reaper, "{summary:?}");
    assert!(summary.time_left_ms > 0, "{summary:?}");
    proxy.restore();
    wait_until("the API reaps the run", Duration::from_secs(10), || async {
        h.api.reap().await;
        h.status(id).await == RunStatus::Pending
    })
    .await;

    // A threshold of 1: a counted recovery would block the workflow and fail the run.
    let next = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(next.lease_recoveries, 0, "expected, not counted: {next:?}");
    assert_eq!(next.count(Outcome::PoisonBlocked), 0, "{next:?}");
    assert_eq!(next.count(Outcome::HandedBack), 1, "{next:?}");
}

#[tokio::test]
async fn a_slow_read_before_the_execution_starts_is_bounded_by_the_cutoff() {
    let h = Harness::start().await;
    let proxy = proxy_for(&h).await;
    let worker = through(&h, &proxy)
        .register(ShellWorkflow::one("slow", "sleep 30"))
        .build()
        .unwrap();
    let id = h.create("slow", 0).await;
    // A first invocation hands it back, so that the next one reads its steps before executing.
    let first = h.invoke(&worker, Duration::from_secs(3)).await;
    assert_eq!(first.count(Outcome::HandedBack), 1, "{first:?}");
    proxy.next("GET /runs/{id}", Fault::Delay(Duration::from_secs(30)));

    let summary = h.invoke(&worker, Duration::from_secs(4)).await;

    assert!(
        summary.time_left_ms > 0,
        "returned before its deadline: {summary:?}"
    );
    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
}
