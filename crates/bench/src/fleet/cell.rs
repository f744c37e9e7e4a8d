//! One cell of the fleet section: F workers of one kind on one workload, against a fresh API
//! on a fresh database behind the delay proxy, the backlog kept full by a feeder, measured over
//! a steady-state window after a warm-up.
//!
//! The window opens after the warm-up and closes once it has lasted its length and at least
//! the minimum of runs have ended in it. Everything is read at both ends (requests at the
//! API, CPU times in `/proc`, the runs' counts in the store); in between, `pg_stat_activity`
//! is sampled every 100 ms and the server processes' CPU every 500 ms ([`super::postgres`]),
//! the workers' threads' context switches every second.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_local_api::{Backend, DelayProxy, LocalApi, new_run};
use ironflow_store::entities::RunFilter;
use ironflow_store::postgres::PostgresStore;
use ironflow_store::store::Store;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use tokio_util::task::AbortOnDropHandle;
use uuid::Uuid;

use super::postgres::{self, Counter, LockWaits, PgProbe, RunCounts};
use super::processes::{Fleet, Spec, ThreadSample};
use super::procfs::{self, Counters};
use super::{FleetWorkload, Worker};
use crate::BenchError;
use crate::drain::API_THREADS;

/// The claim route, counted at the API.
pub const CLAIM_ROUTE: &str = "GET /api/v1/internal/runs/next";
/// Longest a window may outlast its length waiting for its minimum of runs.
const OVERRUN: Duration = Duration::from_secs(300);
/// Runs read back for the claim latency, at most.
const LATENCY_SAMPLE: usize = 300;
/// Runs the feeder creates at once, at most.
const FEED_TASKS: usize = 8;
/// How often the feeder reads the backlog.
const FEED_EVERY: Duration = Duration::from_millis(100);

/// What one cell runs.
#[derive(Debug, Clone)]
pub struct CellSpec {
    pub workload: FleetWorkload,
    pub worker: Worker,
    pub f: usize,
    pub concurrency: usize,
    pub max_runs: usize,
    pub warmup: Duration,
    pub window: Duration,
    pub min_runs: u64,
    pub rtt: Duration,
    /// The PostgreSQL server (a fresh database per cell); `None`: the in-memory store.
    pub postgres: Option<String>,
    /// The workers run under callgrind, their counts written there (`fleet --callgrind`).
    pub callgrind: Option<super::callgrind::Dumps>,
}

/// What one cell measured over its window.
#[derive(Debug, Clone)]
pub struct Cell {
    pub spec: CellSpec,
    pub window: Duration,
    /// Runs ended in the window.
    pub runs: u64,
    /// Runs claimed (for the first time) in the window.
    pub claimed: u64,
    /// Requests the API received in the window, per route.
    pub requests: BTreeMap<String, u64>,
    /// CPU time of the API's runtime threads.
    pub api_cpu: Duration,
    /// CPU time of PostgreSQL's processes serving the fleet (`None`: not visible).
    pub pg_cpu: Option<Duration>,
    pub locks: Option<LockWaits>,
    /// The worker processes' own CPU time, and their reaped children's (the steps').
    pub worker_cpu: Duration,
    pub steps_cpu: Duration,
    /// The worker processes' CPU time by thread name (threads alive at a read; a thread gone
    /// within a second of its last read loses that second).
    pub worker_threads: BTreeMap<String, Duration>,
    pub voluntary: u64,
    pub involuntary: u64,
    /// The bench process's CPU besides the API's threads: the delay proxy, the Runtime API
    /// stand-in, the feeder, the sampler.
    pub bench_cpu: Duration,
    /// The machine's busy share of all its CPUs (everything on it, not only the fleet).
    pub machine_busy: Option<f64>,
    /// Our invocations answered in the window, and those that claimed nothing.
    pub invocations: Option<(u64, u64)>,
    /// Errors: our answers' invocation and batch errors and API faults, ERROR log lines,
    /// runs ended failed.
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// Claim → first step of runs claimed in the window (a sample), sorted.
    pub latencies: Vec<Duration>,
    pub measured_rtt: Duration,
    /// The backlog at the feeder's reads over the window.
    pub backlog: BacklogLevel,
    /// User-space instructions the workers executed over the window (`fleet --callgrind`;
    /// `None` without it).
    pub instructions: Option<u64>,
}

