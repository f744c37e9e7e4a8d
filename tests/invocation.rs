//! One invocation end to end against the real ironflow API on 127.0.0.1, on both of its stores
//! (`memory::` and `postgres::`, each test on a database of its own): claims, caps, handback and
//! resume, loop guard, run timeout across invocations, lease loss, panics, poison pill,
//! deadlines, and nothing sent after the handler returns.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Backend, Harness, ShellWorkflow, deadline_in, executions, outcomes_of, wait_until};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::MemoryPoisonTable;
use ironflow_lambda::Outcome;
use ironflow_lambda::orphans;
use ironflow_lambda::poison::{PoisonPolicy, PoisonTable};
use ironflow_lambda::report::StopReason;
use ironflow_store::entities::{LeaseUpdate, Run, RunStatus, RunUpdate, Step, StepStatus};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

fn quick(h: &Harness) -> ShellWorkflow {
    ShellWorkflow {
        name: "quick",
        steps: vec![(
            "touch",
            format!("echo x >> '{}'", h.path("quick").display()),
        )],
    }
}

/// A step that hangs forever.
fn stuck() -> ShellWorkflow {
    ShellWorkflow {
        name: "stuck",
        steps: vec![("hang", "sleep 600".to_string())],
    }
}

async fn happy_path_completes_every_run(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h.builder().register(quick(&h)).build().unwrap();
    let ids = [
        h.create("quick", 0).await,
        h.create("quick", 0).await,
        h.create("quick", 0).await,
    ];

    let summary = h.invoke(&worker, LONG).await;

    assert_eq!(summary.claimed, 3);
    assert_eq!(summary.count(Outcome::Completed), 3);
    assert_eq!(summary.stop_reason, StopReason::NoPendingRun);
    assert!(
        summary.worker_id.starts_with("lambda-req-"),
        "{}",
        summary.worker_id
    );
    assert!(summary.time_left_ms > 0);
    for id in ids {
        assert_eq!(h.status(id).await, RunStatus::Completed);
    }
    assert_eq!(executions(&h.path("quick")), 3);
}

async fn claims_at_most_n_runs_and_honours_a_smaller_override(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(quick(&h))
        .max_runs_per_invocation(2)
        .build()
        .unwrap();
    for _ in 0..5 {
        h.create("quick", 0).await;
    }

    let summary = h.invoke(&worker, LONG).await;
    assert_eq!(summary.claimed, 2);
    assert_eq!(summary.stop_reason, StopReason::MaxRuns);

    let one = h
        .invoke_event(&worker, json!({"max_runs": 1}), deadline_in(LONG))
        .await
        .unwrap();
    assert_eq!(one.claimed, 1);

    let refused = h
        .invoke_event(&worker, json!({"max_runs": 3}), deadline_in(LONG))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("max_runs"), "{refused}");
    assert_eq!(
        executions(&h.path("quick")),
        3,
        "the refused override claimed nothing"
    );
}

/// Counts handlers executing at once; each waits until `release`.
struct Gauge {
    current: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    release: Arc<AtomicBool>,
}

impl WorkflowHandler for Gauge {
    fn name(&self) -> &str {
        "gauge"
    }

    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(now, Ordering::SeqCst);
            while !self.release.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.current.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// A worker of `gauge` runs (C = 2, N = 4, claim-ahead at `claim_ahead_percent`): the runs
/// executing now, the most at once, and the switch that lets them finish (set to `released`).
fn gauge_worker(
    h: &Harness,
    claim_ahead_percent: u32,
    released: bool,
) -> (
    Arc<ironflow_lambda::LambdaWorker>,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    Arc<AtomicBool>,
) {
    let (current, max, release) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(released)),
    );
    let worker = h
        .builder()
        .register(Gauge {
            current: current.clone(),
            max: max.clone(),
            release: release.clone(),
        })
        .concurrency(2)
        .max_runs_per_invocation(4)
        .claim_ahead_percent(claim_ahead_percent)
        .build()
        .unwrap();
    (Arc::new(worker), current, max, release)
}

/// With 4 gauge runs pending, `worker` (from [`gauge_worker`], not released) claims only into
/// its 2 free slots: while 2 execute, 2 are Running and 2 claims were sent; then all complete,
/// never more than 2 at once.
async fn claims_only_into_free_slots(
    h: &Arc<Harness>,
    worker: &Arc<ironflow_lambda::LambdaWorker>,
    (current, max, release): (&Arc<AtomicUsize>, &Arc<AtomicUsize>, &Arc<AtomicBool>),
) {
    let ids: Vec<_> = futures_join(h, 4).await;
    let before = claims_sent(h);
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    wait_until("two runs execute", Duration::from_secs(20), || {
        let c = current.clone();
        async move { c.load(Ordering::SeqCst) == 2 }
    })
    .await;
    let mut running = 0;
    for id in &ids {
        if h.status(*id).await == RunStatus::Running {
            running += 1;
        }
    }
    assert_eq!(running, 2, "a run is claimed only once a slot is free");
    assert_eq!(claims_sent(h) - before, 2);
    release.store(true, Ordering::SeqCst);

    let summary = invocation.await.unwrap();
    assert_eq!(summary.count(Outcome::Completed), 4, "{summary:?}");
    assert_eq!(max.load(Ordering::SeqCst), 2);
}

