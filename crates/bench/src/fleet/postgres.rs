//! The fleet's store seen from the side, on connections of the bench's own (left out of the
//! CPU they measure): the runs' counts ([`Counter`], which also drives the feeder), and, on
//! PostgreSQL, `pg_stat_activity` sampled every [`SAMPLE`] ([`PgProbe`]): lock waits of the
//! fleet's database, and the CPU time of the server processes that serve it. The probe also
//! keeps the planner's statistics of the runs current ([`ANALYZE`] every [`ANALYZE_EVERY`]
//! samples), as they are on a long-lived database.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironflow_local_api::Backend;
use ironflow_store::entities::{RunFilter, RunStatus};
use ironflow_store::store::Store;
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
use tokio_util::task::AbortOnDropHandle;

use super::procfs::{self, Counters};
use crate::BenchError;

/// How often `pg_stat_activity` is sampled.
pub const SAMPLE: Duration = Duration::from_millis(100);
/// Every this many samples, the server processes' CPU time is read from `/proc`.
const CPU_EVERY: u64 = 5;
/// Every this many samples (1 s), [`ANALYZE`] on the probe's connection.
pub const ANALYZE_EVERY: u64 = 10;
/// The statistics of the tables the API's claim query plans with. A fleet's database is minutes
/// old and grows by thousands of runs a minute; autovacuum analyzes it at most once a minute, at
/// a time the cell does not control, and until it does the planner takes the runs table for
/// the size it had, and picks another plan for the claim (docs/benchmark.md, "PostgreSQL's
/// JIT"). On a long-lived database the share of pending runs among all barely moves between
/// two analyzes: this keeps the fleet's database in that state. `SKIP_LOCKED`: a table that
/// autovacuum is analyzing at that moment is left to it. Its CPU is the bench's (the probe's
/// backend is not counted).
pub const ANALYZE: &str = "ANALYZE (SKIP_LOCKED) ironflow.runs, lib_fsm.state_machine";

fn db_error(what: &str) -> impl Fn(sqlx::Error) -> BenchError + '_ {
    move |e| BenchError::msg(format!("PostgreSQL ({what}): {e}"))
}

/// The runs in the store: never claimed, claimed at least once, ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounts {
    pub pending: u64,
    pub claimed: u64,
    pub ended: u64,
}

/// Counts the runs: on PostgreSQL with one query on a connection of its own (`started_at` is
/// written by the first claim, `completed_at` by the end), in memory through the store.
pub enum Counter {
    Sql(tokio::sync::Mutex<PgConnection>),
    Store(Arc<dyn Store>),
}

impl Counter {
    /// The runs' counts now.
    pub async fn counts(&self) -> Result<RunCounts, BenchError> {
        match self {
            Self::Sql(conn) => {
                let mut conn = conn.lock().await;
                let row = sqlx::query(
                    "SELECT count(*) FILTER (WHERE started_at IS NULL) AS pending, \
                     count(*) FILTER (WHERE started_at IS NOT NULL) AS claimed, \
                     count(*) FILTER (WHERE completed_at IS NOT NULL) AS ended \
                     FROM ironflow.runs",
                )
                .fetch_one(&mut *conn)
                .await
                .map_err(db_error("counting the runs"))?;
                let n = |c: &str| row.try_get::<i64, _>(c).map(|n| n.max(0) as u64);
                Ok(RunCounts {
                    pending: n("pending").map_err(db_error("pending"))?,
                    claimed: n("claimed").map_err(db_error("claimed"))?,
                    ended: n("ended").map_err(db_error("ended"))?,
                })
            }
            Self::Store(store) => {
                let all = store.get_stats(RunFilter::default()).await?;
                let pending = store
                    .get_stats(RunFilter {
                        status: Some(RunStatus::Pending),
                        ..RunFilter::default()
                    })
                    .await?
                    .total_runs;
                Ok(RunCounts {
                    pending,
                    claimed: all.total_runs.saturating_sub(pending),
                    ended: all.completed_runs + all.failed_runs + all.cancelled_runs,
                })
            }
        }
    }
}

/// Lock waits over a window: how many of the fleet database's backends waited on a lock
/// (`wait_event_type = 'Lock'`), per sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct LockWaits {
    pub samples: u64,
    /// Backends waiting, summed over the samples.
    pub waiting: u64,
    /// The most waiting in one sample.
    pub max: u64,
    /// Samples with at least one waiting.
    pub with_any: u64,
    /// Backends of the database active (running a query), summed over the samples.
    pub active: u64,
}

impl LockWaits {
    pub fn mean(&self) -> f64 {
        self.waiting as f64 / self.samples.max(1) as f64
    }

    pub fn mean_active(&self) -> f64 {
        self.active as f64 / self.samples.max(1) as f64
    }
}

/// What a window saw of PostgreSQL.
#[derive(Debug, Clone, Copy, Default)]
pub struct PgWindow {
    /// CPU time of the server processes serving the fleet's database and of its background
    /// processes (WAL writer, checkpointer, ...); `None` when `/proc` does not show them (a
    /// server in another PID namespace or on another host).
    pub cpu: Option<Duration>,
    pub locks: LockWaits,
}

#[derive(Default)]
struct ProbeState {
    /// The server processes to count: the database's backends and the background processes.
    tracked: Vec<u32>,
    cpu: Counters<u32>,
    locks: LockWaits,
    window: bool,
    visible: bool,
    ticks: u64,
    error: Option<String>,
}

