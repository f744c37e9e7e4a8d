//! The items' reads and conditional writes: [`PoisonTable`] over the table.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use tracing::warn;
use uuid::Uuid;

use super::{FailureCounter, PoisonError, PoisonTable, RUN_RETENTION, duration_ms};

use super::*;

impl DynamoPoisonTable {
    /// One conditional write of [`PoisonTable::record_failure`]: `restart` overwrites an
    /// expired (or absent) item with a streak of 1, otherwise the count is incremented on an
    /// absent or live item whose streak lacks `failure_id`. `Ok(Err(old))` when the condition
    /// failed, with the item as it was.
    async fn write_failure(
        &self,
        key: &str,
        failure_id: &str,
        now_ms: u64,
        restart: bool,
    ) -> Result<Result<FailureCounter, Option<StoredCounter>>, PoisonError> {
        let op = "record failure";
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, AttributeValue::S(key.to_string()))
            .expression_attribute_names("#pk", PARTITION_KEY)
            .expression_attribute_names("#c", CONSECUTIVE_FAILURES)
            .expression_attribute_names("#l", LAST_FAILURE_MS)
            .expression_attribute_names("#id", LAST_FAILURE_ID)
            .expression_attribute_names("#ids", FAILURE_IDS)
            .expression_attribute_names("#exp", TTL_ATTRIBUTE)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":fid", AttributeValue::S(failure_id.to_string()))
            .expression_attribute_values(":fids", AttributeValue::Ss(vec![failure_id.to_string()]))
            .expression_attribute_values(":exp", n(self.workflow_expires_at(now_ms)))
            .expression_attribute_values(":stale", n(self.stale_before(now_ms)))
            .expression_attribute_values(":ahead", n(Self::dated_at_most(now_ms)))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        req = if restart {
            req.update_expression("SET #c = :one, #l = :now, #id = :fid, #ids = :fids, #exp = :exp")
                .condition_expression("attribute_not_exists(#pk) OR #l <= :stale OR #l > :ahead")
        } else {
            req.update_expression(
                "SET #c = if_not_exists(#c, :zero) + :one, #l = :now, #id = :fid, #exp = :exp \
                 ADD #ids :fids",
            )
            .expression_attribute_values(":zero", n(0))
            .condition_expression(
                "attribute_not_exists(#pk) OR (#l > :stale AND #l <= :ahead AND NOT \
                 contains(#ids, :fid))",
            )
        };
        match req.send().await {
            Ok(out) => {
                let item = out.attributes().ok_or_else(|| {
                    self.malformed(op, "UpdateItem returned no attributes".into())
                })?;
                let stored = StoredCounter::parse(item).map_err(|w| self.malformed(op, w))?;
                Ok(Ok(stored.counter))
            }
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(cf)) => {
                    let old = cf
                        .item()
                        .map(StoredCounter::parse)
                        .transpose()
                        .map_err(|w| self.malformed(op, w))?;
                    Ok(Err(old))
                }
                _ => Err(self.error(op, &e)),
            },
        }
    }

    /// Whether the counter of item `key` counts as absent at `now_ms`: expired, or dated
    /// beyond the clock-skew allowance (logged once per item, and deleted: [`Self::heal`]).
    async fn expired(&self, key: &str, counter: &FailureCounter, now_ms: u64) -> bool {
        if self.future_dated.check(&self.table, key, counter, now_ms) {
            self.heal(key, counter.last_failure_ms).await;
            return true;
        }
        self.policy.is_expired(counter, now_ms)
    }

    /// Delete the future-dated counter of item `key` (while its `last_failure_ms` is still
    /// `last`): read as absent, it would never be reset by a success, and would block again
    /// once the clocks caught up with its date. Best effort: a failure leaves it to the next
    /// read or failure (which restarts it).
    async fn heal(&self, key: &str, last: u64) {
        let deleted = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, AttributeValue::S(key.to_string()))
            .condition_expression("#l = :l")
            .expression_attribute_names("#l", LAST_FAILURE_MS)
            .expression_attribute_values(":l", AttributeValue::N(last.to_string()))
            .send()
            .await;
        if let Err(e) = deleted {
            tracing::debug!(item = key, error = %DisplayErrorContext(&e), "future-dated counter not deleted");
        }
    }

    /// The item under `key`, strongly consistent (when the condition-failure response did not
    /// carry it).
    async fn read_stored(&self, key: &str) -> Result<Option<StoredCounter>, PoisonError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, AttributeValue::S(key.to_string()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.error("read", &e))?;
        out.item()
            .map(StoredCounter::parse)
            .transpose()
            .map_err(|w| self.malformed("read", w))
    }
}

/// A workflow item as stored.
#[derive(Debug)]
pub(super) struct StoredCounter {
    counter: FailureCounter,
    failure_ids: Vec<String>,
}

