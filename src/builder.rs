//! The public builder, mirroring `ironflow_worker::WorkerBuilder`, and the worker it builds.
//!
//! Build once per cold start: the HTTP client, the engine and the settings are reused by every
//! warm invocation of the same Lambda instance.

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use ironflow_core::account_strategy::{AccountStrategy, LeastUtilized};
use ironflow_core::decision::DecisionProvider;
use ironflow_core::provider::AgentProvider;
use ironflow_engine::accounts::AccountAwareProvider;
use ironflow_engine::engine::Engine;
use ironflow_engine::error::EngineError;
use ironflow_engine::handler::WorkflowHandler;
use ironflow_store::entities::{
    WorkerCapabilities, WorkerTagError, normalize_worker_tags, validate_worker_tags,
};
use ironflow_store::store::Store;
use tracing::warn;

use crate::api::artifacts::ApiArtifactSink;
use crate::api::logs::LogForwarder;
use crate::api::{ApiClient, ClientError};
use crate::calls::Calls;
use crate::claim_ahead::RunPace;
use crate::config::{self, ConfigError, Settings, WorkerToken};
use crate::credentials::Credentials;
use crate::poison::dynamodb::{DynamoPoisonTable, DynamoSetupError};
use crate::poison::memory::MemoryPoisonTable;
use crate::poison::{PoisonMode, PoisonTable};
use crate::pool::{DEFAULT_IDLE_PROBE_AFTER, PoolWarden};
use crate::runtime::{self, ExecutionRuntime, StuckExecutions};
use crate::secrets::{self, SecretError, TokenSecret};
use crate::store::GuardedStore;
use crate::store::fault::FaultLog;
use crate::wake::Waker;

