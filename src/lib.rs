//! # ironflow-lambda
//!
//! ironflow's worker made serverless: each AWS Lambda invocation claims up to N pending
//! ironflow runs from the API (`/api/v1/internal/*`), executes them with `ironflow-engine`
//! under a lease refresher bounded by the invocation's cutoff and stopped at the run timeout,
//! and hands every run still executing back to Pending before the deadline, for the next
//! invocation to resume by replay.
//!
//! A function is a `main` that registers its agent provider and workflows on the worker
//! [`run`] builds from the environment (the settings: [`settings::VARIABLES`]), and runs the
//! Lambda runtime loop:
//!
//! ```no_run
//! use std::process::ExitCode;
//! use std::sync::Arc;
//! use ironflow_lambda::BedrockProvider;
//!
//! fn main() -> ExitCode {
//!     ironflow_lambda::run(|worker| {
//!         worker
//!             .provider(Arc::new(BedrockProvider::from_env()))
//!             .register(ironflow_lambda::samples::QuickShell)
//!     })
//! }
//! ```
//!
//! To drive invocations yourself (a local runner, tests), build a [`LambdaWorker`] with
//! [`LambdaWorkerBuilder`] and hand each event to [`handle`] ([`handle_summary`] for the typed
//! [`InvocationSummary`]).
//!
//! The public surface: the builder and the worker, the entry point and the handler, the agent
//! providers that work inside a function ([`BedrockProvider`], [`AnthropicSecretProvider`]: the
//! [`agents`] module), the [`settings`] and their errors, what an invocation reports
//! ([`Outcome`], [`RunReport`], [`InvocationSummary`]), the poison-pill table ([`PoisonTable`],
//! [`MemoryPoisonTable`], [`DynamoPoisonTable`]), the [`Waker`] of wake-ups, the [`layers`]
//! around the handler, and the helpers the local runner and the tests share ([`orphans`],
//! [`logging`], [`metrics`], [`samples`]). How it works (one invocation, claim-ahead, handback, poison pill, wake-ups,
//! faults) is in the repository's `docs/` directory.

#![warn(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod admission;
pub mod agents;
mod api;
mod attempt_time;
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
pub mod layers;
mod lease;
pub mod logging;
pub mod metrics;
pub mod orphans;
pub mod poison;
mod pool;
mod process_mark;
mod report;
mod runtime;
pub mod samples;
mod secrets;
pub mod settings;
mod step_times;
mod store;
mod trigger;
mod wake;
pub mod webhook;
mod worker;

pub use agents::{AnthropicSecretProvider, BedrockProvider};
pub use build_error::BuildError;
pub use builder::LambdaWorkerBuilder;
pub use entry::run;
pub use handler::{HandlerError, Response, handle, handle_response, handle_summary};
pub use poison::dynamodb::{DynamoPoisonTable, DynamoSetupError};
pub use poison::memory::MemoryPoisonTable;
pub use poison::{PoisonMode, PoisonPolicy, PoisonTable};
pub use report::{
    ApiErrorCount, BatchRequest, CHARS_PER_TOKEN, Due, FaultKind, FlushReport, InvocationSummary,
    Outcome, RunReport, SleepWatch, Spend, StopReason, TimerWake, WakeReport, WakeTrigger,
    WatchReport,
};
pub use secrets::SecretError;
pub use settings::{ConfigError, FunctionRole, Settings, WakeSettings, WebhookSecret, WorkerToken};
pub use store::spread::CapacitySpread;
pub use trigger::TriggerError;
pub use wake::{LocalWakeQueue, SqsWakeQueue, WakeQueue, Waker};
pub use worker::LambdaWorker;
