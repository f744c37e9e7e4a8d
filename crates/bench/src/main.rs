//! Benchmark against the reference worker (`ironflow_worker::Worker`), on this machine, in one
//! run: drain throughput, HTTP requests per run, idle invocation latency, deadline precision,
//! cold start, binary size and peak RSS, and one function process serving several invocations
//! at once (Lambda Managed Instances) against as many single-invocation processes
//! ([`managed`]), and pickup latency at an idle fleet, push against the schedule and the
//! reference's polls ([`pickup`]). Writes `BENCHMARKS.md`.
//!
//! ```sh
//! cargo build --release --bin ironflow-lambda \
//!   && cargo run --release -p ironflow-lambda-bench              # full run, writes BENCHMARKS.md
//! cargo run --release -p ironflow-lambda-bench -- --quick        # small run, prints only
//! cargo run --release -p ironflow-lambda-bench -- --managed-only # the managed-instances rows
//! cargo run --release -p ironflow-lambda-bench -- --pickup-only  # the pickup-latency rows
//! cargo run --release -p ironflow-lambda-bench -- --agents-only  # agent rows and dollars
//! ```
//!
//! `--agents-only` ([`agents`]) replaces its own section of `BENCHMARKS.md` ("Agent runs and
//! dollars") and leaves the rest of the file as it is; with `--quick` it prints only.
//!
//! The first command builds the deployable function as deployed, whose cold start, size and
//! memory are measured.
//!
//! The options: `--help` ([`Args`]).
//! Not part of the test command.

mod agents;
mod drain;
mod dynamodb;
mod fleet;
mod latency;
mod managed;
mod pickup;
mod process;
mod production;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use drain::{DrainResult, DrainSettings, Link, UsagePerRun, Which, Workload};
use latency::DeadlineSettings;
use managed::ManagedSettings;
use pickup::PickupSettings;
use production::ProductionSettings;

