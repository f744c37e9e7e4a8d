//! The store the engine executes runs through, and the invocation's own calls go through:
//! `ironflow-worker`'s [`ApiRunStore`] under a guard that bounds, retries and reads back every
//! call to the API, and hands each claimed run to the engine's first read of it.
//!
//! **Bounded and retried** ([`guard`]). `ApiRunStore`'s timeouts are fixed (30 s per request, 5 s
//! to connect) and its `PUT`s retry a transport error or a 5xx after 1, 2 and 4 s, blindly: so
//! the `PUT`s do not go through it but make one attempt each (`store/put.rs`), and only the
//! guard sends a write again, after reading back what the lost attempt did (docs/faults.md,
//! "Writes under a lease"). Each call here is bounded by the
//! [scope] of the work it belongs to (an execution's cutoff and lease, the invocation's
//! last write) and by a per-attempt limit, and its future is dropped at the bound: a reads is
//! retried until the bound, a write is read back before it is sent again (a write retried after
//! a lost answer meets the illegal-transition 500 its first, applied, attempt causes), and a call
//! that cannot be read back is sent again only when it surely never left.
//!
//! **An infrastructure error is never a workflow failure.** An API fault ([`fault`]) the retries
//! could not overcome never returns to the engine, which would record the run as Failed for good
//! (it treats a store error as non-retryable): the execution's scope stops, and the run's
//! supervisor ([`crate::execution`]) hands the run back to Pending, to be resumed by replay. The
//! engine only ever sees the API's own refusals (a bad request, an output over the size limit).
//! A write's error texts and a step's trace are cut to sizes the API takes (`store/bounded.rs`),
//! so that a failure is never refused for its message's length.
//!
//! **A run this execution holds is read from what it knows** ([`GuardedStore::prime`]).
//! `Engine::execute_handler_run(id)` starts with `get_run(id)`, right after the claim returned that
//! same run, and reads it again for its pause checks (before each step, at the end) and for the
//! input. The run's view here answers those reads: the claim's copy, then the copy of the latest
//! live read, each for one lease refresh interval after its request was sent; after that, the next
//! read goes to the API and renews the view. A write that only records progress (the engine's cost
//! and duration after each step) lands in the view as the API applies it; after any other write of
//! the run, the next read goes to the API (`store/view.rs`). Nothing about the run changes under
//! its lease but through this execution, except an operator's pause or cancel: the lease refresher
//! sees those at its next renewal (the API refuses to renew a run that left Running), within one
//! refresh interval, and the supervisor then stops the execution, as the reference worker does
//! ([`crate::execution`]: only a status the execution wrote itself lets it finish). What
//! the engine takes from the claim's copy (the workflow's name and trigger, labels, handler
//! version, retry count, carried cost and duration, cost limit, creation time, input) does not
//! change after the run's creation, or only under its lease. Sub-workflow children, whose first
//! read hands their lease to the root run, are not viewed.
//!
//! **The token follows rotations** ([`crate::credentials`]): a call the API answers 401 asks for a
//! newer token, and the store is rebuilt with it.
//!
//! Calls `ApiRunStore` answers locally (routes a worker does not have) are forwarded as they are.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod bounded;
pub mod claim_log;
pub mod fault;
pub mod fit;
pub mod guard;
pub(crate) mod holder;
mod put;
mod readback;
pub mod scope;
mod spend;
pub mod spread;
mod view;

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_engine::engine::chain_root;
use ironflow_engine::error::EngineError;
use ironflow_engine::signal::{SignalOrigin, SignalSendFuture, SignalSender};
use ironflow_store::prelude::*;
use ironflow_store::store::StoreFuture;
use ironflow_worker::ApiRunStore;
use tokio::time::Instant;
use uuid::Uuid;

use self::fault::Route;
use self::scope::CallScope;
use self::view::{Taken, Views};
use crate::api::ApiClient;
use crate::credentials::Credentials;
use crate::report::Spend;

/// Attempts of a claim (`GET /runs/next`) that meets faults: 3. A claim the API refuses for a
/// wrong base URL (an empty 404) or a proxy's error page looks like a server fault; the
/// invocation explains it after the third attempt rather than retrying until its cutoff.
pub const CLAIM_ATTEMPTS: u32 = 3;

