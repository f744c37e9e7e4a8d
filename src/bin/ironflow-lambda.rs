//! The project's deployable function: its sample workflows on the library's entry point
//! ([`ironflow_lambda::run`]), configured by the environment (README, "Configuration"). A team's
//! own function is the same few lines with its own workflows (README, "Run your own
//! workflows"). Locally: `cargo lambda watch`. Its agent steps run on Amazon Bedrock, signed by the
//! function's role ([`ironflow_lambda::BedrockProvider`]).

use std::process::ExitCode;
use std::sync::Arc;

use ironflow_lambda::BedrockProvider;

// The library's sample workflows, compiled into the function itself: the library exports them
// only with its `test-support` feature, which a deployed function leaves off.
#[path = "../samples.rs"]
mod samples;

fn main() -> ExitCode {
    ironflow_lambda::run(|worker| {
        worker
            .provider(Arc::new(BedrockProvider::from_env()))
            .register(samples::QuickShell)
            .register(samples::MultiStep { step_secs: 5.0 })
            .register(samples::Flaky)
            .register(samples::AlwaysFails)
    })
}
