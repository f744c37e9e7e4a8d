//! The drains' watcher: when the API's store first saw a run claimed and every run terminal
//! ([`all_terminal`]), and the runs' own start and end times read back ([`timestamps`]).

use std::sync::Arc;
use std::time::Duration;

use ironflow_store::entities::RunStatus;
use ironflow_store::store::Store;
use tokio::time::{Instant, sleep};
use uuid::Uuid;

use crate::BenchError;

/// The drained runs' timestamps, from the API's store.
pub struct Timestamps {
    pub first_started: chrono::DateTime<chrono::Utc>,
    pub last_completed: chrono::DateTime<chrono::Utc>,
    /// Median of `completed_at − started_at` (claim to end).
    pub median_latency: Duration,
}

pub async fn timestamps(store: &Arc<dyn Store>, ids: &[Uuid]) -> Result<Timestamps, BenchError> {
    let mut first_started = None;
    let mut last_completed = None;
    let mut latencies = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(run) = store.get_run(*id).await? else {
            continue;
        };
        let (Some(started), Some(completed)) = (run.started_at, run.completed_at) else {
            return Err(BenchError::msg(format!(
                "run {id} has no start or end time"
            )));
        };
        first_started =
            Some(first_started.map_or(started, |f: chrono::DateTime<_>| f.min(started)));
        last_completed =
            Some(last_completed.map_or(completed, |l: chrono::DateTime<_>| l.max(completed)));
        latencies.push((completed - started).to_std().unwrap_or_default());
    }
    latencies.sort();
    let (Some(first_started), Some(last_completed)) = (first_started, last_completed) else {
        return Err(BenchError::msg("no drained run to time"));
    };
    Ok(Timestamps {
        first_started,
        last_completed,
        median_latency: latencies[latencies.len() / 2],
    })
}

/// When the watcher saw the first run claimed, and every run terminal.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub first_claimed: Instant,
    pub all_terminal: Instant,
}

/// Resolves when every run in `ids` is terminal.
///
/// Runs are claimed oldest first, so each poll walks the remaining runs in creation order,
/// drops the terminal ones, keeps the running ones and stops at the first one still pending
/// (every younger one is pending too): a poll costs about C + 1 store reads, not K.
pub async fn all_terminal(
    store: Arc<dyn Store>,
    ids: Vec<Uuid>,
    poll: Duration,
) -> Result<Seen, BenchError> {
    let mut remaining = std::collections::VecDeque::from(ids);
    let mut first_claimed = None;
    loop {
        let mut kept = Vec::new();
        while let Some(id) = remaining.pop_front() {
            let state = store.get_run(id).await?.map(|r| r.status.state);
            match state {
                Some(RunStatus::Pending) => {
                    kept.push(id);
                    break;
                }
                Some(state) if state.is_terminal() => {}
                _ => kept.push(id),
            }
            first_claimed.get_or_insert_with(Instant::now);
        }
        if remaining.is_empty() && kept.is_empty() {
            let now = Instant::now();
            return Ok(Seen {
                first_claimed: first_claimed.unwrap_or(now),
                all_terminal: now,
            });
        }
        for id in kept.into_iter().rev() {
            remaining.push_front(id);
        }
        sleep(poll).await;
    }
}
