//! The example crate's AI patterns (examples/my-workflows/src/patterns, docs/agents.md) end to end
//! through the Lambda handler, on the real API and both of its stores: the terminal state, the
//! outputs, and the model calls counted, with handbacks forced by short invocations and an
//! approval given later than the run timeout.
//!
//! The model is a scripted in-process provider ([`Scripted`]): its answers depend only on the
//! prompt, each call is counted by the step it belongs to, and each takes [`CALL`], so that a
//! short invocation ends in the middle of a run. (The Bedrock provider against the scripted
//! model server, `crates/model-server`, is not wired here yet.)

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, Harness};
use ironflow_core::error::AgentError;
use ironflow_core::provider::{AgentConfig, AgentOutput, AgentProvider, InvokeFuture};
use ironflow_lambda::Outcome;
use ironflow_local_api::new_run;
use ironflow_store::entities::{RunStatus, StepKind, StepStatus};
use ironflow_store::store::RunStore;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long each model call takes.
const CALL: Duration = Duration::from_millis(300);

/// Answers by the prompt's content; counts the calls per step (the answer's label).
#[derive(Default)]
struct Scripted {
    calls: Mutex<BTreeMap<&'static str, u32>>,
}

impl Scripted {
    fn answer(prompt: &str) -> (&'static str, Value) {
        let turn = |v: Value| v;
        if prompt.contains("three-point outline") {
            ("outline", json!("1. a 2. b 3. c"))
        } else if prompt.contains("article this outline describes") {
            ("draft", json!("a long draft"))
        } else if prompt.contains("Tighten this article") {
            ("polish", json!("a short article"))
        } else if prompt.contains("Extract the vendor") {
            (
                "extract",
                json!({"vendor": "ACME", "total_cents": 1999, "due": "2026-12-31"}),
            )
        } else if prompt.contains("note to accounting") {
            ("confirm", json!("Pay ACME."))
        } else if prompt.contains("refunded") {
            (
                "turn-3",
                turn(json!({"kind": "answer", "text": "A-200 refunded."})),
            )
        } else if prompt.contains("delivered damaged") {
            (
                "turn-2",
                turn(json!({"kind": "tool", "tool": "refund", "argument": "A-200"})),
            )
        } else if prompt.contains("lookup_order") {
            (
                "turn-1",
                turn(json!({"kind": "tool", "tool": "lookup_order", "argument": "A-200"})),
            )
        } else {
            ("unknown", json!("?"))
        }
    }

    fn calls(&self) -> BTreeMap<&'static str, u32> {
        self.calls.lock().unwrap().clone()
    }

    fn total(&self) -> u32 {
        self.calls().values().sum()
    }
}

impl AgentProvider for Scripted {
    fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
        Box::pin(async move {
            let (step, value) = Self::answer(&config.prompt);
            *self.calls.lock().unwrap().entry(step).or_default() += 1;
            tokio::time::sleep(CALL).await;
            if step == "unknown" {
                return Err(AgentError::Api {
                    status: Some(400),
                    message: format!("unscripted prompt: {}", config.prompt),
                    code: None,
                });
            }
            Ok(AgentOutput::new(value))
        })
    }
}

struct Setup {
    harness: Harness,
    model: Arc<Scripted>,
    worker: ironflow_lambda::LambdaWorker,
}

async fn setup(backend: Backend, run_timeout: Duration) -> Setup {
    let harness = Harness::start_on(backend).await;
    let model = Arc::new(Scripted::default());
    let worker = my_workflows::patterns::register(
        harness
            .builder()
            .provider(model.clone())
            .run_timeout(run_timeout),
    )
    .build()
    .expect("worker");
    Setup {
        harness,
        model,
        worker,
    }
}

async fn create(h: &Harness, workflow: &str, payload: Value) -> Uuid {
    let mut run = new_run(workflow, 2);
    run.payload = payload;
    h.client
        .create_run(run)
        .await
        .expect("create run")
        .into_run()
        .id
}

/// Invocations of `time_left` each until the run leaves Pending/Running: how many handed it back.
async fn drive(s: &Setup, run: Uuid, time_left: Duration) -> (RunStatus, u32) {
    let mut handbacks = 0;
    for _ in 0..40 {
        let summary = s.harness.invoke(&s.worker, time_left).await;
        let state = s.harness.status(run).await;
        if !matches!(state, RunStatus::Pending | RunStatus::Running) {
            return (state, handbacks);
        }
        if summary.count(Outcome::HandedBack) > 0 {
            handbacks += 1;
        }
    }
    panic!("run {run} not settled after 40 invocations");
}

async fn approve(h: &Harness, run: Uuid) {
    let answer = reqwest::Client::new()
        .post(format!("{}/api/v1/runs/{run}/approve", h.api.url()))
        .header("authorization", h.api.admin_bearer().await.unwrap())
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(
        answer.status().is_success(),
        "{}",
        answer.text().await.unwrap()
    );
}

