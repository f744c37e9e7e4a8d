//! Model calls cut at the cutoff: K agent runs through `cut_parallel` on-demand instances
//! side by side (each its own worker, one invocation at a time, back to back), each
//! invocation claiming C (= N) runs with the scaled 60 s deadline, cutoff-aware starts on or
//! off. The model server counts the calls whose client dropped them before the answer (a
//! step cut at the cutoff) and the tokens those answers would have cost; the summaries give
//! the handbacks and how much of the invocation each left unused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ironflow_lambda::{InvocationSummary, LambdaWorkerBuilder, Outcome};
use ironflow_local_api::{Backend, LocalApi, new_run};
use ironflow_model_server::{Calls, ModelServer};
use ironflow_store::entities::RunStatus;
use ironflow_store::store::Store;
use tokio::time::Instant;
use uuid::Uuid;

use super::AgentSettings;
use crate::BenchError;
use crate::drain::{API_THREADS, DrainSettings, billed_ms, invoke};
use crate::workload::Workload;

/// Longest a cutoff row may take: past it the instances stop, and the row reports the runs
/// that completed.
const ROW_LIMIT: Duration = Duration::from_secs(600);

/// One cutoff row.
#[derive(Debug, Clone)]
pub struct CutRow {
    /// Cutoff-aware starts on.
    pub aware: bool,
    /// K.
    pub runs: usize,
    /// Runs that ended completed.
    pub completed: usize,
    /// The model server's counts: every call, answered, abandoned (cut) and their tokens.
    pub calls: Calls,
    /// Invocations, and those that claimed nothing.
    pub invocations: usize,
    pub empty_invocations: usize,
    /// Runs handed back (at the cutoff, or before it by a deferred start) or released (by the
    /// claim window: their first step would not fit).
    pub handbacks: usize,
    /// Handbacks that left more than [`EARLY`] of the invocation unused before its cutoff:
    /// starts deferred (none without cutoff-aware starts, whose handbacks come at the cutoff).
    pub early_handbacks: usize,
    /// Summed over handbacks: the time from the handback (the run's `updated_at` in the
    /// store, read as the invocation returns) to the invocation's cutoff (scaled): the budget
    /// a deferred start left unused.
    pub unused_before_cutoff: Duration,
    /// The billed durations of the invocations that claimed a run, summed (scaled). Those
    /// that claimed nothing are left out: they are this row's instances polling while the
    /// other instances hold every run, which a deployed fleet, woken by pushes, does not do.
    pub billed: Duration,
    /// Per run, the time it executed over all its invocations, summed (scaled): what one
    /// invocation per run would bill, less the invocations' own overhead.
    pub executed: Duration,
    /// From the first invocation until every run ended (scaled).
    pub wall: Duration,
}

/// A handback more than this share of the invocation before its cutoff is a deferred start.
pub const EARLY: f64 = 0.02;

impl CutRow {
    /// Calls cut at the cutoff, as a share of every call.
    pub fn cut_share(&self) -> f64 {
        self.calls.abandoned as f64 / self.calls.total.max(1) as f64
    }

    pub fn line(&self) -> String {
        format!(
            "cutoff-aware {}: {} runs, {} completed, {} calls, {} cut ({:.2} %), {} + {} tokens \
             wasted, {} invocations ({} empty), {} handbacks ({} early), {:.3} s wall",
            if self.aware { "on" } else { "off" },
            self.runs,
            self.completed,
            self.calls.total,
            self.calls.abandoned,
            100.0 * self.cut_share(),
            self.calls.abandoned_tokens.input,
            self.calls.abandoned_tokens.output,
            self.invocations,
            self.empty_invocations,
            self.handbacks,
            self.early_handbacks,
            self.wall.as_secs_f64(),
        )
    }
}

/// What every instance's invocations added up to.
#[derive(Debug, Default)]
struct Tally {
    invocations: usize,
    empty: usize,
    handbacks: usize,
    early: usize,
    unused: Duration,
    billed: Duration,
    executed: Duration,
}

