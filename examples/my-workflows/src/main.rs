//! The Lambda function of this crate's workflows: `sam build` and `cargo lambda watch` run it.

use std::process::ExitCode;
use std::sync::Arc;

use ironflow_lambda::BedrockProvider;

fn main() -> ExitCode {
    ironflow_lambda::run(|worker| {
        // Agent steps on Amazon Bedrock, signed by the function's role (docs/agents.md).
        let worker = worker
            .provider(Arc::new(BedrockProvider::from_env()))
            .register(my_workflows::Greet)
            .register(my_workflows::DailyReport);
        my_workflows::patterns::register(worker)
    })
}