/// A first invocation completes one gauge run (released), then the switch is set back: the
/// instance now knows its pace, and a claim is a large share of a gauge run (a few API
/// requests).
async fn warm_up_gauge(h: &Harness, worker: &ironflow_lambda::LambdaWorker, release: &AtomicBool) {
    h.create("gauge", 0).await;
    let warm_up = h.invoke(worker, LONG).await;
    assert_eq!(warm_up.count(Outcome::Completed), 1, "{warm_up:?}");
    release.store(false, Ordering::SeqCst);
}

async fn a_cold_instance_claims_only_when_a_slot_is_free_and_never_exceeds_concurrency(
    backend: Backend,
) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (worker, current, max, release) = gauge_worker(&h, 1, false);
    claims_only_into_free_slots(&h, &worker, (&current, &max, &release)).await;
}

async fn with_claim_ahead_off_a_warm_instance_claims_only_into_a_free_slot(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (worker, current, max, release) = gauge_worker(&h, 0, true);
    warm_up_gauge(&h, &worker, &release).await;
    claims_only_into_free_slots(&h, &worker, (&current, &max, &release)).await;
}

async fn a_warm_instance_claims_one_run_ahead_under_its_lease_and_never_exceeds_concurrency(
    backend: Backend,
) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (worker, current, max, release) = gauge_worker(&h, 1, true);
    warm_up_gauge(&h, &worker, &release).await;
    let ids: Vec<_> = futures_join(&h, 4).await;
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    let running = |h: Arc<Harness>, ids: Vec<uuid::Uuid>| async move {
        let mut runs = Vec::new();
        for id in ids {
            let run = h.run(id).await;
            if run.status.state == RunStatus::Running {
                runs.push(run);
            }
        }
        runs
    };
    wait_until(
        "two runs execute and a third is claimed ahead",
        Duration::from_secs(20),
        || {
            let (h, ids, c) = (h.clone(), ids.clone(), current.clone());
            async move { c.load(Ordering::SeqCst) == 2 && running(h, ids).await.len() == 3 }
        },
    )
    .await;
    let held = running(h.clone(), ids.clone()).await;
    let first_expiry: Vec<_> = held.iter().map(|r| r.lease_expires_at).collect();
    // The run waiting for a slot keeps its lease: the refresher (every 200 ms here) extends
    // every claimed run's lease, the waiting one's included.
    wait_until(
        "every claimed run's lease is refreshed while two execute",
        Duration::from_secs(20),
        || {
            let (h, ids, first_expiry) = (h.clone(), ids.clone(), first_expiry.clone());
            async move {
                let now = running(h, ids).await;
                now.len() == 3
                    && now
                        .iter()
                        .zip(&first_expiry)
                        .all(|(run, first)| run.lease_expires_at > *first)
            }
        },
    )
    .await;
    assert_eq!(current.load(Ordering::SeqCst), 2, "only C runs execute");
    release.store(true, Ordering::SeqCst);

    let summary = invocation.await.unwrap();
    assert_eq!(summary.count(Outcome::Completed), 4, "{summary:?}");
    assert_eq!(max.load(Ordering::SeqCst), 2, "never more than C at once");
}

async fn a_run_claimed_ahead_has_its_steps_read_while_it_waits(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (current, max, release) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(true)),
    );
    // A refresh interval longer than the test: the read stays fresh until the run starts.
    let worker = Arc::new(
        h.builder()
            .register(Gauge {
                current: current.clone(),
                max,
                release: release.clone(),
            })
            .concurrency(2)
            .max_runs_per_invocation(3)
            .claim_ahead_percent(1)
            .lease_refresh_interval(Duration::from_secs(9))
            .build()
            .unwrap(),
    );
    warm_up_gauge(&h, &worker, &release).await;
    futures_join(&h, 3).await;
    let before = run_reads(&h);
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    // Two runs execute (each read its steps as it started); the third, claimed ahead, has its
    // steps read while it waits for a slot.
    wait_until(
        "two runs execute and the third's steps are read before it starts",
        Duration::from_secs(20),
        || {
            let (h, c) = (h.clone(), current.clone());
            async move { c.load(Ordering::SeqCst) == 2 && run_reads(&h) - before == 3 }
        },
    )
    .await;
    assert_eq!(current.load(Ordering::SeqCst), 2, "the third still waits");
    release.store(true, Ordering::SeqCst);
    let summary = invocation.await.unwrap();
    assert_eq!(summary.count(Outcome::Completed), 3, "{summary:?}");
    assert_eq!(
        run_reads(&h) - before,
        3,
        "no run's steps read twice: {:?}",
        h.api.requests_by_route()
    );
}

async fn a_run_claimed_ahead_without_a_free_slot_is_released_at_the_cutoff(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(Noop)
        .register(quick(&h))
        .register(stuck())
        .concurrency(1)
        .max_runs_per_invocation(2)
        .claim_ahead_percent(1)
        .build()
        .unwrap();
    warm_up(&h, &worker).await;

    // Oldest first: the stuck run takes the only slot, the quick one is claimed ahead and
    // waits for a slot that frees only at the cutoff, after the claim window (which closes
    // the minimum claim budget before it): released then.
    let executing = h.create("stuck", 0).await;
    let waiting = h.create("quick", 0).await;
    let first = h.invoke(&worker, Duration::from_secs(3)).await;
    let outcome_of = |id| {
        first
            .runs
            .iter()
            .find(|r| r.run_id == id)
            .map(|r| r.outcome)
    };
    assert_eq!(
        outcome_of(executing),
        Some(Outcome::HandedBack),
        "{first:?}"
    );
    assert_eq!(outcome_of(waiting), Some(Outcome::Released), "{first:?}");
    assert!(first.runs.iter().all(|r| r.error.is_none()), "{first:?}");
    let released = h.run(waiting).await;
    assert_eq!(released.status.state, RunStatus::Pending);
    assert!(released.worker_id.is_none(), "its lease is released");
    assert_eq!(released.duration_ms, 0, "no execution time is recorded");
    assert!(h.steps(waiting).await.is_empty(), "no step was written");
    assert_eq!(executions(&h.path("quick")), 0, "it never executed");

    // The next invocation (a worker that takes only `quick`) runs it like any pending run.
    let worker = h.builder().register(quick(&h)).build().unwrap();
    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(waiting).await, RunStatus::Completed);
    assert_eq!(executions(&h.path("quick")), 1);
}

