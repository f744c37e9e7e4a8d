//! The main job end to end on an embedded default: no AWS account, no outside service.
//!
//! Starts the real ironflow API in-process (router, in-memory store, reaper), creates a mix of
//! runs through its internal API, then drives invocations through the same handler the Lambda
//! runtime calls, each with a short simulated deadline, until every run is terminal. Prints each
//! invocation's summary and a final table; exits 1 if a run is left non-terminal.
//!
//! `cargo run --bin ironflow-lambda-local` (`RUST_LOG=info` for the worker's logs).
//!
//! `cargo run --bin ironflow-lambda-local -- --serve [PORT]` instead keeps the API up on
//! `127.0.0.1:PORT` (default 3000) with the same runs pending, prints the environment for the
//! deployable function (`cargo lambda watch`), and prints the table of runs on Ctrl-C (exit 0:
//! runs still pending then are not a failure). `--run WORKFLOW[=JSON]` (repeatable) creates
//! runs of your own workflows instead of the samples, for a function of your own.
//!
//! `--database-url URL` (or `DATABASE_URL`) puts the API on a PostgreSQL database, the store an
//! operator's API runs on, instead of the in-memory default.

use std::collections::{BTreeSet, HashMap};
use std::io::IsTerminal;
use std::num::NonZeroU16;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_lambda::{orphans, samples};
use ironflow_local_api::{Backend, LocalApi, new_run};
use ironflow_store::entities::StepStatus;
use ironflow_store::store::{RunStore, Store};
use ironflow_worker::ApiRunStore;
use lambda_runtime::{Context, LambdaEvent};
use uuid::Uuid;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "ironflow-lambda-local",
    about = "Run ironflow-lambda end to end on the embedded ironflow API (no AWS account): the \
             sample runs through simulated invocations until every one is terminal, then their table"
)]
struct Args {
    /// Instead, keep the API up on 127.0.0.1:PORT (default 3000) with the runs pending, for a
    /// function under `cargo lambda watch`; Ctrl-C prints the table of runs.
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "3000")]
    serve: Option<NonZeroU16>,
    /// The API's store: a PostgreSQL database (postgres://user:password@host:5432/db; its
    /// migrations are applied) instead of the in-memory default.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        value_name = "URL",
        value_parser = parse_database_url
    )]
    database_url: Option<String>,
    /// With --serve: create a run of WORKFLOW, with the JSON object after `=` as its payload
    /// (e.g. --run 'greet={"name":"Ada"}'), instead of the sample runs. Repeatable.
    #[arg(long = "run", value_name = "WORKFLOW[=JSON]", requires = "serve", value_parser = parse_run)]
    runs: Vec<RunSpec>,
}

/// A run to create: its workflow and payload.
#[derive(Debug, Clone)]
struct RunSpec {
    workflow: String,
    payload: serde_json::Value,
}

/// `WORKFLOW` or `WORKFLOW=JSON` (a JSON object).
/// A PostgreSQL URL (`postgres://` or `postgresql://`); empty, as an unset variable often is,
/// means none (the in-memory store). The error never shows the URL (it may hold a password).
fn parse_database_url(arg: &str) -> Result<String, String> {
    let url = arg.trim();
    if url.is_empty() || url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(url.to_string())
    } else {
        Err("expected a PostgreSQL URL such as postgres://user:password@host:5432/db".into())
    }
}

fn parse_run(arg: &str) -> Result<RunSpec, String> {
    let (workflow, payload) = match arg.split_once('=') {
        Some((workflow, json)) => {
            let payload: serde_json::Value = serde_json::from_str(json)
                .map_err(|e| format!("the payload after '=' is not JSON ({e}): {json}"))?;
            if !payload.is_object() {
                return Err(format!(
                    "the payload after '=' must be a JSON object, got {json}"
                ));
            }
            (workflow, payload)
        }
        None => (arg, serde_json::json!({})),
    };
    if workflow.trim().is_empty() {
        return Err("expected WORKFLOW or WORKFLOW=JSON, with a workflow name".into());
    }
    Ok(RunSpec {
        workflow: workflow.trim().to_string(),
        payload,
    })
}

