//! The poison-pill table in DynamoDB, shared by every Lambda instance of the function (and by
//! several functions, each under its own namespace).
//!
//! # Table and items
//!
//! The schema is defined here, once: the SAM template and `infra/create-local-table.sh` create
//! the same table, and a test compares them with these constants.
//!
//! - table: partition key [`PARTITION_KEY`] (`pk`, type S) only, no sort key; on-demand
//!   billing; TTL on [`TTL_ATTRIBUTE`] (`expires_at`).
//! - one item per workflow, `pk = "<namespace>#workflow#<workflow name>"` ([`workflow_key`]):
//!
//!   | attribute | type | meaning |
//!   |---|---|---|
//!   | `consecutive_failures` | N | failures in a row of the current streak |
//!   | `last_failure_ms` | N | last failure, ms since the Unix epoch |
//!   | `last_failure_id` | S | id of the last failure (`<run id>/<retry_count>`, …) |
//!   | `failure_ids` | SS | ids of the failures counted in the current streak (idempotency) |
//!   | `expires_at` | N | TTL, epoch **seconds**: last failure + cooldown + [`TTL_SLACK`] |
//!
//! - one item per run claimed with `lease_recoveries > 0`, `pk = "<namespace>#run#<run id>"`
//!   ([`run_key`]): `lease_recoveries_seen` (N, the highest value this function saw),
//!   `seen_by` (S, a token of the write that set it) and `expires_at` (now +
//!   `RUN_RETENTION`, 7 days). Runs that were never recovered have no item.
//! - one item per function for the webhook receivers' wake-up mark,
//!   `pk = "<namespace>#wake#pushed"`: `covered`, `in_flight_until_ms`, `tail_due_ms`,
//!   `expires_at`, written
//!   and documented by the wake-up code (`src/wake/fleet.rs`, `docs/push.md#coalescing`).
//!
//! The namespace (`IRONFLOW_POISON_NAMESPACE`, default the Lambda function's name) contains no
//! `#`, so keys of different namespaces never collide.
//!
//! # Semantics
//!
//! - **Read** ([`PoisonTable::counter`], [`PoisonTable::counters`]): strongly consistent
//!   `GetItem` / `BatchGetItem`. An item whose cooldown has passed counts as absent, whether
//!   or not DynamoDB's TTL has deleted it yet (TTL deletion lags by up to days); so does an item
//!   whose `last_failure_ms` is more than [`CLOCK_SKEW_ALLOWANCE`] ahead of the reader's clock
//!   (logged once per item and process).
//! - **Failure** ([`PoisonTable::record_failure`]): one conditional `UpdateItem`,
//!   `SET consecutive_failures = if_not_exists(consecutive_failures, 0) + 1, … ADD failure_ids
//!   :id` if the item is absent, or live and its streak does not contain the failure id. It
//!   returns the new count: concurrent failures from any number of instances add up exactly
//!   (DynamoDB serialises writes to one item). When the condition fails, the item is returned
//!   with the error (`ReturnValuesOnConditionCheckFailure = ALL_OLD`): a streak already holding
//!   the id means the failure was counted (a write retried after a lost response) and its
//!   counter is returned unchanged; an expired item (or one dated beyond the clock-skew
//!   allowance) is overwritten by a second conditional write that restarts the streak at 1,
//!   guarded by "still expired" so that of two instances restarting at once one restarts and
//!   the other increments.
//! - **Counts** saturate: a stored `consecutive_failures` above `u32::MAX` (the increment of a
//!   streak at `u32::MAX`) reads as `u32::MAX`.
//! - **Success** ([`PoisonTable::reset`]): `DeleteItem`; the gate calls it only when a counter
//!   exists, so the happy path writes nothing.
//! - **Lease recoveries** ([`PoisonTable::observe_lease_recoveries`]): one conditional
//!   `UpdateItem` on the run's item, "absent or below the claimed value".
//!
//! Every call is bounded (`sdk_timeouts`: connect 1 s, attempt 2 s, operation 5 s, with the
//! SDK's standard retries); the gate cuts each run-time call much sooner (1 s, its
//! `CALL_BUDGET`), as it sits on the claim loop's path. Errors are [`PoisonError`]s carrying the
//! table name and the SDK error with its source chain; the invocation fails open on them (see
//! `super::gate`).
//!
//! IAM actions the function needs on the table: `dynamodb:DescribeTable` (cold start),
//! `dynamodb:GetItem`, `dynamodb:BatchGetItem`, `dynamodb:UpdateItem`, `dynamodb:DeleteItem`.

