//! The builder's poison-pill table: a table given, or the DynamoDB table the settings name,
//! connected with the parts that live in it (the fleet-wide wake-up mark, the record of the
//! webhook bodies taken).

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use tracing::warn;

use super::LambdaWorkerBuilder;
use crate::build_error::BuildError;
use crate::poison::{DynamoPoisonTable, DynamoSetupError, PoisonTable};
use crate::wake::fleet::FleetMark;
use crate::webhook::replay_table::ReplayTable;

impl LambdaWorkerBuilder {
    /// The poison-pill table. Default: an in-memory table (per Lambda instance), or the
    /// DynamoDB table named by `IRONFLOW_POISON_TABLE` once
    /// [`LambdaWorkerBuilder::connect_poison_table`] has connected it.
    pub fn poison_table(mut self, table: Arc<dyn PoisonTable>) -> Self {
        self.poison_table = Some(table);
        self.fleet = None;
        self
    }

    /// The DynamoDB poison-pill table, which also holds the webhook receivers' shared wake-up
    /// mark (`docs/push.md#coalescing`: what a burst of pushes queues, fleet-wide).
    /// [`LambdaWorkerBuilder::connect_poison_table`] sets the one `IRONFLOW_POISON_TABLE`
    /// names this way.
    pub fn dynamo_poison_table(mut self, table: DynamoPoisonTable) -> Self {
        self.fleet = Some(FleetMark::new(
            table.client().clone(),
            table.name(),
            table.namespace(),
        ));
        self.poison_table = Some(Arc::new(table));
        self
    }

    /// How long the wake-ups a push sent count as in flight for the receivers sharing the
    /// DynamoDB table's mark (`docs/push.md#coalescing`). Default and what a deployment uses:
    /// 2 s (`FLEET_WINDOW`, `src/wake/fleet.rs`); every receiver sharing the
    /// table must use the same. A longer one lets a test make several decisions within one
    /// window whatever the machine's load. No environment variable sets it; without
    /// [`LambdaWorkerBuilder::dynamo_poison_table`] (or `IRONFLOW_POISON_TABLE`) there is no
    /// mark and it does nothing.
    pub fn wake_mark_window(mut self, window: Duration) -> Self {
        self.fleet_window = Some(window);
        self
    }

    /// The AWS configuration (region, credentials, endpoint) the DynamoDB poison-pill table and
    /// the wake-up queue are reached with, loaded once per cold start. Default: none
    /// ([`LambdaWorkerBuilder::from_env_and_secrets`] sets the one it is given).
    pub fn aws_config(mut self, aws: SdkConfig) -> Self {
        self.aws = Some(aws);
        self
    }

    /// Connect the DynamoDB poison-pill table named by `IRONFLOW_POISON_TABLE` under the
    /// poison-pill namespace, with the AWS configuration set by [`LambdaWorkerBuilder::aws_config`]
    /// (else the one from the environment), and check that it exists (`DescribeTable`). The same
    /// table holds the fleet-wide wake-up mark (docs/push.md, "Coalescing") and the record of the
    /// bodies the webhook receiver took (docs/push.md, "Replays"). Does nothing when no table is configured or one was set with
    /// [`LambdaWorkerBuilder::poison_table`]. Call it once per cold start, after the poison
    /// threshold and cooldown are final (the table applies the cooldown). Variable
    /// `IRONFLOW_POISON_TABLE`; default none: in-memory table.
    ///
    /// # Errors
    ///
    /// [`BuildError::PoisonTable`] naming the table when it does not exist, has another key
    /// schema, or `DescribeTable` is refused (no credentials, access denied). A passing fault
    /// (throttled, a 5xx, no answer within 2 s) is logged as a warning and the
    /// table used unchecked: each of its calls then fails open while the fault lasts.
    pub async fn connect_poison_table(self) -> Result<Self, BuildError> {
        let Some(name) = self.unconnected_table() else {
            return Ok(self);
        };
        let config = match &self.aws {
            Some(aws) => aws_sdk_dynamodb::config::Builder::from(aws).build(),
            None => {
                let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .load()
                    .await;
                aws_sdk_dynamodb::config::Builder::from(&aws).build()
            }
        };
        let table = self.dynamo_table(&name, config);
        match table.check_table().await {
            Ok(()) => {}
            // A passing fault (throttled, a 5xx, no answer in time) must not stop the worker:
            // each later call fails open while it lasts, as at run time.
            Err(unreachable @ DynamoSetupError::Unreachable { .. }) => {
                warn!(error = %unreachable, "the poison-pill table could not be checked");
            }
            Err(refused) => return Err(refused.into()),
        }
        Ok(self.with_dynamo_parts(table))
    }

    /// [`LambdaWorkerBuilder::connect_poison_table`] without the `DescribeTable` check: the
    /// webhook receiver's cold start, whose role may only read and write the table's items. It
    /// sets the same parts (the poison-pill table, the fleet-wide wake-up mark and the record of
    /// the webhook bodies taken), over the AWS configuration set by
    /// [`LambdaWorkerBuilder::aws_config`] (else an empty one). A missing table shows on the
    /// first item read or write instead.
    pub fn connect_poison_table_unchecked(self) -> Self {
        let Some(name) = self.unconnected_table() else {
            return self;
        };
        let aws = self
            .aws
            .clone()
            .unwrap_or_else(|| SdkConfig::builder().build());
        let config = aws_sdk_dynamodb::config::Builder::from(&aws).build();
        let table = self.dynamo_table(&name, config);
        self.with_dynamo_parts(table)
    }

    /// The table `IRONFLOW_POISON_TABLE` names, when it is set and no table was set otherwise.
    fn unconnected_table(&self) -> Option<String> {
        match self.poison_table {
            Some(_) => None,
            None => self.settings.poison_table.clone(),
        }
    }

    /// The DynamoDB poison-pill table `name` over `config` (not yet checked), under the
    /// poison-pill namespace: the one wiring both roles' cold starts use.
    fn dynamo_table(&self, name: &str, config: aws_sdk_dynamodb::Config) -> DynamoPoisonTable {
        let (namespace, policy) = (&self.settings.poison_namespace, self.settings.poison);
        DynamoPoisonTable::new(config, name, namespace, policy)
    }

    /// Set `table` ([`Self::dynamo_poison_table`]: with the fleet-wide wake-up mark in it) and
    /// the record of the webhook bodies taken, all three over the table's one client.
    fn with_dynamo_parts(self, table: DynamoPoisonTable) -> Self {
        let replay = ReplayTable::new(table.client().clone(), table.name(), table.namespace());
        let mut builder = self.dynamo_poison_table(table);
        builder.replay_table = Some(replay);
        builder
    }
}
