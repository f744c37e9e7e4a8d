//! What the chaos run still found at 634c6dc, one fault at a time through the fault proxy
//! (tests/common/fault_proxy.rs), on both stores: a write that gives a run up is sent once and a
//! lost answer read back; a recovery of a run whose holder never started a step is not a death
//! for the poison pill; time lost to the API is not a handback without progress.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fault_proxy::{Fault, FaultProxy};
use common::{Backend, Harness, ShellWorkflow, start_step, wait_until};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::report::StopReason;
use ironflow_lambda::{LambdaWorkerBuilder, Outcome};
use ironflow_store::entities::{LeaseRequest, LeaseUpdate, RunStatus, RunUpdate, StepStatus};
use ironflow_store::store::RunStore;
use ironflow_worker::ApiRunStore;

/// A worker of the harness's API reached through `proxy`, with test-sized settings.
fn through(h: &Harness, proxy: &FaultProxy) -> LambdaWorkerBuilder {
    LambdaWorkerBuilder::new(&proxy.url(), h.api.token())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_millis(500))
        .deadline_margin(Duration::from_millis(1500))
        .min_claim_budget(Duration::from_millis(200))
}

/// One step that hangs until the cutoff.
fn stuck() -> ShellWorkflow {
    ShellWorkflow::one("stuck", "sleep 600")
}

fn requests(proxy: &FaultProxy, route: &str) -> u64 {
    proxy.stats().requests.get(route).copied().unwrap_or(0)
}

async fn a_lost_answer_to_a_write_is_read_back_and_the_write_never_sent_again(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 11).await;
    // 5 s between the cutoff and the deadline: time for `ApiRunStore`'s own resend (1 s
    // after a lost answer) within the handback's first attempt, were it made through it.
    let worker = through(&h, &proxy)
        .deadline_margin(Duration::from_secs(5))
        .register(stuck())
        .build()
        .unwrap();
    let id = h.create("stuck", 0).await;
    // The step's Running and the handback's Pending both land, and their answers are lost:
    // `ApiRunStore`'s put_json would send each again a second later, by itself.
    proxy.next("PUT /steps/{id}", Fault::LostAnswer);
    proxy.next("PUT /runs/{id}", Fault::LostAnswer);

    let summary = h.invoke(&worker, Duration::from_secs(8)).await;

    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    let report = &summary.runs[0];
    assert!(!report.left_to_reaper, "{report:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    assert_eq!(
        requests(&proxy, "PUT /runs/{id}"),
        1,
        "the handback's Pending is sent once, its lost answer read back: {:?}",
        proxy.stats()
    );
    assert_eq!(
        requests(&proxy, "PUT /steps/{id}"),
        2,
        "the step's Running once (read back), its interruption once: {:?}",
        proxy.stats()
    );
}

