//! The store traits the engine needs besides `RunStore`: forwarded to `ApiRunStore` as it
//! answers them (routes a worker does not have are answered locally), and guarded like every
//! other call where they reach the API (artifacts, logs, signals).

use chrono::{DateTime, Utc};
use ironflow_store::prelude::*;
use ironflow_store::store::StoreFuture;
use serde_json::Value;
use uuid::Uuid;

use super::GuardedStore;
use super::scope::CallScope;

impl ApiKeyStore for GuardedStore {
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

impl ApprovalDelegationStore for GuardedStore {
    forward! {
        fn create_delegation(&self, req: NewApprovalDelegation) -> StoreFuture<'_, ApprovalDelegation>;
        fn find_delegation_by_id(&self, id: Uuid) -> StoreFuture<'_, Option<ApprovalDelegation>>;
        fn list_active_delegations(&self, filter: DelegationFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<ApprovalDelegation>>;
        fn find_active_delegation(&self, from_user_id: Uuid, to_user_id: Uuid, workflow_name: &str) -> StoreFuture<'_, Option<ApprovalDelegation>>;
        fn delete_delegation(&self, id: Uuid) -> StoreFuture<'_, ()>;
    }
}

impl ArtifactStore for GuardedStore {
    fn list_artifacts_for_run(&self, run_id: Uuid) -> StoreFuture<'_, Vec<Artifact>> {
        Box::pin(self.read("GET /runs/{id}/artifacts", move |s| async move {
            s.list_artifacts_for_run(run_id).await
        }))
    }

    fn find_artifact_for_input(&self, lookup: ArtifactLookup) -> StoreFuture<'_, Option<Artifact>> {
        // ApiRunStore resolves it from the run's steps and artifacts (two reads).
        Box::pin(self.read("GET /runs/{id}", move |s| {
            let lookup = lookup.clone();
            async move { s.find_artifact_for_input(lookup).await }
        }))
    }

    forward! {
        fn create_artifact(&self, artifact: NewArtifact) -> StoreFuture<'_, Artifact>;
        fn get_artifact(&self, step_id: Uuid, name: &str) -> StoreFuture<'_, Option<Artifact>>;
        fn find_artifact_by_sha256(&self, sha256: &str) -> StoreFuture<'_, Option<Artifact>>;
        fn count_artifacts_by_storage_key(&self, storage_key: &str) -> StoreFuture<'_, u64>;
        fn list_all_storage_keys(&self) -> StoreFuture<'_, Vec<String>>;
    }
}

impl AuditLogStore for GuardedStore {
    forward! {
        fn append_audit_log(&self, entry: NewAuditLogEntry) -> StoreFuture<'_, AuditLogEntry>;
        fn list_audit_logs(&self, filter: AuditLogFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<AuditLogEntry>>;
    }
}

impl LogStore for GuardedStore {
    forward! {
        fn append_logs(&self, entries: NewLogEntries) -> StoreFuture<'_, ()>;
        fn get_logs(&self, run_id: Uuid, filter: LogFilter, cursor: Option<Uuid>, limit: u32) -> StoreFuture<'_, Vec<LogEntry>>;
    }
}

impl ProviderAccountStore for GuardedStore {
    fn record_provider_account_observation(
        &self,
        id: Uuid,
        observation: NewProviderAccountObservation,
    ) -> StoreFuture<'_, Vec<ProviderAccountWindow>> {
        // An observation only informs the account strategy: a lost one is tolerated.
        Box::pin(self.once(
            "POST /provider-accounts/{id}/observations",
            false,
            move |s| {
                let observation = observation.clone();
                async move { s.record_provider_account_observation(id, observation).await }
            },
        ))
    }

    fn list_provider_account_candidates(
        &self,
        kind: String,
    ) -> StoreFuture<'_, Vec<ProviderAccountCandidate>> {
        Box::pin(self.read("GET /provider-accounts/candidates", move |s| {
            let kind = kind.clone();
            async move { s.list_provider_account_candidates(kind).await }
        }))
    }

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
        fn purge_provider_account_usage(&self, before: DateTime<Utc>) -> StoreFuture<'_, u64>;
    }
}

impl ScheduleStore for GuardedStore {
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

impl SecretStore for GuardedStore {
    fn get_secret(&self, key: &str) -> StoreFuture<'_, Option<Secret>> {
        let key = key.to_string();
        Box::pin(self.read("GET /secrets/{key}", move |s| {
            let key = key.clone();
            async move { s.get_secret(&key).await }
        }))
    }

    forward! {
        fn set_secret(&self, key: &str, value: &str) -> StoreFuture<'_, Secret>;
        fn delete_secret(&self, key: &str) -> StoreFuture<'_, bool>;
        fn list_secret_keys(&self, prefix: &str) -> StoreFuture<'_, Vec<String>>;
        fn list_secrets(&self, prefix: &str, page: u32, per_page: u32) -> StoreFuture<'_, Page<SecretMetadata>>;
        fn secret_key_status(&self) -> StoreFuture<'_, KeyVersionStatus>;
        fn rotate_secrets(&self, request: RotationRequest) -> StoreFuture<'_, RotationBatch>;
    }
}

impl SignalStore for GuardedStore {
    fn list_signals_for_key(
        &self,
        name: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> StoreFuture<'_, Vec<Signal>> {
        let (name, key) = (name.to_string(), key.to_string());
        Box::pin(self.read("GET /signals", move |s| {
            let (name, key) = (name.clone(), key.clone());
            async move { s.list_signals_for_key(&name, &key, since).await }
        }))
    }

    fn resolve_signal_step(
        &self,
        step_id: Uuid,
        output: Value,
    ) -> StoreFuture<'_, SignalStepResolution> {
        Box::pin(
            self.once("POST /steps/{id}/signal-resolution", true, move |s| {
                let output = output.clone();
                async move { s.resolve_signal_step(step_id, output).await }
            }),
        )
    }

    fn suspend_run_on_signal(
        &self,
        run_id: Uuid,
        step_id: Uuid,
        deadline_at: DateTime<Utc>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let waiting = self
                .once("POST /runs/{id}/signal-suspension", true, move |s| async move {
                    s.suspend_run_on_signal(run_id, step_id, deadline_at).await
                })
                .await?;
            // Sleeping until the deadline (or a signal); not waiting: a signal came meanwhile,
            // the run is due at once.
            let due = if waiting { deadline_at } else { Utc::now() };
            CallScope::current().wrote_due(run_id, RunStatus::Sleeping, Some(due));
            Ok(waiting)
        })
    }

    forward! {
        fn insert_signal(&self, signal: NewSignal) -> StoreFuture<'_, SignalInsert>;
        fn list_signals(&self, filter: SignalFilter, page: u32, per_page: u32) -> StoreFuture<'_, Page<Signal>>;
        fn list_signal_waiters(&self, name: &str, key: &str) -> StoreFuture<'_, Vec<Step>>;
        fn purge_signals(&self, before: DateTime<Utc>) -> StoreFuture<'_, u64>;
    }
}

impl UserStore for GuardedStore {
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
