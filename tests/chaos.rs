//! The chaos suite: the real handler code path against the real API router through the
//! fault-injecting proxy (tests/common/fault_proxy.rs), with every production fault at once,
//! then invariants checked through the API.
//!
//! - **Runs**: a mix of 310 by default, every one with `max_retries` 2 — three quick shell steps,
//!   three one-second steps that outlast a short invocation, a flaky step that fails its first try
//!   and succeeds on its step-level retry, a handler that panics on its first attempt, and a
//!   handler that blocks its thread before its step. Every real execution of a shell step appends
//!   `<run> <attempt> <step> <ns>` to a shared log; the handlers check, before and after each step,
//!   that their run is still Running under their own, unexpired lease (read from the API's store).
//! - **Invocations**: three instances (workers) invoking back to back, invocations of 2 to 4 s,
//!   for the chaos phase; some are aborted mid-way (an instance dying: its worker is dropped and a
//!   new one cold-starts).
//! - **Faults**: 5 % of requests meet a 5xx, a reset, a lost answer or latency (up to 400 ms);
//!   the lease route is black-holed for 1.5 s every 10 s; now and then a running run's lease is
//!   stolen by another worker id; the API's reaper runs every 500 ms on a 3 s lease TTL.
//! - **Then** the faults stop and invocations go on until every run is terminal.
//!
//! Invariants: every run terminal; no step executed again after its completion was recorded (per
//! attempt); no execution while its lease had expired or was another's; every invocation
//! returned before its deadline; no healthy workflow poison-blocked; runs failed by
//! infrastructure alone at most 1 % (runs the reaper failed after an aborted invocation or a
//! stolen lease are counted apart); the worker token in no log line. The figures are printed at
//! the end.
//!
//! `IRONFLOW_CHAOS_SEED` reproduces a run (its fault plan and schedule; thread timing aside);
//! without it a new seed is drawn and printed. `IRONFLOW_CHAOS_SECS` sets the chaos phase
//! (default 40 s: the bounded run of the test command), `IRONFLOW_CHAOS_RUNS` the runs (310),
//! `IRONFLOW_CHAOS_FAULT_RATE` the share of faulty requests (0.05) and `IRONFLOW_CHAOS_DRAIN_SECS`
//! the longest the final drain may take (180); a soak is e.g. `IRONFLOW_CHAOS_SECS=600
//! IRONFLOW_CHAOS_RUNS=2000 IRONFLOW_CHAOS_DRAIN_SECS=400 cargo nextest run --test chaos
//! --no-capture`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use common::Harness;
use common::fault_proxy::{FaultProxy, Faults};
use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_core::retry::RetryPolicy;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::InvocationSummary;
use ironflow_lambda::Outcome;
use ironflow_lambda::logging::{self, CaptureWriter};
use ironflow_lambda::{LambdaWorker, LambdaWorkerBuilder, MemoryPoisonTable, poison::PoisonPolicy};
use ironflow_store::entities::{LeaseUpdate, RunStatus, RunUpdate, StepStatus};
use ironflow_store::store::{LEASE_EXPIRED_ERROR, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use uuid::Uuid;

const LEASE_TTL: Duration = Duration::from_secs(3);
const REFRESH: Duration = Duration::from_millis(500);
const MARGIN: Duration = Duration::from_millis(800);
/// How far past its lease an execution may be seen: the time to stop one, measured from the
/// check's own read (the lease is dated from the request's receipt at the API, the worker
/// stops at its send time plus the TTL).
const STOP_SLACK: chrono::TimeDelta = chrono::TimeDelta::milliseconds(50);
/// The worker id leases are stolen for.
const THIEF: &str = "chaos-thief";
/// A stolen lease is seen at the victim's next refresh: two refresh intervals, and the stop.
const STEAL_NOTICED_WITHIN: chrono::TimeDelta = chrono::TimeDelta::milliseconds(1300);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the handlers share: the API's own store (to check their lease), the execution log and
/// the violations they saw.
struct Probe {
    store: Arc<dyn Store>,
    /// The test's runtime: the probe's reads run there, not on the worker's execution runtime
    /// that calls them (a PostgreSQL connection the pool opened there breaks when an aborted
    /// instance's runtime shuts down, and a later read of the harness's fails with it).
    home: tokio::runtime::Handle,
    log: PathBuf,
    violations: Mutex<Vec<String>>,
    /// When each run's lease was last stolen (written to another worker id behind the worker's
    /// back): the worker learns it at its next refresh.
    stolen: Mutex<HashMap<Uuid, chrono::DateTime<Utc>>>,
}

impl Probe {
    fn violation(&self, what: String) {
        self.violations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what);
    }

    /// The run as the API's store has it, read on the test's runtime (`None`: not read).
    async fn read(&self, run: Uuid) -> Option<ironflow_store::entities::Run> {
        let store = self.store.clone();
        let read = self.home.spawn(async move { store.get_run(run).await });
        read.await.ok()?.ok().flatten()
    }

    /// The worker holding the run's lease as the execution starts.
    async fn holder(&self, run: Uuid) -> Option<String> {
        self.read(run).await?.worker_id
    }

    /// The run must be Running under `holder`'s unexpired lease while it executes.
    async fn check(&self, run: Uuid, holder: &Option<String>, at: &str) {
        let asked = Utc::now();
        let Some(stored) = self.read(run).await else {
            return;
        };
        let now = Utc::now();
        let expired = stored.lease_expires_at.is_none_or(|e| e < now - STOP_SLACK);
        let just_stolen = self
            .stolen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&run)
            .is_some_and(|at| now - *at < STEAL_NOTICED_WITHIN);
        if stored.worker_id.as_deref() == Some(THIEF) && just_stolen {
            // Stolen behind the worker's back: seen at its next refresh, not before.
            return;
        }
        if stored.status.state != RunStatus::Running || stored.worker_id != *holder || expired {
            self.violation(format!(
                "run {run} executing {at} while {} under {:?} (lease until {:?}, now {now}, read \
                 asked at {asked}; the execution's lease was {holder:?})",
                stored.status.state, stored.worker_id, stored.lease_expires_at
            ));
        }
    }

    /// A shell step that records its real execution, then runs `then`.
    fn step(&self, ctx: &WorkflowContext, step: &str, then: &str) -> ShellConfig {
        ShellConfig::new(&format!(
            "printf '%s %s %s %s\\n' {} {} {step} \"$(date +%s%N)\" >> '{}'; {then}",
            ctx.run_id(),
            ctx.attempt(),
            self.log.display()
        ))
    }
}