mod calls;
mod items;

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{KeyType, ScalarAttributeType};
use uuid::Uuid;

use super::{
    CLOCK_SKEW_ALLOWANCE, FailureCounter, FutureDatedLog, PoisonError, PoisonPolicy, PoisonTable,
    RUN_RETENTION, duration_ms,
};
pub use calls::CallCounter;

/// The table's partition key (type S), its only key.
pub const PARTITION_KEY: &str = "pk";
/// The table's TTL attribute: epoch seconds after which DynamoDB may delete the item.
pub const TTL_ATTRIBUTE: &str = "expires_at";
/// Workflow item: failures in a row (N).
pub const CONSECUTIVE_FAILURES: &str = "consecutive_failures";
/// Workflow item: last failure, ms since the Unix epoch (N).
pub const LAST_FAILURE_MS: &str = "last_failure_ms";
/// Workflow item: id of the last failure counted (S).
pub const LAST_FAILURE_ID: &str = "last_failure_id";
/// Workflow item: ids of the failures counted in the current streak (SS).
pub const FAILURE_IDS: &str = "failure_ids";
/// Run item: the highest `lease_recoveries` this function saw for the run (N).
pub const LEASE_RECOVERIES_SEEN: &str = "lease_recoveries_seen";
/// Run item: token of the write that set `lease_recoveries_seen` (S).
pub const SEEN_BY: &str = "seen_by";
/// Time added to a workflow item's TTL beyond its cooldown, so that clock skew between Lambda
/// instances and DynamoDB never deletes a live counter: 1 hour.
pub const TTL_SLACK: Duration = Duration::from_secs(3600);

/// Rounds of conditional writes one [`PoisonTable::record_failure`] may take before giving up
/// (each round is lost only to another instance's concurrent write, which made progress).
const MAX_WRITE_ROUNDS: usize = 6;
/// `BatchGetItem` takes at most 100 keys.
const BATCH_GET_MAX_KEYS: usize = 100;
/// Attempts at a batch's unprocessed keys before the read counts as failed.
const BATCH_GET_ATTEMPTS: usize = 4;

/// `pk` of the item holding `workflow`'s counter: `<namespace>#workflow#<workflow>`.
pub fn workflow_key(namespace: &str, workflow: &str) -> String {
    format!("{namespace}#workflow#{workflow}")
}

/// `pk` of the item holding the `lease_recoveries` seen for a run: `<namespace>#run#<run id>`.
pub fn run_key(namespace: &str, run_id: Uuid) -> String {
    format!("{namespace}#run#{run_id}")
}

/// Timeouts of every call the table makes: connect 1 s, one attempt 2 s, the whole operation
/// (retries included) 5 s. DynamoDB answers in milliseconds in-region; these only bound how
/// long an unreachable table can hold an invocation.
pub fn sdk_timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_attempt_timeout(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(5))
        .build()
}

/// The longest the cold start's `DescribeTable` waits, retries included: 2 s (an
/// unanswered check then starts the worker with the table unchecked).
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The table cannot be used at cold start (`IRONFLOW_POISON_TABLE`).
#[derive(Debug, thiserror::Error)]
pub enum DynamoSetupError {
    /// `DescribeTable` says the table does not exist (in this account and region).
    #[error(
        "poison-pill table {table} (IRONFLOW_POISON_TABLE) does not exist in this account and \
         region: create it (SAM template, or infra/create-local-table.sh locally) or unset \
         IRONFLOW_POISON_TABLE to use the in-memory table"
    )]
    NotFound {
        /// The table name.
        table: String,
    },
    /// The table exists with another key schema.
    #[error(
        "poison-pill table {table} (IRONFLOW_POISON_TABLE) has the wrong key schema: expected \
         only a partition key \"pk\" of type S, found {found}"
    )]
    WrongSchema {
        /// The table name.
        table: String,
        /// The key schema found, rendered.
        found: String,
    },
    /// `DescribeTable` was refused (no credentials, access denied, an invalid request): a
    /// configuration that every later call would meet too.
    #[error("poison-pill table {table} (IRONFLOW_POISON_TABLE): DescribeTable failed: {cause}")]
    Describe {
        /// The table name.
        table: String,
        /// The SDK error with its source chain.
        cause: String,
    },
    /// `DescribeTable` met a passing fault: throttled, a 5xx, no answer in time, the
    /// connection failed. [`LambdaWorkerBuilder::connect_poison_table`](crate::LambdaWorkerBuilder::connect_poison_table)
    /// starts with the table unchecked on it: each later call fails open, as a run-time fault
    /// does.
    #[error(
        "poison-pill table {table} (IRONFLOW_POISON_TABLE): DescribeTable met a passing fault \
         (the table is used unchecked; each call fails open while the fault lasts): {cause}"
    )]
    Unreachable {
        /// The table name.
        table: String,
        /// The SDK error with its source chain.
        cause: String,
    },
}

