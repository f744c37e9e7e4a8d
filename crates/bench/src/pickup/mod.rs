//! Pickup latency at an idle fleet (issue 20): how long a run waits from its creation, and
//! separately from coming due (a sleep's wake time, a retry's backoff), until it is claimed, for
//! K runs created at random moments (a seeded RNG, idle gaps between them), in three setups run
//! side by side, each fleet against an embedded API of its own ([`fleet`]):
//!
//! - ours with push and timer wake-ups ([`Setup::Push`]): the API's webhook posts its run events,
//!   signed, through a Function URL stand-in to the receiver (`ironflow_lambda::handle_response`),
//!   whose wake-ups go to a queue in the process (`LocalWakeQueue`), handed to the handler as SQS
//!   events by a consumer loop, as Lambda's event source mapping would; the batches book timer
//!   wake-ups for the runs they leave due later. No schedule tick: every claim is a wake-up's.
//! - ours with the schedule alone ([`Setup::Schedule`]): a tick every 60 s (`rate(1 minute)`, as
//!   deployed), no wake queue, no receiver.
//! - the reference worker (`ironflow_worker::Worker`) at its default poll interval
//!   ([`Setup::Reference`]).
//!
//! The claim time is the run's `started_at` in the API's store, written by the claim under the
//! store's lock; it is compared with the run's `created_at`, the delay step's `wake_at` (the
//! run's `scheduled_at` while it slept, cleared by the API's waker) or the retry's
//! `scheduled_at`, all stamped by the same clock in this process.
//!
//! Runs coming due are spread over independent lanes (one API and one fleet each), so that no
//! other run's activity claims a due run before its own wake-up does ([`Kind::lanes`]).

mod fleet;
mod report;
mod workflows;

use std::collections::BTreeMap;
use std::time::Duration;

use ironflow_local_api::new_run;
use ironflow_store::entities::RunStatus;
use ironflow_store::store::{RunStore, Store};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use uuid::Uuid;

use crate::BenchError;
pub use fleet::Tally;
pub use report::{print, section};

/// The settings of the pickup rows.
#[derive(Debug, Clone, Copy)]
pub struct PickupSettings {
    /// K: runs per row (0: the rows are not measured).
    pub runs: usize,
    /// The seed of the random moments.
    pub seed: u64,
    /// C: runs executing at once, for every worker.
    pub concurrency: usize,
    /// N: runs one of our invocations claims at most (push fleets).
    pub max_runs: usize,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// From a run's creation to its claim (a no-op run).
    Created,
    /// From a sleep's wake time (`ctx.delay` of [`workflows::NAP_SECS`]) to the claim after it.
    Sleep,
    /// From a retry's due time (a first attempt failing as a step past its timeout does; the
    /// engine's backoff, 30 s ± 20 %) to its claim.
    Retry,
    /// Diagnostic, ours with push only: from creation to claim while a timer wake-up for a run
    /// sleeping [`workflows::LONG_NAP_SECS`] waits on the queue, with schedule ticks as deployed.
    BehindTimer,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Created, Kind::Sleep, Kind::Retry, Kind::BehindTimer];

    /// The row's name in the report.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Created => "creation → claim",
            Kind::Sleep => "sleep due → claim",
            Kind::Retry => "retry due → claim",
            Kind::BehindTimer => {
                "creation → claim, a timer wake-up delayed on the queue (diagnostic)"
            }
        }
    }

    /// The setups it is measured in.
    pub fn setups(self) -> &'static [Setup] {
        match self {
            Kind::BehindTimer => &[Setup::Push],
            _ => &Setup::ALL,
        }
    }

    /// Independent fleets the runs are spread over. A due run's own wake-up must be the first
    /// invocation after it comes due: any batch claims every run it finds Pending, so in one
    /// fleet another run's creation or wake-up would often claim it first. Each lane creates
    /// its next run only once the last one has been claimed after coming due (at most about
    /// 15 s after its creation for a 3 s sleep, 38 s for a retry), hence the lanes.
    pub fn lanes(self) -> usize {
        match self {
            Kind::Created | Kind::BehindTimer => 1,
            Kind::Sleep => 5,
            Kind::Retry => 10,
        }
    }

    /// The idle gap before each run's creation in a lane, drawn uniformly in this range.
    pub fn gaps(self) -> (Duration, Duration) {
        let s = Duration::from_secs;
        match self {
            Kind::Created | Kind::BehindTimer => (s(2), s(8)),
            Kind::Sleep => (s(18), s(26)),
            Kind::Retry => (s(42), s(50)),
        }
    }

    /// Runs measured in all for `k` runs per row: the diagnostic takes a fifth (at least 2).
    pub fn runs(self, k: usize) -> usize {
        match self {
            Kind::BehindTimer => (k / 5).max(2).min(k),
            _ => k,
        }
    }

    /// The runs of each lane: `runs(k)` spread over at most [`Kind::lanes`] lanes.
    fn lane_runs(self, k: usize) -> Vec<usize> {
        let runs = self.runs(k);
        let lanes = self.lanes().min(runs).max(1);
        (0..lanes)
            .map(|i| runs / lanes + usize::from(i < runs % lanes))
            .filter(|&n| n > 0)
            .collect()
    }
}