/// Another worker ("thief") takes `id`'s lease, straight in the API's store.
async fn steal_lease(h: &Harness, id: uuid::Uuid) {
    let lease = LeaseUpdate::Set {
        worker_id: "thief".into(),
        expires_at: chrono::Utc::now() + chrono::TimeDelta::seconds(300),
    };
    let update = RunUpdate {
        lease: Some(lease),
        ..RunUpdate::default()
    };
    h.api.store().update_run(id, update).await.unwrap();
}

/// Requests the API has answered so far on `route` (`"<METHOD> <route template>"`).
fn requests_to(h: &Harness, route: &str) -> u64 {
    h.api.requests_by_route().get(route).copied().unwrap_or(0)
}

/// Claims (`GET /api/v1/internal/runs/next`) the API has answered so far.
fn claims_sent(h: &Harness) -> u64 {
    requests_to(h, "GET /api/v1/internal/runs/next")
}

async fn after_a_full_batch_the_first_claims_go_out_together(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(quick(&h))
        .concurrency(2)
        .max_runs_per_invocation(2)
        .build()
        .unwrap();
    h.create("quick", 0).await;
    h.create("quick", 0).await;
    let full = h.invoke(&worker, LONG).await;
    assert_eq!(full.stop_reason, StopReason::MaxRuns, "{full:?}");
    assert_eq!(full.count(Outcome::Completed), 2, "{full:?}");

    // The backlog likely goes on: one claim per slot at once. Only one run is pending: one
    // claim takes it, the other finds nothing, and the batch stops there.
    let last = h.create("quick", 0).await;
    let before = claims_sent(&h);
    let next = h.invoke(&worker, LONG).await;
    assert_eq!(claims_sent(&h) - before, 2, "two claims together: {next:?}");
    assert_eq!(next.claimed, 1, "{next:?}");
    assert_eq!(next.runs[0].run_id, last);
    assert_eq!(next.count(Outcome::Completed), 1, "{next:?}");
    assert_eq!(next.stop_reason, StopReason::NoPendingRun, "{next:?}");
    assert!(next.errors.is_empty(), "{next:?}");

    // That batch was not full: an idle invocation costs one claim.
    let before = claims_sent(&h);
    let idle = h.invoke(&worker, LONG).await;
    assert_eq!(claims_sent(&h) - before, 1, "{idle:?}");
    assert_eq!(idle.claimed, 0);
    assert_eq!(executions(&h.path("quick")), 3);
}

/// Reads of one run (`GET /api/v1/internal/runs/{id}`) the API has answered so far.
fn run_reads(h: &Harness) -> u64 {
    requests_to(h, "GET /api/v1/internal/runs/{id}")
}

async fn the_engine_reads_a_held_run_from_what_it_knows_and_its_steps_from_the_api(
    backend: Backend,
) {
    let h = Harness::start_on(backend).await;
    // No lease refresh during the run: a refresh landing after the run's end would be refused
    // and followed by a read of its own.
    let worker = h
        .builder()
        .register(Noop)
        .lease_refresh_interval(Duration::from_secs(9))
        .build()
        .unwrap();
    let id = h.create("noop", 0).await;
    let before = run_reads(&h);
    let summary = h.invoke(&worker, LONG).await;
    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    // The engine reads a handler-less run four times: to start it, its steps to replay, the
    // pause check at its end and the run as its final write left it. The first and the pause
    // check are answered by the claim's copy (fresh for one refresh interval), the last is
    // built from it and the final write; the steps are the one live read.
    assert_eq!(run_reads(&h) - before, 1, "{:?}", h.api.requests_by_route());
    let run = h.api.store().get_run(id).await.unwrap().unwrap();
    assert!(
        run.completed_at.is_some() && run.worker_id.is_none(),
        "{run:?}"
    );
}

async fn a_pause_is_seen_within_one_refresh_interval_and_stops_the_run_at_a_step(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let (first, third) = (h.path("first"), h.path("third"));
    let workflow = ShellWorkflow {
        name: "pausable",
        steps: vec![
            ("first", format!("echo x >> '{}'", first.display())),
            // Longer than the refresh interval: the refresher sees the pause meanwhile.
            ("second", "sleep 2".to_string()),
            ("third", format!("echo x >> '{}'", third.display())),
        ],
    };
    let worker = Arc::new(h.builder().register(workflow).build().unwrap());
    let id = h.create("pausable", 0).await;
    let invocation = {
        let worker = worker.clone();
        tokio::spawn(async move {
            let mut context = lambda_runtime::Context::default();
            context.request_id = "pause".into();
            context.deadline = deadline_in(LONG);
            ironflow_lambda::handle_summary(
                &worker,
                lambda_runtime::LambdaEvent::new(json!({}), context),
            )
            .await
            .unwrap()
        })
    };
    wait_until("the first step done", LONG, || async {
        executions(&first) == 1
    })
    .await;
    h.api.pause_run(id).await.unwrap();
    let summary = invocation.await.unwrap();

    assert_eq!(summary.count(Outcome::Suspended), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Paused);
    assert_eq!(
        executions(&third),
        0,
        "no step started after the pause was seen"
    );
}

