//! The deployable function: the example workflows, configured from the environment
//! (see the README; the worker token from Secrets Manager when `IRONFLOW_WORKER_TOKEN_SECRET_ARN`
//! is set), run by the Lambda runtime. Locally: `cargo lambda watch`.

use std::process::ExitCode;
use std::sync::Arc;

use ironflow_core::providers::claude::ClaudeCodeProvider;
use ironflow_lambda::builder::{BuildError, LambdaWorker, LambdaWorkerBuilder};
use ironflow_lambda::layers::ExitWhenStuckLayer;
use ironflow_lambda::wake::Waker;
use ironflow_lambda::{handler, logging, metrics, orphans, workflows};
use lambda_runtime::layers::TracingLayer;
use lambda_runtime::{LambdaEvent, Runtime, service_fn};
use serde_json::Value;

const USAGE: &str =
    "ironflow-lambda: the deployable function, run by AWS Lambda (or `cargo lambda \
watch`) and configured by environment variables (README, \"Configuration\"). It takes no argument.
To run the sample workflows locally without Lambda: cargo run --bin ironflow-lambda-local";

/// Every error is logged as one JSON line (never the token) and the process exits 1, which
/// Lambda reports as an init or runtime failure; nothing else is printed.
///
/// The runtime loop, the claims, lease refreshers and handbacks run on this single-threaded
/// runtime; the worker executes the runs on a runtime of its own (`ironflow_lambda::runtime`),
/// so that workflow code blocking its threads cannot stop them.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--help" || a == "-h")
    {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    logging::init(logging::filter(), std::io::stdout);
    orphans::become_subreaper();
    let worker = match build_worker().await {
        Ok(worker) => Arc::new(worker),
        Err(e) => {
            // Stop the cold start with the error in the logs: Lambda reports the init failure
            // and retries the cold start on the next event.
            tracing::error!(error = %e, "cold start failed");
            return ExitCode::FAILURE;
        }
    };
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "local".into());
    let namespace =
        std::env::var("IRONFLOW_METRICS_NAMESPACE").unwrap_or_else(|_| "ironflow-lambda".into());
    let collector = metrics::install(&namespace, &function);
    // lambda_runtime panics on a missing runtime variable: outside Lambda (or cargo lambda
    // watch), stop with an error that says so instead.
    if let Some(e) = runtime_environment_error() {
        tracing::error!(error = %e, "not under a Lambda runtime");
        return ExitCode::FAILURE;
    }
    let exit_when_stuck = ExitWhenStuckLayer::new(worker.clone());
    let handler = service_fn(move |event: LambdaEvent<Value>| {
        let worker = worker.clone();
        async move {
            let response = handler::handle(&worker, event).await;
            // The metrics document goes out before the response: the process may be
            // frozen right after it.
            if let Some(collector) = collector {
                metrics::flush(collector, std::io::stdout().lock());
            }
            response
        }
    });
    let runtime = Runtime::new(handler)
        .layer(TracingLayer::new())
        .layer(exit_when_stuck)
        .run()
        .await;
    match runtime {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let api = std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap_or_default();
            // The error and its causes ("client error (Connect): tcp connect error: ...").
            let mut error = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                error.push_str(&format!(": {c}"));
                cause = c.source();
            }
            tracing::error!(
                error = %error,
                runtime_api = %api,
                "the Lambda Runtime API (AWS_LAMBDA_RUNTIME_API) failed: the runtime loop stopped"
            );
            ExitCode::FAILURE
        }
    }
}

/// Settings from the environment (the worker token from Secrets Manager when only
/// IRONFLOW_WORKER_TOKEN_SECRET_ARN is set), the example workflows, the default provider, the
/// poison-pill table, and wake-ups when `IRONFLOW_WAKE_QUEUE_URL` is set (the AWS clients
/// honour `AWS_ENDPOINT_URL`).
async fn build_worker() -> Result<LambdaWorker, BuildError> {
    // Region, credentials and endpoint from the Lambda environment: loaded once, for Secrets
    // Manager, the poison-pill table and the wake-up queue, and only when one of them is
    // configured. Outside AWS without AWS_REGION, loading them asks the EC2 instance metadata
    // service for a region, and warns at length when there is none.
    let uses_aws = [
        "IRONFLOW_WORKER_TOKEN_SECRET_ARN",
        "IRONFLOW_POISON_TABLE",
        "IRONFLOW_WAKE_QUEUE_URL",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let aws = if uses_aws {
        aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
    } else {
        aws_config::SdkConfig::builder().build()
    };
    let mut builder = LambdaWorkerBuilder::from_env_and_secrets(&aws)
        .await?
        .provider(Arc::new(ClaudeCodeProvider::new()))
        .register(workflows::QuickShell)
        .register(workflows::MultiStep { step_secs: 5.0 })
        .register(workflows::Flaky)
        .register(workflows::AlwaysFails)
        // IRONFLOW_POISON_TABLE set: the shared DynamoDB table, checked now (a missing table
        // stops the cold start with its name); unset: the in-memory table.
        .connect_poison_table()
        .await?;
    if let Some(waker) = Waker::from_env(&aws)? {
        builder = builder.wake_ups(waker);
    }
    builder.build()
}

/// What is wrong with the variables the Lambda runtime sets, which `lambda_runtime` reads with a
/// panic (`Config::from_env`): `None` when all are there and well formed.
fn runtime_environment_error() -> Option<String> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        return Some(
            "AWS_LAMBDA_RUNTIME_API is not set: this binary runs under AWS Lambda or `cargo \
             lambda watch` (README); to run workflows locally without them, use `cargo run \
             --bin ironflow-lambda-local`"
                .to_string(),
        );
    }
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut wrong = Vec::new();
    for name in ["AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_VERSION"] {
        if var(name).is_none() {
            wrong.push(format!("{name} (not set)"));
        }
    }
    let memory = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE";
    match var(memory) {
        None => wrong.push(format!("{memory} (not set)")),
        Some(v) if v.parse::<i32>().is_err() => {
            wrong.push(format!(
                "{memory} (expected a whole number of MB, found {v:?})"
            ));
        }
        Some(_) => {}
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "the Lambda runtime's variables are incomplete: {}; AWS Lambda and `cargo lambda \
             watch` set them",
            wrong.join(", ")
        )
    })
}
