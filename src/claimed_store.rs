//! The engine's store: `ironflow-worker`'s [`ApiRunStore`](ironflow_worker::ApiRunStore), with
//! each claimed run handed to the engine's first read of it.
//!
//! `Engine::execute_handler_run(id)` starts with `get_run(id)`: through the API, one
//! `GET /api/v1/internal/runs/{id}` per run, sent right after the claim
//! (`GET /api/v1/internal/runs/next`) returned that same run, as the store holds it after the
//! claim. [`ClaimedRunStore::prime`] keeps the claimed run for that one read, which then costs
//! no request: a no-op run takes 5 requests instead of 6. Every other call, and every later read
//! of the run, goes to the API as before: an operator's pause is seen where the engine checks for
//! it (before each step and at the end of the run), a cancel by the lease refresher (the API
//! refuses to renew the lease of a run no longer Running).
//!
//! What the engine takes from that first read (the workflow's name and trigger, labels, the
//! handler version, retry count, carried cost and duration, cost limit and creation time; the
//! input is read live, later) does not change after the run's creation, or only under its lease,
//! which this invocation holds until it executes the run: the claimed copy is the stored one.
//! Runs whose first read uses their lease (sub-workflow children, which the engine resumes
//! through their root run, handing over the lease the read shows) are not primed: the lease
//! refresher may have renewed the lease since the claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use ironflow_engine::engine::chain_root;
use ironflow_store::prelude::*;
use ironflow_store::store::StoreFuture;
use serde_json::Value;
use uuid::Uuid;

/// Forwards each listed method to the wrapped store, unchanged.
macro_rules! forward {
    ($(fn $name:ident $(<$lt:lifetime>)? (&$($self_lt:lifetime)? self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(
            fn $name $(<$lt>)? (&$($self_lt)? self $(, $arg: $ty)*) -> $ret {
                self.inner.$name($($arg),*)
            }
        )*
    };
}

/// A [`Store`] that forwards every call to `inner` (the API), except the first
/// `get_run(id)` of a run [primed](ClaimedRunStore::prime) with its claimed copy.
pub struct ClaimedRunStore {
    inner: Arc<dyn Store>,
    primed: Mutex<HashMap<Uuid, Run>>,
}

impl ClaimedRunStore {
    /// Wrap `inner`, the store the engine would otherwise use (the worker's `ApiRunStore`).
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            primed: Mutex::new(HashMap::new()),
        }
    }

    /// Serve `run`, as its claim returned it, to the next `get_run(run.id)`, once. The copy is
    /// dropped with the returned guard if no read took it. Sub-workflow children are not
    /// primed (see the module's docs): their first read goes to the API.
    pub fn prime(&self, run: &Run) -> Primed<'_> {
        let primed = chain_root(run).is_none();
        if primed {
            self.entries().insert(run.id, run.clone());
        }
        Primed {
            store: self,
            run_id: run.id,
            primed,
        }
    }

    /// Runs primed and not yet read.
    #[cfg(all(test, feature = "local"))]
    fn primed_count(&self) -> usize {
        self.entries().len()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Run>> {
        // The map holds plain data: a panic while it was held leaves nothing half-written.
        self.primed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Drops a primed run's copy if no read took it (see [`ClaimedRunStore::prime`]).
#[must_use = "the copy is dropped with the guard"]
pub struct Primed<'a> {
    store: &'a ClaimedRunStore,
    run_id: Uuid,
    primed: bool,
}

impl Drop for Primed<'_> {
    fn drop(&mut self) {
        if self.primed {
            self.store.entries().remove(&self.run_id);
        }
    }
}

