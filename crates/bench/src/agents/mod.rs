//! The agent rows (issue 26, the `agents` subcommand): runs of three model calls against the scripted
//! model server (`ironflow-model-server`, Bedrock Converse), each call's latency drawn from a
//! stated distribution (uniform over [`AgentSettings::latency`], seeded), every latency and
//! the invocation's length multiplied by one time scale ([`AgentSettings::time_scale`]) so
//! that the section runs in minutes.
//!
//! - [`Drains`]: agent runs drained by ours and the reference worker on PostgreSQL over a 2 ms
//!   round trip (the production rows' delay proxy), as [`crate::production`] drains;
//! - [`cutoff::CutRow`]: K runs through several invocations at once (on-demand instances, one
//!   invocation each), cutoff-aware starts on and off: the calls cut at the cutoff and their
//!   tokens counted exactly at the model server (requests its client dropped before the
//!   answer), the handbacks and the budget they left unused;
//! - managed instances: one function process serving M invocations at once of agent runs,
//!   runs per second and memory ([`crate::managed`]'s fleet);
//! - the billed time per run of no-op and three-step shell runs, and the figures the dollars
//!   are computed from ([`cost`]).
//!
//! The section replaces its own part of `BENCHMARKS.md` ([`report::replace_section`]).

pub mod cost;
mod cutoff;
mod report;
pub mod workflow;

use std::time::Duration;

use ironflow_model_server::{Calls, Match, ModelServer, Reply, Script};

use crate::drain::{self, DrainResult, DrainSettings, Link, Which};
use crate::managed::{self, Job, ManagedDrain, ManagedSettings, Shape};
use crate::pickup::Rng;
use crate::workload::Workload;
use crate::{BenchError, Options};

pub use cutoff::CutRow;
pub use report::{keep_section, replace_section, section};

/// The agent rows' settings (`agents`; defaults in `cli.rs`).
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// Every model latency and the invocation's length are multiplied by this (so are the
    /// worker's deadline margin and minimum claim budget, which follow the invocation).
    pub time_scale: f64,
    /// A call's latency is drawn uniformly from this range, before scaling.
    pub latency: (Duration, Duration),
    /// Input and output tokens each call's answer reports (the script's usage).
    pub tokens: (u64, u64),
    /// The on-demand invocation's length before scaling (`Context.deadline` − start).
    pub invocation: Duration,
    /// The managed instances' invocation length before scaling (the template's default
    /// `FunctionTimeout`).
    pub managed_invocation: Duration,
    /// The seed of the latencies.
    pub seed: u64,
    /// K and C (= N) of the drains against the reference, and their rounds.
    pub drain_runs: usize,
    pub drain_concurrency: usize,
    pub drain_rounds: usize,
    /// The round trip of the drains' link, µs (2 ms: the production rows' 2 ms row).
    pub rtt_us: u64,
    /// K of each cutoff row, invocations at once, C (= N) per invocation.
    pub cut_runs: usize,
    pub cut_parallel: usize,
    pub cut_concurrency: usize,
    /// K of each managed-instances drain, the Ms, and C (= N) per invocation.
    pub managed_runs: usize,
    pub managed_ms: Vec<usize>,
    pub managed_concurrency: usize,
    /// K of the no-op and shell drains that measure the billed time per run.
    pub billed_runs: usize,
    /// The dollars' parameters.
    pub prices: cost::Prices,
}

impl AgentSettings {
    /// `d` scaled.
    pub fn scaled(&self, d: Duration) -> Duration {
        d.mul_f64(self.time_scale)
    }

    /// A scaled duration back in unscaled seconds.
    pub fn unscaled_secs(&self, d: Duration) -> f64 {
        d.as_secs_f64() / self.time_scale
    }

    /// The drain settings of the agent drains.
    fn drain_settings(&self, o: &Options, url: &str, runs: usize, c: usize) -> DrainSettings {
        DrainSettings {
            runs,
            concurrency: c,
            max_runs: c,
            invocation: self.scaled(self.invocation),
            model_endpoint: Some(url.to_string()),
            time_scale: self.time_scale,
            cutoff_aware: None,
            ..o.drain.clone()
        }
    }
}