/// The workflows of the mix; `healthy` ones must end Completed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
enum Kind {
    Quick,
    Long,
    Flaky,
    Panics,
    Blocking,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Quick,
        Kind::Long,
        Kind::Flaky,
        Kind::Panics,
        Kind::Blocking,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Quick => "chaos-quick",
            Kind::Long => "chaos-long",
            Kind::Flaky => "chaos-flaky",
            Kind::Panics => "chaos-panics",
            Kind::Blocking => "chaos-blocking",
        }
    }

    fn healthy(self) -> bool {
        self != Kind::Panics
    }

    /// Its share of the runs, in tenths.
    fn share(self) -> usize {
        match self {
            Kind::Quick => 4,
            Kind::Long => 2,
            Kind::Flaky => 2,
            Kind::Panics => 1,
            Kind::Blocking => 1,
        }
    }
}

struct Chaotic {
    kind: Kind,
    probe: Arc<Probe>,
}

impl WorkflowHandler for Chaotic {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let p = &self.probe;
            let run = ctx.run_id();
            let holder = p.holder(run).await;
            p.check(run, &holder, "at start").await;
            match self.kind {
                Kind::Quick => {
                    for s in ["a", "b", "c"] {
                        ctx.shell(s, p.step(ctx, s, "true")).await?;
                        p.check(run, &holder, s).await;
                    }
                }
                Kind::Long => {
                    for s in ["l1", "l2", "l3"] {
                        ctx.shell(s, p.step(ctx, s, "sleep 1")).await?;
                        p.check(run, &holder, s).await;
                    }
                }
                Kind::Flaky => {
                    let marker = p
                        .log
                        .with_file_name(format!("flaky-{run}-{}", ctx.attempt()));
                    let then = format!(
                        "if [ -e '{m}' ]; then echo recovered; else touch '{m}'; exit 1; fi",
                        m = marker.display()
                    );
                    let retry = RetryPolicy::new(2).backoff(Duration::from_millis(50));
                    let config = p.step(ctx, "f", &then).retry_policy(retry);
                    ctx.shell("f", config).await?;
                    p.check(run, &holder, "f").await;
                }
                Kind::Panics => {
                    if ctx.attempt() == 1 {
                        panic!("chaos: a panicking handler");
                    }
                    ctx.shell("p", p.step(ctx, "p", "true")).await?;
                }
                Kind::Blocking => {
                    // Blocks its thread; after it, only the engine's own (fenced) calls.
                    std::thread::sleep(Duration::from_millis(700));
                    ctx.shell("b", p.step(ctx, "b", "true")).await?;
                }
            }
            Ok(())
        })
    }
}

