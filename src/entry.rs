//! The entry point of a Lambda function running ironflow workflows: [`run`].
//!
//! One call does what the deployable function needs at cold start and for each event: the JSON
//! logs, the child subreaper, the settings from the environment (the worker token from Secrets
//! Manager when `IRONFLOW_WORKER_TOKEN_SECRET_ARN` is set, the Anthropic API key when
//! `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN` is), the DynamoDB poison-pill table and
//! the wake-up queue when configured, the EMF metrics, the checks of the Lambda runtime's own
//! variables, and the runtime loop with its layers ([`crate::layers`]). Every error is one JSON
//! log line (never the token) and exit status 1, which Lambda reports as an init or runtime
//! failure. In the webhook receiver's role (`IRONFLOW_FUNCTION_ROLE=webhook-receiver`) the cold
//! start skips what only the worker needs: the child subreaper and the poison-pill table's
//! `DescribeTable` check (docs/push.md, "Denial of service").
//!
//! The runtime loop, the claims, the lease refreshers and the handbacks run on a single-threaded
//! runtime on the main thread; the worker executes the runs on a runtime of its own
//! ([`crate::runtime`]), so that workflow code blocking its threads cannot stop them. Under
//! Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY` = M > 1) the loop is lambda_runtime's
//! `run_concurrent`: M polling loops on that same thread, M invocations in flight at once
//! ([`crate::LambdaWorker`] says what they share).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::process::ExitCode;
use std::sync::Arc;

use lambda_runtime::layers::TracingLayer;
use lambda_runtime::tower::ServiceBuilder;
use lambda_runtime::{LambdaEvent, Runtime, service_fn};
use serde_json::Value;
use tracing::{error, warn};

use crate::build_error::BuildError;
use crate::builder::LambdaWorkerBuilder;
use crate::layers::{ExitWhenStuckLayer, MetricsLayer};
use crate::settings::table;
use crate::settings::{FUNCTION_ROLE_VAR, FunctionRole};
use crate::worker::LambdaWorker;
use crate::{handler, logging, metrics, orphans};

const USAGE: &str = "This is an ironflow-lambda function: AWS Lambda (or `cargo lambda watch`) runs \
it, and environment variables configure it (the ironflow-lambda README, \"Configuration\"). It \
takes no argument. To run workflows locally without Lambda: `cargo run -p \
ironflow-lambda-local` in the ironflow-lambda repository.";

/// The variables that need the AWS configuration (and only they load it: outside AWS without a
/// region, loading it asks the EC2 instance metadata service, and warns at length).
const AWS_VARIABLES: [&str; 5] = [
    table::WORKER_TOKEN_SECRET_ARN.variable,
    table::ANTHROPIC_API_KEY_SECRET_ARN.variable,
    table::WEBHOOK_SECRET_ARN.variable,
    table::POISON_TABLE.variable,
    table::WAKE_QUEUE_URL.variable,
];

