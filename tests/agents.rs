//! The example crate's AI patterns (examples/my-workflows/src/patterns, docs/agents.md) end to end
//! through the Lambda handler, on the real API and both of its stores: the terminal state, the
//! outputs, and the model calls counted, for each of the seven patterns, with handbacks forced
//! by short invocations and an approval given later than the run timeout.
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

/// Answers by the prompt's content (and model); counts the calls per step (the answer's label).
/// The first `structured-output` answer fails its schema, as the provider's validator would say.
#[derive(Default)]
struct Scripted {
    calls: Mutex<BTreeMap<String, u32>>,
}

/// A sentiment by a review's words.
fn sentiment(prompt: &str) -> &'static str {
    if prompt.contains("great") {
        "positive"
    } else if prompt.contains("awful") {
        "negative"
    } else {
        "neutral"
    }
}

impl Scripted {
    fn answer(config: &AgentConfig) -> (String, Value) {
        let prompt = config.prompt.as_str();
        let tool = |tool: &str, argument: &str| json!({"kind": "tool", "tool": tool, "argument": argument});
        let (label, value) = if prompt.contains("three-point outline") {
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
                json!({"kind": "answer", "text": "A-200 refunded."}),
            )
        } else if prompt.contains("delivered damaged") {
            ("turn-2", tool("refund", "A-200"))
        } else if prompt.contains("lookup_order") {
            ("turn-1", tool("lookup_order", "A-200"))
        } else if prompt.contains("69.8 f") {
            (
                "weather-turn-3",
                json!({"kind": "answer", "text": "Sunny, 69.8 F."}),
            )
        } else if prompt.contains("sunny, 21 c") {
            ("weather-turn-2", tool("convert", "21 c"))
        } else if prompt.contains("weather (argument") {
            ("weather-turn-1", tool("weather", "Paris"))
        } else if prompt.contains("Answer this question") {
            let label = format!("candidate:{}", config.model);
            let answer = json!(format!("answer of {}", config.model));
            return (label, answer);
        } else if prompt.contains("Which answer to the question") {
            ("judge", json!({"best": 2, "reason": "clearer"}))
        } else if prompt.contains("Classify the sentiment") {
            let label = sentiment(prompt);
            return (format!("classify:{label}"), json!({"sentiment": label}));
        } else if prompt.contains("support ticket") {
            let ticket = json!({"customer": "Ada", "product": "router", "priority": 4, "summary": "It is down."});
            ("ticket", ticket)
        } else {
            ("unknown", json!("?"))
        };
        (label.to_string(), value)
    }

    fn calls(&self) -> BTreeMap<String, u32> {
        self.calls.lock().unwrap().clone()
    }

    fn count(&self, label: &str) -> u32 {
        self.calls().get(label).copied().unwrap_or(0)
    }

    fn total(&self) -> u32 {
        self.calls().values().sum()
    }
}

impl AgentProvider for Scripted {
    fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
        Box::pin(async move {
            let (label, value) = Self::answer(config);
            let calls = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(label.clone()).or_default();
                *n += 1;
                *n
            };
            tokio::time::sleep(CALL).await;
            if label == "unknown" {
                return Err(AgentError::Api {
                    status: Some(400),
                    message: format!("unscripted prompt: {}", config.prompt),
                    code: None,
                });
            }
            if label == "ticket" && calls == 1 {
                return Err(AgentError::SchemaValidation {
                    expected: "priority of at most 5".into(),
                    got: "9".into(),
                    debug_messages: Vec::new(),
                    partial_usage: Box::default(),
                    raw_response: None,
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
        let n = s.model.count(step);
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
    assert_eq!(s.model.count("extract"), 1, "{calls:?}");
    assert_eq!(s.model.count("confirm"), 1, "{calls:?}");
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
        let n = s.model.count(turn);
        assert!((1..=2).contains(&n), "{turn}: {n}, {calls:?}");
    }
    assert!(s.model.total() <= 3 + before + after, "{calls:?}");
    eprintln!(
        "durable-agent: {} calls for 3 needed, {} handbacks",
        s.model.total(),
        before + after
    );
}

/// `agent-with-tools`: three turns and two tool steps across handbacks.
async fn agent_with_tools_answers_after_two_tools(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let question = "What is the weather in Paris, in Fahrenheit?";
    let run = create(
        &s.harness,
        "agent-with-tools",
        json!({"question": question}),
    )
    .await;
    let (state, handbacks) = drive(&s, run, Duration::from_millis(1100)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    assert_eq!(
        stored.output,
        Some(json!({"answer": "Sunny, 69.8 F.", "turns": 3}))
    );
    let calls = s.model.calls();
    for turn in ["weather-turn-1", "weather-turn-2", "weather-turn-3"] {
        let n = s.model.count(turn);
        assert!((1..=2).contains(&n), "{turn}: {n}, {calls:?}");
    }
    assert!(s.model.total() <= 3 + handbacks, "{calls:?}");
    eprintln!(
        "agent-with-tools: {} calls for 3 needed, {handbacks} handbacks",
        s.model.total()
    );
}

/// `llm-as-judge`: two candidates from two models in one wave, then the judge.
async fn llm_as_judge_picks_a_candidate(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let input =
        json!({"question": "Why durable steps?", "model": "m-main", "second_model": "m-second"});
    let run = create(&s.harness, "llm-as-judge", input).await;
    let (state, handbacks) = drive(&s, run, Duration::from_millis(1100)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(
        output["answers"],
        json!(["answer of m-main", "answer of m-second"])
    );
    assert_eq!(output["model"], "m-second");
    let calls = s.model.calls();
    for label in ["candidate:m-main", "candidate:m-second", "judge"] {
        let n = s.model.count(label);
        assert!((1..=2).contains(&n), "{label}: {n}, {calls:?}");
    }
    assert!(s.model.total() <= 3 + 2 * handbacks, "{calls:?}");
    eprintln!(
        "llm-as-judge: {} calls for 3 needed, {handbacks} handbacks",
        s.model.total()
    );
}

/// `parallel-invocation`: one call per review, joined.
async fn parallel_invocation_classifies_each_review_once(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let reviews = json!({"reviews": ["great value", "awful support", "fine"]});
    let run = create(&s.harness, "parallel-invocation", reviews).await;
    let (state, handbacks) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    assert_eq!(
        stored.output,
        Some(json!({
            "labels": ["positive", "negative", "neutral"],
            "counts": {"positive": 1, "neutral": 1, "negative": 1},
        }))
    );
    assert_eq!(s.model.total(), 3, "{:?}", s.model.calls());
    eprintln!("parallel-invocation: 3 calls for 3 needed, {handbacks} handbacks");
}

/// `structured-output`: an answer that fails its schema is asked again, within the step.
async fn structured_output_asks_again_after_an_invalid_answer(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let message = json!({"message": "Ada here: my router is down since this morning."});
    let run = create(&s.harness, "structured-output", message).await;
    let (state, handbacks) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(output["priority"], 4);
    assert_eq!(output["customer"], "Ada");
    assert_eq!(s.model.count("ticket"), 2, "one invalid answer, one valid");
    eprintln!(
        "structured-output: 2 calls for 1 needed (one invalid answer), {handbacks} handbacks"
    );
}

on_both_stores!(
    prompt_chaining_survives_handbacks,
    human_review_completes_after_a_late_approval,
    durable_agent_waits_for_the_refund_approval_between_turns,
    agent_with_tools_answers_after_two_tools,
    llm_as_judge_picks_a_candidate,
    parallel_invocation_classifies_each_review_once,
    structured_output_asks_again_after_an_invalid_answer,
);