/// `prompt-chaining` across handbacks: each completed step's call is never made again, an
/// interrupted one at most once more.
async fn prompt_chaining_survives_handbacks(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let run = create(&s.harness, "prompt-chaining", json!({"topic": "lambdas"})).await;
    // 1.1 s to the deadline, 0.5 s margin: about two 300 ms calls per invocation.
    let (state, handbacks) = drive(&s, run, Duration::from_millis(1100)).await;
    assert_eq!(state, RunStatus::Completed);
    let output = s.harness.run(run).await.output.expect("an output");
    assert_eq!(output["final"], "a short article", "{output}");
    assert_eq!(output["outline"], "1. a 2. b 3. c");
    assert!(handbacks >= 1, "the run was never handed back");
    let calls = s.model.calls();
    for step in ["outline", "draft", "polish"] {
        let n = calls.get(step).copied().unwrap_or(0);
        assert!((1..=2).contains(&n), "{step}: {n} calls, {calls:?}");
    }
    assert!(
        s.model.total() <= 3 + handbacks,
        "{calls:?} with {handbacks} handbacks"
    );
    eprintln!(
        "prompt-chaining: {} calls for 3 needed, {handbacks} handbacks",
        s.model.total()
    );
}

/// `human-review`: the run waits for its approval with no invocation holding it, past its run
/// timeout, and completes once approved without asking the model for `extract` again.
async fn human_review_completes_after_a_late_approval(backend: Backend) {
    let s = setup(backend, Duration::from_secs(2)).await;
    let document = "ACME invoice, 19.99 due 2026-12-31";
    let run = create(&s.harness, "human-review", json!({"document": document})).await;
    let (state, _) = drive(&s, run, Duration::from_secs(5)).await;
    assert_eq!(state, RunStatus::AwaitingApproval);
    let steps = s.harness.steps(run).await;
    assert!(
        steps
            .iter()
            .any(|st| st.kind == StepKind::Approval
                && st.status.state == StepStatus::AwaitingApproval)
    );
    // No invocation holds it: one more finds nothing to claim.
    let summary = s.harness.invoke(&s.worker, Duration::from_secs(2)).await;
    assert_eq!(summary.claimed, 0, "{summary:?}");
    // The approval comes later than the run timeout (2 s of executed time).
    tokio::time::sleep(Duration::from_secs(3)).await;
    approve(&s.harness, run).await;
    let (state, handbacks) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(output["invoice"]["total_cents"], 1999);
    assert_eq!(output["confirmation"], "Pay ACME.");
    let calls = s.model.calls();
    assert_eq!(calls.get("extract"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("confirm"), Some(&1), "{calls:?}");
    eprintln!(
        "human-review: {} calls for 2 needed, {handbacks} handbacks",
        s.model.total()
    );
}

/// `durable-agent`: three turns, the refund between turns two and three waiting for a human;
/// no turn is sent to the model twice across the suspension.
async fn durable_agent_waits_for_the_refund_approval_between_turns(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let request = "My order A-200 arrived broken, refund it.";
    let run = create(&s.harness, "durable-agent", json!({"request": request})).await;
    let (state, before) = drive(&s, run, Duration::from_millis(1100)).await;
    let steps = s.harness.steps(run).await;
    assert_eq!(
        state,
        RunStatus::AwaitingApproval,
        "{:?} {steps:?}",
        s.harness.run(run).await.error
    );
    let mut names: Vec<String> = s
        .harness
        .steps(run)
        .await
        .into_iter()
        .map(|st| st.name)
        .collect();
    // A step interrupted by a handback leaves a record before its retake.
    names.dedup();
    assert_eq!(
        names,
        ["turn-1", "tool-1", "turn-2", "approve-refund-2"],
        "{names:?}"
    );
    approve(&s.harness, run).await;
    let (state, after) = drive(&s, run, Duration::from_millis(1100)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    assert_eq!(
        stored.output,
        Some(json!({"answer": "A-200 refunded.", "turns": 3}))
    );
    let tool = s
        .harness
        .steps(run)
        .await
        .into_iter()
        .find(|st| st.name == "tool-2")
        .expect("the refund ran");
    assert_eq!(
        tool.output.as_ref().unwrap()["result"],
        "A-200: refunded 1999 cents"
    );
    let calls = s.model.calls();
    for turn in ["turn-1", "turn-2", "turn-3"] {
        let n = calls.get(turn).copied().unwrap_or(0);
        assert!((1..=2).contains(&n), "{turn}: {n}, {calls:?}");
    }
    assert!(s.model.total() <= 3 + before + after, "{calls:?}");
    eprintln!(
        "durable-agent: {} calls for 3 needed, {} handbacks",
        s.model.total(),
        before + after
    );
}

on_both_stores!(
    prompt_chaining_survives_handbacks,
    human_review_completes_after_a_late_approval,
    durable_agent_waits_for_the_refund_approval_between_turns,
);
