//! In-process poison-pill table: the local and test default.
//!
//! Counters live as long as the process: across the invocations of one warm Lambda instance,
//! not across instances. Use the DynamoDB table in production.

use async_trait::async_trait;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use uuid::Uuid;

use super::{
    FailureCounter, FutureDatedLog, PoisonError, PoisonPolicy, PoisonTable, RUN_RETENTION,
    duration_ms,
};

#[derive(Debug)]
struct Entry {
    counter: FailureCounter,
    /// Ids of the failures counted in the current streak.
    failure_ids: HashSet<String>,
}

#[derive(Debug, Default)]
struct State {
    workflows: HashMap<String, Entry>,
    /// Run id → (last `lease_recoveries` seen, when it was seen in ms since the epoch).
    runs: HashMap<Uuid, (u32, u64)>,
}

/// A [`PoisonTable`] in a mutex-guarded map.
///
/// # Examples
///
/// ```
/// # tokio_test_block_on(async {
/// use ironflow_lambda::poison::{PoisonPolicy, PoisonTable};
/// use ironflow_lambda::MemoryPoisonTable;
///
/// let table = MemoryPoisonTable::new(PoisonPolicy::default());
/// let counter = table.record_failure("deploy", "run-1/1", 1_000).await.unwrap();
/// assert_eq!(counter.consecutive_failures, 1);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct MemoryPoisonTable {
    policy: PoisonPolicy,
    state: Mutex<State>,
    future_dated: FutureDatedLog,
}