impl Cell {
    pub fn secs(&self) -> f64 {
        self.window.as_secs_f64().max(1e-9)
    }
    pub fn runs_per_s(&self) -> f64 {
        self.runs as f64 / self.secs()
    }
    fn per_run(&self) -> f64 {
        self.runs.max(1) as f64
    }
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
    pub fn requests_per_run(&self) -> f64 {
        self.total_requests() as f64 / self.per_run()
    }
    pub fn requests_per_s(&self) -> f64 {
        self.total_requests() as f64 / self.secs()
    }
    /// CPU per run in ms.
    pub fn ms_per_run(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1000.0 / self.per_run()
    }
    /// Claim requests that claimed no run, per 1 000 runs ended.
    pub fn empty_claims_per_1000(&self) -> f64 {
        let claims = self.requests.get(CLAIM_ROUTE).copied().unwrap_or(0);
        claims.saturating_sub(self.claimed) as f64 * 1000.0 / self.per_run()
    }
    /// Cores kept busy by `cpu` over the window (CPU time over the window's length).
    pub fn cores(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / self.secs()
    }
    pub fn latency_ms(&self, q: f64) -> Option<f64> {
        let n = self.latencies.len();
        (n > 0).then(|| {
            let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
            self.latencies[i].as_secs_f64() * 1000.0
        })
    }
}

/// Everything read at one end of the window.
struct Ends {
    at: Instant,
    wall: DateTime<Utc>,
    requests: BTreeMap<String, u64>,
    api: HashMap<u32, u64>,
    workers: (u64, u64),
    bench: u64,
    machine: Option<(u64, u64)>,
    counts: RunCounts,
    tally: Option<(u64, u64, u64)>,
}

/// The fleet's store, its feeder and its probes.
struct Setup {
    api: LocalApi,
    backend: Backend,
    proxy: DelayProxy,
    counter: Arc<Counter>,
    probe: Option<PgProbe>,
    ids: Arc<Mutex<Vec<Uuid>>>,
    /// The backlog at the feeder's reads since the window began.
    backlog: Arc<Mutex<BacklogLevel>>,
    _feeder: AbortOnDropHandle<Result<(), BenchError>>,
}

/// Measure one cell.
pub async fn measure(spec: &CellSpec) -> Result<Cell, BenchError> {
    let setup = Setup::start(spec).await?;
    let result = run_window(spec, &setup).await;
    let backend = setup.backend.clone();
    drop(setup);
    postgres::drop_database(&backend).await;
    result
}

impl Setup {
    async fn start(spec: &CellSpec) -> Result<Self, BenchError> {
        let token = Uuid::new_v4().to_string();
        let backend = match &spec.postgres {
            Some(server) => Backend::fresh_postgres(server).await?,
            None => Backend::Memory,
        };
        let api = LocalApi::start_apart(&token, &backend, API_THREADS).await?;
        let addr = api
            .url()
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| {
                BenchError::msg(format!(
                    "the API's URL {} is not an address: {e}",
                    api.url()
                ))
            })?;
        let proxy = DelayProxy::start(addr, spec.rtt)?;
        let (counter, probe) = match &backend {
            Backend::Postgres { url } => {
                let (conn, pid) = postgres::connect(url).await?;
                let probe = PgProbe::start(url, vec![pid]).await?;
                (Counter::Sql(tokio::sync::Mutex::new(conn)), Some(probe))
            }
            Backend::Memory => (Counter::Store(api.store().clone()), None),
        };
        let counter = Arc::new(counter);
        let ids: Arc<Mutex<Vec<Uuid>>> = Arc::default();
        // The backlog never runs dry: twice what the fleet can hold claimed, and some.
        let level = (2 * spec.f * spec.max_runs.max(spec.concurrency) + 64) as u64;
        // On PostgreSQL the feeder has a pool of its own: it does not wait for the API's
        // connections, which the fleet's requests hold.
        let store: Arc<dyn Store> = match &backend {
            Backend::Postgres { url } => Arc::new(PostgresStore::new(url).await?),
            Backend::Memory => api.store().clone(),
        };
        feed(&store, spec.workload, &ids, level).await?;
        let backlog: Arc<Mutex<BacklogLevel>> = Arc::default();
        let feeder = tokio::spawn(feeder(
            store,
            counter.clone(),
            spec.workload,
            ids.clone(),
            level,
            backlog.clone(),
        ));
        Ok(Self {
            api,
            backend,
            proxy,
            counter,
            probe,
            ids,
            backlog,
            _feeder: AbortOnDropHandle::new(feeder),
        })
    }

    async fn ends(&self, fleet: &Fleet) -> Result<Ends, BenchError> {
        Ok(Ends {
            at: Instant::now(),
            wall: Utc::now(),
            requests: self.api.requests_by_route(),
            api: procfs::own_threads_named("local-api"),
            workers: fleet.cpu(),
            bench: procfs::process_cpu(std::process::id()).map_or(0, |c| c.0),
            machine: procfs::machine_ticks(),
            counts: self.counter.counts().await?,
            tally: fleet
                .tally()
                .map(|t| (t.invocations as u64, t.empty as u64, t.errors as u64)),
        })
    }
}

