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
//!
//! It also keeps the *expected recoveries* this process has not written to the table yet
//! ([`SeenCounters::keep_expected`]): a run this process left to the reaper, or whose lease it
//! lost, whose note to the table failed (a table error, or the gate's error cap reached). The
//! process's next gate call writes them ([`super::gate::PoisonGate`]), and until then a claim
//! of such a run by this process does not count its recovery as a death: an infrastructure
//! error never counts toward the poison pill.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use uuid::Uuid;

use super::FailureCounter;

/// Unwritten expected recoveries a process keeps at most: 10 000 (a few hundred bytes each).
/// Past it, a new one is not kept (and the gate logs it, naming the run).
pub const MAX_UNWRITTEN_EXPECTED: usize = 10_000;

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
    /// Run → the expected recovery not written to the table yet.
    expected: HashMap<Uuid, Expected>,
}

/// A run's next lease recovery, expected by this process and not yet written to the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The run.
    pub run_id: Uuid,
    /// Its workflow, for the logs.
    pub workflow: String,
    /// The `lease_recoveries` the run will have once the reaper recovered it.
    pub lease_recoveries: u32,
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

impl SeenCounters {
    /// Keep `expected` until [`SeenCounters::expected_written`] says it reached the table (a
    /// higher expectation of the same run replaces a lower one). `false` when it is not kept:
    /// [`MAX_UNWRITTEN_EXPECTED`] others are waiting.
    pub fn keep_expected(&self, expected: Expected) -> bool {
        let mut inner = self.inner();
        if let Some(known) = inner.expected.get_mut(&expected.run_id) {
            known.lease_recoveries = known.lease_recoveries.max(expected.lease_recoveries);
            return true;
        }
        if inner.expected.len() >= MAX_UNWRITTEN_EXPECTED {
            return false;
        }
        inner.expected.insert(expected.run_id, expected);
        true
    }

    /// The recovery of `run_id` this process expects and has not written yet: the run's
    /// `lease_recoveries` once recovered.
    pub fn expected(&self, run_id: Uuid) -> Option<u32> {
        self.inner()
            .expected
            .get(&run_id)
            .map(|e| e.lease_recoveries)
    }

    /// Up to `limit` expected recoveries not written yet, to write.
    pub fn unwritten(&self, limit: usize) -> Vec<Expected> {
        self.inner()
            .expected
            .values()
            .take(limit)
            .cloned()
            .collect()
    }

    /// `written` reached the table: forget it, unless a higher expectation of its run came
    /// since.
    pub fn expected_written(&self, written: &Expected) {
        let mut inner = self.inner();
        if inner
            .expected
            .get(&written.run_id)
            .is_some_and(|e| e.lease_recoveries <= written.lease_recoveries)
        {
            inner.expected.remove(&written.run_id);
        }
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

    #[test]
    fn an_expected_recovery_is_kept_until_written_and_a_higher_one_wins() {
        let seen = SeenCounters::default();
        let run = Uuid::new_v4();
        let expected = |n| Expected {
            run_id: run,
            workflow: "wf".into(),
            lease_recoveries: n,
        };
        assert!(seen.keep_expected(expected(1)));
        assert!(seen.keep_expected(expected(2)));
        assert!(
            seen.keep_expected(expected(1)),
            "a lower one keeps the higher"
        );
        assert_eq!(seen.expected(run), Some(2));
        assert_eq!(seen.unwritten(10), vec![expected(2)]);
        seen.expected_written(&expected(1));
        assert_eq!(
            seen.expected(run),
            Some(2),
            "a lower write does not cover it"
        );
        seen.expected_written(&expected(2));
        assert_eq!(seen.expected(run), None);
        assert!(seen.unwritten(10).is_empty());

        for _ in 0..MAX_UNWRITTEN_EXPECTED {
            let other = Expected {
                run_id: Uuid::new_v4(),
                ..expected(1)
            };
            assert!(seen.keep_expected(other));
        }
        assert!(!seen.keep_expected(expected(1)), "bounded");
        assert_eq!(seen.unwritten(3).len(), 3);
    }
}
