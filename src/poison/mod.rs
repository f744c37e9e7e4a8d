//! The poison-pill table: consecutive failures per workflow, shared by every invocation.
//!
//! A workflow whose runs failed (Failed, TimedOut or Panicked outcome) `threshold` times in a
//! row is *blocked* until `cooldown` has passed since its last failure. A Completed run resets
//! the counter; LeaseLost, HandedBack and Released outcomes do not count either way. A counter whose
//! cooldown has passed counts as absent, and the next failure starts counting afresh.
//!
//! New in the serverless form: a run claimed with a `lease_recoveries` above what this function
//! last saw for it, whose steps show that its holder had started one, means the invocation that
//! held it died (function timeout, out of memory) executing it; that counts as a failure of its
//! workflow too (see [`PoisonTable::observe_lease_recoveries`], `gate::PoisonGate::on_claim`
//! and docs/faults.md). A recovery of a claim whose answer was lost does not.
//!
//! Lambda instances do not persist between calls, so the production table is shared
//! ([`DynamoPoisonTable`], selected by `IRONFLOW_POISON_TABLE`);
//! [`MemoryPoisonTable`] is the local and test default. The module map:
//! [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

#[cfg(not(feature = "test-support"))]
pub(crate) mod dynamodb;
#[cfg(feature = "test-support")]
pub mod dynamodb;
pub(crate) mod gate;
mod memory;
pub(crate) mod recovery;
pub(crate) mod seen;

pub use dynamodb::{CallCounter, DynamoPoisonTable, DynamoSetupError};
pub use memory::MemoryPoisonTable;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

/// Default number of consecutive failures that blocks a workflow (`IRONFLOW_POISON_THRESHOLD`).
pub(crate) const DEFAULT_THRESHOLD: u32 = 3;
/// Default time a blocked workflow stays blocked after its last failure
/// (`IRONFLOW_POISON_COOLDOWN_SECS`).
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5 * 60);

/// How long a table remembers the `lease_recoveries` it saw for a run: 7 days after the last
/// increase (in DynamoDB, the run item's `expires_at`). A run claimed again after that with the
/// same value counts one more failure.
pub(crate) const RUN_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// One workflow's consecutive-failure counter as stored in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureCounter {
    /// Failures in a row since the last success (or since the counter expired).
    pub consecutive_failures: u32,
    /// When the last failure was recorded, in milliseconds since the Unix epoch.
    pub last_failure_ms: u64,
}

/// Threshold and cooldown: when a counter blocks its workflow. The default is the defaults of
/// `IRONFLOW_POISON_THRESHOLD` and `IRONFLOW_POISON_COOLDOWN_SECS` (README, "Configuration").
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

/// What happens to the runs of a blocked workflow (`IRONFLOW_POISON_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoisonMode {
    /// `fail` (default, the reference worker's behaviour): a claimed run of a blocked workflow
    /// is failed at once with the reason (`fail_or_schedule_retry`, so a retry may follow).
    #[default]
    Fail,
    /// `defer`: blocked workflows are left out of the claim's capabilities, so their runs stay
    /// Pending and are not claimed until the cooldown ends. Needs the registered workflow
    /// list: with a comma in a workflow name (no workflow filter on claims) it acts as `fail`.
    Defer,
}

impl PoisonMode {
    /// The variable's spelling: `fail` or `defer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Defer => "defer",
        }
    }
}

impl fmt::Display for PoisonMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `IRONFLOW_POISON_MODE` is neither `fail` nor `defer`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected fail or defer, found {0:?}")]
pub struct ParsePoisonModeError(pub String);

impl FromStr for PoisonMode {
    type Err = ParsePoisonModeError;

    /// `fail` or `defer`, case-insensitive, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fail" => Ok(Self::Fail),
            "defer" => Ok(Self::Defer),
            _ => Err(ParsePoisonModeError(s.to_string())),
        }
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
    /// What was attempted: `read`, `batch read`, `record failure`, `reset`,
    /// `observe lease recoveries`.
    pub operation: &'static str,
    /// The underlying error, rendered.
    pub cause: String,
}

/// Storage of the consecutive-failure counters, one per workflow.
///
/// Implementations: [`MemoryPoisonTable`] (one process) and
/// [`DynamoPoisonTable`] (shared by every Lambda instance). Each takes the
/// [`PoisonPolicy`] at construction so that it can treat an expired counter as absent.
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
    /// Atomic across concurrent callers: N concurrent failures add exactly N. `failure_id`
    /// identifies this failure (`<run id>/<retry_count>`, or
    /// `lease-recovery/<worker id of the invocation that died>`): an id already counted in the current
    /// streak is not counted again (the counter is returned as it is), so a write retried after
    /// a lost response is harmless even when other failures were recorded in between. An
    /// expired counter (or none) restarts at 1.
    async fn record_failure(
        &self,
        workflow: &str,
        failure_id: &str,
        now_ms: u64,
    ) -> Result<FailureCounter, PoisonError>;

    /// The live counters of `workflows`, in as few reads as the table allows (one batch read
    /// for DynamoDB). A workflow without a live counter is absent from the map.
    ///
    /// The default reads each workflow with [`PoisonTable::counter`].
    async fn counters(
        &self,
        workflows: &[String],
        now_ms: u64,
    ) -> Result<HashMap<String, FailureCounter>, PoisonError> {
        let mut found = HashMap::new();
        for workflow in workflows {
            if let Some(counter) = self.counter(workflow, now_ms).await? {
                found.insert(workflow.clone(), counter);
            }
        }
        Ok(found)
    }

    /// Forget the counter of `workflow` after a success.
    async fn reset(&self, workflow: &str) -> Result<(), PoisonError>;

    /// Note that run `run_id` was claimed with `lease_recoveries` (> 0) and say whether that
    /// is above what this function last saw for it: `true` means one more invocation holding
    /// the run died since, and the caller counts it as a failure of the run's workflow.
    ///
    /// Atomic across concurrent callers: of two callers that observe the same new value, one
    /// gets `true`. Idempotent: a call retried after a lost response still returns `true` to
    /// the caller whose write it was. Never seen before counts as 0.
    async fn observe_lease_recoveries(
        &self,
        run_id: Uuid,
        lease_recoveries: u32,
        now_ms: u64,
    ) -> Result<bool, PoisonError>;
}

/// Milliseconds since the Unix epoch, now (defined once, with the invocation's other clocks;
/// public with the `test-support` feature only).
#[cfg(feature = "test-support")]
pub use crate::deadline::now_ms;
#[cfg(not(feature = "test-support"))]
pub(crate) use crate::deadline::now_ms;

/// `d` in whole milliseconds, saturating.
pub(crate) fn duration_ms(d: Duration) -> u64 {
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

    #[test]
    fn mode_parses_fail_and_defer_only() {
        assert_eq!("fail".parse::<PoisonMode>(), Ok(PoisonMode::Fail));
        assert_eq!(" Defer ".parse::<PoisonMode>(), Ok(PoisonMode::Defer));
        assert_eq!(
            "skip".parse::<PoisonMode>(),
            Err(ParsePoisonModeError("skip".into()))
        );
        assert_eq!(PoisonMode::default(), PoisonMode::Fail);
        assert_eq!(PoisonMode::Defer.to_string(), "defer");
    }
}