/// Everything the invocations reported, and what the orchestration did.
#[derive(Default)]
struct Tally {
    invocations: usize,
    aborted: usize,
    outcomes: BTreeMap<Outcome, usize>,
    api_errors: BTreeMap<&'static str, u64>,
    late: Vec<String>,
    min_time_left_ms: u64,
    stuck: usize,
    left_to_reaper: usize,
    lease_recoveries: u32,
    healthy_poison_blocks: Vec<String>,
    /// Healthy runs whose execution ended Failed (the engine's error).
    healthy_failures: Vec<String>,
    /// Runs held by an invocation when it was aborted, or whose lease was stolen.
    reaped_on_purpose: HashSet<Uuid>,
    /// The request ids of the invocations aborted (their worker ids contain them).
    killed: HashSet<String>,
    steals: usize,
    black_holes: usize,
}

impl Tally {
    fn take(&mut self, summary: &InvocationSummary, deadline_left: Duration) {
        self.invocations += 1;
        for (outcome, n) in &summary.outcomes {
            *self.outcomes.entry(*outcome).or_default() += n;
        }
        for e in &summary.api_errors {
            *self.api_errors.entry(e.kind.as_str()).or_default() += u64::from(e.count);
        }
        if self.invocations == 1 || summary.time_left_ms < self.min_time_left_ms {
            self.min_time_left_ms = summary.time_left_ms;
        }
        if summary.time_left_ms == 0 {
            self.late.push(format!(
                "{} returned with no time left (deadline in {deadline_left:?})",
                summary.request_id
            ));
        }
        self.stuck += summary.runs.iter().filter(|r| r.stuck).count();
        self.left_to_reaper += summary.runs.iter().filter(|r| r.left_to_reaper).count();
        self.lease_recoveries += summary.lease_recoveries;
        for r in &summary.runs {
            let healthy = Kind::ALL
                .iter()
                .any(|k| k.name() == r.workflow && k.healthy());
            if healthy && r.outcome == Outcome::PoisonBlocked {
                self.healthy_poison_blocks
                    .push(format!("{} {}: {:?}", r.workflow, r.run_id, r.error));
            }
            if healthy && r.outcome == Outcome::Failed {
                self.healthy_failures
                    .push(format!("{} {}: {:?}", r.workflow, r.run_id, r.error));
            }
        }
    }
}

/// One instance: a worker of its own (its own engine, pools), through the proxy, counting
/// poison-pill failures in the table every instance shares (as the fleet shares its DynamoDB
/// table: a recovery one instance expects is not counted by the one that claims the run).
fn instance(
    url: &str,
    token: &str,
    probe: &Arc<Probe>,
    poison: &Arc<MemoryPoisonTable>,
) -> LambdaWorker {
    let mut builder = LambdaWorkerBuilder::new(url, token)
        .poison_table(poison.clone())
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .lease_ttl(LEASE_TTL)
        .lease_refresh_interval(REFRESH)
        .deadline_margin(MARGIN)
        .min_claim_budget(Duration::from_millis(300))
        .max_runs_per_invocation(6)
        .concurrency(2);
    for kind in Kind::ALL {
        builder = builder.register(Chaotic {
            kind,
            probe: probe.clone(),
        });
    }
    builder.build().expect("worker")
}

