//! The requests the table's client sends, counted per operation (an SDK interceptor).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::{
    ConfigBag, Intercept, RuntimeComponents, interceptors::BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::error::BoxError;

/// Counts the HTTP requests the table's client sends to DynamoDB, per operation (`GetItem`,
/// `UpdateItem`…, from the `X-Amz-Target` header), retries included: what DynamoDB bills
/// and the benchmark reports. An SDK interceptor; cheap clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    calls: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CallCounter {
    fn calls(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Requests sent so far, per operation name.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.calls().clone()
    }

    /// Requests of `operation` (e.g. `"GetItem"`) sent so far.
    pub fn get(&self, operation: &str) -> u64 {
        self.calls().get(operation).copied().unwrap_or(0)
    }

    /// Requests sent so far, every operation.
    pub fn total(&self) -> u64 {
        self.calls().values().sum()
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "IronflowDynamoCallCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let operation = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(|target| target.rsplit('.').next())
            .unwrap_or("unknown")
            .to_string();
        *self.calls().entry(operation).or_insert(0) += 1;
        Ok(())
    }
}
