//! The worker built once per cold start, and how it is assembled from a builder's parts.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::Arc;
use std::time::Duration;

use ironflow_core::account_strategy::{AccountStrategy, LeastUtilized};
use ironflow_core::decision::DecisionProvider;
use ironflow_core::provider::AgentProvider;
use ironflow_engine::accounts::AccountAwareProvider;
use ironflow_engine::engine::Engine;
use ironflow_engine::handler::WorkflowHandler;
use ironflow_store::entities::{WorkerCapabilities, normalize_worker_tags};
use ironflow_store::store::Store;

use crate::admission::Admission;
use crate::agents::budget::WorkerBudget;
use crate::api::ApiClient;
use crate::api::artifacts::ApiArtifactSink;
use crate::api::logs::LogForwarder;
use crate::build_error::BuildError;
use crate::calls::Calls;
use crate::claim_ahead::RunPace;
use crate::credentials::Credentials;
use crate::poison::MemoryPoisonTable;
use crate::poison::seen::SeenCounters;
use crate::poison::{PoisonMode, PoisonTable};
use crate::pool::PoolWarden;
use crate::runtime::{self, ExecutionRuntime, StuckExecutions};
use crate::secrets::{TokenSecret, WebhookSecretSource};
use crate::settings::{Settings, WebhookSecret};
use crate::step_times::StepTimes;
use crate::store::GuardedStore;
use crate::store::fault::FaultLog;
use crate::store::spread::CapacitySpread;
use crate::wake::Waker;
use crate::wake::fleet::FleetMark;
use crate::webhook::replay_table::ReplayTable;
use crate::webhook::{Receiver, WorkerView};

/// The worker built once per cold start ([`LambdaWorkerBuilder::build`](crate::LambdaWorkerBuilder::build))
/// and shared by every invocation of the instance: the settings, the engine and the workflows,
/// the HTTP clients, the poison-pill table, the claim pace and the execution runtime.
///
/// It serves at most M invocations at once ([`Settings::concurrent_invocations`], 1 unless
/// Lambda Managed Instances set `AWS_LAMBDA_MAX_CONCURRENCY`; `src/admission.rs`). Each
/// invocation has its own worker id, budget, leases, handbacks, step-log inbox and summary;
/// what they share is safe to share: the engine and its HTTP clients (pooled connections), the
/// execution runtime (M × C + 1 threads), the step-log channel (each line routed to the
/// invocation that owns its run, `src/api/logs.rs`), the poison-pill table and the counters
/// read from it (each invocation sees the others' outcomes, `crate::poison::gate`), and the
/// claim pace (atomic moving averages, `src/claim_ahead.rs`).
pub struct LambdaWorker {
    /// The engine that executes runs, on [`LambdaWorker::runtime`].
    pub(crate) engine: Arc<Engine>,
    /// The engine's store, which takes each claimed run for the engine's first read of it.
    pub(crate) engine_store: Arc<GuardedStore>,
    /// Where the engine executes runs (`docs/faults.md#blocking-steps`).
    pub(crate) runtime: Arc<ExecutionRuntime>,
    /// The invocations' own store and recording engine (see [`crate::calls`]).
    pub(crate) calls_store: Arc<GuardedStore>,
    pub(crate) calls_engine: Arc<Engine>,
    /// Executions that did not stop when told to (workflow code blocking its thread).
    pub(crate) stuck: Arc<StuckExecutions>,
    pub(crate) capabilities: WorkerCapabilities,
    pub(crate) poison_table: Arc<dyn PoisonTable>,
    /// The poison-pill counters this process's invocations have read or written.
    pub(crate) poison_seen: Arc<SeenCounters>,
    pub(crate) pool: PoolWarden,
    pub(crate) pace: RunPace,
    /// How long steps took, as this process saw them ([`crate::step_times`]).
    pub(crate) step_times: Arc<StepTimes>,
    pub(crate) logs: Arc<LogForwarder>,
    pub(crate) api: ApiClient,
    pub(crate) wake: Option<Waker>,
    pub(crate) settings: Settings,
    /// The invocations in flight, at most M ([`crate::invocation::run`]).
    pub(crate) admission: Admission,
    /// Held by the webhook receiver's wake-up decision ([`crate::webhook`]).
    pub(crate) push_turn: tokio::sync::Mutex<()>,
    /// The receivers' wake-up mark shared by every environment (a DynamoDB poison-pill table).
    pub(crate) fleet: Option<FleetMark>,
    /// The webhook receiver's secrets and the events it took ([`crate::webhook`]).
    pub(crate) receiver: Receiver,
}

