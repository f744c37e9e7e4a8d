//! Drain throughput: K pending runs drained by the reference worker (`ironflow_worker::Worker`)
//! and by back-to-back invocations of ours, each against its own fresh embedded API.
//!
//! Both are timed the same way: from the moment the worker starts (the reference's `run()`, our
//! first invocation) until a watcher sees every one of the K runs terminal in the API's store.
//! HTTP requests are counted at the API, per route, from the worker's start until it stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::InvocationSummary;
use ironflow_lambda::{LambdaWorker, LambdaWorkerBuilder};
use ironflow_local_api::{Backend, DelayProxy, LocalApi, new_run};
use ironflow_worker::WorkerBuilder;
use lambda_runtime::{Context, LambdaEvent};
use tokio::time::{Instant, sleep, timeout};
use uuid::Uuid;

use crate::BenchError;
use crate::usage::Usage;
use crate::watch::{Seen, all_terminal, timestamps};
use crate::workload::Workload;

/// Which worker drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Which {
    Reference,
    /// Our invocations back to back, N runs each: what is measured against the reference.
    Ours,
    /// The same with claim-ahead off (`claim_ahead_percent(0)`): claims one at a time, each
    /// only once a slot is free, as the reference worker does, to show what claim-ahead buys.
    OursNoClaimAhead,
    /// One invocation of ours claiming all K runs: the same per-run path without invocation
    /// boundaries, to tell the two costs apart.
    OursOneInvocation,
    /// Our invocations back to back with [`LARGER_BATCH`] × N runs each: a quarter of the
    /// boundaries, to show what a larger `IRONFLOW_MAX_RUNS_PER_INVOCATION` buys.
    OursLargerBatch,
}

/// How many times N the larger-batch row claims per invocation: 4.
pub const LARGER_BATCH: usize = 4;

impl Which {
    /// Every worker: the rows of a round, in the order `round_order` draws from.
    pub const ALL: [Which; 5] = [
        Which::Reference,
        Which::Ours,
        Which::OursNoClaimAhead,
        Which::OursOneInvocation,
        Which::OursLargerBatch,
    ];

    /// The row named `name` on the command line (`reference`, `ours`, `no-claim-ahead`,
    /// `one-invocation`, `larger-batch`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.flag() == name)
    }

    /// The row's name on the command line.
    pub fn flag(self) -> &'static str {
        match self {
            Which::Reference => "reference",
            Which::Ours => "ours",
            Which::OursNoClaimAhead => "no-claim-ahead",
            Which::OursOneInvocation => "one-invocation",
            Which::OursLargerBatch => "larger-batch",
        }
    }

    /// The row's name in the report.
    pub fn name(self, s: &DrainSettings) -> String {
        match self {
            Which::Reference => "reference `ironflow_worker::Worker`".to_string(),
            Which::Ours => "ironflow-lambda (invocations back to back)".to_string(),
            Which::OursNoClaimAhead => "ironflow-lambda, claim-ahead off: one claim at a time, \
                 into a free slot (diagnostic)"
                .to_string(),
            Which::OursOneInvocation => {
                "ironflow-lambda, one invocation claiming all K (diagnostic)".to_string()
            }
            Which::OursLargerBatch => format!(
                "ironflow-lambda, N = {} per invocation (diagnostic)",
                self.max_runs(s)
            ),
        }
    }

    /// Runs one invocation of ours claims at most in this row (0 for the reference).
    pub fn max_runs(self, s: &DrainSettings) -> usize {
        match self {
            Which::Reference => 0,
            Which::Ours | Which::OursNoClaimAhead => s.max_runs,
            Which::OursOneInvocation => s.runs,
            Which::OursLargerBatch => s.max_runs * LARGER_BATCH,
        }
    }
}

/// Where the drained API keeps its runs and how far the workers are from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// The in-memory store, on loopback: the rows measured since the first release.
    Loopback,
    /// PostgreSQL (a fresh database per drain), with `rtt_us` microseconds of round trip added
    /// between the workers and the API by a delay proxy (0: none).
    Postgres { rtt_us: u64 },
}