impl StoredCounter {
    pub(super) fn parse(item: &HashMap<String, AttributeValue>) -> Result<Self, String> {
        // Saturating: a streak counted to u32::MAX and incremented once more by the write
        // (DynamoDB's numbers are wider) still reads as a count, the largest one.
        let consecutive_failures: u128 = number(item, CONSECUTIVE_FAILURES)?;
        let consecutive_failures = u32::try_from(consecutive_failures).unwrap_or(u32::MAX);
        let last_failure_ms = number(item, LAST_FAILURE_MS)?;
        let failure_ids = match item.get(FAILURE_IDS) {
            None => Vec::new(),
            Some(AttributeValue::Ss(ids)) => ids.clone(),
            Some(other) => return Err(format!("{FAILURE_IDS} is not a string set: {other:?}")),
        };
        Ok(Self {
            counter: FailureCounter {
                consecutive_failures,
                last_failure_ms,
            },
            failure_ids,
        })
    }
}

pub(super) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(super) fn number<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    attribute: &str,
) -> Result<T, String> {
    match item.get(attribute) {
        Some(AttributeValue::N(raw)) => raw
            .parse()
            .map_err(|_| format!("{attribute} = {raw:?} is not a whole number in range")),
        Some(other) => Err(format!("{attribute} is not a number: {other:?}")),
        None => Err(format!("{attribute} is missing")),
    }
}

#[async_trait]
impl PoisonTable for DynamoPoisonTable {
    fn name(&self) -> &str {
        &self.table
    }

