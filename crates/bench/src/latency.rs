//! Invocation latencies through the Lambda handler (`ironflow_lambda::handle_summary`), against the
//! embedded API on loopback: an idle invocation (nothing pending), and the deadline precision
//! of invocations whose runs outlast their deadline.

use std::sync::Arc;
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_lambda::Outcome;
use ironflow_local_api::{LocalApi, new_run};
use lambda_runtime::Context;
use tokio::time::Instant;
use uuid::Uuid;

use crate::BenchError;
use crate::drain::{DrainSettings, invoke, invoke_with};
use crate::workload::Workload;

/// Idle invocations, in milliseconds each.
#[derive(Debug, Clone)]
pub struct Idle {
    /// Back to back: the pooled connections are reused as they are.
    pub warm_ms: Vec<f64>,
    /// Each one as after an idle gap longer than the pool's probe threshold
    /// (`idle_probe_after(0)`): `2 × C + 2` probes of the pooled connections first.
    pub after_gap_ms: Vec<f64>,
    /// HTTP requests per warm idle invocation.
    pub warm_requests: f64,
    /// HTTP requests per idle invocation after a gap.
    pub after_gap_requests: f64,
}

/// `count` idle invocations (nothing pending) of each kind, after a few unmeasured ones.
pub async fn idle(s: &DrainSettings, count: usize) -> Result<Idle, BenchError> {
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start(&token).await?;
    let mut out = Idle {
        warm_ms: Vec::new(),
        after_gap_ms: Vec::new(),
        warm_requests: 0.0,
        after_gap_requests: 0.0,
    };
    for after_gap in [false, true] {
        let mut builder = LambdaWorkerBuilder::new(&api.url(), &token)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .concurrency(s.concurrency)
            .max_runs_per_invocation(s.max_runs)
            .function_timeout(s.invocation);
        if after_gap {
            builder = builder.idle_probe_after(Duration::ZERO);
        }
        let worker = Arc::new(Workload::NoOp.register_ours(builder).build()?);
        for n in 0..5 {
            invoke(&worker, n, s.invocation).await?;
        }
        let before = api.requests();
        let mut times = Vec::with_capacity(count);
        for n in 0..count {
            let start = Instant::now();
            let summary = invoke(&worker, n, s.invocation).await?;
            times.push(ms(start.elapsed()));
            if summary.claimed != 0 || !summary.errors.is_empty() {
                return Err(BenchError::msg(format!(
                    "an idle invocation claimed {} runs, errors {:?}",
                    summary.claimed, summary.errors
                )));
            }
        }
        let per = (api.requests() - before) as f64 / count as f64;
        if after_gap {
            (out.after_gap_ms, out.after_gap_requests) = (times, per);
        } else {
            (out.warm_ms, out.warm_requests) = (times, per);
        }
    }
    Ok(out)
}

/// A run whose one step sleeps far longer than any invocation: it is handed back every time.
struct Sleeper;

const SLEEPER: &str = "bench-sleeper";

impl WorkflowHandler for Sleeper {
    fn name(&self) -> &str {
        SLEEPER
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("long", ShellConfig::new("sleep 600")).await?;
            Ok(())
        })
    }
}

/// The settings of the deadline-precision invocations.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineSettings {
    /// Time from an invocation's start to its deadline.
    pub invocation: Duration,
    /// `IRONFLOW_DEADLINE_MARGIN_MS`: the cutoff is this long before the deadline.
    pub margin: Duration,
    /// Runs executing (and handed back) in each invocation.
    pub runs: usize,
}

/// What the deadline-precision invocations measured.
#[derive(Debug, Clone)]
pub struct DeadlinePrecision {
    pub settings: DeadlineSettings,
    pub invocations: usize,
    /// Per invocation: time left before the deadline when the handler returned, in ms.
    pub time_left_ms: Vec<f64>,
    /// Per handed-back run: from the cutoff to the API storing the run back as Pending, in ms
    /// (the store's `updated_at` of that write against `deadline − margin`, both wall clock).
    pub handback_ms: Vec<f64>,
}

/// `invocations` invocations whose `s.runs` runs (one `sleep 600` step each) outlast them.
pub async fn deadline_precision(
    s: DeadlineSettings,
    invocations: usize,
) -> Result<DeadlinePrecision, BenchError> {
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start(&token).await?;
    let builder = LambdaWorkerBuilder::new(&api.url(), &token)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(Sleeper)
        .concurrency(s.runs)
        .max_runs_per_invocation(s.runs)
        .function_timeout(s.invocation)
        .deadline_margin(s.margin)
        .min_claim_budget(Duration::from_millis(300))
        .lease_ttl(Duration::from_secs(30))
        .lease_refresh_interval(Duration::from_secs(1))
        // The same runs are handed back again and again: keep the loop guard out of the way.
        .max_handbacks_without_progress(u32::MAX);
    let worker = Arc::new(builder.build()?);
    let mut ids = Vec::new();
    for _ in 0..s.runs {
        ids.push(
            api.store()
                .create_run(new_run(SLEEPER, 0))
                .await?
                .into_run()
                .id,
        );
    }
    let mut out = DeadlinePrecision {
        settings: s,
        invocations,
        time_left_ms: Vec::new(),
        handback_ms: Vec::new(),
    };
    for n in 0..invocations {
        let mut context = Context::default();
        context.request_id = format!("bench-deadline-{n}");
        let deadline_ms = ironflow_lambda::poison::now_ms() + s.invocation.as_millis() as u64;
        context.deadline = deadline_ms;
        let summary = invoke_with(&worker, context).await?;
        let returned_us = crate::epoch_us();
        out.time_left_ms
            .push((deadline_ms as f64 * 1000.0 - returned_us as f64) / 1000.0);
        let cutoff_us = (deadline_ms * 1000) as f64 - s.margin.as_micros() as f64;
        for report in &summary.runs {
            if report.outcome != Outcome::HandedBack || report.error.is_some() {
                return Err(BenchError::msg(format!(
                    "run {} was not handed back cleanly: {:?} {:?}",
                    report.run_id, report.outcome, report.error
                )));
            }
            let run = api
                .store()
                .get_run(report.run_id)
                .await?
                .ok_or_else(|| BenchError::msg("handed-back run vanished"))?;
            let written_us = run.updated_at.timestamp_micros() as f64;
            out.handback_ms.push((written_us - cutoff_us) / 1000.0);
        }
        if summary.runs.len() != s.runs {
            return Err(BenchError::msg(format!(
                "invocation {n} claimed {} runs instead of {}",
                summary.runs.len(),
                s.runs
            )));
        }
    }
    Ok(out)
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
