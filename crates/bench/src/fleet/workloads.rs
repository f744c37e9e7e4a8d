//! The fleet section's three workloads and the two worker processes that run them: our
//! function ([`function_main`]: `ironflow_lambda::run`, the deployable binary's entry point,
//! with the three workflows registered) and the reference worker ([`reference_main`]:
//! `ironflow_worker::Worker::run`), each the bench binary started again with
//! [`ROLE`] set.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_worker::WorkerBuilder;

use crate::workload::{NoOp, ThreeStepShell, Workload};

/// Set in a process's environment, the bench binary is one of the fleet's workers instead:
/// `function` ([`function_main`]) or `reference` ([`reference_main`]).
pub const ROLE: &str = "IRONFLOW_LAMBDA_BENCH_FLEET_ROLE";
/// The reference worker's poll interval, in ms ([`reference_main`]).
pub const POLL_MS: &str = "IRONFLOW_LAMBDA_BENCH_FLEET_POLL_MS";

/// A workload of the fleet section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum FleetWorkload {
    /// A handler with no step.
    Noop,
    /// Three shell steps, each `echo`ing a line.
    Shell,
    /// Three shell steps, each `sleep 1`: I/O-bound, the steps wait.
    Sleep,
}

impl FleetWorkload {
    /// The workflow's name.
    pub fn workflow(self) -> &'static str {
        match self {
            Self::Noop => Workload::NoOp.name(),
            Self::Shell => Workload::ThreeStepShell.name(),
            Self::Sleep => SLEEP_WORKFLOW,
        }
    }

    /// Its name on the command line.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Noop => "noop",
            Self::Shell => "shell",
            Self::Sleep => "sleep",
        }
    }

    /// Its name in the report.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Noop => Workload::NoOp.describe(),
            Self::Shell => Workload::ThreeStepShell.describe(),
            Self::Sleep => "I/O-bound (`sleep 1` ×3)",
        }
    }

    /// The default length of its steady-state window: the sleeping runs take 3 s each, so
    /// their window is longer.
    pub fn default_window(self) -> Duration {
        match self {
            Self::Noop | Self::Shell => Duration::from_secs(20),
            Self::Sleep => Duration::from_secs(30),
        }
    }
}

/// The I/O-bound workflow's name.
pub const SLEEP_WORKFLOW: &str = "bench-sleep-3";

/// Three shell steps, each waiting a second (`sleep 1`).
pub struct ThreeStepSleep;

impl WorkflowHandler for ThreeStepSleep {
    fn name(&self) -> &str {
        SLEEP_WORKFLOW
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for step in ["wait-a", "wait-b", "wait-c"] {
                ctx.shell(step, ShellConfig::new("sleep 1")).await?;
            }
            Ok(())
        })
    }
}

fn register_ours(b: LambdaWorkerBuilder) -> LambdaWorkerBuilder {
    b.provider(Arc::new(ClaudeCodeProvider::new()))
        .register(NoOp)
        .register(ThreeStepShell)
        .register(ThreeStepSleep)
}

fn register_reference(b: WorkerBuilder) -> WorkerBuilder {
    b.provider(Arc::new(ClaudeCodeProvider::new()))
        .register(NoOp)
        .register(ThreeStepShell)
        .register(ThreeStepSleep)
}

/// The bench binary as one of the fleet's workers, when [`ROLE`] says so; `None` otherwise.
pub fn role_main() -> Option<ExitCode> {
    match std::env::var(ROLE).ok()?.as_str() {
        "function" => Some(function_main()),
        "reference" => Some(reference_main()),
        other => {
            eprintln!("error: {ROLE}={other:?}: expected `function` or `reference`");
            Some(ExitCode::FAILURE)
        }
    }
}

/// Our function: `ironflow_lambda::run` (configured by the environment, as deployed) with the
/// three workflows.
pub fn function_main() -> ExitCode {
    ironflow_lambda::run(register_ours)
}

/// The reference worker: `Worker::run` against `IRONFLOW_API_URL` with
/// `IRONFLOW_WORKER_TOKEN`, at `IRONFLOW_CONCURRENCY` runs at once, polling every [`POLL_MS`]
/// ms after an empty poll. Runs until killed.
pub fn reference_main() -> ExitCode {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let number = |name: &str| -> Result<u64, String> {
        var(name)?
            .parse()
            .map_err(|e| format!("{name}: expected a whole number ({e})"))
    };
    let worker = (|| -> Result<ironflow_worker::Worker, String> {
        let builder = WorkerBuilder::new(&var("IRONFLOW_API_URL")?, &var("IRONFLOW_WORKER_TOKEN")?);
        register_reference(builder)
            .concurrency(usize::try_from(number("IRONFLOW_CONCURRENCY")?).unwrap_or(1))
            .poll_interval(Duration::from_millis(number(POLL_MS)?))
            .build()
            .map_err(|e| e.to_string())
    })();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match (worker, runtime) {
        (Ok(worker), Ok(runtime)) => match runtime.block_on(worker.run()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: the reference worker stopped: {e}");
                ExitCode::FAILURE
            }
        },
        (Err(e), _) => {
            eprintln!("error: the reference worker could not start: {e}");
            ExitCode::FAILURE
        }
        (_, Err(e)) => {
            eprintln!("error: the reference worker's runtime could not start: {e}");
            ExitCode::FAILURE
        }
    }
}
