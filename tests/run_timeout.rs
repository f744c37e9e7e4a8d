//! The run timeout's waits (docs/design.md, "The run timeout across invocations"), against the
//! real ironflow API on both of its stores: the time a run stays Paused is a wait, not executed
//! time, whether the pause stopped the execution between two steps or after it had started
//! another step on its last view of the run; so is the time a decision escalated to a human
//! waits for its answer, and the time a sub-workflow waits for a human, for the run that
//! entered it.
//!
//! The pause's workflow: a step `a`, then workflow code that waits outside any step until the test
//! creates the file `go`, then a step `b` (which sleeps 30 s unless the file `resumed` exists,
//! so that it is still running when its execution is stopped the first time, and ends at once
//! after the resume), then `c`. Each test pauses the run for longer than its run timeout, then
//! resumes it: it must complete.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::{Backend, Harness, wait_until};
use ironflow_core::decision::{DecisionAnswer, DecisionOutput, DecisionUsage, NoulAnswer};
use ironflow_core::providers::record_replay_decision::{
    RecordReplayDecisionProvider, hash_request,
};
use ironflow_engine::config::{DecisionConfig, HumanInputConfig, ShellConfig};
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::decision::DecisionAnswers;
use ironflow_engine::handler::{HandlerFuture, TypedWorkflow, WorkflowHandler};
use ironflow_lambda::{LambdaWorker, LambdaWorkerBuilder, Outcome};
use ironflow_store::entities::{RunStatus, StepKind, StepStatus, StepUpdate};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use serde_json::json;

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

/// One invocation of `worker` with `time_left`, during which run `id` is paused as soon as its
/// step `step` is in `state`, `go` created right after the pause when given: the invocation
/// must report the run Suspended and leave it Paused.
async fn invoke_and_pause(
    h: &Harness,
    worker: &LambdaWorker,
    id: uuid::Uuid,
    time_left: Duration,
    (step, state): (&str, StepStatus),
    go: Option<&Path>,
) {
    let pause = async {
        wait_until("the step to pause at", LONG, || step_is(h, id, step, state)).await;
        h.api.pause_run(id).await.unwrap();
        if let Some(go) = go {
            std::fs::write(go, "").unwrap();
        }
    };
    let (summary, ()) = tokio::join!(h.invoke(worker, time_left), pause);
    assert_eq!(summary.count(Outcome::Suspended), 1, "{summary:?}");
    assert_eq!(h.status(id).await, RunStatus::Paused);
}

