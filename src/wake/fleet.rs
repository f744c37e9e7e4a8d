//! The webhook receiver's wake-up decisions shared by every execution environment: a
//! high-water mark of the wake-ups in flight, in the poison-pill table
//! (`docs/push.md#coalescing`).
//!
//! On-demand Lambda serves concurrent Function URL requests in separate environments, so the
//! receiver's one-decision-at-a-time lock (`push_turn`) holds in one process only: receivers
//! that read the queue's depth before any of them sends would each send what the backlog needs.
//! With the table, each decision that would send makes one conditional `UpdateItem` on one item
//! first, `pk = "<namespace>#wake#pushed"` ([`mark_key`]):
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `covered` | N | wake-ups the queue holds for the backlog once the last decision's are sent (at most `ceil(pending / N)`) |
//! | `in_flight_until_ms` | N | until when they count as in flight, ms since the Unix epoch |
//! | `tail_due_ms` | N | when the last tail wake-up booked becomes visible on the queue, ms since the Unix epoch; absent before the first |
//! | `expires_at` | N | TTL, epoch seconds (an hour later: the item is never read after `in_flight_until_ms`) |
//!
//! A decision that read `queued` wake-ups on the queue and would send `count` writes
//! `target = queued + count` (≤ `ceil(pending / N)`): `SET covered = :target,
//! in_flight_until_ms = :now + FLEET_WINDOW` if the item is absent, its window has passed, or
//! `covered < :target`; the old item is returned either way. A decision whose write succeeds
//! sends at most `target − covered` of a live mark (all it needs when the window had passed).
//! The successful writes of a window raise `covered` strictly, each sending at most the rise,
//! so they queue at most the largest `target` written in the window (≤ the largest
//! `ceil(pending / N)` a receiver read), however many environments decide at once. A send SQS
//! refused in part gives its share back ([`FleetMark::give_back`], a second write, only then).
//!
//! A decision whose write fails finds wake-ups sent less than [`FLEET_WINDOW`] ago covering a
//! backlog at least as large; it sends nothing now. But the mark cannot tell wake-ups still on
//! their way from wake-ups whose invocations already claimed the backlog: in a trickle (runs a
//! second apart, fast claims) the window's wake-ups may have claimed every run they were sent
//! for before this decision's run turned Pending. So the decision makes sure a *tail* wake-up
//! comes after it ([`FleetMark::book_tail`]): a second conditional write, `SET tail_due_ms =
//! :now + delay` if no tail was booked or the last one is due already (`tail_due_ms <= :now`),
//! where the delay is the window's time left (the `in_flight_until_ms` the failed write
//! returned), rounded up to whole seconds, at least 1: 1 or 2 s. The decision whose write
//! succeeds sends one wake-up with that `DelaySeconds`; the others send nothing, a tail not
//! yet due coming after them. A tail's invocation claims what the window's wake-ups left: every
//! run whose push it covers was Pending before that push's decision, which came before the
//! tail was due (a tail that fills its batch wakes more, as any batch). At most one tail is on
//! its way at any time, fleet-wide, each at least 1 s after the one before; it is due at the
//! end of the window it was booked in, and becomes visible then, so that decisions after the
//! window count it in `queued`. So a window queues at most the largest `target` + 1, and a run
//! whose push the mark covers is claimable by a woken invocation at most `FLEET_WINDOW` + 1 s
//! after that push (the rounding), plus the event source mapping's pick-up and a cold start.
//! A tail SQS refused is un-booked ([`FleetMark::give_back_tail`]) and its push answered 503,
//! for the API to re-send it. A table error or no answer in time, on either write, falls back
//! to the decision of this process alone (`docs/push.md#coalescing`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::poison::dynamodb::{PARTITION_KEY, TTL_ATTRIBUTE};

/// How long wake-ups a push sent count as in flight for the other receivers: 2 s. It spans the
/// decisions of one burst (the API posts a burst's events at once; a decision takes a pending
/// count, a queue-depth read, this write and a send) and SQS's depth catching up with the sends;
/// after it, receivers subtract what the queue shows, as in one process.
pub const FLEET_WINDOW: Duration = Duration::from_secs(2);

/// The mark's item: wake-ups sent for the backlog (N).
pub const COVERED: &str = "covered";
/// The mark's item: until when they count as in flight, ms since the Unix epoch (N).
pub const IN_FLIGHT_UNTIL_MS: &str = "in_flight_until_ms";
/// The mark's item: when the tail wake-up booked last becomes visible on the queue, ms since
/// the Unix epoch (N).
pub const TAIL_DUE_MS: &str = "tail_due_ms";
/// Longest delay SQS allows a message: 900 s (a tail's delay is at most the window).
const MAX_DELAY_SECS: u64 = 900;
/// The mark item's TTL after its window: 1 hour.
const MARK_TTL: Duration = Duration::from_secs(3600);

/// `pk` of the mark: `<namespace>#wake#pushed` (the poison-pill namespace: one mark per
/// function; a workflow named `wake#pushed` would still have its own `#workflow#` key).
pub fn mark_key(namespace: &str) -> String {
    format!("{namespace}#wake#pushed")
}

