//! What a run costs, reported where operators look (docs/agents.md, "What a run costs"), and
//! throttled runs woken spread out (docs/agents.md, "Throttled runs"): through the Lambda handler
//! on the real API (both stores), with the Bedrock provider (the real AWS SDK client) talking to
//! the scripted model server, whose scripted usage and recorded requests give the exact counts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use common::{Backend, Harness};
use ironflow_core::provider::AgentConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::{BedrockProvider, LambdaWorker, Outcome, metrics, wake_ups::CapacitySpread};
use ironflow_model_server::{Match, ModelServer, Reply, Script};
use ironflow_store::entities::RunStatus;

/// A model of the price table: $0.80 per million input tokens, $3.20 per million output.
const NOVA: &str = "us.amazon.nova-pro-v1:0";
/// The usage each answered call reports, and what it costs on Nova: $0.0016.
const IN: u64 = 1000;
const OUT: u64 = 250;
const CALL_USD: f64 = 0.0016;
/// The prompt of the call the first invocation cuts.
const SLOW_PROMPT: &str = "Second: write the slow part, at length, with every detail.";

/// Three agent steps on Nova, the run's cost capped at `cap` dollars when set.
struct ThreeCalls {
    cap: Option<&'static str>,
}

impl WorkflowHandler for ThreeCalls {
    fn name(&self) -> &str {
        "three-calls"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            if let Some(cap) = self.cap {
                ctx.set_max_cost_usd(Some(cap.parse().expect("a decimal")));
            }
            for prompt in ["First: a quick part.", SLOW_PROMPT, "Third: the end."] {
                let name = prompt.split(':').next().unwrap_or("step").to_lowercase();
                ctx.agent(&name, AgentConfig::new(prompt).model(NOVA))
                    .await?;
            }
            Ok(())
        })
    }
}

/// The model server: every call answered at once with [`IN`]/[`OUT`] tokens, but the first call
/// of the second step, which takes 60 s (the invocation's cutoff cuts it).
async fn server() -> ModelServer {
    let answer = Reply::text("done").with_usage(IN, OUT);
    let script = Script::new()
        .on(
            Match::any().containing("Second:"),
            [answer.clone().delayed(Duration::from_secs(60))],
        )
        .always(Match::any(), answer);
    ModelServer::start(script).await.expect("model server")
}

async fn bedrock(server: &ModelServer) -> BedrockProvider {
    let aws = common::moto::aws_config_at(&server.url()).await;
    BedrockProvider::new(&aws)
}

async fn worker(h: &Harness, server: &ModelServer, cap: Option<&'static str>) -> LambdaWorker {
    h.builder()
        .provider(Arc::new(bedrock(server).await))
        .register(ThreeCalls { cap })
        .build()
        .expect("worker")
}

fn assert_usd(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() < 1e-9, "{what}: {got} for {want}");
}

/// An invocation whose cutoff cuts the second step's call: the summary (per run and in all)
/// and the EMF document carry the recorded tokens and cost of the first step, the cut step,
/// and the cut call as an estimate from what the model server received.
async fn tokens_cost_and_a_cut_call_reach_the_summary_and_the_metrics(backend: Backend) {
    let collector = metrics::install("ironflow-lambda-test", "fn").expect("first recorder");
    let h = Harness::start_on(backend).await;
    let server = server().await;
    let worker = worker(&h, &server, None).await;
    let run = h.create("three-calls", 0).await;

    let summary = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(summary.count(Outcome::HandedBack), 1, "{summary:?}");
    let received = server
        .requests()
        .into_iter()
        .find(|r| r.last_user_text().contains("Second:"))
        .expect("the cut call reached the server");
    let chars = u64::try_from(received.last_user_text().chars().count()).unwrap();
    assert_eq!(
        received.system(),
        None,
        "the prompt is all the request's text"
    );
    let spend = summary.runs[0].spend;
    assert_eq!(
        (spend.input_tokens, spend.output_tokens),
        (IN, OUT),
        "{spend:?}"
    );
    assert_usd(spend.cost_usd, CALL_USD, "the first step's cost");
    assert_eq!((spend.steps_cut, spend.calls_cut), (1, 1), "{spend:?}");
    assert_eq!(spend.estimated_input_tokens, chars.div_ceil(4), "{spend:?}");
    assert_eq!(
        summary.spend, spend,
        "one run: the invocation's figures are its"
    );
    let json = serde_json::to_value(&summary).unwrap();
    for field in [
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "estimated_input_tokens",
    ] {
        assert_eq!(json["runs"][0][field], json[field], "{field} in {json}");
    }
    assert_eq!(json["estimated_input_tokens"], chars.div_ceil(4));

    let emf = common::Emf::flush(collector);
    let (find, text) = (|name: &str| emf.find(name), &emf.text);
    assert_eq!(find("InputTokens")["InputTokens"], IN);
    assert_eq!(find("OutputTokens")["OutputTokens"], OUT);
    assert_eq!(find("StepsCutAtCutoff")["StepsCutAtCutoff"], 1);
    assert_usd(
        find("CostUsd")["CostUsd"][0].as_f64().unwrap(),
        CALL_USD,
        "CostUsd",
    );
    for name in ["InputTokens", "OutputTokens", "CostUsd", "StepsCutAtCutoff"] {
        assert_eq!(find(name)["workflow"], "three-calls", "{text}");
    }
    assert_ne!(h.status(run).await, RunStatus::Completed);
}