/// After `paused_for`, let the workflow go on and `b` end at once, resume run `id` and invoke
/// `worker`: the run must complete.
async fn resume_and_complete(
    h: &Harness,
    worker: &LambdaWorker,
    id: uuid::Uuid,
    paused_for: Duration,
) {
    tokio::time::sleep(paused_for).await;
    std::fs::write(h.path("go"), "").unwrap();
    std::fs::write(h.path("resumed"), "").unwrap();
    h.api.resume_run(id).await.unwrap();
    let last = h.invoke(worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

/// A builder of a worker of `waits-for-go` with run timeout `timeout` and, when given, lease
/// refreshes every `refresh` (its TTL three times that; the harness's 200 ms otherwise).
fn waits_for_go(h: &Harness, refresh: Option<Duration>, timeout: Duration) -> LambdaWorkerBuilder {
    let builder = h
        .builder()
        .register(WaitsForGo::new(h))
        .run_timeout(timeout);
    match refresh {
        Some(refresh) => builder
            .lease_ttl(refresh * 3)
            .lease_refresh_interval(refresh),
        None => builder,
    }
}

/// Paused while its workflow code waited between `a` and `b`: the refresher sees the pause
/// (every 200 ms here) and stops the execution with no step running. The invocation records
/// when the run began to wait; 8 s Paused against a 6 s timeout must not time it out.
async fn a_pause_between_two_steps_does_not_count_toward_the_run_timeout(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = waits_for_go(&h, None, Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let after_a = ("a", StepStatus::Completed);
    invoke_and_pause(&h, &worker, id, LONG, after_a, None).await;
    let marked = h.steps(id).await.iter().any(|s| {
        s.debug_messages
            .as_ref()
            .is_some_and(|m| m.to_string().contains("ironflow_lambda_handed_back_at"))
    });
    assert!(marked, "the wait's start recorded: {:?}", h.steps(id).await);
    // Paused longer than the whole timeout.
    resume_and_complete(&h, &worker, id, Duration::from_secs(8)).await;
}

/// Paused between `a` and `b`, and `go` created at once: the engine's check before `b` reads
/// the run from what its execution knows (the claim's copy, fresh for one refresh interval:
/// 5 s here), so it starts `b`; the refresher then sees the pause and stops the execution with
/// `b` running. The invocation marks `b` interrupted at once (the API's pause could not: `b`
/// started after it); 8 s Paused against a 10 s timeout, with about 5 s executed before it,
/// must not time it out.
async fn a_step_started_after_the_pause_is_interrupted_when_the_pause_is_seen(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = waits_for_go(&h, Some(Duration::from_secs(5)), Duration::from_secs(10))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let after_a = ("a", StepStatus::Completed);
    invoke_and_pause(&h, &worker, id, LONG, after_a, Some(&h.path("go"))).await;
    assert_interrupted_by_the_invocation(&h.steps(id).await);
    resume_and_complete(&h, &worker, id, Duration::from_secs(8)).await;
}

/// Paused between `a` and `b` as above, with `go` created at once, but the invocation's cutoff
/// comes before the refresher's first renewal (every 15 s here, 4 s invocations): the pause is
/// met first by the handback, whose lease confirmation the API refuses. `b`, started on the
/// stale view, must be interrupted all the same, the run reported Suspended (not a lost lease),
/// and 8 s Paused against a 10 s timeout must not time it out.
async fn a_pause_met_first_at_the_cutoff_is_a_wait(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = waits_for_go(&h, Some(Duration::from_secs(15)), Duration::from_secs(10))
        .cutoff_aware_starts(false)
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let (after_a, go) = (("a", StepStatus::Completed), h.path("go"));
    invoke_and_pause(&h, &worker, id, Duration::from_secs(4), after_a, Some(&go)).await;
    assert_interrupted_by_the_invocation(&h.steps(id).await);
    resume_and_complete(&h, &worker, id, Duration::from_secs(8)).await;
}

/// The same pause met first by the run deadline (3 s): the engine writes no failure to a paused
/// run, so the run is reported Suspended, not TimedOut, and `b` is interrupted.
async fn a_pause_met_first_at_the_run_deadline_is_reported_and_interrupts_the_step(
    backend: Backend,
) {
    let h = Harness::start_on(backend).await;
    let worker = waits_for_go(&h, Some(Duration::from_secs(15)), Duration::from_secs(3))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let after_a = ("a", StepStatus::Completed);
    invoke_and_pause(&h, &worker, id, LONG, after_a, Some(&h.path("go"))).await;
    assert_interrupted_by_the_invocation(&h.steps(id).await);
}

/// `b` was started after the pause, then interrupted by the invocation (its "paused" mark).
fn assert_interrupted_by_the_invocation(steps: &[ironflow_store::entities::Step]) {
    let b: Vec<_> = steps.iter().filter(|s| s.name == "b").collect();
    assert!(
        !b.is_empty()
            && b.iter().all(|s| s.status.state == StepStatus::Failed
                && s.error.as_deref() == Some(STEP_INTERRUPTED_ERROR)
                && s.debug_messages
                    .as_ref()
                    .is_some_and(|m| m.to_string().contains("\"paused\""))),
        "{steps:?}"
    );
}

/// The common pause: `b` running when the operator pauses, interrupted by the API's pause,
/// whose interruption begins the wait. The refresher sees the pause about 4 s after the claim;
/// the invocation's record of the wait must begin at the API's interruption, not then: after
/// the resume `b` takes 2 s, 2.3 s executed in all against a 5 s timeout (6 s if the time to
/// the pause's sight counted).
async fn a_pause_during_a_step_waits_from_the_api_s_interruption(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let resumed = h.path("resumed");
    let workflow = WaitsForGo {
        go: h.path("go"),
        b: format!(
            "if test -f '{}'; then sleep 2; else sleep 30; fi",
            resumed.display()
        ),
    };
    std::fs::write(&workflow.go, "").unwrap();
    let worker = h
        .builder()
        .register(workflow)
        .lease_ttl(Duration::from_secs(12))
        .lease_refresh_interval(Duration::from_secs(4))
        .run_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let id = h.create("waits-for-go", 0).await;
    let b_running = ("b", StepStatus::Running);
    invoke_and_pause(&h, &worker, id, LONG, b_running, None).await;
    resume_and_complete(&h, &worker, id, Duration::from_secs(5)).await;
}

/// The answers of the decision below.
#[derive(DecisionAnswers)]
struct Urgency {
    #[noul("Does this convey urgency?")]
    urgent: f64,
}

/// The decision's config: escalated to a human when its confidence is below 0.7.
fn urgency() -> DecisionConfig<Urgency> {
    DecisionConfig::new("Payouts fail since 3 days")
        .answers::<Urgency>()
        .escalate_below(0.7)
}

/// A step `a`, the decision `urgency`, a step `c` that records its answer.
struct Triage;

impl WorkflowHandler for Triage {
    fn name(&self) -> &str {
        "triage"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("a", ShellConfig::new("true")).await?;
            let answer = ctx.decision("urgency", urgency()).await?;
            let record = format!("echo {}", answer.urgent);
            ctx.shell("c", ShellConfig::new(&record)).await?;
            Ok(())
        })
    }
}

/// A decision escalated to a human (its model's answer, replayed by ironflow-core's
/// `RecordReplayDecisionProvider` from a fixture written here: "urgent" at 0.6, a confidence of
/// 0.2) waits with no invocation holding the run; answered 8 s later, past the 6 s timeout,
/// the run must complete. The engine leaves the step AwaitingApproval and completes it only at
/// the replay after the answer: without the decision's own reading, its whole interval counted.
async fn a_decision_escalated_to_a_human_does_not_count_its_wait_toward_the_run_timeout(
    backend: Backend,
) {
    let h = Harness::start_on(backend).await;
    let fixtures = h.path("decisions");
    std::fs::create_dir_all(&fixtures).unwrap();
    let request = urgency().to_request();
    let output = DecisionOutput {
        model: None,
        answers: BTreeMap::from([(
            "urgent".to_string(),
            DecisionAnswer::Noul(NoulAnswer { noul: 0.6 }),
        )]),
        usage: DecisionUsage::default(),
    };
    let fixture = json!({ "request": request, "output": output });
    let file = fixtures.join(format!("{}.json", hash_request(&request)));
    std::fs::write(&file, fixture.to_string()).unwrap();
    let provider = RecordReplayDecisionProvider::replay(fixtures.to_str().unwrap());
    let worker = h
        .builder()
        .register(Triage)
        .decision_provider(Arc::new(provider))
        .run_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let id = h.create("triage", 0).await;

    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    assert_eq!(h.status(id).await, RunStatus::AwaitingApproval);
    let steps = h.steps(id).await;
    assert!(
        steps.iter().any(|s| s.kind == StepKind::Decision
            && s.status.state == StepStatus::AwaitingApproval),
        "{steps:?}"
    );

    tokio::time::sleep(Duration::from_secs(8)).await;
    h.approve(id).await;
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
    let steps = h.steps(id).await;
    let decision = steps.iter().find(|s| s.kind == StepKind::Decision);
    assert!(
        decision
            .is_some_and(|d| d.status.state == StepStatus::Completed && !d.approvals.is_empty()),
        "completed by the replay, with the human's vote: {steps:?}"
    );
}

/// A human's answer.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Review {
    ok: bool,
}