/// Samples `pg_stat_activity` on a connection of its own while it lives, and runs [`ANALYZE`]
/// on it every [`ANALYZE_EVERY`] samples.
pub struct PgProbe {
    state: Arc<Mutex<ProbeState>>,
    _task: AbortOnDropHandle<()>,
}

fn lock(s: &Mutex<ProbeState>) -> std::sync::MutexGuard<'_, ProbeState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One backend as a sample sees it.
struct Backend1 {
    pid: u32,
    ours: bool,
    background: bool,
    waiting: bool,
    active: bool,
}

impl PgProbe {
    /// Start sampling the database at `url`; `excluded` are the bench's own backends (their
    /// pids), left out of the CPU and the counts.
    pub async fn start(url: &str, mut excluded: Vec<u32>) -> Result<Self, BenchError> {
        let mut conn = PgConnection::connect(url)
            .await
            .map_err(db_error("connecting the sampler"))?;
        excluded.push(backend_pid(&mut conn).await?);
        let state: Arc<Mutex<ProbeState>> = Arc::default();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for tick in 1_u64.. {
                every.tick().await;
                if tick.is_multiple_of(ANALYZE_EVERY)
                    && let Err(e) = sqlx::query(ANALYZE).execute(&mut conn).await
                {
                    lock(&shared).error.get_or_insert(format!("{ANALYZE}: {e}"));
                }
                match sample(&mut conn).await {
                    Ok(backends) => record(&shared, &backends, &excluded),
                    Err(e) => {
                        lock(&shared).error.get_or_insert(e.to_string());
                    }
                }
            }
        });
        Ok(Self {
            state,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// Start the window: the tracked processes' CPU now, the lock counts from zero.
    pub fn begin(&self) {
        let mut s = lock(&self.state);
        let cpu = server_cpu(&s.tracked);
        s.visible = !cpu.is_empty();
        s.cpu.begin(cpu);
        s.locks = LockWaits::default();
        s.window = true;
    }

    /// End the window: what it saw, or the sampler's first error.
    pub fn end(&self) -> Result<PgWindow, BenchError> {
        let mut s = lock(&self.state);
        if let Some(e) = &s.error {
            return Err(BenchError::msg(format!("the PostgreSQL probe: {e}")));
        }
        let cpu = server_cpu(&s.tracked);
        s.cpu.observe(cpu);
        s.window = false;
        Ok(PgWindow {
            cpu: s.visible.then(|| procfs::ticks(s.cpu.total())),
            locks: s.locks,
        })
    }
}

/// The pid of `conn`'s backend.
pub async fn backend_pid(conn: &mut PgConnection) -> Result<u32, BenchError> {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .map_err(db_error("pg_backend_pid()"))?;
    Ok(pid.max(0) as u32)
}

async fn sample(conn: &mut PgConnection) -> Result<Vec<Backend1>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT pid, \
         coalesce(datname = current_database(), false) AS ours, \
         datname IS NULL AS background, \
         coalesce(wait_event_type = 'Lock', false) AS waiting, \
         coalesce(state = 'active', false) AS active \
         FROM pg_stat_activity",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Backend1 {
                pid: r.try_get::<i32, _>("pid")?.max(0) as u32,
                ours: r.try_get("ours")?,
                background: r.try_get("background")?,
                waiting: r.try_get("waiting")?,
                active: r.try_get("active")?,
            })
        })
        .collect()
}

fn record(state: &Mutex<ProbeState>, backends: &[Backend1], excluded: &[u32]) {
    let mut s = lock(state);
    let counted = |b: &&Backend1| !excluded.contains(&b.pid);
    s.tracked = backends
        .iter()
        .filter(counted)
        .filter(|b| b.ours || b.background)
        .map(|b| b.pid)
        .collect();
    if !s.window {
        return;
    }
    let ours = || backends.iter().filter(counted).filter(|b| b.ours);
    let waiting = ours().filter(|b| b.waiting).count() as u64;
    s.locks.samples += 1;
    s.locks.waiting += waiting;
    s.locks.max = s.locks.max.max(waiting);
    s.locks.with_any += u64::from(waiting > 0);
    s.locks.active += ours().filter(|b| b.active).count() as u64;
    s.ticks += 1;
    if s.ticks.is_multiple_of(CPU_EVERY) {
        let cpu = server_cpu(&s.tracked);
        s.cpu.observe(cpu);
    }
}

/// The CPU ticks of the server processes `pids` that `/proc` shows as PostgreSQL's.
fn server_cpu(pids: &[u32]) -> Vec<(u32, u64)> {
    pids.iter()
        .filter_map(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, own, _) = procfs::parse_stat(&stat)?;
            comm.starts_with("postgres").then_some((pid, own))
        })
        .collect()
}

/// A connection to the fleet's database for the bench's own queries, and its backend's pid.
pub async fn connect(url: &str) -> Result<(PgConnection, u32), BenchError> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(db_error("connecting the counter"))?;
    let pid = backend_pid(&mut conn).await?;
    Ok((conn, pid))
}

/// Drop the fleet's database (best effort: a leftover database only takes disk).
pub async fn drop_database(backend: &Backend) {
    let Backend::Postgres { url } = backend else {
        return;
    };
    let Some((server, name)) = url.rsplit_once('/') else {
        return;
    };
    if let Ok(mut conn) = PgConnection::connect(&format!("{server}/postgres")).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
    }
}
