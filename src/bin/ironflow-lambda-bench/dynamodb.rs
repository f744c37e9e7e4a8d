//! DynamoDB calls per run against moto's server, for the DynamoDB poison-pill table.
//!
//! NOT MEASURED YET: the DynamoDB table is not merged (it is being added on another branch).
//! Once it is, [`measure`] is the one function to write: start a worker with the DynamoDB table
//! pointed at `IRONFLOW_TEST_MOTO_ENDPOINT` (moto's server, as `./scripts/test` starts it),
//! count the table's calls (an SDK interceptor, or moto's request log) while draining runs of
//! two workflows, and return [`DynamoDb::Measured`]. The report already renders both variants.
//! Targets (issue 7): at most 1 read per distinct workflow per invocation, 0 writes on the
//! success path.

use crate::BenchError;
use crate::drain::DrainSettings;

/// DynamoDB calls of the poison-pill table.
#[derive(Debug, Clone)]
pub enum DynamoDb {
    /// Not measured, and why.
    NotMeasured(String),
    /// Measured against moto's server.
    #[allow(dead_code)] // Filled in by `measure` once the DynamoDB table is merged.
    Measured {
        /// Invocations measured.
        invocations: usize,
        /// Distinct workflows claimed per invocation, on average.
        workflows_per_invocation: f64,
        /// Reads (GetItem, BatchGetItem, Query) per invocation.
        reads_per_invocation: f64,
        /// Writes (PutItem, UpdateItem, DeleteItem) per successful run.
        writes_per_successful_run: f64,
    },
}

/// Measure the DynamoDB table's calls per run (see the module docs).
pub async fn measure(_s: &DrainSettings) -> Result<DynamoDb, BenchError> {
    Ok(DynamoDb::NotMeasured(
        "not measured yet: DynamoDB table not merged".into(),
    ))
}