impl Tally {
    /// Add one invocation of `length` whose cutoff was at `cutoff_us` (µs since the epoch),
    /// its handed-back runs' handback moments read from `store`.
    async fn add(
        &mut self,
        summary: &InvocationSummary,
        length: Duration,
        cutoff_us: u64,
        store: &Arc<dyn Store>,
    ) -> Result<(), BenchError> {
        self.invocations += 1;
        if summary.claimed == 0 {
            self.empty += 1;
        }
        for run in &summary.runs {
            self.executed += run.executed;
            // A release is the claim window's deferral: a run claimed whose first step would
            // not fit.
            if !matches!(run.outcome, Outcome::HandedBack | Outcome::Released) {
                continue;
            }
            self.handbacks += 1;
            let Some(back) = store.get_run(run.run_id).await? else {
                continue;
            };
            let back_us = u64::try_from(back.updated_at.timestamp_micros()).unwrap_or(0);
            let left = Duration::from_micros(cutoff_us.saturating_sub(back_us));
            if left.as_secs_f64() > EARLY * length.as_secs_f64() {
                self.early += 1;
            }
            self.unused += left;
        }
        Ok(())
    }

    fn merge(&mut self, other: Tally) {
        self.invocations += other.invocations;
        self.empty += other.empty;
        self.handbacks += other.handbacks;
        self.early += other.early;
        self.unused += other.unused;
        self.billed += other.billed;
        self.executed += other.executed;
    }
}

/// One cutoff row against `server`.
pub async fn measure(
    a: &AgentSettings,
    server: &ModelServer,
    aware: bool,
) -> Result<CutRow, BenchError> {
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start_apart(&token, &Backend::Memory, API_THREADS).await?;
    let mut ids = Vec::with_capacity(a.cut_runs);
    for _ in 0..a.cut_runs {
        let run = api
            .store()
            .create_run(new_run(Workload::Agent.name(), 0))
            .await?;
        ids.push(run.into_run().id);
    }
    let s = DrainSettings {
        runs: a.cut_runs,
        concurrency: a.cut_concurrency,
        max_runs: a.cut_concurrency,
        invocation: a.scaled(a.invocation),
        poll_interval: Duration::from_millis(100),
        postgres: None,
        model_endpoint: Some(server.url()),
        time_scale: a.time_scale,
        cutoff_aware: Some(aware),
    };
    let finished = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    // The runs that ended, from the store (the summaries' outcomes miss a run the reaper
    // requeued, or one ended by another path).
    let watcher = tokio::spawn(watch(api.store().clone(), ids.clone(), finished.clone()));
    let mut instances = tokio::task::JoinSet::new();
    for i in 0..a.cut_parallel {
        let builder = LambdaWorkerBuilder::new(&api.url(), &token)
            .provider(s.provider())
            .concurrency(s.concurrency)
            .max_runs_per_invocation(s.max_runs)
            .function_timeout(s.invocation)
            .worker_id_prefix(&format!("bench-cut-{i}"));
        let worker = Arc::new(s.scaled(Workload::Agent.register_ours(builder)).build()?);
        let (s, finished, store) = (s.clone(), finished.clone(), api.store().clone());
        instances.spawn(async move { instance(worker, &s, &finished, &store, start).await });
    }
    let mut tally = Tally::default();
    while let Some(done) = instances.join_next().await {
        tally.merge(done??);
    }
    watcher.abort();
    let wall = start.elapsed();
    let mut completed = 0;
    for id in &ids {
        let state = api.store().get_run(*id).await?.map(|r| r.status.state);
        match state {
            Some(RunStatus::Completed) => completed += 1,
            other => eprintln!("agents: cutoff row: run {id} ended as {other:?}"),
        }
    }
    // Every call has ended (answered or dropped) once every invocation has returned.
    Ok(CutRow {
        aware,
        runs: a.cut_runs,
        completed,
        calls: server.calls(),
        invocations: tally.invocations,
        empty_invocations: tally.empty,
        handbacks: tally.handbacks,
        early_handbacks: tally.early,
        unused_before_cutoff: tally.unused,
        billed: tally.billed,
        executed: tally.executed,
        wall,
    })
}