/// Runs Running with a worker id of invocation `request_id`: what an aborted invocation held.
async fn held_by(store: &Arc<dyn Store>, ids: &[Uuid], request_id: &str) -> Vec<Uuid> {
    let mut held = Vec::new();
    for id in ids {
        if let Ok(Some(run)) = store.get_run(*id).await
            && run.status.state == RunStatus::Running
            && run
                .worker_id
                .as_deref()
                .is_some_and(|w| w.contains(request_id))
        {
            held.push(*id);
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    chaos_on(common::Backend::Memory).await;
}

/// The same bounded run with the API on PostgreSQL (a database of its own), its production
/// store: claims lock rows there instead of the whole store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_postgres() {
    chaos_on(common::postgres().await).await;
}

async fn chaos_on(backend: common::Backend) {
    let store = backend.describe();
    // The panicking workflow's panics are expected: keep them out of the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let expected = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("chaos: "));
        if !expected {
            default_hook(info);
        }
    }));
    let capture = CaptureWriter::default();
    assert!(logging::init(
        tracing_subscriber::EnvFilter::new("info"),
        capture.clone()
    ));
    let seed: u64 = env_or("IRONFLOW_CHAOS_SEED", rand::rng().random());
    let chaos_for = Duration::from_secs(env_or("IRONFLOW_CHAOS_SECS", 40));
    let total_runs: usize = env_or("IRONFLOW_CHAOS_RUNS", 310);
    let fault_rate: f64 = env_or("IRONFLOW_CHAOS_FAULT_RATE", 0.05);
    println!(
        "chaos on the {store}: seed {seed} (IRONFLOW_CHAOS_SEED={seed} reproduces it), {total_runs} runs, {chaos_for:?} of chaos at {fault_rate} faults per request"
    );

    let h = Harness::start_on(backend).await;
    let proxy = Arc::new(FaultProxy::start(&h.api.url(), seed).await);
    let probe = Arc::new(Probe {
        store: h.api.store().clone(),
        home: tokio::runtime::Handle::current(),
        log: h.path("executions.log"),
        violations: Mutex::default(),
        stolen: Mutex::default(),
    });
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let poison = Arc::new(MemoryPoisonTable::new(PoisonPolicy::default()));

    // The runs, in a shuffled order of kinds.
    let mut kinds: Vec<Kind> = Kind::ALL
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, total_runs * k.share() / 10))
        .collect();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.random_range(0..=i));
    }
    let mut runs: HashMap<Uuid, Kind> = HashMap::new();
    for kind in &kinds {
        runs.insert(h.create(kind.name(), 2).await, *kind);
    }
    let ids: Vec<Uuid> = runs.keys().copied().collect();
    let tally = Arc::new(tokio::sync::Mutex::new(Tally::default()));

    // The API's reaper, on the short TTL.
    let reaper = h.api.start_reaper(Duration::from_millis(500));

    // The chaos phase.
    proxy.set(Faults::mixed(fault_rate, Duration::from_millis(400)));
    let chaos_end = Instant::now() + chaos_for;
    let url = proxy.url();
    let token = h.api.token().to_string();
    let mut instances = tokio::task::JoinSet::new();
    for n in 0..3u64 {
        let (url, token, probe, tally, store, poison) = (
            url.clone(),
            token.clone(),
            probe.clone(),
            tally.clone(),
            h.api.store().clone(),
            poison.clone(),
        );
        let ids = ids.clone();
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(n));
        instances.spawn(async move {
            let mut worker = instance(&url, &token, &probe, &poison);
            while Instant::now() < chaos_end {
                let left = Duration::from_millis(rng.random_range(2000..=4000));
                // 8 % of the invocations die 0.3 to 1.5 s in, mid-batch.
                let abort = rng
                    .random_bool(0.08)
                    .then(|| Duration::from_millis(rng.random_range(300..1500)));
                let request_id = format!("chaos-{n}-{}", Uuid::new_v4().simple());
                let event = invoke(&worker, &request_id, left);
                match abort {
                    None => {
                        let summary = event.await;
                        tally.lock().await.take(&summary, left);
                    }
                    Some(after) => {
                        tokio::select! {
                            summary = event => tally.lock().await.take(&summary, left),
                            () = tokio::time::sleep(after) => {
                                // The instance dies: what it held is the reaper's.
                                let held = held_by(&store, &ids, &request_id).await;
                                let mut t = tally.lock().await;
                                t.aborted += 1;
                                t.reaped_on_purpose.extend(held);
                                t.killed.insert(request_id.clone());
                                drop(t);
                                worker = instance(&url, &token, &probe, &poison);
                            }
                        }
                    }
                }
            }
        });
    }
    // Stolen leases and a black-holed lease route, while the instances run.
    let mut next_black_hole = Instant::now() + Duration::from_secs(10);
    while Instant::now() < chaos_end {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if Instant::now() >= next_black_hole {
            proxy.black_hole("POST /runs/{id}/lease");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            proxy.lift_black_holes();
            tally.lock().await.black_holes += 1;
            next_black_hole = Instant::now() + Duration::from_secs(10);
        }
        if rng.random_bool(0.3) {
            let running: Vec<Uuid> = {
                let mut running = Vec::new();
                for id in &ids {
                    if let Ok(Some(run)) = h.api.store().get_run(*id).await
                        && run.status.state == RunStatus::Running
                    {
                        running.push(*id);
                    }
                }
                running
            };
            if !running.is_empty() {
                let id = running[rng.random_range(0..running.len())];
                probe
                    .stolen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(id, Utc::now());
                let stolen = RunUpdate {
                    lease: Some(LeaseUpdate::Set {
                        worker_id: THIEF.into(),
                        expires_at: Utc::now() + chrono::TimeDelta::seconds(3),
                    }),
                    ..RunUpdate::default()
                };
                if h.api.store().update_run(id, stolen).await.is_ok() {
                    let mut t = tally.lock().await;
                    t.steals += 1;
                    t.reaped_on_purpose.insert(id);
                }
            }
        }
    }
    while let Some(done) = instances.join_next().await {
        done.expect("an instance's loop");
    }

    // No more faults: invocations until every run is terminal.
    proxy.restore();
    let worker = instance(&url, &token, &probe, &poison);
    let drain_end = Instant::now() + Duration::from_secs(env_or("IRONFLOW_CHAOS_DRAIN_SECS", 180));
    loop {
        let mut open = 0;
        for id in &ids {
            if !h.status(*id).await.is_terminal() {
                open += 1;
            }
        }
        if open == 0 || Instant::now() >= drain_end {
            break;
        }
        let summary = invoke(
            &worker,
            &format!("drain-{}", Uuid::new_v4().simple()),
            Duration::from_secs(15),
        )
        .await;
        if summary.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tally.lock().await.take(&summary, Duration::from_secs(15));
    }
    drop(reaper);
    // Stuck executions finish their blocked code before the checks read the log.
    let mut settle = 0;
    while worker.stuck_executions() > 0 && settle < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        settle += 1;
    }

    // The invariants.
    let t = tally.lock().await;
    let mut not_terminal = Vec::new();
    let mut infra_failed = Vec::new();
    let mut reaper_failed_on_purpose = 0;
    // Failed as blocked by the poison pill, the deaths that blocked it being this suite's
    // aborted invocations (checked below: `undeserved` is empty).
    let mut blocked_by_the_suites_deaths = 0;
    let mut workflow_failed = 0;
    let mut completed = 0;
    let mut reexecuted = Vec::new();
    let log = std::fs::read_to_string(&probe.log).unwrap_or_default();
    let mut starts: HashMap<(Uuid, u32, String), Vec<i128>> = HashMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [run, attempt, step, ns] = f.as_slice()
            && let (Ok(run), Ok(attempt), Ok(ns)) =
                (Uuid::parse_str(run), attempt.parse(), ns.parse::<i128>())
        {
            starts
                .entry((run, attempt, step.to_string()))
                .or_default()
                .push(ns);
        }
    }
    for (id, kind) in &runs {
        let run = h.run(*id).await;
        let state = run.status.state;
        if !state.is_terminal() {
            not_terminal.push(format!("{} {id}: {state}", kind.name()));
            continue;
        }
        match state {
            RunStatus::Completed => completed += 1,
            RunStatus::Failed if !kind.healthy() => workflow_failed += 1,
            RunStatus::Failed
                if run.error.as_deref() == Some(LEASE_EXPIRED_ERROR)
                    && t.reaped_on_purpose.contains(id) =>
            {
                reaper_failed_on_purpose += 1
            }
            RunStatus::Failed
                if run
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("is blocked as a poison pill"))
                    && !t.killed.is_empty() =>
            {
                blocked_by_the_suites_deaths += 1
            }
            _ => infra_failed.push(format!("{} {id}: {state} {:?}", kind.name(), run.error)),
        }
        for step in h.steps(*id).await {
            let (Some(done), StepStatus::Completed) = (step.completed_at, step.status.state) else {
                continue;
            };
            let done_ns = i128::from(done.timestamp_nanos_opt().unwrap_or(i64::MAX));
            let key = (*id, step.attempt, step.name.clone());
            let later = starts
                .get(&key)
                .map_or(0, |s| s.iter().filter(|&&s| s > done_ns).count());
            if later > 0 {
                reexecuted.push(format!(
                    "{} {id} step {} attempt {}: {later} execution(s) after its completion",
                    kind.name(),
                    step.name,
                    step.attempt
                ));
            }
        }
    }
    let violations = probe
        .violations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let logs = capture.contents();
    let leaked = logs.lines().filter(|l| l.contains(h.api.token())).count();
    let faults = proxy.stats();
    let infra_share = infra_failed.len() as f64 / runs.len() as f64;

    println!("chaos figures (seed {seed}):");
    println!(
        "  runs {}: completed {completed}, failed by their workflow {workflow_failed}, failed by the reaper after an aborted invocation or a stolen lease {reaper_failed_on_purpose}, blocked by the poison pill after this suite's aborted invocations {blocked_by_the_suites_deaths}, failed by infrastructure alone {} ({:.2} %)",
        runs.len(),
        infra_failed.len(),
        infra_share * 100.0
    );
    println!(
        "  invocations {} ({} aborted), outcomes {:?}",
        t.invocations + t.aborted,
        t.aborted,
        t.outcomes
    );
    println!(
        "  requests {}, faults injected: server errors {}, resets {}, lost answers {}, delays {}, black-holed {} ({} windows); leases stolen {}",
        faults.all_requests(),
        faults.total("server_error"),
        faults.total("reset"),
        faults.total("lost_answer"),
        faults.total("delay"),
        faults.total("black_hole"),
        t.black_holes,
        t.steals
    );
    println!(
        "  API faults met by the worker, by kind: {:?}",
        t.api_errors
    );
    println!(
        "  stuck executions {}, runs left to the reaper {}, lease recoveries counted {}, min time left at return {} ms",
        t.stuck, t.left_to_reaper, t.lease_recoveries, t.min_time_left_ms
    );
    println!(
        "  invariants: not terminal {}, completed steps executed again {}, executions past or without their lease {}, late returns {}, healthy workflows poison-blocked {}, token leaks {leaked}",
        not_terminal.len(),
        reexecuted.len(),
        violations.len(),
        t.late.len(),
        t.healthy_poison_blocks.len()
    );

    // Every failure the poison pill counted against a healthy workflow must be a death this
    // suite caused (an aborted invocation's run, recovered mid-step, counted under the worker id
    // of the aborted invocation, which its steps name): anything else is an infrastructure error
    // counted toward the poison pill, or one death counted under another name.
    let counted = counted_failures(&logs);
    let deaths: HashSet<&str> = counted
        .iter()
        .filter(|c| c.recovery)
        .map(|c| c.failure_id.as_str())
        .collect();
    let undeserved: Vec<String> = counted
        .iter()
        .filter(|c| {
            Kind::ALL
                .iter()
                .any(|k| k.name() == c.workflow && k.healthy())
                && !(c.recovery
                    && c.run.is_some_and(|r| t.reaped_on_purpose.contains(&r))
                    && t.killed.iter().any(|k| c.failure_id.contains(k.as_str())))
        })
        .map(|c| {
            let kind = if c.recovery {
                "lease recovery"
            } else {
                "failure"
            };
            format!("{} {kind} {} of run {:?}", c.workflow, c.failure_id, c.run)
        })
        .collect();
    println!(
        "  poison-pill failures counted against healthy workflows other than the deaths this suite caused: {}; distinct deaths counted {} (of {} invocations killed)",
        undeserved.len(),
        deaths.len(),
        t.killed.len()
    );
    println!(
        "  claims whose lease the API dated back, released unexecuted: {}; renewals dated back: {}",
        logs.lines()
            .filter(|l| l.contains("the API granted a lease that ends before its first refresh"))
            .count(),
        logs.lines()
            .filter(|l| l.contains("the API dated the renewed lease back"))
            .count()
    );
    let blocks: Vec<String> = t.healthy_poison_blocks.clone();
    explain_failures(&logs, &violations, &undeserved);
    assert!(
        not_terminal.is_empty(),
        "runs not terminal: {not_terminal:#?}"
    );
    assert!(
        reexecuted.is_empty(),
        "completed steps executed again: {reexecuted:#?}"
    );
    assert!(
        violations.is_empty(),
        "executions past their lease: {violations:#?}"
    );
    assert!(
        t.late.is_empty(),
        "invocations that returned late: {:#?}",
        t.late
    );
    assert!(
        undeserved.is_empty(),
        "failures counted toward the poison pill that were not the workflow's: {undeserved:#?} \
         (healthy workflows blocked: {blocks:#?})"
    );
    assert!(
        infra_share <= 0.01,
        "runs failed by infrastructure alone: {infra_failed:#?}"
    );
    assert_eq!(leaked, 0, "the worker token is in {leaked} log lines");
    assert!(
        t.invocations + t.aborted >= 50,
        "only {} invocations",
        t.invocations + t.aborted
    );
}