/// How a claim is retried: [`CLAIM_ATTEMPTS`], each awaited until the scope's end (see
/// [`guard`]).
const CLAIM_RETRIES: guard::Retries = guard::Retries {
    attempts: Some(CLAIM_ATTEMPTS),
    attempt_limit: false,
};

/// No spread of capacity wake-ups (a store built without [`GuardedStore::with_capacity_spread`]).
const NO_SPREAD: spread::CapacitySpread = spread::CapacitySpread {
    spread: Duration::ZERO,
    max: Duration::ZERO,
};

/// Forwards each listed method to the store as first built, unchanged: `ApiRunStore` answers
/// them locally, without a request.
macro_rules! forward {
    ($(fn $name:ident $(<$lt:lifetime>)? (&$($self_lt:lifetime)? self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(
            fn $name $(<$lt>)? (&$($self_lt)? self $(, $arg: $ty)*) -> $ret {
                self.base.$name($($arg),*)
            }
        )*
    };
}

/// The store traits besides `RunStore` (after the macro they use).
mod stores;

/// Where the guarded calls go.
enum Source {
    /// The API: an `ApiRunStore` rebuilt when the token changes.
    Api(ApiSource),
    /// Any store as it is (the API's own store in tests).
    #[cfg(test)]
    Fixed(Arc<dyn Store>),
}

struct ApiSource {
    url: String,
    credentials: Arc<Credentials>,
    /// The `PUT`s, one attempt each ([`put`]), never `ApiRunStore`'s retrying `put_json`.
    writes: ApiClient,
    /// The token generation the store was built with, and the store.
    current: RwLock<(u64, Arc<ApiRunStore>)>,
}

impl ApiSource {
    fn store(&self) -> Arc<ApiRunStore> {
        let generation = self.credentials.generation();
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == generation {
                return current.1.clone();
            }
        }
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.0 != generation {
            let token = self.credentials.token();
            *current = (
                generation,
                Arc::new(ApiRunStore::new(&self.url, token.expose())),
            );
        }
        current.1.clone()
    }
}

/// The guarded store (see the module docs).
pub struct GuardedStore {
    source: Source,
    /// The store as first built, for the calls answered without a request.
    base: Arc<dyn Store>,
    /// The runs held under this worker's leases, as known (see [`GuardedStore::prime`]).
    views: Views,
    /// What the held runs' steps used and cost ([`GuardedStore::take_spend`]).
    spends: spend::Spends,
    /// How capacity wake-ups are spread ([`spread`]).
    spread: spread::CapacitySpread,
}

impl GuardedStore {
    /// The API at `url`, with the token of `credentials`; its `PUT`s go through `writes` (a
    /// client of the same API and credentials), one attempt each.
    pub fn api(url: &str, credentials: Arc<Credentials>, writes: ApiClient) -> Self {
        let generation = credentials.generation();
        let store = Arc::new(ApiRunStore::new(url, credentials.token().expose()));
        Self {
            base: store.clone(),
            source: Source::Api(ApiSource {
                url: url.to_string(),
                credentials,
                writes,
                current: RwLock::new((generation, store)),
            }),
            views: Views::default(),
            spends: spend::Spends::default(),
            spread: NO_SPREAD,
        }
    }

    /// Any store, guarded the same way (the API's own store in tests).
    #[cfg(test)]
    pub fn over(inner: Arc<dyn Store>) -> Self {
        Self {
            base: inner.clone(),
            source: Source::Fixed(inner),
            views: Views::default(),
            spends: spend::Spends::default(),
            spread: NO_SPREAD,
        }
    }

    /// This store, spreading the wake times of runs put to sleep for provider capacity as
    /// `spread` says ([`spread`]); none by default.
    pub fn with_capacity_spread(mut self, spread: spread::CapacitySpread) -> Self {
        self.spread = spread;
        self
    }

    /// Answer the engine's reads of `run`, claimed by a request sent at `claim_sent`, from
    /// what this execution knows (see the module docs): the claim's copy for `valid_for` (the
    /// lease refresh interval) after `claim_sent`, then the latest live read's for as long
    /// after its request. Dropped with the returned guard, when the execution stops.
    /// Sub-workflow children are not viewed: their reads go to the API.
    pub fn prime(&self, run: &Run, claim_sent: Instant, valid_for: Duration) -> Primed<'_> {
        let primed = chain_root(run).is_none();
        if primed {
            self.views.insert(run, claim_sent, valid_for);
        }
        Primed {
            store: self,
            run_id: run.id,
            primed,
        }
    }

    /// Answer the engine's first step list of `run_id` (viewed) with `steps`, read by a
    /// request sent at `sent` while the run waited for a slot (see `store/view.rs`).
    pub fn keep_steps(&self, run_id: Uuid, steps: Vec<Step>, sent: Instant) {
        self.views.keep_steps(run_id, steps, sent);
    }

    /// What run `run_id`'s steps used and cost as this worker wrote their records since it began
    /// holding the run (`input_tokens`, `output_tokens`, `cost_usd` of [`Spend`]; the rest zero),
    /// and how many of its steps were created or started and not ended; forgotten once taken
    /// (at the end of the run's execution here).
    pub fn take_spend(&self, run_id: Uuid) -> (Spend, u32) {
        self.spends.take(run_id)
    }

    /// The ids of run `run_id`'s steps (its execution's, sub-workflow children's included)
    /// that this worker created or started and saw no end of, until [`GuardedStore::take_spend`].
    pub fn open_steps(&self, run_id: Uuid) -> Vec<Uuid> {
        self.spends.open(run_id)
    }

    /// Stop answering reads of `run_id` from its view (its status changed): the next read goes
    /// to the API.
    fn forget(&self, run_id: Uuid) {
        self.views.forget(run_id);
    }

    /// Runs viewed.
    #[cfg(test)]
    fn primed_count(&self) -> usize {
        self.views.len()
    }

    /// `get_run(id)` from the API; a viewed run's view takes the answer, fresh for one
    /// interval from the request's send time.
    async fn read_run(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        let (sent, epoch) = (Instant::now(), self.views.epoch(id));
        let run = self
            .read(
                "GET /runs/{id}",
                move |s| async move { s.get_run(id).await },
            )
            .await?;
        if let Some(run) = run.as_ref() {
            self.views.renew(run, sent, epoch);
        }
        Ok(run)
    }

    /// `update_run(id, update)`, guarded. A held run's copy is taken out of its view while the
    /// write is in flight (reads go to the API) and returned once the write landed, for the
    /// caller to put back or build the read-back from (see `store/view.rs`).
    async fn write_run(&self, id: Uuid, update: RunUpdate) -> Result<Option<Taken>, StoreError> {
        let update = bounded::run_update(self.spread.apply(id, update, Utc::now()));
        let taken = self.views.take(id);
        let target = update.status;
        let scheduled_at = update.scheduled_at;
        if let Some(status) = target {
            CallScope::current().writing_status(id, status);
        }
        let releases = matches!(update.lease, Some(LeaseUpdate::Release));
        if matches!(update.lease, Some(LeaseUpdate::Set { .. })) {
            CallScope::current().setting_lease(id);
        }
        // A claim of the run by this invocation after this point is a later one.
        let sent = CallScope::current().write_sent();
        let written = guard::write(
            "PUT /runs/{id}",
            self.credentials(),
            || self.put_run(id, update.clone()),
            || self.run_write_landed(id, target, releases, sent.as_ref()),
        )
        .await;
        if let Some(status) = target {
            Self::note_status_write("PUT /runs/{id}", id, (status, scheduled_at), &written);
        }
        written?;
        Ok(taken)
    }

    /// One attempt of `PUT /runs/{id}` ([`put`]: never re-sent by the HTTP client itself).
    async fn put_run(&self, id: Uuid, update: RunUpdate) -> Result<(), StoreError> {
        match &self.source {
            Source::Api(api) => put::put_once(&api.writes, &format!("/runs/{id}"), &update).await,
            #[cfg(test)]
            Source::Fixed(store) => store.update_run(id, update).await,
        }
    }

    /// One attempt of `PUT /runs/{id}/status`, with `ApiRunStore`'s body.
    async fn put_run_status(&self, id: Uuid, status: RunStatus) -> Result<(), StoreError> {
        match &self.source {
            Source::Api(api) => {
                let body = serde_json::json!({ "status": status });
                put::put_once(&api.writes, &format!("/runs/{id}/status"), &body).await
            }
            #[cfg(test)]
            Source::Fixed(store) => store.update_run_status(id, status).await,
        }
    }

    /// One attempt of `PUT /steps/{id}`.
    async fn put_step(&self, id: Uuid, update: StepUpdate) -> Result<(), StoreError> {
        match &self.source {
            Source::Api(api) => put::put_once(&api.writes, &format!("/steps/{id}"), &update).await,
            #[cfg(test)]
            Source::Fixed(store) => store.update_step(id, update).await,
        }
    }

    /// Write `update` to step `id` ([`guard::write`]: a lost answer read back before any
    /// resend).
    async fn write_step(&self, id: Uuid, update: &StepUpdate) -> Result<(), StoreError> {
        guard::write(
            "PUT /steps/{id}",
            self.credentials(),
            || self.put_step(id, update.clone()),
            || self.step_write_landed(id, update.status),
        )
        .await
    }

    /// A completion `update` of step `id` the API refused for its size (`why`): sent again
    /// without its trace, if it has one; if that is too large still (its output), the step's
    /// failure, its usage kept, instead ([`bounded::output_refused`]). What landed, and the
    /// refusal the engine gets when the completion did not.
    async fn too_large_completion(
        &self,
        id: Uuid,
        update: StepUpdate,
        why: String,
    ) -> Result<(StepUpdate, Option<StoreError>), StoreError> {
        let why = match bounded::without_trace(&update) {
            Some(lean) => match self.write_step(id, &lean).await {
                Ok(()) => return Ok((lean, None)),
                Err(StoreError::Database(again)) if bounded::too_large(&again) => again,
                Err(e) => return Err(e),
            },
            None => why,
        };
        let failed = bounded::output_refused(update, &why);
        self.write_step(id, &failed).await?;
        let refusal = StoreError::Database(failed.error.clone().unwrap_or(why));
        Ok((failed, Some(refusal)))
    }

    /// Tell the scope what became of a write of `status` to run `id` through `route`: landed
    /// ([`CallScope::wrote_due`]), or refused by the API ([`CallScope::refused_status`]); a
    /// fault, a lost lease or a withheld call tells it nothing.
    fn note_status_write(
        route: Route,
        id: Uuid,
        (status, scheduled_at): (RunStatus, Option<DateTime<Utc>>),
        written: &Result<(), StoreError>,
    ) {
        match written {
            Ok(()) => CallScope::current().wrote_due(id, status, scheduled_at),
            Err(e) if fault::is_refusal(route, e) => CallScope::current().refused_status(id),
            Err(_) => {}
        }
    }

    /// The store the next attempt goes to.
    fn inner(&self) -> Arc<dyn Store> {
        match &self.source {
            Source::Api(api) => api.store(),
            #[cfg(test)]
            Source::Fixed(store) => store.clone(),
        }
    }

    /// The store behind the guard, for calls whose failure is the point (the connection
    /// pool's probes, [`crate::pool`]).
    pub fn unguarded(&self) -> Arc<dyn Store> {
        self.inner()
    }

    fn credentials(&self) -> Option<&Credentials> {
        match &self.source {
            Source::Api(api) => Some(&api.credentials),
            #[cfg(test)]
            Source::Fixed(_) => None,
        }
    }

    fn read<'a, T, F, Fut>(
        &'a self,
        route: Route,
        call: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a
    where
        F: Fn(Arc<dyn Store>) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'a,
        T: Send + 'a,
    {
        guard::read(
            route,
            self.credentials(),
            guard::Retries::UNTIL_END,
            move || call(self.inner()),
        )
    }

    fn once<'a, T, F, Fut>(
        &'a self,
        route: Route,
        stop_on_fault: bool,
        call: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a
    where
        F: Fn(Arc<dyn Store>) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'a,
        T: Send + 'a,
    {
        guard::once(route, self.credentials(), stop_on_fault, move || {
            call(self.inner())
        })
    }
}

