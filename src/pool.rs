//! Stale pooled connections after a freeze.
//!
//! Lambda freezes the process between invocations. Meanwhile the API, its load balancer or a
//! NAT gateway may drop the idle keep-alive connections that `ApiRunStore`'s HTTP client keeps
//! pooled; the first request sent on such a connection fails. A claim could be retried, but
//! the engine's own requests (step writes) would meet the other stale connections mid-run.
//!
//! So, when an invocation starts after an idle gap, [`PoolWarden::before_claims`] sends a few
//! cheap concurrent probes (`GET /api/v1/internal/runs/{nil}`, answered 404) through each of
//! the worker's two stores (the engine's, from the execution runtime that owns its connections,
//! and the invocation's own, see [`crate::calls`]): each takes one pooled connection, a stale
//! one fails and is evicted from the pool, and the run's requests then go out on live or fresh
//! connections. The probes bypass the store's guard: a failed probe is the point, not a fault
//! to retry. Cost: `2 × concurrency + 2` requests per store, only after an idle gap; none for
//! back-to-back invocations.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use std::sync::Arc;

use ironflow_store::store::Store;
use tokio::time::{Instant, timeout_at};
use tracing::{debug, info};
use uuid::Uuid;

/// Default idle gap after which the pool is probed: 10 s.
pub const DEFAULT_IDLE_PROBE_AFTER: Duration = Duration::from_secs(10);

/// Remembers when the API was last used, and probes the pool after an idle gap.
#[derive(Debug)]
pub struct PoolWarden {
    probe_after: Duration,
    last_used: Mutex<Option<SystemTime>>,
}

impl PoolWarden {
    /// A warden that probes after `probe_after` without any invocation.
    pub fn new(probe_after: Duration) -> Self {
        Self {
            probe_after,
            last_used: Mutex::new(None),
        }
    }

    /// Before the first claim of an invocation: if the previous invocation ended more than the
    /// idle gap ago (wall clock, which keeps counting while the process is frozen), send
    /// `probes` concurrent probes through each of `invocation` (polled here) and `engine`
    /// (polled on `runtime`), each bounded by `until`. Returns how many failed (stale
    /// connections evicted, or an unreachable API: the claim then reports the error).
    pub async fn before_claims(
        &self,
        invocation: Arc<dyn Store>,
        engine: Arc<dyn Store>,
        runtime: &crate::runtime::ExecutionRuntime,
        probes: usize,
        until: Instant,
    ) -> usize {
        let idle = {
            let last = self
                .last_used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match *last {
                None => return 0, // cold start: the pool is empty
                Some(at) => at.elapsed().unwrap_or_default(),
            }
        };
        if idle < self.probe_after {
            return 0;
        }
        let probe = move |store: Arc<dyn Store>| async move {
            matches!(
                timeout_at(until, store.get_run(Uuid::nil())).await,
                Ok(Err(_)) | Err(_)
            )
        };
        let there = runtime.spawn({
            let engine_probes = (0..probes).map(move |_| probe(engine.clone()));
            futures_util::future::join_all(engine_probes)
        });
        let here = futures_util::future::join_all((0..probes).map(|_| probe(invocation.clone())));
        let (here, there) = futures_util::future::join(here, there).await;
        let failed = here
            .into_iter()
            .chain(there.unwrap_or_default())
            .filter(|failed| *failed)
            .count();
        if failed > 0 {
            info!(
                idle_ms = idle.as_millis() as u64,
                failed, "evicted stale pooled connections after an idle gap"
            );
        } else {
            debug!(
                idle_ms = idle.as_millis() as u64,
                "pooled connections still live after an idle gap"
            );
        }
        failed
    }

    /// At the end of an invocation.
    pub fn after_invocation(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(SystemTime::now());
    }
}
