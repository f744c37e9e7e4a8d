//! In-process poison-pill table: the local and test default.
//!
//! Counters live as long as the process: across the invocations of one warm Lambda instance,
//! not across instances. Use the DynamoDB table in production.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{FailureCounter, PoisonError, PoisonPolicy, PoisonTable};

#[derive(Debug)]
struct Entry {
    counter: FailureCounter,
    last_failure_id: String,
}

/// A [`PoisonTable`] in a mutex-guarded map.
///
/// # Examples
///
/// ```
/// # tokio_test_block_on(async {
/// use ironflow_lambda::poison::{PoisonPolicy, PoisonTable};
/// use ironflow_lambda::poison::memory::MemoryPoisonTable;
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
    entries: Mutex<HashMap<String, Entry>>,
}

impl MemoryPoisonTable {
    /// An empty table applying `policy`'s cooldown to expire counters.
    pub fn new(policy: PoisonPolicy) -> Self {
        Self {
            policy,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding this lock cannot leave a map half-updated: every update is a
        // single insert or remove. Recover the guard instead of propagating the poison.
        self.entries
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
        Ok(self
            .entries()
            .get(workflow)
            .map(|e| e.counter)
            .filter(|c| !self.policy.is_expired(c, now_ms)))
    }

    async fn record_failure(
        &self,
        workflow: &str,
        failure_id: &str,
        now_ms: u64,
    ) -> Result<FailureCounter, PoisonError> {
        let mut entries = self.entries();
        let entry = entries.entry(workflow.to_string()).or_insert(Entry {
            counter: FailureCounter {
                consecutive_failures: 0,
                last_failure_ms: now_ms,
            },
            last_failure_id: String::new(),
        });
        if entry.last_failure_id == failure_id {
            return Ok(entry.counter);
        }
        if self.policy.is_expired(&entry.counter, now_ms) {
            entry.counter.consecutive_failures = 0;
        }
        entry.counter.consecutive_failures = entry.counter.consecutive_failures.saturating_add(1);
        entry.counter.last_failure_ms = now_ms;
        entry.last_failure_id = failure_id.to_string();
        Ok(entry.counter)
    }

    async fn reset(&self, workflow: &str) -> Result<(), PoisonError> {
        self.entries().remove(workflow);
        Ok(())
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
    async fn same_failure_id_counts_once() {
        let t = table();
        t.record_failure("wf", "run/1", 1_000).await.unwrap();
        let c = t.record_failure("wf", "run/1", 1_001).await.unwrap();
        assert_eq!(c.consecutive_failures, 1);
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
}
