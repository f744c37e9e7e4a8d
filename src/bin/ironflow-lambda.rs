//! The deployable function: the example workflows, configured from the environment
//! (see the README; the worker token from Secrets Manager when `IRONFLOW_WORKER_TOKEN_SECRET_ARN`
//! is set), run by the Lambda runtime. Locally: `cargo lambda watch`.

use std::sync::Arc;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::builder::LambdaWorkerBuilder;
use ironflow_lambda::{handler, orphans, workflows};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_current_span(true)
        .without_time()
        .init();

    orphans::become_subreaper();
    // Region, credentials and endpoint from the Lambda environment, shared by every AWS client.
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let worker = Arc::new(
        LambdaWorkerBuilder::from_env_and_secrets(&aws)
            .await?
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(workflows::QuickShell)
            .register(workflows::MultiStep { step_secs: 5.0 })
            .register(workflows::Flaky)
            .register(workflows::AlwaysFails)
            .build()?,
    );
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let worker = worker.clone();
        async move { handler::handle(&worker, event).await }
    }))
    .await
}
