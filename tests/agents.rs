//! The example crate's AI patterns (examples/my-workflows/src/patterns, docs/agents.md) end to end
//! through the Lambda handler, on the real API and both of its stores, with the Bedrock provider
//! (`ironflow_lambda::BedrockProvider`, the real AWS SDK client) talking to the scripted model
//! server (`crates/model-server`): for each of the seven patterns the terminal state, the outputs
//! and the model calls counted per step, with handbacks forced by short invocations; an approval
//! given later than the run timeout; a throttled model ending in a sleep and a wake-up.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, Harness};
use ironflow_lambda::poison::now_ms;
use ironflow_lambda::{
    BedrockProvider, MemoryPoisonTable, Outcome, PoisonTable, poison::PoisonPolicy,
};
use ironflow_local_api::new_run;
use ironflow_model_server::{Match, ModelServer, Reply, Script};
use ironflow_store::entities::{RunStatus, StepKind, StepStatus};
use ironflow_store::store::RunStore;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long each model call takes (the server's latency).
const CALL: Duration = Duration::from_millis(300);

/// Each scripted step: its label, the text its prompt (the last user message) contains, the
/// model it is for (`None`: any), and its answer. A request is answered, and counted, by the
/// first row it matches.
fn rows() -> Vec<(&'static str, &'static str, Option<&'static str>, Reply)> {
    let tool = |tool: &str, argument: &str| {
        Reply::structured(json!({"kind": "tool", "tool": tool, "argument": argument}))
    };
    let answer = |text: &str| Reply::structured(json!({"kind": "answer", "text": text}));
    let ticket = json!({"customer": "Ada", "product": "router", "priority": 4, "summary": "Down."});
    vec![
        (
            "outline",
            "three-point outline",
            None,
            Reply::text("1. a 2. b 3. c"),
        ),
        (
            "draft",
            "article this outline describes",
            None,
            Reply::text("a long draft"),
        ),
        (
            "polish",
            "Tighten this article",
            None,
            Reply::text("a short article"),
        ),
        (
            "extract",
            "Extract the vendor",
            None,
            Reply::structured(json!({"vendor": "ACME", "total_cents": 1999, "due": "2026-12-31"})),
        ),
        (
            "confirm",
            "note to accounting",
            None,
            Reply::text("Pay ACME."),
        ),
        ("turn-3", "refunded", None, answer("A-200 refunded.")),
        ("turn-2", "delivered damaged", None, tool("refund", "A-200")),
        (
            "turn-1",
            "lookup_order",
            None,
            tool("lookup_order", "A-200"),
        ),
        ("weather-turn-3", "69.8 f", None, answer("Sunny, 69.8 F.")),
        (
            "weather-turn-2",
            "sunny, 21 c",
            None,
            tool("convert", "21 c"),
        ),
        (
            "weather-turn-1",
            "weather (argument",
            None,
            tool("weather", "Paris"),
        ),
        (
            "candidate:test.m-main",
            "Answer this question",
            Some("test.m-main"),
            Reply::text("answer of test.m-main"),
        ),
        (
            "candidate:test.m-second",
            "Answer this question",
            Some("test.m-second"),
            Reply::text("answer of test.m-second"),
        ),
        (
            "judge",
            "Which answer to the question",
            None,
            Reply::structured(json!({"best": 2, "reason": "clearer"})),
        ),
        (
            "classify:positive",
            "great value",
            None,
            Reply::structured(json!({"sentiment": "positive"})),
        ),
        (
            "classify:negative",
            "awful support",
            None,
            Reply::structured(json!({"sentiment": "negative"})),
        ),
        (
            "classify:neutral",
            "just fine ok",
            None,
            Reply::structured(json!({"sentiment": "neutral"})),
        ),
        ("ticket", "support ticket", None, Reply::structured(ticket)),
    ]
}

fn matcher(needle: &str, model: Option<&str>) -> Match {
    match model {
        Some(model) => Match::model(model).containing(needle),
        None => Match::any().containing(needle),
    }
}

/// The script: each row as a standing answer, `first` rules before them; strict, so that an
/// unforeseen prompt fails its step loudly.
fn script(first: Vec<(Match, Vec<Reply>)>) -> Script {
    let mut script = Script::new().strict().latency(CALL);
    for (when, replies) in first {
        script = script.on(when, replies);
    }
    for (_, needle, model, reply) in rows() {
        script = script.always(matcher(needle, model), reply);
    }
    script
}

/// The model server's calls so far, per step label (see [`rows`]).
fn counts(server: &ModelServer) -> BTreeMap<String, u32> {
    let rows = rows();
    let mut counts = BTreeMap::new();
    for r in server.requests() {
        let text = r.last_user_text();
        let row = rows.iter().find(|(_, needle, model, _)| {
            text.contains(needle) && model.is_none_or(|m| m == r.model)
        });
        let label = row.map_or("unscripted", |(label, ..)| label);
        *counts.entry(label.to_string()).or_default() += 1;
    }
    counts
}

/// The steps of a run completed at some point, and the model's calls per label then.
type Snapshot = (BTreeSet<String>, BTreeMap<String, u32>);

struct Setup {
    harness: Harness,
    server: ModelServer,
    poison: Arc<MemoryPoisonTable>,
    worker: ironflow_lambda::LambdaWorker,
    /// After each invocation: the steps completed then, and the calls per label then.
    snapshots: Mutex<Vec<Snapshot>>,
}

impl Setup {
    fn total(&self) -> u32 {
        u32::try_from(self.server.calls().total).unwrap()
    }

    fn count(&self, label: &str) -> u32 {
        counts(&self.server).get(label).copied().unwrap_or(0)
    }

    /// Remember which of `run`'s steps are completed, and the calls so far.
    async fn snapshot(&self, run: Uuid) {
        let completed = self
            .harness
            .steps(run)
            .await
            .into_iter()
            .filter(|r| r.status.state == StepStatus::Completed)
            .map(|r| r.name)
            .collect();
        let calls = counts(&self.server);
        self.snapshots.lock().unwrap().push((completed, calls));
    }
}

async fn setup(backend: Backend, run_timeout: Duration) -> Setup {
    setup_with(backend, run_timeout, Vec::new(), |p| p).await
}

/// The API on `backend`, the model server with `script` then the standing answers, and a worker
/// with the example's patterns on a Bedrock provider pointed at the server.
async fn setup_with(
    backend: Backend,
    run_timeout: Duration,
    first: Vec<(Match, Vec<Reply>)>,
    provider: impl FnOnce(BedrockProvider) -> BedrockProvider,
) -> Setup {
    let harness = Harness::start_on(backend).await;
    let server = ModelServer::start(script(first))
        .await
        .expect("model server");
    let aws = common::moto::aws_config_at(&server.url()).await;
    let poison = Arc::new(MemoryPoisonTable::new(PoisonPolicy::default()));
    let worker = my_workflows::patterns::register(
        harness
            .builder()
            .provider(Arc::new(provider(BedrockProvider::new(&aws))))
            .poison_table(poison.clone())
            .run_timeout(run_timeout),
    )
    .build()
    .expect("worker");
    Setup {
        harness,
        server,
        poison,
        worker,
        snapshots: Mutex::default(),
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

/// Invocations until the run leaves Pending/Running, the first with `time_left`, each next one
/// 400 ms longer (so that a loaded machine still makes progress): how many handed it back.
async fn drive(s: &Setup, run: Uuid, time_left: Duration) -> (RunStatus, u32) {
    let mut handbacks = 0;
    for i in 0..40 {
        let time_left = time_left + Duration::from_millis(400) * i;
        let summary = s.harness.invoke(&s.worker, time_left).await;
        s.snapshot(run).await;
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

/// Each step's model calls against its records: exactly one record completed; no call for it
/// once it completed (its calls when an invocation first saw it completed are its calls at the
/// end: later runs replay it from the store); at most one retake per handback (a step cut by a
/// handback leaves its record, and the next invocation makes its call once more). `steps`:
/// (label of [`rows`], step name).
async fn assert_calls_per_attempt(s: &Setup, run: Uuid, steps: &[(&str, &str)], handbacks: u32) {
    let records = s.harness.steps(run).await;
    let now = counts(&s.server);
    let snapshots = s.snapshots.lock().unwrap().clone();
    for (label, name) in steps {
        let mine: Vec<_> = records.iter().filter(|r| r.name == *name).collect();
        let completed = mine
            .iter()
            .filter(|r| r.status.state == StepStatus::Completed)
            .count();
        assert_eq!(completed, 1, "{name}: {mine:?}");
        let calls = now.get(*label).copied().unwrap_or(0);
        assert!(calls >= 1, "{name}: no call ({now:?})");
        let (_, then) = snapshots
            .iter()
            .find(|(done, _)| done.contains(*name))
            .unwrap_or_else(|| panic!("{name} never seen completed"));
        assert_eq!(
            then.get(*label).copied().unwrap_or(0),
            calls,
            "{name}: called again after it completed ({snapshots:?})"
        );
        assert!(
            mine.len() <= 1 + usize::try_from(handbacks).unwrap(),
            "{name}: {} attempts with {handbacks} handbacks, calls {now:?}",
            mine.len()
        );
    }
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
    let steps = [
        ("outline", "outline"),
        ("draft", "draft"),
        ("polish", "polish"),
    ];
    assert_calls_per_attempt(&s, run, &steps, handbacks).await;
    eprintln!(
        "prompt-chaining: {} calls for 3 needed, {handbacks} handbacks",
        s.total()
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
    s.harness.approve(run).await;
    let (state, handbacks) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(output["invoice"]["total_cents"], 1999);
    assert_eq!(output["confirmation"], "Pay ACME.");
    let calls = s.server.calls();
    assert_eq!(s.count("extract"), 1, "{calls:?}");
    assert_eq!(s.count("confirm"), 1, "{calls:?}");
    eprintln!(
        "human-review: {} calls for 2 needed, {handbacks} handbacks",
        s.total()
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
    // One gate is open, the one the approval votes on and the replay reads.
    let open: Vec<_> = s
        .harness
        .steps(run)
        .await
        .into_iter()
        .filter(|st| st.status.state == StepStatus::AwaitingApproval)
        .map(|st| (st.position, st.name, st.approvals.len()))
        .collect();
    assert_eq!(open, [(3, "approve-refund-2".to_string(), 0)], "{open:?}");
    s.harness.approve(run).await;
    let (state, after) = drive(&s, run, Duration::from_millis(1100)).await;
    let stored = s.harness.run(run).await;
    // On failure, every record with its state, votes and error.
    let steps: Vec<_> = s
        .harness
        .steps(run)
        .await
        .into_iter()
        .map(|st| {
            (
                st.position,
                st.name,
                st.status.state,
                st.approvals.len(),
                st.error,
            )
        })
        .collect();
    assert_eq!(state, RunStatus::Completed, "{:?} {steps:?}", stored.error);
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
    let turns = [
        ("turn-1", "turn-1"),
        ("turn-2", "turn-2"),
        ("turn-3", "turn-3"),
    ];
    assert_calls_per_attempt(&s, run, &turns, before + after).await;
    eprintln!(
        "durable-agent: {} calls for 3 needed, {} handbacks",
        s.total(),
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
    let turns = [
        ("weather-turn-1", "turn-1"),
        ("weather-turn-2", "turn-2"),
        ("weather-turn-3", "turn-3"),
    ];
    assert_calls_per_attempt(&s, run, &turns, handbacks).await;
    eprintln!(
        "agent-with-tools: {} calls for 3 needed, {handbacks} handbacks",
        s.total()
    );
}

/// `llm-as-judge`: two candidates from two models in one wave, then the judge.
async fn llm_as_judge_picks_a_candidate(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let input = json!({"question": "Why durable steps?", "model": "test.m-main", "second_model": "test.m-second"});
    let run = create(&s.harness, "llm-as-judge", input).await;
    let (state, handbacks) = drive(&s, run, Duration::from_millis(1100)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(
        output["answers"],
        json!(["answer of test.m-main", "answer of test.m-second"])
    );
    assert_eq!(output["model"], "test.m-second");
    let steps = [
        ("candidate:test.m-main", "candidate-main"),
        ("candidate:test.m-second", "candidate-second"),
        ("judge", "judge"),
    ];
    assert_calls_per_attempt(&s, run, &steps, handbacks).await;
    eprintln!(
        "llm-as-judge: {} calls for 3 needed, {handbacks} handbacks",
        s.total()
    );
}

/// `parallel-invocation`: one call per review, joined.
async fn parallel_invocation_classifies_each_review_once(backend: Backend) {
    let s = setup(backend, Duration::from_secs(60)).await;
    let reviews = json!({"reviews": ["great value", "awful support", "just fine ok"]});
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
    assert_eq!(s.total(), 3, "{:?}", s.server.calls());
    eprintln!("parallel-invocation: 3 calls for 3 needed, {handbacks} handbacks");
}

/// `structured-output`: an answer that fails its schema (priority 9 of at most 5) is the step's
/// retryable error: the step asks again and completes with the valid one.
async fn structured_output_asks_again_after_an_invalid_answer(backend: Backend) {
    let invalid =
        json!({"customer": "Ada", "product": "router", "priority": 9, "summary": "Down."});
    let first = vec![(
        Match::any().containing("support ticket"),
        vec![Reply::structured(invalid)],
    )];
    let s = setup_with(backend, Duration::from_secs(60), first, |p| p).await;
    let message = json!({"message": "Ada here: my router is down since this morning."});
    let run = create(&s.harness, "structured-output", message).await;
    let (state, handbacks) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    let output = stored.output.expect("an output");
    assert_eq!(output["priority"], 4);
    assert_eq!(output["customer"], "Ada");
    assert_eq!(s.count("ticket"), 2, "one invalid answer, one valid");
    eprintln!(
        "structured-output: 2 calls for 1 needed (one invalid answer), {handbacks} handbacks"
    );
}

/// A throttled model: the provider gives up at once (no retry window) and asks for a capacity
/// wait; the run sleeps, holds no invocation, is woken, and completes. Not a failure: no retry
/// spent, nothing counted by the poison pill.
async fn a_throttled_model_sleeps_and_wakes_up(backend: Backend) {
    let first = vec![(
        Match::any().containing("support ticket"),
        vec![Reply::throttle()],
    )];
    let s = setup_with(backend, Duration::from_secs(60), first, |p| {
        p.with_retry_window(Duration::ZERO)
            .with_capacity_pause(Duration::from_secs(1))
    })
    .await;
    let message = json!({"message": "Ada here: my router is down since this morning."});
    let run = create(&s.harness, "structured-output", message).await;
    let summary = s.harness.invoke(&s.worker, Duration::from_secs(5)).await;
    assert_eq!(summary.count(Outcome::Suspended), 1, "{summary:?}");
    assert_eq!(s.harness.status(run).await, RunStatus::Sleeping);
    // The API's waker makes it Pending once its wake time has passed (it looks every 10 s).
    let h = &s.harness;
    common::wait_until(
        "the throttled run is Pending again",
        Duration::from_secs(60),
        || async { h.status(run).await == RunStatus::Pending },
    )
    .await;
    let (state, _) = drive(&s, run, Duration::from_secs(5)).await;
    let stored = s.harness.run(run).await;
    assert_eq!(state, RunStatus::Completed, "{:?}", stored.error);
    assert_eq!(stored.retry_count, 0, "a capacity wait is no retry");
    assert_eq!(
        s.count("ticket"),
        2,
        "the throttled call, then the one after the wake-up"
    );
    let counter = s
        .poison
        .counter("structured-output", now_ms())
        .await
        .unwrap();
    assert!(
        counter.is_none_or(|c| c.consecutive_failures == 0),
        "{counter:?}"
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
    a_throttled_model_sleeps_and_wakes_up,
);