/// Simulated invocation length: short, so that the multi-step workflow is handed back.
const INVOCATION: Duration = Duration::from_secs(4);
const MAX_INVOCATIONS: usize = 40;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(e) => {
            if let Ok(value) = std::env::var("RUST_LOG") {
                eprintln!(
                    "RUST_LOG={value:?} is not a log filter ({e}); expected e.g. info or \
                     ironflow_lambda=debug: the worker's logs stay off"
                );
            }
            tracing_subscriber::EnvFilter::new("off")
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // No colour codes when the output goes to a file or a pipe.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    orphans::become_subreaper();
    let args = Args::parse();
    let serve = args.serve.map(NonZeroU16::get);
    let token = Uuid::new_v4().to_string();
    let backend = match args.database_url.filter(|url| !url.is_empty()) {
        Some(url) => Backend::Postgres { url },
        None => Backend::Memory,
    };
    let api = match serve {
        Some(port) => LocalApi::start_on_port(&token, &backend, port).await?,
        None => LocalApi::start_on(&token, &backend).await?,
    };
    println!(
        "ironflow API ({}) listening on {}",
        backend.describe(),
        api.url()
    );
    let runs = create_runs(&api.url(), &token, &args.runs).await?;
    println!(
        "created {} run{} through POST /api/v1/internal/runs\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );

    if serve.is_some() {
        println!("Drive the deployable function against it, in another terminal:\n");
        println!(
            "  export IRONFLOW_API_URL={} IRONFLOW_WORKER_TOKEN={token} IRONFLOW_EMULATED_INVOCATION_SECS=30",
            api.url()
        );
        let function = if args.runs.is_empty() {
            "ironflow-lambda"
        } else {
            "<your function's binary>"
        };
        println!("  cargo lambda watch --bin {function}");
        println!("  cargo lambda invoke {function} --data-ascii '{{}}'\n");
        println!("Ctrl-C prints the runs and stops the API.");
        tokio::signal::ctrl_c().await?;
        // Runs left pending are expected here (the function may not have been invoked): the
        // exit status says only whether the API ran.
        let terminal = print_table(&api, &runs, None).await?;
        println!(
            "\n{terminal} of {} runs are terminal (the others were not run to the end)",
            runs.len()
        );
        return Ok(true);
    }

    let worker = LambdaWorkerBuilder::new(&api.url(), &token)
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(samples::QuickShell)
        .register(samples::MultiStep { step_secs: 1.2 })
        .register(samples::Flaky)
        .register(samples::AlwaysFails)
        .max_runs_per_invocation(4)
        .concurrency(2)
        .function_timeout(INVOCATION)
        .deadline_margin(Duration::from_millis(1000))
        .min_claim_budget(Duration::from_millis(300))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_secs(1))
        .poison_threshold(3)
        .poison_cooldown(Duration::from_secs(60))
        .build()?;

    let mut invocations_per_run: HashMap<Uuid, usize> = HashMap::new();
    for n in 1..=MAX_INVOCATIONS {
        if all_terminal(api.store(), &runs).await {
            break;
        }
        let mut context = Context::default();
        context.request_id = format!("local-{n}");
        context.deadline = epoch_ms() + INVOCATION.as_millis() as u64;
        let response =
            ironflow_lambda::handle(&worker, LambdaEvent::new(serde_json::json!({}), context))
                .await?;
        println!("invocation {n}: {response}");
        let claimed = response["runs"].as_array().map_or(0, Vec::len);
        for r in response["runs"].as_array().into_iter().flatten() {
            if let Some(id) = r["run_id"].as_str().and_then(|s| Uuid::parse_str(s).ok()) {
                *invocations_per_run.entry(id).or_default() += 1;
            }
        }
        if claimed == 0 {
            // Nothing claimable right now (a lease waiting for the reaper): wait a little.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    let terminal = print_table(&api, &runs, Some(&invocations_per_run)).await?;
    if terminal == runs.len() {
        println!("\nall {} runs are terminal", runs.len());
        Ok(true)
    } else {
        println!(
            "\n{} of {} runs are not terminal after {MAX_INVOCATIONS} invocations",
            runs.len() - terminal,
            runs.len()
        );
        Ok(false)
    }
}

/// Print the final table of runs, and return how many are terminal.
///
/// `invocations_per_run`: the invocations that listed each run (`None` under `--serve`, where
/// the deployable function's invocations are not seen here). Steps are counted by position: a
/// step interrupted at a handback (or failed before a run-level retry) keeps its row, and the
/// run's next execution adds another for the same position, shown apart as an earlier attempt.
/// A step's own retries (its retry policy) stay in one row.
async fn print_table(
    api: &LocalApi,
    runs: &[Uuid],
    invocations_per_run: Option<&HashMap<Uuid, usize>>,
) -> Result<usize, Box<dyn std::error::Error>> {
    println!(
        "\n{:<14} {:<38} {:<10} {:>11} {:<26}  error",
        "workflow", "run", "state", "invocations", "steps done/all"
    );
    let mut terminal = 0;
    for id in runs {
        let Some(run) = api.store().get_run(*id).await? else {
            continue;
        };
        let steps = api.store().list_steps(*id).await?;
        let positions: BTreeSet<u32> = steps.iter().map(|s| s.position).collect();
        let done: BTreeSet<u32> = steps
            .iter()
            .filter(|s| s.status.state == StepStatus::Completed)
            .map(|s| s.position)
            .collect();
        let mut step_count = format!("{}/{}", done.len(), positions.len());
        match steps.len() - positions.len() {
            0 => {}
            1 => step_count.push_str(" +1 earlier attempt"),
            n => step_count.push_str(&format!(" +{n} earlier attempts")),
        }
        if run.status.state.is_terminal() {
            terminal += 1;
        }
        println!(
            "{:<14} {:<38} {:<10} {:>11} {:<26}  {}",
            run.workflow_name,
            // Uuid's Display ignores the width: pad its string.
            run.id.to_string(),
            run.status.state.to_string(),
            invocations_per_run.map_or("-".to_string(), |per_run| per_run
                .get(id)
                .copied()
                .unwrap_or(0)
                .to_string()),
            step_count,
            run.error.as_deref().unwrap_or("")
        );
    }
    Ok(terminal)
}

/// The runs to drain, created through the API's internal route: `asked` (`--run`), else the
/// mix of sample runs.
async fn create_runs(
    url: &str,
    token: &str,
    asked: &[RunSpec],
) -> Result<Vec<Uuid>, Box<dyn std::error::Error>> {
    let client = ApiRunStore::new(url, token);
    let samples = [
        ("quick-shell", 3),
        ("multi-step", 2),
        ("flaky", 1),
        ("always-fails", 5),
    ];
    let specs: Vec<RunSpec> = if asked.is_empty() {
        samples
            .iter()
            .flat_map(|(workflow, count)| {
                (0..*count).map(|_| RunSpec {
                    workflow: (*workflow).to_string(),
                    payload: serde_json::json!({}),
                })
            })
            .collect()
    } else {
        asked.to_vec()
    };
    let mut runs = Vec::new();
    for spec in specs {
        let mut run = new_run(&spec.workflow, 0);
        run.payload = spec.payload;
        runs.push(client.create_run(run).await?.into_run().id);
    }
    Ok(runs)
}

async fn all_terminal(store: &Arc<dyn Store>, runs: &[Uuid]) -> bool {
    for id in runs {
        match store.get_run(*id).await {
            Ok(Some(run)) if run.status.state.is_terminal() => {}
            _ => return false,
        }
    }
    true
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