/// DynamoDB's throttling codes (sent with a 400).
const THROTTLED: &[&str] = &[
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "LimitExceededException",
];

/// A [`PoisonTable`] in DynamoDB: one item per workflow (its failure streak), per run
/// recovered from a lost lease, and per function for the webhook receivers' wake-up mark,
/// partition key `pk`, TTL on `expires_at` (the SAM template's `PoisonTable` creates it). The
/// semantics of each call: `docs/design.md#poison-pill`.
///
/// # Examples
///
/// ```no_run
/// use ironflow_lambda::DynamoPoisonTable;
/// use ironflow_lambda::poison::PoisonPolicy;
///
/// # async fn example() -> Result<(), ironflow_lambda::poison::DynamoSetupError> {
/// // Region and credentials from the environment, as on Lambda.
/// let table = DynamoPoisonTable::connect("ironflow-poison", "my-function", PoisonPolicy::default())
///     .await?;
/// println!("{} DynamoDB calls so far", table.calls().total());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoPoisonTable {
    client: Client,
    table: String,
    namespace: String,
    policy: PoisonPolicy,
    calls: CallCounter,
    /// Future-dated items already logged (shared by the clones).
    future_dated: std::sync::Arc<FutureDatedLog>,
}

impl DynamoPoisonTable {
    /// Connect to `table` with the AWS configuration from the environment (region,
    /// credentials, and `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL` for a local endpoint),
    /// and check with `DescribeTable` that it exists with the expected key schema.
    ///
    /// `namespace` prefixes every key; `policy` (threshold, cooldown) must be the worker's.
    ///
    /// # Errors
    ///
    /// [`DynamoSetupError`] naming the table when it does not exist, has another key schema,
    /// or cannot be described.
    pub async fn connect(
        table: &str,
        namespace: &str,
        policy: PoisonPolicy,
    ) -> Result<Self, DynamoSetupError> {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        Self::connect_with(
            aws_sdk_dynamodb::config::Builder::from(&sdk).build(),
            table,
            namespace,
            policy,
        )
        .await
    }

    /// [`DynamoPoisonTable::connect`] with an explicit client configuration (endpoint,
    /// region, credentials), e.g. a local DynamoDB-protocol server in tests.
    ///
    /// # Errors
    ///
    /// As [`DynamoPoisonTable::connect`].
    pub async fn connect_with(
        config: aws_sdk_dynamodb::Config,
        table: &str,
        namespace: &str,
        policy: PoisonPolicy,
    ) -> Result<Self, DynamoSetupError> {
        let t = Self::new(config, table, namespace, policy);
        t.check_table().await?;
        Ok(t)
    }

    /// The table over `config` without checking it exists. The client runs with
    /// `sdk_timeouts` and counts its calls ([`DynamoPoisonTable::calls`]).
    pub fn new(
        config: aws_sdk_dynamodb::Config,
        table: &str,
        namespace: &str,
        policy: PoisonPolicy,
    ) -> Self {
        let calls = CallCounter::default();
        let config = config
            .to_builder()
            .timeout_config(sdk_timeouts())
            .interceptor(calls.clone())
            .build();
        Self {
            client: Client::from_conf(config),
            table: table.to_string(),
            namespace: namespace.to_string(),
            policy,
            calls,
            future_dated: std::sync::Arc::default(),
        }
    }

    /// The DynamoDB requests this table has sent, per operation.
    pub fn calls(&self) -> &CallCounter {
        &self.calls
    }

