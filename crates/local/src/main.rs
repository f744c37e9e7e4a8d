//! The main job end to end on an embedded default: no AWS account, no outside service.
//!
//! Starts the real ironflow API in-process (router, in-memory store, reaper) with its webhook
//! posting run events, signed, to the webhook receiver behind a Function URL stand-in
//! (`ironflow_local_api::FunctionUrl`), creates a mix of runs through its internal API, and
//! serves the receiver's wake-ups from a queue in the process (`LocalWakeQueue`) as Lambda's SQS
//! event source mapping would: an SQS event per batch of wake-ups, to the same handler the
//! Lambda runtime calls, with a short simulated deadline, a few at once; schedule ticks every
//! few seconds are the safety net. Runs start on push. When every run is terminal it stops the
//! loops, prints each invocation's summary as it ends, a final table (with each run's time from
//! creation to its first claim) and how many invocations wake-ups and ticks started; exits 1 if
//! a run is left non-terminal.
//!
//! Agent runs are among them: three of the example crate's AI patterns on the Bedrock provider,
//! against the scripted model server in the process (`agents`), a human review approved by the
//! runner itself.
//!
//! `cargo run -p ironflow-lambda-local` (`RUST_LOG=info` for the worker's logs).
//!
//! `cargo run -p ironflow-lambda-local -- --serve [PORT]` instead keeps the API up on
//! `127.0.0.1:PORT` (default 3000) with the same runs pending, without a webhook, prints the
//! environment for the deployable function (`cargo lambda watch`), and prints the table of runs
//! on Ctrl-C (exit 0: runs still pending then are not a failure). `--run WORKFLOW[=JSON]`
//! (repeatable) creates runs of your own workflows instead of the samples, for a function of
//! your own.
//!
//! `--database-url URL` (or `DATABASE_URL`) puts the API on a PostgreSQL database, the store an
//! operator's API runs on, instead of the in-memory default.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use clap::Parser;

mod agents;
mod args;
mod driver;
mod table;

use ironflow_lambda::LambdaWorker;
use ironflow_lambda::orphans;
use ironflow_lambda::wake_ups::LocalWakeQueue;
use ironflow_local_api::{Backend, FunctionUrl, LocalApi, Webhook, new_run};
use ironflow_store::store::RunStore;
use ironflow_worker::ApiRunStore;
use tokio::sync::watch;
use uuid::Uuid;

use args::{Args, RunSpec};
use driver::{Driver, Posted, push_worker, url_handler, watch_until_terminal};
use table::{drained, print_created, print_table, print_tally, report_end};

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
    let token = Uuid::new_v4().to_string();
    let backend = match args.database_url.filter(|url| !url.is_empty()) {
        Some(url) => Backend::Postgres { url },
        None => Backend::Memory,
    };
    match args.serve {
        Some(port) => serve(port.get(), &token, &backend, &args.runs).await,
        None => drain(&token, &backend).await,
    }
}

/// `--serve`: the API on `port` with the runs pending, for the deployable function; the table
/// on Ctrl-C. No webhook: the function's invocations are the user's.
async fn serve(
    port: u16,
    token: &str,
    backend: &Backend,
    asked: &[RunSpec],
) -> Result<bool, Box<dyn std::error::Error>> {
    let api = LocalApi::start_on_port(token, backend, port).await?;
    println!(
        "ironflow API ({}) listening on {}",
        backend.describe(),
        api.url()
    );
    let runs = create_runs(&api.url(), token, asked).await?;
    print_created(&runs);
    println!("Drive the deployable function against it, in another terminal:\n");
    println!(
        "  export IRONFLOW_API_URL={} IRONFLOW_WORKER_TOKEN={token} IRONFLOW_EMULATED_INVOCATION_SECS=30",
        api.url()
    );
    let function = if asked.is_empty() {
        "ironflow-lambda"
    } else {
        "<your function's binary>"
    };
    println!("  cargo lambda watch --bin {function}");
    println!("  cargo lambda invoke {function} --data-ascii '{{}}'\n");
    println!("Ctrl-C prints the runs and stops the API.");
    tokio::signal::ctrl_c().await?;
    // Runs left pending are expected here (the function may not have been invoked): the exit
    // status says only whether the API ran.
    let terminal = print_table(&api, &runs, None).await?;
    println!(
        "\n{terminal} of {} runs are terminal (the others were not run to the end)",
        runs.len()
    );
    Ok(true)
}