/// Drops a run's view when the execution stops (see [`GuardedStore::prime`]).
#[must_use = "the view is dropped with the guard"]
pub struct Primed<'a> {
    store: &'a GuardedStore,
    run_id: Uuid,
    primed: bool,
}

impl Drop for Primed<'_> {
    fn drop(&mut self) {
        if self.primed {
            self.store.views.remove(self.run_id);
        }
    }
}

impl RunStore for GuardedStore {
    fn get_run(&self, id: Uuid) -> StoreFuture<'_, Option<Run>> {
        match self.views.fresh(id) {
            Some(run) => Box::pin(std::future::ready(Ok(Some(run)))),
            None => Box::pin(self.read_run(id)),
        }
    }

    fn create_run(&self, req: NewRun) -> StoreFuture<'_, RunCreation> {
        Box::pin(self.once("POST /runs", true, move |s| {
            let req = req.clone();
            async move { s.create_run(req).await }
        }))
    }

    fn update_run_status(&self, id: Uuid, new_status: RunStatus) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.forget(id);
            CallScope::current().writing_status(id, new_status);
            let sent = CallScope::current().write_sent();
            let sent = sent.as_ref();
            let written = guard::write(
                "PUT /runs/{id}/status",
                self.credentials(),
                move || self.put_run_status(id, new_status),
                move || self.run_write_landed(id, Some(new_status), false, sent),
            )
            .await;
            let route = "PUT /runs/{id}/status";
            Self::note_status_write(route, id, (new_status, None), &written);
            written
        })
    }

    fn update_run(&self, id: Uuid, update: RunUpdate) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let progress = view::is_progress(&update).then(|| update.clone());
            let releases = matches!(update.lease, Some(LeaseUpdate::Release));
            let taken = self.write_run(id, update).await?;
            if releases {
                // A sub-workflow child's lease moved to its root (`CallScope::lease_moved`).
                CallScope::current().released_lease(id);
            }
            if let (Some(taken), Some(update)) = (taken, progress) {
                self.views.put_back(taken, &update);
            }
            Ok(())
        })
    }

    fn update_run_returning(&self, id: Uuid, update: RunUpdate) -> StoreFuture<'_, Run> {
        Box::pin(async move {
            let last = view::is_final(&update).then(|| update.clone());
            let taken = self.write_run(id, update).await?;
            // The engine's finalize: the run as the write left it, without a read-back.
            if let (Some(taken), Some(update)) = (taken, last)
                && let Some(run) = self.views.finished(taken, &update)
            {
                return Ok(run);
            }
            self.read_run(id).await?.ok_or(StoreError::RunNotFound(id))
        })
    }

    fn list_active_descendants(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Run>> {
        Box::pin(
            self.read("GET /runs/{id}/descendants", move |s| async move {
                s.list_active_descendants(run_id).await
            }),
        )
    }

    fn pick_next_pending(&self, lease: Option<LeaseRequest>) -> StoreFuture<'_, Option<Run>> {
        self.pick_next_pending_for(lease, None)
    }

    fn pick_next_pending_for(
        &self,
        lease: Option<LeaseRequest>,
        capabilities: Option<WorkerCapabilities>,
    ) -> StoreFuture<'_, Option<Run>> {
        Box::pin(guard::read(
            fault::CLAIM_ROUTE,
            self.credentials(),
            CLAIM_RETRIES,
            move || {
                let (s, lease, capabilities) = (self.inner(), lease.clone(), capabilities.clone());
                async move { s.pick_next_pending_for(lease, capabilities).await }
            },
        ))
    }

    fn renew_lease(&self, id: Uuid, lease: LeaseRequest) -> StoreFuture<'_, DateTime<Utc>> {
        Box::pin(self.read("POST /runs/{id}/lease", move |s| {
            let lease = lease.clone();
            async move { s.renew_lease(id, lease).await }
        }))
    }

    fn create_step(&self, step: NewStep) -> StoreFuture<'_, Step> {
        Box::pin(async move {
            // Not a step that would be cut at the cutoff: the run is handed back instead.
            CallScope::current().may_start(&step).await;
            let created = guard::write(
                "POST /steps",
                self.credentials(),
                || {
                    let (s, step) = (self.inner(), step.clone());
                    async move { s.create_step(step).await }
                },
                || self.step_created(&step),
            )
            .await?;
            let scope = CallScope::current();
            // A sub-workflow child's steps count for the run whose execution makes them.
            let run = scope.run_key().map_or(created.run_id, |k| k.run_id);
            self.spends.created(created.id, run);
            scope.saw_steps([created.id]);
            if let Some(fit) = scope.fit() {
                fit.created(&created);
            }
            // The engine starts the step on this answer: not on a lease about to end.
            scope.start_margin_left().await;
            Ok(created)
        })
    }

    fn update_step(&self, id: Uuid, update: StepUpdate) -> StoreFuture<'_, ()> {
        let scope = CallScope::current();
        let update = bounded::step_update(holder::mark_start(update, &scope));
        Box::pin(async move {
            let (landed, refusal) = match self.write_step(id, &update).await {
                Ok(()) => (update, None),
                Err(StoreError::Database(why))
                    if bounded::too_large(&why) && update.status == Some(StepStatus::Completed) =>
                {
                    // Rare, and a large future: boxed, off the common path's size.
                    Box::pin(self.too_large_completion(id, update, why)).await?
                }
                Err(e) => return Err(e),
            };
            if let Some(fit) = scope.fit() {
                fit.updated(id, &landed);
            }
            self.spends
                .landed(id, &landed, scope.run_key().map(|k| k.run_id));
            refusal.map_or(Ok(()), Err)
        })
    }

    fn list_steps(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Step>> {
        Box::pin(async move {
            let steps = match self.views.take_steps(run_id) {
                Some(steps) => steps,
                None => {
                    self.read("GET /runs/{id}", move |s| async move {
                        s.list_steps(run_id).await
                    })
                    .await?
                }
            };
            let scope = CallScope::current();
            scope.saw_steps(steps.iter().map(|s| s.id));
            if let Some(fit) = scope.fit() {
                fit.read_history(&steps);
            }
            Ok(steps)
        })
    }

    fn create_step_dependencies(&self, deps: Vec<NewStepDependency>) -> StoreFuture<'_, ()> {
        Box::pin(self.once("POST /step-dependencies", true, move |s| {
            let deps = deps.clone();
            async move { s.create_step_dependencies(deps).await }
        }))
    }

    forward! {
        fn find_run_by_idempotency_key(&self, key: &str) -> StoreFuture<'_, Option<Run>>;
        fn list_runs(&self, filter: RunFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<Run>>;
        fn count_blocked_runs_by_group(&self) -> StoreFuture<'_, Vec<ConcurrencyGroupBacklog>>;
        fn reap_expired_leases(&self, limit: u32) -> StoreFuture<'_, Vec<ReapedRun>>;
        fn claim_due_approval_deadlines(&self, limit: u32) -> StoreFuture<'_, Vec<Step>>;
        fn claim_due_sleeping_runs(&self, limit: u32) -> StoreFuture<'_, Vec<Run>>;
        fn pause_workflow(&self, workflow_name: &str, paused_by: Option<Uuid>) -> StoreFuture<'_, WorkflowPause>;
        fn resume_workflow(&self, workflow_name: &str) -> StoreFuture<'_, bool>;
        fn list_workflow_pauses(&self) -> StoreFuture<'_, Vec<WorkflowPause>>;
        fn get_step(&self, id: Uuid) -> StoreFuture<'_, Option<Step>>;
        fn record_step_approval(&self, step_id: Uuid, approval: StepApproval) -> StoreFuture<'_, Step>;
        fn get_stats(&self, filter: RunFilter) -> StoreFuture<'_, RunStats>;
        fn get_stats_history(&self, filter: StatsHistoryFilter) -> StoreFuture<'_, Vec<StatsHistoryBucket>>;
        fn list_steps_by_agent_role<'a>(&'a self, agent_role: &'a str, page: u32, per_page: u32) -> StoreFuture<'a, Page<Step>>;
        fn get_agent_role_stats(&self, created_after: DateTime<Utc>) -> StoreFuture<'_, Vec<AgentRoleStats>>;
        fn list_step_dependencies(&self, run_id: Uuid) -> StoreFuture<'_, Vec<StepDependency>>;
        fn list_purgeable_runs(&self, policy: &PurgePolicy, batch_size: u32) -> StoreFuture<'_, Vec<PurgeableRun>>;
        fn delete_run(&self, id: Uuid) -> StoreFuture<'_, Vec<String>>;
    }
}

