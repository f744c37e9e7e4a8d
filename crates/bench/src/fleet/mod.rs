//! Fleet scale (issue 28): F = 1, 2, 4, 8, 16, 32 concurrent workers against one API on
//! PostgreSQL behind a 2 ms round trip, ours against the reference's, on three workloads;
//! writes its own section of `BENCHMARKS.md` ([`report`]).
//!
//! ```sh
//! cargo build --release --bin ironflow-lambda && cargo build --release -p ironflow-lambda-bench
//! cargo run --release -p ironflow-lambda-bench -- fleet     # about 20 min: the section
//! cargo run --release -p ironflow-lambda-bench -- fleet --fleets 1,2 --workloads noop \
//!   --warmup-secs 1 --window-secs 3 --print-only                 # a small look
//! ```
//!
//! Ours: F processes of the bench binary as a Lambda function (the deployable binary's entry
//! point, `ironflow_lambda::run`, with this section's workflows: [`workloads`]), each fed
//! invocations back to back by its own endpoint of the managed section's Runtime API
//! stand-in, one invocation at a time (as classic Lambda runs an environment); the
//! reference's: F processes running `ironflow_worker::Worker` ([`processes`]). Each (workload,
//! F, worker) is one cell ([`cell`]): a fresh API (the real ironflow router, on threads of its
//! own) on a fresh database, the delay proxy in front of it, the backlog kept full, a warm-up,
//! then a steady-state window whose requests, CPU times, lock waits and claim latencies are
//! measured ([`postgres`], [`procfs`]).

mod callgrind;
mod cell;
mod postgres;
mod processes;
mod procfs;
mod report;
mod workloads;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use cell::{Cell, CellSpec};
pub use report::keep_section;
pub use workloads::{FleetWorkload, role_main};

use crate::BenchError;

/// Which worker a fleet is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Worker {
    /// The reference `ironflow_worker::Worker`, one process each.
    Reference,
    /// Ours: one function process each, invocations back to back.
    Ours,
}

impl Worker {
    pub fn name(self) -> &'static str {
        match self {
            Worker::Reference => "reference",
            Worker::Ours => "ours",
        }
    }
}

/// The fleet section's options (`ironflow-lambda-bench fleet --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Fleet sizes F: workers at once (our invocations, or reference worker processes; 1 to 64
    /// each).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "1,2,4,8,16,32",
          allow_hyphen_values = true, value_parser = crate::args::whole(1_u32, 64))]
    pub fleets: Vec<u32>,
    /// Workloads, in order.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "noop,shell,sleep"
    )]
    pub workloads: Vec<FleetWorkload>,
    /// Workers measured.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "reference,ours"
    )]
    pub workers: Vec<Worker>,
    /// Warm-up before each window, in seconds (0 to 3600).
    #[arg(long, value_name = "S", default_value_t = 5.0, allow_negative_numbers = true, value_parser = secs)]
    pub warmup_secs: f64,
    /// Length of each steady-state window, in seconds (default: 20 for no-op and shell, 30 for
    /// sleep; 0 to 3600).
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = secs)]
    pub window_secs: Option<f64>,
    /// A window lasts at least until this many runs have ended in it (0 to 100000).
    #[arg(long, value_name = "K", default_value_t = 20, allow_negative_numbers = true,
          value_parser = crate::args::whole(0, u64::from(crate::args::MAX_RUNS)))]
    pub min_runs: u64,
    /// C: runs executing at once per invocation of ours and per reference worker (the bench's
    /// shared `--concurrency`).
    #[arg(skip)]
    pub concurrency: u32,
    /// N: runs one invocation of ours claims at most (the bench's shared `--max-runs`).
    #[arg(skip)]
    pub max_runs: u32,
    /// Round trip added between the workers and the API, in ms (0 to 1000).
    #[arg(long, value_name = "MS", default_value_t = 2.0, allow_negative_numbers = true, value_parser = rtt_ms)]
    pub rtt_ms: f64,
    /// PostgreSQL server, a fresh database per cell (the bench's shared `--postgres-url`);
    /// `None`: the in-memory store (no PostgreSQL figures; nothing written).
    #[arg(skip)]
    pub postgres_url: Option<String>,
    /// Where the section is written (the bench's shared `--out`; default: BENCHMARKS.md of the
    /// repository).
    #[arg(skip)]
    pub out: Option<PathBuf>,
    /// Print the section only; write nothing.
    #[arg(long)]
    pub print_only: bool,
    /// Diagnostic: run every worker under valgrind's callgrind and report the user-space
    /// instructions per run over each window, the dumps kept in DIR (created if needed) for
    /// `callgrind_annotate`. The workers run 20 to 50 times slower: that run's other figures are
    /// not comparable with a normal run's, and it writes nothing to BENCHMARKS.md
    /// (`fleet/callgrind.rs`).
    #[arg(long, value_name = "DIR")]
    pub callgrind: Option<PathBuf>,
}