/// What a builder hands over once its settings are valid.
pub(crate) struct Parts {
    pub settings: Settings,
    pub provider: Arc<dyn AgentProvider>,
    pub decision_provider: Option<Arc<dyn DecisionProvider>>,
    pub account_strategy: Option<Arc<dyn AccountStrategy>>,
    pub handlers: Vec<Box<dyn WorkflowHandler>>,
    pub poison_table: Arc<dyn PoisonTable>,
    pub waker: Option<Waker>,
    pub fleet: Option<FleetMark>,
    pub token_secret: Option<TokenSecret>,
    pub webhook_source: Option<(WebhookSecretSource, Option<WebhookSecret>)>,
    pub replay_table: Option<ReplayTable>,
    pub idle_probe_after: Duration,
}

impl LambdaWorker {
    /// Assemble the worker: the stores and HTTP clients, the engine with every handler, the
    /// capabilities claims send, the execution runtime.
    pub(crate) fn assemble(parts: Parts) -> Result<Self, BuildError> {
        let s = parts.settings;
        let tags = normalize_worker_tags(s.tags.clone());
        let credentials = Arc::new(Credentials::new(s.worker_token.clone(), parts.token_secret));
        // Two stores, two HTTP clients: one for the engine, polled on the execution runtime,
        // one for the invocation's own calls, on the caller's (crate::runtime, crate::calls).
        let engine_writes = ApiClient::new(&s.api_url, credentials.clone())?;
        let engine_store = Arc::new(
            GuardedStore::api(&s.api_url, credentials.clone(), engine_writes).with_capacity_spread(
                CapacitySpread {
                    spread: s.capacity_spread,
                    max: s.capacity_spread_max,
                },
            ),
        );
        let store: Arc<dyn Store> = engine_store.clone();
        let strategy = parts
            .account_strategy
            .unwrap_or_else(|| Arc::new(LeastUtilized));
        let provider: Arc<dyn AgentProvider> = Arc::new(
            // The worker's capacity-wait budget reaches every provider, not only the accounts'.
            AccountAwareProvider::new(
                Arc::new(WorkerBudget::new(parts.provider, s.max_capacity_wait)),
                store.clone(),
            )
            .with_strategy(strategy)
            .with_max_capacity_wait(s.max_capacity_wait),
        );
        // `ctx.send_signal` goes through the API (`POST /api/v1/internal/signals`), which stores
        // the signal and wakes the waiting runs to Pending for a claim, as the reference worker
        // does. The engine's default would resume them in this process, outside any invocation.
        let mut engine =
            Engine::new(store, provider.clone()).with_signal_sender(engine_store.clone());
        if let Some(decision) = parts.decision_provider {
            engine = engine.with_decision_provider(decision);
        }
        for handler in parts.handlers {
            engine
                .register_boxed(handler)
                .map_err(BuildError::Register)?;
        }
        let capabilities =
            WorkerCapabilities::new(Some(registered_workflows(&engine)), tags.clone());
        engine.set_worker_tags(tags);

        // Step logs and artifacts travel through the API: the worker holds no storage
        // credential. Artifacts are uploaded by the engine (on the execution runtime), logs
        // pushed by the invocation: each with its own HTTP client.
        let api = ApiClient::new(&s.api_url, credentials.clone())?;
        let artifacts = ApiClient::new(&s.api_url, credentials.clone())?;
        let (log_sender, log_receiver) = ironflow_engine::log_sender::channel();
        engine.set_log_sender(log_sender.clone());
        engine.set_artifact_sink(Arc::new(ApiArtifactSink::new(artifacts)));
        // Every invocation in flight may execute C runs at once (validated: M × C ≤ 4096).
        let threads = runtime::threads_for(s.concurrent_invocations.saturating_mul(s.concurrency));
        let execution_runtime = ExecutionRuntime::new(threads)
            .map_err(|source| BuildError::Runtime { threads, source })?;
        let calls_writes = ApiClient::new(&s.api_url, credentials.clone())?;
        let calls_store = Arc::new(GuardedStore::api(&s.api_url, credentials, calls_writes));
        let calls_engine = Engine::new(calls_store.clone(), provider);

        Ok(Self {
            engine: Arc::new(engine),
            engine_store,
            runtime: Arc::new(execution_runtime),
            calls_store,
            calls_engine: Arc::new(calls_engine),
            stuck: Arc::default(),
            capabilities,
            poison_table: parts.poison_table,
            poison_seen: Arc::default(),
            pool: PoolWarden::new(parts.idle_probe_after),
            pace: RunPace::new(s.claim_ahead_percent),
            step_times: Arc::default(),
            logs: Arc::new(LogForwarder::new(api.clone(), log_sender, log_receiver)),
            api,
            wake: parts.waker,
            admission: Admission::new(s.concurrent_invocations),
            push_turn: tokio::sync::Mutex::new(()),
            fleet: parts.fleet,
            receiver: Receiver::new(
                s.webhook_secret.clone(),
                parts.webhook_source,
                parts.replay_table,
            ),
            settings: s,
        })
    }

