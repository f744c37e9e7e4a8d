//! Lambda Managed Instances (issue 19): one execution environment (one process) serving M
//! invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY=M`, lambda_runtime's `run_concurrent`)
//! against M processes serving one each (the variable unset, as on classic Lambda), draining
//! the same backlog at the same C and N per invocation.
//!
//! Each process is this bench binary started again in function mode ([`FUNCTION_MODE`]:
//! `ironflow_lambda::run` with the bench's workloads registered, the entry point the
//! deployable `ironflow-lambda` binary calls with its sample workflows, which do not include
//! them), against its own endpoint of a stand-in for the Lambda Runtime API ([`crate::runtime_api`]) and
//! the embedded API on its in-memory store. The drain's clock starts once every process waits
//! on its poll loops and stops when the invocations' answers have reported the end of every
//! run (no watcher polling the store); the store is checked afterwards. Peak RSS is each
//! process's `VmHWM` (`/proc/<pid>/status`) at the end, summed.

mod fleet;
mod report;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_local_api::{Backend, LocalApi, new_run};
use ironflow_store::entities::RunStatus;
use uuid::Uuid;

use crate::drain::{API_THREADS, DrainSettings};
use crate::runtime_api::{Dispatcher, Slots, Tally};
use crate::usage::Usage;
use crate::workload::Workload;
use crate::{BenchError, Options};
use fleet::Fleet;
pub use fleet::Logs;
pub use report::{print_medians, section};

/// Set in a process's environment, the bench binary is a Lambda function instead
/// ([`function_main`]).
pub const FUNCTION_MODE: &str = "IRONFLOW_LAMBDA_BENCH_AS_FUNCTION";

/// The bench binary as a Lambda function: `ironflow_lambda::run` with the bench's workloads.
pub fn function_main() -> ExitCode {
    // The agent rows point the Bedrock client at the scripted model server.
    let agents = std::env::var_os("AWS_ENDPOINT_URL_BEDROCK_RUNTIME").is_some();
    ironflow_lambda::run(move |worker| {
        let worker = if agents {
            worker.provider(Arc::new(ironflow_lambda::BedrockProvider::from_env()))
        } else {
            worker.provider(Arc::new(ClaudeCodeProvider::new()))
        };
        Workload::ALL
            .into_iter()
            .chain([Workload::Agent])
            .fold(worker, |worker, w| w.register_ours(worker))
    })
}

/// What a drain runs, and which binary runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Job {
    /// One of the bench's workflows, in the bench binary started as a function
    /// ([`function_main`]).
    Bench(Workload),
    /// The deployable `ironflow-lambda` binary's `quick-shell` sample (one `echo` step), as
    /// deployed.
    QuickShell,
}

impl Job {
    pub const ALL: [Job; 3] = [
        Job::Bench(Workload::NoOp),
        Job::Bench(Workload::ThreeStepShell),
        Job::QuickShell,
    ];

    /// The workflow its runs are of.
    pub fn workflow(self) -> &'static str {
        match self {
            Job::Bench(w) => w.name(),
            Job::QuickShell => "quick-shell",
        }
    }

    /// The row's name in the report.
    pub fn describe(self) -> String {
        match self {
            Job::Bench(w) => format!("{} (bench binary)", w.describe()),
            Job::QuickShell => {
                "`quick-shell` (one `echo` step; the deployable `ironflow-lambda`)".to_string()
            }
        }
    }
}

/// How the M invocations at once are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// One process serving M invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY=M`).
    OneProcess,
    /// M processes serving one invocation each (the variable unset).
    Processes,
}

impl Shape {
    pub const ALL: [Shape; 2] = [Shape::OneProcess, Shape::Processes];

    /// Function processes.
    pub fn processes(self, m: usize) -> usize {
        match self {
            Shape::OneProcess => 1,
            Shape::Processes => m,
        }
    }

    /// Invocations each process serves at once.
    pub fn per_process(self, m: usize) -> usize {
        match self {
            Shape::OneProcess => m,
            Shape::Processes => 1,
        }
    }

    pub fn flag(self) -> &'static str {
        match self {
            Shape::OneProcess => "one-process",
            Shape::Processes => "processes",
        }
    }

    /// The row's name in the report.
    pub fn describe(self, m: usize) -> String {
        match self {
            Shape::OneProcess => {
                format!("one process, {m} invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY={m}`)")
            }
            Shape::Processes => format!("{m} processes, one invocation each"),
        }
    }
}

