//! Cutoff-aware step starts (docs/design.md, "Cutoff-aware starts") against the real ironflow
//! API on both of its stores: a step that would not fit before the cutoff is not started, the
//! run is handed back and the next invocation runs the step with a full budget; a step that can
//! never fit still fails with the loop guard's message; the claim window releases a run whose
//! first step would not fit.
//!
//! Invocations of 8 s (cut at 7.5 s, the harness's 500 ms margin), run one run at a time: a
//! first run of `pre` (a `sleep` of 3 or 4 s) makes the next run start late, with at most
//! 4.5 s left, and a step of 5 s (the expectation of a step never seen, here), or of 4 s after
//! a 4 s `pre`, does not fit then but does in a fresh invocation.

mod common;

use std::time::Duration;

use common::{Backend, Harness, ShellWorkflow, executions};
use ironflow_lambda::{LambdaWorker, Outcome};
use ironflow_store::entities::{RunStatus, StepStatus};

const INVOCATION: Duration = Duration::from_secs(8);

/// A workflow of one step `long` that notes each start in `mark` then sleeps `secs`.
fn long(h: &Harness, secs: u32) -> ShellWorkflow {
    let cmd = format!("echo x >> '{}'; sleep {secs}", h.path("long").display());
    ShellWorkflow {
        name: "fit",
        steps: vec![("long", cmd)],
    }
}

/// A workflow of one step taking `secs`: run first, it makes the next run start late.
fn pre(secs: u32) -> ShellWorkflow {
    ShellWorkflow {
        name: "pre",
        steps: vec![("pre", format!("sleep {secs}"))],
    }
}