/// A model server answering every call after a latency drawn from the stated distribution
/// (`calls` draws queued in arrival order, then the mean), with the stated usage.
fn model_server(a: &AgentSettings, calls: usize, seed: u64) -> Result<ModelServer, BenchError> {
    let mut rng = Rng::new(seed);
    let (low, high) = (a.scaled(a.latency.0), a.scaled(a.latency.1));
    let (input, output) = a.tokens;
    let answer = |delay| {
        Reply::text("a plan, an action, an answer")
            .with_usage(input, output)
            .delayed(delay)
    };
    let replies: Vec<Reply> = (0..calls).map(|_| answer(rng.between(low, high))).collect();
    let script = Script::new()
        .on(Match::any(), replies)
        .default_reply(answer((low + high) / 2));
    ModelServer::start_on_own_thread(script)
        .map_err(|e| BenchError::msg(format!("the model server: {e}")))
}

/// The agent drains against the reference, on PostgreSQL over the link.
#[derive(Debug, Default)]
pub struct Drains {
    /// Per worker, per round: the drain and the model server's counts.
    pub rows: Vec<(Which, DrainResult, Calls)>,
    pub skipped: Option<String>,
}

/// Everything the agent section measured.
#[derive(Debug, Default)]
pub struct Agents {
    pub drains: Drains,
    /// Cutoff-aware starts off, then on (on: `None` when the worker lacks the setting).
    pub cut: Vec<CutRow>,
    /// One process serving M invocations at once: agent runs at each M, no-op and shell
    /// runs at the first M.
    pub managed: Vec<ManagedRow>,
    /// No-op and three-step shell drains of ours and the reference on the same link, for the
    /// billed time per run and the reference's capacity.
    pub billed: Vec<(Workload, Which, DrainResult)>,
    /// The idle invocation's duration (median, ms), the receiver's stand-in.
    pub idle_invocation_ms: f64,
    /// Wall time of the whole section.
    pub elapsed: Duration,
}

/// Measure the agent section.
pub async fn measure(o: &Options) -> Result<Agents, BenchError> {
    let a = &o.agents;
    let began = std::time::Instant::now();
    // Each part boxed: their futures are deep (the compiler's layout query overflows).
    let drains = Box::pin(drains(o)).await?;
    let mut cut = Vec::new();
    for (i, aware) in [false, true].into_iter().enumerate() {
        let server = model_server(a, a.cut_runs * 4, a.seed ^ (0xC0 + i as u64))?;
        let row = Box::pin(cutoff::measure(a, &server, aware)).await?;
        eprintln!("agents: {}", row.line());
        cut.push(row);
    }
    let managed = Box::pin(managed_rows(o)).await?;
    let billed = Box::pin(billed_rows(o)).await?;
    let idle = Box::pin(crate::latency::idle(&o.drain, 50)).await?;
    Ok(Agents {
        drains,
        cut,
        managed,
        billed,
        idle_invocation_ms: crate::stats::median(&idle.warm_ms),
        elapsed: began.elapsed(),
    })
}

/// The agent drains of ours and the reference, `drain_rounds` rounds, each first in turn.
async fn drains(o: &Options) -> Result<Drains, BenchError> {
    let a = &o.agents;
    if o.drain.postgres.is_none() {
        return Ok(Drains {
            skipped: Some(
                "not measured: no PostgreSQL server (give --postgres-url, or set \
                 IRONFLOW_TEST_POSTGRES_URL)"
                    .into(),
            ),
            ..Drains::default()
        });
    }
    let mut rows = Vec::new();
    for round in 0..a.drain_rounds {
        let mut order = [Which::Reference, Which::Ours];
        if round % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let seed = a.seed ^ ((round as u64) << 8) ^ which as u64;
            let server = model_server(a, a.drain_runs * 4, seed)?;
            let s = a.drain_settings(o, &server.url(), a.drain_runs, a.drain_concurrency);
            let link = Link::Postgres { rtt_us: a.rtt_us };
            let r = Box::pin(drain::drain(which, Workload::Agent, &s, link)).await?;
            let calls = server.calls();
            eprintln!(
                "agents: drain round {}/{} {:<10} {:.3} s  {} invocations  {} calls ({} cut)",
                round + 1,
                a.drain_rounds,
                which.flag(),
                r.wall.as_secs_f64(),
                r.invocations,
                calls.total,
                calls.abandoned
            );
            rows.push((which, r, calls));
        }
    }
    Ok(Drains {
        rows,
        skipped: None,
    })
}

