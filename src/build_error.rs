//! What [`LambdaWorkerBuilder::build`](crate::LambdaWorkerBuilder::build) and the
//! builder's constructors refuse, shared by the builder and the worker it assembles.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use ironflow_engine::error::EngineError;
use ironflow_store::entities::WorkerTagError;

use crate::api::ClientError;
use crate::poison::DynamoSetupError;
use crate::secrets::SecretError;
use crate::settings::ConfigError;

/// `build()` refused the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No agent provider was set (`provider(...)`), as the reference worker requires.
    #[error("LambdaWorkerBuilder: a provider is required (call .provider(...))")]
    MissingProvider,
    /// A worker tag is malformed, or there are too many.
    #[error("invalid worker tag: {0}")]
    InvalidTag(#[from] WorkerTagError),
    /// The engine refused a handler (e.g. two handlers with one name).
    #[error("could not register workflow handler: {0}")]
    Register(#[source] EngineError),
    /// A registered workflow's name could not be claimed by its name alone: claims send the
    /// names as one comma-separated list, which the API splits and trims
    /// ([`LambdaWorkerBuilder::register`](crate::LambdaWorkerBuilder::register)).
    #[error("invalid workflow name {name}: {reason}")]
    InvalidWorkflowName {
        /// The name, quoted and escaped (cut after 80 characters, with its length).
        name: String,
        /// What is wrong and what is expected.
        reason: &'static str,
    },
    /// A setting that cannot work ([`Settings::validate`](crate::Settings::validate)).
    #[error("invalid setting {setter} ({variable}): {reason}")]
    InvalidSetting {
        /// The builder method concerned.
        setter: &'static str,
        /// The environment variable of the same setting.
        variable: &'static str,
        /// Why it cannot work, with the values involved.
        reason: String,
    },
    /// The HTTP client for the API could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// An environment variable is missing or malformed (from [`LambdaWorkerBuilder::from_env`](crate::LambdaWorkerBuilder::from_env)).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The DynamoDB poison-pill table (`IRONFLOW_POISON_TABLE`) cannot be used: it does not
    /// exist, has the wrong key schema, or cannot be described.
    #[error(transparent)]
    PoisonTable(#[from] DynamoSetupError),
    /// `IRONFLOW_POISON_TABLE` is set but `build()` was called without
    /// [`LambdaWorkerBuilder::connect_poison_table`](crate::LambdaWorkerBuilder::connect_poison_table) (or [`LambdaWorkerBuilder::poison_table`](crate::LambdaWorkerBuilder::poison_table)).
    #[error(
        "IRONFLOW_POISON_TABLE is set to {table} but the table was not connected: call \
         .connect_poison_table().await before .build()"
    )]
    PoisonTableNotConnected {
        /// The configured table name.
        table: String,
    },
    /// `IRONFLOW_WAKE_QUEUE_URL` is set but the builder has no AWS configuration to reach SQS
    /// with ([`LambdaWorkerBuilder::aws_config`](crate::LambdaWorkerBuilder::aws_config), or [`LambdaWorkerBuilder::wake_ups`](crate::LambdaWorkerBuilder::wake_ups)).
    #[error(
        "IRONFLOW_WAKE_QUEUE_URL is set to {queue_url} but there is no AWS configuration to send \
         wake-ups with: call .aws_config(...) (from_env_and_secrets does) or .wake_ups(...)"
    )]
    WakeQueueNotConnected {
        /// The configured queue URL.
        queue_url: String,
    },
    /// A webhook secret is set (`IRONFLOW_WEBHOOK_SECRET` or `..._ARN`) but the worker has no
    /// wake queue to send the receiver's wake-ups to.
    #[error(
        "the webhook receiver is on (IRONFLOW_WEBHOOK_SECRET or IRONFLOW_WEBHOOK_SECRET_ARN) but \
         IRONFLOW_WAKE_QUEUE_URL is not set: the receiver wakes the fleet through that queue"
    )]
    WebhookWithoutWakeQueue,
    /// The worker token could not be read from Secrets Manager (from
    /// [`LambdaWorkerBuilder::from_env_and_secrets`](crate::LambdaWorkerBuilder::from_env_and_secrets)).
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The runtime the engine executes runs on could not be started (no thread could be
    /// spawned).
    #[error("could not start the execution runtime ({threads} threads): {source}")]
    Runtime {
        /// The worker threads asked for (the concurrency plus one).
        threads: usize,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
