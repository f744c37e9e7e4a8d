//! The invocation's own calls to the API, apart from the executions': claims, lease
//! refreshes, handbacks and releases, the failures it records from outside a handler.
//!
//! They go through a store of their own ([`GuardedStore`] over its own `ApiRunStore`, so its
//! own HTTP connection pool), polled on the invocation's runtime: when workflow code blocks the
//! threads of the execution runtime ([`crate::runtime`]), the connections its HTTP client holds
//! there stall with them, and these calls must not wait behind them. The engine's recording
//! functions (`fail_or_schedule_retry`) run on a second [`Engine`] over that store, one with no
//! handler.
//!
//! Every call runs in a [returning](crate::store::scope::OnFault::Return) scope bounded by the
//! caller ([`Calls::within`]): its faults are retried until the bound and counted in the
//! invocation's fault log, and then returned.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Arc;

use ironflow_engine::engine::Engine;
use tokio::time::Instant;

use crate::report::Due;
use crate::store::GuardedStore;
use crate::store::fault::FaultLog;
use crate::store::scope::{CallScope, RunKey};

/// The invocation's store, recording engine and fault log.
#[derive(Clone)]
pub struct Calls {
    /// The invocation's own store.
    pub store: Arc<GuardedStore>,
    /// An engine with no handler over that store, for `fail_or_schedule_retry`.
    pub engine: Arc<Engine>,
    /// The invocation's fault log (the summary's `api_errors`).
    pub faults: Arc<FaultLog>,
}

impl Calls {
    /// Run `work` (calls to [`Calls::store`] or [`Calls::engine`]) in a returning scope that
    /// gives up at `until`, about `run` when given (its writes are read back against its
    /// lease). The future returned holds `work` once ([`CallScope::run`]).
    pub fn within<F: Future>(
        &self,
        until: Instant,
        run: Option<RunKey>,
        work: F,
    ) -> impl Future<Output = F::Output> {
        let mut scope = CallScope::returning(until, self.faults.clone());
        if let Some(run) = run {
            scope = scope.with_run(run);
        }
        Arc::new(scope).run(work)
    }

    /// [`Calls::within`] about `run`, and when the writes that landed left the run due again
    /// (a retry's backoff: [`CallScope::due`]).
    pub async fn within_noting_due<F: Future>(
        &self,
        until: Instant,
        run: RunKey,
        work: F,
    ) -> (F::Output, Option<Due>) {
        let scope = Arc::new(CallScope::returning(until, self.faults.clone()).with_run(run));
        let output = scope.clone().run(work).await;
        (output, scope.due())
    }
}