fn secs(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| (0.0..=3600.0).contains(v))
        .ok_or(format!("expected seconds from 0 to 3600, got {s:?}"))
}

fn rtt_ms(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| (0.0..=1000.0).contains(v))
        .ok_or(format!(
            "expected a round trip in ms from 0 to 1000, got {s:?}"
        ))
}

/// Everything the section measured.
pub struct Fleets {
    pub args: FleetArgs,
    /// The command line, for the section's header.
    pub command: Vec<String>,
    pub cells: Vec<Cell>,
    pub elapsed: Duration,
}

/// Measure every cell, then print the section and (unless `--print-only`, `--callgrind`, or
/// without PostgreSQL) write it into `BENCHMARKS.md` in place of the old one. `command` is the
/// command line given (`fleet` and its options), for the section's header.
pub async fn run(args: FleetArgs, command: Vec<String>) -> Result<(), BenchError> {
    let machine = crate::machine::Machine::read();
    let fleets = measure(args, command).await?;
    let section = report::section(&fleets, &machine.finish());
    println!("{section}");
    if fleets.args.print_only
        || fleets.args.postgres_url.is_none()
        || fleets.args.callgrind.is_some()
    {
        return Ok(());
    }
    let out =
        fleets.args.out.clone().unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../BENCHMARKS.md")
        });
    report::replace_section(&out, &section)?;
    eprintln!("replaced the fleet section of {}", out.display());
    Ok(())
}

/// Every cell: per workload, per F ascending, both workers, the one first in turn.
pub async fn measure(args: FleetArgs, command: Vec<String>) -> Result<Fleets, BenchError> {
    let started = Instant::now();
    if let Some(dir) = &args.callgrind {
        callgrind::prepare(dir)?;
    }
    let mut cells = Vec::new();
    for &workload in &args.workloads {
        for (i, &f) in args.fleets.iter().enumerate() {
            let mut workers = args.workers.clone();
            if i % 2 == 1 {
                workers.reverse();
            }
            for worker in workers {
                let spec = spec(&args, workload, worker, f as usize);
                let cell = cell::measure(&spec).await?;
                eprintln!("fleet {}", report::line(&cell));
                cells.push(cell);
            }
        }
    }
    Ok(Fleets {
        args,
        command,
        cells,
        elapsed: started.elapsed(),
    })
}

fn spec(args: &FleetArgs, workload: FleetWorkload, worker: Worker, f: usize) -> CellSpec {
    CellSpec {
        workload,
        worker,
        f,
        concurrency: args.concurrency as usize,
        max_runs: args.max_runs as usize,
        warmup: Duration::from_secs_f64(args.warmup_secs),
        window: args
            .window_secs
            .map_or_else(|| workload.default_window(), Duration::from_secs_f64),
        min_runs: args.min_runs,
        rtt: Duration::from_secs_f64(args.rtt_ms / 1000.0),
        postgres: args.postgres_url.clone(),
        callgrind: args.callgrind.as_ref().map(|dir| callgrind::Dumps {
            dir: dir.clone(),
            stem: format!("{}-{}-f{f}", worker.name(), workload.flag()),
        }),
    }
}
