//! Signals between runs: `ctx.send_signal` in a run our worker executes is delivered by the API
//! (`POST /api/v1/internal/signals`), which stores it and wakes the waiting runs back to
//! Pending, where the next invocation claims them, as with the reference worker. Nothing is
//! resumed in the Lambda process itself, outside an invocation's slots and leases.
//!
//! Waits (a signal, a human input, a `ctx.delay`) do not count toward the run timeout, which
//! counts the time the attempt executed across invocations (docs/design.md, "The run timeout
//! across invocations").

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::{Backend, Harness, ShellWorkflow};
use ironflow_engine::config::{DelayConfig, HumanInputConfig, ShellConfig};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_engine::signal::{SentSignals, Signal};
use ironflow_lambda::InvocationSummary;
use ironflow_lambda::LambdaWorker;
use ironflow_lambda::Outcome;
use ironflow_store::entities::{RunStatus, StepStatus, StepUpdate};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const LONG: Duration = Duration::from_secs(60);

#[derive(Serialize, Deserialize, JsonSchema)]
struct Released {
    by: String,
}

impl Signal for Released {
    const NAME: &'static str = "test.released";
}

/// Waits for `Released` with key `k1`, then records who released it.
struct Waiter;

impl WorkflowHandler for Waiter {
    fn name(&self) -> &str {
        "waiter"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let released = ctx
                .wait_for_signal::<Released>("wait", "k1", Duration::from_secs(3600))
                .await?;
            let by = released.map_or_else(|| "nobody".to_string(), |r| r.by);
            ctx.shell(
                "after",
                ironflow_engine::config::ShellConfig::new(&format!("echo released by {by}")),
            )
            .await?;
            Ok(())
        })
    }
}

/// Sends `Released` with key `k1`.
struct Sender;

impl WorkflowHandler for Sender {
    fn name(&self) -> &str {
        "sender"
    }

    fn sent_signals(&self) -> SentSignals {
        SentSignals::new().allow::<Released>()
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let released = Released {
                by: "sender".into(),
            };
            ctx.send_signal("release", &released, "k1").await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_signal_sent_by_a_run_wakes_the_waiting_run_through_the_api() {
    let h = Arc::new(Harness::start().await);
    let worker = h
        .builder()
        .register(Waiter)
        .register(Sender)
        .build()
        .unwrap();

    let waiter = h.create("waiter", 0).await;
    let first = one_run(&h, &worker).await;
    assert_ran(&first, waiter, Outcome::Suspended);
    assert_eq!(h.status(waiter).await, RunStatus::Sleeping);

    let sender = h.create("sender", 0).await;
    let second = one_run(&h, &worker).await;
    assert_ran(&second, sender, Outcome::Completed);
    assert_eq!(h.status(sender).await, RunStatus::Completed);

    common::wait_until("the waiter is Pending again", LONG, || {
        let h = h.clone();
        async move { h.status(waiter).await == RunStatus::Pending }
    })
    .await;
    let third = one_run(&h, &worker).await;
    assert_ran(&third, waiter, Outcome::Completed);
    assert_eq!(h.status(waiter).await, RunStatus::Completed);
    let steps = h.steps(waiter).await;
    let after = steps
        .iter()
        .find(|s| s.name == "after")
        .expect("the step after the wait");
    assert_eq!(
        after
            .output
            .as_ref()
            .and_then(|o| o["stdout"].as_str())
            .map(str::trim),
        Some("released by sender"),
        "the waiter received the sender's payload: {after:?}"
    );
}

/// A run timeout far shorter than the waits below: only time the runs executed counts toward it.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Waits for a human's answer (`ctx.human_input`), then one step.
struct Reviewed;

#[derive(Deserialize, JsonSchema)]
struct Review {
    ok: bool,
}

impl WorkflowHandler for Reviewed {
    fn name(&self) -> &str {
        "reviewed"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let review: Review = ctx
                .human_input("review", HumanInputConfig::new("Is it fine?"))
                .await?;
            ctx.shell("after", ShellConfig::new(&format!("echo {}", review.ok)))
                .await?;
            Ok(())
        })
    }
}

/// Sleeps 2 × [`TIMEOUT`] (`ctx.delay`), then one step.
struct Napper;

impl WorkflowHandler for Napper {
    fn name(&self) -> &str {
        "napper"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let nap = DelayConfig::from_secs(2 * TIMEOUT.as_secs());
            ctx.delay("nap", nap).await?;
            ctx.shell("after", ShellConfig::new("true")).await?;
            Ok(())
        })
    }
}

/// A worker of `h`'s API with the short run timeout and every workflow above.
fn short_timeout_worker(h: &Harness) -> LambdaWorker {
    h.builder()
        .run_timeout(TIMEOUT)
        .register(Waiter)
        .register(Sender)
        .register(Reviewed)
        .register(Napper)
        .build()
        .unwrap()
}

/// Wait until `run`'s step `step` has been open (waiting) longer than the run timeout.
async fn wait_past_the_timeout(h: &Arc<Harness>, run: uuid::Uuid, step: &'static str) {
    common::wait_until("the wait outlasts the run timeout", LONG, || {
        let h = h.clone();
        async move {
            h.steps(run).await.iter().any(|s| {
                s.name == step
                    && s.started_at.is_some_and(|at| {
                        (Utc::now() - at).to_std().unwrap_or_default() > TIMEOUT * 3 / 2
                    })
            })
        }
    })
    .await;
}