async fn a_lost_claim_recovered_by_the_reaper_is_not_a_death(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 12).await;
    let worker = through(&h, &proxy)
        .lease_ttl(Duration::from_secs(2))
        .poison_threshold(1)
        .register(ShellWorkflow::one("quick", "true"))
        .build()
        .unwrap();
    // Retries left: the reaper fails a run recovered more times than its max_retries.
    let id = h.create("quick", 3).await;
    // The API leases the run to this worker, and the answer never arrives.
    proxy.next("GET /runs/next", Fault::LostAnswer);

    let lost = h.invoke(&worker, Duration::from_secs(4)).await;
    assert!(lost.runs.is_empty(), "{lost:?}");
    // It cannot find the run again, and says so: the worker id the run may be leased to.
    let said = lost.errors.join("\n");
    assert!(
        said.contains("lost their answer") && said.contains(&lost.worker_id),
        "{lost:?}"
    );
    wait_until("the API reaps the run", Duration::from_secs(20), || async {
        h.api.reap().await;
        let run = h.run(id).await;
        run.status.state == RunStatus::Pending && run.lease_recoveries == 1
    })
    .await;

    // A threshold of 1: a counted recovery would block the workflow and fail the run.
    let next = h.invoke(&worker, Duration::from_secs(6)).await;
    assert_eq!(next.lease_recoveries, 0, "not a death: {next:?}");
    assert_eq!(next.count(Outcome::Completed), 1, "{next:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

async fn a_holder_that_died_mid_step_is_a_death(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 13).await;
    let worker = through(&h, &proxy)
        .poison_threshold(1)
        .register(ShellWorkflow::one("quick", "true"))
        .build()
        .unwrap();
    let id = h.create("quick", 3).await;
    // An invocation claims the run under a 1 s lease, starts its step and dies.
    let dead = ApiRunStore::new(&h.api.url(), h.api.token());
    let lease = LeaseRequest {
        worker_id: "lambda-dead-invocation".into(),
        ttl: Duration::from_secs(1),
    };
    let claimed = dead.pick_next_pending_for(Some(lease), None).await.unwrap();
    assert_eq!(claimed.map(|r| r.id), Some(id));
    start_step(&dead, id).await;
    wait_until("the API reaps the run", Duration::from_secs(20), || async {
        h.api.reap().await;
        h.status(id).await == RunStatus::Pending
    })
    .await;

    let next = h.invoke(&worker, Duration::from_secs(6)).await;
    assert_eq!(next.lease_recoveries, 1, "a death: {next:?}");
    assert_eq!(next.count(Outcome::PoisonBlocked), 1, "{next:?}");
}

async fn a_lease_taken_over_mid_step_and_left_to_expire_is_not_a_death(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let proxy = FaultProxy::start(&h.api.url(), 15).await;
    let worker = Arc::new(
        through(&h, &proxy)
            .poison_threshold(1)
            .register(stuck())
            .build()
            .unwrap(),
    );
    let id = h.create("stuck", 3).await;
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, Duration::from_secs(30)).await })
    };
    wait_until("the step runs", Duration::from_secs(20), || async {
        h.steps(id)
            .await
            .iter()
            .any(|s| s.status.state == StepStatus::Running)
    })
    .await;
    // Another worker takes the lease over, and lets it expire: the step this invocation left
    // Running is interrupted by the reaper, as a dead holder's would be.
    let taken = RunUpdate {
        lease: Some(LeaseUpdate::Set {
            worker_id: "taker".into(),
            expires_at: chrono::Utc::now() + chrono::TimeDelta::seconds(1),
        }),
        ..RunUpdate::default()
    };
    h.api.store().update_run(id, taken).await.unwrap();
    let lost = invocation.await.unwrap();
    assert_eq!(lost.count(Outcome::LeaseLost), 1, "{lost:?}");
    wait_until("the API reaps the run", Duration::from_secs(20), || async {
        h.api.reap().await;
        let run = h.run(id).await;
        run.status.state == RunStatus::Pending && run.lease_recoveries == 1
    })
    .await;

    let next = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(next.lease_recoveries, 0, "not a death: {next:?}");
    assert_eq!(next.count(Outcome::PoisonBlocked), 0, "{next:?}");
    assert_eq!(next.count(Outcome::HandedBack), 1, "{next:?}");
}

/// The stuck run, through `proxy` with `fault` queued on `route`, in a worker whose loop guard
/// fails a run at its first counted handback without progress: the outcome.
async fn stuck_run_under(backend: Backend, route: &str, fault: Fault) -> (Outcome, RunStatus) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 14).await;
    let worker = through(&h, &proxy)
        .max_handbacks_without_progress(1)
        .register(stuck())
        .build()
        .unwrap();
    let id = h.create("stuck", 0).await;
    proxy.next(route, fault);
    let summary = h.invoke(&worker, Duration::from_secs(6)).await;
    assert_eq!(summary.runs.len(), 1, "{summary:?}");
    assert_eq!(summary.runs[0].run_id, id);
    (summary.runs[0].outcome, h.status(id).await)
}