/// Anything that stops the bench, with what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Msg(String),
    #[error(transparent)]
    Api(#[from] ironflow_local_api::LocalApiError),
    #[error("store: {0}")]
    Store(#[from] ironflow_store::error::StoreError),
    #[error("building our worker: {0}")]
    Build(#[from] ironflow_lambda::BuildError),
    #[error("building the reference worker: {0}")]
    Reference(#[from] ironflow_worker::WorkerError),
    #[error("invocation refused: {0}")]
    Trigger(#[from] ironflow_lambda::TriggerError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("task: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl BenchError {
    pub fn msg(m: impl Into<String>) -> Self {
        Self::Msg(m.into())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    /// Only the drain rounds (`--drain-only`): medians printed, no report written.
    pub drain_only: bool,
    pub drain: DrainSettings,
    /// The workloads drained (`--workload`; default both).
    pub workloads: Vec<Workload>,
    /// The rows of each round, in order (`--rows`; default [`Which::ALL`]).
    pub rows: Vec<Which>,
    pub rounds: usize,
    pub idle_invocations: usize,
    pub deadline: DeadlineSettings,
    pub deadline_invocations: usize,
    pub cold_starts: usize,
    pub dynamodb_runs: usize,
    pub out: Option<PathBuf>,
    pub function: Option<PathBuf>,
    pub args: Vec<String>,
    /// The production-path rows (PostgreSQL, round trips).
    pub production: ProductionSettings,
    /// Only the production-path drains (`--production-only`): medians printed.
    pub production_only: bool,
    /// The Lambda Managed Instances rows.
    pub managed: ManagedSettings,
    /// Only the Lambda Managed Instances rows (`--managed-only`): medians and the report's
    /// section printed.
    pub managed_only: bool,
    /// The pickup-latency rows.
    pub pickup: PickupSettings,
    /// Only the pickup-latency rows (`--pickup-only`): the report's section printed.
    pub pickup_only: bool,
    /// The agent rows and the dollars.
    pub agents: agents::AgentSettings,
    /// Only the agent rows and the dollars (`--agents-only`): their section printed and, but
    /// with `--quick`, written into `BENCHMARKS.md` in place of the old one.
    pub agents_only: bool,
}

/// The command line (`--help` prints it).
#[derive(Debug, clap::Parser)]
#[command(
    name = "ironflow-lambda-bench",
    about = "Benchmark ironflow-lambda against the reference worker on this machine; writes BENCHMARKS.md"
)]
struct Args {
    /// Small counts; prints the report, writes nothing.
    #[arg(long)]
    quick: bool,
    /// Only the drain rounds, their medians printed; nothing written.
    #[arg(long)]
    drain_only: bool,
    /// Runs per drain (default 500, 50 with --quick).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Rounds of drains (default 20, 2 with --quick).
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..))]
    rounds: Option<u32>,
    /// Runs executing at once (C).
    #[arg(long, value_name = "C", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Runs one invocation claims at most (N).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    max_runs: u32,
    /// Where to write the report (default BENCHMARKS.md of the repository).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// The function binary to measure (default: the release `ironflow-lambda` beside the bench).
    #[arg(long, value_name = "PATH", value_parser = existing_file)]
    function: Option<PathBuf>,
    /// One workload instead of both (with --drain-only).
    #[arg(long, value_parser = ["noop", "shell"], requires = "drain_only")]
    workload: Option<String>,
    /// PostgreSQL server of the production-path rows (a fresh database per drain), e.g.
    /// postgres://postgres@127.0.0.1:5432 (default: IRONFLOW_TEST_POSTGRES_URL). Without
    /// one, those rows are not measured.
    #[arg(
        long,
        env = "IRONFLOW_TEST_POSTGRES_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    postgres_url: Option<String>,
    /// Round trips added between the workers and the API in the production-path rows, in ms,
    /// comma-separated (0: PostgreSQL on loopback).
    #[arg(long, value_name = "MS", value_delimiter = ',', default_value = "0,1,2,5", value_parser = rtt)]
    rtts_ms: Vec<u64>,
    /// Rounds of production-path drains (default 3, 1 with --quick).
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..))]
    production_rounds: Option<u32>,
    /// Only the production-path drains, their medians printed; nothing written.
    #[arg(long, conflicts_with = "drain_only", requires = "postgres_url")]
    production_only: bool,
    /// Only the Lambda Managed Instances rows (one process with M invocations at once against
    /// M processes with one each): their medians and the report's section printed; nothing
    /// written.
    #[arg(long, conflicts_with_all = ["drain_only", "production_only"])]
    managed_only: bool,
    /// Only the pickup-latency rows (creation → claim and due → claim at an idle fleet, ours
    /// with push, ours with the schedule alone, the reference): the report's section printed;
    /// nothing written.
    #[arg(long, conflicts_with_all = ["drain_only", "production_only", "managed_only"])]
    pickup_only: bool,
    /// K: runs per pickup row (default 50, 10 with --quick; 0: none).
    #[arg(long, value_name = "K")]
    pickup_runs: Option<u32>,
    /// The seed of the pickup rows' random moments.
    #[arg(long, value_name = "SEED", default_value_t = 20)]
    pickup_seed: u64,
    /// M: invocations at once in the managed-instances rows (`AWS_LAMBDA_MAX_CONCURRENCY` of
    /// the one process, and the number of single-invocation processes).
    #[arg(long, value_name = "M", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_concurrency: u32,
    /// Rounds of managed-instances drains (default 4, each layout first in half of them; 1 with
    /// --quick; 0: none).
    #[arg(long, value_name = "R")]
    managed_rounds: Option<u32>,
    /// Runs per no-op managed-instances drain (default 6000, 600 with --quick).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    managed_noop_runs: Option<u32>,
    /// Runs per three-step shell managed-instances drain (default 1500, 150 with --quick).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    managed_shell_runs: Option<u32>,
    /// Runs per managed-instances drain of the deployable binary's `quick-shell` (default
    /// 3000, 300 with --quick).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    managed_quick_shell_runs: Option<u32>,
    /// Only the agent rows and the dollars (issue 26): agent drains against the reference on
    /// PostgreSQL over a 2 ms round trip, model calls cut at the cutoff with cutoff-aware
    /// starts off and on, agent runs per managed-instances process at M = 16 and 64, and $
    /// per 1 million runs; replaces the "Agent runs and dollars" section of BENCHMARKS.md
    /// (with --quick: prints it only). About 17 minutes; --quick about 3-4.
    #[arg(long, conflicts_with_all = ["drain_only", "production_only", "managed_only", "pickup_only"])]
    agents_only: bool,
    /// The agent rows' time scale: model latencies, the invocation's length, the deadline
    /// margin, the minimum claim budget and the default step duration are multiplied by it
    /// (0.05 at least: the margin's 500 ms floor; at 0.1 the 1 s margin is short for a
    /// handback of 32 runs over PostgreSQL on a loaded machine).
    #[arg(long, value_name = "FACTOR", default_value_t = 0.2, value_parser = time_scale)]
    time_scale: f64,
    /// The seed of the agent rows' model latencies.
    #[arg(long, value_name = "SEED", default_value_t = 26)]
    agent_seed: u64,
    /// The rows of each round, comma-separated, out of reference, ours, no-claim-ahead,
    /// one-invocation, larger-batch (with --drain-only; default all).
    #[arg(long, value_name = "LIST", value_parser = rows, requires = "drain_only")]
    rows: Option<Rows>,
}