    /// What each claim asks the API for: the registered workflows (sorted) and the normalised
    /// tags.
    pub fn capabilities(&self) -> &WorkerCapabilities {
        &self.capabilities
    }

    /// Whether a handler of `workflow` is registered (the claims' list, sorted).
    pub(crate) fn registered(&self, workflow: &str) -> bool {
        self.capabilities
            .workflows
            .as_ref()
            .is_some_and(|names| names.binary_search_by(|n| n.as_str().cmp(workflow)).is_ok())
    }

    /// The poison-pill mode invocations apply (`IRONFLOW_POISON_MODE`).
    pub fn poison_mode(&self) -> PoisonMode {
        self.settings.poison_mode
    }

    /// The settings this worker runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Executions still running in workflow code that blocks its thread, after their runs
    /// were handed back or abandoned (`docs/faults.md#blocking-steps`): a process with one must not go on
    /// to another invocation once the response is out, under on-demand Lambda.
    pub fn stuck_executions(&self) -> usize {
        self.stuck.count()
    }

    /// Invocations in flight in this worker now (at most
    /// [`Settings::concurrent_invocations`]).
    pub fn invocations_in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// What the webhook receiver reads of this worker, for one request.
    pub(crate) fn webhook(&self) -> WorkerView<'_> {
        WorkerView {
            receiver: &self.receiver,
            settings: &self.settings,
            capabilities: &self.capabilities,
            wake: self.wake.as_ref(),
            push_turn: &self.push_turn,
            poison_table: &self.poison_table,
            poison_seen: &self.poison_seen,
            fleet: self.fleet.as_ref(),
            api: &self.api,
        }
    }

    /// The invocation's own calls, counting their faults in `faults`.
    pub(crate) fn calls(&self, faults: Arc<FaultLog>) -> Calls {
        Calls {
            store: self.calls_store.clone(),
            engine: self.calls_engine.clone(),
            faults,
        }
    }
}

/// The default poison-pill table: in memory, per instance.
pub(crate) fn memory_table(settings: &Settings) -> Arc<dyn PoisonTable> {
    Arc::new(MemoryPoisonTable::new(settings.poison))
}

/// Sorted names of the registered workflows, sent with each claim (as one comma-separated
/// query parameter) so the API only hands out runs this worker can execute. The builder
/// refuses a name the API would split, trim or drop (`check_workflow_name`), so the list is
/// always sent.
fn registered_workflows(engine: &Engine) -> Vec<String> {
    let mut names: Vec<String> = engine
        .handler_names()
        .into_iter()
        .map(str::to_string)
        .collect();
    names.sort();
    names
}
