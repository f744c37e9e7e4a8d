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
//! `cargo run --bin ironflow-lambda-local` (`RUST_LOG=info` for the worker's logs).
//!
//! `cargo run --bin ironflow-lambda-local -- --serve [PORT]` instead keeps the API up on
//! `127.0.0.1:PORT` (default 3000) with the same runs pending, without a webhook, prints the
//! environment for the deployable function (`cargo lambda watch`), and prints the table of runs
//! on Ctrl-C (exit 0: runs still pending then are not a failure). `--run WORKFLOW[=JSON]`
//! (repeatable) creates runs of your own workflows instead of the samples, for a function of
//! your own.
//!
//! `--database-url URL` (or `DATABASE_URL`) puts the API on a PostgreSQL database, the store an
//! operator's API runs on, instead of the in-memory default.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::IsTerminal;
use std::num::NonZeroU16;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use clap::Parser;

mod agents;

use ironflow_core::provider::AgentProvider;
use ironflow_lambda::{
    InvocationSummary, LambdaWorker, LambdaWorkerBuilder, Response, settings::WakeSettings,
    wake_ups::LocalWakeQueue, wake_ups::WakeQueue, wake_ups::Waker,
};
use ironflow_lambda::{orphans, samples};
use ironflow_local_api::{Backend, FunctionUrl, LocalApi, UrlHandler, Webhook, new_run};
use ironflow_store::entities::StepStatus;
use ironflow_store::store::{RunStore, Store};
use ironflow_worker::ApiRunStore;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use uuid::Uuid;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "ironflow-lambda-local",
    about = "Run ironflow-lambda end to end on the embedded ironflow API (no AWS account): the \
             sample runs, started on push (the API's webhook, the receiver's wake-ups, simulated \
             SQS invocations), until every one is terminal, then their table"
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

/// `WORKFLOW` or `WORKFLOW=JSON` (a JSON object).
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
/// Invocations started at most, wake-ups and ticks together.
const MAX_INVOCATIONS: usize = 40;
/// Invocations from the wake queue at once at most, as an event source mapping's maximum
/// concurrency bounds them.
const QUEUE_CONCURRENCY: usize = 3;
/// The schedule's period, the first tick one period after the start: the safety net, not what
/// starts runs (the deployed rule ticks every minute).
const TICK_EVERY: Duration = Duration::from_secs(10);
/// Delay of the wake-ups sent after a handback: 1 s (`IRONFLOW_WAKE_DELAY_SECS`, deployed 5 s
/// by default so that the wake-up finds the sender's instance warm; here there is none to find).
const HANDBACK_WAKE_DELAY: Duration = Duration::from_secs(1);
/// How often the runner reads the runs' states (first claims, the end).
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// Delay before a wake-up its invocation reported as a batch item failure is visible again (as
/// SQS's visibility timeout, shortened).
const RETRY_DELAY_SECS: u64 = 2;

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

