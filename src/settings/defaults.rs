//! The limits other modules name, and the defaults the tests and the bench read, each taken
//! from its row of the table (`table/`) when one holds it.

use std::time::Duration;

#[cfg(any(test, feature = "test-support"))]
use super::table;

/// Most runs one process may execute at once, M × C: 4096 (each has an execution thread).
pub const MAX_RUNS_PER_PROCESS: usize = 4096;
/// Longest accepted poison-pill namespace, in bytes.
pub const MAX_POISON_NAMESPACE_LEN: usize = 200;
/// The longest duration any setting takes: 100 years, so that
/// every deadline computed from a setting is an instant this crate can hold.
pub const MAX_DURATION: Duration = crate::deadline::HORIZON;
/// The lease TTLs the API accepts: 1 to 3600 s (its `validate_lease_ttl`).
pub const LEASE_TTL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);
/// The smallest deadline margin: 500 ms. A handback needs a few requests (the lease, the steps,
/// the status) and the response its reserve (250 ms) before the deadline.
pub const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(500);
/// The smallest minimum claim budget: 100 ms.
pub const MIN_CLAIM_BUDGET: Duration = Duration::from_millis(100);

/// Default margin before the invocation deadline, time to hand runs back with retries when
/// the API fails: the default of `IRONFLOW_DEADLINE_MARGIN_MS` (README, "Configuration").
#[cfg(any(test, feature = "test-support"))]
pub const DEFAULT_DEADLINE_MARGIN: Duration = table::DEADLINE_MARGIN.default;
/// Default minimum time before the cutoff for a claim: the default of
/// `IRONFLOW_MIN_CLAIM_BUDGET_MS` (README, "Configuration").
#[cfg(any(test, feature = "test-support"))]
pub const DEFAULT_MIN_CLAIM_BUDGET: Duration = table::MIN_CLAIM_BUDGET.default;
/// Default threshold of claim-ahead, in % of a run's execution time: the default of
/// `IRONFLOW_CLAIM_AHEAD_PERCENT` (README, "Configuration").
#[cfg(any(test, feature = "test-support"))]
pub const DEFAULT_CLAIM_AHEAD_PERCENT: u32 = table::CLAIM_AHEAD_PERCENT.default;
/// Default expected duration of a step never seen: the default of `IRONFLOW_DEFAULT_STEP_SECS`
/// (README, "Configuration").
#[cfg(any(test, feature = "test-support"))]
pub const DEFAULT_STEP_DURATION: Duration = table::DEFAULT_STEP_SECS.default;

/// Default runs claimed per invocation (N).
#[cfg(test)]
pub const DEFAULT_MAX_RUNS_PER_INVOCATION: usize = table::MAX_RUNS_PER_INVOCATION.default;
/// Default lease TTL, as the reference worker's.
#[cfg(test)]
pub const DEFAULT_LEASE_TTL: Duration = table::LEASE_TTL.default;
/// Default namespace of the poison-pill table's keys when `AWS_LAMBDA_FUNCTION_NAME` is unset.
#[cfg(test)]
pub const DEFAULT_POISON_NAMESPACE: &str = table::POISON_NAMESPACE.default;
/// Default CloudWatch namespace of the EMF metrics.
#[cfg(test)]
pub const DEFAULT_METRICS_NAMESPACE: &str = table::METRICS_NAMESPACE.default;