/// `build()` refused the configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No agent provider was set (`provider(...)`), as the reference worker requires.
    #[error("LambdaWorkerBuilder: a provider is required (call .provider(...))")]
    MissingProvider,
    /// A worker tag is malformed, or there are too many.
    #[error("invalid worker tag: {0}")]
    InvalidTag(#[from] WorkerTagError),
    /// The engine refused a handler (e.g. two handlers with one name).
    #[error("could not register workflow handler: {0}")]
    Register(#[source] EngineError),
    /// A setting that cannot work.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The builder method (and environment variable) concerned.
        setting: &'static str,
        /// Why it cannot work, with the values involved.
        reason: String,
    },
    /// The HTTP client for the API could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// An environment variable is missing or malformed (from [`LambdaWorkerBuilder::from_env`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The DynamoDB poison-pill table (`IRONFLOW_POISON_TABLE`) cannot be used: it does not
    /// exist, has the wrong key schema, or cannot be described.
    #[error(transparent)]
    PoisonTable(#[from] DynamoSetupError),
    /// `IRONFLOW_POISON_TABLE` is set but `build()` was called without
    /// [`LambdaWorkerBuilder::connect_poison_table`] (or [`LambdaWorkerBuilder::poison_table`]).
    #[error(
        "IRONFLOW_POISON_TABLE is set to {table} but the table was not connected: call \
         .connect_poison_table().await before .build()"
    )]
    PoisonTableNotConnected {
        /// The configured table name.
        table: String,
    },
    /// The worker token could not be read from Secrets Manager (from
    /// [`LambdaWorkerBuilder::from_env_and_secrets`]).
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The runtime the engine executes runs on could not be started (no thread could be
    /// spawned).
    #[error("could not start the execution runtime ({threads} threads): {source}")]
    Runtime {
        /// The worker threads asked for (the concurrency plus one).
        threads: usize,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Builder for a [`LambdaWorker`].
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ironflow_core::providers::claude::ClaudeCodeProvider;
/// use ironflow_lambda::builder::LambdaWorkerBuilder;
///
/// # fn example() -> Result<(), ironflow_lambda::builder::BuildError> {
/// let worker = LambdaWorkerBuilder::new("https://ironflow.example.com", "worker-token")
///     .provider(Arc::new(ClaudeCodeProvider::new()))
///     .max_runs_per_invocation(4)
///     .concurrency(2)
///     .deadline_margin(Duration::from_secs(10))
///     .build()?;
/// # Ok(())
/// # }
/// ```
pub struct LambdaWorkerBuilder {
    settings: Settings,
    provider: Option<Arc<dyn AgentProvider>>,
    decision_provider: Option<Arc<dyn DecisionProvider>>,
    account_strategy: Option<Arc<dyn AccountStrategy>>,
    handlers: Vec<Box<dyn WorkflowHandler>>,
    poison_table: Option<Arc<dyn PoisonTable>>,
    aws: Option<SdkConfig>,
    idle_probe_after: Duration,
    waker: Option<Waker>,
    /// The secret the token came from, to re-read it when the API refuses the token.
    token_secret: Option<TokenSecret>,
}

impl LambdaWorkerBuilder {
    /// A builder for the API at `api_url` with the worker token, every other setting at its
    /// default (see [`crate::config`]).
    pub fn new(api_url: &str, worker_token: &str) -> Self {
        Self::from_settings(Settings::new(api_url, WorkerToken::new(worker_token)))
    }

    /// A builder from the environment variables listed in [`crate::config`].
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] naming the missing or malformed variable.
    pub fn from_env() -> Result<Self, BuildError> {
        Ok(Self::from_settings(Settings::from_env()?))
    }

    /// A builder from the environment, as [`LambdaWorkerBuilder::from_env`], with the worker
    /// token read once from Secrets Manager when `IRONFLOW_WORKER_TOKEN` is unset and
    /// `IRONFLOW_WORKER_TOKEN_SECRET_ARN` is set (see [`crate::secrets`]). `aws` is the AWS
    /// configuration loaded at cold start (`aws_config::load_defaults`), kept for
    /// [`LambdaWorkerBuilder::connect_poison_table`]. This is what the deployed function calls.
    ///
    /// # Errors
    ///
    /// [`BuildError::Secret`] naming the variable and the secret's ARN when the secret cannot
    /// be read, [`BuildError::Config`] naming a missing or malformed variable.
    pub async fn from_env_and_secrets(aws: &SdkConfig) -> Result<Self, BuildError> {
        Self::from_lookup_and_secrets(|name| std::env::var(name).ok(), aws).await
    }

    /// [`LambdaWorkerBuilder::from_env_and_secrets`] with variables from any lookup (a map in
    /// tests).
    ///
    /// # Errors
    ///
    /// As [`LambdaWorkerBuilder::from_env_and_secrets`].
    pub async fn from_lookup_and_secrets(
        lookup: impl Fn(&str) -> Option<String>,
        aws: &SdkConfig,
    ) -> Result<Self, BuildError> {
        let (token, secret) = match secrets::worker_token_from_lookup(&lookup, aws).await? {
            Some((token, secret)) => (Some(token), Some(secret)),
            None => (None, None),
        };
        let mut builder = Self::from_settings(Settings::from_lookup_with_token(lookup, token)?)
            .aws_config(aws.clone());
        builder.token_secret = secret;
        Ok(builder)
    }

    /// A builder from already-loaded settings.
    pub fn from_settings(settings: Settings) -> Self {
        Self {
            settings,
            provider: None,
            decision_provider: None,
            account_strategy: None,
            handlers: Vec::new(),
            poison_table: None,
            aws: None,
            idle_probe_after: DEFAULT_IDLE_PROBE_AFTER,
            waker: None,
            token_secret: None,
        }
    }

    /// Set the agent provider for AI operations. Required.
    pub fn provider(mut self, provider: Arc<dyn AgentProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Set the [`DecisionProvider`] for `ctx.decision(...)` steps. Optional.
    pub fn decision_provider(mut self, provider: Arc<dyn DecisionProvider>) -> Self {
        self.decision_provider = Some(provider);
        self
    }

    /// Set the strategy picking a provider account per agent step. Defaults to
    /// [`LeastUtilized`].
    pub fn account_strategy(mut self, strategy: Arc<dyn AccountStrategy>) -> Self {
        self.account_strategy = Some(strategy);
        self
    }

    /// How long an agent step may wait for provider-account capacity. Defaults to 6 hours,
    /// in practice bounded by the run timeout and the invocation cutoff.
    pub fn max_capacity_wait(mut self, wait: Duration) -> Self {
        self.settings.max_capacity_wait = wait;
        self
    }

    /// Register a workflow handler.
    pub fn register(mut self, handler: impl WorkflowHandler + 'static) -> Self {
        self.handlers.push(Box::new(handler));
        self
    }

    /// Accept a plain `http://` API URL to a host that is not loopback (an API inside the VPC):
    /// the worker token then crosses the network in clear text (`IRONFLOW_ALLOW_INSECURE_HTTP`).
    /// Default `false`: such a URL is refused at build time. `https://` URLs and `http://` to a
    /// loopback host need nothing.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.settings.allow_insecure_http = allow;
        self
    }

    /// Runs executing at once. Default 2; must be at least 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.settings.concurrency = n;
        self
    }

    /// Runs one invocation claims at most (N). Default 8; must be at least 1.
    pub fn max_runs_per_invocation(mut self, n: usize) -> Self {
        self.settings.max_runs_per_invocation = n;
        self
    }

    /// A run attempt's time limit, counted from its first start across invocations.
    /// Default 30 minutes.
    pub fn run_timeout(mut self, timeout: Duration) -> Self {
        self.settings.run_timeout = timeout;
        self
    }

    /// Time kept free before the invocation deadline, to hand runs back and answer. Default
    /// 10 s; at least 500 ms and below the function timeout. The handback's writes are retried
    /// within it when the API fails, so a larger margin rides out a longer API blip.
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.settings.deadline_margin = margin;
        self
    }

    /// No run is claimed once less than this is left before the cutoff. Default 2 s; at least
    /// 100 ms.
    pub fn min_claim_budget(mut self, budget: Duration) -> Self {
        self.settings.min_claim_budget = budget;
        self
    }

    /// Claim one run ahead of a free slot while, on this instance, a claim's round trip is at
    /// least `percent` % of a run's execution time (see [`crate::claim_ahead`]). Default 20;
    /// 0 claims as the reference worker: one claim at a time, each into a free slot (no claim
    /// ahead, no first claims sent together).
    pub fn claim_ahead_percent(mut self, percent: u32) -> Self {
        self.settings.claim_ahead_percent = percent;
        self
    }

    /// The function's configured timeout (the template's `Timeout`). Default 900 s.
    pub fn function_timeout(mut self, timeout: Duration) -> Self {
        self.settings.function_timeout = timeout;
        self
    }

    /// Lease TTL requested on claim and refresh. Default 90 s; 1 to 3600 s, the range the API
    /// accepts. Once a lease expires, the API's reaper takes the run back: it requeues it, or
    /// fails it once its lease expired more times than the run's `max_retries`.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl;
        self
    }

    /// Lease refresh interval. Default 30 s; above zero and below the lease TTL (keep the TTL
    /// at least twice the interval: what is left of it is the time failed refreshes are retried
    /// in, see [`crate::lease`]).
    pub fn lease_refresh_interval(mut self, interval: Duration) -> Self {
        self.settings.lease_refresh_interval = interval;
        self
    }

    /// Add worker tags. Each tag is 1 to 64 bytes of ASCII letters, digits and `- _ . : / =`,
    /// at most 32 tags; surrounding whitespace and duplicates are dropped.
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Prefix of the worker id. Each invocation claims under its own id,
    /// `<prefix>-<request id>-<8 hex>`, so a lease tells which invocation holds it.
    /// Default `lambda`.
    pub fn worker_id_prefix(mut self, prefix: &str) -> Self {
        self.settings.worker_id_prefix = prefix.to_string();
        self
    }

    /// Consecutive failures that block a workflow (poison pill). Default 3; at least 1.
    pub fn poison_threshold(mut self, n: u32) -> Self {
        self.settings.poison.threshold = n;
        self
    }

    /// How long a blocked workflow stays blocked after its last failure. Default 5 minutes.
    pub fn poison_cooldown(mut self, cooldown: Duration) -> Self {
        self.settings.poison.cooldown = cooldown;
        self
    }

    /// The poison-pill table. Default: an in-memory table (per Lambda instance), or the
    /// DynamoDB table named by `IRONFLOW_POISON_TABLE` once
    /// [`LambdaWorkerBuilder::connect_poison_table`] has connected it.
    pub fn poison_table(mut self, table: Arc<dyn PoisonTable>) -> Self {
        self.poison_table = Some(table);
        self
    }

    /// What happens to the runs of a blocked workflow (`IRONFLOW_POISON_MODE`): `Fail`
    /// (default) fails a claimed run; `Defer` leaves blocked workflows out of the claim so
    /// their runs stay Pending until the cooldown ends. Defer needs the registered workflow
    /// list on claims: with a comma in a workflow name it falls back to `Fail` (with a
    /// warning at build time).
    pub fn poison_mode(mut self, mode: PoisonMode) -> Self {
        self.settings.poison_mode = mode;
        self
    }

    /// The AWS configuration (region, credentials, endpoint) the DynamoDB poison-pill table is
    /// connected with, so that a cold start loads it once. Default: none, and
    /// [`LambdaWorkerBuilder::connect_poison_table`] loads it from the environment;
    /// [`LambdaWorkerBuilder::from_env_and_secrets`] sets the one it is given.
    pub fn aws_config(mut self, aws: SdkConfig) -> Self {
        self.aws = Some(aws);
        self
    }

    /// Connect the DynamoDB poison-pill table named by `IRONFLOW_POISON_TABLE`
    /// ([`Settings::poison_table`]) under `IRONFLOW_POISON_NAMESPACE`, with the AWS
    /// configuration set by [`LambdaWorkerBuilder::aws_config`] (else the one from the
    /// environment), and check that it exists (`DescribeTable`). Does
    /// nothing when no table is configured or one was set with
    /// [`LambdaWorkerBuilder::poison_table`]. Call it once per cold start, after the poison
    /// threshold and cooldown are final (the table applies the cooldown).
    ///
    /// # Errors
    ///
    /// [`BuildError::PoisonTable`] naming the table when it does not exist, has another key
    /// schema, or cannot be described.
    pub async fn connect_poison_table(mut self) -> Result<Self, BuildError> {
        if self.poison_table.is_some() {
            return Ok(self);
        }
        if let Some(name) = self.settings.poison_table.clone() {
            let (namespace, policy) = (&self.settings.poison_namespace, self.settings.poison);
            let table = match &self.aws {
                Some(aws) => {
                    let config = aws_sdk_dynamodb::config::Builder::from(aws).build();
                    DynamoPoisonTable::connect_with(config, &name, namespace, policy).await?
                }
                None => DynamoPoisonTable::connect(&name, namespace, policy).await?,
            };
            self.poison_table = Some(Arc::new(table));
        }
        Ok(self)
    }

    /// Dead man's switch URL pinged with `HEAD` once per invocation that completed its batch.
    /// Default none.
    pub fn heartbeat_url(mut self, url: &str) -> Self {
        self.settings.heartbeat_url = Some(url.to_string());
        self
    }

    /// Invocation length used when `Context.deadline` has already passed, as under an emulator
    /// (`cargo lambda watch` sends a deadline in 1970). Default: none, a past deadline claims
    /// nothing. Lambda always sends a future deadline, so this never applies there.
    pub fn emulated_invocation(mut self, length: Duration) -> Self {
        self.settings.emulated_invocation = Some(length);
        self
    }

    /// Send wake-ups to an SQS queue after a batch that handed runs back or left a backlog
    /// (see [`crate::wake`]; from the environment: [`Waker::from_env`]). Default: none.
    pub fn wake_ups(mut self, waker: Waker) -> Self {
        self.waker = Some(waker);
        self
    }

    /// Handbacks in a row without a completed step before a run is failed. Default 3.
    pub fn max_handbacks_without_progress(mut self, n: u32) -> Self {
        self.settings.max_handbacks_without_progress = n;
        self
    }

    /// Idle gap after which an invocation first probes the HTTP connection pool for
    /// connections dropped during the freeze (see [`crate::pool`]). Default 10 s.
    pub fn idle_probe_after(mut self, gap: Duration) -> Self {
        self.idle_probe_after = gap;
        self
    }

    /// Build the worker: the API store, the engine with every handler, the capabilities.
    ///
    /// # Errors
    ///
    /// [`BuildError::MissingProvider`] without a provider, [`BuildError::InvalidTag`] for a
    /// malformed tag, [`BuildError::Register`] when the engine refuses a handler, and
    /// [`BuildError::InvalidSetting`] when N or the concurrency is zero, the refresh interval
    /// is not below the lease TTL, or the margin is not below the function timeout.
    pub fn build(self) -> Result<LambdaWorker, BuildError> {
        let s = self.settings;
        let provider = self.provider.ok_or(BuildError::MissingProvider)?;
        validate_worker_tags(&s.tags)?;
        check_settings(&s)?;
        let tags = normalize_worker_tags(s.tags.clone());

        let credentials = Arc::new(Credentials::new(s.worker_token.clone(), self.token_secret));
        // Two stores, two HTTP clients: one for the engine, polled on the execution runtime,
        // one for the invocation's own calls, on the caller's (crate::runtime, crate::calls).
        let engine_store = Arc::new(GuardedStore::api(&s.api_url, credentials.clone()));
        let store: Arc<dyn Store> = engine_store.clone();
        let strategy = self
            .account_strategy
            .unwrap_or_else(|| Arc::new(LeastUtilized));
        let provider: Arc<dyn AgentProvider> = Arc::new(
            AccountAwareProvider::new(provider, store.clone())
                .with_strategy(strategy)
                .with_max_capacity_wait(s.max_capacity_wait),
        );
        // `ctx.send_signal` goes through the API (`POST /api/v1/internal/signals`), which stores
        // the signal and wakes the waiting runs to Pending for a claim, as the reference worker
        // does. The engine's default would resume them in this process, outside any invocation.
        let mut engine =
            Engine::new(store, provider.clone()).with_signal_sender(engine_store.clone());
        if let Some(decision) = self.decision_provider {
            engine = engine.with_decision_provider(decision);
        }
        for handler in self.handlers {
            engine
                .register_boxed(handler)
                .map_err(BuildError::Register)?;
        }
        let capabilities = WorkerCapabilities::new(registered_workflows(&engine), tags.clone());
        engine.set_worker_tags(tags);

        // Step logs and artifacts travel through the API: the worker holds no storage credential.
        // Artifacts are uploaded by the engine (on the execution runtime), logs pushed by the
        // invocation: each with its own HTTP client.
        let api = ApiClient::new(&s.api_url, credentials.clone())?;
        let artifacts = ApiClient::new(&s.api_url, credentials.clone())?;
        let (log_sender, log_receiver) = ironflow_engine::log_sender::channel();
        engine.set_log_sender(log_sender);
        engine.set_artifact_sink(Arc::new(ApiArtifactSink::new(artifacts)));
        let threads = runtime::threads_for(s.concurrency);
        let execution_runtime = ExecutionRuntime::new(threads)
            .map_err(|source| BuildError::Runtime { threads, source })?;
        let calls_store = Arc::new(GuardedStore::api(&s.api_url, credentials.clone()));
        let calls_engine = Engine::new(calls_store.clone(), provider);

        let poison_table = match (self.poison_table, &s.poison_table) {
            (Some(table), _) => table,
            (None, Some(name)) => {
                return Err(BuildError::PoisonTableNotConnected {
                    table: name.clone(),
                });
            }
            (None, None) => Arc::new(MemoryPoisonTable::new(s.poison)),
        };
        let poison_mode = if s.poison_mode == PoisonMode::Defer && capabilities.workflows.is_none()
        {
            warn!(
                "IRONFLOW_POISON_MODE=defer needs the registered workflow list on claims, and a \
                 workflow name contains a comma: falling back to fail mode"
            );
            PoisonMode::Fail
        } else {
            s.poison_mode
        };

        Ok(LambdaWorker {
            engine: Arc::new(engine),
            engine_store,
            runtime: Arc::new(execution_runtime),
            calls_store,
            calls_engine: Arc::new(calls_engine),
            stuck: Arc::default(),
            capabilities,
            poison_table,
            poison_mode,
            pool: PoolWarden::new(self.idle_probe_after),
            pace: RunPace::new(s.claim_ahead_percent),
            logs: Arc::new(LogForwarder::new(api.clone(), log_receiver)),
            api,
            wake: self.waker,
            settings: s,
            one_at_a_time: tokio::sync::Mutex::new(()),
        })
    }
}

