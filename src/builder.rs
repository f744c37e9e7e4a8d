//! The public builder, mirroring `ironflow_worker::WorkerBuilder`: every setting has a method,
//! and an environment variable read by [`LambdaWorkerBuilder::from_env`] (the table of them is
//! [`crate::settings::VARIABLES`]).
//!
//! Build once per cold start: the HTTP clients, the engine and the settings are reused by every
//! warm invocation of the same Lambda instance.

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use ironflow_core::account_strategy::AccountStrategy;
use ironflow_core::decision::DecisionProvider;
use ironflow_core::provider::AgentProvider;
use ironflow_engine::handler::WorkflowHandler;
use ironflow_store::entities::validate_worker_tags;

use crate::agents::AnthropicSecretProvider;
use crate::build_error::BuildError;
use crate::poison::DynamoPoisonTable;
use crate::poison::{PoisonMode, PoisonTable};
use crate::pool::DEFAULT_IDLE_PROBE_AFTER;
use crate::secrets::{self, ApiKey, ApiKeySecret, TokenSecret, WebhookSecretSource};
use crate::settings::{Settings, WebhookSecret, WorkerToken};
use crate::wake::Waker;
use crate::wake::fleet::FleetMark;
use crate::webhook::replay_table::ReplayTable;
use crate::worker::{self, LambdaWorker, Parts};

/// Builder for a [`LambdaWorker`]. Each setter names the environment variable of the same
/// setting and its default; [`LambdaWorkerBuilder::build`] checks the settings together
/// ([`Settings::validate`]).
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ironflow_lambda::{BedrockProvider, LambdaWorkerBuilder};
///
/// # fn example() -> Result<(), ironflow_lambda::BuildError> {
/// let worker = LambdaWorkerBuilder::new("https://ironflow.example.com", "worker-token")
///     .provider(Arc::new(BedrockProvider::from_env()))
///     .register(ironflow_lambda::samples::QuickShell)
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
    /// The webhook receivers' shared wake-up mark, in the DynamoDB poison-pill table.
    fleet: Option<FleetMark>,
    /// The mark's window, when not `FLEET_WINDOW` (tests).
    fleet_window: Option<Duration>,
    /// The secret the token came from, to re-read it when the API refuses the token.
    token_secret: Option<TokenSecret>,
    /// The secret the webhook secret came from, and its previous version read at cold start.
    webhook_source: Option<(WebhookSecretSource, Option<WebhookSecret>)>,
    /// The fleet-wide record of the webhook bodies taken, in the DynamoDB poison-pill table.
    replay_table: Option<ReplayTable>,
    /// The Anthropic API key read at cold start, and its secret.
    anthropic: Option<(ApiKey, ApiKeySecret)>,
}

impl LambdaWorkerBuilder {
    /// A builder for the API at `api_url` (`https://`, or `http://` to a loopback host) with its
    /// worker token, every other setting at its default. Variable `IRONFLOW_API_URL`; default
    /// required. Variable `IRONFLOW_WORKER_TOKEN`; default required, or its `_SECRET_ARN`.
    pub fn new(api_url: &str, worker_token: &str) -> Self {
        Self::from_settings(Settings::new(api_url, WorkerToken::new(worker_token)))
    }