/// Lines of `path` equal to `line`.
fn lines_equal(path: &std::path::Path, line: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

async fn a_run_paused_and_resumed_while_a_step_runs_is_stopped_not_run_twice(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (second, third) = (h.path("second"), h.path("third"));
    let workflow = ShellWorkflow {
        name: "resumable-pause",
        steps: vec![
            (
                "second",
                format!(
                    "echo start >> '{s}'; sleep 2; echo end >> '{s}'",
                    s = second.display()
                ),
            ),
            ("third", format!("echo x >> '{}'", third.display())),
        ],
    };
    // Two instances (two workers): each serves its own invocations.
    let instance = || Arc::new(h.builder().register(workflow.clone()).build().unwrap());
    let (one, other) = (instance(), instance());
    let id = h.create("resumable-pause", 0).await;
    let invoke = |worker: Arc<ironflow_lambda::LambdaWorker>, request_id: &'static str| {
        tokio::spawn(async move {
            let mut context = lambda_runtime::Context::default();
            context.request_id = request_id.into();
            context.deadline = deadline_in(LONG);
            let event = lambda_runtime::LambdaEvent::new(json!({}), context);
            ironflow_lambda::handle_summary(&worker, event)
                .await
                .unwrap()
        })
    };
    let first = invoke(one, "first");
    wait_until("the step started", LONG, || async {
        lines_equal(&second, "start") == 1
    })
    .await;
    // Paused and resumed within one refresh interval: the run is Pending again, and another
    // invocation claims it at once.
    h.api.pause_run(id).await.unwrap();
    h.api.resume_run(id).await.unwrap();
    let next = invoke(other, "next");
    let (first, next) = (first.await.unwrap(), next.await.unwrap());

    assert_eq!(first.count(Outcome::LeaseLost), 1, "{first:?}");
    assert_eq!(next.count(Outcome::Completed), 1, "{next:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(
        lines_equal(&second, "end"),
        1,
        "the first execution's step was stopped, not run to its end beside the second's"
    );
    assert_eq!(executions(&third), 1, "the step after it ran once");
}

/// The same, with the run claimed again by the same invocation (one worker id): the first
/// execution's lease renewals would be answered for the later claim, so it is stopped by the
/// claim itself.
async fn a_run_paused_resumed_and_claimed_again_by_the_same_invocation_is_stopped_not_run_twice(
    backend: Backend,
) {
    let h = Harness::start_on(backend).await;
    let (second, third) = (h.path("second"), h.path("third"));
    let (gate, gated, pids) = (h.path("gate"), h.path("gated"), h.path("pids"));
    let wait_for = |file: &std::path::Path| {
        format!("while [ ! -e '{}' ]; do sleep 0.02; done", file.display())
    };
    let workflow = ShellWorkflow {
        name: "resumable-pause",
        steps: vec![
            (
                "second",
                format!(
                    "echo $$ >> '{p}'; echo start >> '{s}'; {wait}; echo end >> '{s}'",
                    p = pids.display(),
                    s = second.display(),
                    wait = wait_for(&gate)
                ),
            ),
            ("third", format!("echo x >> '{}'", third.display())),
        ],
    };
    let worker = h
        .builder()
        .concurrency(2)
        .register(workflow)
        .register(ShellWorkflow::one("gated", &wait_for(&gated)))
        .register(ShellWorkflow::one("quick", "true"))
        .build()
        .unwrap();
    // The oldest first: once resumed, the run is the one the next claim takes.
    let id = h.create("resumable-pause", 0).await;
    h.create("gated", 0).await;
    h.create("quick", 0).await;
    let drive = async {
        wait_until("the step started", LONG, || async {
            lines_equal(&second, "start") == 1
        })
        .await;
        let first = std::fs::read_to_string(&pids).unwrap();
        let first = std::path::PathBuf::from(format!("/proc/{}/stat", first.trim()));
        // Gone, or dead and not reaped yet: `<pid> (<name>) <state> ...`, Z or X.
        let ended = || match std::fs::read_to_string(&first) {
            Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| {
                matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))
            }),
            Err(_) => true,
        };
        // Paused and resumed within one refresh interval: the run is Pending again. The gated
        // run ends, freeing a slot: this invocation's claim loop claims the run again, which
        // stops the first execution (its step's process ends) before the step's gate opens.
        h.api.pause_run(id).await.unwrap();
        h.api.resume_run(id).await.unwrap();
        std::fs::write(&gated, "").unwrap();
        wait_until("the first execution's step process ended", LONG, || async {
            ended()
        })
        .await;
        std::fs::write(&gate, "").unwrap();
    };

    let (summary, ()) = tokio::join!(h.invoke(&worker, LONG), drive);

    let outcomes = outcomes_of(&summary, id);
    // The first execution ended at the later claim (handed back: "claimed again"), or at its
    // refresher's sight of the pause if a renewal fell between the pause and the resume.
    assert!(
        matches!(
            outcomes[..],
            [Outcome::Completed, Outcome::Suspended | Outcome::HandedBack]
        ),
        "{summary:?}"
    );
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(
        lines_equal(&second, "end"),
        1,
        "the first execution's step was stopped, not run to its end beside the second's"
    );
    assert_eq!(executions(&third), 1, "the step after it ran once");
}