impl Link {
    /// The link's name in the report.
    pub fn describe(self) -> String {
        match self {
            Link::Loopback => "in-memory store, loopback".to_string(),
            Link::Postgres { rtt_us: 0 } => "PostgreSQL, loopback".to_string(),
            Link::Postgres { rtt_us } => {
                format!("PostgreSQL, {} ms round trip", rtt_us as f64 / 1000.0)
            }
        }
    }

    /// The round trip added.
    pub fn rtt(self) -> Duration {
        match self {
            Link::Loopback => Duration::ZERO,
            Link::Postgres { rtt_us } => Duration::from_micros(rtt_us),
        }
    }
}

/// The drain settings shared by both workers.
#[derive(Debug, Clone)]
pub struct DrainSettings {
    /// K: runs to drain.
    pub runs: usize,
    /// C: runs executing at once, for both workers.
    pub concurrency: usize,
    /// N: runs one of our invocations claims at most.
    pub max_runs: usize,
    /// Time from an invocation's start to its deadline (`Context.deadline`).
    pub invocation: Duration,
    /// The reference worker's poll interval (it sleeps this long after an empty poll).
    pub poll_interval: Duration,
    /// The PostgreSQL server the [`Link::Postgres`] drains create their databases on.
    pub postgres: Option<String>,
    /// The scripted model server's URL the agent steps call (Bedrock Converse), for
    /// [`Workload::Agent`]; other workloads get the Claude Code provider, never called.
    pub model_endpoint: Option<String>,
    /// The factor applied to the worker's time settings that follow the invocation's length
    /// (its deadline margin and minimum claim budget), as the agent rows scale model latencies
    /// and the invocation ([`crate::agents`]); 1 elsewhere: the defaults.
    pub time_scale: f64,
    /// Cutoff-aware step starts on or off (`None`: the worker's default).
    pub cutoff_aware: Option<bool>,
}

impl DrainSettings {
    /// The worker's deadline margin and minimum claim budget: their defaults times
    /// [`DrainSettings::time_scale`].
    pub fn scaled_margins(&self) -> (Duration, Duration) {
        use ironflow_lambda::settings::{DEFAULT_DEADLINE_MARGIN, DEFAULT_MIN_CLAIM_BUDGET};
        (
            DEFAULT_DEADLINE_MARGIN.mul_f64(self.time_scale),
            DEFAULT_MIN_CLAIM_BUDGET.mul_f64(self.time_scale),
        )
    }

    /// The expected duration of an unseen step for cutoff-aware starts: its default times
    /// [`DrainSettings::time_scale`], whole seconds (the variable's unit), 1 s at least.
    pub fn scaled_default_step(&self) -> Duration {
        let secs = ironflow_lambda::settings::DEFAULT_STEP_DURATION
            .mul_f64(self.time_scale)
            .as_secs_f64()
            .round()
            .max(1.0);
        Duration::from_secs_f64(secs)
    }

    /// `builder` with the scaled time settings and the cutoff-aware choice, when they differ
    /// from the defaults.
    pub fn scaled(&self, builder: LambdaWorkerBuilder) -> LambdaWorkerBuilder {
        let builder = if self.time_scale == 1.0 {
            builder
        } else {
            let (margin, budget) = self.scaled_margins();
            builder
                .deadline_margin(margin)
                .min_claim_budget(budget)
                .default_step_duration(self.scaled_default_step())
        };
        match self.cutoff_aware {
            Some(on) => crate::agents::workflow::cutoff_aware(builder, on),
            None => builder,
        }
    }

    /// The same as environment variables, for a function process.
    pub fn function_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(url) = &self.model_endpoint {
            env.push(("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", url.clone()));
        }
        if self.time_scale != 1.0 {
            let (margin, budget) = self.scaled_margins();
            env.push((
                "IRONFLOW_DEADLINE_MARGIN_MS",
                margin.as_millis().to_string(),
            ));
            env.push((
                "IRONFLOW_MIN_CLAIM_BUDGET_MS",
                budget.as_millis().to_string(),
            ));
            let step = self.scaled_default_step().as_secs();
            env.push(("IRONFLOW_DEFAULT_STEP_SECS", step.to_string()));
        }
        env
    }

    /// The agent provider both workers get.
    pub fn provider(&self) -> Arc<dyn ironflow_core::provider::AgentProvider> {
        match &self.model_endpoint {
            Some(url) => Arc::new(crate::agents::workflow::provider(url)),
            None => Arc::new(ClaudeCodeProvider::new()),
        }
    }
}