/// The rows of `--rows`, in order, each once.
#[derive(Debug, Clone)]
struct Rows(Vec<Which>);

fn rows(list: &str) -> Result<Rows, String> {
    let mut rows: Vec<Which> = Vec::new();
    for name in list.split(',') {
        let row = Which::parse(name.trim()).ok_or(format!(
            "expected reference, ours, no-claim-ahead, one-invocation or larger-batch, got {name:?}"
        ))?;
        if rows.contains(&row) {
            return Err(format!("{name:?} is named twice"));
        }
        rows.push(row);
    }
    Ok(Rows(rows))
}

/// A round trip in ms (0 to 1000, fractions allowed), as µs.
fn rtt(ms: &str) -> Result<u64, String> {
    ms.trim()
        .parse::<f64>()
        .ok()
        .filter(|ms| (0.0..=1000.0).contains(ms))
        .map(|ms| (ms * 1000.0).round() as u64)
        .ok_or(format!(
            "expected a round trip in ms from 0 to 1000, got {ms:?}"
        ))
}

/// A time scale from 0.05 (the deadline margin's 500 ms floor at the default 10 s) to 1.
fn time_scale(factor: &str) -> Result<f64, String> {
    factor
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|f| (0.05..=1.0).contains(f))
        .ok_or(format!(
            "expected a time scale from 0.05 to 1, got {factor:?}"
        ))
}

/// Checked now, not after minutes of drains.
fn existing_file(path: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{}: no such file (the function binary to measure)",
            path.display()
        ))
    }
}