/// The shared mark in the poison-pill table (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct FleetMark {
    client: Client,
    table: String,
    key: String,
    /// How long a decision's wake-ups count as in flight ([`FLEET_WINDOW`] but in tests).
    window: Duration,
    /// Decisions that fell back to their own environment's (the table failed), this process.
    errors: Arc<AtomicU64>,
}

/// What one decision may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// The mark is raised to `target`: send `count` wake-ups (possibly fewer than asked).
    Send {
        /// Wake-ups this decision sends.
        count: usize,
        /// The mark written, to give back what SQS refuses.
        target: u64,
        /// The window written, ms since the Unix epoch.
        until_ms: u64,
    },
    /// Wake-ups in flight already cover a backlog at least this large: send none now (the
    /// window's tail, [`FleetMark::book_tail`], is for the runs they may miss).
    Covered {
        /// The mark found.
        covered: u64,
        /// The end of its window, ms since the Unix epoch.
        until_ms: u64,
    },
}

/// A tail wake-up this decision booked ([`FleetMark::book_tail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// Its `DelaySeconds`: the window's time left, rounded up to whole seconds (1 to 900).
    pub delay_secs: u64,
    /// When it becomes visible on the queue, ms since the Unix epoch (`tail_due_ms`).
    pub due_ms: u64,
}

/// The mark could not be read or written (the decision falls back to this process's own).
#[derive(Debug, thiserror::Error)]
#[error("wake-up mark in table {table}: {cause}")]
pub struct FleetError {
    /// The poison-pill table's name.
    pub table: String,
    /// The SDK error with its source chain, or what was malformed.
    pub cause: String,
}

impl FleetMark {
    /// The mark of the function whose poison-pill keys start with `namespace`, in `table`,
    /// through `client` (the poison-pill table's, with its timeouts).
    pub fn new(client: Client, table: &str, namespace: &str) -> Self {
        Self {
            client,
            table: table.to_string(),
            key: mark_key(namespace),
            window: FLEET_WINDOW,
            errors: Arc::default(),
        }
    }