async fn a_slow_api_answer_is_not_a_handback_without_progress(backend: Backend) {
    // The engine's step list (`GET /runs/{id}`) answered 1.7 s late.
    let late = Fault::Delay(Duration::from_millis(1700));
    let (outcome, status) = stuck_run_under(backend, "GET /runs/{id}", late).await;
    assert_eq!(outcome, Outcome::HandedBack, "not failed by the loop guard");
    assert_eq!(status, RunStatus::Pending);
}

async fn a_retried_server_error_is_not_a_handback_without_progress(backend: Backend) {
    // The step's Running write meets a 5xx and is sent again.
    let (outcome, status) = stuck_run_under(backend, "PUT /steps/{id}", Fault::ServerError).await;
    assert_eq!(outcome, Outcome::HandedBack, "not failed by the loop guard");
    assert_eq!(status, RunStatus::Pending);
}

async fn without_api_trouble_the_loop_guard_still_fails_the_stuck_run(backend: Backend) {
    let (outcome, status) = stuck_run_under(backend, "GET /nothing", Fault::Reset).await;
    assert_eq!(outcome, Outcome::Failed, "the control: counted");
    assert_eq!(status, RunStatus::Failed);
}

/// A workflow whose one step appends a line to `log` after `secs` seconds.
fn marking(log: &std::path::Path, secs: u32) -> ShellWorkflow {
    ShellWorkflow::one(
        "marking",
        &format!("sleep {secs}; echo done >> '{}'", log.display()),
    )
}

fn lines(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |s| s.lines().count())
}

async fn a_claim_whose_lease_the_api_dated_back_is_released_not_executed(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 16).await;
    let log = h.path("marks.log");
    let worker = through(&h, &proxy)
        .register(marking(&log, 0))
        .build()
        .unwrap();
    let id = h.create("marking", 0).await;
    // The claim's answer states a lease that ended 30 s before the API took the claim (a
    // PostgreSQL transaction left open on a pooled connection dates it so): the reaper may
    // requeue the run as soon as the answer leaves.
    proxy.next("GET /runs/next", Fault::DatedBack(Duration::from_secs(40)));

    let summary = h.invoke(&worker, Duration::from_secs(8)).await;

    assert_eq!(
        summary.claimed, 2,
        "released unexecuted, then claimed again under a lease dated right: {summary:?}"
    );
    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(lines(&log), 1, "executed once");
}

async fn renewals_the_api_dated_back_do_not_extend_the_lease(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 17).await;
    let log = h.path("marks.log");
    let worker = through(&h, &proxy)
        .lease_ttl(Duration::from_secs(2))
        .register(marking(&log, 4))
        .build()
        .unwrap();
    let id = h.create("marking", 0).await;
    // Every renewal is answered with a lease dated 10 s back: none extends the claim's 2 s.
    for _ in 0..40 {
        proxy.next(
            "POST /runs/{id}/lease",
            Fault::DatedBack(Duration::from_secs(10)),
        );
    }

    let summary = h.invoke(&worker, Duration::from_secs(9)).await;

    assert_eq!(summary.runs.len(), 1, "{summary:?}");
    let report = &summary.runs[0];
    assert_ne!(
        report.outcome,
        Outcome::Completed,
        "stopped at its lease's end: {report:?}"
    );
    assert!(
        report
            .error
            .as_deref()
            .is_some_and(|e| e.contains("lease expired")),
        "{report:?}"
    );
    assert_eq!(lines(&log), 0, "the step was stopped before its end");
    assert_ne!(h.status(id).await, RunStatus::Completed);
}