/// Counts into `finished` the runs of `ids` that are terminal in `store`, every 200 ms,
/// until all are.
async fn watch(store: Arc<dyn Store>, ids: Vec<Uuid>, finished: Arc<AtomicUsize>) {
    loop {
        let mut ended = 0;
        for id in &ids {
            if let Ok(Some(run)) = store.get_run(*id).await
                && run.status.state.is_terminal()
            {
                ended += 1;
            }
        }
        finished.store(ended, Ordering::SeqCst);
        if ended == ids.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One instance: invocations back to back until every run has ended in one of them (a
/// short pause after one that claimed nothing: the rest are held by other instances).
async fn instance(
    worker: Arc<ironflow_lambda::LambdaWorker>,
    s: &DrainSettings,
    finished: &AtomicUsize,
    store: &Arc<dyn Store>,
    start: Instant,
) -> Result<Tally, BenchError> {
    let (margin, _) = s.scaled_margins();
    let length_us = u64::try_from(s.invocation.as_micros()).unwrap_or(u64::MAX);
    let margin_us = u64::try_from(margin.as_micros()).unwrap_or(u64::MAX);
    let mut tally = Tally::default();
    let mut n = 0;
    while finished.load(Ordering::SeqCst) < s.runs {
        if start.elapsed() > ROW_LIMIT {
            eprintln!("agents: cutoff row: stopped after {ROW_LIMIT:?}, runs left unfinished");
            break;
        }
        n += 1;
        let began = Instant::now();
        // The deadline `invoke` gives, within a few µs.
        let cutoff_us = (crate::epoch_us() + length_us).saturating_sub(margin_us);
        // Boxed: the invocation's future is deep (the compiler's layout query overflows).
        let summary = Box::pin(invoke(&worker, n, s.invocation)).await?;
        if summary.claimed > 0 {
            tally.billed += billed_ms(began.elapsed());
        }
        tally.add(&summary, s.invocation, cutoff_us, store).await?;
        if summary.claimed == 0 {
            if tally.empty % 200 == 199 {
                eprintln!(
                    "agents: cutoff row: {} of {} runs ended after {:.1} s",
                    finished.load(Ordering::SeqCst),
                    s.runs,
                    start.elapsed().as_secs_f64()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{AgentSettings, cost::Prices, model_server};

    /// A few runs at the smallest time scale: the row's invariants, not its figures.
    fn smoke() -> AgentSettings {
        AgentSettings {
            time_scale: 0.05,
            // 0.1–1 s a call, scaled: a run fits an invocation or two.
            latency: (Duration::from_secs(2), Duration::from_secs(20)),
            tokens: (20, 5),
            invocation: Duration::from_secs(60),
            managed_invocation: Duration::from_secs(900),
            seed: 7,
            drain_runs: 0,
            drain_concurrency: 1,
            drain_rounds: 0,
            rtt_us: 0,
            cut_runs: 6,
            cut_parallel: 2,
            cut_concurrency: 3,
            managed_runs: 0,
            managed_ms: Vec::new(),
            managed_concurrency: 1,
            billed_runs: 0,
            prices: Prices::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_call_is_counted_answered_or_cut_with_its_tokens_and_every_run_completes() {
        let a = smoke();
        for aware in [false, true] {
            let server = model_server(&a, 64, 1).expect("the model server starts");
            let row = measure(&a, &server, aware).await.expect("the row runs");
            assert_eq!(row.completed, a.cut_runs, "{}", row.line());
            let c = &row.calls;
            assert_eq!(c.answered + c.abandoned, c.total, "{}", row.line());
            // Three answered calls per completed run at least; every answer's usage is exact.
            assert!(c.answered >= 3 * a.cut_runs as u64, "{}", row.line());
            assert_eq!(c.answered_tokens.input, c.answered * a.tokens.0);
            assert_eq!(c.abandoned_tokens.output, c.abandoned * a.tokens.1);
            assert!(row.early_handbacks <= row.handbacks);
            assert!(row.billed > Duration::ZERO && row.invocations > 0);
        }
    }
}