/// Where a row's runs are claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Setup {
    /// Ours: the receiver's push wake-ups and the batches' timer wake-ups, no schedule tick.
    Push,
    /// Ours: a schedule tick every 60 s, nothing else.
    Schedule,
    /// The reference worker at its default poll interval.
    Reference,
}

impl Setup {
    pub const ALL: [Setup; 3] = [Setup::Push, Setup::Schedule, Setup::Reference];

    /// The setup's name in the report.
    pub fn describe(self) -> &'static str {
        match self {
            Setup::Push => "ironflow-lambda, push + timer wake-ups",
            Setup::Schedule => "ironflow-lambda, schedule alone (a tick every 60 s)",
            Setup::Reference => "reference `ironflow_worker::Worker`, default poll (2 s)",
        }
    }
}

/// One row: every lane's samples and counts.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Lanes (fleets) the row's runs were spread over.
    pub lanes: usize,
    /// Each run's wait, in ms.
    pub samples_ms: Vec<f64>,
    /// The fleets' invocations, wake-ups and claims, summed.
    pub tally: Tally,
    /// How many of the row's runs were last claimed by an invocation of each trigger (ours:
    /// `pushed`, `due`, `backlog`, `tick`, joined with `+` for an SQS batch of several).
    pub claimed_by: BTreeMap<String, usize>,
}

/// Every pickup row, or why none ran.
#[derive(Debug, Default)]
pub struct Pickup {
    pub skipped: Option<String>,
    pub settings: Option<PickupSettings>,
    pub rows: BTreeMap<(Kind, Setup), Row>,
    /// Wall time of the whole measurement (every lane side by side).
    pub elapsed: Duration,
}

/// What one lane measured.
struct Lane {
    samples_ms: Vec<f64>,
    tally: Tally,
    claimed_by: BTreeMap<String, usize>,
}

/// Longest a lane waits, after its last creation, for its runs to complete.
const SETTLE_LIMIT: Duration = Duration::from_secs(300);

