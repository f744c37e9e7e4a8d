//! The workflows the drains run ([`Workload`]) and their handlers, registered alike on the
//! reference worker and on ours.

use ironflow_engine::config::ShellConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_worker::WorkerBuilder;

use crate::agents::workflow as agents;

/// The workflows drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// A handler with no step: the run's whole cost is the worker's and the API's.
    NoOp,
    /// Three shell steps, each `echo`ing one line (a process spawn, step writes, a log push).
    ThreeStepShell,
    /// Three agent steps against the scripted model server ([`crate::agents`],
    /// [`agents::AgentRun`]); not in
    /// [`Workload::ALL`]: drained only by the agent rows (`agents`).
    Agent,
}

impl Workload {
    pub const ALL: [Workload; 2] = [Workload::NoOp, Workload::ThreeStepShell];

    pub fn name(self) -> &'static str {
        match self {
            Workload::NoOp => "bench-noop",
            Workload::ThreeStepShell => "bench-shell-3",
            Workload::Agent => agents::WORKFLOW,
        }
    }

    /// The workload named `name` on the command line (`noop`, `shell`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "noop" => Some(Workload::NoOp),
            "shell" => Some(Workload::ThreeStepShell),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Workload::NoOp => "no-op (a handler with no step)",
            Workload::ThreeStepShell => "three-step shell (`echo` ×3)",
            Workload::Agent => "agent (three model calls)",
        }
    }

    /// The reference worker's builder with this workload registered.
    pub fn register_reference(self, b: WorkerBuilder) -> WorkerBuilder {
        match self {
            Workload::NoOp => b.register(NoOp),
            Workload::ThreeStepShell => b.register(ThreeStepShell),
            Workload::Agent => b.register(agents::AgentRun),
        }
    }

    /// Our builder with this workload registered.
    pub fn register_ours(self, b: LambdaWorkerBuilder) -> LambdaWorkerBuilder {
        match self {
            Workload::NoOp => b.register(NoOp),
            Workload::ThreeStepShell => b.register(ThreeStepShell),
            Workload::Agent => b.register(agents::AgentRun),
        }
    }
}

/// A workflow handler with no step.
pub struct NoOp;

impl WorkflowHandler for NoOp {
    fn name(&self) -> &str {
        Workload::NoOp.name()
    }

    fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// Three shell steps, each printing one line.
pub struct ThreeStepShell;

impl WorkflowHandler for ThreeStepShell {
    fn name(&self) -> &str {
        Workload::ThreeStepShell.name()
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for step in ["fetch", "build", "publish"] {
                ctx.shell(step, ShellConfig::new(&format!("echo {step} done")))
                    .await?;
            }
            Ok(())
        })
    }
}