/// The default mode: the API's webhook through the Function URL stand-in to the receiver, its
/// wake-ups through a queue in the process to invocations (an SQS event each, as an event
/// source mapping sends), schedule ticks as the safety net, until every run is terminal.
async fn drain(token: &str, backend: &Backend) -> Result<bool, Box<dyn std::error::Error>> {
    // The front door first: the API's webhook needs its URL; the worker needs the API's.
    let secret = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let receiver: Arc<OnceLock<Arc<LambdaWorker>>> = Arc::default();
    let posted = Arc::new(Posted::default());
    let front = FunctionUrl::start(url_handler(receiver.clone(), posted.clone())).await?;
    let webhook = Webhook {
        url: front.url(),
        signing_secret: Some(secret.clone()),
    };
    let api = LocalApi::start_with_webhook(token, backend, webhook).await?;
    println!(
        "ironflow API ({}) listening on {}",
        backend.describe(),
        api.url()
    );
    println!(
        "its webhook posts run events, signed, to the receiver behind a Function URL stand-in at {}",
        front.url()
    );
    let queue = Arc::new(LocalWakeQueue::new());
    let (model, provider) = agents::start().await?;
    let worker = Arc::new(push_worker(
        &api.url(),
        token,
        &secret,
        queue.clone(),
        Arc::new(provider),
    )?);
    // Set before any run exists: no event reaches the receiver earlier.
    let _ = receiver.set(worker.clone());

    let (stop, stopped) = watch::channel(false);
    let driver = Driver::new(worker, queue.clone(), stop);
    let drive = tokio::spawn(driver.clone().drive(stopped));
    let created = async {
        let mut runs = create_runs(&api.url(), token, &[]).await?;
        let reviewed = create_agent_runs(&api.url(), token, &mut runs).await?;
        let bearer = api.admin_bearer().await?;
        Ok::<_, Box<dyn std::error::Error>>((runs, reviewed, bearer))
    };
    let (runs, reviewed, bearer) = match created.await {
        Ok(created) => created,
        Err(e) => {
            driver.stop();
            let _ = drive.await;
            return Err(e);
        }
    };
    print_created(&runs);
    let reviewer = tokio::spawn(agents::review(
        api.url(),
        bearer,
        api.store().clone(),
        reviewed,
    ));
    let claims = watch_until_terminal(&api, &runs, &driver, drive).await?;
    reviewer.abort();
    let record = std::mem::take(&mut *driver.record());
    if let Some(error) = record.error {
        return Err(error.into());
    }
    let terminal = print_table(&api, &runs, Some(&drained(&record, claims))).await?;
    print_tally(&record.invocations, &posted, queue.len());
    agents::print_calls(&model);
    // Nothing left running: the loops have ended; the API and then the receiver's front door
    // stop here.
    drop(api);
    drop(front);
    Ok(report_end(terminal, runs.len(), record.invocations.len()))
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

/// The agent runs ([`agents::runs`]), created as the samples are and added to `runs`: the ids of
/// those the runner approves.
async fn create_agent_runs(
    url: &str,
    token: &str,
    runs: &mut Vec<Uuid>,
) -> Result<Vec<Uuid>, Box<dyn std::error::Error>> {
    let client = ApiRunStore::new(url, token);
    let mut reviewed = Vec::new();
    for (workflow, payload) in agents::runs() {
        // As the README asks of runs on Lambda: a retry for an invocation's death.
        let mut run = new_run(workflow, 1);
        run.payload = payload;
        let id = client.create_run(run).await?.into_run().id;
        if workflow == agents::REVIEWED {
            reviewed.push(id);
        }
        runs.push(id);
    }
    Ok(reviewed)
}