impl RunStore for ClaimedRunStore {
    fn get_run(&self, id: Uuid) -> StoreFuture<'_, Option<Run>> {
        let primed = self.entries().remove(&id);
        match primed {
            Some(run) => Box::pin(std::future::ready(Ok(Some(run)))),
            None => self.inner.get_run(id),
        }
    }

    forward! {
        fn create_run(&self, req: NewRun) -> StoreFuture<'_, RunCreation>;
        fn find_run_by_idempotency_key(&self, key: &str) -> StoreFuture<'_, Option<Run>>;
        fn list_runs(&self, filter: RunFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<Run>>;
        fn update_run_status(&self, id: Uuid, new_status: RunStatus) -> StoreFuture<'_, ()>;
        fn update_run(&self, id: Uuid, update: RunUpdate) -> StoreFuture<'_, ()>;
        fn list_active_descendants(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Run>>;
        fn pick_next_pending(&self, lease: Option<LeaseRequest>) -> StoreFuture<'_, Option<Run>>;
        fn pick_next_pending_for(&self, lease: Option<LeaseRequest>, capabilities: Option<WorkerCapabilities>) -> StoreFuture<'_, Option<Run>>;
        fn renew_lease(&self, id: Uuid, lease: LeaseRequest) -> StoreFuture<'_, DateTime<Utc>>;
        fn count_blocked_runs_by_group(&self) -> StoreFuture<'_, Vec<ConcurrencyGroupBacklog>>;
        fn reap_expired_leases(&self, limit: u32) -> StoreFuture<'_, Vec<ReapedRun>>;
        fn claim_due_approval_deadlines(&self, limit: u32) -> StoreFuture<'_, Vec<Step>>;
        fn claim_due_sleeping_runs(&self, limit: u32) -> StoreFuture<'_, Vec<Run>>;
        fn pause_workflow(&self, workflow_name: &str, paused_by: Option<Uuid>) -> StoreFuture<'_, WorkflowPause>;
        fn resume_workflow(&self, workflow_name: &str) -> StoreFuture<'_, bool>;
        fn list_workflow_pauses(&self) -> StoreFuture<'_, Vec<WorkflowPause>>;
        fn create_step(&self, step: NewStep) -> StoreFuture<'_, Step>;
        fn update_step(&self, id: Uuid, update: StepUpdate) -> StoreFuture<'_, ()>;
        fn get_step(&self, id: Uuid) -> StoreFuture<'_, Option<Step>>;
        fn list_steps(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Step>>;
        fn record_step_approval(&self, step_id: Uuid, approval: StepApproval) -> StoreFuture<'_, Step>;
        fn get_stats(&self, filter: RunFilter) -> StoreFuture<'_, RunStats>;
        fn get_stats_history(&self, filter: StatsHistoryFilter) -> StoreFuture<'_, Vec<StatsHistoryBucket>>;
        fn list_steps_by_agent_role<'a>(&'a self, agent_role: &'a str, page: u32, per_page: u32) -> StoreFuture<'a, Page<Step>>;
        fn get_agent_role_stats(&self, created_after: DateTime<Utc>) -> StoreFuture<'_, Vec<AgentRoleStats>>;
        fn create_step_dependencies(&self, deps: Vec<NewStepDependency>) -> StoreFuture<'_, ()>;
        fn list_step_dependencies(&self, run_id: Uuid) -> StoreFuture<'_, Vec<StepDependency>>;
        fn list_purgeable_runs(&self, policy: &PurgePolicy, batch_size: u32) -> StoreFuture<'_, Vec<PurgeableRun>>;
        fn delete_run(&self, id: Uuid) -> StoreFuture<'_, Vec<String>>;
        fn update_run_returning(&self, id: Uuid, update: RunUpdate) -> StoreFuture<'_, Run>;
    }
}

impl ApiKeyStore for ClaimedRunStore {
    forward! {
        fn create_api_key(&self, req: NewApiKey) -> StoreFuture<'_, ApiKey>;
        fn find_api_key_by_prefix(&self, prefix: &str) -> StoreFuture<'_, Option<ApiKey>>;
        fn find_api_key_by_id(&self, id: Uuid) -> StoreFuture<'_, Option<ApiKey>>;
        fn list_api_keys_by_user(&self, user_id: Uuid) -> StoreFuture<'_, Vec<ApiKey>>;
        fn update_api_key(&self, id: Uuid, update: ApiKeyUpdate) -> StoreFuture<'_, ()>;
        fn touch_api_key(&self, id: Uuid) -> StoreFuture<'_, ()>;
        fn delete_api_key(&self, id: Uuid) -> StoreFuture<'_, ()>;
    }
}

impl ApprovalDelegationStore for ClaimedRunStore {
    forward! {
        fn create_delegation(&self, req: NewApprovalDelegation) -> StoreFuture<'_, ApprovalDelegation>;
        fn find_delegation_by_id(&self, id: Uuid) -> StoreFuture<'_, Option<ApprovalDelegation>>;
        fn list_active_delegations(&self, filter: DelegationFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<ApprovalDelegation>>;
        fn find_active_delegation(&self, from_user_id: Uuid, to_user_id: Uuid, workflow_name: &str) -> StoreFuture<'_, Option<ApprovalDelegation>>;
        fn delete_delegation(&self, id: Uuid) -> StoreFuture<'_, ()>;
    }
}

impl ArtifactStore for ClaimedRunStore {
    forward! {
        fn create_artifact(&self, artifact: NewArtifact) -> StoreFuture<'_, Artifact>;
        fn get_artifact(&self, step_id: Uuid, name: &str) -> StoreFuture<'_, Option<Artifact>>;
        fn list_artifacts_for_run(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Artifact>>;
        fn find_artifact_for_input(&self, lookup: ArtifactLookup) -> StoreFuture<'_, Option<Artifact>>;
        fn find_artifact_by_sha256(&self, sha256: &str) -> StoreFuture<'_, Option<Artifact>>;
        fn count_artifacts_by_storage_key(&self, storage_key: &str) -> StoreFuture<'_, u64>;
        fn list_all_storage_keys(&self) -> StoreFuture<'_, Vec<String>>;
    }
}

impl AuditLogStore for ClaimedRunStore {
    forward! {
        fn append_audit_log(&self, entry: NewAuditLogEntry) -> StoreFuture<'_, AuditLogEntry>;
        fn list_audit_logs(&self, filter: AuditLogFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<AuditLogEntry>>;
    }
}

impl LogStore for ClaimedRunStore {
    forward! {
        fn append_logs(&self, entries: NewLogEntries) -> StoreFuture<'_, ()>;
        fn get_logs(&self, run_id: Uuid, filter: LogFilter, cursor: Option<Uuid>, limit: u32) -> StoreFuture<'_, Vec<LogEntry>>;
    }
}

impl ProviderAccountStore for ClaimedRunStore {
    forward! {
        fn create_provider_account(&self, req: NewProviderAccount) -> StoreFuture<'_, ProviderAccount>;
        fn get_provider_account(&self, id: Uuid) -> StoreFuture<'_, Option<ProviderAccount>>;
        fn list_provider_accounts_by_ids(&self, ids: Vec<Uuid>) -> StoreFuture<'_, Vec<ProviderAccount>>;
        fn find_provider_account_by_name(&self, name: &str) -> StoreFuture<'_, Option<ProviderAccount>>;
        fn list_provider_accounts(&self, kind: Option<String>, page: u32, per_page: u32) -> StoreFuture<'_, Page<ProviderAccount>>;
        fn update_provider_account(&self, id: Uuid, update: ProviderAccountUpdate) -> StoreFuture<'_, ProviderAccount>;
        fn delete_provider_account(&self, id: Uuid) -> StoreFuture<'_, bool>;
        fn list_provider_account_windows(&self, ids: Vec<Uuid>) -> StoreFuture<'_, Vec<ProviderAccountWindow>>;
        fn list_provider_account_usage(&self, id: Uuid, since: DateTime<Utc>) -> StoreFuture<'_, Vec<ProviderAccountUsagePoint>>;
        fn record_provider_account_observation(&self, id: Uuid, observation: NewProviderAccountObservation) -> StoreFuture<'_, Vec<ProviderAccountWindow>>;
        fn purge_provider_account_usage(&self, before: DateTime<Utc>) -> StoreFuture<'_, u64>;
        fn list_provider_account_candidates(&self, kind: String) -> StoreFuture<'_, Vec<ProviderAccountCandidate>>;
    }
}

impl ScheduleStore for ClaimedRunStore {
    forward! {
        fn create_schedule(&self, req: NewSchedule) -> StoreFuture<'_, Schedule>;
        fn find_schedule_by_id(&self, id: Uuid) -> StoreFuture<'_, Option<Schedule>>;
        fn list_schedules(&self, page: u32, per_page: u32) -> StoreFuture<'_, Page<Schedule>>;
        fn update_schedule(&self, id: Uuid, update: ScheduleUpdate) -> StoreFuture<'_, Schedule>;
        fn delete_schedule(&self, id: Uuid) -> StoreFuture<'_, ()>;
        fn list_due_schedules(&self) -> StoreFuture<'_, Vec<Schedule>>;
        fn fire_due_schedule(&self, id: Uuid, due: DateTime<Utc>, plan: ScheduleFiringPlan) -> StoreFuture<'_, Option<ScheduleFiring>>;
    }
}

impl SecretStore for ClaimedRunStore {
    forward! {
        fn get_secret(&self, key: &str) -> StoreFuture<'_, Option<Secret>>;
        fn set_secret(&self, key: &str, value: &str) -> StoreFuture<'_, Secret>;
        fn delete_secret(&self, key: &str) -> StoreFuture<'_, bool>;
        fn list_secret_keys(&self, prefix: &str) -> StoreFuture<'_, Vec<String>>;
        fn list_secrets(&self, prefix: &str, page: u32, per_page: u32) -> StoreFuture<'_, Page<SecretMetadata>>;
        fn secret_key_status(&self) -> StoreFuture<'_, KeyVersionStatus>;
        fn rotate_secrets(&self, request: RotationRequest) -> StoreFuture<'_, RotationBatch>;
    }
}

impl SignalStore for ClaimedRunStore {
    forward! {
        fn insert_signal(&self, signal: NewSignal) -> StoreFuture<'_, SignalInsert>;
        fn list_signals(&self, filter: SignalFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<Signal>>;
        fn list_signals_for_key(&self, name: &str, key: &str, since: DateTime<Utc>) -> StoreFuture<'_, Vec<Signal>>;
        fn list_signal_waiters(&self, name: &str, key: &str) -> StoreFuture<'_, Vec<Step>>;
        fn resolve_signal_step(&self, step_id: Uuid, output: Value) -> StoreFuture<'_, SignalStepResolution>;
        fn suspend_run_on_signal(&self, run_id: Uuid, step_id: Uuid, deadline_at: DateTime<Utc>) -> StoreFuture<'_, bool>;
        fn purge_signals(&self, before: DateTime<Utc>) -> StoreFuture<'_, u64>;
    }
}

impl UserStore for ClaimedRunStore {
    forward! {
        fn create_user(&self, req: NewUser) -> StoreFuture<'_, User>;
        fn find_user_by_email(&self, email: &str) -> StoreFuture<'_, Option<User>>;
        fn find_user_by_username(&self, username: &str) -> StoreFuture<'_, Option<User>>;
        fn find_user_by_id(&self, id: Uuid) -> StoreFuture<'_, Option<User>>;
        fn count_users(&self) -> StoreFuture<'_, u64>;
        fn list_users(&self, page: u32, per_page: u32) -> StoreFuture<'_, Page<User>>;
        fn delete_user(&self, id: Uuid) -> StoreFuture<'_, ()>;
        fn update_user_role(&self, id: Uuid, is_admin: bool) -> StoreFuture<'_, User>;
        fn update_user_password(&self, id: Uuid, password_hash: String) -> StoreFuture<'_, ()>;
        fn list_user_groups(&self, user_id: Uuid) -> StoreFuture<'_, Vec<String>>;
        fn set_user_groups(&self, user_id: Uuid, groups: Vec<String>) -> StoreFuture<'_, Vec<String>>;
        fn revoke_user_sessions(&self, id: Uuid) -> StoreFuture<'_, i64>;
        fn store_refresh_token(&self, token: NewRefreshToken) -> StoreFuture<'_, ()>;
        fn consume_refresh_token(&self, token_hash: &str) -> StoreFuture<'_, Option<Uuid>>;
    }
}

// The local runner's run template: the tests build with the default `local` feature.
#[cfg(all(test, feature = "local"))]
mod tests {
    use std::collections::HashMap;

    use ironflow_core::provider::LABEL_ROOT_RUN_ID;
    use ironflow_store::memory::InMemoryStore;

    use super::*;

    /// A manual run of `primed` (the local runner's), with `trigger` and `labels`.
    fn new_run(trigger: TriggerKind, labels: HashMap<String, String>) -> NewRun {
        NewRun {
            trigger,
            labels,
            ..crate::local::new_run("primed", 0)
        }
    }

    /// A store over a real in-memory store, and a run claimed from it.
    async fn claimed(
        trigger: TriggerKind,
        labels: HashMap<String, String>,
    ) -> (ClaimedRunStore, Arc<InMemoryStore>, Run) {
        let inner = Arc::new(InMemoryStore::new());
        inner.create_run(new_run(trigger, labels)).await.unwrap();
        let run = inner.pick_next_pending(None).await.unwrap().unwrap();
        (ClaimedRunStore::new(inner.clone()), inner, run)
    }

    /// Changes the stored run behind the wrapper's back, as another writer would.
    async fn record_duration(inner: &InMemoryStore, id: Uuid, ms: u64) {
        let update = RunUpdate {
            duration_ms: Some(ms),
            ..RunUpdate::default()
        };
        inner.update_run(id, update).await.unwrap();
    }

    #[tokio::test]
    async fn the_first_read_of_a_primed_run_is_its_claimed_copy_and_later_reads_are_live() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        let _primed = store.prime(&run);
        record_duration(&inner, run.id, 1234).await;

        let first = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(first.duration_ms, 0, "the claimed copy, not the store");
        assert_eq!(first.status.state, RunStatus::Running);
        assert_eq!(store.primed_count(), 0, "taken by the read");

        let second = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(second.duration_ms, 1234, "from the store");
    }

    #[tokio::test]
    async fn an_unread_copy_goes_with_its_guard() {
        let (store, inner, run) = claimed(TriggerKind::Manual, HashMap::new()).await;
        drop(store.prime(&run));
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
        let _primed = store.prime(&run);
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
        let _primed = store.prime(&run);
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