/// Create runs until `level` are pending, `FEED_TASKS` at a time.
async fn feed(
    store: &Arc<dyn Store>,
    workload: FleetWorkload,
    ids: &Arc<Mutex<Vec<Uuid>>>,
    missing: u64,
) -> Result<(), BenchError> {
    let mut left = missing;
    while left > 0 {
        let mut set = JoinSet::new();
        for _ in 0..left.min(FEED_TASKS as u64) {
            let store = store.clone();
            set.spawn(async move { store.create_run(new_run(workload.workflow(), 0)).await });
        }
        while let Some(created) = set.join_next().await {
            let id = created??.into_run().id;
            ids.lock().unwrap_or_else(PoisonError::into_inner).push(id);
            left -= 1;
        }
    }
    Ok(())
}

/// Keep `level` runs pending: the feeder's loop. Every [`FEED_EVERY`] it reads the backlog (into
/// `seen`) and sets how many runs are missing; meanwhile it keeps up to [`FEED_TASKS`] creations
/// in flight, a new one as soon as one is done, until none is missing.
async fn feeder(
    store: Arc<dyn Store>,
    counter: Arc<Counter>,
    workload: FleetWorkload,
    ids: Arc<Mutex<Vec<Uuid>>>,
    level: u64,
    seen: Arc<Mutex<BacklogLevel>>,
) -> Result<(), BenchError> {
    let mut creating = JoinSet::new();
    let mut missing = 0_u64;
    let mut tick = tokio::time::interval(FEED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        while missing > 0 && creating.len() < FEED_TASKS {
            let store = store.clone();
            creating.spawn(async move { store.create_run(new_run(workload.workflow(), 0)).await });
            missing -= 1;
        }
        tokio::select! {
            _ = tick.tick() => {
                let pending = counter.counts().await?.pending;
                seen.lock().unwrap_or_else(PoisonError::into_inner).read(pending);
                missing = level.saturating_sub(pending + creating.len() as u64);
            }
            Some(created) = creating.join_next() => {
                let id = created??.into_run().id;
                ids.lock().unwrap_or_else(PoisonError::into_inner).push(id);
            }
        }
    }
}

/// The backlog as the feeder read it over a window: runs pending (never claimed) at each read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BacklogLevel {
    pub reads: u64,
    sum: u64,
    /// The fewest pending at a read (`None`: no read).
    pub min: Option<u64>,
}

impl BacklogLevel {
    pub(super) fn read(&mut self, pending: u64) {
        self.reads += 1;
        self.sum = self.sum.saturating_add(pending);
        self.min = Some(self.min.map_or(pending, |m| m.min(pending)));
    }

    /// The mean pending over the reads.
    pub fn mean(&self) -> Option<f64> {
        (self.reads > 0).then(|| self.sum as f64 / self.reads as f64)
    }

    /// Whether the backlog ran dry at a read: a claim then could find nothing for want of
    /// runs, and the cell measured the feeder as much as the workers.
    pub fn ran_dry(&self) -> bool {
        self.min == Some(0)
    }
}