/// Returns at once: a warm-up run, whose execution is a few API requests, so that a claim's
/// round trip is a large share of it (claim-ahead's pace, `claim_ahead_percent(1)`).
struct Noop;

impl WorkflowHandler for Noop {
    fn name(&self) -> &str {
        "noop"
    }

    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// Complete one no-op run, so that `worker`'s instance has a pace that claims ahead.
async fn warm_up(h: &Harness, worker: &ironflow_lambda::LambdaWorker) {
    h.create("noop", 0).await;
    let warm_up = h.invoke(worker, LONG).await;
    assert_eq!(warm_up.count(Outcome::Completed), 1, "{warm_up:?}");
}

/// Fails once `release` is set; counts its executions.
struct FailsWhenReleased {
    executions: Arc<AtomicUsize>,
    release: Arc<AtomicBool>,
}

impl WorkflowHandler for FailsWhenReleased {
    fn name(&self) -> &str {
        "fails-when-released"
    }

    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.executions.fetch_add(1, Ordering::SeqCst);
            while !self.release.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(ironflow_engine::error::EngineError::InvalidWorkflow(
                "failing on purpose".into(),
            ))
        })
    }
}

async fn a_run_claimed_ahead_does_not_start_once_a_failure_blocked_its_workflow(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (count, release) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let worker = Arc::new(
        h.builder()
            .register(Noop)
            .register(FailsWhenReleased {
                executions: count.clone(),
                release: release.clone(),
            })
            .poison_threshold(1)
            .concurrency(1)
            .max_runs_per_invocation(3)
            .claim_ahead_percent(1)
            .build()
            .unwrap(),
    );
    warm_up(&h, &worker).await;

    let failing = h.create("fails-when-released", 0).await;
    let waiting = h.create("fails-when-released", 0).await;
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    wait_until(
        "one run executes and the other is claimed ahead",
        Duration::from_secs(20),
        || {
            let (h, count) = (h.clone(), count.clone());
            async move {
                count.load(Ordering::SeqCst) == 1 && h.status(waiting).await == RunStatus::Running
            }
        },
    )
    .await;
    release.store(true, Ordering::SeqCst);

    let summary = invocation.await.unwrap();
    let outcome_of = |id| {
        summary
            .runs
            .iter()
            .find(|r| r.run_id == id)
            .map(|r| r.outcome)
    };
    assert_eq!(outcome_of(failing), Some(Outcome::Failed), "{summary:?}");
    // Threshold 1: the first failure blocks the workflow, and the waiting run is checked
    // after that failure was counted.
    assert_eq!(
        outcome_of(waiting),
        Some(Outcome::PoisonBlocked),
        "{summary:?}"
    );
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "the waiting run never executed"
    );
    assert_eq!(h.status(waiting).await, RunStatus::Failed);
}

async fn a_run_claimed_ahead_whose_lease_was_taken_is_not_released(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let worker = Arc::new(
        h.builder()
            .register(Noop)
            .register(quick(&h))
            .register(stuck())
            .concurrency(1)
            .max_runs_per_invocation(2)
            .claim_ahead_percent(1)
            .build()
            .unwrap(),
    );
    warm_up(&h, &worker).await;

    h.create("stuck", 0).await;
    let waiting = h.create("quick", 0).await;
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, Duration::from_secs(4)).await })
    };
    wait_until(
        "the quick run is claimed ahead",
        Duration::from_secs(20),
        || {
            let h = h.clone();
            async move { h.status(waiting).await == RunStatus::Running }
        },
    )
    .await;
    // Another worker takes the waiting run over.
    steal_lease(&h, waiting).await;

    let summary = invocation.await.unwrap();
    let report = summary.runs.iter().find(|r| r.run_id == waiting).unwrap();
    assert_eq!(report.outcome, Outcome::LeaseLost, "{summary:?}");
    let run = h.run(waiting).await;
    assert_eq!(run.status.state, RunStatus::Running, "nothing was written");
    assert_eq!(run.worker_id.as_deref(), Some("thief"));
    assert_eq!(executions(&h.path("quick")), 0, "it never executed here");
}

async fn futures_join(h: &Harness, n: usize) -> Vec<uuid::Uuid> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(h.create("gauge", 0).await);
    }
    ids
}

async fn handback_mid_step_then_resume_replays_completed_steps(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let (a, b, c) = (h.path("a"), h.path("b"), h.path("c"));
    let workflow = ShellWorkflow {
        name: "resumable",
        steps: vec![
            ("a", format!("echo x >> '{}'", a.display())),
            // Hangs (with a grandchild `sleep`) on its first execution only.
            (
                "b",
                format!(
                    "echo x >> '{b}'; if [ \"$(wc -l < '{b}')\" -eq 1 ]; then sleep 600; fi",
                    b = b.display()
                ),
            ),
            ("c", format!("echo x >> '{}'", c.display())),
        ],
    };
    let worker = h.builder().register(workflow).build().unwrap();
    let id = h.create("resumable", 0).await;

    let first = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(first.count(Outcome::HandedBack), 1, "{first:?}");
    assert!(first.runs[0].error.is_none(), "{first:?}");
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Pending);
    assert!(run.worker_id.is_none(), "the lease is released");
    assert!(run.duration_ms > 0, "the handback records the time it ran");
    let steps = h.steps(id).await;
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].status.state, StepStatus::Completed);
    assert_eq!(steps[1].status.state, StepStatus::Failed);
    assert_eq!(steps[1].error.as_deref(), Some(STEP_INTERRUPTED_ERROR));
    assert!(
        first.orphans_killed >= 1,
        "the step's `sleep` was killed: {first:?}"
    );
    assert!(
        orphans::descendants().is_empty(),
        "no process outlives the invocation"
    );

    let second = h.invoke(&worker, LONG).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    assert_eq!(
        executions(&a),
        1,
        "the completed step was replayed, not re-executed"
    );
    assert_eq!(executions(&b), 2, "the cut step ran again");
    assert_eq!(executions(&c), 1);
    assert!(
        h.steps(id)
            .await
            .iter()
            .all(|s| s.status.state != StepStatus::Running),
        "no step row is left Running"
    );
}