fn check_settings(s: &Settings) -> Result<(), BuildError> {
    let invalid = |setting, reason: String| Err(BuildError::InvalidSetting { setting, reason });
    if let Some(expected) = config::api_url_problem(&s.api_url, s.allow_insecure_http) {
        return invalid("api_url (IRONFLOW_API_URL)", format!("expected {expected}"));
    }
    // Every duration must be one a deadline can be computed from.
    let durations = [
        ("run_timeout (IRONFLOW_RUN_TIMEOUT_SECS)", s.run_timeout),
        (
            "deadline_margin (IRONFLOW_DEADLINE_MARGIN_MS)",
            s.deadline_margin,
        ),
        (
            "min_claim_budget (IRONFLOW_MIN_CLAIM_BUDGET_MS)",
            s.min_claim_budget,
        ),
        (
            "function_timeout (IRONFLOW_FUNCTION_TIMEOUT_SECS)",
            s.function_timeout,
        ),
        (
            "lease_refresh_interval (IRONFLOW_LEASE_REFRESH_INTERVAL_SECS)",
            s.lease_refresh_interval,
        ),
        (
            "poison_cooldown (IRONFLOW_POISON_COOLDOWN_SECS)",
            s.poison.cooldown,
        ),
        (
            "max_capacity_wait (IRONFLOW_MAX_CAPACITY_WAIT_SECS)",
            s.max_capacity_wait,
        ),
        (
            "emulated_invocation (IRONFLOW_EMULATED_INVOCATION_SECS)",
            s.emulated_invocation.unwrap_or_default(),
        ),
    ];
    if let Some((setting, d)) = durations.iter().find(|(_, d)| *d > config::MAX_DURATION) {
        return invalid(
            setting,
            format!(
                "{} s is too large: at most {} s (100 years)",
                d.as_secs(),
                config::MAX_DURATION.as_secs()
            ),
        );
    }
    if s.max_runs_per_invocation == 0 {
        return invalid(
            "max_runs_per_invocation (IRONFLOW_MAX_RUNS_PER_INVOCATION)",
            "must be at least 1".into(),
        );
    }
    if s.concurrency == 0 {
        return invalid(
            "concurrency (IRONFLOW_CONCURRENCY)",
            "must be at least 1".into(),
        );
    }
    if !config::LEASE_TTL_RANGE.contains(&s.lease_ttl) {
        return invalid(
            "lease_ttl (IRONFLOW_LEASE_TTL_SECS)",
            format!(
                "{:?} is outside 1 to 3600 s, the lease TTLs the API accepts",
                s.lease_ttl
            ),
        );
    }
    if s.lease_refresh_interval.is_zero() || s.lease_refresh_interval >= s.lease_ttl {
        return invalid(
            "lease_refresh_interval (IRONFLOW_LEASE_REFRESH_INTERVAL_SECS)",
            format!(
                "{:?} is not above zero and below the lease TTL {:?}: the lease would expire \
                 between refreshes",
                s.lease_refresh_interval, s.lease_ttl
            ),
        );
    }
    if s.deadline_margin < config::MIN_DEADLINE_MARGIN {
        return invalid(
            "deadline_margin (IRONFLOW_DEADLINE_MARGIN_MS)",
            format!(
                "{:?} is below {:?}: the handback and the response need that much before the \
                 deadline",
                s.deadline_margin,
                config::MIN_DEADLINE_MARGIN
            ),
        );
    }
    if s.deadline_margin >= s.function_timeout {
        return invalid(
            "deadline_margin (IRONFLOW_DEADLINE_MARGIN_MS)",
            format!(
                "{:?} is not below the function timeout {:?}: no invocation would have time to run",
                s.deadline_margin, s.function_timeout
            ),
        );
    }
    if let Some(length) = s.emulated_invocation
        && length <= s.deadline_margin
    {
        return invalid(
            "emulated_invocation (IRONFLOW_EMULATED_INVOCATION_SECS)",
            format!(
                "{length:?} is not above the deadline margin {:?}: no emulated invocation would have time to run",
                s.deadline_margin
            ),
        );
    }
    if s.min_claim_budget < config::MIN_CLAIM_BUDGET {
        return invalid(
            "min_claim_budget (IRONFLOW_MIN_CLAIM_BUDGET_MS)",
            format!(
                "{:?} is below {:?}: a claim needs time to be answered before the cutoff",
                s.min_claim_budget,
                config::MIN_CLAIM_BUDGET
            ),
        );
    }
    if s.min_claim_budget
        .checked_add(s.deadline_margin)
        .is_none_or(|both| both >= s.function_timeout)
    {
        return invalid(
            "min_claim_budget (IRONFLOW_MIN_CLAIM_BUDGET_MS)",
            format!(
                "{:?} plus the margin {:?} is not below the function timeout {:?}: no run would \
                 ever be claimed",
                s.min_claim_budget, s.deadline_margin, s.function_timeout
            ),
        );
    }
    if s.poison.threshold == 0 {
        return invalid(
            "poison_threshold (IRONFLOW_POISON_THRESHOLD)",
            "must be at least 1".into(),
        );
    }
    if s.max_handbacks_without_progress == 0 {
        return invalid(
            "max_handbacks_without_progress (IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS)",
            "must be at least 1".into(),
        );
    }
    if s.run_timeout.is_zero() {
        return invalid(
            "run_timeout (IRONFLOW_RUN_TIMEOUT_SECS)",
            "must be above zero".into(),
        );
    }
    Ok(())
}

