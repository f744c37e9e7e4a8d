//! The workflows of the pickup rows, registered alike in our worker and the reference's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_core::error::OperationError;
use ironflow_engine::config::delay::DelayConfig;
use ironflow_engine::context::WorkflowContext;
use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
use ironflow_lambda::LambdaWorkerBuilder;
use ironflow_store::store::Store;
use ironflow_worker::WorkerBuilder;
use uuid::Uuid;

use super::Kind;
use crate::BenchError;
use crate::workload::{NoOp, Workload};

/// The sleep of the sleep rows: 3 s.
pub const NAP_SECS: u64 = 3;
/// The sleep of the run whose timer wake-up waits on the queue in the diagnostic row: 10 min
/// (its wake-up is delayed 10 min 11 s, within SQS's 15 min).
pub const LONG_NAP_SECS: u64 = 600;

const NAP: &str = "bench-pickup-nap";
const LONG_NAP: &str = "bench-pickup-long-nap";
const FAILS_ONCE: &str = "bench-pickup-fails-once";
/// The name of the delay step, whose output holds the wake time.
const NAP_STEP: &str = "nap";

/// One `ctx.delay` of `secs`, then done.
struct Nap {
    name: &'static str,
    secs: u64,
}

impl WorkflowHandler for Nap {
    fn name(&self) -> &str {
        self.name
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            ctx.delay(NAP_STEP, DelayConfig::from_secs(self.secs))
                .await?;
            Ok(())
        })
    }
}

/// The first attempt of each run fails as a step past its 1 s timeout does
/// (`OperationError::Timeout`, retryable: the engine schedules the retry after its backoff),
/// without starting a process: a shell step's child would be an orphan to the orphan sweeps of
/// our invocations in the other lanes of this process, which kill it (`exit -9`, not
/// retryable). The retry does nothing and completes.
#[derive(Default)]
struct FailsOnce {
    failed: Arc<Mutex<HashSet<Uuid>>>,
}

impl WorkflowHandler for FailsOnce {
    fn name(&self) -> &str {
        FAILS_ONCE
    }

    fn execute<'a>(&'a self, ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let first = self
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(ctx.run_id());
            if first {
                return Err(OperationError::Timeout {
                    step: "slow".into(),
                    limit: Duration::from_secs(1),
                }
                .into());
            }
            Ok(())
        })
    }
}

/// The workflow of the runs a row creates, and their `max_retries`.
pub fn created(kind: Kind) -> (&'static str, u32) {
    match kind {
        Kind::Created | Kind::BehindTimer => (Workload::NoOp.name(), 0),
        Kind::Sleep => (NAP, 0),
        Kind::Retry => (FAILS_ONCE, 1),
    }
}

/// The workflow of the run parked on the queue's timer in the diagnostic row.
pub fn long_nap() -> &'static str {
    LONG_NAP
}

/// Our builder with the row's workflows registered.
pub fn register_ours(kind: Kind, b: LambdaWorkerBuilder) -> LambdaWorkerBuilder {
    match kind {
        Kind::Created => b.register(NoOp),
        Kind::Sleep => b.register(Nap {
            name: NAP,
            secs: NAP_SECS,
        }),
        Kind::Retry => b.register(FailsOnce::default()),
        Kind::BehindTimer => b.register(NoOp).register(Nap {
            name: LONG_NAP,
            secs: LONG_NAP_SECS,
        }),
    }
}

/// The reference worker's builder with the row's workflows registered.
pub fn register_reference(kind: Kind, b: WorkerBuilder) -> WorkerBuilder {
    match kind {
        Kind::Created => b.register(NoOp),
        Kind::Sleep => b.register(Nap {
            name: NAP,
            secs: NAP_SECS,
        }),
        Kind::Retry => b.register(FailsOnce::default()),
        Kind::BehindTimer => b.register(NoOp).register(Nap {
            name: LONG_NAP,
            secs: LONG_NAP_SECS,
        }),
    }
}

/// When run `id`'s sleep came due: the delay step's `wake_at` (the run's `scheduled_at` while
/// it slept; the API's waker clears it when it makes the run Pending).
pub async fn wake_at(store: &Arc<dyn Store>, id: Uuid) -> Result<DateTime<Utc>, BenchError> {
    let steps = store.list_steps(id).await?;
    let wake_at = steps
        .iter()
        .filter(|s| s.name == NAP_STEP)
        .find_map(|s| {
            s.output
                .as_ref()?
                .get("wake_at")?
                .as_str()
                .map(str::to_string)
        })
        .ok_or_else(|| BenchError::msg(format!("run {id}: no delay step with a wake_at")))?;
    DateTime::parse_from_rfc3339(&wake_at)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| BenchError::msg(format!("run {id}: wake_at {wake_at:?}: {e}")))
}