async fn a_run_handed_back_without_progress_is_failed_not_looped(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(stuck())
        .max_handbacks_without_progress(3)
        .build()
        .unwrap();
    let id = h.create("stuck", 0).await;

    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let summary = h.invoke(&worker, Duration::from_millis(1500)).await;
        assert_eq!(summary.claimed, 1, "{summary:?}");
        outcomes.push(summary.runs[0].outcome);
    }

    assert_eq!(
        outcomes,
        [Outcome::HandedBack, Outcome::HandedBack, Outcome::Failed]
    );
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(error.contains("handed back 3 times in a row"), "{error}");
    assert!(
        error.contains("'hang'"),
        "the error names the step: {error}"
    );
    assert!(
        h.steps(id)
            .await
            .iter()
            .all(|s| s.status.state != StepStatus::Running)
    );
}

async fn the_run_timeout_counts_executed_time_across_invocations(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(stuck())
        .run_timeout(Duration::from_secs(3))
        .max_handbacks_without_progress(10)
        .build()
        .unwrap();
    let id = h.create("stuck", 0).await;

    // 2 s invocations, cut at 1.5 s: each alone is well under the 3 s timeout.
    let first = h.invoke(&worker, Duration::from_secs(2)).await;
    assert_eq!(first.runs[0].outcome, Outcome::HandedBack, "{first:?}");
    let mut last = first;
    for _ in 0..3 {
        if h.status(id).await != RunStatus::Pending {
            break;
        }
        last = h.invoke(&worker, Duration::from_secs(2)).await;
    }

    assert_eq!(last.runs[0].outcome, Outcome::TimedOut, "{last:?}");
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Failed, "no retries left");
    assert!(run.error.unwrap_or_default().contains("timed out after 3s"));
}

async fn a_stolen_lease_abandons_the_run_without_any_write(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let worker = Arc::new(h.builder().register(stuck()).build().unwrap());
    let id = h.create("stuck", 0).await;

    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    wait_until("the step runs", Duration::from_secs(20), || {
        let h = h.clone();
        async move {
            h.steps(id)
                .await
                .iter()
                .any(|s| s.status.state == StepStatus::Running)
        }
    })
    .await;
    // Another worker takes the run over.
    steal_lease(&h, id).await;

    let summary = invocation.await.unwrap();
    assert_eq!(summary.runs[0].outcome, Outcome::LeaseLost, "{summary:?}");
    let run = h.run(id).await;
    assert_eq!(
        run.status.state,
        RunStatus::Running,
        "no status write by us"
    );
    assert_eq!(run.worker_id.as_deref(), Some("thief"));
    assert!(run.error.is_none());
    assert!(
        h.steps(id)
            .await
            .iter()
            .any(|s| s.status.state == StepStatus::Running),
        "the thief's step is left alone"
    );
}

struct Panics;

impl WorkflowHandler for Panics {
    fn name(&self) -> &str {
        "panics"
    }

    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move { panic!("handler bug") })
    }
}

async fn a_panicking_handler_is_caught_and_its_retry_scheduled(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h.builder().register(Panics).build().unwrap();
    let id = h.create("panics", 1).await;

    let summary = h.invoke(&worker, LONG).await;

    assert_eq!(summary.runs[0].outcome, Outcome::Panicked);
    assert!(
        summary.runs[0]
            .error
            .as_deref()
            .unwrap()
            .contains("handler bug")
    );
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Retrying, "retry scheduled");
    assert_eq!(run.retry_count, 1);
}

/// Fails while the file `fail` exists in the harness directory.
fn toggle(h: &Harness) -> ShellWorkflow {
    ShellWorkflow {
        name: "toggle",
        steps: vec![(
            "maybe-fail",
            format!("test ! -e '{}'", h.path("fail").display()),
        )],
    }
}

async fn poison_pill_trips_after_k_failures_and_blocks_the_workflow(backend: Backend) {
    let h = Harness::start_on(backend).await;
    std::fs::write(h.path("fail"), "").unwrap();
    let policy = PoisonPolicy {
        threshold: 2,
        cooldown: Duration::from_secs(600),
    };
    let table = Arc::new(MemoryPoisonTable::new(policy));
    let worker = h
        .builder()
        .register(toggle(&h))
        .poison_threshold(2)
        .poison_cooldown(policy.cooldown)
        .poison_table(table.clone())
        .max_runs_per_invocation(1)
        .build()
        .unwrap();
    let runs = [
        h.create("toggle", 0).await,
        h.create("toggle", 0).await,
        h.create("toggle", 0).await,
    ];

    let a = h.invoke(&worker, LONG).await;
    let b = h.invoke(&worker, LONG).await;
    let c = h.invoke(&worker, LONG).await;

    assert_eq!(a.runs[0].outcome, Outcome::Failed);
    assert_eq!(b.runs[0].outcome, Outcome::Failed);
    assert_eq!(c.runs[0].outcome, Outcome::PoisonBlocked, "{c:?}");
    let blocked = h.run(runs[2]).await;
    assert_eq!(blocked.status.state, RunStatus::Failed);
    let error = blocked.error.unwrap_or_default();
    assert!(
        error.contains("poison pill") && error.contains("2 consecutive failures"),
        "{error}"
    );
    assert!(
        h.steps(runs[2]).await.is_empty(),
        "the blocked run never executed"
    );
    let counter = table
        .counter("toggle", ironflow_lambda::poison::now_ms())
        .await
        .unwrap();
    assert_eq!(counter.map(|c| c.consecutive_failures), Some(2));
}