/// The mark of a deferred run's wait (docs/design.md, "The run timeout across invocations")
/// survives a fault on its write: a reset write is read back and sent again, a write whose
/// answer was lost is read back and not sent again. Each run: `a` (2 s), then `b`, expected to
/// take 5 s, deferred with 4.5 s left.
async fn a_fault_on_the_mark_of_a_wait_is_read_back_and_the_mark_sent_again(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 13).await;
    // One workflow per fault: `b`'s time, once seen, is known to fit.
    let two = |name| ShellWorkflow {
        name,
        steps: vec![("a", "sleep 2".into()), ("b", "true".into())],
    };
    let worker = through(&h, &proxy)
        .register(two("mark-reset"))
        .register(two("mark-lost"))
        .concurrency(1)
        .max_runs_per_invocation(1)
        .claim_ahead_percent(0)
        .default_step_duration(Duration::from_secs(5))
        .build()
        .unwrap();
    for (workflow, fault, writes) in [
        ("mark-reset", Fault::Reset, 2),
        ("mark-lost", Fault::LostAnswer, 1),
    ] {
        let id = h.create(workflow, 0).await;
        let before = requests(&proxy, "PUT /steps/{id}");
        // `a`'s Running and Completed pass; the mark meets the fault.
        proxy.next("PUT /steps/{id}", Fault::Delay(Duration::ZERO));
        proxy.next("PUT /steps/{id}", Fault::Delay(Duration::ZERO));
        proxy.next("PUT /steps/{id}", fault);

        let summary = h.invoke(&worker, Duration::from_secs(8)).await;

        let note = summary.runs[0].error.as_deref().unwrap_or_default();
        assert!(note.contains("step 'b' deferred"), "{fault:?}: {summary:?}");
        assert_eq!(h.status(id).await, RunStatus::Pending);
        let marks: usize = h
            .steps(id)
            .await
            .iter()
            .filter_map(|s| s.debug_messages.as_ref()?.as_array().cloned())
            .flatten()
            .filter(|m| m.get("ironflow_lambda_handed_back_at").is_some())
            .count();
        assert_eq!(marks, 1, "{fault:?}: the wait is marked once");
        assert_eq!(
            requests(&proxy, "PUT /steps/{id}") - before,
            2 + writes,
            "{fault:?}: the mark sent {writes} time(s): {:?}",
            proxy.stats()
        );
        // Resumed by the next invocation (before the next run is created: claims take the
        // oldest first).
        let resumed = h.invoke(&worker, Duration::from_secs(8)).await;
        assert_eq!(
            resumed.count(Outcome::Completed),
            1,
            "{fault:?}: {resumed:?}"
        );
    }
}

