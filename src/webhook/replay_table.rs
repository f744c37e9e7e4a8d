//! The fleet-wide record of the webhook bodies taken ([`super::replay`]), in the DynamoDB
//! poison-pill table when one is configured (`IRONFLOW_POISON_TABLE`), so that a replay served
//! by another execution environment within the window is refused there too.
//!
//! One item per body taken, beside the poison-pill items (`src/poison/dynamodb/`, whose table,
//! key and TTL it shares): `pk = "<namespace>#webhook-body#<hex SHA-256 of the body>"`, and
//! `expires_at` (N, the table's TTL, epoch seconds): when the replay window refuses the body
//! anyway (`at` + window, rounded up). DynamoDB's TTL deletes it some time after (up to days
//! later): an item past its `expires_at` counts as absent.
//!
//! - **Taken?** One strongly consistent `GetItem`.
//! - **Record** One conditional `UpdateItem` (`SET expires_at`, if the item is absent or
//!   expired), so that it needs no permission beyond the poison-pill table's (`GetItem`,
//!   `UpdateItem`); a failed condition means another environment recorded it first.
//!
//! Every call is bounded by the request's time and the table's SDK timeouts; a failure is
//! logged and the local record ([`super::replay::Seen`]) still holds: the table only widens it.

use aws_sdk_dynamodb::types::AttributeValue;
use tokio::time::{Instant, timeout_at};
use tracing::warn;

use super::replay::BodyDigest;
use crate::poison::dynamodb::{PARTITION_KEY, TTL_ATTRIBUTE};

/// The bodies taken, in the poison-pill table.
#[derive(Debug, Clone)]
pub struct ReplayTable {
    client: aws_sdk_dynamodb::Client,
    table: String,
    namespace: String,
}

impl ReplayTable {
    /// The record in `table` under `namespace` (the poison-pill table's), over `client` (the
    /// poison-pill table's own, with its SDK timeouts: one connection pool for the table).
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str, namespace: &str) -> Self {
        Self {
            client,
            table: table.to_string(),
            namespace: namespace.to_string(),
        }
    }

    fn key(&self, digest: &BodyDigest) -> AttributeValue {
        AttributeValue::S(format!(
            "{}#webhook-body#{}",
            self.namespace,
            hex::encode(digest)
        ))
    }

    /// Whether another environment (or this one) recorded `digest` and it has not expired by
    /// `now_ms`; `false` when the table cannot say before `until` (logged).
    pub async fn contains(&self, digest: &BodyDigest, now_ms: i64, until: Instant) -> bool {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, self.key(digest))
            .consistent_read(true)
            .projection_expression("#exp")
            .expression_attribute_names("#exp", TTL_ATTRIBUTE)
            .send();
        match timeout_at(until, read).await {
            Ok(Ok(output)) => output
                .item()
                .and_then(|item| item.get(TTL_ATTRIBUTE))
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
                .is_some_and(|expires_secs| expires_secs.saturating_mul(1000) > now_ms),
            Ok(Err(e)) => {
                warn!(table = %self.table, error = %aws_sdk_dynamodb::error::DisplayErrorContext(&e),
                    "reading the webhook's replay record failed: this environment's own record only");
                false
            }
            Err(_) => {
                warn!(table = %self.table, "reading the webhook's replay record ran out of the request's time");
                false
            }
        }
    }

    /// Record `digest` until `expires_ms` (epoch ms), unless a live record is there already.
    /// A failure is logged.
    pub async fn record(&self, digest: &BodyDigest, expires_ms: i64, now_ms: i64, until: Instant) {
        let secs = |ms: i64| AttributeValue::N(ms.div_euclid(1000).saturating_add(1).to_string());
        let write = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PARTITION_KEY, self.key(digest))
            .update_expression("SET #exp = :exp")
            .condition_expression("attribute_not_exists(#pk) OR #exp <= :now")
            .expression_attribute_names("#pk", PARTITION_KEY)
            .expression_attribute_names("#exp", TTL_ATTRIBUTE)
            .expression_attribute_values(":exp", secs(expires_ms))
            .expression_attribute_values(
                ":now",
                AttributeValue::N(now_ms.div_euclid(1000).to_string()),
            )
            .send();
        match timeout_at(until, write).await {
            Ok(Ok(_)) => {}
            Ok(Err(e))
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
            Ok(Err(e)) => {
                warn!(table = %self.table, error = %aws_sdk_dynamodb::error::DisplayErrorContext(&e),
                    "recording a webhook body as taken failed: only this environment refuses its replays");
            }
            Err(_) => {
                warn!(table = %self.table, "recording a webhook body as taken ran out of the request's time");
            }
        }
    }
}