impl MemoryPoisonTable {
    /// An empty table applying `policy`'s cooldown to expire counters.
    pub fn new(policy: PoisonPolicy) -> Self {
        Self {
            policy,
            state: Mutex::new(State::default()),
            future_dated: FutureDatedLog::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave a map half-updated: every update is a
        // single insert or remove. Recover the guard instead of propagating the poison.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl PoisonTable for MemoryPoisonTable {
    fn name(&self) -> &str {
        "memory"
    }

    async fn counter(
        &self,
        workflow: &str,
        now_ms: u64,
    ) -> Result<Option<FailureCounter>, PoisonError> {
        let mut state = self.state();
        let Some(counter) = state.workflows.get(workflow).map(|e| e.counter) else {
            return Ok(None);
        };
        if self
            .future_dated
            .check(self.name(), workflow, &counter, now_ms)
        {
            // Read as absent, it would never be reset by a success (as in DynamoDB).
            state.workflows.remove(workflow);
            return Ok(None);
        }
        Ok(Some(counter).filter(|c| !self.policy.is_expired(c, now_ms)))
    }

    async fn record_failure(
        &self,
        workflow: &str,
        failure_id: &str,
        now_ms: u64,
    ) -> Result<FailureCounter, PoisonError> {
        let mut state = self.state();
        let entry = state
            .workflows
            .entry(workflow.to_string())
            .or_insert(Entry {
                counter: FailureCounter {
                    consecutive_failures: 0,
                    last_failure_ms: now_ms,
                },
                failure_ids: HashSet::new(),
            });
        if entry.failure_ids.contains(failure_id) {
            return Ok(entry.counter);
        }
        let future_dated = self
            .future_dated
            .check("memory", workflow, &entry.counter, now_ms);
        if future_dated || self.policy.is_expired(&entry.counter, now_ms) {
            entry.counter.consecutive_failures = 0;
            entry.failure_ids.clear();
        }
        entry.counter.consecutive_failures = entry.counter.consecutive_failures.saturating_add(1);
        entry.counter.last_failure_ms = now_ms;
        entry.failure_ids.insert(failure_id.to_string());
        Ok(entry.counter)
    }

    async fn reset(&self, workflow: &str) -> Result<(), PoisonError> {
        self.state().workflows.remove(workflow);
        Ok(())
    }

    async fn observe_lease_recoveries(
        &self,
        run_id: Uuid,
        lease_recoveries: u32,
        now_ms: u64,
    ) -> Result<bool, PoisonError> {
        let retention = duration_ms(RUN_RETENTION);
        let mut state = self.state();
        state
            .runs
            .retain(|_, (_, seen_ms)| now_ms.saturating_sub(*seen_ms) < retention);
        let seen = state.runs.get(&run_id).map_or(0, |(n, _)| *n);
        if lease_recoveries <= seen {
            return Ok(false);
        }
        state.runs.insert(run_id, (lease_recoveries, now_ms));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table() -> MemoryPoisonTable {
        MemoryPoisonTable::new(PoisonPolicy {
            threshold: 3,
            cooldown: Duration::from_secs(60),
        })
    }

    #[tokio::test]
    async fn counts_blocks_and_resets() {
        let t = table();
        assert_eq!(t.counter("wf", 0).await.unwrap(), None);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            let c = t.record_failure("wf", id, 1_000).await.unwrap();
            assert_eq!(c.consecutive_failures, i as u32 + 1);
        }
        let c = t.counter("wf", 2_000).await.unwrap().unwrap();
        assert!(t.policy.is_blocked(&c, 2_000));
        assert_eq!(t.counter("other", 2_000).await.unwrap(), None);
        t.reset("wf").await.unwrap();
        assert_eq!(t.counter("wf", 2_000).await.unwrap(), None);
    }

    #[tokio::test]
    async fn same_failure_id_counts_once_even_after_others() {
        let t = table();
        t.record_failure("wf", "run/1", 1_000).await.unwrap();
        t.record_failure("wf", "other/1", 1_000).await.unwrap();
        let c = t.record_failure("wf", "run/1", 1_001).await.unwrap();
        assert_eq!(c.consecutive_failures, 2);
    }

    #[tokio::test]
    async fn expired_counter_is_absent_and_restarts() {
        let t = table();
        t.record_failure("wf", "a", 1_000).await.unwrap();
        t.record_failure("wf", "b", 1_000).await.unwrap();
        assert_eq!(t.counter("wf", 61_000).await.unwrap(), None);
        let c = t.record_failure("wf", "c", 61_000).await.unwrap();
        assert_eq!(c.consecutive_failures, 1);
    }

    #[tokio::test]
    async fn a_counter_dated_beyond_the_clock_skew_allowance_counts_as_absent_and_restarts() {
        let t = table();
        let now = 1_700_000_000_000;
        // Written by a caller whose clock is a day fast.
        for id in ["a", "b", "c"] {
            t.record_failure("wf", id, now + 86_400_000).await.unwrap();
        }
        assert_eq!(t.counter("wf", now).await.unwrap(), None);
        let c = t.record_failure("wf", "d", now).await.unwrap();
        assert_eq!(c.consecutive_failures, 1, "a new streak");
        assert_eq!(c.last_failure_ms, now, "dated by this clock");
        // Within the allowance it counts (and blocks at most the cooldown past its date).
        let ahead = now + duration_ms(super::super::CLOCK_SKEW_ALLOWANCE);
        t.record_failure("wf", "e", ahead).await.unwrap();
        let c = t.counter("wf", now).await.unwrap().unwrap();
        assert_eq!((c.consecutive_failures, c.last_failure_ms), (2, ahead));
    }

    #[tokio::test]
    async fn lease_recoveries_count_once_per_increase() {
        let t = table();
        let run = Uuid::new_v4();
        assert!(t.observe_lease_recoveries(run, 1, 1_000).await.unwrap());
        assert!(!t.observe_lease_recoveries(run, 1, 2_000).await.unwrap());
        assert!(t.observe_lease_recoveries(run, 2, 3_000).await.unwrap());
        assert!(!t.observe_lease_recoveries(run, 1, 4_000).await.unwrap());
        // Forgotten after the retention: seen again as new.
        let later = 3_000 + duration_ms(RUN_RETENTION);
        assert!(t.observe_lease_recoveries(run, 2, later).await.unwrap());
    }
}
