//! The poison-pill table: consecutive failures per workflow, shared by every invocation.
//!
//! A workflow whose runs failed (Failed, TimedOut or Panicked outcome) `threshold` times in a
//! row is *blocked* until `cooldown` has passed since its last failure. A Completed run resets
//! the counter; LeaseLost, HandedBack and Released outcomes do not count either way. A counter whose
//! cooldown has passed counts as absent, and the next failure starts counting afresh. So does a
//! counter dated more than [`CLOCK_SKEW_ALLOWANCE`] ahead of the reader's clock (a skewed host, a
//! bad write): no block outlasts the cooldown plus that allowance.
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tracing::warn;
use uuid::Uuid;

/// Default number of consecutive failures that blocks a workflow (`IRONFLOW_POISON_THRESHOLD`).
pub(crate) const DEFAULT_THRESHOLD: u32 = 3;
/// Default time a blocked workflow stays blocked after its last failure
/// (`IRONFLOW_POISON_COOLDOWN_SECS`).
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5 * 60);

/// How far a counter's `last_failure_ms` may be ahead of the reader's clock and still count:
/// 30 s. Lambda hosts keep their clocks within milliseconds of each other (Amazon Time Sync), so
/// this only absorbs a host whose clock is off by a few seconds. A counter dated further ahead
/// (a host clock minutes or days fast, a hand-written or corrupted item) counts as absent, as an
/// expired one does (logged once per item and process), and the next failure overwrites it with
/// a streak of 1 dated by the writer's clock: a block lasts at most the cooldown plus this
/// allowance past the reader's now, never longer.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(30);

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
    /// Whether `counter` must count as absent at `now_ms` (ms since the Unix epoch): it has
    /// outlived the cooldown, or it is dated more than [`CLOCK_SKEW_ALLOWANCE`] ahead of
    /// `now_ms` ([`is_future_dated`]).
    pub fn is_expired(&self, counter: &FailureCounter, now_ms: u64) -> bool {
        is_future_dated(counter, now_ms)
            || now_ms.saturating_sub(counter.last_failure_ms) >= duration_ms(self.cooldown)
    }

    /// Whether `counter` blocks its workflow at `now_ms`.
    pub fn is_blocked(&self, counter: &FailureCounter, now_ms: u64) -> bool {
        counter.consecutive_failures >= self.threshold && !self.is_expired(counter, now_ms)
    }
}

/// Whether `counter`'s last failure is more than [`CLOCK_SKEW_ALLOWANCE`] ahead of `now_ms`
/// (ms since the Unix epoch): a date no clock within the allowance wrote, which counts as
/// absent ([`PoisonPolicy::is_expired`]).
pub fn is_future_dated(counter: &FailureCounter, now_ms: u64) -> bool {
    counter.last_failure_ms > now_ms.saturating_add(duration_ms(CLOCK_SKEW_ALLOWANCE))
}

/// The future-dated counters a table has logged: each item is logged once per process (a
/// warning naming the table and the item), not at every read.
#[derive(Debug, Default)]
pub(crate) struct FutureDatedLog(Mutex<HashSet<String>>);

/// Items remembered by a [`FutureDatedLog`]; past it, the set starts over (an item may then
/// be logged again).
const FUTURE_DATED_LOGGED_MAX: usize = 1024;

impl FutureDatedLog {
    /// Whether `counter`, read from `item` of `table` at `now_ms`, is future-dated
    /// ([`is_future_dated`]); logs a warning the first time for `item`.
    pub(crate) fn check(
        &self,
        table: &str,
        item: &str,
        counter: &FailureCounter,
        now_ms: u64,
    ) -> bool {
        if !is_future_dated(counter, now_ms) {
            return false;
        }
        let first = {
            let mut logged = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if logged.len() >= FUTURE_DATED_LOGGED_MAX {
                logged.clear();
            }
            logged.insert(item.to_string())
        };
        if first {
            warn!(
                table,
                item,
                last_failure_ms = counter.last_failure_ms,
                now_ms,
                ahead_ms = counter.last_failure_ms.saturating_sub(now_ms),
                allowance_ms = duration_ms(CLOCK_SKEW_ALLOWANCE),
                "poison-pill counter dated in the future beyond the clock-skew allowance (a \
                 skewed host clock or a bad write): counted as absent, deleted when read, and \
                 restarted by the next failure"
            );
        }
        true
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
    fn no_block_outlasts_the_cooldown_plus_the_clock_skew_allowance() {
        let cooldown = Duration::from_secs(300);
        let policy = PoisonPolicy {
            threshold: 1,
            cooldown,
        };
        let now = 1_700_000_000_000u64;
        let allowance = duration_ms(CLOCK_SKEW_ALLOWANCE);
        let longest = duration_ms(cooldown) + allowance;
        for ahead in [
            0,
            1,
            allowance,
            allowance + 1,
            3_600_000,
            86_400_000,
            u64::MAX - now,
        ] {
            let c = FailureCounter {
                consecutive_failures: 5,
                last_failure_ms: now + ahead,
            };
            let within = ahead <= allowance;
            assert_eq!(policy.is_blocked(&c, now), within, "{ahead} ms ahead");
            assert_eq!(is_future_dated(&c, now), !within, "{ahead} ms ahead");
            // Whenever a reader finds it blocking, it has stopped blocking by the cooldown
            // plus the allowance later.
            for read_at in [
                now,
                now + 1,
                now + 3_000_000,
                now + 86_000_000,
                now + 86_400_000,
            ] {
                if policy.is_blocked(&c, read_at) {
                    let end = read_at + longest;
                    assert!(
                        !policy.is_blocked(&c, end),
                        "{ahead} ahead, read at {read_at}"
                    );
                    assert!(!policy.is_blocked(&c, end + 86_400_000));
                }
            }
        }
        let bound = now + longest;
        let at_edge = FailureCounter {
            consecutive_failures: 5,
            last_failure_ms: now + allowance,
        };
        assert!(policy.is_blocked(&at_edge, bound - 1));
        assert!(!policy.is_blocked(&at_edge, bound));

        let log = FutureDatedLog::default();
        let far = FailureCounter {
            consecutive_failures: 5,
            last_failure_ms: now + 86_400_000,
        };
        assert!(log.check("t", "ns#workflow#wf", &far, now));
        assert!(
            log.check("t", "ns#workflow#wf", &far, now),
            "still absent, logged once"
        );
        assert!(!log.check("t", "ns#workflow#wf", &at_edge, now));
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