/// Run the Lambda function: build the worker from the environment, let `configure` add the
/// agent provider and the workflows (and any other setting), and serve every event until the
/// runtime stops. Call it from a plain `fn main`:
///
/// ```no_run
/// use std::process::ExitCode;
/// use std::sync::Arc;
/// use ironflow_lambda::BedrockProvider;
/// # use ironflow_engine::context::WorkflowContext;
/// # use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
/// # /// A team's workflow (examples/my-workflows has real ones).
/// # struct Hello;
/// # impl WorkflowHandler for Hello {
/// #     fn name(&self) -> &str { "hello" }
/// #     fn execute<'a>(&'a self, _: &'a mut WorkflowContext) -> HandlerFuture<'a> {
/// #         Box::pin(async { Ok(()) })
/// #     }
/// # }
///
/// fn main() -> ExitCode {
///     ironflow_lambda::run(|worker| {
///         worker
///             .provider(Arc::new(BedrockProvider::from_env()))
///             .register(Hello)
///     })
/// }
/// ```
///
/// Returns the process's exit status: success when the runtime loop ends (it does not, under
/// Lambda), failure (1) after logging the error when the cold start or the runtime fails.
/// `--help` prints what the binary is and exits 0.
pub fn run<F>(configure: F) -> ExitCode
where
    F: FnOnce(LambdaWorkerBuilder) -> LambdaWorkerBuilder,
{
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--help" || a == "-h")
    {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    logging::init(logging::filter(), std::io::stdout);
    logging::log_panics();
    if let Some(problem) = logging::filter_problem() {
        warn!("{problem}");
    }
    if cfg!(panic = "abort") {
        warn!(
            "built with panic = \"abort\": a panicking step ends the process, and the runs of its \
             invocation are left to the API's reaper; set panic = \"unwind\" in \
             [profile.release] (README, \"Run your own workflows\")"
        );
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "could not start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(configure))
}

async fn serve<F>(configure: F) -> ExitCode
where
    F: FnOnce(LambdaWorkerBuilder) -> LambdaWorkerBuilder,
{
    let role = role_from_env();
    // The worker's child processes (shell steps) are reaped; the receiver starts none.
    if role == FunctionRole::Worker {
        orphans::become_subreaper();
    }
    let worker = match build(configure).await {
        Ok(worker) => Arc::new(worker),
        Err(e) => {
            // Lambda reports the init failure and retries the cold start on the next event.
            error!(error = %e, "cold start failed");
            return ExitCode::FAILURE;
        }
    };
    let settings = worker.settings();
    let collector = metrics::install(&settings.metrics_namespace, &function_name());
    // lambda_runtime panics on a missing runtime variable: say so instead.
    if let Some(e) = runtime_environment_error() {
        error!(error = %e, "not under a Lambda runtime");
        return ExitCode::FAILURE;
    }
    let answer = {
        let worker = worker.clone();
        service_fn(move |event: LambdaEvent<Value>| {
            let worker = worker.clone();
            async move { handler::handle(&worker, event).await }
        })
    };
    let handler = ServiceBuilder::new()
        .layer(MetricsLayer::new(collector))
        .service(answer);
    // AWS_LAMBDA_MAX_CONCURRENCY > 1 (Lambda Managed Instances): that many polling loops,
    // each serving one invocation at a time, all admitted by the worker (crate::admission);
    // unset or 1: the one sequential loop of on-demand Lambda.
    let served = Runtime::new(handler)
        .layer(TracingLayer::new())
        .layer(ExitWhenStuckLayer::new(worker))
        .run_concurrent()
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(
                error = %error_chain(e.as_ref()),
                runtime_api = %std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap_or_default(),
                "the Lambda Runtime API (AWS_LAMBDA_RUNTIME_API) failed: the runtime loop stopped"
            );
            ExitCode::FAILURE
        }
    }
}

/// The worker from the environment, configured by `configure`, with the poison-pill table and
/// the wake-ups when their variables are set (the AWS configuration is loaded once, for Secrets
/// Manager, DynamoDB and SQS, and only when one of them is configured).
async fn build<F>(configure: F) -> Result<LambdaWorker, BuildError>
where
    F: FnOnce(LambdaWorkerBuilder) -> LambdaWorkerBuilder,
{
    let uses_aws = AWS_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let aws = if uses_aws {
        aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
    } else {
        aws_config::SdkConfig::builder().build()
    };
    let builder = configure(LambdaWorkerBuilder::from_env_and_secrets(&aws).await?);
    // IRONFLOW_POISON_TABLE set: the shared DynamoDB table, checked now (a missing table stops
    // the cold start with its name); unset: the in-memory table.
    // IRONFLOW_WAKE_QUEUE_URL set: the waker is built from the settings and the AWS
    // configuration by `build`.
    // The receiver (IRONFLOW_FUNCTION_ROLE=webhook-receiver) does not check the table at cold
    // start: its role may only read and write items (docs/push.md, "Denial of service").
    if builder.role() == FunctionRole::WebhookReceiver {
        return builder.connect_poison_table_unchecked().build();
    }
    builder.connect_poison_table().await?.build()
}

/// The role `IRONFLOW_FUNCTION_ROLE` names, for what the cold start does before the settings
/// are read (a bad value is refused with the other settings, by the builder).
fn role_from_env() -> FunctionRole {
    std::env::var(FUNCTION_ROLE_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// The function's name for the metrics' `function` dimension: `AWS_LAMBDA_FUNCTION_NAME`, or
/// `local` outside Lambda.
fn function_name() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "local".into())
}

/// What is wrong with the variables the Lambda runtime sets, which `lambda_runtime` reads with a
/// panic (`Config::from_env`): `None` when all are there and well formed.
fn runtime_environment_error() -> Option<String> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        return Some(
            "AWS_LAMBDA_RUNTIME_API is not set: this binary runs under AWS Lambda or `cargo \
             lambda watch` (README); to run workflows locally without them, use `cargo run \
             -p ironflow-lambda-local`"
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

/// An error with its causes (`client error (Connect): tcp connect error: ...`).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}