/// Sorted names of the registered workflows, sent with each claim so the API only hands out
/// runs this worker can execute. The names travel as one comma-separated query parameter: if
/// a name contains a comma, `None` (any workflow) is sent and tags alone route the runs.
fn registered_workflows(engine: &Engine) -> Option<Vec<String>> {
    let mut names: Vec<String> = engine
        .handler_names()
        .into_iter()
        .map(str::to_string)
        .collect();
    if let Some(name) = names.iter().find(|n| n.contains(',')) {
        warn!(workflow = %name, "workflow name contains a comma: claims will not filter by workflow");
        return None;
    }
    names.sort();
    Some(names)
}

/// The worker built once per cold start and shared by every invocation of the instance.
///
/// It runs one invocation at a time, as Lambda sends an execution environment one event at a
/// time: a second call of [`crate::handler::handle`] on the same worker waits until the first
/// returns (its deadline running meanwhile): the step-log channel, the claim pace and the
/// pooled connections it shares across invocations serve one at a time.
pub struct LambdaWorker {
    /// The engine that executes runs, on [`LambdaWorker::runtime`].
    pub(crate) engine: Arc<Engine>,
    /// The engine's store, which takes each claimed run for the engine's first read of it.
    pub(crate) engine_store: Arc<GuardedStore>,
    /// Where the engine executes runs (see [`crate::runtime`]).
    pub(crate) runtime: Arc<ExecutionRuntime>,
    /// The invocations' own store and recording engine (see [`crate::calls`]).
    pub(crate) calls_store: Arc<GuardedStore>,
    pub(crate) calls_engine: Arc<Engine>,
    /// Executions that did not stop when told to (workflow code blocking its thread).
    pub(crate) stuck: Arc<StuckExecutions>,
    pub(crate) capabilities: WorkerCapabilities,
    pub(crate) poison_table: Arc<dyn PoisonTable>,
    pub(crate) poison_mode: PoisonMode,
    pub(crate) pool: PoolWarden,
    pub(crate) pace: RunPace,
    pub(crate) logs: Arc<LogForwarder>,
    pub(crate) api: ApiClient,
    pub(crate) wake: Option<Waker>,
    pub(crate) settings: Settings,
    /// Held by the invocation under way ([`crate::invocation::run`]).
    pub(crate) one_at_a_time: tokio::sync::Mutex<()>,
}