/// One drain.
#[derive(Debug, Clone)]
pub struct DrainResult {
    /// From the worker's start until every run is terminal in the API.
    pub wall: Duration,
    /// From the moment the watcher saw the first run claimed until every run is terminal:
    /// leaves out what a worker does before its first claim.
    pub from_first_claim: Duration,
    /// HTTP requests the API received from the worker's start until it stopped, per route.
    pub requests: BTreeMap<String, u64>,
    /// Our invocations used (0 for the reference worker).
    pub invocations: usize,
    /// What Lambda would bill of our invocations that claimed a run: the sum of their
    /// durations, each rounded up to a whole millisecond (zero for the reference worker).
    pub billed: Duration,
    /// Median time from a run's claim to its end, from the API's `started_at` and
    /// `completed_at` (`None` on the loopback link, where runs are not read back).
    pub run_latency: Option<Duration>,
    /// The round trip the link added, as measured through it (zero without one).
    pub measured_rtt: Duration,
    /// What the bench process (worker, API and the watcher's 1 ms polls alike) and its reaped
    /// children (the shell steps) used from the worker's start until it stopped: for ours,
    /// until the last invocation returned (its last log lines pushed); for the reference, until
    /// [`SETTLE`] after every run was terminal (its last log lines pushed meanwhile), as the
    /// HTTP requests are counted.
    pub usage: Usage,
}

/// Each drain's wall time, in s.
pub fn walls(results: &[DrainResult]) -> Vec<f64> {
    results.iter().map(|r| r.wall.as_secs_f64()).collect()
}

/// The median of per-round ratios: in each round, `ours`'s wall time over `reference`'s (both
/// lists in round order, one drain per round each). A round drains a workload with every row
/// one after the other, so each ratio compares two drains seconds apart: a machine that slows
/// down or speeds up over the run moves both alike, where the ratio of the two medians can
/// pair a fast stretch of one with a slow one of the other.
pub fn paired_ratio(ours: &[DrainResult], reference: &[DrainResult]) -> f64 {
    let ratios: Vec<f64> = walls(ours)
        .iter()
        .zip(walls(reference))
        .map(|(o, r)| o / r)
        .collect();
    crate::stats::median(&ratios)
}

