//! Signals between runs: `ctx.send_signal` in a run our worker executes is delivered by the API
//! (`POST /api/v1/internal/signals`), which stores it and wakes the waiting runs back to
//! Pending, where the next invocation claims them, as with the reference worker. Nothing is
//! resumed in the Lambda process itself, outside an invocation's slots and leases.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Harness;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_engine::signal::{SentSignals, Signal};
use ironflow_lambda::InvocationSummary;
use ironflow_lambda::LambdaWorker;
use ironflow_lambda::Outcome;
use ironflow_store::entities::RunStatus;
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