/// Every row, each lane in a task of its own, all side by side.
pub async fn measure(s: &PickupSettings) -> Result<Pickup, BenchError> {
    if s.runs == 0 {
        return Ok(Pickup {
            skipped: Some("not measured: --pickup-runs 0".into()),
            ..Pickup::default()
        });
    }
    let started = Instant::now();
    let mut lanes = JoinSet::new();
    for kind in Kind::ALL {
        for &setup in kind.setups() {
            for (lane, runs) in kind.lane_runs(s.runs).into_iter().enumerate() {
                let seed = stream_seed(s.seed, kind, setup, lane);
                let settings = *s;
                lanes.spawn(async move {
                    let measured = run_lane(kind, setup, runs, seed, settings).await;
                    ((kind, setup), measured)
                });
            }
        }
    }
    eprintln!(
        "pickup: {} lanes side by side, K = {} runs per row ...",
        lanes.len(),
        s.runs
    );
    let mut rows: BTreeMap<(Kind, Setup), Row> = BTreeMap::new();
    while let Some(joined) = lanes.join_next().await {
        let (key, measured) = joined?;
        let lane = measured?;
        let row = rows.entry(key).or_default();
        row.lanes += 1;
        row.samples_ms.extend(lane.samples_ms);
        row.tally.merge(lane.tally);
        for (trigger, n) in lane.claimed_by {
            *row.claimed_by.entry(trigger).or_default() += n;
        }
        eprintln!(
            "pickup: a lane of {:?} / {:?} done after {:.0} s",
            key.0,
            key.1,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(Pickup {
        skipped: None,
        settings: Some(*s),
        rows,
        elapsed: started.elapsed(),
    })
}

/// One lane: its fleet, `runs` runs created after random gaps, their waits once all completed.
async fn run_lane(
    kind: Kind,
    setup: Setup,
    runs: usize,
    seed: u64,
    s: PickupSettings,
) -> Result<Lane, BenchError> {
    let mut rng = Rng::new(seed);
    let token = Uuid::new_v4().to_string();
    let phase = rng.between(Duration::ZERO, fleet::TICK);
    let fleet = fleet::Fleet::start(kind, setup, &token, &s, phase).await?;
    if kind == Kind::BehindTimer {
        fleet.park_long_sleeper(&token).await?;
    }
    let creator = ironflow_worker::ApiRunStore::new(&fleet.api_url(), &token);
    let (workflow, retries) = workflows::created(kind);
    let (low, high) = kind.gaps();
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        sleep(rng.between(low, high)).await;
        let run = creator.create_run(new_run(workflow, retries)).await?;
        ids.push(run.into_run().id);
    }
    let settled = all_completed(fleet.store(), &ids).await;
    let (api, tally) = fleet.stop().await;
    settled.map_err(|e| BenchError::msg(format!("pickup {kind:?} / {setup:?}: {e}")))?;
    let samples_ms = waits(kind, api.store(), &ids).await?;
    let mut claimed_by = BTreeMap::new();
    for id in &ids {
        if let Some(trigger) = tally.claimed_by.get(id) {
            *claimed_by.entry(trigger.clone()).or_default() += 1;
        }
    }
    Ok(Lane {
        samples_ms,
        tally,
        claimed_by,
    })
}

/// Resolves once every run in `ids` has completed; an error for a run that ended otherwise, or
/// when [`SETTLE_LIMIT`] passes first.
async fn all_completed(store: &std::sync::Arc<dyn Store>, ids: &[Uuid]) -> Result<(), BenchError> {
    let limit = Instant::now() + SETTLE_LIMIT;
    let mut left: Vec<Uuid> = ids.to_vec();
    while !left.is_empty() {
        let mut still = Vec::new();
        for id in left {
            let run = store
                .get_run(id)
                .await?
                .ok_or_else(|| BenchError::msg(format!("run {id} vanished")))?;
            match run.status.state {
                RunStatus::Completed => {}
                state if state.is_terminal() => {
                    return Err(BenchError::msg(format!(
                        "run {id} ended {state:?}: {:?}",
                        run.error
                    )));
                }
                _ => still.push(id),
            }
        }
        left = still;
        if !left.is_empty() && Instant::now() > limit {
            return Err(BenchError::msg(format!(
                "{} runs not completed {} s after the last creation",
                left.len(),
                SETTLE_LIMIT.as_secs()
            )));
        }
        sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Each run's wait from creation or from coming due until its last claim, in ms.
async fn waits(
    kind: Kind,
    store: &std::sync::Arc<dyn Store>,
    ids: &[Uuid],
) -> Result<Vec<f64>, BenchError> {
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        let run = store
            .get_run(id)
            .await?
            .ok_or_else(|| BenchError::msg(format!("run {id} vanished")))?;
        let claimed = run
            .started_at
            .ok_or_else(|| BenchError::msg(format!("run {id} has no start time")))?;
        let from = match kind {
            Kind::Created | Kind::BehindTimer => run.created_at,
            Kind::Sleep => workflows::wake_at(store, id).await?,
            Kind::Retry if run.retry_count != 1 => {
                return Err(BenchError::msg(format!(
                    "run {id} was retried {} times, not once",
                    run.retry_count
                )));
            }
            Kind::Retry => run
                .scheduled_at
                .ok_or_else(|| BenchError::msg(format!("retried run {id} has no due time")))?,
        };
        let us = (claimed - from).num_microseconds().unwrap_or(i64::MAX);
        out.push(us as f64 / 1000.0);
    }
    Ok(out)
}

/// The seed of one lane: `seed` mixed with the row and the lane, so that every lane draws its
/// own moments.
fn stream_seed(seed: u64, kind: Kind, setup: Setup, lane: usize) -> u64 {
    let mut rng = Rng::new(seed ^ ((kind as u64) << 48) ^ ((setup as u64) << 40) ^ lane as u64);
    rng.next_u64()
}

/// SplitMix64: a small seeded generator (the moments need no better).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn uniformly in `[low, high)`.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        low + high.saturating_sub(low).mul_f64(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_moments_within_the_range() {
        let (low, high) = (Duration::from_secs(2), Duration::from_secs(8));
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..100).map(|_| rng.between(low, high)).collect::<Vec<_>>()
        };
        assert_eq!(draw(20), draw(20));
        assert_ne!(draw(20), draw(21));
        assert!(draw(20).iter().all(|d| *d >= low && *d < high));
        let mean = draw(20).iter().map(Duration::as_secs_f64).sum::<f64>() / 100.0;
        assert!((4.0..6.0).contains(&mean), "{mean}");
    }

    #[test]
    fn runs_are_spread_over_the_lanes_and_every_lane_gets_its_own_seed() {
        assert_eq!(Kind::Created.lane_runs(50), [50]);
        assert_eq!(Kind::Sleep.lane_runs(50), [10; 5]);
        assert_eq!(Kind::Retry.lane_runs(50), [5; 10]);
        assert_eq!(Kind::Retry.lane_runs(12), [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(Kind::Retry.lane_runs(3), [1, 1, 1]);
        assert_eq!(Kind::BehindTimer.lane_runs(50), [10]);
        assert_eq!(Kind::BehindTimer.lane_runs(1), [1]);
        let seeds: std::collections::BTreeSet<u64> = Kind::ALL
            .iter()
            .flat_map(|&k| {
                k.setups()
                    .iter()
                    .flat_map(move |&s| (0..k.lanes()).map(move |l| stream_seed(20, k, s, l)))
            })
            .collect();
        let lanes: usize = Kind::ALL.iter().map(|k| k.setups().len() * k.lanes()).sum();
        assert_eq!(seeds.len(), lanes);
    }

    #[test]
    fn a_lane_creates_its_next_run_only_after_the_last_one_came_due_and_was_woken() {
        // A sleep: claimed at once, due NAP_SECS later, woken 11 s after that at most
        // (its timer wake-up, rounded up to a whole second).
        let sleep_done = workflows::NAP_SECS + 12;
        assert!(Kind::Sleep.gaps().0 > Duration::from_secs(sleep_done));
        // A retry: a backoff of at most 36 s, its wake-up 2 s after at most.
        assert!(Kind::Retry.gaps().0 > Duration::from_secs(36 + 2));
    }
}