/// The managed-instances rows' settings (C and N are the drain's).
#[derive(Debug, Clone)]
pub struct ManagedSettings {
    /// M: invocations at once, in one process or across M.
    pub max_concurrency: usize,
    /// K of the no-op drains.
    pub noop_runs: usize,
    /// K of the three-step shell drains.
    pub shell_runs: usize,
    /// K of the deployable binary's `quick-shell` drains.
    pub quick_shell_runs: usize,
    /// K of the agent drains (`agents`).
    pub agent_runs: usize,
    pub rounds: usize,
    /// Measure the rows at all (`--managed-rounds 0` turns them off).
    pub enabled: bool,
}

impl ManagedSettings {
    /// K for `job`.
    pub fn runs(&self, job: Job) -> usize {
        match job {
            Job::Bench(Workload::NoOp) => self.noop_runs,
            Job::Bench(Workload::ThreeStepShell) => self.shell_runs,
            Job::Bench(Workload::Agent) => self.agent_runs,
            Job::QuickShell => self.quick_shell_runs,
        }
    }
}

/// One function process over a drain.
#[derive(Debug, Clone, Default)]
pub struct ProcessUse {
    /// `VmHWM` at the end, in KiB.
    pub peak_rss_kib: u64,
    /// `RssAnon` at the end, in KiB (the process's own memory, without the mapped binary).
    pub rss_anon_kib: u64,
    /// The process's CPU time over the drain (user + system).
    pub cpu: Duration,
    /// Its reaped children's (the shell steps').
    pub children_cpu: Duration,
    /// Its invocations, as the Runtime API saw them.
    pub slots: Slots,
    /// What it logged.
    pub logs: Logs,
}

/// One drain.
#[derive(Debug, Clone)]
pub struct ManagedDrain {
    /// K.
    pub runs: usize,
    /// From the first event served until the answer that reported the last run's end.
    pub wall: Duration,
    /// HTTP requests the API received from the first event to the end, per route.
    pub requests: BTreeMap<String, u64>,
    pub processes: Vec<ProcessUse>,
    /// The invocations' answers.
    pub tally: Tally,
    /// The bench process's CPU time over the drain: the API, the Runtime API stubs, the log
    /// readers.
    pub bench_cpu: Duration,
    /// Runs the store holds as ended but not completed.
    pub not_completed: usize,
}