    async fn counter(
        &self,
        workflow: &str,
        now_ms: u64,
    ) -> Result<Option<FailureCounter>, PoisonError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(
                PARTITION_KEY,
                AttributeValue::S(workflow_key(&self.namespace, workflow)),
            )
            .consistent_read(true)
            .projection_expression("#c, #l")
            .expression_attribute_names("#c", CONSECUTIVE_FAILURES)
            .expression_attribute_names("#l", LAST_FAILURE_MS)
            .send()
            .await
            .map_err(|e| self.error("read", &e))?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let stored = StoredCounter::parse(item).map_err(|w| self.malformed("read", w))?;
        let key = workflow_key(&self.namespace, workflow);
        if self.expired(&key, &stored.counter, now_ms).await {
            return Ok(None);
        }
        Ok(Some(stored.counter))
    }

    async fn counters(
        &self,
        workflows: &[String],
        now_ms: u64,
    ) -> Result<HashMap<String, FailureCounter>, PoisonError> {
        let op = "batch read";
        let by_key: HashMap<String, &String> = workflows
            .iter()
            .map(|w| (workflow_key(&self.namespace, w), w))
            .collect();
        let keys: Vec<&String> = by_key.keys().collect();
        let mut found = HashMap::new();
        for chunk in keys.chunks(BATCH_GET_MAX_KEYS) {
            let mut pending: Vec<HashMap<String, AttributeValue>> = chunk
                .iter()
                .map(|k| {
                    HashMap::from([(PARTITION_KEY.to_string(), AttributeValue::S((*k).clone()))])
                })
                .collect();
            for attempt in 1..=BATCH_GET_ATTEMPTS {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(true)
                    .projection_expression("#pk, #c, #l")
                    .expression_attribute_names("#pk", PARTITION_KEY)
                    .expression_attribute_names("#c", CONSECUTIVE_FAILURES)
                    .expression_attribute_names("#l", LAST_FAILURE_MS)
                    .build()
                    .map_err(|e| PoisonError {
                        table: self.table.clone(),
                        operation: op,
                        cause: DisplayErrorContext(&e).to_string(),
                    })?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|e| self.error(op, &e))?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    let Some(AttributeValue::S(pk)) = item.get(PARTITION_KEY) else {
                        return Err(self.malformed(op, format!("{PARTITION_KEY} missing")));
                    };
                    let Some(workflow) = by_key.get(pk) else {
                        continue;
                    };
                    let stored = StoredCounter::parse(item).map_err(|w| self.malformed(op, w))?;
                    if !self.expired(pk, &stored.counter, now_ms).await {
                        found.insert((*workflow).clone(), stored.counter);
                    }
                }
                pending = out
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
                if pending.is_empty() {
                    break;
                }
                if attempt == BATCH_GET_ATTEMPTS {
                    return Err(PoisonError {
                        table: self.table.clone(),
                        operation: op,
                        cause: format!(
                            "{} keys still unprocessed after {BATCH_GET_ATTEMPTS} attempts \
                             (throttled)",
                            pending.len()
                        ),
                    });
                }
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
        }
        Ok(found)
    }

    async fn record_failure(
        &self,
        workflow: &str,
        failure_id: &str,
        now_ms: u64,
    ) -> Result<FailureCounter, PoisonError> {
        let key = workflow_key(&self.namespace, workflow);
        let mut restart = false;
        for _ in 0..MAX_WRITE_ROUNDS {
            let old = match self
                .write_failure(&key, failure_id, now_ms, restart)
                .await?
            {
                Ok(counter) => return Ok(counter),
                Err(Some(old)) => Some(old),
                // Condition failed but the error did not carry the item: read it.
                Err(None) => self.read_stored(&key).await?,
            };
            let Some(old) = old else {
                // Deleted meanwhile (a success reset it, or TTL): count from nothing.
                restart = false;
                continue;
            };
            if old.failure_ids.iter().any(|id| id == failure_id) {
                // Already counted: a write retried after a lost response.
                return Ok(old.counter);
            }
            // Expired: restart the streak. Live (another instance restarted it meanwhile):
            // increment.
            // The write restarts a future-dated counter itself: no delete needed.
            restart = self
                .future_dated
                .check(&self.table, &key, &old.counter, now_ms)
                || self.policy.is_expired(&old.counter, now_ms);
        }
        Err(PoisonError {
            table: self.table.clone(),
            operation: "record failure",
            cause: format!(
                "the item kept changing under {MAX_WRITE_ROUNDS} conditional writes in a row"
            ),
        })
    }

    async fn reset(&self, workflow: &str) -> Result<(), PoisonError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(
                PARTITION_KEY,
                AttributeValue::S(workflow_key(&self.namespace, workflow)),
            )
            .send()
            .await
            .map_err(|e| self.error("reset", &e))?;
        Ok(())
    }

    async fn observe_lease_recoveries(
        &self,
        run_id: Uuid,
        lease_recoveries: u32,
        now_ms: u64,
    ) -> Result<bool, PoisonError> {
        let op = "observe lease recoveries";
        // Identifies this write: an SDK retry of it after a lost response sends the same
        // token, finds it in the item and still answers `true`.
        let token = Uuid::new_v4().to_string();
        let expires_at = now_ms
            .saturating_add(duration_ms(RUN_RETENTION))
            .div_ceil(1000);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(
                PARTITION_KEY,
                AttributeValue::S(run_key(&self.namespace, run_id)),
            )
            .update_expression("SET #seen = :k, #by = :token, #exp = :exp")
            .condition_expression("attribute_not_exists(#pk) OR #seen < :k")
            .expression_attribute_names("#pk", PARTITION_KEY)
            .expression_attribute_names("#seen", LEASE_RECOVERIES_SEEN)
            .expression_attribute_names("#by", SEEN_BY)
            .expression_attribute_names("#exp", TTL_ATTRIBUTE)
            .expression_attribute_values(":k", n(lease_recoveries))
            .expression_attribute_values(":token", AttributeValue::S(token.clone()))
            .expression_attribute_values(":exp", n(expires_at))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(cf)) => {
                    let ours = cf
                        .item()
                        .and_then(|item| item.get(SEEN_BY))
                        .is_some_and(|by| by.as_s().is_ok_and(|by| *by == token));
                    if ours {
                        warn!(run_id = %run_id, "lease recovery write retried after a lost response");
                    }
                    Ok(ours)
                }
                _ => Err(self.error(op, &e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_counter_parses_and_refuses_malformed_items() {
        let item = HashMap::from([
            (CONSECUTIVE_FAILURES.to_string(), n(3)),
            (LAST_FAILURE_MS.to_string(), n(1_700_000_000_000u64)),
            (
                FAILURE_IDS.to_string(),
                AttributeValue::Ss(vec!["a/0".into()]),
            ),
        ]);
        let s = StoredCounter::parse(&item).unwrap();
        assert_eq!(s.counter.consecutive_failures, 3);
        assert_eq!(s.failure_ids, vec!["a/0".to_string()]);

        let mut bad = item.clone();
        bad.insert(CONSECUTIVE_FAILURES.into(), n(-1));
        assert!(
            StoredCounter::parse(&bad)
                .unwrap_err()
                .contains("consecutive_failures")
        );
        let mut bad = item.clone();
        bad.remove(LAST_FAILURE_MS);
        assert!(StoredCounter::parse(&bad).unwrap_err().contains("missing"));

        // A count past u32::MAX (the write's increment of a saturated streak) saturates.
        let mut big = item;
        big.insert(CONSECUTIVE_FAILURES.into(), n(u64::from(u32::MAX) + 1));
        let s = StoredCounter::parse(&big).unwrap();
        assert_eq!(s.counter.consecutive_failures, u32::MAX);
        big.insert(CONSECUTIVE_FAILURES.into(), n("1e3"));
        assert!(StoredCounter::parse(&big).is_err(), "not a whole number");
    }
}
