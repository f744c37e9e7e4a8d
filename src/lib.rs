//! # ironflow-lambda
//!
//! ironflow's worker made serverless: each AWS Lambda invocation claims up to N pending
//! ironflow runs from the API (`/api/v1/internal/*`), executes them with `ironflow-engine`
//! under a lease refresher bounded by the invocation's cutoff and stopped at the run timeout,
//! and hands every run still executing back to Pending before the deadline, for the next
//! invocation to resume by replay.
//!
//! A function is a `main` that registers its agent provider and its team's workflows on the
//! worker [`run`] builds from the environment (the [`settings`]), and runs the Lambda runtime
//! loop (the same as the example crate `examples/my-workflows`):
//!
//! ```no_run
//! use std::process::ExitCode;
//! use std::sync::Arc;
//!
//! use ironflow_engine::config::ShellConfig;
//! use ironflow_engine::context::WorkflowContext;
//! use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
//! use ironflow_lambda::BedrockProvider;
//!
//! /// The team's workflow: one shell step.
//! struct Hello;
//!
//! impl WorkflowHandler for Hello {
//!     fn name(&self) -> &str {
//!         "hello"
//!     }
//!
//!     fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
//!         Box::pin(async move {
//!             ctx.shell("hello", ShellConfig::new("echo hello")).await?;
//!             Ok(())
//!         })
//!     }
//! }
//!
//! fn main() -> ExitCode {
//!     ironflow_lambda::run(|worker| {
//!         worker
//!             .provider(Arc::new(BedrockProvider::from_env()))
//!             .register(Hello)
//!     })
//! }
//! ```
//!
//! To drive invocations yourself (a local runner, tests), build a [`LambdaWorker`] with
//! [`LambdaWorkerBuilder`] and hand each event to [`handle`] ([`handle_summary`] for the typed
//! [`InvocationSummary`], [`handle_response`] for a Function URL's answer).
//!
//! The public surface: the names at this root (the entry point, the builder and the worker,
//! the handler, [`Settings`], the report, the poison-pill table and its two tables, one name
//! per agent provider) and five modules: [`settings`] (the secret newtypes and the variables an
//! operator sets), [`report`] (the report's nested types), [`poison`] (the table's policy),
//! [`agents`] (the providers' defaults) and [`wake_ups`] (the wake-up queues). The feature
//! `test-support` adds the helpers the tests, the local runner and the bench share (`samples`,
//! `orphans`, `logging`, `metrics`). The module map and how the surface is kept small:
//! [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md);
//! how it works (one invocation, claim-ahead, handback, poison pill, wake-ups, faults) is in
//! the repository's `docs/` directory.

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod admission;
pub mod agents;
mod api;
mod attempt_time;
mod aws_faults;
mod build_error;
mod builder;
mod calls;
mod claim_ahead;
mod claimed;
mod context;
mod credentials;
mod deadline;
mod entry;
mod execution;
mod handback;
mod handler;
mod heartbeat;
mod invocation;
mod layers;
mod lease;
#[cfg(not(feature = "test-support"))]
mod logging;
#[cfg(feature = "test-support")]
pub mod logging;
#[cfg(not(feature = "test-support"))]
mod metrics;
#[cfg(feature = "test-support")]
pub mod metrics;
#[cfg(not(feature = "test-support"))]
mod orphans;
#[cfg(feature = "test-support")]
pub mod orphans;
pub mod poison;
mod pool;
mod process_mark;
pub mod report;
mod runtime;
#[cfg(any(test, feature = "test-support"))]
pub mod samples;
mod secrets;
pub mod settings;
mod step_times;
mod store;
mod trigger;
mod wake;
#[cfg(not(feature = "test-support"))]
mod webhook;
#[cfg(feature = "test-support")]
pub mod webhook;
mod worker;

pub use agents::{AnthropicSecretProvider, BedrockProvider};
pub use build_error::BuildError;
pub use builder::LambdaWorkerBuilder;
pub use entry::run;
pub use handler::{HandlerError, Response, handle, handle_response, handle_summary};
pub use poison::{DynamoPoisonTable, MemoryPoisonTable, PoisonTable};
pub use report::{InvocationSummary, Outcome, RunReport};
pub use secrets::SecretError;
pub use settings::{ConfigError, Settings};
pub use trigger::TriggerError;
pub use webhook::Answer as WebhookAnswer;
pub use worker::LambdaWorker;

/// Wake-ups: the queue a function sends its own wake-up messages to when runs are left
/// pending or come due ([`Waker`](crate::wake_ups::Waker), given to [`LambdaWorkerBuilder::wake_ups`]), and its two
/// implementations (with `test-support`, also how capacity wake-ups are spread,
/// `CapacitySpread`: [`LambdaWorkerBuilder::capacity_spread`] sets it). What a wake-up is and when one is
/// sent: `docs/push.md`; the module map:
/// [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).
pub mod wake_ups {
    #[cfg(feature = "test-support")]
    pub use crate::store::spread::CapacitySpread;
    pub use crate::wake::{LocalWakeQueue, SqsWakeQueue, WakeQueue, Waker};
}

/// The internals stay crate-private: outside the crate, none of these paths compiles (each
/// was public before issue 27; the list of what is public: docs/structure.md).
///
/// ```compile_fail
/// use ironflow_lambda::poison::gate::PoisonGate;
/// ```
///
/// ```compile_fail
/// use ironflow_lambda::poison::seen::SeenCounters;
/// ```
///
/// ```compile_fail
/// use ironflow_lambda::settings::table::VARIABLES;
/// ```
///
/// ```compile_fail
/// use ironflow_lambda::settings::is_token;
/// ```
///
/// ```compile_fail
/// use ironflow_lambda::layers::MetricsLayer;
/// ```
///
/// ```compile_fail
/// use ironflow_lambda::poison::RUN_RETENTION;
/// ```
#[cfg(doctest)]
pub struct InternalsArePrivate;
