//! The poison-pill table: consecutive failures per workflow, shared by every invocation.
//!
//! A workflow whose runs failed (Failed, TimedOut or Panicked outcome) `threshold` times in a
//! row is *blocked* until `cooldown` has passed since its last failure. A Completed run resets
//! the counter; LeaseLost and HandedBack outcomes do not count either way. A counter whose
//! cooldown has passed counts as absent, and the next failure starts counting afresh.
//!
//! Lambda instances do not persist between calls, so the production table is shared (see the
//! DynamoDB implementation); [`memory::MemoryPoisonTable`] is the local and test default.

pub mod gate;
pub mod memory;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

/// Default number of consecutive failures that blocks a workflow (`IRONFLOW_POISON_THRESHOLD`).
pub const DEFAULT_THRESHOLD: u32 = 3;
/// Default time a blocked workflow stays blocked after its last failure
/// (`IRONFLOW_POISON_COOLDOWN_SECS`).
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5 * 60);

/// One workflow's consecutive-failure counter as stored in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureCounter {
    /// Failures in a row since the last success (or since the counter expired).
    pub consecutive_failures: u32,
    /// When the last failure was recorded, in milliseconds since the Unix epoch.
    pub last_failure_ms: u64,
}

/// Threshold and cooldown: when a counter blocks its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoisonPolicy {
    /// Consecutive failures that block a workflow; at least 1.
    pub threshold: u32,
    /// How long a blocked workflow stays blocked after its last failure.
    pub cooldown: Duration,
}

impl Default for PoisonPolicy {
    fn default() -> Self {
        Self {
            threshold: DEFAULT_THRESHOLD,
            cooldown: DEFAULT_COOLDOWN,
        }
    }
}

impl PoisonPolicy {
    /// Whether `counter` has outlived the cooldown and must count as absent at `now_ms`.
    pub fn is_expired(&self, counter: &FailureCounter, now_ms: u64) -> bool {
        now_ms.saturating_sub(counter.last_failure_ms) >= duration_ms(self.cooldown)
    }

    /// Whether `counter` blocks its workflow at `now_ms`.
    pub fn is_blocked(&self, counter: &FailureCounter, now_ms: u64) -> bool {
        counter.consecutive_failures >= self.threshold && !self.is_expired(counter, now_ms)
    }
}

/// A poison-pill table could not be read or written.
///
/// The invocation fails open on it: the run executes, and the error is logged with the table
/// name and the underlying cause.
#[derive(Debug, thiserror::Error)]
#[error("poison-pill table {table}: {operation} failed: {cause}")]
pub struct PoisonError {
    /// The table's name (e.g. the DynamoDB table name, or `memory`).
    pub table: String,
    /// What was attempted: `read`, `record failure`, `reset`.
    pub operation: &'static str,
    /// The underlying error, rendered.
    pub cause: String,
}

/// Storage of the consecutive-failure counters, one per workflow.
///
/// Implementations: [`memory::MemoryPoisonTable`] (one process) and the DynamoDB table (shared
/// by every Lambda instance). Each takes the [`PoisonPolicy`] at construction so that it can
/// treat an expired counter as absent.
#[async_trait]
pub trait PoisonTable: Send + Sync {
    /// The table's name, for logs and errors.
    fn name(&self) -> &str;

    /// The live counter of `workflow`, `None` when there is none or it has expired.
    async fn counter(
        &self,
        workflow: &str,
        now_ms: u64,
    ) -> Result<Option<FailureCounter>, PoisonError>;

    /// Count one failure of `workflow` and return the new counter.
    ///
    /// Atomic across concurrent callers. `failure_id` identifies this failure (run id and
    /// attempt): recording the same id twice in a row counts it once, so a write retried after
    /// a lost response is harmless. An expired counter restarts at 1.
    async fn record_failure(
        &self,
        workflow: &str,
        failure_id: &str,
        now_ms: u64,
    ) -> Result<FailureCounter, PoisonError>;

    /// Forget the counter of `workflow` after a success.
    async fn reset(&self, workflow: &str) -> Result<(), PoisonError>;
}

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, duration_ms)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_only_at_threshold_and_within_cooldown() {
        let policy = PoisonPolicy {
            threshold: 2,
            cooldown: Duration::from_secs(10),
        };
        let one = FailureCounter {
            consecutive_failures: 1,
            last_failure_ms: 1_000,
        };
        let two = FailureCounter {
            consecutive_failures: 2,
            ..one
        };
        assert!(!policy.is_blocked(&one, 2_000));
        assert!(policy.is_blocked(&two, 2_000));
        assert!(policy.is_blocked(&two, 10_999));
        assert!(!policy.is_blocked(&two, 11_000));
        assert!(policy.is_expired(&two, 11_000));
    }
}
