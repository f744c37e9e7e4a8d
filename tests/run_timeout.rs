//! The run timeout and an operator's pause (docs/design.md, "The run timeout across
//! invocations"), against the real ironflow API on both of its stores: the time a run stays
//! Paused is a wait, not executed time, whether the pause stopped the execution between two
//! steps or after it had started another step on its last view of the run.
//!
//! The workflow: a step `a`, then workflow code that waits outside any step until the test
//! creates the file `go`, then a step `b` (which sleeps 30 s unless the file `resumed` exists,
//! so that it is still running when its execution is stopped the first time, and ends at once
//! after the resume), then `c`. Each test pauses the run for longer than its run timeout, then
//! resumes it: it must complete.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Backend, Harness, wait_until};
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::Outcome;
use ironflow_store::entities::{RunStatus, StepStatus};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;

const LONG: Duration = Duration::from_secs(60);

/// See the module docs.
struct WaitsForGo {
    go: PathBuf,
    b: String,
}

impl WaitsForGo {
    fn new(h: &Harness) -> Self {
        let resumed = h.path("resumed");
        Self {
            go: h.path("go"),
            b: format!("test -f '{}' || sleep 30", resumed.display()),
        }
    }
}

impl WorkflowHandler for WaitsForGo {
    fn name(&self) -> &str {
        "waits-for-go"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("a", ShellConfig::new("true")).await?;
            while !self.go.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ctx.shell("b", ShellConfig::new(&self.b)).await?;
            ctx.shell("c", ShellConfig::new("true")).await?;
            Ok(())
        })
    }
}

/// Whether step `name` of the run is in `state`.
async fn step_is(h: &Harness, id: uuid::Uuid, name: &str, state: StepStatus) -> bool {
    h.steps(id)
        .await
        .iter()
        .any(|s| s.name == name && s.status.state == state)
}

/// Paused while its workflow code waited between `a` and `b`: the refresher sees the pause
/// (every 200 ms here) and stops the execution with no step running. The invocation records
/// when the run began to wait; 8 s Paused against a 6 s timeout must not time it out.
async fn a_pause_between_two_steps_does_not_count_toward_the_run_timeout(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let workflow = WaitsForGo::new(&h);
    let go = workflow.go.clone();
    let worker = h
        .builder()
        .register(workflow)
        .run_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let invocation = {
        let (h, worker) = (&h, &worker);
        async move { h.invoke(worker, LONG).await }
    };
    let pause = async {
        wait_until("step a completed", LONG, || {
            step_is(&h, id, "a", StepStatus::Completed)
        })
        .await;
        h.api.pause_run(id).await.unwrap();
    };
    let (summary, ()) = tokio::join!(invocation, pause);
    assert_eq!(summary.count(Outcome::Suspended), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Paused);
    let marked = h.steps(id).await.iter().any(|s| {
        s.debug_messages
            .as_ref()
            .is_some_and(|m| m.to_string().contains("ironflow_lambda_handed_back_at"))
    });
    assert!(marked, "the wait's start recorded: {:?}", h.steps(id).await);

    // Paused longer than the whole timeout.
    tokio::time::sleep(Duration::from_secs(8)).await;
    std::fs::write(&go, "").unwrap();
    std::fs::write(h.path("resumed"), "").unwrap();
    h.api.resume_run(id).await.unwrap();
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// Paused between `a` and `b`, and `go` created at once: the engine's check before `b` reads
/// the run from what its execution knows (the claim's copy, fresh for one refresh interval:
/// 5 s here), so it starts `b`; the refresher then sees the pause and stops the execution with
/// `b` running. The invocation marks `b` interrupted at once (the API's pause could not: `b`
/// started after it); 8 s Paused against a 10 s timeout, with about 5 s executed before it,
/// must not time it out.
async fn a_step_started_after_the_pause_is_interrupted_when_the_pause_is_seen(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let workflow = WaitsForGo::new(&h);
    let go = workflow.go.clone();
    let worker = h
        .builder()
        .register(workflow)
        .lease_ttl(Duration::from_secs(20))
        .lease_refresh_interval(Duration::from_secs(5))
        .run_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let invocation = {
        let (h, worker) = (&h, &worker);
        async move { h.invoke(worker, LONG).await }
    };
    let pause = async {
        wait_until("step a completed", LONG, || {
            step_is(&h, id, "a", StepStatus::Completed)
        })
        .await;
        h.api.pause_run(id).await.unwrap();
        std::fs::write(&go, "").unwrap();
    };
    let (summary, ()) = tokio::join!(invocation, pause);
    assert_eq!(summary.count(Outcome::Suspended), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Paused);
    let steps = h.steps(id).await;
    let b: Vec<_> = steps.iter().filter(|s| s.name == "b").collect();
    assert!(
        !b.is_empty()
            && b.iter().all(|s| s.status.state == StepStatus::Failed
                && s.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)),
        "b started on the stale view, then interrupted by the invocation: {steps:?}"
    );

    tokio::time::sleep(Duration::from_secs(8)).await;
    std::fs::write(h.path("resumed"), "").unwrap();
    h.api.resume_run(id).await.unwrap();
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

on_both_stores!(
    a_pause_between_two_steps_does_not_count_toward_the_run_timeout,
    a_step_started_after_the_pause_is_interrupted_when_the_pause_is_seen,
);