impl SignalSender for GuardedStore {
    /// `ctx.send_signal` through the API (`POST /api/v1/internal/signals`), sent again only
    /// when it surely never left.
    fn send(&self, signal: NewSignal, origin: SignalOrigin) -> SignalSendFuture<'_> {
        Box::pin(async move {
            // Infallible outside the tests, whose stores are fixed ones.
            #[allow(clippy::infallible_destructuring_match)]
            let api = match &self.source {
                Source::Api(api) => api,
                #[cfg(test)]
                Source::Fixed(_) => {
                    return Err(EngineError::Store(StoreError::Database(
                        "signals are sent through the API; this store has none".into(),
                    )));
                }
            };
            let sent = guard::once("POST /signals", self.credentials(), true, || {
                let (s, signal, origin) = (api.store(), signal.clone(), origin);
                async move {
                    match s.send(signal, origin).await {
                        Err(EngineError::Store(e)) => Err(e),
                        other => Ok(other),
                    }
                }
            })
            .await;
            sent.map_err(EngineError::Store)?
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ironflow_core::provider::LABEL_ROOT_RUN_ID;
    use ironflow_store::memory::InMemoryStore;

    use self::scope::{RunKey, ScopeStop};
    use crate::deadline::LeaseClock;

    use super::*;

    /// A manual run of `primed` (the local runner's), with `trigger` and `labels`.
    fn new_run(trigger: TriggerKind, labels: HashMap<String, String>) -> NewRun {
        NewRun {
            trigger,
            labels,
            ..ironflow_local_api::new_run("primed", 0)
        }
    }

    /// A store over a real in-memory store, and a run claimed from it.
    async fn claimed(
        trigger: TriggerKind,
        labels: HashMap<String, String>,
    ) -> (GuardedStore, Arc<InMemoryStore>, Run) {
        let inner = Arc::new(InMemoryStore::new());
        inner.create_run(new_run(trigger, labels)).await.unwrap();
        let run = inner.pick_next_pending(None).await.unwrap().unwrap();
        (GuardedStore::over(inner.clone()), inner, run)
    }

    /// Changes the stored run behind the wrapper's back, as another writer would.
    async fn record_duration(inner: &InMemoryStore, id: Uuid, ms: u64) {
        let update = RunUpdate {
            duration_ms: Some(ms),
            ..RunUpdate::default()
        };
        inner.update_run(id, update).await.unwrap();
    }

    const INTERVAL: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn a_held_run_is_read_from_its_claim_for_one_interval_then_live() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let _viewed = store.prime(&run, Instant::now(), INTERVAL);
        record_duration(&inner, run.id, 1234).await;

        let first = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(first.duration_ms, 0, "the claimed copy, not the store");
        assert_eq!(first.status.state, RunStatus::Running);
        let again = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            again.duration_ms, 0,
            "still the claim's copy within the interval"
        );

        tokio::time::advance(INTERVAL).await;
        let live = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            live.duration_ms, 1234,
            "from the store once the interval has passed"
        );
        record_duration(&inner, run.id, 5678).await;
        let viewed = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            viewed.duration_ms, 1234,
            "the live read's copy, for another interval"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_of_the_run_or_a_pause_seen_by_the_refresher_sends_the_next_read_live() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let _viewed = store.prime(&run, Instant::now(), INTERVAL);
        let update = RunUpdate {
            duration_ms: Some(42),
            ..RunUpdate::default()
        };
        store.update_run(run.id, update).await.unwrap();
        record_duration(&inner, run.id, 7).await;
        let read = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            read.duration_ms, 42,
            "a progress write lands in the view, which answers the read"
        );

        let error = RunUpdate {
            error: Some("boom".to_string()),
            increment_retry: true,
            ..RunUpdate::default()
        };
        store.update_run(run.id, error).await.unwrap();
        let read = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (read.duration_ms, read.retry_count),
            (7, 1),
            "any other write sends the next read to the API"
        );

        inner
            .update_run_status(run.id, RunStatus::Paused)
            .await
            .unwrap();
        let viewed = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            viewed.status.state,
            RunStatus::Running,
            "not seen before the refresher"
        );
        store.forget(run.id);
        let live = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(live.status.state, RunStatus::Paused, "seen once forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn the_read_back_of_the_final_write_is_built_from_the_view() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let _viewed = store.prime(&run, Instant::now(), INTERVAL);
        // Changed behind the view's back: a live read-back would show it.
        record_duration(&inner, run.id, 1234).await;
        let completed_at = Utc::now();
        let update = RunUpdate {
            status: Some(RunStatus::Completed),
            output: Some(serde_json::json!({"ok": true})),
            completed_at: Some(completed_at),
            ..RunUpdate::default()
        };
        let done = store.update_run_returning(run.id, update).await.unwrap();
        assert_eq!(done.status.state, RunStatus::Completed);
        assert_eq!(done.completed_at, Some(completed_at));
        assert_eq!(done.output, Some(serde_json::json!({"ok": true})));
        assert_eq!(done.worker_id, None, "the lease goes with Running");
        assert_eq!(done.duration_ms, 0, "built from the view, not read back");
        let stored = inner.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            stored.status.state,
            RunStatus::Completed,
            "the write landed"
        );

        let other = RunUpdate {
            error: Some("noted".to_string()),
            ..RunUpdate::default()
        };
        let read = store.update_run_returning(run.id, other).await.unwrap();
        assert_eq!(
            read.duration_ms, 1234,
            "any other read-back goes to the API"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_starts_only_with_its_margin_of_lease_left() {
        let (store, _inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let key = RunKey {
            run_id: run.id,
            worker_id: run.worker_id.clone().unwrap_or_default(),
            claimed_recoveries: None,
            holding: None,
        };
        let clock = Arc::new(LeaseClock::new(Instant::now(), Duration::from_millis(500)));
        let scope = CallScope::execution(
            key.clone(),
            Instant::now() + Duration::from_secs(60),
            clock.clone(),
            Arc::default(),
        )
        .with_start_margin(Duration::from_secs(1));
        let step = NewStep {
            run_id: run.id,
            trace_id: Uuid::new_v4(),
            name: "s".to_string(),
            kind: StepKind::Shell,
            position: 0,
            input: None,
            is_error_handler: false,
        };
        let scope = Arc::new(scope);
        let create = scope.clone().run(store.create_step(step.clone()));
        tokio::pin!(create);
        let short = tokio::time::timeout(Duration::from_millis(200), &mut create).await;
        assert!(short.is_err(), "held back with 0.5 s of lease left");

        clock.confirm(Instant::now(), Duration::from_secs(3));
        let created = tokio::time::timeout(Duration::from_millis(100), create)
            .await
            .expect("started once a refresh confirmed the lease further")
            .unwrap();
        assert_eq!(created.run_id, run.id);
        assert!(scope.lost_time_to_api(), "held back: time lost to the API");

        // No refresh confirms it: the lease runs out, the scope stops, the step never starts.
        let clock = Arc::new(LeaseClock::new(Instant::now(), Duration::from_millis(300)));
        let scope = Arc::new(
            CallScope::execution(
                key,
                Instant::now() + Duration::from_secs(60),
                clock,
                Arc::default(),
            )
            .with_start_margin(Duration::from_secs(1)),
        );
        tokio::select! {
            _ = scope.clone().run(store.create_step(step)) => panic!("started on a lease that ran out"),
            why = scope.stopped() => assert!(matches!(why, ScopeStop::Fault(_)), "{why:?}"),
        }
    }

    #[tokio::test]
    async fn the_view_goes_with_its_guard() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        drop(store.prime(&run, Instant::now(), INTERVAL));
        assert_eq!(store.primed_count(), 0);
        record_duration(&inner, run.id, 7).await;
        let read = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(read.duration_ms, 7, "from the store");
    }

    #[tokio::test]
    async fn a_sub_workflow_child_is_not_primed() {
        let root = Uuid::new_v4().to_string();
        let labels = HashMap::from([(LABEL_ROOT_RUN_ID.to_string(), root)]);
        let (store, inner, run) = claimed(TriggerKind::Workflow, labels).await;
        let _primed = store.prime(&run, Instant::now(), INTERVAL);
        assert_eq!(store.primed_count(), 0);
        record_duration(&inner, run.id, 99).await;
        let read = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            read.duration_ms, 99,
            "from the store: its lease may have moved on"
        );
    }

    #[tokio::test]
    async fn other_runs_and_other_calls_go_to_the_store() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let other = inner
            .create_run(new_run(TriggerKind::Manual, HashMap::new()))
            .await
            .unwrap()
            .into_run();
        let _primed = store.prime(&run, Instant::now(), INTERVAL);
        let read = store.get_run(other.id).await.unwrap().unwrap();
        assert_eq!(read.id, other.id);
        assert_eq!(store.primed_count(), 1, "still kept for its own run");
        // A write through the wrapper lands in the store.
        let update = RunUpdate {
            duration_ms: Some(42),
            ..RunUpdate::default()
        };
        store.update_run(run.id, update).await.unwrap();
        let stored = inner.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(stored.duration_ms, 42);
    }
}