impl DrainResult {
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

/// After the last run is terminal, how long the reference worker keeps running before it is
/// stopped: ample time for its log pusher (which pushes lines as they come, waiting at most
/// 200 ms for one) to deliver the last runs' lines, so that they are counted, as ours are (our
/// last invocation sends them before it returns).
const SETTLE: Duration = Duration::from_millis(400);

/// Worker threads of the API's own runtime: 2, the machine's cores.
pub const API_THREADS: usize = 2;

/// A drain that takes longer than this is a failure of the bench.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// Drain `s.runs` runs of `workload` with `which` over `link`.
pub async fn drain(
    which: Which,
    workload: Workload,
    s: &DrainSettings,
    link: Link,
) -> Result<DrainResult, BenchError> {
    let token = Uuid::new_v4().to_string();
    let backend = backend_for(link, s).await?;
    // The API runs apart, on threads of its own, as a separate server would: neither worker
    // shares its runtime (ours executes runs on its own runtime, the reference worker on the
    // bench's).
    let api = LocalApi::start_apart(&token, &backend, API_THREADS).await?;
    // Both workers reach the API through the same link.
    let proxy = match link.rtt() {
        rtt if rtt.is_zero() => None,
        rtt => Some(DelayProxy::start(api_addr(&api)?, rtt)?),
    };
    let measured_rtt = match &proxy {
        Some(p) => p.measure(20)?,
        None => Duration::ZERO,
    };
    let url = proxy.as_ref().map_or_else(|| api.url(), DelayProxy::url);
    let mut ids = Vec::with_capacity(s.runs);
    for _ in 0..s.runs {
        // Straight into the API's store: creating the runs is not part of what is measured.
        ids.push(
            api.store()
                .create_run(new_run(workload.name(), 0))
                .await?
                .into_run()
                .id,
        );
    }
    let before = api.requests_by_route();
    // On loopback a watcher polling every 1 ms times the drain's end; on PostgreSQL such polls
    // cost a query each (about 15 ms of CPU per run): there it polls every 50 ms, and the end
    // is read from the runs' own timestamps afterwards.
    let poll = match link {
        Link::Loopback => Duration::from_millis(1),
        Link::Postgres { .. } => Duration::from_millis(50),
    };
    let watcher = tokio::spawn(all_terminal(api.store().clone(), ids.clone(), poll));
    let started_wall = chrono::Utc::now();
    let usage_before = Usage::now();

    let (seen, start, (invocations, billed), usage) = match which {
        Which::Reference => {
            drain_reference(workload, s, &url, &token, watcher, usage_before).await?
        }
        _ => drain_ours(which, workload, s, &url, &token, watcher, usage_before).await?,
    };
    let after = api.requests_by_route();
    let requests = after
        .into_iter()
        .map(|(route, n)| {
            let n = n - before.get(&route).copied().unwrap_or(0);
            (route, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let (wall, from_first_claim, run_latency) = match link {
        Link::Loopback => (
            seen.all_terminal - start,
            seen.all_terminal - seen.first_claimed,
            None,
        ),
        Link::Postgres { .. } => {
            let t = timestamps(api.store(), &ids).await?;
            let since = |at: chrono::DateTime<chrono::Utc>| {
                (at - started_wall).to_std().unwrap_or_default()
            };
            (
                since(t.last_completed),
                (t.last_completed - t.first_started)
                    .to_std()
                    .unwrap_or_default(),
                Some(t.median_latency),
            )
        }
    };
    drop(proxy);
    Ok(DrainResult {
        wall,
        from_first_claim,
        requests,
        invocations,
        billed,
        usage,
        run_latency,
        measured_rtt,
    })
}

/// The reference worker drains: `Worker::run` in a task, aborted once every run is terminal
/// and [`SETTLE`] has passed (its log pusher delivers the last lines meanwhile).
async fn drain_reference(
    workload: Workload,
    s: &DrainSettings,
    url: &str,
    token: &str,
    watcher: tokio::task::JoinHandle<Result<Seen, BenchError>>,
    usage_before: Usage,
) -> Result<(Seen, Instant, (usize, Duration), Usage), BenchError> {
    let builder = WorkerBuilder::new(url, token).provider(s.provider());
    let worker = workload
        .register_reference(builder)
        .concurrency(s.concurrency)
        .poll_interval(s.poll_interval)
        .build()?;
    let start = Instant::now();
    // `Worker::run` returns only on SIGTERM/SIGINT: run it in a task and abort the task
    // once every run is terminal (no run is in flight then).
    let task = tokio::spawn(async move { worker.run().await });
    let done = timeout(DRAIN_LIMIT, watcher)
        .await
        .map_err(|_| BenchError::msg("the reference worker did not drain in time"))???;
    sleep(SETTLE).await;
    let usage = Usage::since(usage_before);
    task.abort();
    let _ = task.await;
    Ok((done, start, (0, Duration::ZERO), usage))
}

/// Our invocations, back to back, until every run has ended in one of them.
async fn drain_ours(
    which: Which,
    workload: Workload,
    s: &DrainSettings,
    url: &str,
    token: &str,
    watcher: tokio::task::JoinHandle<Result<Seen, BenchError>>,
    usage_before: Usage,
) -> Result<(Seen, Instant, (usize, Duration), Usage), BenchError> {
    let max_runs = which.max_runs(s);
    let claim_ahead_percent = if which == Which::OursNoClaimAhead {
        0
    } else {
        ironflow_lambda::settings::DEFAULT_CLAIM_AHEAD_PERCENT
    };
    let builder = LambdaWorkerBuilder::new(url, token).provider(s.provider());
    let builder = workload
        .register_ours(builder)
        .concurrency(s.concurrency)
        .max_runs_per_invocation(max_runs)
        .claim_ahead_percent(claim_ahead_percent)
        .function_timeout(s.invocation);
    let worker = Arc::new(s.scaled(builder).build()?);
    let start = Instant::now();
    let mut invocations = 0;
    let mut billed = Duration::ZERO;
    let mut finished = 0;
    while finished < s.runs {
        if start.elapsed() > DRAIN_LIMIT {
            return Err(BenchError::msg("our invocations did not drain in time"));
        }
        invocations += 1;
        let began = Instant::now();
        let summary = invoke(&worker, invocations, s.invocation).await?;
        if summary.claimed > 0 {
            billed += billed_ms(began.elapsed());
        }
        finished += summary
            .runs
            .iter()
            .filter(|r| {
                !matches!(
                    r.outcome,
                    ironflow_lambda::Outcome::HandedBack
                        | ironflow_lambda::Outcome::Released
                        | ironflow_lambda::Outcome::LeaseLost
                )
            })
            .count();
        if summary.claimed == 0 && finished < s.runs && workload == Workload::Agent {
            // A run whose handback could not be written before the scaled margin ran out is
            // left to the API's reaper, which requeues it after the lease TTL: wait for it.
            sleep(Duration::from_millis(100)).await;
        } else if summary.claimed == 0 && finished < s.runs {
            return Err(BenchError::msg(format!(
                "an invocation claimed nothing with {} runs left: {:?}",
                s.runs - finished,
                summary.errors
            )));
        }
    }
    let done = timeout(DRAIN_LIMIT, watcher)
        .await
        .map_err(|_| BenchError::msg("runs reported finished are not terminal"))???;
    Ok((
        done,
        start,
        (invocations, billed),
        Usage::since(usage_before),
    ))
}

/// An invocation's duration as Lambda bills it: rounded up to a whole millisecond, 1 ms at
/// least.
pub fn billed_ms(duration: Duration) -> Duration {
    let ms = duration.as_micros().div_ceil(1000).max(1);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// The API's store for `link`: in memory, or a fresh database on `s.postgres`.
async fn backend_for(link: Link, s: &DrainSettings) -> Result<Backend, BenchError> {
    Ok(match link {
        Link::Loopback => Backend::Memory,
        Link::Postgres { .. } => {
            let server = s.postgres.as_deref().ok_or_else(|| {
                BenchError::msg(
                    "a PostgreSQL row needs --postgres-url (or IRONFLOW_TEST_POSTGRES_URL)",
                )
            })?;
            Backend::fresh_postgres(server).await?
        }
    })
}

/// The API's socket address, for the delay proxy in front of it.
fn api_addr(api: &LocalApi) -> Result<std::net::SocketAddr, BenchError> {
    let url = api.url();
    url.trim_start_matches("http://")
        .parse()
        .map_err(|e| BenchError::msg(format!("the API's URL {url} is not an address: {e}")))
}

/// One invocation of ours through the Lambda handler, with a deadline `invocation` from now,
/// awaited where it is called: the bench runs in a task on the worker threads, as the deployed
/// function runs its Lambda runtime loop (`handler::in_worker_task`).
pub async fn invoke(
    worker: &Arc<LambdaWorker>,
    n: usize,
    invocation: Duration,
) -> Result<InvocationSummary, BenchError> {
    let mut context = Context::default();
    context.request_id = format!("bench-{n}");
    context.deadline = ironflow_lambda::poison::now_ms() + invocation.as_millis() as u64;
    invoke_with(worker, context).await
}

/// One invocation with `context`, as [`invoke`].
pub async fn invoke_with(
    worker: &Arc<LambdaWorker>,
    context: Context,
) -> Result<InvocationSummary, BenchError> {
    let event = LambdaEvent::new(serde_json::json!({}), context);
    Ok(ironflow_lambda::handle_summary(worker, event).await?)
}