/// One run at a time, never claimed ahead, at most two per invocation; the loop guard fails a
/// run at its `max_without_progress`-th counted handback in a row.
fn worker(h: &Harness, workflows: [ShellWorkflow; 2], max_without_progress: u32) -> LambdaWorker {
    let [a, b] = workflows;
    h.builder()
        .register(a)
        .register(b)
        .concurrency(1)
        .max_runs_per_invocation(2)
        .claim_ahead_percent(0)
        .max_handbacks_without_progress(max_without_progress)
        .default_step_duration(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// `pre` then `fit` created, in that order (claims take the oldest first); `fit`'s id.
async fn pre_then_fit(h: &Harness) -> uuid::Uuid {
    h.create("pre", 0).await;
    h.create("fit", 0).await
}

/// The first report of run `id` in `summary`: handed back, its step `step` deferred.
fn assert_deferred(summary: &ironflow_lambda::InvocationSummary, id: uuid::Uuid, step: &str) {
    let report = summary.runs.iter().find(|r| r.run_id == id);
    let report = report.unwrap_or_else(|| panic!("{id} not claimed: {summary:?}"));
    assert_eq!(report.outcome, Outcome::HandedBack, "{summary:?}");
    let note = report.error.as_deref().unwrap_or_default();
    assert!(note.contains(&format!("step '{step}' deferred")), "{note}");
}

async fn a_step_that_would_not_fit_is_not_started_and_runs_next_with_a_full_budget(
    backend: Backend,
) {
    let h = Harness::start_on(backend).await;
    // One counted handback without progress would fail the run.
    let worker = worker(&h, [pre(3), long(&h, 5)], 1);
    let id = pre_then_fit(&h).await;

    let first = h.invoke(&worker, INVOCATION).await;
    assert_deferred(&first, id, "long");
    assert!(h.steps(id).await.is_empty(), "no step record was created");
    assert_eq!(executions(&h.path("long")), 0, "the step never started");
    assert_eq!(h.status(id).await, RunStatus::Pending);

    let second = h.invoke(&worker, INVOCATION).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    let steps = h.steps(id).await;
    assert_eq!(steps.len(), 1, "one record, of the one start: {steps:?}");
    assert_eq!(steps[0].status.state, StepStatus::Completed);
    assert_eq!(executions(&h.path("long")), 1, "started once, and finished");
}

async fn a_step_that_never_fits_still_fails_with_the_loop_guard_s_message(backend: Backend) {
    let h = Harness::start_on(backend).await;
    // Expected to take 5 s (the default): deferred from the late start, then cut in fresh
    // invocations, which never defer it (they could give it no more time).
    let worker = worker(&h, [pre(3), long(&h, 600)], 2);
    let id = pre_then_fit(&h).await;

    let first = h.invoke(&worker, INVOCATION).await;
    assert_deferred(&first, id, "long");
    assert!(h.steps(id).await.is_empty(), "no step record was created");

    let mut invocations = 1;
    while h.status(id).await == RunStatus::Pending {
        assert!(
            invocations < 6,
            "still Pending after {invocations} invocations"
        );
        let summary = h.invoke(&worker, INVOCATION).await;
        invocations += 1;
        let error = summary.runs[0].error.as_deref().unwrap_or_default();
        assert!(
            !error.contains("deferred"),
            "a fresh invocation deferred it: {error}"
        );
    }
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(
        error.contains("handed back 2 times in a row") && error.contains("'long'"),
        "{error}"
    );
    assert!(
        h.steps(id)
            .await
            .iter()
            .all(|s| s.status.state != StepStatus::Running)
    );
}

async fn the_claim_window_releases_a_run_whose_first_step_would_not_fit(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = worker(&h, [pre(4), long(&h, 4)], 3);
    // The process learns `fit`'s first step: 4 s.
    let learn = h.create("fit", 0).await;
    let summary = h.invoke(&worker, INVOCATION).await;
    assert_eq!(summary.count(Outcome::Completed), 1, "{summary:?}");
    assert_eq!(h.status(learn).await, RunStatus::Completed);

    let id = pre_then_fit(&h).await;
    let first = h.invoke(&worker, INVOCATION).await;
    let fit = first.runs.iter().find(|r| r.run_id == id).expect("claimed");
    assert_eq!(fit.outcome, Outcome::Released, "{first:?}");
    assert!(h.steps(id).await.is_empty(), "it did not execute");
    assert_eq!(executions(&h.path("long")), 1, "only the learning run's");
    assert_eq!(h.status(id).await, RunStatus::Pending);

    let second = h.invoke(&worker, INVOCATION).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// The time a run waits Pending after a deferral (a schedule's tick, a throttled wake-up) is
/// not executed time, though the handback interrupted no step, and every such wait of the
/// attempt stays one after later handbacks (docs/design.md, "The run timeout across
/// invocations"): the 12 s timeout counts the 7 s of the steps and the invocations around them,
/// not the 6 s wait.
async fn the_pending_time_after_a_deferral_does_not_count_toward_the_run_timeout(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let three = ShellWorkflow {
        name: "three",
        steps: vec![
            ("a", "sleep 3".into()),
            ("b", "sleep 3".into()),
            ("c", "sleep 1".into()),
        ],
    };
    let worker = h
        .builder()
        .register(three)
        .concurrency(1)
        .max_runs_per_invocation(1)
        .claim_ahead_percent(0)
        .default_step_duration(Duration::from_secs(5))
        .run_timeout(Duration::from_secs(12))
        .build()
        .unwrap();
    let id = h.create("three", 0).await;
    let deferred = |summary: &ironflow_lambda::InvocationSummary, step: &str| {
        assert_deferred(summary, id, step);
    };

    // `a` takes 3 s: `b`, expected to take 5 s, does not fit in the 4.5 s left.
    deferred(&h.invoke(&worker, INVOCATION).await, "b");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    let steps = h.steps(id).await;
    let marked = steps[0].debug_messages.as_ref().and_then(|m| m.as_array());
    assert!(
        marked.is_some_and(|m| m
            .iter()
            .any(|m| m.get("ironflow_lambda_handed_back_at").is_some())),
        "the handback recorded when the wait began: {steps:?}"
    );

    // 6 s Pending: with the 3 s of `a` and the 3 of `b`, more than the timeout if it counted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // `b` takes 3 s: `c` does not fit either.
    deferred(&h.invoke(&worker, INVOCATION).await, "c");
    let last = h.invoke(&worker, INVOCATION).await;
    assert_eq!(last.runs[0].outcome, Outcome::Completed, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// A deferred run is not claimed again by the invocation that deferred it (the time left only
/// shrinks): its workflow is left out of the claims, and the runs of other workflows that fit
/// are claimed and run instead of the batch's N runs being spent on the one deferral.
async fn a_deferred_run_is_not_claimed_again_by_the_same_invocation(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let quick = ShellWorkflow::one("quick", "true");
    let worker = h
        .builder()
        .register(pre(3))
        .register(long(&h, 5))
        .register(quick)
        .concurrency(1)
        .max_runs_per_invocation(8)
        .claim_ahead_percent(0)
        .default_step_duration(Duration::from_secs(5))
        .build()
        .unwrap();
    // The process learns `quick`'s step: milliseconds.
    let learn = h.create("quick", 0).await;
    h.invoke(&worker, INVOCATION).await;
    assert_eq!(h.status(learn).await, RunStatus::Completed);

    let id = pre_then_fit(&h).await;
    let after = h.create("quick", 0).await;
    let first = h.invoke(&worker, INVOCATION).await;

    let claims_of_fit = first.runs.iter().filter(|r| r.run_id == id).count();
    assert_eq!(claims_of_fit, 1, "claimed once: {first:?}");
    assert_deferred(&first, id, "long");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    assert_eq!(h.status(after).await, RunStatus::Completed, "{first:?}");
    assert_eq!(first.count(Outcome::Completed), 2, "{first:?}");

    let second = h.invoke(&worker, INVOCATION).await;
    assert_eq!(second.count(Outcome::Completed), 1, "{second:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

on_both_stores!(
    a_deferred_run_is_not_claimed_again_by_the_same_invocation,
    the_pending_time_after_a_deferral_does_not_count_toward_the_run_timeout,
    a_step_that_would_not_fit_is_not_started_and_runs_next_with_a_full_budget,
    a_step_that_never_fits_still_fails_with_the_loop_guard_s_message,
    the_claim_window_releases_a_run_whose_first_step_would_not_fit,
);
