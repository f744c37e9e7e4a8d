//! The Lambda function of this crate's workflows: `sam build` and `cargo lambda watch` run it.

use std::process::ExitCode;
use std::sync::Arc;

use ironflow_core::providers::claude::ClaudeCodeProvider;

fn main() -> ExitCode {
    ironflow_lambda::run(|worker| {
        let worker = worker
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .register(my_workflows::Greet)
            .register(my_workflows::DailyReport);
        my_workflows::patterns::register(worker)
    })
}