async fn a_success_resets_the_poison_pill_count(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let table = Arc::new(MemoryPoisonTable::new(PoisonPolicy {
        threshold: 2,
        cooldown: Duration::from_secs(600),
    }));
    let worker = h
        .builder()
        .register(toggle(&h))
        .poison_threshold(2)
        .poison_table(table.clone())
        .max_runs_per_invocation(1)
        .build()
        .unwrap();
    for _ in 0..4 {
        h.create("toggle", 0).await;
    }

    std::fs::write(h.path("fail"), "").unwrap();
    assert_eq!(
        h.invoke(&worker, LONG).await.runs[0].outcome,
        Outcome::Failed
    );
    std::fs::remove_file(h.path("fail")).unwrap();
    assert_eq!(
        h.invoke(&worker, LONG).await.runs[0].outcome,
        Outcome::Completed
    );
    assert_eq!(
        table
            .counter("toggle", ironflow_lambda::poison::now_ms())
            .await
            .unwrap(),
        None
    );
    std::fs::write(h.path("fail"), "").unwrap();
    assert_eq!(
        h.invoke(&worker, LONG).await.runs[0].outcome,
        Outcome::Failed
    );
    // Without the reset this would be the second failure in a row, and the run blocked.
    assert_eq!(
        h.invoke(&worker, LONG).await.runs[0].outcome,
        Outcome::Failed
    );
}

async fn nothing_is_sent_to_the_api_after_the_handler_returned(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(quick(&h))
        .register(stuck())
        .lease_refresh_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    h.create("stuck", 0).await;
    h.create("quick", 0).await;

    let summary = h.invoke(&worker, Duration::from_secs(2)).await;
    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");

    let after_return = h.api.requests();
    // Observe 20 refresh intervals: a refresher, execution or log task left behind would
    // send something in that time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.api.requests(), after_return);
    assert!(orphans::descendants().is_empty());
}

/// Whether process `pid` is alive (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

/// The pid a step wrote to `path`, once written.
fn pid_in(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

async fn a_run_s_processes_end_with_it_and_another_run_s_go_on(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let (detached, held, release) = (h.path("detached"), h.path("held"), h.path("release"));
    // Leaves a grandchild in a session of its own behind, and completes.
    let leaves = ShellWorkflow::one(
        "leaves-a-process",
        // Its output elsewhere: the step's pipes close when the step's shell exits.
        &format!(
            "setsid sleep 600 >/dev/null 2>&1 & echo $! > '{}'",
            detached.display()
        ),
    );
    // Runs a child of its own until released.
    let holds = ShellWorkflow::one(
        "holds-a-process",
        &format!(
            "sleep 600 >/dev/null 2>&1 & echo $! > '{}'; while [ ! -e '{}' ]; do sleep 0.05; done; kill $!",
            held.display(),
            release.display()
        ),
    );
    let worker = Arc::new(
        h.builder()
            .register(leaves)
            .register(holds)
            .concurrency(2)
            .build()
            .unwrap(),
    );
    let holder = h.create("holds-a-process", 0).await;
    let leaver = h.create("leaves-a-process", 0).await;
    let invocation = {
        let (h, worker) = (h.clone(), worker.clone());
        tokio::spawn(async move { h.invoke(&worker, LONG).await })
    };
    wait_until(
        "the leaving run completed and the other run's child runs",
        Duration::from_secs(20),
        || {
            let (h, held) = (h.clone(), held.clone());
            async move { h.status(leaver).await == RunStatus::Completed && pid_in(&held).is_some() }
        },
    )
    .await;
    let (left, other) = (pid_in(&detached).unwrap(), pid_in(&held).unwrap());
    wait_until(
        "the completed run's detached process is killed at its end",
        Duration::from_secs(20),
        || async move { !alive(left) },
    )
    .await;
    assert!(alive(other), "the other run's process goes on");
    assert_eq!(h.status(holder).await, RunStatus::Running);

    std::fs::write(&release, "").unwrap();
    let summary = invocation.await.unwrap();
    assert_eq!(summary.count(Outcome::Completed), 2, "{summary:?}");
    assert!(summary.orphans_killed >= 1, "{summary:?}");
    assert!(orphans::descendants().is_empty());
}

async fn a_past_or_zero_deadline_claims_nothing(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h.builder().register(quick(&h)).build().unwrap();
    let id = h.create("quick", 0).await;
    let before = h.api.requests();

    for deadline in [0, 1, deadline_in(Duration::ZERO) - 5_000] {
        let summary = h.invoke_event(&worker, json!({}), deadline).await.unwrap();
        assert_eq!(summary.claimed, 0);
        assert_eq!(summary.stop_reason, StopReason::Cutoff);
        assert_eq!(summary.time_left_ms, 0);
    }

    assert_eq!(h.api.requests(), before, "not even a claim was sent");
    assert_eq!(h.status(id).await, RunStatus::Pending);
}

/// A run of one shell step running `cmd`, claimed and ended by one invocation: failed, in the
/// invocation's report and in the API; the run and its steps as the API has them.
async fn failed_in_one_invocation(backend: Backend, cmd: &str) -> (Run, Vec<Step>) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .register(ShellWorkflow::one("one-step", cmd))
        .build()
        .unwrap();
    let id = h.create("one-step", 0).await;
    let summary = h.invoke(&worker, Duration::from_secs(30)).await;
    assert_eq!(outcomes_of(&summary, id), vec![Outcome::Failed]);
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Failed);
    (run, h.steps(id).await)
}