/// A run capped at $0.0025 (one call's $0.0016 fits, two do not): the first invocation spends
/// on the first step and is cut in the second, the next one completes the second step and the
/// cap, counting the first invocation's spend, stops the run before the third. Each summary
/// reports its own invocation's spend; the run's carries both.
async fn the_cost_cap_counts_the_spend_of_earlier_invocations(backend: Backend) {
    let h = Harness::start_on(backend).await;
    let server = server().await;
    let worker = worker(&h, &server, Some("0.0025")).await;
    let run = h.create("three-calls", 0).await;

    let first = h.invoke(&worker, Duration::from_secs(4)).await;
    assert_eq!(first.count(Outcome::HandedBack), 1, "{first:?}");
    assert_usd(first.spend.cost_usd, CALL_USD, "the first invocation");
    // A handback the loaded machine could not write leaves the run to the reaper: claimable
    // again once its lease expired.
    common::wait_until(
        "the run is Pending again",
        Duration::from_secs(60),
        || async { h.status(run).await == RunStatus::Pending },
    )
    .await;
    let second = h.invoke(&worker, Duration::from_secs(10)).await;
    let stored = h.run(run).await;
    assert_eq!(stored.status.state, RunStatus::Cancelled, "{stored:?}");
    let error = stored.error.unwrap_or_default();
    assert!(error.contains("0.0025"), "the cap stopped it: {error}");
    assert_usd(second.spend.cost_usd, CALL_USD, "the second invocation");
    assert_eq!(
        stored.cost_usd.to_string().parse::<f64>().unwrap(),
        2.0 * CALL_USD
    );
    let third = server
        .requests()
        .iter()
        .filter(|r| r.last_user_text().contains("Third:"))
        .count();
    assert_eq!(third, 0, "the third step never called the model");
    assert_eq!(
        server.calls().total,
        3,
        "first, the cut second, the second again"
    );
}

/// Runs throttled together are put to sleep with wake times spread over the window (20 s
/// here), each by its run id's offset, not all within one second of each other.
async fn runs_throttled_together_are_woken_spread_out(backend: Backend) {
    const N: usize = 8;
    let h = Harness::start_on(backend).await;
    let server = ModelServer::start(Script::new().always(Match::any(), Reply::throttle()))
        .await
        .expect("model server");
    let provider = bedrock(&server)
        .await
        .with_retry_window(Duration::ZERO)
        .with_capacity_pause(Duration::from_secs(1));
    let window = Duration::from_secs(20);
    let worker = h
        .builder()
        .provider(Arc::new(provider))
        .register(ThreeCalls { cap: None })
        .max_runs_per_invocation(N)
        .concurrency(N)
        .capacity_spread(window, window)
        .build()
        .expect("worker");
    let mut runs = Vec::new();
    for _ in 0..N {
        runs.push(h.create("three-calls", 0).await);
    }
    let before = Utc::now();
    let summary = h.invoke(&worker, Duration::from_secs(30)).await;
    let after = Utc::now();
    assert_eq!(summary.count(Outcome::Suspended), N, "{summary:?}");
    let spread = CapacitySpread {
        spread: window,
        max: window,
    };
    let mut seconds = std::collections::BTreeSet::new();
    for id in runs {
        let run = h.run(id).await;
        assert_eq!(run.status.state, RunStatus::Sleeping);
        let at = run.scheduled_at.expect("a wake time");
        let offset = spread.offset(id, Duration::from_secs(1));
        let unspread = at - TimeDelta::from_std(offset).unwrap();
        // The provider's wake time: its 1 s pause, plus up to a quarter of jitter.
        assert!(
            unspread >= before + TimeDelta::seconds(1)
                && unspread <= after + TimeDelta::milliseconds(1250),
            "{id}: {at} is not its offset {offset:?} after the provider's wake time"
        );
        seconds.insert(at.timestamp());
    }
    assert!(
        seconds.len() > 1,
        "all {N} woken within the same second: {seconds:?}"
    );
}

on_both_stores!(
    tokens_cost_and_a_cut_call_reach_the_summary_and_the_metrics,
    the_cost_cap_counts_the_spend_of_earlier_invocations,
    runs_throttled_together_are_woken_spread_out,
);