    /// The namespace prefixing every key.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The SDK client, to inspect the table's items in tests (`test-support`).
    #[cfg(feature = "test-support")]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The SDK client (the webhook receivers' tables share it).
    #[cfg(not(feature = "test-support"))]
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// `DescribeTable`: the table exists, keyed by `pk` (S) alone.
    pub(crate) async fn check_table(&self) -> Result<(), DynamoSetupError> {
        // A cold start's check: a table that does not answer costs it at most this much
        // (Lambda gives the whole init phase 10 s), then the worker starts unchecked.
        let check_timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(1))
            .operation_attempt_timeout(Duration::from_secs(1))
            .operation_timeout(DESCRIBE_TIMEOUT)
            .build();
        let out = match self
            .client
            .describe_table()
            .table_name(&self.table)
            .customize()
            .config_override(
                aws_sdk_dynamodb::config::Builder::new().timeout_config(check_timeouts),
            )
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                if let Some(DescribeTableError::ResourceNotFoundException(_)) = e.as_service_error()
                {
                    return Err(DynamoSetupError::NotFound {
                        table: self.table.clone(),
                    });
                }
                let table = self.table.clone();
                let cause = DisplayErrorContext(&e).to_string();
                return Err(if crate::aws_faults::is_passing_fault(&e, THROTTLED) {
                    DynamoSetupError::Unreachable { table, cause }
                } else {
                    DynamoSetupError::Describe { table, cause }
                });
            }
        };
        let Some(desc) = out.table() else {
            return Err(DynamoSetupError::Describe {
                table: self.table.clone(),
                cause: "the response has no table description".into(),
            });
        };
        let keys: Vec<String> = desc
            .key_schema()
            .iter()
            .map(|k| {
                let ty = desc
                    .attribute_definitions()
                    .iter()
                    .find(|d| d.attribute_name() == k.attribute_name())
                    .map_or("?", |d| d.attribute_type().as_str());
                format!("{} {} {}", k.attribute_name(), k.key_type().as_str(), ty)
            })
            .collect();
        let expected = [format!(
            "{PARTITION_KEY} {} {}",
            KeyType::Hash.as_str(),
            ScalarAttributeType::S.as_str()
        )];
        if keys != expected {
            return Err(DynamoSetupError::WrongSchema {
                table: self.table.clone(),
                found: format!("[{}]", keys.join(", ")),
            });
        }
        Ok(())
    }

    fn error<E>(&self, operation: &'static str, e: &SdkError<E>) -> PoisonError
    where
        E: std::error::Error + 'static,
    {
        PoisonError {
            table: self.table.clone(),
            operation,
            cause: DisplayErrorContext(e).to_string(),
        }
    }

    fn malformed(&self, operation: &'static str, what: String) -> PoisonError {
        PoisonError {
            table: self.table.clone(),
            operation,
            cause: format!("malformed item: {what}"),
        }
    }

    /// Exclusive lower bound of a live item's `last_failure_ms` at `now_ms`: an item whose
    /// last failure is at or before it has outlived the cooldown.
    fn stale_before(&self, now_ms: u64) -> i128 {
        i128::from(now_ms) - i128::from(duration_ms(self.policy.cooldown))
    }

    /// Inclusive upper bound of a live item's `last_failure_ms` at `now_ms`: an item dated
    /// later is ahead of `now_ms` by more than [`CLOCK_SKEW_ALLOWANCE`] and counts as absent.
    fn dated_at_most(now_ms: u64) -> u64 {
        now_ms.saturating_add(duration_ms(CLOCK_SKEW_ALLOWANCE))
    }

    fn workflow_expires_at(&self, now_ms: u64) -> u64 {
        now_ms
            .saturating_add(duration_ms(self.policy.cooldown))
            .saturating_add(duration_ms(TTL_SLACK))
            .div_ceil(1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_namespace() {
        assert_eq!(workflow_key("fn-a", "deploy"), "fn-a#workflow#deploy");
        let id = Uuid::nil();
        assert_eq!(
            run_key("fn-a", id),
            "fn-a#run#00000000-0000-0000-0000-000000000000"
        );
    }

    #[test]
    fn ttl_is_in_seconds_after_the_cooldown_and_slack() {
        let t = DynamoPoisonTable::new(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
            "t",
            "ns",
            PoisonPolicy {
                threshold: 3,
                cooldown: Duration::from_secs(60),
            },
        );
        assert_eq!(t.workflow_expires_at(1_000_500), 1_001 + 60 + 3600);
        assert_eq!(t.stale_before(1_000), 1_000 - 60_000);
        assert_eq!(DynamoPoisonTable::dated_at_most(1_000), 31_000);
    }
}
