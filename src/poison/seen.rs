//! The poison-pill counters this process knows, shared by the invocations in flight in it.
//!
//! Each invocation reads a workflow's counter from the table at most once
//! ([`super::gate::PoisonGate`]); several invocations at once in one process (Lambda Managed
//! Instances) see each other's writes here as soon as they land: a failure one of them counts
//! blocks the workflow for the others' next runs, and a success one of them records resets it
//! for all, as one invocation sees its own. The table stays the truth between processes.
//!
//! Invariant: a value read from the table never replaces one written after that read began
//! (each write takes a sequence number; a read keeps the number current when it was sent).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::FailureCounter;

/// The counters read from or written to the table by this process's invocations.
#[derive(Debug, Default)]
pub struct SeenCounters {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The number of the last write.
    writes: u64,
    /// Workflow → its counter (`None`: none, or reset) and the write that set it (0: a read).
    counters: HashMap<String, (Option<FailureCounter>, u64)>,
}

/// Where a table read started: see [`SeenCounters::read_started`].
#[derive(Debug, Clone, Copy)]
pub struct ReadStart(u64);

impl SeenCounters {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counter of `workflow` as last read or written here; `None` when unknown.
    pub fn get(&self, workflow: &str) -> Option<Option<FailureCounter>> {
        self.inner().counters.get(workflow).map(|(c, _)| *c)
    }

    /// Call before a table read, to hand the result to [`SeenCounters::read`].
    pub fn read_started(&self) -> ReadStart {
        ReadStart(self.inner().writes)
    }

    /// What a table read started at `start` found for `workflow`, kept unless a write landed
    /// here since.
    pub fn read(&self, workflow: &str, counter: Option<FailureCounter>, start: ReadStart) {
        let mut inner = self.inner();
        let newer = inner
            .counters
            .get(workflow)
            .is_some_and(|(_, write)| *write > start.0);
        if !newer {
            inner.counters.insert(workflow.to_string(), (counter, 0));
        }
    }

    /// What a table write returned for `workflow` (`None`: reset).
    pub fn wrote(&self, workflow: &str, counter: Option<FailureCounter>) {
        let mut inner = self.inner();
        inner.writes = inner.writes.saturating_add(1);
        let write = inner.writes;
        inner
            .counters
            .insert(workflow.to_string(), (counter, write));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(n: u32) -> Option<FailureCounter> {
        Some(FailureCounter {
            consecutive_failures: n,
            last_failure_ms: 1,
        })
    }

    #[test]
    fn a_write_wins_over_a_read_sent_before_it_and_not_over_one_sent_after() {
        let seen = SeenCounters::default();
        let start = seen.read_started();
        seen.wrote("w", counter(3));
        seen.read("w", counter(2), start);
        assert_eq!(seen.get("w"), Some(counter(3)), "the older read is dropped");
        let later = seen.read_started();
        seen.read("w", None, later);
        assert_eq!(
            seen.get("w"),
            Some(None),
            "a read sent after the write is newer"
        );
        assert_eq!(seen.get("other"), None);
    }
}