impl Args {
    fn options(self, args: Vec<String>) -> Options {
        let quick = self.quick;
        let count = |given: Option<u32>, full: usize, small: usize| {
            given.map_or(if quick { small } else { full }, |n| n as usize)
        };
        Options {
            quick,
            drain_only: self.drain_only,
            drain: DrainSettings {
                runs: count(self.runs, 500, 50),
                concurrency: self.concurrency as usize,
                max_runs: self.max_runs as usize,
                invocation: Duration::from_secs(60),
                poll_interval: Duration::from_millis(100),
                postgres: self.postgres_url,
                model_endpoint: None,
                time_scale: 1.0,
                cutoff_aware: None,
            },
            workloads: self
                .workload
                .as_deref()
                .and_then(Workload::parse)
                .map_or_else(|| Workload::ALL.to_vec(), |w| vec![w]),
            rows: self.rows.map_or_else(|| Which::ALL.to_vec(), |r| r.0),
            // Single rounds swing by ±20 % on a shared 2-core machine: medians of 20 hold to a
            // few %. 20 is two whole blocks of the round order's design (2 × 5 rows,
            // `round_order`).
            rounds: count(self.rounds, 20, 2),
            idle_invocations: if quick { 50 } else { 200 },
            deadline: DeadlineSettings {
                invocation: Duration::from_secs(3),
                margin: Duration::from_secs(1),
                runs: 2,
            },
            deadline_invocations: if quick { 3 } else { 20 },
            cold_starts: if quick { 5 } else { 30 },
            dynamodb_runs: if quick { 16 } else { 96 },
            out: self.out.or_else(|| {
                (!quick && !self.drain_only)
                    .then(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../BENCHMARKS.md"))
            }),
            function: self.function,
            args,
            production: ProductionSettings {
                links: self
                    .rtts_ms
                    .iter()
                    .map(|&rtt_us| Link::Postgres { rtt_us })
                    .collect(),
                rounds: count(self.production_rounds, 3, 1),
            },
            production_only: self.production_only,
            managed: ManagedSettings {
                max_concurrency: self.max_concurrency as usize,
                noop_runs: count(self.managed_noop_runs, 6000, 600),
                shell_runs: count(self.managed_shell_runs, 1500, 150),
                quick_shell_runs: count(self.managed_quick_shell_runs, 3000, 300),
                agent_runs: 0,
                rounds: count(self.managed_rounds, 4, 1),
                enabled: self.managed_rounds != Some(0),
            },
            managed_only: self.managed_only,
            pickup: PickupSettings {
                runs: count(self.pickup_runs, 50, 10),
                seed: self.pickup_seed,
                concurrency: self.concurrency as usize,
                max_runs: self.max_runs as usize,
            },
            pickup_only: self.pickup_only,
            agents: agents::AgentSettings {
                time_scale: self.time_scale,
                latency: (Duration::from_secs(2), Duration::from_secs(40)),
                tokens: (2000, 500),
                invocation: Duration::from_secs(60),
                managed_invocation: Duration::from_secs(900),
                seed: self.agent_seed,
                drain_runs: if quick { 32 } else { 128 },
                drain_concurrency: 32,
                drain_rounds: if quick { 1 } else { 2 },
                rtt_us: 2000,
                cut_runs: if quick { 128 } else { 1000 },
                cut_parallel: 8,
                cut_concurrency: 16,
                managed_runs: if quick { 256 } else { 1000 },
                managed_ms: vec![16, 64],
                managed_concurrency: 8,
                billed_runs: if quick { 50 } else { 500 },
                prices: agents::cost::Prices::default(),
            },
            agents_only: self.agents_only,
        }
    }
}

/// Everything measured.
pub struct Results {
    pub drains: BTreeMap<(Workload, Which), Vec<DrainResult>>,
    pub idle: latency::Idle,
    pub deadline: latency::DeadlinePrecision,
    pub cold_start_ms: Vec<f64>,
    pub cold_start_rss_kib: u64,
    pub binary_bytes: u64,
    pub batch: process::BatchMemory,
    pub dynamodb: dynamodb::DynamoDb,
    pub production: production::Production,
    pub managed: managed::Managed,
    pub pickup: pickup::Pickup,
}

fn main() -> ExitCode {
    // The fleet section (`fleet`, issue 28): its command, and its worker processes.
    if let Some(code) = fleet::main() {
        return code;
    }
    // Started again by the managed-instances rows as a Lambda function.
    if std::env::var_os(managed::FUNCTION_MODE).is_some() {
        return managed::function_main();
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(bench()),
        Err(e) => {
            eprintln!("error: could not start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench() -> ExitCode {
    let options = <Args as clap::Parser>::parse().options(std::env::args().skip(1).collect());
    // The reference worker installs SIGINT/SIGTERM handlers that outlive it (its drain is
    // stopped by aborting its task), and they swallow the signals: Ctrl+C and SIGTERM must
    // still stop the bench, and the moto server it may have started.
    tokio::spawn(async {
        let code = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => 130,
                _ = term.recv() => 143,
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                130
            }
        };
        eprintln!("interrupted");
        dynamodb::kill_started_server();
        std::process::exit(code);
    });
    // In a task on the worker threads, as the deployed function runs its Lambda runtime loop
    // (`handler::in_worker_task`): our invocations are awaited from there.
    match in_worker_task(run(options)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(o: Options) -> Result<(), BenchError> {
    // moto first: started before we become a subreaper, it is not our descendant, and our
    // invocations' orphan sweep leaves it alone.
    let only =
        o.drain_only || o.production_only || o.managed_only || o.pickup_only || o.agents_only;
    let moto = if only {
        Err("not measured: --drain-only".to_string())
    } else {
        dynamodb::Moto::find_or_start().await
    };
    // Like the deployed function: descendants left by shell steps are reaped by us.
    ironflow_lambda::orphans::become_subreaper();
    let machine = report::Machine::read();
    let whole_blocks = 2 * o.rows.len();
    if !o.rounds.is_multiple_of(whole_blocks) && !only {
        eprintln!(
            "note: {} rounds is not a multiple of {whole_blocks} (2 × {} rows): the order is \
             balanced only over whole blocks of {whole_blocks} rounds",
            o.rounds,
            o.rows.len()
        );
    }
    let binary = match (&o.function, only) {
        (Some(path), _) => path.clone(),
        (None, false) => process::function_beside_bench()?,
        (None, true) => PathBuf::new(),
    };

    let drains = loopback_drains(&o).await?;

    if o.drain_only {
        print_drain_medians(&drains, o.drain.runs);
        return Ok(());
    }
    if o.pickup_only {
        pickup::print(&pickup::measure(&o.pickup).await?);
        return Ok(());
    }
    if o.agents_only {
        let measured = Box::pin(agents::measure(&o)).await?;
        let section = agents::section(&o, &machine.finish(), &measured);
        println!("{section}");
        if let Some(out) = &o.out {
            agents::replace_section(out, &section)?;
            eprintln!("replaced the agent section of {}", out.display());
        }
        return Ok(());
    }
    let production = if o.managed_only {
        production::Production::default()
    } else {
        production::measure(&o).await?
    };
    if o.production_only {
        production::print_medians(&production, o.drain.runs);
        return Ok(());
    }
    let managed = managed::measure(&o).await?;
    if o.managed_only {
        managed::print_medians(&managed, &o);
        // The section as the full run writes it into BENCHMARKS.md.
        let mut section = String::new();
        managed::section(&mut section, &o, &managed);
        println!("\n--- the report's section:\n{section}");
        return Ok(());
    }

    eprintln!("idle invocations ...");
    let idle = latency::idle(&o.drain, o.idle_invocations).await?;
    eprintln!("deadline precision ...");
    let deadline = latency::deadline_precision(o.deadline, o.deadline_invocations).await?;
    eprintln!("cold starts of {} ...", binary.display());
    let (cold_start_ms, cold_start_rss_kib) =
        process::cold_starts(&binary, o.cold_starts, o.drain.concurrency).await?;
    let binary_bytes = process::size(&binary)?;
    eprintln!("peak RSS during a batch of 8 ...");
    let batch = process::batch_memory(&binary, o.drain.concurrency).await?;
    eprintln!("DynamoDB calls ...");
    let dynamodb = dynamodb::measure(&moto, &o.drain, o.dynamodb_runs).await?;
    drop(moto);
    let pickup = pickup::measure(&o.pickup).await?;

    let results = Results {
        drains,
        idle,
        deadline,
        cold_start_ms,
        cold_start_rss_kib,
        binary_bytes,
        batch,
        dynamodb,
        production,
        managed,
        pickup,
    };
    let markdown = report::render(&o, &machine.finish(), &results);
    println!("{markdown}");
    if let Some(out) = &o.out {
        // The agent section (`--agents-only`) and the fleet section (`fleet`) are not measured
        // here: kept as they were.
        let old = std::fs::read_to_string(out).unwrap_or_default();
        let kept = fleet::keep_section(&old, agents::keep_section(&old, markdown));
        std::fs::write(out, kept)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// The loopback drain rows, `o.rounds` rounds of every workload and row in a balanced order
/// ([`round_order`]); none when only another section is measured.
async fn loopback_drains(
    o: &Options,
) -> Result<BTreeMap<(Workload, Which), Vec<DrainResult>>, BenchError> {
    let mut drains: BTreeMap<(Workload, Which), Vec<DrainResult>> = BTreeMap::new();
    let loopback_rounds = if o.production_only || o.managed_only || o.pickup_only || o.agents_only {
        0
    } else {
        o.rounds
    };
    for round in 0..loopback_rounds {
        for &workload in &o.workloads {
            for which in round_order(&o.rows, round) {
                let r = drain::drain(which, workload, &o.drain, Link::Loopback).await?;
                let u = r.usage.per_run(o.drain.runs);
                eprintln!(
                    "round {}/{} {:<14} {:<15} {:>8.3} s  {:>6.1} runs/s  {:>5.2} requests/run  {} invocations  \
                     CPU/run {:.3} ms + children {:.3} ms  switches/run {:.1} voluntary {:.1} involuntary",
                    round + 1,
                    o.rounds,
                    workload.name(),
                    which.flag(),
                    r.wall.as_secs_f64(),
                    o.drain.runs as f64 / r.wall.as_secs_f64(),
                    r.total_requests() as f64 / o.drain.runs as f64,
                    r.invocations,
                    u.cpu_ms,
                    u.children_cpu_ms,
                    u.voluntary_switches,
                    u.involuntary_switches,
                );
                drains.entry((workload, which)).or_default().push(r);
            }
        }
    }
    Ok(drains)
}

/// The rows of round `round` (0-based), in the order they drain: a Williams design. Round `i`
/// of a block takes the base order `0, 1, n-1, 2, n-2, ...` of `rows` (n of them) shifted by
/// `i`, and the next n rounds take the same orders reversed. Over every 2n rounds each row
/// drains twice in each position (first, second, ...) and twice right after each other row, so
/// that a drift of the machine's load, and whatever a drain leaves behind for the next one,
/// hit every row alike. (A fixed order, reversed every other round, kept the reference first or
/// last and ours second or fourth; the second position ran about 4 % slower than the mean in
/// 9bb9368's run.)
fn round_order(rows: &[Which], round: usize) -> Vec<Which> {
    let n = rows.len();
    if n == 0 {
        return Vec::new();
    }
    let (mut low, mut high) = (1, n - 1);
    let base = std::iter::once(0).chain((1..n).map(|k| {
        if k % 2 == 1 {
            low += 1;
            low - 1
        } else {
            high -= 1;
            high + 1
        }
    }));
    let mut order: Vec<Which> = base.map(|b| rows[(b + round) % n]).collect();
    if (round / n) % 2 == 1 {
        order.reverse();
    }
    order
}

/// `--drain-only`: per workload and row, the median wall time, its ratio to the reference's
/// (when the reference row ran) and the median CPU time and context switches per run.
fn print_drain_medians(drains: &BTreeMap<(Workload, Which), Vec<DrainResult>>, runs: usize) {
    let median_wall = |rs: &[DrainResult]| report::median(&report::walls(rs));
    for ((w, which), rs) in drains {
        let wall = median_wall(rs);
        let ratio = drains
            .get(&(*w, Which::Reference))
            .map(|reference| {
                format!(
                    " ({:.3} of the reference; per round {:.3})",
                    wall / median_wall(reference),
                    report::paired_ratio(rs, reference)
                )
            })
            .unwrap_or_default();
        let u = UsagePerRun::median(rs, runs);
        println!(
            "{:<14} {:<15} {wall:.3} s{ratio}  per run: CPU {:.3} ms + children {:.3} ms, \
             {:.1} voluntary + {:.1} involuntary switches",
            w.name(),
            which.flag(),
            u.cpu_ms,
            u.children_cpu_ms,
            u.voluntary_switches,
            u.involuntary_switches,
        );
    }
}

/// Now, in ms since the Unix epoch.
pub fn epoch_ms() -> u64 {
    epoch_us() / 1000
}

/// Now, in µs since the Unix epoch.
pub fn epoch_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Run `future` in a task of its own on the runtime's worker threads, and return its output:
/// under `#[tokio::main]` (a multi-thread runtime) a future awaited in `block_on` runs on the
/// main thread, outside the worker threads, and every wake-up of a claim loop awaited there (a
/// run finished, a slot is free, a claim answered) would hop to another thread. Our invocations
/// are awaited from here; the worker executes their runs on its own runtime either way
/// (`ironflow_lambda`'s `runtime` module). A panic in `future` is resumed here.
async fn in_worker_task<T, F>(future: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    use tracing::Instrument;
    let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(future.in_current_span()));
    match task.await {
        Ok(output) => output,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => std::panic::resume_unwind(Box::new(format!(
            "the task was cancelled (the runtime is shutting down): {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_drains_twice_in_each_position_and_after_each_other_row_per_2n_rounds() {
        for n in 1..=Which::ALL.len() {
            let rows = &Which::ALL[..n];
            let orders: Vec<Vec<Which>> = (0..2 * n).map(|r| round_order(rows, r)).collect();
            for order in &orders {
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, rows.to_vec(), "every row once per round");
            }
            for position in 0..n {
                for row in rows {
                    let times = orders.iter().filter(|o| o[position] == *row).count();
                    assert_eq!(times, 2, "n = {n}: {row:?} in position {position}");
                }
            }
            for before in rows {
                for after in rows.iter().filter(|r| *r != before) {
                    let times = orders
                        .iter()
                        .flat_map(|o| o.windows(2))
                        .filter(|w| w[0] == *before && w[1] == *after)
                        .count();
                    assert_eq!(times, 2, "n = {n}: {after:?} right after {before:?}");
                }
            }
        }
        assert!(round_order(&[], 3).is_empty());
    }
}
