//! Benchmark against the reference worker (`ironflow_worker::Worker`), on this machine, in one
//! run: drain throughput, HTTP requests per run, idle invocation latency, deadline precision,
//! cold start, binary size and peak RSS, and one function process serving several invocations
//! at once (Lambda Managed Instances) against as many single-invocation processes
//! ([`managed`]), and pickup latency at an idle fleet, push against the schedule and the
//! reference's polls ([`pickup`]). Writes `BENCHMARKS.md`.
//!
//! ```sh
//! cargo build --release --bin ironflow-lambda \
//!   && cargo run --release -p ironflow-lambda-bench              # `all`: full run, writes BENCHMARKS.md
//! cargo run --release -p ironflow-lambda-bench -- --quick        # small run, prints only
//! cargo run --release -p ironflow-lambda-bench -- drain          # the drain throughput rows
//! cargo run --release -p ironflow-lambda-bench -- production     # the production-path rows
//! cargo run --release -p ironflow-lambda-bench -- managed        # the managed-instances rows
//! cargo run --release -p ironflow-lambda-bench -- pickup         # the pickup-latency rows
//! cargo run --release -p ironflow-lambda-bench -- agents         # agent rows and dollars
//! cargo run --release -p ironflow-lambda-bench -- fleet          # fleet scale (issue 28)
//! ```
//!
//! `all` measures every section but `agents` and `fleet`, and keeps their sections of
//! `BENCHMARKS.md` as they were. `agents` ([`agents`]) replaces its own section ("Agent runs
//! and dollars"), `fleet` ([`fleet`]) its own ("Fleet scale") and `drain` the drain rows'
//! parts ([`report::drain::write`]), leaving the rest of the file as it is; with `--quick`
//! they print only.
//!
//! The first command builds the deployable function as deployed, whose cold start, size and
//! memory are measured.
//!
//! The options: `--help` ([`cli::Args`]), and each subcommand's `--help`.
//! Not part of the test command.

mod agents;
mod args;
mod cli;
mod drain;
mod dynamodb;
mod fleet;
mod latency;
mod machine;
mod managed;
mod markdown;
mod pickup;
mod process;
mod production;
mod report;
mod runtime_api;
mod stats;
mod usage;
mod watch;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use drain::{DrainSettings, Link, Which};
use latency::DeadlineSettings;
use managed::ManagedSettings;
use pickup::PickupSettings;
use production::ProductionSettings;
use workload::Workload;

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

/// The section a run measures (its subcommand, [`cli`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Every section but the agent rows; writes `BENCHMARKS.md`.
    All,
    /// The loopback drain rows: medians printed, their parts of `BENCHMARKS.md` replaced
    /// ([`report::drain::write`]).
    Drain,
    /// The production-path drains: medians printed.
    Production,
    /// The Lambda Managed Instances rows: medians and the report's section printed.
    Managed,
    /// The pickup-latency rows: the report's section printed.
    Pickup,
    /// The agent rows and the dollars: their section printed and, but with `--quick`, written
    /// into `BENCHMARKS.md` in place of the old one.
    Agents,
    /// Fleet scale: its section printed and, with PostgreSQL and without `--print-only`,
    /// written into `BENCHMARKS.md` in place of the old one ([`fleet::run`]).
    Fleet,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    /// The section measured.
    pub section: Section,
    pub drain: DrainSettings,
    /// The workloads drained (`drain --workload`; default both).
    pub workloads: Vec<Workload>,
    /// The rows of each round, in order (`drain --rows`; default [`Which::ALL`]).
    pub rows: Vec<Which>,
    pub rounds: usize,
    pub idle_invocations: usize,
    pub deadline: DeadlineSettings,
    pub deadline_invocations: usize,
    pub cold_starts: usize,
    pub dynamodb_runs: usize,
    /// Where the report, or the section's part of it, is written (`None`: printed only).
    pub out: Option<PathBuf>,
    pub function: Option<PathBuf>,
    pub args: Vec<String>,
    /// The production-path rows (PostgreSQL, round trips).
    pub production: ProductionSettings,
    /// The Lambda Managed Instances rows.
    pub managed: ManagedSettings,
    /// The pickup-latency rows.
    pub pickup: PickupSettings,
    /// The agent rows and the dollars.
    pub agents: agents::AgentSettings,
    /// The fleet section's options (`fleet`; `None` for another section).
    pub fleet: Option<fleet::FleetArgs>,
}