/// A failure the poison-pill gate counted, from its log lines.
#[derive(Debug)]
struct Counted {
    workflow: String,
    /// The run: the recovered run of a lease recovery, or the failed run.
    run: Option<Uuid>,
    failure_id: String,
    /// A lease recovery (a dead holder), not a workflow failure.
    recovery: bool,
}

/// Every failure the poison-pill gate counted: a lease recovery is logged with its run just
/// before it is counted under `lease-recovery/<worker id>`; a workflow failure is counted as
/// `<run>/<retry>`.
fn counted_failures(logs: &str) -> Vec<Counted> {
    let mut counted = Vec::new();
    let mut recovered: HashMap<String, Uuid> = HashMap::new();
    for line in logs.lines() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let field = |name: &str| json.get(name).and_then(|v| v.as_str()).unwrap_or("");
        let message = field("message");
        let workflow = field("workflow").to_string();
        if message.contains("counting a failure of its workflow") {
            if let Ok(run) = Uuid::parse_str(field("run_id")) {
                recovered.insert(workflow, run);
            }
        } else if message == "counted a failure of its workflow" {
            let failure_id = field("failure_id").to_string();
            let recovery = failure_id.starts_with("lease-recovery/");
            let run = if recovery {
                recovered.remove(&workflow)
            } else {
                failure_id
                    .split('/')
                    .next()
                    .and_then(|r| Uuid::parse_str(r).ok())
            };
            counted.push(Counted {
                workflow,
                run,
                failure_id,
                recovery,
            });
        }
    }
    counted
}