/// The worker threads over a window: context switches, and CPU time by thread name.
#[derive(Default)]
struct ThreadWatch {
    voluntary: Counters<(u32, u32)>,
    involuntary: Counters<(u32, u32)>,
    cpu: Counters<(u32, u32)>,
    names: HashMap<(u32, u32), String>,
}

impl ThreadWatch {
    /// Read every thread now; `begin`: the window starts.
    fn sample(&mut self, fleet: &Fleet, begin: bool) {
        let threads = fleet.threads();
        let pick = |f: fn(&ThreadSample) -> u64| threads.iter().map(move |(k, t)| (*k, f(t)));
        if begin {
            self.voluntary.begin(pick(|t| t.voluntary));
            self.involuntary.begin(pick(|t| t.involuntary));
            self.cpu.begin(pick(|t| t.cpu));
        } else {
            self.voluntary.observe(pick(|t| t.voluntary));
            self.involuntary.observe(pick(|t| t.involuntary));
            self.cpu.observe(pick(|t| t.cpu));
        }
        for (k, t) in threads {
            self.names.insert(k, t.name);
        }
    }

    /// CPU time over the window per thread name.
    fn cpu_by_name(&self) -> BTreeMap<String, Duration> {
        let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
        for (k, ticks) in self.cpu.per_key() {
            let name = self.names.get(k).cloned().unwrap_or_default();
            *by_name.entry(name).or_default() += ticks;
        }
        by_name
            .into_iter()
            .map(|(name, t)| (name, procfs::ticks(t)))
            .collect()
    }
}

/// Start the fleet, warm up, measure the window, stop the fleet.
async fn run_window(spec: &CellSpec, setup: &Setup) -> Result<Cell, BenchError> {
    let measured_rtt = setup.proxy.measure(10)?;
    let url = setup.proxy.url();
    let mut fleet = Fleet::start(&Spec {
        worker: spec.worker,
        f: spec.f,
        concurrency: spec.concurrency,
        max_runs: spec.max_runs,
        api_url: &url,
        token: setup.api.token(),
        callgrind: spec.callgrind.as_ref(),
    })
    .await?;
    fleet.open();
    wait(&mut fleet, spec.warmup).await?;

    let pids: Vec<u32> = fleet.pids().collect();
    if spec.callgrind.is_some() {
        super::callgrind::zero(&pids).await?;
    }
    let mut threads = ThreadWatch::default();
    let start = setup.ends(&fleet).await?;
    if let Some(p) = &setup.probe {
        p.begin();
    }
    threads.sample(&fleet, true);
    *setup.backlog.lock().unwrap_or_else(PoisonError::into_inner) = BacklogLevel::default();
    window(spec, setup, &mut fleet, &start, &mut threads).await?;
    threads.sample(&fleet, false);
    let backlog = *setup.backlog.lock().unwrap_or_else(PoisonError::into_inner);
    let instructions = match &spec.callgrind {
        Some(dumps) => Some(dumps.count(&pids).await?),
        None => None,
    };
    let end = setup.ends(&fleet).await?;
    let pg = setup.probe.as_ref().map(PgProbe::end).transpose()?;
    let output = fleet.stop().await;

    let failed = setup
        .api
        .store()
        .get_stats(RunFilter::default())
        .await?
        .failed_runs;
    let latencies = claim_latencies(setup.api.store(), &setup.ids, start.wall, end.wall).await?;
    let mut cell = assemble(spec, &start, &end, &threads);
    cell.pg_cpu = pg.and_then(|p| p.cpu);
    cell.locks = pg.map(|p| p.locks);
    cell.errors += output.errors + failed;
    cell.first_errors = output.first;
    if failed > 0 {
        cell.first_errors
            .push(format!("{failed} runs ended failed"));
    }
    cell.latencies = latencies;
    cell.measured_rtt = measured_rtt;
    cell.backlog = backlog;
    cell.instructions = instructions;
    Ok(cell)
}

