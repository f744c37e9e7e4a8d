//! An example team's own ironflow workflows, deployed on AWS Lambda by `src/main.rs`.
//!
//! | name | input | steps |
//! |---|---|---|
//! | `greet` | `{"name": "Ada"}` (default `world`) | `greet` |
//! | `daily-report` | `{"pause_secs": 0}` (seconds each step waits, default 0) | `extract`, `total`, `publish` |
//!
//! Each step's output is stored by the API, so a run handed back at the end of an invocation
//! resumes at its next step: `total` gets `extract`'s output from the store, not by running
//! it again.
//!
//! [`patterns`]: the seven AI workflow patterns on Amazon Bedrock (docs/agents.md), each in a
//! module of its own.

pub mod patterns;

use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::error::EngineError;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use serde_json::Value;

/// `greet`: one step that greets the run's `name`.
pub struct Greet;

impl WorkflowHandler for Greet {
    fn name(&self) -> &str {
        "greet"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let payload = ctx.payload().await?;
            let name = payload
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("world");
            // The input reaches the shell as a variable, never spliced into the command.
            let greet = ShellConfig::new("echo \"hello, $NAME\"").env("NAME", name);
            ctx.shell("greet", greet).await?;
            Ok(())
        })
    }
}

/// `daily-report`: three steps, each taking the previous one's output.
pub struct DailyReport;

impl WorkflowHandler for DailyReport {
    fn name(&self) -> &str {
        "daily-report"
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let payload = ctx.payload().await?;
            let pause = payload
                .get("pause_secs")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let pause = pause.to_string();
            let step = |command: &str| ShellConfig::new(command).env("PAUSE", &pause);

            let sales = ctx
                .shell("extract", step("sleep \"$PAUSE\"; printf 'eu,3\\nus,5\\n'"))
                .await?;
            let total = ctx
                .shell(
                    "total",
                    step("sleep \"$PAUSE\"; printf '%s' \"$SALES\" | awk -F, '{ n += $2 } END { print n }'")
                        .env("SALES", stdout(&sales.output)?),
                )
                .await?;
            ctx.shell(
                "publish",
                step("sleep \"$PAUSE\"; echo \"daily total: $TOTAL\"")
                    .env("TOTAL", stdout(&total.output)?.trim()),
            )
            .await?;
            Ok(())
        })
    }
}

/// A shell step's standard output.
fn stdout(output: &Value) -> Result<&str, EngineError> {
    output
        .get("stdout")
        .and_then(Value::as_str)
        .ok_or_else(|| EngineError::StepConfig("a shell step's output has no stdout".into()))
}