/// The worker's log lines behind a failed invariant, printed with the figures: every line of a
/// run executing past its lease, and of each run behind a failure the poison pill should not
/// have counted.
fn explain_failures(logs: &str, violations: &[String], undeserved: &[String]) {
    let id_of = |s: &str| {
        s.split_whitespace().find_map(|w| {
            Uuid::parse_str(w.trim_matches(|c: char| !c.is_ascii_hexdigit() && c != '-')).ok()
        })
    };
    let runs: HashSet<String> = violations
        .iter()
        .chain(undeserved)
        .filter_map(|v| id_of(&v.replace(['"', '/', ',', '('], " ")))
        .map(|u| u.to_string())
        .collect();
    if runs.is_empty() {
        return;
    }
    println!("the worker's log lines behind the failed invariants:");
    for line in logs
        .lines()
        .filter(|l| runs.iter().any(|r| l.contains(r.as_str())))
        .take(600)
    {
        println!("  {line}");
    }
}

/// One invocation of `worker` with `left` until its deadline.
async fn invoke(worker: &LambdaWorker, request_id: &str, left: Duration) -> InvocationSummary {
    let mut context = lambda_runtime::Context::default();
    context.request_id = request_id.to_string();
    context.deadline = common::deadline_in(left);
    ironflow_lambda::handle_summary(
        worker,
        lambda_runtime::LambdaEvent::new(serde_json::json!({}), context),
    )
    .await
    .expect("invocation accepted")
}
