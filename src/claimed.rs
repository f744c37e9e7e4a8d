//! A claimed run, from its claim to the start of its execution: its lease refresher (started at
//! the claim, so that a run claimed ahead keeps its lease while it waits for a slot), the lease
//! it needs left to start a step, and its steps read while it waits.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Arc;
use std::time::Duration;

use ironflow_store::entities::{LeaseRequest, Run, Step};
use ironflow_store::error::StoreError;
use ironflow_store::store::RunStore;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, error_span};
use uuid::Uuid;

use crate::lease::{LeaseRefresher, RefreshContext};
use crate::store::GuardedStore;
use crate::store::fault::FaultLog;
use crate::store::scope::CallScope;

/// A claimed run with its lease refresher, started at the claim so that a run claimed ahead
/// keeps its lease while it waits for a slot, and the run's tracing span.
pub(crate) struct Claimed {
    pub run: Run,
    pub refresher: LeaseRefresher,
    pub span: tracing::Span,
    /// When its claim was sent: the claim's copy of the run answers reads for one refresh
    /// interval from then ([`GuardedStore::prime`]).
    pub claim_sent: Instant,
    /// The lease refresh interval.
    pub interval: Duration,
    /// Lease a step needs left to start ([`step_start_margin`]).
    pub start_margin: Duration,
    /// Its steps, read while it waits for a slot (claimed ahead).
    pub steps_ahead: Option<StepsAhead>,
}

/// The steps of a run claimed ahead, read while it waits for a slot: the engine's first step
/// list is then answered without a request of its own (the read, done or still in flight when
/// the run starts, is the one the engine would have made, sent earlier).
pub(crate) struct StepsAhead {
    sent: Instant,
    read: AbortOnDropHandle<Result<Vec<Step>, StoreError>>,
    /// The read's scope: the time it lost to the API is the execution's.
    scope: Arc<CallScope>,
}

impl StepsAhead {
    /// Read `run_id`'s steps through `store`, bounded by `until` (the lease's validity or the
    /// cutoff), in a task of its own that dies with this value.
    pub fn read(
        store: Arc<GuardedStore>,
        run_id: Uuid,
        until: Instant,
        faults: Arc<FaultLog>,
    ) -> Self {
        let scope = Arc::new(CallScope::returning(until, faults));
        let read = async move { store.list_steps(run_id).await };
        Self {
            sent: Instant::now(),
            read: AbortOnDropHandle::new(tokio::spawn(scope.clone().run(read).in_current_span())),
            scope,
        }
    }

    /// The steps and when their request was sent, once the read is done, if it succeeded
    /// (else the engine reads them itself). Awaited in the execution's scope, which takes the
    /// time the read lost to the API ([`CallScope::absorb_lost_time`]).
    pub(crate) async fn ready(self) -> Option<(Vec<Step>, Instant)> {
        let read = self.read.await;
        CallScope::current().absorb_lost_time(&self.scope);
        match read {
            Ok(Ok(steps)) => Some((steps, self.sent)),
            _ => None,
        }
    }
}

impl Claimed {
    /// Start refreshing the lease of `run`, claimed under `lease` by a request sent at
    /// `claim_sent`, every `interval` until `cutoff`.
    pub fn new(
        ctx: RefreshContext,
        run: Run,
        lease: &LeaseRequest,
        claim_sent: Instant,
        interval: Duration,
        cutoff: Instant,
    ) -> Self {
        // At ERROR level, as the invocation's span: its fields on every line about the run.
        let span = error_span!("run", run_id = %run.id, workflow = %run.workflow_name);
        let refresher = span.in_scope(|| {
            LeaseRefresher::spawn(ctx, &run, lease.clone(), claim_sent, interval, cutoff)
        });
        Self {
            run,
            refresher,
            span,
            claim_sent,
            interval,
            start_margin: step_start_margin(lease.ttl, interval),
            steps_ahead: None,
        }
    }
}

/// Lease a step needs left to start: [`STEP_START_MARGIN`], or half of what a lease renewed on
/// time always has left (its TTL less one refresh interval) if that is less. A step created
/// just before the lease's last confirmed validity would otherwise start (its process spawned)
/// after it, while another worker may hold the run already.
fn step_start_margin(ttl: Duration, interval: Duration) -> Duration {
    STEP_START_MARGIN.min(ttl.saturating_sub(interval) / 2)
}

/// The most lease a step needs left to start: 1 s.
const STEP_START_MARGIN: Duration = Duration::from_secs(1);