fn print_created(runs: &[Uuid]) {
    println!(
        "created {} run{} through POST /api/v1/internal/runs\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
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
    let driver = Arc::new(Driver {
        worker,
        queue: queue.clone(),
        started: AtomicUsize::new(0),
        record: Mutex::default(),
        stop,
    });
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

/// The worker of the default mode: the samples and the example's AI patterns on `provider`, the
/// receiver with `secret`, its wake-ups on `queue`, several invocations at once.
fn push_worker(
    api_url: &str,
    token: &str,
    secret: &str,
    queue: Arc<LocalWakeQueue>,
    provider: Arc<dyn AgentProvider>,
) -> Result<LambdaWorker, ironflow_lambda::BuildError> {
    let mut wake = WakeSettings::new("local://ironflow-wake");
    wake.handback_delay = HANDBACK_WAKE_DELAY;
    let builder = LambdaWorkerBuilder::new(api_url, token).provider(provider);
    let worker = my_workflows::patterns::register(builder)
        .register(samples::QuickShell)
        .register(samples::MultiStep { step_secs: 1.2 })
        .register(samples::Flaky)
        .register(samples::AlwaysFails)
        .max_runs_per_invocation(4)
        .concurrency(2)
        // One process serving the queue's invocations and a tick at once, as a Managed
        // Instances process does (on-demand Lambda would give each its own environment).
        .concurrent_invocations(QUEUE_CONCURRENCY + 1)
        .function_timeout(INVOCATION)
        .deadline_margin(Duration::from_millis(1000))
        .min_claim_budget(Duration::from_millis(300))
        .lease_ttl(Duration::from_secs(10))
        .lease_refresh_interval(Duration::from_secs(1))
        .poison_threshold(3)
        .poison_cooldown(Duration::from_secs(60))
        .webhook_secret(secret)
        .wake_ups(Waker::to_queue(queue, wake))
        .build()?;
    println!(
        "wake-ups go to a queue in this process, served as an SQS event source mapping \
         ({QUEUE_CONCURRENCY} invocations at once at most, one worker serving {} at once); a \
         schedule tick every {}s is the safety net",
        QUEUE_CONCURRENCY + 1,
        TICK_EVERY.as_secs()
    );
    Ok(worker)
}

/// Watch the store until every run is terminal, or the invocations ran out (or one failed);
/// then stop the driver and wait for its loops. The claims seen.
async fn watch_until_terminal(
    api: &LocalApi,
    runs: &[Uuid],
    driver: &Driver,
    mut drive: tokio::task::JoinHandle<()>,
) -> Result<Claims, Box<dyn std::error::Error>> {
    let mut claims = Claims::default();
    let mut drive_ended = false;
    loop {
        if claims.watch(api.store(), runs).await {
            break;
        }
        tokio::select! {
            ended = &mut drive => {
                drive_ended = true;
                ended?;
                break;
            }
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
    }
    driver.stop();
    if !drive_ended {
        drive.await?;
    }
    claims.watch(api.store(), runs).await;
    Ok(claims)
}

/// What the table shows of the drive: invocations per run and each run's claim time.
fn drained(record: &Record, claims: Claims) -> Drained {
    let mut invocations_per_run: HashMap<Uuid, usize> = HashMap::new();
    for invoked in &record.invocations {
        for id in &invoked.claimed {
            *invocations_per_run.entry(*id).or_default() += 1;
        }
    }
    Drained {
        invocations_per_run,
        claim_ms: claims.claim_ms,
    }
}

/// The last line: whether every run is terminal.
fn report_end(terminal: usize, runs: usize, invocations: usize) -> bool {
    if terminal == runs {
        println!("\nall {runs} runs are terminal");
        true
    } else {
        println!(
            "\n{} of {runs} runs are not terminal after {invocations} invocations",
            runs - terminal
        );
        false
    }
}

/// The Function URL's function: each request, as Lambda's event, to the handler (the webhook
/// receiver), counted in `posted`.
fn url_handler(worker: Arc<OnceLock<Arc<LambdaWorker>>>, posted: Arc<Posted>) -> UrlHandler {
    Arc::new(move |event| {
        let worker = worker.get().cloned();
        let posted = posted.clone();
        Box::pin(async move {
            let Some(worker) = worker else {
                // Before the worker is built (no run exists yet): the API's webhook retries.
                return json!({"statusCode": 503, "body": r#"{"error":"starting"}"#});
            };
            let mut context = Context::default();
            context.request_id = format!("local-url-{}", Uuid::new_v4());
            context.deadline = epoch_ms() + INVOCATION.as_millis() as u64;
            let answer = match ironflow_lambda::handle(&worker, LambdaEvent::new(event, context))
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    json!({"statusCode": 500, "body": json!({"error": e.to_string()}).to_string()})
                }
            };
            posted.count(&answer);
            answer
        })
    })
}

/// The webhook requests the receiver answered.
#[derive(Debug, Default)]
struct Posted {
    /// Every request.
    events: AtomicUsize,
    /// Those that sent wake-ups (202, `"woke": true`).
    woke: AtomicUsize,
    /// Those answered with another status than 2xx.
    refused: AtomicUsize,
}

impl Posted {
    fn count(&self, answer: &Value) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let status = answer["statusCode"].as_u64().unwrap_or(0);
        if !(200..300).contains(&status) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        let body: Value = answer["body"]
            .as_str()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        if body["woke"] == true {
            self.woke.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The first claim of each run, read from the API's store.
#[derive(Debug, Default)]
struct Claims {
    /// Milliseconds from each run's `created_at` to the first `started_at` seen.
    claim_ms: HashMap<Uuid, i64>,
    /// Runs seen terminal and claimed: not read again.
    done: HashSet<Uuid>,
}

impl Claims {
    /// Read the runs: record first claims, and say whether every run is terminal. The in-memory
    /// store sets `started_at` again at each claim: a run's first one is the first seen, read
    /// every [`WATCH_EVERY`] (a run is claimed again only after a handback, seconds later).
    async fn watch(&mut self, store: &Arc<dyn Store>, runs: &[Uuid]) -> bool {
        let mut all = true;
        for id in runs {
            if self.done.contains(id) {
                continue;
            }
            let Ok(Some(run)) = store.get_run(*id).await else {
                all = false;
                continue;
            };
            if let Some(started) = run.started_at {
                self.claim_ms
                    .entry(*id)
                    .or_insert_with(|| (started - run.created_at).num_milliseconds());
            }
            if run.status.state.is_terminal() {
                if run.started_at.is_some() {
                    self.done.insert(*id);
                }
            } else {
                all = false;
            }
        }
        all
    }
}

/// What the default mode's invocations did, for the table.
struct Drained {
    /// The invocations that listed each run.
    invocations_per_run: HashMap<Uuid, usize>,
    /// Milliseconds from each run's creation to its first claim.
    claim_ms: HashMap<Uuid, i64>,
}

/// What started an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Trigger {
    /// An SQS event of wake-ups from the queue, with each one's `reason` (`pushed`,
    /// `handed_back`, `backlog`).
    WakeUps(Vec<String>),
    /// A schedule tick.
    Tick,
}

/// One invocation: its trigger and the runs it claimed.
#[derive(Debug)]
struct Invoked {
    trigger: Trigger,
    claimed: Vec<Uuid>,
}

#[derive(Debug, Default)]
struct Record {
    invocations: Vec<Invoked>,
    /// The first invocation that failed (the handler's error): the drive stops.
    error: Option<String>,
}

/// Drives invocations of the handler: from the wake queue and on schedule ticks.
struct Driver {
    worker: Arc<LambdaWorker>,
    queue: Arc<LocalWakeQueue>,
    /// Invocations started.
    started: AtomicUsize,
    record: Mutex<Record>,
    stop: watch::Sender<bool>,
}

impl Driver {
    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stop both loops: they end once their invocations have.
    fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// The next invocation's number, `None` once [`MAX_INVOCATIONS`] have started.
    fn next_number(&self) -> Option<usize> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        (n <= MAX_INVOCATIONS).then_some(n)
    }

    /// Both loops, until stopped or out of invocations.
    async fn drive(self: Arc<Self>, stopped: watch::Receiver<bool>) {
        tokio::join!(
            self.clone().serve_queue(stopped.clone()),
            self.clone().tick(stopped)
        );
    }

    /// As an SQS event source mapping: take the visible wake-ups (10 at most), invoke the
    /// handler with them as one SQS event, [`QUEUE_CONCURRENCY`] invocations at once at most.
    async fn serve_queue(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(QUEUE_CONCURRENCY));
        let mut running = JoinSet::new();
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let bodies = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                bodies = self.queue.receive(far) => bodies,
            };
            let permit = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => None,
                permit = permits.clone().acquire_owned() => permit.ok(),
            };
            let number = permit.as_ref().and_then(|_| self.next_number());
            let (Some(permit), Some(n)) = (permit, number) else {
                // Stopped, or out of invocations: the wake-ups stay on the queue.
                for body in &bodies {
                    self.queue.send(1, body, 0, None).await;
                }
                break;
            };
            let this = self.clone();
            running.spawn(async move {
                this.invoke_queue(n, bodies).await;
                drop(permit);
            });
            while let Some(ended) = running.try_join_next() {
                self.check(ended);
            }
        }
        while let Some(ended) = running.join_next().await {
            self.check(ended);
        }
    }

    fn check(&self, ended: Result<(), tokio::task::JoinError>) {
        if let Err(e) = ended {
            self.fail(format!("an invocation's task failed: {e}"));
        }
    }

    fn fail(&self, error: String) {
        self.record().error.get_or_insert(error);
        self.stop();
    }

    /// A schedule tick every [`TICK_EVERY`], the first one period after the start.
    async fn tick(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut every = tokio::time::interval_at(Instant::now() + TICK_EVERY, TICK_EVERY);
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                _ = every.tick() => {}
            }
            let Some(n) = self.next_number() else { break };
            let tick = json!({
                "version": "0",
                "id": Uuid::new_v4(),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": "000000000000",
                "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "region": "local",
                "resources": ["arn:aws:events:local:000000000000:rule/ironflow-lambda-local"],
                "detail": {}
            });
            if let Some(response) = self.invoke(n, tick, "schedule tick").await {
                self.note(Trigger::Tick, response.summary());
            }
        }
    }

    /// One invocation from the queue; its batch item failures go back on the queue, visible
    /// again after [`RETRY_DELAY_SECS`].
    async fn invoke_queue(&self, n: usize, bodies: Vec<String>) {
        let ids: Vec<String> = (0..bodies.len())
            .map(|i| format!("local-{n}-{i}"))
            .collect();
        let records: Vec<Value> = ids
            .iter()
            .zip(&bodies)
            .map(|(id, body)| {
                json!({
                    "messageId": id,
                    "body": body,
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:local:000000000000:ironflow-wake",
                })
            })
            .collect();
        let reasons: Vec<String> = bodies
            .iter()
            .map(|body| {
                serde_json::from_str::<Value>(body)
                    .ok()
                    .and_then(|b| b["reason"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "?".to_string())
            })
            .collect();
        let label = format!(
            "SQS, {} wake-up{}: {}",
            bodies.len(),
            if bodies.len() == 1 { "" } else { "s" },
            by_reason(reasons.iter())
                .iter()
                .map(|(reason, count)| match count {
                    1 => reason.to_string(),
                    n => format!("{reason} ×{n}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        let Some(response) = self.invoke(n, json!({ "Records": records }), &label).await else {
            return;
        };
        let failures = response.to_json()["batchItemFailures"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for failure in failures {
            let id = failure["itemIdentifier"].as_str().unwrap_or("");
            if let Some(i) = ids.iter().position(|m| m == id) {
                self.queue.send(1, &bodies[i], RETRY_DELAY_SECS, None).await;
            }
        }
        self.note(Trigger::WakeUps(reasons), response.summary());
    }

    /// Invoke the handler with `payload` under a deadline [`INVOCATION`] away, and print its
    /// summary; `None` (and the drive stops) when the handler fails.
    async fn invoke(&self, n: usize, payload: Value, label: &str) -> Option<Response> {
        let mut context = Context::default();
        context.request_id = format!("local-{n}");
        context.deadline = epoch_ms() + INVOCATION.as_millis() as u64;
        match ironflow_lambda::handle_response(&self.worker, LambdaEvent::new(payload, context))
            .await
        {
            Ok(response) => {
                match response.summary() {
                    Some(summary) => println!(
                        "invocation {n} ({label}): {}",
                        serde_json::to_value(summary).unwrap_or_default()
                    ),
                    None => println!(
                        "invocation {n} ({label}): no batch ran: {}",
                        response.to_json()
                    ),
                }
                Some(response)
            }
            Err(e) => {
                println!("invocation {n} ({label}): failed: {e}");
                self.fail(e.to_string());
                None
            }
        }
    }

    fn note(&self, trigger: Trigger, summary: Option<&InvocationSummary>) {
        let claimed = summary.map_or_else(Vec::new, |s| s.runs.iter().map(|r| r.run_id).collect());
        self.record().invocations.push(Invoked { trigger, claimed });
    }
}

/// Each reason and how many times it occurs, by name.
fn by_reason<'a>(reasons: impl Iterator<Item = &'a String>) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for reason in reasons {
        *counts.entry(reason.as_str()).or_default() += 1;
    }
    counts
}

/// How many invocations wake-ups and ticks started, what they claimed, and what the webhook
/// posted.
fn print_tally(invocations: &[Invoked], posted: &Posted, left_on_queue: usize) {
    let reasons: Vec<&String> = invocations
        .iter()
        .flat_map(|i| match &i.trigger {
            Trigger::WakeUps(reasons) => reasons.iter().collect(),
            Trigger::Tick => Vec::new(),
        })
        .collect();
    let from_queue = invocations
        .iter()
        .filter(|i| i.trigger != Trigger::Tick)
        .count();
    let pushed = invocations
        .iter()
        .filter(|i| matches!(&i.trigger, Trigger::WakeUps(r) if r.iter().any(|r| r == "pushed")))
        .count();
    let ticks = invocations.len() - from_queue;
    let claimed_by = |tick: bool| -> usize {
        invocations
            .iter()
            .filter(|i| (i.trigger == Trigger::Tick) == tick)
            .map(|i| i.claimed.len())
            .sum()
    };
    let counts = by_reason(reasons.iter().copied());
    println!(
        "\ninvocations: {} = {from_queue} from the wake queue ({pushed} with a pushed wake-up) + \
         {ticks} schedule tick{}",
        invocations.len(),
        if ticks == 1 { "" } else { "s" }
    );
    // Pushed first, then the batches' own (handed_back, backlog, due), as they occurred.
    let mut kinds = vec![format!(
        "{} pushed",
        counts.get("pushed").copied().unwrap_or(0)
    )];
    kinds.extend(
        counts
            .iter()
            .filter(|(reason, _)| **reason != "pushed")
            .map(|(reason, n)| format!("{n} {reason}")),
    );
    println!(
        "wake-ups taken from the queue: {} ({})",
        reasons.len(),
        kinds.join(", ")
    );
    println!(
        "claims: {} by wake-up invocations, {} by schedule ticks (a run handed back is claimed again)",
        claimed_by(false),
        claimed_by(true)
    );
    let refused = posted.refused.load(Ordering::Relaxed);
    println!(
        "the API's webhook: {} events posted to the receiver, {} of them sent wake-ups{}",
        posted.events.load(Ordering::Relaxed),
        posted.woke.load(Ordering::Relaxed),
        if refused == 0 {
            String::new()
        } else {
            format!(", {refused} answered with an error")
        }
    );
    if left_on_queue > 0 {
        println!("wake-ups left on the queue, not served: {left_on_queue}");
    }
}

/// Print the final table of runs, and return how many are terminal.
///
/// `drained`: the invocations that listed each run and each run's first claim (`None` under
/// `--serve`, where the deployable function's invocations are not seen here). Steps are counted
/// by position: a step interrupted at a handback (or failed before a run-level retry) keeps its
/// row, and the run's next execution adds another for the same position, shown apart as an
/// earlier attempt. A step's own retries (its retry policy) stay in one row. Tokens in/out are
/// the sums of the run's step records (every attempt's, as the provider reported them) and the
/// cost is the run's `cost_usd` (what the engine charged it); a model call cut at the cutoff is
/// in neither (each invocation's summary estimates it: docs/agents.md, "What a run costs").
async fn print_table(
    api: &LocalApi,
    runs: &[Uuid],
    drained: Option<&Drained>,
) -> Result<usize, Box<dyn std::error::Error>> {
    println!(
        "\n{:<17} {:<38} {:<10} {:>17}  {:>11} {:<26} {:>15} {:>10}  error",
        "workflow",
        "run",
        "state",
        "created → claimed",
        "invocations",
        "steps done/all",
        "tokens in/out",
        "cost $"
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
        let tokens_in: u64 = steps.iter().filter_map(|s| s.input_tokens).sum();
        let tokens_out: u64 = steps.iter().filter_map(|s| s.output_tokens).sum();
        let claimed = drained
            .and_then(|d| d.claim_ms.get(id))
            .map_or("-".to_string(), |ms| format!("{ms} ms"));
        let invocations = drained.map_or("-".to_string(), |d| {
            d.invocations_per_run
                .get(id)
                .copied()
                .unwrap_or(0)
                .to_string()
        });
        println!(
            "{:<17} {:<38} {:<10} {:>17}  {:>11} {:<26} {:>15} {:>10}  {}",
            run.workflow_name,
            // Uuid's Display ignores the width: pad its string.
            run.id.to_string(),
            run.status.state.to_string(),
            claimed,
            invocations,
            step_count,
            format!("{tokens_in}/{tokens_out}"),
            run.cost_usd.round_dp(6).to_string(),
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

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