impl ManagedDrain {
    pub fn runs_per_s(&self) -> f64 {
        self.runs as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn peak_rss_kib(&self) -> u64 {
        self.processes.iter().map(|p| p.peak_rss_kib).sum()
    }

    pub fn requests_per_run(&self) -> f64 {
        self.requests.values().sum::<u64>() as f64 / self.runs.max(1) as f64
    }
}

/// Every managed-instances drain, or why none ran.
#[derive(Debug, Default)]
pub struct Managed {
    pub drains: BTreeMap<(Job, Shape), Vec<ManagedDrain>>,
    pub skipped: Option<String>,
}

/// Longest a drain may take.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// Drain each workload with each shape, `o.managed.rounds` times, the shapes in turn first.
pub async fn measure(o: &Options) -> Result<Managed, BenchError> {
    let m = &o.managed;
    if !m.enabled {
        return Ok(Managed {
            skipped: Some("not measured: --managed-rounds 0".into()),
            ..Managed::default()
        });
    }
    let bench = std::env::current_exe()?;
    let deployable = match &o.function {
        Some(path) => path.clone(),
        None => crate::process::function_beside_bench()?,
    };
    let jobs = o
        .workloads
        .iter()
        .map(|w| Job::Bench(*w))
        .chain([Job::QuickShell]);
    let jobs: Vec<Job> = jobs.collect();
    let mut drains: BTreeMap<(Job, Shape), Vec<ManagedDrain>> = BTreeMap::new();
    for round in 0..m.rounds {
        for &job in &jobs {
            let mut shapes = Shape::ALL;
            if round % 2 == 1 {
                shapes.reverse();
            }
            let binary = match job {
                Job::Bench(_) => &bench,
                Job::QuickShell => &deployable,
            };
            for shape in shapes {
                let d = drain(binary, shape, job, &o.drain, m).await?;
                eprintln!(
                    "managed round {}/{} {}",
                    round + 1,
                    m.rounds,
                    line(job, shape, &d)
                );
                drains.entry((job, shape)).or_default().push(d);
            }
        }
    }
    Ok(Managed {
        drains,
        skipped: None,
    })
}

/// One drain's figures on a line.
fn line(job: Job, shape: Shape, d: &ManagedDrain) -> String {
    let loops: Vec<String> = d
        .processes
        .iter()
        .map(|p| p.slots.loops_at_start.to_string())
        .collect();
    let most: Vec<String> = d
        .processes
        .iter()
        .map(|p| p.slots.max_in_flight.to_string())
        .collect();
    let mean: Vec<String> = d
        .processes
        .iter()
        .map(|p| format!("{:.2}", p.slots.mean_in_flight(d.wall)))
        .collect();
    let cpu: f64 = d.processes.iter().map(|p| p.cpu.as_secs_f64()).sum();
    let warnings: usize = d
        .processes
        .iter()
        .map(|p| p.logs.warnings + p.logs.errors)
        .sum();
    format!(
        "{:<14} {:<12} {:>7.3} s  {:>7.1} runs/s  peak RSS {:.1} MiB  {:.2} requests/run  \
         {} invocations ({} empty)  poll loops {}  at once max {} mean {}  function CPU/run \
         {:.3} ms  errors {}  log warnings+errors {warnings}",
        job.workflow(),
        shape.flag(),
        d.wall.as_secs_f64(),
        d.runs_per_s(),
        d.peak_rss_kib() as f64 / 1024.0,
        d.requests_per_run(),
        d.tally.invocations,
        d.tally.empty,
        loops.join("/"),
        most.join("/"),
        mean.join("/"),
        cpu * 1000.0 / d.runs.max(1) as f64,
        d.tally.errors,
    )
}

/// One drain of `job`'s K runs by `shape`'s processes of `binary`.
pub(crate) async fn drain(
    binary: &Path,
    shape: Shape,
    job: Job,
    s: &DrainSettings,
    m: &ManagedSettings,
) -> Result<ManagedDrain, BenchError> {
    let runs = m.runs(job);
    let token = Uuid::new_v4().to_string();
    let api = LocalApi::start_apart(&token, &Backend::Memory, API_THREADS).await?;
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        let run = api.store().create_run(new_run(job.workflow(), 0)).await?;
        ids.push(run.into_run().id);
    }
    let dispatcher = Dispatcher::new(shape.processes(m.max_concurrency), runs, s.invocation);
    let mut fleet =
        Fleet::start(binary, (job, shape), m, s, &api.url(), &token, &dispatcher).await?;
    let per_process = shape.per_process(m.max_concurrency);
    dispatcher
        .ready(
            per_process,
            Duration::from_secs(1),
            Duration::from_secs(10),
            &mut || fleet.alive(),
        )
        .await?;

    let before = api.requests_by_route();
    let cpu_before = fleet.cpu();
    let usage_before = Usage::now();
    let opened = dispatcher.open();
    let done = dispatcher.done(DRAIN_LIMIT, &mut || fleet.alive()).await?;
    let bench_cpu = Usage::since(usage_before).cpu;
    let requests = requests_since(&before, api.requests_by_route());
    let cpu_after = fleet.cpu();
    let memory = fleet.memory();
    let logs = fleet.stop().await;

    let (slots, tally) = dispatcher.finish();
    let processes = (0..slots.len())
        .map(|p| {
            let (cpu0, cpu1) = (cpu_before[p], cpu_after[p]);
            ProcessUse {
                peak_rss_kib: memory[p].0,
                rss_anon_kib: memory[p].1,
                cpu: cpu1.0.saturating_sub(cpu0.0),
                children_cpu: cpu1.1.saturating_sub(cpu0.1),
                slots: slots[p].clone(),
                logs: logs.get(p).cloned().unwrap_or_default(),
            }
        })
        .collect();
    let not_completed = check_ended(&api, &ids).await?;
    Ok(ManagedDrain {
        runs,
        wall: done.saturating_duration_since(opened),
        requests,
        processes,
        tally,
        bench_cpu,
        not_completed,
    })
}

/// The requests counted since `before`, per route.
pub(crate) fn requests_since(
    before: &BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .into_iter()
        .map(|(route, n)| {
            let n = n.saturating_sub(before.get(&route).copied().unwrap_or(0));
            (route, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// How many of `ids` ended other than completed; an error if one has not ended.
async fn check_ended(api: &LocalApi, ids: &[Uuid]) -> Result<usize, BenchError> {
    let mut not_completed = 0;
    for id in ids {
        let state = api.store().get_run(*id).await?.map(|r| r.status.state);
        match state {
            Some(RunStatus::Completed) => {}
            Some(state) if state.is_terminal() => not_completed += 1,
            other => {
                return Err(BenchError::msg(format!(
                    "run {id} has not ended after the drain ({other:?}): the answers reported \
                     its end"
                )));
            }
        }
    }
    Ok(not_completed)
}