/// Everything measured.
pub struct Results {
    pub drains: report::drain::Drains,
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
    // Started again by the fleet section as one of its workers (ours or the reference).
    if let Some(code) = fleet::role_main() {
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
    let options =
        match <cli::Args as clap::Parser>::parse().options(std::env::args().skip(1).collect()) {
            Ok(options) => options,
            Err(e) => e.exit(),
        };
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
    let moto = match o.section {
        Section::All => dynamodb::Moto::find_or_start().await,
        _ => Err("not measured: only another section".to_string()),
    };
    // Like the deployed function: descendants left by shell steps are reaped by us.
    ironflow_lambda::orphans::become_subreaper();
    let machine = machine::Machine::read();
    match o.section {
        Section::All => run_all(&o, machine, moto).await,
        Section::Drain => {
            let drains = loopback_drains(&o).await?;
            report::drain::print_medians(&drains, o.drain.runs);
            if let Some(out) = &o.out {
                report::drain::write(out, &o, &machine.finish(), &drains)?;
                eprintln!("replaced the drain rows' parts of {}", out.display());
            }
            Ok(())
        }
        Section::Production => {
            production::print_medians(&production::measure(&o).await?, o.drain.runs);
            Ok(())
        }
        Section::Managed => {
            let managed = managed::measure(&o).await?;
            managed::print_medians(&managed, &o);
            // The section as the full run writes it into BENCHMARKS.md.
            let mut section = String::new();
            managed::section(&mut section, &o, &managed);
            println!("\n--- the report's section:\n{section}");
            Ok(())
        }
        Section::Pickup => {
            pickup::print(&pickup::measure(&o.pickup).await?);
            Ok(())
        }
        Section::Agents => {
            let measured = Box::pin(agents::measure(&o)).await?;
            let section = agents::section(&o, &machine.finish(), &measured);
            println!("{section}");
            if let Some(out) = &o.out {
                agents::replace_section(out, &section)?;
                eprintln!("replaced the agent section of {}", out.display());
            }
            Ok(())
        }
        Section::Fleet => match o.fleet.clone() {
            Some(args) => fleet::run(args, o.args.clone()).await,
            None => Err(BenchError::Msg("fleet: no options given".to_string())),
        },
    }
}

/// `all`: every section but the agent rows, into the whole report.
async fn run_all(
    o: &Options,
    machine: machine::Machine,
    moto: Result<dynamodb::Moto, String>,
) -> Result<(), BenchError> {
    let whole_blocks = 2 * o.rows.len();
    if !o.rounds.is_multiple_of(whole_blocks) {
        eprintln!(
            "note: {} rounds is not a multiple of {whole_blocks} (2 × {} rows): the order is \
             balanced only over whole blocks of {whole_blocks} rounds",
            o.rounds,
            o.rows.len()
        );
    }
    let binary = match &o.function {
        Some(path) => path.clone(),
        None => process::function_beside_bench()?,
    };
    let drains = loopback_drains(o).await?;
    let production = production::measure(o).await?;
    let managed = managed::measure(o).await?;
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
    let markdown = report::render(o, &machine.finish(), &results);
    println!("{markdown}");
    if let Some(out) = &o.out {
        // The agent section (`agents`) and the fleet section (`fleet`) are not measured
        // here: kept as they were.
        let old = std::fs::read_to_string(out).unwrap_or_default();
        let kept = fleet::keep_section(&old, agents::keep_section(&old, markdown));
        std::fs::write(out, kept)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// The loopback drain rows, `o.rounds` rounds of every workload and row in a balanced order
/// ([`round_order`]).
async fn loopback_drains(o: &Options) -> Result<report::drain::Drains, BenchError> {
    let mut drains = report::drain::Drains::new();
    for round in 0..o.rounds {
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