impl LambdaWorker {
    /// What each claim asks the API for: the registered workflows (sorted, or `None` when a
    /// name contains a comma) and the normalised tags.
    pub fn capabilities(&self) -> &WorkerCapabilities {
        &self.capabilities
    }

    /// The poison-pill mode invocations apply: the configured one, except `Defer` falls back
    /// to `Fail` when claims cannot filter by workflow (a comma in a workflow name).
    pub fn poison_mode(&self) -> PoisonMode {
        self.poison_mode
    }

    /// The settings this worker runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The engine (and through it the API store).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Executions still running in workflow code that blocks its thread, after their runs
    /// were handed back or abandoned (see [`crate::runtime`]): a process with one must not go on
    /// to another invocation once the response is out, under on-demand Lambda.
    pub fn stuck_executions(&self) -> usize {
        self.stuck.count()
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

#[cfg(test)]
mod tests {
    use ironflow_core::providers::claude::ClaudeCodeProvider;
    use ironflow_engine::context::WorkflowContext;
    use ironflow_engine::handler::HandlerFuture;

    use super::*;

    struct Named(&'static str);
    impl WorkflowHandler for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn execute<'a>(&'a self, _ctx: &'a mut WorkflowContext) -> HandlerFuture<'a> {
            Box::pin(async { Ok(()) })
        }
    }

    fn builder() -> LambdaWorkerBuilder {
        LambdaWorkerBuilder::new("http://127.0.0.1:1", "token")
            .provider(Arc::new(ClaudeCodeProvider::new()))
    }

    #[test]
    fn missing_provider_is_refused() {
        let err = LambdaWorkerBuilder::new("http://x", "t")
            .build()
            .err()
            .unwrap();
        assert!(matches!(err, BuildError::MissingProvider));
    }

    #[test]
    fn tags_are_validated_and_normalised() {
        assert!(matches!(
            builder().tags(["bad tag"]).build().err().unwrap(),
            BuildError::InvalidTag(_)
        ));
        let w = builder()
            .tags(["region:eu", " gpu ", "gpu"])
            .build()
            .unwrap();
        assert_eq!(
            w.capabilities().tags,
            vec!["gpu".to_string(), "region:eu".to_string()]
        );
    }

    #[test]
    fn comma_in_a_workflow_name_disables_the_workflow_filter() {
        let w = builder()
            .register(Named("a"))
            .register(Named("b,c"))
            .build()
            .unwrap();
        assert_eq!(w.capabilities().workflows, None);
        let w = builder()
            .register(Named("b"))
            .register(Named("a"))
            .build()
            .unwrap();
        assert_eq!(
            w.capabilities().workflows,
            Some(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn defer_mode_falls_back_to_fail_without_a_workflow_list() {
        let w = builder()
            .register(Named("a,b"))
            .poison_mode(PoisonMode::Defer)
            .build()
            .unwrap();
        assert_eq!(w.poison_mode(), PoisonMode::Fail);
        let w = builder()
            .register(Named("a"))
            .poison_mode(PoisonMode::Defer)
            .build()
            .unwrap();
        assert_eq!(w.poison_mode(), PoisonMode::Defer);
    }

    #[test]
    fn a_configured_table_must_be_connected() {
        let mut settings = Settings::new("http://127.0.0.1:1", WorkerToken::new("t"));
        settings.poison_table = Some("ironflow-poison".into());
        let err = LambdaWorkerBuilder::from_settings(settings)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .build()
            .err()
            .unwrap();
        assert!(err.to_string().contains("ironflow-poison"), "{err}");
        assert!(err.to_string().contains("connect_poison_table"), "{err}");
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let cases = [
            (
                builder().max_runs_per_invocation(0),
                "max_runs_per_invocation",
            ),
            (builder().concurrency(0), "concurrency"),
            (
                builder()
                    .lease_ttl(Duration::from_secs(10))
                    .lease_refresh_interval(Duration::from_secs(10)),
                "lease_refresh_interval",
            ),
            (
                builder()
                    .function_timeout(Duration::from_secs(10))
                    .deadline_margin(Duration::from_secs(10)),
                "deadline_margin",
            ),
            // Settings that would overflow an instant, or that the API or a handback cannot
            // work with.
            (builder().run_timeout(Duration::MAX), "run_timeout"),
            (
                builder().run_timeout(Duration::from_secs(u64::MAX)),
                "run_timeout",
            ),
            (builder().poison_cooldown(Duration::MAX), "poison_cooldown"),
            (
                builder().max_capacity_wait(Duration::MAX),
                "max_capacity_wait",
            ),
            (
                builder().emulated_invocation(Duration::MAX),
                "emulated_invocation",
            ),
            (
                builder().deadline_margin(Duration::from_secs(u64::MAX)),
                "deadline_margin",
            ),
            (
                builder().min_claim_budget(Duration::from_secs(u64::MAX)),
                "min_claim_budget",
            ),
            (builder().lease_ttl(Duration::from_secs(3601)), "lease_ttl"),
            (builder().lease_ttl(Duration::ZERO), "lease_ttl"),
            (builder().deadline_margin(Duration::ZERO), "deadline_margin"),
            (
                builder().min_claim_budget(Duration::ZERO),
                "min_claim_budget",
            ),
            (
                builder().lease_refresh_interval(Duration::ZERO),
                "lease_refresh_interval",
            ),
        ];
        for (b, named) in cases {
            let err = b.build().err().expect("refused");
            assert!(
                matches!(&err, BuildError::InvalidSetting { setting, .. } if setting.starts_with(named)),
                "{named}: {err}"
            );
        }
    }

    #[test]
    fn plain_http_to_a_remote_host_needs_the_opt_in() {
        let remote = || {
            LambdaWorkerBuilder::new("http://api.internal.example:8080", "token")
                .provider(Arc::new(ClaudeCodeProvider::new()))
        };
        let err = remote().build().err().expect("refused");
        let text = err.to_string();
        assert!(text.contains("IRONFLOW_API_URL"), "{text}");
        assert!(text.contains("IRONFLOW_ALLOW_INSECURE_HTTP"), "{text}");
        assert!(remote().allow_insecure_http(true).build().is_ok());
        for url in [
            "https://api.example.com",
            "http://127.0.0.1:1",
            "http://localhost:3000",
            "http://[::1]:3000",
        ] {
            let built = LambdaWorkerBuilder::new(url, "token")
                .provider(Arc::new(ClaudeCodeProvider::new()))
                .build();
            assert!(built.is_ok(), "{url}");
        }
    }
}
