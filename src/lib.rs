//! # ironflow-lambda
//!
//! ironflow's worker made serverless: each AWS Lambda invocation claims up to N pending
//! ironflow runs from the API (`/api/v1/internal/*`), executes them with `ironflow-engine`
//! under a lease refresher bounded by the invocation's cutoff and stopped at the run timeout,
//! and hands every run still executing back to Pending before the deadline, for the next
//! invocation to resume by replay.
//!
//! Build a [`builder::LambdaWorker`] once per cold start and hand each event to
//! [`handler::handle`], as the deployable function does (`src/bin/ironflow-lambda.rs`):
//!
//! ```no_run
//! use std::sync::Arc;
//! use ironflow_core::providers::claude::ClaudeCodeProvider;
//! use ironflow_lambda::builder::LambdaWorkerBuilder;
//! use ironflow_lambda::layers::ExitWhenStuckLayer;
//! use lambda_runtime::layers::TracingLayer;
//! use lambda_runtime::{LambdaEvent, Runtime, service_fn};
//!
//! # async fn example() -> Result<(), lambda_runtime::Error> {
//! let worker = Arc::new(
//!     LambdaWorkerBuilder::from_env()?
//!         .provider(Arc::new(ClaudeCodeProvider::new()))
//!         .register(ironflow_lambda::workflows::QuickShell)
//!         .build()?,
//! );
//! let handler = {
//!     let worker = worker.clone();
//!     service_fn(move |event: LambdaEvent<serde_json::Value>| {
//!         let worker = worker.clone();
//!         async move { ironflow_lambda::handler::handle(&worker, event).await }
//!     })
//! };
//! // Runs execute on the worker's own runtime; this loop, the claims and the leases on the
//! // caller's (`#[tokio::main(flavor = "current_thread")]` in the deployable function).
//! Runtime::new(handler)
//!     .layer(TracingLayer::new())
//!     .layer(ExitWhenStuckLayer::new(worker))
//!     .run()
//!     .await
//! # }
//! ```
//!
//! Modules, in the order of one invocation: [`config`], [`secrets`] and [`builder`] (cold start),
//! [`handler`] and [`trigger`] (event in), [`deadline`] and [`invocation`] (the batch),
//! [`execution`], [`runtime`], [`store`], [`calls`], [`lease`] and [`handback`] (one run),
//! [`credentials`] (the token), [`poison`] (the poison-pill table), [`layers`] (after the
//! response),
//! [`orphans`] (no process outlives the invocation), [`pool`] (stale connections after a
//! freeze), [`wake`] and [`api`] (wake-ups after the batch).

#![warn(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod api;
mod build_error;
mod builder;
mod calls;
mod claim_ahead;
mod credentials;
mod deadline;
mod entry;
mod execution;
mod handback;
mod handler;
mod heartbeat;
mod invocation;
pub mod layers;
mod lease;
pub mod logging;
pub mod metrics;
pub mod orphans;
pub mod poison;
mod pool;
mod report;
mod runtime;
pub mod samples;
mod secrets;
pub mod settings;
mod store;
mod trigger;
mod wake;
mod worker;

pub use build_error::BuildError;
pub use builder::LambdaWorkerBuilder;
pub use entry::run;
pub use handler::{HandlerError, Response, handle, handle_response, handle_summary};
pub use poison::dynamodb::{DynamoPoisonTable, DynamoSetupError};
pub use poison::memory::MemoryPoisonTable;
pub use poison::{PoisonMode, PoisonPolicy, PoisonTable};
pub use report::{
    ApiErrorCount, BatchRequest, FaultKind, FlushReport, InvocationSummary, Outcome, RunReport,
    StopReason, WakeReport, WakeTrigger,
};
pub use secrets::SecretError;
pub use settings::{ConfigError, Settings, WakeSettings, WorkerToken};
pub use trigger::TriggerError;
pub use wake::Waker;
pub use worker::LambdaWorker;
