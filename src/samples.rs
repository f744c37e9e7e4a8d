//! Example workflows registered by the deployable function and the local runner.
//!
//! | name | what it does |
//! |---|---|
//! | `quick-shell` | one shell step, done in milliseconds |
//! | `multi-step` | three shell steps of `step_secs` each: outlasts a short invocation, so it is handed back and resumed |
//! | `flaky` | one step that times out on its first try and succeeds on its step-level retry |
//! | `always-fails` | a step that exits 3: trips the poison pill after a few runs |
//!
//! They only use `sh`, so they run anywhere the function does.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::time::Duration;

use ironflow_core::retry::RetryPolicy;
use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};

/// One shell step that prints a line.
pub struct QuickShell;

impl WorkflowHandler for QuickShell {
    fn name(&self) -> &str {
        "quick-shell"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell("hello", ShellConfig::new("echo hello from ironflow-lambda"))
                .await?;
            Ok(())
        })
    }
}

/// Three steps (`prepare`, `build`, `publish`) sleeping `step_secs` each.
pub struct MultiStep {
    /// Seconds each step takes.
    pub step_secs: f64,
}

impl WorkflowHandler for MultiStep {
    fn name(&self) -> &str {
        "multi-step"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for step in ["prepare", "build", "publish"] {
                let cmd = format!("sleep {} && echo {step} done", self.step_secs);
                ctx.shell(step, ShellConfig::new(&cmd)).await?;
            }
            Ok(())
        })
    }
}

/// A step that hangs (and times out after 1 s) the first time it runs for a run, then succeeds
/// on its step-level retry, which removes its marker file from the temporary directory.
pub struct Flaky;

impl WorkflowHandler for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let marker =
                std::env::temp_dir().join(format!("ironflow-lambda-flaky-{}", ctx.run_id()));
            let cmd = format!(
                "if [ -e '{m}' ]; then rm -f '{m}'; echo recovered; else touch '{m}'; sleep 30; fi",
                m = marker.display()
            );
            let retry = RetryPolicy::new(2).backoff(Duration::from_millis(100));
            ctx.shell(
                "call-flaky-service",
                ShellConfig::new(&cmd).timeout_secs(1).retry_policy(retry),
            )
            .await?;
            Ok(())
        })
    }
}

/// A step that always exits with status 3.
pub struct AlwaysFails;

impl WorkflowHandler for AlwaysFails {
    fn name(&self) -> &str {
        "always-fails"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.shell(
                "broken",
                ShellConfig::new("echo 'this always fails' >&2; exit 3"),
            )
            .await?;
            Ok(())
        })
    }
}