async fn a_run_waiting_on_a_signal_longer_than_its_run_timeout_completes(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let worker = short_timeout_worker(&h);
    let waiter = h.create("waiter", 0).await;
    assert_ran(&one_run(&h, &worker).await, waiter, Outcome::Suspended);
    wait_past_the_timeout(&h, waiter, "wait").await;

    let sender = h.create("sender", 0).await;
    assert_ran(&one_run(&h, &worker).await, sender, Outcome::Completed);
    common::wait_until("the waiter is Pending again", LONG, || {
        let h = h.clone();
        async move { h.status(waiter).await == RunStatus::Pending }
    })
    .await;

    assert_ran(&one_run(&h, &worker).await, waiter, Outcome::Completed);
    assert_eq!(h.status(waiter).await, RunStatus::Completed);
}

async fn a_run_waiting_on_a_human_input_longer_than_its_run_timeout_completes(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let worker = short_timeout_worker(&h);
    let id = h.create("reviewed", 0).await;
    assert_ran(&one_run(&h, &worker).await, id, Outcome::Suspended);
    assert_eq!(h.status(id).await, RunStatus::AwaitingApproval);
    wait_past_the_timeout(&h, id, "review").await;

    // The answer, as `POST /api/v1/runs/{id}/steps/{step_id}/submit` writes it (ironflow-api's
    // `submit_human_input`; the route needs a user's session, which the embedded API does not
    // hand out): the step completed with the answer, the run Pending for a worker.
    let review = h.steps(id).await.into_iter().find(|s| s.name == "review");
    let review = review.expect("the human input step");
    let answer = StepUpdate {
        status: Some(StepStatus::Completed),
        output: Some(serde_json::json!({"ok": true})),
        completed_at: Some(Utc::now()),
        clear_approval_deadline: true,
        ..StepUpdate::default()
    };
    let store = h.api.store();
    store.update_step(review.id, answer).await.unwrap();
    store
        .update_run_status(id, RunStatus::Pending)
        .await
        .unwrap();

    assert_ran(&one_run(&h, &worker).await, id, Outcome::Completed);
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

async fn a_run_sleeping_longer_than_its_run_timeout_completes(backend: Backend) {
    let h = Arc::new(Harness::start_on(backend).await);
    let worker = short_timeout_worker(&h);
    let id = h.create("napper", 0).await;
    assert_ran(&one_run(&h, &worker).await, id, Outcome::Suspended);
    assert_eq!(h.status(id).await, RunStatus::Sleeping);
    // The API's waker makes it Pending once its delay is over (it looks every 10 s).
    common::wait_until("the napper is Pending again", LONG, || {
        let h = h.clone();
        async move { h.status(id).await == RunStatus::Pending }
    })
    .await;

    assert_ran(&one_run(&h, &worker).await, id, Outcome::Completed);
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// Two shell steps, the first 2.5 s long, the second endless.
fn long_steps() -> ShellWorkflow {
    ShellWorkflow {
        name: "long-steps",
        steps: vec![("one", "sleep 2.5".into()), ("two", "sleep 60".into())],
    }
}

async fn a_run_executing_past_its_run_timeout_across_two_invocations_times_out(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let timeout = Duration::from_secs(4);
    let worker = h
        .builder()
        .run_timeout(timeout)
        .deadline_margin(Duration::from_millis(1500))
        .register(long_steps())
        .build()
        .unwrap();
    let id = h.create("long-steps", 0).await;

    // Cut at 3 s (1.5 s margin, for the handback's writes), under the 4 s timeout: handed back.
    let first = h.invoke(&worker, Duration::from_millis(4500)).await;
    assert_eq!(first.runs[0].outcome, Outcome::HandedBack, "{first:?}");
    let second = h.invoke(&worker, LONG).await;

    let report = &second.runs[0];
    assert_eq!(report.outcome, Outcome::TimedOut, "{second:?}");
    // What the first invocation executed counted: far less than a whole timeout was left.
    assert!(report.executed < timeout / 2, "{report:?}");
    let run = h.run(id).await;
    assert_eq!(run.status.state, RunStatus::Failed, "no retries left");
    assert!(run.error.unwrap_or_default().contains("timed out after 4s"));
}

on_both_stores!(
    a_run_waiting_on_a_signal_longer_than_its_run_timeout_completes,
    a_run_waiting_on_a_human_input_longer_than_its_run_timeout_completes,
    a_run_sleeping_longer_than_its_run_timeout_completes,
    a_run_executing_past_its_run_timeout_across_two_invocations_times_out,
);

/// One invocation claiming at most one run.
async fn one_run(h: &Harness, worker: &LambdaWorker) -> InvocationSummary {
    let event = serde_json::json!({"max_runs": 1});
    h.invoke_event(worker, event, common::deadline_in(LONG))
        .await
        .unwrap()
}

/// `summary` claimed `run` alone, which ended with `outcome`.
fn assert_ran(summary: &InvocationSummary, run: uuid::Uuid, outcome: Outcome) {
    assert_eq!(summary.runs.len(), 1, "{summary:?}");
    assert_eq!(summary.runs[0].run_id, run, "{summary:?}");
    assert_eq!(summary.runs[0].outcome, outcome, "{summary:?}");
}