/// A step created whose start is never written (its dependencies' route does not answer): the
/// run is handed back after the API fault with the step left Pending, which the engine never
/// replays (it creates the step again). That record executes nothing: the 6 s the run then
/// waits do not count toward its 6 s timeout (found by a review: it counted as a step
/// executing until the claim).
async fn a_step_whose_start_was_never_written_does_not_count_the_wait_after_it(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 14).await;
    let two = ShellWorkflow {
        name: "two",
        steps: vec![("a", "sleep 1".into()), ("b", "sleep 1".into())],
    };
    let worker = through(&h, &proxy)
        .register(two)
        .concurrency(1)
        .max_runs_per_invocation(1)
        .claim_ahead_percent(0)
        .run_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("two", 0).await;
    proxy.black_hole("POST /step-dependencies");

    let first = h.invoke(&worker, Duration::from_secs(8)).await;

    assert_eq!(first.runs[0].outcome, Outcome::HandedBack, "{first:?}");
    proxy.restore();
    let steps = h.steps(id).await;
    assert!(
        steps.iter().any(|s| s.status.state == StepStatus::Pending),
        "a step left Pending: {steps:?}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let second = h.invoke(&worker, Duration::from_secs(8)).await;
    assert_eq!(second.runs[0].outcome, Outcome::Completed, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// The API refuses the write of a workflow's failure (an answer, not a fault): the run is still
/// Running under the invocation's lease, and the invocation says so (left to the reaper), not
/// that it failed.
async fn a_failure_whose_write_the_api_refused_is_reported_left_to_the_reaper(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 13).await;
    let worker = through(&h, &proxy)
        .register(ShellWorkflow::one("bad", "exit 3"))
        .build()
        .unwrap();
    let id = h.create("bad", 0).await;
    // The second write of the run is its failure's (the first sets no status).
    proxy.next("PUT /runs/{id}", Fault::Delay(Duration::ZERO));
    proxy.next("PUT /runs/{id}", Fault::Refused);

    let summary = h.invoke(&worker, Duration::from_secs(8)).await;

    assert_eq!(proxy.stats().total("refused"), 1, "{:?}", proxy.stats());
    let report = &summary.runs[0];
    assert_eq!(report.outcome, Outcome::Failed, "{report:?}");
    assert!(report.left_to_reaper, "{report:?}");
    let error = report.error.as_deref().unwrap_or_default();
    assert!(error.contains("refused its failure's write"), "{error}");
    assert_eq!(
        h.status(id).await,
        RunStatus::Running,
        "nothing was written"
    );
}

/// A claim answered with a run of a workflow this worker has no handler for (an API that
/// ignores the workflow filter): the run goes back to Pending untouched, as no failure of its
/// workflow and not left to the reaper, and is no run of the batch; the claims stop with a
/// claim error naming it, so the invocation could not run (an SQS record is retried, the error
/// alarm raised) instead of reporting an empty backlog. The worker's own runs are claimed once
/// the API filters again.
async fn a_claimed_run_of_a_workflow_not_registered_here_is_released_untouched(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let proxy = FaultProxy::start(&h.api.url(), 17).await;
    let worker = through(&h, &proxy)
        .register(ShellWorkflow::one("ours", "true"))
        .build()
        .unwrap();
    let foreign = h.create("someone-elses", 0).await;
    let ours = h.create("ours", 0).await;
    for _ in 0..4 {
        proxy.next("GET /runs/next", Fault::Unfiltered);
    }

    let summary = h.invoke(&worker, Duration::from_secs(8)).await;

    assert_eq!(proxy.stats().total("unfiltered"), 1, "{:?}", proxy.stats());
    assert_eq!(summary.stop_reason, StopReason::ClaimError, "{summary:?}");
    assert!(summary.runs.is_empty(), "{summary:?}");
    assert_eq!(summary.claimed, 0, "{summary:?}");
    let why = summary.errors.join("; ");
    assert!(
        why.contains("someone-elses") && why.contains("ignored the claim's workflow list"),
        "{why}"
    );
    let run = h.run(foreign).await;
    assert_eq!(run.status.state, RunStatus::Pending, "{run:?}");
    assert_eq!(run.error, None, "{run:?}");

    proxy.restore();
    let summary = h.invoke(&worker, Duration::from_secs(8)).await;
    assert_eq!(summary.runs.len(), 1, "{summary:?}");
    assert_eq!(summary.runs[0].run_id, ours);
    assert_eq!(summary.runs[0].outcome, Outcome::Completed);
    assert_eq!(h.status(foreign).await, RunStatus::Pending);
}

on_both_stores!(
    a_claimed_run_of_a_workflow_not_registered_here_is_released_untouched,
    a_failure_whose_write_the_api_refused_is_reported_left_to_the_reaper,
    a_step_whose_start_was_never_written_does_not_count_the_wait_after_it,
    a_fault_on_the_mark_of_a_wait_is_read_back_and_the_mark_sent_again,
    a_claim_whose_lease_the_api_dated_back_is_released_not_executed,
    renewals_the_api_dated_back_do_not_extend_the_lease,
    a_lost_answer_to_a_write_is_read_back_and_the_write_never_sent_again,
    a_lost_claim_recovered_by_the_reaper_is_not_a_death,
    a_holder_that_died_mid_step_is_a_death,
    a_lease_taken_over_mid_step_and_left_to_expire_is_not_a_death,
    a_slow_api_answer_is_not_a_handback_without_progress,
    a_retried_server_error_is_not_a_handback_without_progress,
    without_api_trouble_the_loop_guard_still_fails_the_stuck_run,
);