    /// A builder from the environment variables (the README's configuration table).
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] naming every variable that is missing, malformed or cannot work.
    pub fn from_env() -> Result<Self, BuildError> {
        Ok(Self::from_settings(Settings::from_env()?))
    }

    /// A builder from the environment, as [`LambdaWorkerBuilder::from_env`], with the worker token
    /// read from Secrets Manager when `IRONFLOW_WORKER_TOKEN` is unset and
    /// `IRONFLOW_WORKER_TOKEN_SECRET_ARN` is set (once at cold start, and again when the API
    /// refuses the token: it was rotated), and the webhook secret likewise. `aws` is the AWS
    /// configuration loaded at cold start (`aws_config::load_defaults`), kept for the poison-pill
    /// table and the wake-ups. This is what [`crate::run`] calls. Variable
    /// `IRONFLOW_WORKER_TOKEN_SECRET_ARN`; default none. Variable `IRONFLOW_WEBHOOK_SECRET_ARN`;
    /// default none. The Anthropic API key likewise, for
    /// [`anthropic_provider`](Self::anthropic_provider). Variable
    /// `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`; default none.
    ///
    /// # Errors
    ///
    /// [`BuildError::Secret`] naming the variable and the secret's ARN when the secret cannot
    /// be read, [`BuildError::Config`] naming the variables that are wrong.
    pub async fn from_env_and_secrets(aws: &SdkConfig) -> Result<Self, BuildError> {
        Self::from_lookup_and_secrets(crate::settings::environment()?, aws).await
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
        // Every variable's own problems first, all in one error, before any secret is read: a
        // secret that cannot be read does not hide the other variables' problems. The token read
        // from its secret stands in as a placeholder here (short: never registered for redaction).
        let reads_secret = |variable| crate::settings::is_set(&lookup, variable);
        let token_from_secret = reads_secret(crate::settings::WORKER_TOKEN_SECRET_ARN_VAR);
        if token_from_secret
            || reads_secret(crate::settings::WEBHOOK_SECRET_ARN_VAR)
            || reads_secret(crate::settings::ANTHROPIC_API_KEY_SECRET_ARN_VAR)
        {
            let placeholder = token_from_secret.then(|| WorkerToken::new("unread"));
            Settings::from_lookup_with_token(&lookup, placeholder)?;
        }
        let (token, secret) = match secrets::worker_token_from_lookup(&lookup, aws).await? {
            Some((token, secret)) => (Some(token), Some(secret)),
            None => (None, None),
        };
        let webhook = secrets::webhook_secret_from_lookup(&lookup, aws).await?;
        let anthropic = secrets::anthropic_key_from_lookup(&lookup, aws).await?;
        let mut settings = Settings::from_lookup_with_token(lookup, token)?;
        let webhook_source = webhook.map(|(versions, source)| {
            settings.webhook_secret = Some(versions.current);
            (source, versions.previous)
        });
        let mut builder = Self::from_settings(settings).aws_config(aws.clone());
        builder.token_secret = secret;
        builder.webhook_source = webhook_source;
        builder.anthropic = anthropic;
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
            fleet: None,
            fleet_window: None,
            aws: None,
            idle_probe_after: DEFAULT_IDLE_PROBE_AFTER,
            waker: None,
            token_secret: None,
            webhook_source: None,
            replay_table: None,
            anthropic: None,
        }
    }

    /// Set the agent provider for AI operations. Required, as for the reference worker.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use ironflow_lambda::BedrockProvider;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.provider(Arc::new(BedrockProvider::from_env()));
    /// ```
    pub fn provider(mut self, provider: Arc<dyn AgentProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The Anthropic Messages API provider with the key read at cold start from the secret
    /// `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN` names ([`LambdaWorkerBuilder::from_env_and_secrets`]),
    /// which reads the secret again when the API refuses the key; `None` when the variable is
    /// unset. Register it with [`provider`](Self::provider).
    pub fn anthropic_provider(&self) -> Option<AnthropicSecretProvider> {
        self.anthropic
            .as_ref()
            .map(|(key, secret)| AnthropicSecretProvider::from_key(key.clone(), secret.clone()))
    }

    /// Set the [`DecisionProvider`] for `ctx.decision(...)` steps. Optional: without it, a
    /// decision step fails with `EngineError::NoDecisionProvider`.
    pub fn decision_provider(mut self, provider: Arc<dyn DecisionProvider>) -> Self {
        self.decision_provider = Some(provider);
        self
    }

    /// Set the strategy picking a provider account per agent step. Default `LeastUtilized`.
    pub fn account_strategy(mut self, strategy: Arc<dyn AccountStrategy>) -> Self {
        self.account_strategy = Some(strategy);
        self
    }

    /// Register a workflow handler. Claims ask only for the workflows registered here.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder
    ///     .register(ironflow_lambda::samples::QuickShell)
    ///     .register(ironflow_lambda::samples::MultiStep { step_secs: 5.0 });
    /// ```
    pub fn register(mut self, handler: impl WorkflowHandler + 'static) -> Self {
        self.handlers.push(Box::new(handler));
        self
    }

    /// Accept a plain `http://` URL (the API's, the heartbeat's) to a host that is not loopback (an
    /// API inside the VPC): the worker token then crosses the network in clear text. Off, such a
    /// URL is refused at build time; `https://` URLs and `http://` to a loopback host need nothing.
    /// Variable `IRONFLOW_ALLOW_INSECURE_HTTP`; default `false`.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.settings.allow_insecure_http = allow;
        self
    }

    /// Runs executing at once in one invocation, C. The execution runtime has M × C + 1 threads (M:
    /// [`concurrent_invocations`](Self::concurrent_invocations)). Variable `IRONFLOW_CONCURRENCY`;
    /// default 2; ≥ 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.settings.concurrency = n;
        self
    }

    /// Invocations one process serves at once, M (Lambda Managed Instances set the variable from
    /// the function's `PerExecutionEnvironmentMaxConcurrency`). At 1, one invocation at a time, as
    /// on-demand Lambda sends them; a second call of [`crate::handle`] waits for the first to
    /// return. Above 1, that many invocations run at once, each with its own C runs, lease,
    /// handbacks, step logs and summary; the execution runtime has M × C + 1 threads; M × C is at
    /// most 4096. Variable `AWS_LAMBDA_MAX_CONCURRENCY`; default 1; ≥ 1.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// // 4 invocations at once, each executing at most 2 runs: at most 8 runs in the process.
    /// let builder = builder.concurrent_invocations(4).concurrency(2);
    /// ```
    pub fn concurrent_invocations(mut self, m: usize) -> Self {
        self.settings.concurrent_invocations = m;
        self
    }

    /// Turn the webhook receiver on with its secret (or the Secrets Manager secret
    /// `IRONFLOW_WEBHOOK_SECRET_ARN` names): the key of the API's `X-Signature-256` HMAC, or the
    /// `token` query parameter of the URL the API posts to (docs/push.md); at least 32 visible
    /// ASCII characters. Off, a Function URL event is answered 503. Needs a wake queue
    /// ([`wake_ups`](Self::wake_ups) or `IRONFLOW_WAKE_QUEUE_URL`). A secret set here is never
    /// re-read: it replaces one read from `IRONFLOW_WEBHOOK_SECRET_ARN` (whose current and
    /// previous versions are accepted, and re-read after a rotation). Variable
    /// `IRONFLOW_WEBHOOK_SECRET`; default none: receiver off.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.webhook_secret("a-long-random-secret-of-32-chars-or-more");
    /// ```
    pub fn webhook_secret(mut self, secret: &str) -> Self {
        self.settings.webhook_secret = Some(WebhookSecret::new(secret));
        self.webhook_source = None;
        self
    }

    /// How far an event's `at` may be from now, either way, for the webhook receiver to take
    /// it, in whole seconds: an event outside it is refused
    /// (401), and an event taken is not taken again within it (docs/push.md, "Replays").
    /// Variable `IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS` (seconds); default 300; 1 s to 3600 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.webhook_replay_window(Duration::from_secs(120));
    /// ```
    pub fn webhook_replay_window(mut self, window: Duration) -> Self {
        self.settings.webhook_replay_window = window;
        self
    }

    /// What the function serves (`IRONFLOW_FUNCTION_ROLE`):
    /// [`FunctionRole::Worker`](crate::settings::FunctionRole::Worker) (the default) runs batches, and
    /// answers Function URL requests too when a webhook secret is set;
    /// [`FunctionRole::WebhookReceiver`](crate::settings::FunctionRole::WebhookReceiver) answers Function
    /// URL requests only and refuses every other event with an error naming the role
    /// (docs/push.md, "Denial of service"). Variable `IRONFLOW_FUNCTION_ROLE`; default `worker`.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.function_role(ironflow_lambda::FunctionRole::WebhookReceiver);
    /// ```
    pub fn function_role(mut self, role: crate::settings::FunctionRole) -> Self {
        self.settings.function_role = role;
        self
    }

    /// Runs one invocation claims at most, N. A larger N makes invocation boundaries rarer, and
    /// lets more runs meet the cutoff and be handed back. Variable
    /// `IRONFLOW_MAX_RUNS_PER_INVOCATION`; default 8; ≥ 1.
    pub fn max_runs_per_invocation(mut self, n: usize) -> Self {
        self.settings.max_runs_per_invocation = n;
        self
    }

    /// A run attempt's limit on executed time, summed across the invocations that ran it: time
    /// it slept or waited for a signal, an approval or a human input does not count (read from
    /// the attempt's steps at each claim; what counts is defined in `docs/design.md`); more than
    /// zero. Variable `IRONFLOW_RUN_TIMEOUT_SECS` (seconds); default 1800.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.run_timeout(Duration::from_secs(2 * 3600));
    /// ```
    pub fn run_timeout(mut self, timeout: Duration) -> Self {
        self.settings.run_timeout = timeout;
        self
    }

    /// Time kept free before the invocation deadline to hand runs back and answer: the cutoff is
    /// `deadline − margin`; below the function timeout. The handback's writes are retried within it
    /// when the API fails, so a larger margin rides out a longer API blip. Variable
    /// `IRONFLOW_DEADLINE_MARGIN_MS` (milliseconds); default 10000; ≥ 500 ms.
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.settings.deadline_margin = margin;
        self
    }

    /// No run is claimed once less than this is left before the cutoff. Variable
    /// `IRONFLOW_MIN_CLAIM_BUDGET_MS` (milliseconds); default 2000; ≥ 100 ms.
    pub fn min_claim_budget(mut self, budget: Duration) -> Self {
        self.settings.min_claim_budget = budget;
        self
    }

    /// Claim one run ahead of a free slot while, on this instance, a claim's round trip is at least
    /// `percent` % of a run's execution time; 0 claims as the reference worker: one claim at a
    /// time, each into a free slot. Variable `IRONFLOW_CLAIM_AHEAD_PERCENT`; default 20.
    pub fn claim_ahead_percent(mut self, percent: u32) -> Self {
        self.settings.claim_ahead_percent = percent;
        self
    }

    /// The function's configured timeout, the template's `Timeout`; more than zero. The margin must
    /// be below it; the loop guard's stall rule counts half of it. Variable
    /// `IRONFLOW_FUNCTION_TIMEOUT_SECS` (seconds); default 900.
    pub fn function_timeout(mut self, timeout: Duration) -> Self {
        self.settings.function_timeout = timeout;
        self
    }

    /// Lease TTL requested on claim and refresh, in whole seconds, the range the API accepts. Once
    /// a lease expires, the API's reaper takes the run back: it requeues it, or fails it once its
    /// lease expired more times than the run's `max_retries`. Variable `IRONFLOW_LEASE_TTL_SECS`
    /// (seconds); default 90; 1 s to 3600 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// // Keep the TTL at least twice the refresh interval: the rest is for retries.
    /// let builder = builder
    ///     .lease_ttl(Duration::from_secs(60))
    ///     .lease_refresh_interval(Duration::from_secs(20));
    /// ```
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl;
        self
    }

    /// Lease refresh interval, more than zero and below the lease TTL (keep the TTL at least twice
    /// the interval: what is left of it is the time failed refreshes are retried in). Variable
    /// `IRONFLOW_LEASE_REFRESH_INTERVAL_SECS` (seconds); default 30.
    pub fn lease_refresh_interval(mut self, interval: Duration) -> Self {
        self.settings.lease_refresh_interval = interval;
        self
    }

    /// Add worker tags sent with each claim (the variable is comma-separated). Each tag is 1 to 64
    /// bytes of ASCII letters, digits and `- _ . : / =`, at most 32 tags; surrounding whitespace
    /// and duplicates are dropped. Variable `IRONFLOW_WORKER_TAGS`; default none.
    ///
    /// ```no_run
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.tags(["region:eu", "gpu"]);
    /// ```
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Prefix of the worker id. Each invocation claims under its own id, `<prefix>-<request id>-<8
    /// hex>`, so a lease tells which invocation holds it; no leading space (the API trims ids) and
    /// no control character. Variable `IRONFLOW_WORKER_ID_PREFIX`; default `lambda`.
    pub fn worker_id_prefix(mut self, prefix: &str) -> Self {
        self.settings.worker_id_prefix = prefix.to_string();
        self
    }

    /// Consecutive failures that block a workflow as a poison pill. Variable
    /// `IRONFLOW_POISON_THRESHOLD`; default 3; ≥ 1.
    pub fn poison_threshold(mut self, n: u32) -> Self {
        self.settings.poison.threshold = n;
        self
    }

    /// How long a blocked workflow stays blocked after its last failure. Variable
    /// `IRONFLOW_POISON_COOLDOWN_SECS` (seconds); default 300.
    pub fn poison_cooldown(mut self, cooldown: Duration) -> Self {
        self.settings.poison.cooldown = cooldown;
        self
    }

    /// Prefix of every key in the poison-pill table, so several functions can share one table: 1 to
    /// 200 bytes, no `#`. Variable `IRONFLOW_POISON_NAMESPACE`; default `AWS_LAMBDA_FUNCTION_NAME`,
    /// else `ironflow`.
    pub fn poison_namespace(mut self, namespace: &str) -> Self {
        self.settings.poison_namespace = namespace.to_string();
        self
    }

    /// The poison-pill table. Default: an in-memory table (per Lambda instance), or the
    /// DynamoDB table named by `IRONFLOW_POISON_TABLE` once
    /// [`LambdaWorkerBuilder::connect_poison_table`] has connected it.
    pub fn poison_table(mut self, table: Arc<dyn PoisonTable>) -> Self {
        self.poison_table = Some(table);
        self.fleet = None;
        self
    }

    /// The DynamoDB poison-pill table, which also holds the webhook receivers' shared wake-up
    /// mark (`docs/push.md#coalescing`: what a burst of pushes queues, fleet-wide).
    /// [`LambdaWorkerBuilder::connect_poison_table`] sets the one `IRONFLOW_POISON_TABLE`
    /// names this way.
    pub fn dynamo_poison_table(mut self, table: DynamoPoisonTable) -> Self {
        self.fleet = Some(FleetMark::new(
            table.client().clone(),
            table.name(),
            table.namespace(),
        ));
        self.poison_table = Some(Arc::new(table));
        self
    }

    /// How long the wake-ups a push sent count as in flight for the receivers sharing the
    /// DynamoDB table's mark (`docs/push.md#coalescing`). Default and what a deployment uses:
    /// 2 s (`FLEET_WINDOW`, `src/wake/fleet.rs`); every receiver sharing the
    /// table must use the same. A longer one lets a test make several decisions within one
    /// window whatever the machine's load. No environment variable sets it; without
    /// [`LambdaWorkerBuilder::dynamo_poison_table`] (or `IRONFLOW_POISON_TABLE`) there is no
    /// mark and it does nothing.
    pub fn wake_mark_window(mut self, window: Duration) -> Self {
        self.fleet_window = Some(window);
        self
    }

    /// What happens to the runs of a blocked workflow: `Fail` fails a claimed run; `Defer` leaves
    /// blocked workflows out of the claim so their runs stay Pending until the cooldown ends. Defer
    /// needs the registered workflow list on claims: with a comma in a workflow name it falls back
    /// to `Fail` (with a warning at build time). Variable `IRONFLOW_POISON_MODE`; default `fail`.
    ///
    /// ```no_run
    /// use ironflow_lambda::PoisonMode;
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.poison_mode(PoisonMode::Defer);
    /// ```
    pub fn poison_mode(mut self, mode: PoisonMode) -> Self {
        self.settings.poison_mode = mode;
        self
    }

    /// The AWS configuration (region, credentials, endpoint) the DynamoDB poison-pill table and
    /// the wake-up queue are reached with, loaded once per cold start. Default: none
    /// ([`LambdaWorkerBuilder::from_env_and_secrets`] sets the one it is given).
    pub fn aws_config(mut self, aws: SdkConfig) -> Self {
        self.aws = Some(aws);
        self
    }

    /// Connect the DynamoDB poison-pill table named by `IRONFLOW_POISON_TABLE` under the
    /// poison-pill namespace, with the AWS configuration set by [`LambdaWorkerBuilder::aws_config`]
    /// (else the one from the environment), and check that it exists (`DescribeTable`). The same
    /// table holds the fleet-wide wake-up mark (docs/push.md, "Coalescing") and the record of the
    /// bodies the webhook receiver took (docs/push.md, "Replays"). Does nothing when no table is configured or one was set with
    /// [`LambdaWorkerBuilder::poison_table`]. Call it once per cold start, after the poison
    /// threshold and cooldown are final (the table applies the cooldown). Variable
    /// `IRONFLOW_POISON_TABLE`; default none: in-memory table.
    ///
    /// # Errors
    ///
    /// [`BuildError::PoisonTable`] naming the table when it does not exist, has another key
    /// schema, or cannot be described.
    pub async fn connect_poison_table(self) -> Result<Self, BuildError> {
        let Some(name) = self.unconnected_table() else {
            return Ok(self);
        };
        let config = match &self.aws {
            Some(aws) => aws_sdk_dynamodb::config::Builder::from(aws).build(),
            None => {
                let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .load()
                    .await;
                aws_sdk_dynamodb::config::Builder::from(&aws).build()
            }
        };
        let table = self.dynamo_table(&name, config);
        table.check_table().await?;
        Ok(self.with_dynamo_parts(table))
    }

    /// The role set so far (`IRONFLOW_FUNCTION_ROLE` or [`Self::function_role`]).
    pub(crate) fn role(&self) -> crate::settings::FunctionRole {
        self.settings.function_role
    }

    /// [`LambdaWorkerBuilder::connect_poison_table`] without the `DescribeTable` check: the
    /// webhook receiver's cold start, whose role may only read and write the table's items. It
    /// sets the same parts (the poison-pill table, the fleet-wide wake-up mark and the record of
    /// the webhook bodies taken), over the AWS configuration set by
    /// [`LambdaWorkerBuilder::aws_config`] (else an empty one). A missing table shows on the
    /// first item read or write instead.
    pub fn connect_poison_table_unchecked(self) -> Self {
        let Some(name) = self.unconnected_table() else {
            return self;
        };
        let aws = self
            .aws
            .clone()
            .unwrap_or_else(|| SdkConfig::builder().build());
        let config = aws_sdk_dynamodb::config::Builder::from(&aws).build();
        let table = self.dynamo_table(&name, config);
        self.with_dynamo_parts(table)
    }

    /// The table `IRONFLOW_POISON_TABLE` names, when it is set and no table was set otherwise.
    fn unconnected_table(&self) -> Option<String> {
        match self.poison_table {
            Some(_) => None,
            None => self.settings.poison_table.clone(),
        }
    }

    /// The DynamoDB poison-pill table `name` over `config` (not yet checked), under the
    /// poison-pill namespace: the one wiring both roles' cold starts use.
    fn dynamo_table(&self, name: &str, config: aws_sdk_dynamodb::Config) -> DynamoPoisonTable {
        let (namespace, policy) = (&self.settings.poison_namespace, self.settings.poison);
        DynamoPoisonTable::new(config, name, namespace, policy)
    }

    /// Set `table` ([`Self::dynamo_poison_table`]: with the fleet-wide wake-up mark in it) and
    /// the record of the webhook bodies taken, all three over the table's one client.
    fn with_dynamo_parts(self, table: DynamoPoisonTable) -> Self {
        let replay = ReplayTable::new(table.client().clone(), table.name(), table.namespace());
        let mut builder = self.dynamo_poison_table(table);
        builder.replay_table = Some(replay);
        builder
    }

    /// Dead man's switch URL pinged with `HEAD` once per invocation that completed its batch
    /// (Healthchecks.io, Cronitor, Better Stack...): `https://`, or `http://` as for the API's URL.
    /// Never logged: such URLs usually embed a secret. Variable `IRONFLOW_HEARTBEAT_URL`; default
    /// none.
    pub fn heartbeat_url(mut self, url: &str) -> Self {
        self.settings.heartbeat_url = Some(url.to_string());
        self
    }

    /// Invocation length used when `Context.deadline` has already passed, as under an emulator
    /// (`cargo lambda watch` sends a deadline in 1970); more than zero. Unset, a past deadline
    /// claims nothing. Lambda always sends a future deadline, so this never applies there. Variable
    /// `IRONFLOW_EMULATED_INVOCATION_SECS` (seconds); default none.
    pub fn emulated_invocation(mut self, length: Duration) -> Self {
        self.settings.emulated_invocation = Some(length);
        self
    }

    /// Send wake-ups after a batch that handed runs back or left a backlog, through `waker` (its
    /// queue, a standard SQS queue, and limits). Default: the queue of the settings, if any, over
    /// the AWS configuration ([`LambdaWorkerBuilder::aws_config`]); none without a queue. Variable
    /// `IRONFLOW_WAKE_QUEUE_URL`; default none. Variable `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`;
    /// default 3; 1 to 10. Variable `IRONFLOW_WAKE_DELAY_SECS` (seconds); default 5; 0 s to 900 s.
    pub fn wake_ups(mut self, waker: Waker) -> Self {
        self.waker = Some(waker);
        self
    }

    /// Handbacks in a row without a completed step before a run is failed by the loop guard.
    /// Variable `IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS`; default 3; ≥ 1.
    pub fn max_handbacks_without_progress(mut self, n: u32) -> Self {
        self.settings.max_handbacks_without_progress = n;
        self
    }

    /// Whether a step that would not fit in the time left before the cutoff is not started: the
    /// run is handed back at once, and the next invocation starts the step with a full budget
    /// (docs/design.md, "Cutoff-aware starts"). `false`: every step starts as the engine asks,
    /// and one still running at the cutoff is cut there. Variable
    /// `IRONFLOW_CUTOFF_AWARE_STARTS`; default `true`.
    pub fn cutoff_aware_starts(mut self, on: bool) -> Self {
        self.settings.cutoff_aware_starts = on;
        self
    }

    /// The expected duration of a step this process never saw complete and whose run never
    /// recorded it, for cutoff-aware starts ([`LambdaWorkerBuilder::cutoff_aware_starts`]).
    /// Variable `IRONFLOW_DEFAULT_STEP_SECS` (seconds); default 10.
    pub fn default_step_duration(mut self, expected: Duration) -> Self {
        self.settings.default_step_duration = expected;
        self
    }

    /// How long an agent step that sets no `max_capacity_wait` of its own may wait for provider
    /// capacity in all, across the sleeps it is put to (every provider account rate limited, or
    /// Bedrock throttling past its retries: [`crate::BedrockProvider`]); the run sleeps, holding
    /// no invocation. Variable `IRONFLOW_MAX_CAPACITY_WAIT_SECS` (seconds);
    /// default 21600.
    pub fn max_capacity_wait(mut self, wait: Duration) -> Self {
        self.settings.max_capacity_wait = wait;
        self
    }

    /// How runs put to sleep for provider capacity together are woken spread out: each wake time
    /// moves later by an offset drawn from the run id over a window of half the wait, at least
    /// `spread` and at most `max` (never below `spread`); zero for both: no spread. Wider than
    /// the API waker's 10 s tick and the timer wake-ups' 2 s grouping by default
    /// ([`CapacitySpread`](crate::wake_ups::CapacitySpread)). Variable `IRONFLOW_CAPACITY_SPREAD_SECS` (seconds); default 30.
    /// Variable `IRONFLOW_CAPACITY_SPREAD_MAX_SECS` (seconds); default 300.
    pub fn capacity_spread(mut self, spread: Duration, max: Duration) -> Self {
        self.settings.capacity_spread = spread;
        self.settings.capacity_spread_max = max;
        self
    }

    /// CloudWatch namespace of the EMF metrics: 1 to 255 of ASCII letters, digits, `. - _ / # :`
    /// and space, not starting with `:` or `AWS/` (CloudWatch drops the metrics of any other).
    /// Variable `IRONFLOW_METRICS_NAMESPACE`; default `ironflow-lambda`.
    pub fn metrics_namespace(mut self, namespace: &str) -> Self {
        self.settings.metrics_namespace = namespace.to_string();
        self
    }

    /// Idle gap after which an invocation first probes the HTTP connection pools for
    /// connections dropped during the freeze (no variable). Default 10 s.
    pub fn idle_probe_after(mut self, gap: Duration) -> Self {
        self.idle_probe_after = gap;
        self
    }

    /// Build the worker: the API stores and clients, the engine with every handler, the
    /// capabilities, the execution runtime.
    ///
    /// # Errors
    ///
    /// [`BuildError::MissingProvider`] without a provider, [`BuildError::InvalidTag`] for a
    /// malformed tag, [`BuildError::InvalidSetting`] for the first setting that cannot work
    /// ([`Settings::validate`]), [`BuildError::Register`] when the engine refuses a handler,
    /// [`BuildError::PoisonTableNotConnected`] and [`BuildError::WakeQueueNotConnected`] when
    /// the table or queue of the settings has no connection, [`BuildError::Runtime`] when the
    /// execution runtime cannot start.
    pub fn build(self) -> Result<LambdaWorker, BuildError> {
        let s = self.settings;
        let provider = self.provider.ok_or(BuildError::MissingProvider)?;
        validate_worker_tags(&s.tags)?;
        if let Some(p) = s.validate().into_iter().next() {
            return Err(BuildError::InvalidSetting {
                setter: p.setter,
                variable: p.variable,
                reason: p.reason,
            });
        }
        // The heartbeat URL is a credential of the dead man's switch (it is never logged): any
        // line that would carry it is redacted, as a token's.
        if let Some(url) = &s.heartbeat_url {
            crate::logging::redact(url);
        }
        let poison_table = match (self.poison_table, &s.poison_table) {
            (Some(table), _) => table,
            (None, Some(name)) => {
                return Err(BuildError::PoisonTableNotConnected {
                    table: name.clone(),
                });
            }
            (None, None) => worker::memory_table(&s),
        };
        let waker = match (self.waker, s.wake_settings(), &self.aws) {
            (Some(waker), _, _) => Some(waker),
            (None, Some(wake), Some(aws)) => Some(Waker::new(aws_sdk_sqs::Client::new(aws), wake)),
            (None, Some(wake), None) => {
                return Err(BuildError::WakeQueueNotConnected {
                    queue_url: wake.queue_url,
                });
            }
            (None, None, _) => None,
        };
        if s.webhook_secret.is_some() && waker.is_none() {
            return Err(BuildError::WebhookWithoutWakeQueue);
        }
        LambdaWorker::assemble(Parts {
            settings: s,
            provider,
            decision_provider: self.decision_provider,
            account_strategy: self.account_strategy,
            handlers: self.handlers,
            poison_table,
            waker,
            fleet: match self.fleet_window {
                Some(window) => self.fleet.map(|mark| mark.with_window(window)),
                None => self.fleet,
            },
            token_secret: self.token_secret,
            webhook_source: self.webhook_source,
            replay_table: self.replay_table,
            idle_probe_after: self.idle_probe_after,
        })
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
    fn the_heartbeat_url_is_redacted_from_every_log_line_once_built() {
        let url = "https://hc-ping.example.com/6f1c2a9e-secret-ping-id";
        let line = format!("{{\"message\":\"settings\",\"heartbeat\":\"{url}\"}}");
        assert!(crate::logging::redacted(&line).contains("secret-ping-id"));
        let _worker = builder().heartbeat_url(url).build().unwrap();
        let out = crate::logging::redacted(&line);
        assert!(!out.contains("secret-ping-id"), "{out}");
    }

    #[test]
    fn missing_provider_is_refused() {
        let err = LambdaWorkerBuilder::new("http://127.0.0.1:1", "t")
            .build()
            .err()
            .unwrap();
        assert!(matches!(err, BuildError::MissingProvider));
    }

    #[test]
    fn a_lease_ttl_of_a_fraction_of_a_second_is_refused_with_the_variable_named() {
        let err = builder()
            .lease_ttl(Duration::from_millis(2500))
            .lease_refresh_interval(Duration::from_secs(1))
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("IRONFLOW_LEASE_TTL_SECS"), "{err}");
        assert!(err.contains("whole number of seconds"), "{err}");
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
    fn a_configured_table_or_queue_must_be_connected() {
        let mut settings = Settings::new("http://127.0.0.1:1", WorkerToken::new("t"));
        settings.poison_table = Some("ironflow-poison".into());
        let err = LambdaWorkerBuilder::from_settings(settings)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .build()
            .err()
            .unwrap();
        assert!(err.to_string().contains("ironflow-poison"), "{err}");
        assert!(err.to_string().contains("connect_poison_table"), "{err}");

        let mut settings = Settings::new("http://127.0.0.1:1", WorkerToken::new("t"));
        settings.wake_queue_url = Some("https://sqs.example/123456789012/q".into());
        let err = LambdaWorkerBuilder::from_settings(settings)
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .build()
            .err()
            .unwrap();
        assert!(
            matches!(err, BuildError::WakeQueueNotConnected { .. }),
            "{err}"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_refused_with_their_setter_and_variable() {
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
            (builder().poison_namespace("a#b"), "poison_namespace"),
        ];
        for (b, named) in cases {
            let err = b.build().err().expect("refused");
            assert!(
                matches!(&err, BuildError::InvalidSetting { setter, .. } if *setter == named),
                "{named}: {err}"
            );
            assert!(err.to_string().contains("IRONFLOW_"), "{err}");
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