/// One managed-instances drain.
#[derive(Debug, Clone)]
pub struct ManagedRow {
    pub workload: Workload,
    /// M: invocations the one process serves at once.
    pub m: usize,
    /// C (= N) per invocation.
    pub concurrency: usize,
    pub drain: ManagedDrain,
    /// The model server's counts (agent rows).
    pub calls: Calls,
}

/// One process serving M invocations at once: agent runs at each M, then no-op and
/// three-step shell runs at the first M (at the drains' C and N, unscaled).
async fn managed_rows(o: &Options) -> Result<Vec<ManagedRow>, BenchError> {
    let a = &o.agents;
    let bench = std::env::current_exe()?;
    let mut rows = Vec::new();
    let first = a.managed_ms.first().copied().unwrap_or(16);
    let plain = Workload::ALL.into_iter().map(|w| (w, first));
    let agents = a.managed_ms.iter().map(|&m| (Workload::Agent, m));
    for (i, (workload, m)) in agents.chain(plain).enumerate() {
        let server = model_server(a, a.managed_runs * 4, a.seed ^ (0x400 + i as u64))?;
        let s = if workload == Workload::Agent {
            let mut s = a.drain_settings(o, &server.url(), a.managed_runs, a.managed_concurrency);
            s.invocation = a.scaled(a.managed_invocation);
            s
        } else {
            o.drain.clone()
        };
        let settings = ManagedSettings {
            max_concurrency: m,
            agent_runs: a.managed_runs,
            rounds: 1,
            enabled: true,
            ..o.managed.clone()
        };
        let job = Job::Bench(workload);
        let d = Box::pin(managed::drain(
            &bench,
            Shape::OneProcess,
            job,
            &s,
            &settings,
        ))
        .await?;
        let calls = server.calls();
        eprintln!(
            "agents: managed {} M = {m}: {:.3} s  {:.1} runs/s  peak RSS {:.1} MiB  {} calls ({} cut)",
            workload.name(),
            d.wall.as_secs_f64(),
            d.runs_per_s(),
            d.peak_rss_kib() as f64 / 1024.0,
            calls.total,
            calls.abandoned
        );
        rows.push(ManagedRow {
            workload,
            m,
            concurrency: s.concurrency,
            drain: d,
            calls,
        });
    }
    Ok(rows)
}

/// No-op and three-step shell drains of ours and the reference, on the agent drains' link
/// (in memory when no PostgreSQL server is given): the billed time per run.
async fn billed_rows(o: &Options) -> Result<Vec<(Workload, Which, DrainResult)>, BenchError> {
    let a = &o.agents;
    let link = match o.drain.postgres {
        Some(_) => Link::Postgres { rtt_us: a.rtt_us },
        None => Link::Loopback,
    };
    let s = DrainSettings {
        runs: a.billed_runs,
        ..o.drain.clone()
    };
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        for which in [Which::Reference, Which::Ours] {
            let r = Box::pin(drain::drain(which, workload, &s, link)).await?;
            eprintln!(
                "agents: billed {:<14} {:<10} {:.3} s  billed {:.1} ms in {} invocations",
                workload.name(),
                which.flag(),
                r.wall.as_secs_f64(),
                r.billed.as_secs_f64() * 1000.0,
                r.invocations
            );
            rows.push((workload, which, r));
        }
    }
    Ok(rows)
}
