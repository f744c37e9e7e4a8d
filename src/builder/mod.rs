//! The public builder, mirroring `ironflow_worker::WorkerBuilder`: every setting has a method,
//! and an environment variable read by [`LambdaWorkerBuilder::from_env`] (the table of them is
//! README's configuration table). The setting methods are in `setters.rs`, the poison-pill
//! table's in `poison_table.rs`; the module map:
//! [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).
//!
//! Build once per cold start: the HTTP clients, the engine and the settings are reused by every
//! warm invocation of the same Lambda instance.

mod poison_table;
mod setters;

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use ironflow_core::account_strategy::AccountStrategy;
use ironflow_core::decision::DecisionProvider;
use ironflow_core::provider::AgentProvider;
use ironflow_engine::handler::WorkflowHandler;
use ironflow_store::entities::validate_worker_tags;
use tracing::warn;

use crate::agents::AnthropicSecretProvider;
use crate::build_error::BuildError;
use crate::poison::PoisonTable;
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
/// # use ironflow_engine::context::WorkflowContext;
/// # use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
/// # /// A team's workflow (examples/my-workflows has real ones).
/// # struct Hello;
/// # impl WorkflowHandler for Hello {
/// #     fn name(&self) -> &str { "hello" }
/// #     fn execute<'a>(&'a self, _: &'a mut WorkflowContext) -> HandlerFuture<'a> {
/// #         Box::pin(async { Ok(()) })
/// #     }
/// # }
///
/// # fn example() -> Result<(), ironflow_lambda::BuildError> {
/// let worker = LambdaWorkerBuilder::new("https://ironflow.example.com", "worker-token")
///     .provider(Arc::new(BedrockProvider::from_env()))
///     .register(Hello)
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
    /// worker token, every other setting at its default. Nothing is checked here: an invalid
    /// URL or token is [`build`](Self::build)'s [`BuildError::InvalidSetting`], as any other
    /// setting. Neither has a default. Variable `IRONFLOW_API_URL`; default required. Variable
    /// `IRONFLOW_WORKER_TOKEN`; default required, or its `_SECRET_ARN`.
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

    /// Register a workflow handler. Claims ask only for the workflows registered here, by name:
    /// [`Self::build`] refuses a name that is blank, has whitespace around it, holds a comma or
    /// a control character, or is longer than 256 bytes (claims send the names as one
    /// comma-separated list, which the API splits and trims).
    ///
    /// ```no_run
    /// # use ironflow_engine::context::WorkflowContext;
    /// # use ironflow_engine::handler::{HandlerFuture, WorkflowHandler};
    /// # /// A team's workflow (examples/my-workflows has real ones).
    /// # struct Hello;
    /// # impl WorkflowHandler for Hello {
    /// #     fn name(&self) -> &str { "hello" }
    /// #     fn execute<'a>(&'a self, _: &'a mut WorkflowContext) -> HandlerFuture<'a> {
    /// #         Box::pin(async { Ok(()) })
    /// #     }
    /// # }
    /// # let builder = ironflow_lambda::LambdaWorkerBuilder::new("https://ironflow.example.com", "t");
    /// let builder = builder.register(Hello);
    /// ```
    pub fn register(mut self, handler: impl WorkflowHandler + 'static) -> Self {
        self.handlers.push(Box::new(handler));
        self
    }

    /// The role set so far (`IRONFLOW_FUNCTION_ROLE` or [`Self::function_role`]).
    pub(crate) fn role(&self) -> crate::settings::FunctionRole {
        self.settings.function_role
    }

    /// Build the worker: the API stores and clients, the engine with every handler, the
    /// capabilities, the execution runtime.
    ///
    /// # Errors
    ///
    /// [`BuildError::MissingProvider`] without a provider, [`BuildError::InvalidTag`] for a
    /// malformed tag, [`BuildError::InvalidWorkflowName`] for a registered name claims could not
    /// filter by ([`Self::register`]), [`BuildError::InvalidSetting`] for the first setting that cannot work
    /// ([`Settings::validate`]), [`BuildError::Register`] when the engine refuses a handler,
    /// [`BuildError::PoisonTableNotConnected`] and [`BuildError::WakeQueueNotConnected`] when
    /// the table or queue of the settings has no connection, [`BuildError::Runtime`] when the
    /// execution runtime cannot start.
    pub fn build(self) -> Result<LambdaWorker, BuildError> {
        let s = self.settings;
        let provider = self.provider.ok_or(BuildError::MissingProvider)?;
        validate_worker_tags(&s.tags)?;
        for handler in &self.handlers {
            check_workflow_name(handler.name())?;
        }
        if self.handlers.is_empty() && s.function_role == crate::settings::FunctionRole::Worker {
            warn!("no workflow is registered: the claims of this worker take no run");
        }
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

/// The longest workflow name a claim sends, in bytes: each claim carries every registered
/// name in its URL.
const MAX_WORKFLOW_NAME: usize = 256;

/// `name` can be claimed by its name alone: claims send the registered names as one
/// comma-separated list, which the API splits and trims (`parse_worker_capabilities`). A
/// name with a comma would turn the filter off (the worker would take other teams' runs), one
/// with whitespace around it would claim the trimmed name's runs, and a blank one none.
fn check_workflow_name(name: &str) -> Result<(), BuildError> {
    let reason = if name.trim().is_empty() {
        "expected a name with at least one visible character"
    } else if name.trim() != name {
        "expected no whitespace around it: the API trims the names claims send, so the worker \
         would claim the runs of the trimmed name"
    } else if name.contains(',') {
        "expected no comma: claims send the registered names as one comma-separated list"
    } else if name.chars().any(char::is_control) {
        "expected no control character"
    } else if name.len() > MAX_WORKFLOW_NAME {
        "expected at most 256 bytes: every claim carries every registered name in its URL"
    } else {
        return Ok(());
    };
    let quoted = format!("{name:?}");
    let shown = if quoted.chars().count() <= 80 {
        quoted
    } else {
        let start: String = quoted.chars().take(79).collect();
        format!("{start}…\" ({} bytes)", name.len())
    };
    Err(BuildError::InvalidWorkflowName {
        name: shown,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use ironflow_core::providers::claude::ClaudeCodeProvider;
    use ironflow_engine::context::WorkflowContext;
    use ironflow_engine::handler::HandlerFuture;

    use super::*;

    struct Named(String);
    impl WorkflowHandler for Named {
        fn name(&self) -> &str {
            &self.0
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

    /// Values only the variables' parsing bounded before: an empty token, a worker id prefix
    /// over 128 bytes, a lease refresh interval under 50 ms (a flood of renewals).
    #[test]
    fn values_that_would_fail_every_claim_or_flood_the_api_are_refused_at_build() {
        let empty = LambdaWorkerBuilder::new("http://127.0.0.1:1", "")
            .provider(Arc::new(ClaudeCodeProvider::new()))
            .build()
            .err()
            .unwrap();
        assert!(
            empty.to_string().contains("IRONFLOW_WORKER_TOKEN"),
            "{empty}"
        );
        let prefix = builder()
            .worker_id_prefix(&"p".repeat(100_000))
            .build()
            .err()
            .unwrap();
        assert!(prefix.to_string().contains("128 bytes"), "{prefix}");
        assert!(
            prefix.to_string().contains("100000 bytes in all") && prefix.to_string().len() < 600,
            "named by its start and length, not echoed: {prefix}"
        );
        let storm = builder()
            .lease_refresh_interval(Duration::from_nanos(1))
            .build()
            .err()
            .unwrap();
        assert!(storm.to_string().contains("50 ms"), "{storm}");
        builder()
            .worker_id_prefix(&"p".repeat(128))
            .lease_refresh_interval(Duration::from_millis(50))
            .build()
            .unwrap();
    }

    /// A name the API would split, trim or drop from the claims' workflow list is refused,
    /// naming it; the list is sorted.
    #[test]
    fn a_workflow_name_claims_could_not_filter_by_is_refused() {
        let long = "w".repeat(257);
        for name in ["b,c", "", "   ", "greet ", " greet", "a\tb", long.as_str()] {
            let err = builder()
                .register(Named("a".into()))
                .register(Named(name.into()))
                .build()
                .err()
                .unwrap();
            assert!(
                matches!(err, BuildError::InvalidWorkflowName { .. }),
                "{name:?}: {err}"
            );
            assert!(err.to_string().contains("expected"), "{err}");
            assert!(err.to_string().len() < 600, "{err}");
        }
        let w = builder()
            .register(Named("b".into()))
            .register(Named("a".into()))
            .register(Named("w".repeat(256)))
            .build()
            .unwrap();
        assert_eq!(
            w.capabilities().workflows,
            Some(vec!["a".into(), "b".into(), "w".repeat(256)])
        );
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
