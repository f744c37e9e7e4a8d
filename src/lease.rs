//! The bounded lease refresher of one claimed run.
//!
//! Started at the claim, so that a run claimed ahead ([`crate::claim_ahead`]) keeps its lease
//! while it waits for a slot. Refreshes the run's lease (`POST /api/v1/internal/runs/{id}/lease`)
//! every interval until a bound, the cutoff, after which the invocation writes the run's fate
//! itself; an execution that reaches its run deadline stops it before writing the timeout.
//! Signals *lease lost* when the API hands the run to someone else (after following a
//! sub-workflow child's lease to its root, as the reference worker does), or when refreshes
//! keep failing for longer than the lease TTL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironflow_engine::engine::chain_root;
use ironflow_store::entities::LeaseRequest;
use ironflow_store::error::StoreError;
use ironflow_store::store::Store;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};
use uuid::Uuid;

/// A running refresher. Dropping it without [`LeaseRefresher::stop`] aborts the task too.
pub struct LeaseRefresher {
    lost: CancellationToken,
    target: Arc<Mutex<Uuid>>,
    handle: JoinHandle<()>,
}

impl LeaseRefresher {
    /// Start refreshing `run_id`'s lease every `interval`, until `until`.
    pub fn spawn(
        store: Arc<dyn Store>,
        run_id: Uuid,
        lease: LeaseRequest,
        interval: Duration,
        until: Instant,
    ) -> Self {
        let lost = CancellationToken::new();
        let target = Arc::new(Mutex::new(run_id));
        let handle = tokio::spawn(
            refresh(
                store,
                run_id,
                lease,
                interval,
                until,
                lost.clone(),
                target.clone(),
            )
            .instrument(tracing::Span::current()),
        );
        Self {
            lost,
            target,
            handle,
        }
    }

    /// Resolves once the lease is lost; never resolves otherwise.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether the lease was found lost (at a refresh: it renews every interval).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The run whose lease is held: the claimed run, or the root it was followed to.
    pub fn target(&self) -> Uuid {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stop refreshing without waiting for the task: no refresh starts after this, but one
    /// already under way may still complete. For a run whose handler finished (the engine has
    /// written its status, and a late refresh is refused with *lease lost*): it saves the wait
    /// for the aborted task to be polled, a thread hop on the path from one run to the next
    /// claim.
    pub fn abort(self) {
        self.handle.abort();
    }

    /// Stop refreshing and wait until the task has ended: no refresh is sent after this.
    /// For a run whose fate the invocation writes next (handback, timeout, panic, release of
    /// a run claimed ahead, a waiting run whose workflow got blocked).
    pub async fn stop(mut self) {
        self.handle.abort();
        let _ = (&mut self.handle).await;
    }
}

impl Drop for LeaseRefresher {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

async fn refresh(
    store: Arc<dyn Store>,
    run_id: Uuid,
    lease: LeaseRequest,
    interval: Duration,
    until: Instant,
    lost: CancellationToken,
    target_cell: Arc<Mutex<Uuid>>,
) {
    let ttl = lease.ttl;
    let mut expires = Instant::now() + ttl;
    let mut target = run_id;
    loop {
        let next = Instant::now() + interval;
        if next >= until {
            // The bound comes first: the invocation decides the run's fate from here.
            return;
        }
        sleep_until(next).await;
        let renewed = match timeout_at(until, store.renew_lease(target, lease.clone())).await {
            Ok(renewed) => renewed,
            Err(_) => return,
        };
        match renewed {
            Ok(_) => expires = Instant::now() + ttl,
            Err(StoreError::LeaseLost { held_by, .. }) => {
                if target == run_id
                    && let Some(root) = follow_to_root(store.as_ref(), run_id, &lease).await
                {
                    info!(run_id = %run_id, root_run_id = %root, "lease followed the run to its root");
                    target = root;
                    *target_cell
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = root;
                    expires = Instant::now() + ttl;
                    continue;
                }
                warn!(
                    run_id = %target,
                    held_by = held_by.as_deref().unwrap_or("nobody"),
                    "lease lost: taken over by another worker, or the run left Running"
                );
                lost.cancel();
                return;
            }
            Err(err) if Instant::now() >= expires => {
                warn!(
                    run_id = %target,
                    error = %err,
                    ttl_secs = ttl.as_secs(),
                    "lease could not be refreshed before it expired: abandoning the run"
                );
                lost.cancel();
                return;
            }
            Err(err) => warn!(run_id = %target, error = %err, "lease refresh failed, retrying"),
        }
    }
}

/// The root run that took over the lease of sub-workflow child `run_id`, if its lease renews
/// for this worker.
async fn follow_to_root(store: &dyn Store, run_id: Uuid, lease: &LeaseRequest) -> Option<Uuid> {
    let run = store.get_run(run_id).await.ok()??;
    let root = chain_root(&run)?;
    store
        .renew_lease(root, lease.clone())
        .await
        .ok()
        .map(|_| root)
}