/// Until the window has lasted its length and seen its minimum of runs end, the threads read
/// every second.
async fn window(
    spec: &CellSpec,
    setup: &Setup,
    fleet: &mut Fleet,
    start: &Ends,
    threads: &mut ThreadWatch,
) -> Result<(), BenchError> {
    loop {
        sleep(Duration::from_secs(1)).await;
        fleet.alive()?;
        threads.sample(fleet, false);
        let elapsed = start.at.elapsed();
        if elapsed < spec.window {
            continue;
        }
        let ended = setup.counter.counts().await?.ended;
        if ended.saturating_sub(start.counts.ended) >= spec.min_runs {
            return Ok(());
        }
        if elapsed > spec.window + OVERRUN {
            return Err(BenchError::msg(format!(
                "fewer than {} runs ended in {elapsed:?}",
                spec.min_runs
            )));
        }
    }
}

/// The cell from what both ends and the threads read (PostgreSQL's figures, the output's
/// errors and the latencies are added by the caller).
fn assemble(spec: &CellSpec, start: &Ends, end: &Ends, threads: &ThreadWatch) -> Cell {
    let tally = match (start.tally, end.tally) {
        (Some(a), Some(b)) => Some((
            b.0.saturating_sub(a.0),
            b.1.saturating_sub(a.1),
            b.2.saturating_sub(a.2),
        )),
        _ => None,
    };
    let api_cpu = end
        .api
        .iter()
        .map(|(tid, t)| t.saturating_sub(start.api.get(tid).copied().unwrap_or(0)))
        .sum();
    let busy = start
        .machine
        .zip(end.machine)
        .map(|(a, b)| b.0.saturating_sub(a.0) as f64 / b.1.saturating_sub(a.1).max(1) as f64);
    let api_cpu = procfs::ticks(api_cpu);
    let bench_all = procfs::ticks(end.bench.saturating_sub(start.bench));
    Cell {
        spec: spec.clone(),
        window: end.at - start.at,
        runs: end.counts.ended.saturating_sub(start.counts.ended),
        claimed: end.counts.claimed.saturating_sub(start.counts.claimed),
        requests: crate::managed::requests_since(&start.requests, end.requests.clone()),
        api_cpu,
        pg_cpu: None,
        locks: None,
        worker_cpu: procfs::ticks(end.workers.0.saturating_sub(start.workers.0)),
        steps_cpu: procfs::ticks(end.workers.1.saturating_sub(start.workers.1)),
        worker_threads: threads.cpu_by_name(),
        voluntary: threads.voluntary.total(),
        involuntary: threads.involuntary.total(),
        bench_cpu: bench_all.saturating_sub(api_cpu),
        machine_busy: busy,
        invocations: tally.map(|t| (t.0, t.1)),
        errors: tally.map_or(0, |t| t.2),
        first_errors: Vec::new(),
        latencies: Vec::new(),
        measured_rtt: Duration::ZERO,
        backlog: BacklogLevel::default(),
        instructions: None,
    }
}

/// Wait `d`, checking every second that the fleet is alive.
async fn wait(fleet: &mut Fleet, d: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        sleep(
            end.saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1)),
        )
        .await;
        fleet.alive()?;
    }
    Ok(())
}

/// Claim → first step of up to [`LATENCY_SAMPLE`] runs first claimed within `[from, to]`,
/// sorted: from the run's `started_at` (written by its claim, in the API) to its first step's
/// `started_at` (its end for a run without a step).
async fn claim_latencies(
    store: &Arc<dyn Store>,
    ids: &Mutex<Vec<Uuid>>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Duration>, BenchError> {
    let ids = ids.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let step = (ids.len() / LATENCY_SAMPLE).max(1);
    let mut latencies = Vec::new();
    for id in ids.iter().step_by(step) {
        let Some(run) = store.get_run(*id).await? else {
            continue;
        };
        let (Some(claimed), Some(ended)) = (run.started_at, run.completed_at) else {
            continue;
        };
        if claimed < from || claimed > to {
            continue;
        }
        let steps = store.list_steps(*id).await?;
        let first = steps
            .iter()
            .filter_map(|s| s.started_at.or(Some(s.created_at)))
            .min()
            .unwrap_or(ended);
        latencies.push((first - claimed).to_std().unwrap_or_default());
    }
    latencies.sort();
    Ok(latencies)
}
