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

pub mod api;
pub mod builder;
pub mod calls;
pub mod claim_ahead;
pub mod config;
pub mod credentials;
pub mod deadline;
pub mod execution;
pub mod handback;
pub mod handler;
pub mod heartbeat;
pub mod invocation;
pub mod layers;
pub mod lease;
#[cfg(feature = "local")]
pub mod local;
pub mod logging;
pub mod metrics;
pub mod orphans;
pub mod poison;
pub mod pool;
pub mod runtime;
pub mod secrets;
pub mod store;
pub mod trigger;
pub mod wake;
pub mod workflows;