/// A sub-workflow: a step, a human input, a step.
struct Reviewed;

impl WorkflowHandler for Reviewed {
    fn name(&self) -> &str {
        "reviewed"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("x", ShellConfig::new("true")).await?;
            let review: Review = ctx
                .human_input("review", HumanInputConfig::new("Is it fine?"))
                .await?;
            ctx.shell("y", ShellConfig::new(&format!("echo {}", review.ok)))
                .await?;
            Ok(())
        })
    }
}

impl TypedWorkflow for Reviewed {
    type Input = serde_json::Value;
}

/// A step, the sub-workflow `reviewed`, then 2 s of `c`.
struct EntersReviewed;

impl WorkflowHandler for EntersReviewed {
    fn name(&self) -> &str {
        "enters-reviewed"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("a", ShellConfig::new("true")).await?;
            ctx.workflow(&Reviewed, json!({})).await?;
            ctx.shell("c", ShellConfig::new("sleep 2")).await?;
            Ok(())
        })
    }
}

/// The child waits for a human 8 s, past the parent's 4 s timeout; once answered, the parent
/// goes on within the child's invocation and is handed back during `c` (a 1.5 s invocation),
/// so that the next invocation claims the parent itself and reads its time from its steps,
/// where the child's wait is one `workflow` step: it must read the child's steps too, and
/// complete the run.
async fn a_sub_workflow_s_wait_does_not_count_toward_its_parent_s_run_timeout(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let worker = h
        .builder()
        .run_timeout(Duration::from_secs(4))
        .register(EntersReviewed)
        .register(Reviewed)
        .build()
        .unwrap();
    let id = h.create("enters-reviewed", 0).await;
    let first = h.invoke(&worker, LONG).await;
    assert_eq!(first.count(Outcome::Suspended), 1, "{first:?}");
    let steps = h.steps(id).await;
    let entered = steps.iter().find(|s| s.kind == StepKind::Workflow);
    let child: uuid::Uuid = entered
        .and_then(|s| s.output.as_ref()?["child_run_id"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("the workflow step names its child: {steps:?}"));
    assert_eq!(h.status(child).await, RunStatus::AwaitingApproval);

    tokio::time::sleep(Duration::from_secs(8)).await;
    // The answer, as the human-input route writes it (tests/signals.rs says why by hand).
    let review = h
        .steps(child)
        .await
        .into_iter()
        .find(|s| s.name == "review");
    let answer = StepUpdate {
        status: Some(StepStatus::Completed),
        output: Some(json!({"ok": true})),
        completed_at: Some(Utc::now()),
        clear_approval_deadline: true,
        ..StepUpdate::default()
    };
    let store = h.api.store();
    store
        .update_step(review.expect("the human input").id, answer)
        .await
        .unwrap();
    store
        .update_run_status(child, RunStatus::Pending)
        .await
        .unwrap();

    let cut = h.invoke(&worker, Duration::from_millis(1500)).await;
    assert_eq!(cut.count(Outcome::HandedBack), 1, "{cut:?}");
    assert_eq!(h.status(id).await, RunStatus::Pending);
    let last = h.invoke(&worker, LONG).await;
    assert_eq!(last.runs[0].run_id, id, "{last:?}");
    assert_eq!(last.count(Outcome::Completed), 1, "{last:?}");
    assert_eq!(h.status(id).await, RunStatus::Completed);
}

on_both_stores!(
    a_pause_between_two_steps_does_not_count_toward_the_run_timeout,
    a_step_started_after_the_pause_is_interrupted_when_the_pause_is_seen,
    a_pause_met_first_at_the_cutoff_is_a_wait,
    a_pause_met_first_at_the_run_deadline_is_reported_and_interrupts_the_step,
    a_pause_during_a_step_waits_from_the_api_s_interruption,
    a_decision_escalated_to_a_human_does_not_count_its_wait_toward_the_run_timeout,
    a_sub_workflow_s_wait_does_not_count_toward_its_parent_s_run_timeout,
);