/// A failure whose message is larger than the API takes (a shell step failing with 3 MiB of
/// stderr, which ironflow keeps up to 10 MB) is recorded, its text cut: the run is Failed in
/// this invocation, not left Running for the reaper to run again.
async fn a_failure_with_a_huge_message_is_recorded_with_its_text_cut(backend: Backend) {
    let cmd = "head -c 3145728 /dev/zero | tr '\\0' x >&2; exit 3";
    let (run, steps) = failed_in_one_invocation(backend, cmd).await;
    let error = run.error.unwrap_or_default();
    assert!(error.len() <= 64 * 1024, "{}", error.len());
    assert!(error.contains("more bytes cut]"), "{}", &error[..200]);
    assert_eq!(steps[0].status.state, StepStatus::Failed);
    assert!(steps[0].error.as_ref().unwrap().len() <= 64 * 1024);
}

/// A step whose output is larger than the API takes (3 MiB of stdout) fails, saying so: the
/// step is written Failed (not left Running), and the run fails with the step's error.
async fn a_step_output_too_large_for_the_api_fails_the_step_saying_so(backend: Backend) {
    let cmd = "head -c 3145728 /dev/zero | tr '\\0' x";
    let (run, steps) = failed_in_one_invocation(backend, cmd).await;
    let error = run.error.unwrap_or_default();
    assert!(
        error.contains("the step's output cannot be stored"),
        "{error}"
    );
    assert_eq!(steps[0].status.state, StepStatus::Failed);
    assert!(steps[0].output.is_none());
    assert!(
        steps[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("bytes") && e.contains("limit")),
        "{:?}",
        steps[0].error
    );
}

/// A step whose own record is larger than the API takes (a 3 MiB command, as a prompt built
/// from a large document would be) cannot be created: the API's refusal fails the run in this
/// invocation, not a fault handed back by every invocation after it.
async fn a_step_too_large_to_create_fails_the_run_instead_of_looping(backend: Backend) {
    let cmd = format!("true {}", "x".repeat(3 << 20));
    let (run, steps) = failed_in_one_invocation(backend, &cmd).await;
    let error = run.error.unwrap_or_default();
    assert!(
        error.contains("length limit exceeded"),
        "{}",
        &error[..200.min(error.len())]
    );
    assert!(steps.is_empty(), "no step was created");
}

async fn an_absurdly_far_deadline_is_clamped_and_works(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h.builder().register(quick(&h)).build().unwrap();
    h.create("quick", 0).await;

    let summary = h.invoke_event(&worker, json!({}), u64::MAX).await.unwrap();

    assert_eq!(summary.count(Outcome::Completed), 1);
    assert!(summary.time_left_ms <= 15 * 60 * 1000);
}

on_both_stores!(
    happy_path_completes_every_run,
    claims_at_most_n_runs_and_honours_a_smaller_override,
    a_cold_instance_claims_only_when_a_slot_is_free_and_never_exceeds_concurrency,
    with_claim_ahead_off_a_warm_instance_claims_only_into_a_free_slot,
    a_warm_instance_claims_one_run_ahead_under_its_lease_and_never_exceeds_concurrency,
    a_run_claimed_ahead_without_a_free_slot_is_released_at_the_cutoff,
    a_run_claimed_ahead_has_its_steps_read_while_it_waits,
    after_a_full_batch_the_first_claims_go_out_together,
    the_engine_reads_a_held_run_from_what_it_knows_and_its_steps_from_the_api,
    a_pause_is_seen_within_one_refresh_interval_and_stops_the_run_at_a_step,
    a_run_paused_and_resumed_while_a_step_runs_is_stopped_not_run_twice,
    a_run_paused_resumed_and_claimed_again_by_the_same_invocation_is_stopped_not_run_twice,
    a_run_claimed_ahead_does_not_start_once_a_failure_blocked_its_workflow,
    a_run_claimed_ahead_whose_lease_was_taken_is_not_released,
    handback_mid_step_then_resume_replays_completed_steps,
    a_run_handed_back_without_progress_is_failed_not_looped,
    the_run_timeout_counts_executed_time_across_invocations,
    a_stolen_lease_abandons_the_run_without_any_write,
    a_panicking_handler_is_caught_and_its_retry_scheduled,
    poison_pill_trips_after_k_failures_and_blocks_the_workflow,
    a_success_resets_the_poison_pill_count,
    nothing_is_sent_to_the_api_after_the_handler_returned,
    a_past_or_zero_deadline_claims_nothing,
    an_absurdly_far_deadline_is_clamped_and_works,
    a_failure_with_a_huge_message_is_recorded_with_its_text_cut,
    a_step_output_too_large_for_the_api_fails_the_step_saying_so,
    a_step_too_large_to_create_fails_the_run_instead_of_looping,
    a_run_s_processes_end_with_it_and_another_run_s_go_on,
);