    /// The same mark with a window other than [`FLEET_WINDOW`]: tests that need several
    /// decisions within one window, whatever the machine's load. Every environment sharing the
    /// mark must use the same window.
    pub(crate) fn with_window(self, window: Duration) -> Self {
        Self { window, ..self }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Count one more failed decision; the new count.
    pub(crate) fn count_error(&self) -> u64 {
        self.errors
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
    }

    fn error(&self, cause: String) -> FleetError {
        FleetError {
            table: self.table.clone(),
            cause,
        }
    }

    /// An `UpdateItem` of the mark's item (`pk = mark_key`), for one decision's write.
    fn update_mark(&self) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, AttributeValue::S(self.key.clone()))
    }

    /// Send `write`, a conditional write of the mark that needs no old item: `true` when it was
    /// written, `false` when its condition failed.
    async fn conditionally(&self, write: UpdateItemFluentBuilder) -> Result<bool, FleetError> {
        match write.send().await {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.error(DisplayErrorContext(&e).to_string())),
            },
        }
    }

    /// One conditional write: raise the mark to `target` (the queued wake-ups the decision read
    /// plus the `count` it would send) at `now_ms`; what it may send.
    ///
    /// # Errors
    ///
    /// [`FleetError`] when DynamoDB refuses or does not answer (the SDK's timeouts bound it),
    /// or the item is malformed.
    pub async fn claim(&self, target: u64, count: usize, now_ms: u64) -> Result<Share, FleetError> {
        let until_ms = now_ms.saturating_add(ms(self.window));
        let expires_at = until_ms.saturating_add(ms(MARK_TTL)).div_ceil(1000);
        let result = self
            .update_mark()
            .expression_attribute_names("#c", COVERED)
            .expression_attribute_names("#u", IN_FLIGHT_UNTIL_MS)
            .expression_attribute_names("#exp", TTL_ATTRIBUTE)
            .expression_attribute_values(":t", n(target))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":until", n(until_ms))
            .expression_attribute_values(":exp", n(expires_at))
            .update_expression("SET #c = :t, #u = :until, #exp = :exp")
            .condition_expression("attribute_not_exists(#c) OR #u <= :now OR #c < :t")
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let live = match out.attributes() {
                    Some(old) if number(old, IN_FLIGHT_UNTIL_MS).is_some_and(|u| u > now_ms) => {
                        number(old, COVERED)
                    }
                    _ => None,
                };
                let room = live.map_or(u64::MAX, |covered| target.saturating_sub(covered));
                let count = usize::try_from(room).map_or(count, |room| count.min(room));
                Ok(Share::Send {
                    count,
                    target,
                    until_ms,
                })
            }
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(cf)) => {
                    let old = |attribute| cf.item().and_then(|old| number(old, attribute));
                    match (old(COVERED), old(IN_FLIGHT_UNTIL_MS)) {
                        (Some(covered), Some(until_ms)) => Ok(Share::Covered { covered, until_ms }),
                        _ => Err(self.error(
                            "the condition failed on an item without `covered` or `in_flight_until_ms`"
                                .into(),
                        )),
                    }
                }
                _ => Err(self.error(DisplayErrorContext(&e).to_string())),
            },
        }
    }

    /// Lower the mark by `unsent` wake-ups SQS refused, if it is still the one this decision
    /// wrote (`target`, `until_ms`): the next push then sends them. One conditional write; a
    /// mark another receiver raised since is left alone (its sends cover the backlog).
    ///
    /// # Errors
    ///
    /// [`FleetError`] when DynamoDB refuses or does not answer.
    pub async fn give_back(
        &self,
        target: u64,
        until_ms: u64,
        unsent: u64,
    ) -> Result<(), FleetError> {
        // A failed condition (another receiver raised the mark since) is not an error.
        self.conditionally(
            self.update_mark()
                .expression_attribute_names("#c", COVERED)
                .expression_attribute_names("#u", IN_FLIGHT_UNTIL_MS)
                .expression_attribute_values(":t", n(target))
                .expression_attribute_values(":until", n(until_ms))
                .expression_attribute_values(":lower", n(target.saturating_sub(unsent)))
                .update_expression("SET #c = :lower")
                .condition_expression("#c = :t AND #u = :until"),
        )
        .await?;
        Ok(())
    }

    /// Book the tail wake-up for a decision the window ending at `window_end_ms` covers (a
    /// [`Share::Covered`]'s `until_ms`), at `now_ms`: one conditional write, `SET tail_due_ms =
    /// :due` if no tail was ever booked or the last one is due already (`tail_due_ms <= :now`),
    /// where `:due` is `now_ms` plus the window's time left rounded up to whole seconds (at
    /// least 1, at most 900). The [`Tail`] to send when this decision booked it; `None` when a
    /// tail not yet due was booked already: it comes after this decision, and covers its run.
    ///
    /// # Errors
    ///
    /// [`FleetError`] when DynamoDB refuses or does not answer.
    pub async fn book_tail(
        &self,
        window_end_ms: u64,
        now_ms: u64,
    ) -> Result<Option<Tail>, FleetError> {
        let delay_secs = tail_delay_secs(window_end_ms, now_ms);
        let due_ms = now_ms.saturating_add(delay_secs.saturating_mul(1000));
        let written = self
            .conditionally(
                self.update_mark()
                    .expression_attribute_names("#c", COVERED)
                    .expression_attribute_names("#tail", TAIL_DUE_MS)
                    .expression_attribute_values(":now", n(now_ms))
                    .expression_attribute_values(":due", n(due_ms))
                    .update_expression("SET #tail = :due")
                    .condition_expression(
                        "attribute_exists(#c) AND (attribute_not_exists(#tail) OR #tail <= :now)",
                    ),
            )
            .await?;
        Ok(written.then_some(Tail { delay_secs, due_ms }))
    }

    /// Un-book `tail`, which SQS refused, if it is still the one booked: the next decision the
    /// mark covers books another.
    ///
    /// # Errors
    ///
    /// [`FleetError`] when DynamoDB refuses or does not answer.
    pub async fn give_back_tail(&self, tail: Tail) -> Result<(), FleetError> {
        // A failed condition (the tail booked is no longer this one) is not an error.
        self.conditionally(
            self.update_mark()
                .expression_attribute_names("#tail", TAIL_DUE_MS)
                .expression_attribute_values(":due", n(tail.due_ms))
                .update_expression("REMOVE #tail")
                .condition_expression("#tail = :due"),
        )
        .await?;
        Ok(())
    }
}

/// A tail's `DelaySeconds`: the time left until `window_end_ms` at `now_ms`, rounded up to
/// whole seconds, at least 1, at most 900 (SQS's limit).
fn tail_delay_secs(window_end_ms: u64, now_ms: u64) -> u64 {
    window_end_ms
        .saturating_sub(now_ms)
        .div_ceil(1000)
        .clamp(1, MAX_DELAY_SECS)
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn number(item: &HashMap<String, AttributeValue>, attribute: &str) -> Option<u64> {
    item.get(attribute)?.as_n().ok()?.parse().ok()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_lives_under_the_function_s_namespace() {
        assert_eq!(mark_key("fn-a"), "fn-a#wake#pushed");
    }

    #[test]
    fn a_tail_arrives_once_its_window_is_over() {
        assert_eq!(tail_delay_secs(10_000, 8_000), 2);
        assert_eq!(tail_delay_secs(10_000, 8_001), 2);
        assert_eq!(tail_delay_secs(10_000, 9_000), 1);
        assert_eq!(tail_delay_secs(10_000, 9_999), 1);
        assert_eq!(tail_delay_secs(10_000, 10_000), 1, "at least 1 s");
        assert_eq!(tail_delay_secs(10_000, 12_000), 1, "a clock ahead");
        assert_eq!(tail_delay_secs(u64::MAX, 0), 900, "SQS's longest delay");
    }
}
