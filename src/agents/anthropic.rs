//! [`AnthropicSecretProvider`]: the Anthropic Messages API (ironflow-core's
//! `AnthropicApiProvider`) with its key from Secrets Manager, read at cold start and again when
//! the API refuses it.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use aws_config::SdkConfig;
use ironflow_core::error::AgentError;
use ironflow_core::provider::{AgentConfig, AgentOutput, AgentProvider, InvokeFuture, LogSink};
use ironflow_core::providers::http::AnthropicApiProvider;
use ironflow_core::providers::http::HttpAgentProvider;
use ironflow_core::providers::http::anthropic::adapter::AnthropicApiAdapter;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout_at};
use tracing::{info, warn};

use super::calls::{Sleep, backoff, capacity_wait};
use crate::deadline::later;
use crate::secrets::{ApiKey, ApiKeySecret, SecretError};
use crate::store::scope::{CallScope, ModelCall};

/// The shortest time between two reads of the secret after a refusal: 1 minute.
pub const REREAD_AT_MOST_EVERY: Duration = Duration::from_secs(60);

/// The provider kind of an Anthropic capacity wait.
const KIND: &str = "anthropic";

/// What turns an ironflow `AnthropicApiProvider` into the one a step uses (tools, timeout).
type Configure = Arc<dyn Fn(AnthropicApiProvider) -> AnthropicApiProvider + Send + Sync>;

/// The key in use and when the secret was last read after a refusal.
struct KeyState {
    key: ApiKey,
    /// Bumped at each new key: a call refused with an older one retries with the newer.
    generation: u64,
    last_reread: Option<Instant>,
}

/// The Anthropic Messages API through ironflow-core's `provider-anthropic-api`
/// (`AnthropicApiProvider`: text, structured output by a forced tool or the output format, its
/// tool loop), with its API key read from a Secrets Manager secret: at cold start
/// ([`crate::LambdaWorkerBuilder::from_env_and_secrets`] reads
/// `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`; [`AnthropicSecretProvider::from_secret`] elsewhere).
///
/// The key is never logged, at any level: it is registered for redaction when read
/// (`crate::logging`) and no line of this crate carries it. ironflow's provider fixes the key
/// when it is built, so this one wraps it: when the API refuses the key (HTTP 401, it was
/// rotated), the secret is read again, at most once per [`REREAD_AT_MOST_EVERY`] for the whole
/// instance, and with a new key the inner provider is rebuilt and the call made once more. A
/// key refused again, or read again too soon, fails the step with the API's 401
/// (`AgentError::HttpProvider`, not retried).
///
/// Each call is cut at the invocation's cutoff (`AgentError::Timeout`); within it, ironflow's
/// provider bounds each request (120 s unless [`configure`](Self::configure) sets another
/// timeout). Throttling (429), overload (529) and 5xx are retried within
/// [`with_retry_window`](Self::with_retry_window) and the time left (after the API's
/// `retry-after` when it sends one, but never sooner than the jittered backoff); so is a
/// request that got no answer (the connection failed or was cut), which then fails the step
/// (status 0) as on Bedrock. Each retry calls ironflow's provider again, its whole tool loop
/// included. After that the step returns
/// `AgentError::CapacityWait` (kind `anthropic`): the run sleeps until the `retry-after` (else
/// [`with_capacity_pause`](Self::with_capacity_pause)), within the step's capacity-wait budget,
/// as [`crate::BedrockProvider`]'s do.
///
/// ```no_run
/// use std::sync::Arc;
/// # fn example(builder: ironflow_lambda::LambdaWorkerBuilder) -> ironflow_lambda::LambdaWorkerBuilder {
/// // IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN is set: the key was read at cold start.
/// match builder.anthropic_provider() {
///     Some(anthropic) => builder.provider(Arc::new(anthropic)),
///     None => builder.provider(Arc::new(ironflow_lambda::BedrockProvider::from_env())),
/// }
/// # }
/// ```
pub struct AnthropicSecretProvider {
    secret: ApiKeySecret,
    base_url: Option<String>,
    configure: Option<Configure>,
    retry_window: Duration,
    capacity_pause: Duration,
    state: Mutex<KeyState>,
    inner: RwLock<(u64, Arc<AnthropicApiProvider>)>,
}

impl fmt::Debug for AnthropicSecretProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicSecretProvider")
            .field("secret_arn", &self.secret.arn())
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl AnthropicSecretProvider {
    /// Retry window of throttling and 5xx by default: 20 s.
    pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(20);
    /// Capacity pause by default, when the API sends no `retry-after`: 60 s.
    pub const DEFAULT_CAPACITY_PAUSE: Duration = Duration::from_secs(60);

    /// How long throttling (429) and overload or 5xx answers are retried within one call
    /// (jittered backoff from 0.2 s to 5 s, or the API's `retry-after`), and never past the
    /// invocation's cutoff. Default [`Self::DEFAULT_RETRY_WINDOW`], 20 s.
    pub fn with_retry_window(mut self, window: Duration) -> Self {
        self.retry_window = window;
        self
    }

    /// How long a throttled step's run sleeps when the API sent no `retry-after` (plus up to a
    /// quarter of it, at random). Default [`Self::DEFAULT_CAPACITY_PAUSE`], 60 s.
    pub fn with_capacity_pause(mut self, pause: Duration) -> Self {
        self.capacity_pause = pause;
        self
    }

    /// A provider whose key is read now from the secret `secret_arn` (its `SecretString`, or its
    /// `api_key`, `key` or `ANTHROPIC_API_KEY` value), with `aws`'s region and credentials.
    ///
    /// # Errors
    ///
    /// [`SecretError`] naming `IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN` and the ARN when the ARN is
    /// malformed, the secret cannot be read or holds no usable key (never its value).
    pub async fn from_secret(aws: &SdkConfig, secret_arn: &str) -> Result<Self, SecretError> {
        let secret = ApiKeySecret::new(aws, secret_arn)?;
        let key = secret.read().await?;
        Ok(Self::from_key(key, secret))
    }

    /// A provider with `key`, read from `secret`.
    pub(crate) fn from_key(key: ApiKey, secret: ApiKeySecret) -> Self {
        let inner = build(&key, None, None);
        Self {
            secret,
            base_url: None,
            configure: None,
            retry_window: Self::DEFAULT_RETRY_WINDOW,
            capacity_pause: Self::DEFAULT_CAPACITY_PAUSE,
            state: Mutex::new(KeyState {
                key,
                generation: 0,
                last_reread: None,
            }),
            inner: RwLock::new((0, Arc::new(inner))),
        }
    }

    /// Send the requests to `base_url` instead of `https://api.anthropic.com` (a proxy, or the
    /// tests' scripted model server).
    pub fn with_base_url(mut self, base_url: &str) -> Self {
        self.base_url = Some(base_url.to_string());
        self.rebuild_now();
        self
    }

    /// Apply `configure` to ironflow's provider each time it is built (now, and after a new
    /// key): its tools (`with_tools`, `with_tool_profile`), its request timeout.
    pub fn configure(
        mut self,
        configure: impl Fn(AnthropicApiProvider) -> AnthropicApiProvider + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self.rebuild_now();
        self
    }

    /// Rebuild the inner provider with the key held (while the provider is being built).
    fn rebuild_now(&mut self) {
        let state = self.state.get_mut();
        let provider = build(
            &state.key,
            self.base_url.as_deref(),
            self.configure.as_ref(),
        );
        let inner = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        *inner = (state.generation, Arc::new(provider));
    }

    /// The provider in use and its generation.
    fn current(&self) -> (u64, Arc<AnthropicApiProvider>) {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        (inner.0, inner.1.clone())
    }

    /// After a refusal of the key of `generation`: the provider to try once more, if there is a
    /// newer key (another call read it, or the secret has one now and was not read within the
    /// last minute).
    async fn after_refusal(&self, generation: u64) -> Option<Arc<AnthropicApiProvider>> {
        let mut state = self.state.lock().await;
        if state.generation != generation {
            return Some(self.current().1);
        }
        if state
            .last_reread
            .is_some_and(|at| at.elapsed() < REREAD_AT_MOST_EVERY)
        {
            warn!(secret_arn = %self.secret.arn(), "the Anthropic API refused its key again within a minute of the last read of its secret: not reading it again yet");
            return None;
        }
        state.last_reread = Some(Instant::now());
        let key = match self.secret.read().await {
            Ok(key) => key,
            Err(e) => {
                warn!(error = %e, "the Anthropic API refused its key, and its secret could not be read again");
                return None;
            }
        };
        if key == state.key {
            warn!(secret_arn = %self.secret.arn(), "the Anthropic API refused its key, and its secret still holds the same one");
            return None;
        }
        info!(secret_arn = %self.secret.arn(), "the Anthropic API refused its key: using the new one its secret holds");
        let provider = Arc::new(build(
            &key,
            self.base_url.as_deref(),
            self.configure.as_ref(),
        ));
        state.key = key;
        state.generation = state.generation.saturating_add(1);
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        *inner = (state.generation, provider.clone());
        Some(provider)
    }

    /// The step `config` (with `sink`): throttling, overload and 5xx retried within the retry
    /// window and the time left, then a capacity wait.
    async fn run(
        &self,
        config: &AgentConfig,
        sink: Option<Arc<dyn LogSink>>,
    ) -> Result<AgentOutput, AgentError> {
        // ironflow-core's Messages API provider keeps no session either.
        super::session::no_session_to_resume(config, "the Anthropic API")?;
        let cutoff = CallScope::execution_cutoff();
        let window_end = later(Instant::now(), self.retry_window);
        let mut attempt: u32 = 0;
        loop {
            let result = self.once(config, sink.clone()).await;
            let Some(transient) = transient(&result) else {
                return result;
            };
            let retry_after = match transient {
                Transient::Capacity(retry_after) => retry_after,
                Transient::Network => None,
            };
            // A `retry-after` shorter than the backoff (0 included) still backs off.
            let delay = retry_after.map_or_else(|| backoff(attempt), |r| r.max(backoff(attempt)));
            let next = later(Instant::now(), delay);
            if next < window_end && cutoff.is_none_or(|c| next < c) {
                let why = result.err().map(|e| e.to_string()).unwrap_or_default();
                info!(attempt = attempt + 1, delay_ms = delay.as_millis() as u64, error = %why, "Anthropic call throttled or failed, retrying");
                sleep(delay).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
            // A connection that keeps failing through the window fails the step, as on
            // Bedrock (`calls`, step 3): an unreachable endpoint is a configuration fault.
            if transient == Transient::Network {
                return result;
            }
            let why = result.err().map(|e| e.to_string()).unwrap_or_default();
            let wait = Sleep {
                kind: KIND,
                // A `retry-after` of 0 says nothing of when capacity returns.
                pause: retry_after
                    .filter(|after| !after.is_zero())
                    .unwrap_or(self.capacity_pause),
                default_budget: ironflow_engine::accounts::DEFAULT_MAX_CAPACITY_WAIT,
                model: &config.model,
            };
            return Err(capacity_wait(config, &wait, &why));
        }
    }

    /// One call of the step `config` (with `sink`), re-reading the key once when it is refused.
    async fn once(
        &self,
        config: &AgentConfig,
        sink: Option<Arc<dyn LogSink>>,
    ) -> Result<AgentOutput, AgentError> {
        let (generation, provider) = self.current();
        match bounded(&provider, config, sink.clone()).await {
            Err(AgentError::HttpProvider {
                status_code: 401,
                provider: name,
                message,
            }) => match self.after_refusal(generation).await {
                Some(newer) => bounded(&newer, config, sink).await,
                None => Err(AgentError::HttpProvider {
                    provider: name,
                    status_code: 401,
                    message,
                }),
            },
            other => other,
        }
    }
}

/// A failed call that may pass by trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transient {
    /// Throttled (429, with its `retry-after` if any), overloaded or a 5xx answer.
    Capacity(Option<Duration>),
    /// The request got no answer: the connection failed or was cut before the API answered
    /// (ironflow's provider: status 0, `connection failed`). Not an answer that could not be
    /// read (a 200 that was billed) nor a stream cut midway: asked again, those would be paid
    /// twice.
    Network,
}

/// What `result` is when it may pass by trying again; `None` otherwise (a refusal, a success).
fn transient(result: &Result<AgentOutput, AgentError>) -> Option<Transient> {
    match result {
        Err(AgentError::RateLimited {
            retry_after_secs, ..
        }) => Some(Transient::Capacity(
            retry_after_secs.map(Duration::from_secs),
        )),
        Err(AgentError::HttpProvider { status_code, .. }) if *status_code >= 500 => {
            Some(Transient::Capacity(None))
        }
        Err(AgentError::HttpProvider {
            status_code: 0,
            message,
            ..
        }) if message.starts_with("connection failed") => Some(Transient::Network),
        _ => None,
    }
}

/// ironflow's provider with `key`.
fn build(
    key: &ApiKey,
    base_url: Option<&str>,
    configure: Option<&Configure>,
) -> AnthropicApiProvider {
    let mut adapter = AnthropicApiAdapter::new(key.expose().to_string());
    if let Some(url) = base_url {
        adapter = adapter.with_base_url(url.to_string());
    }
    let provider = HttpAgentProvider::new(adapter);
    match configure {
        Some(f) => f(provider),
        None => provider,
    }
}

/// One invocation of `provider`, cut at the invocation's cutoff.
async fn bounded(
    provider: &AnthropicApiProvider,
    config: &AgentConfig,
    sink: Option<Arc<dyn LogSink>>,
) -> Result<AgentOutput, AgentError> {
    let call = async {
        match sink {
            Some(sink) => provider.invoke_with_logs(config, sink).await,
            None => provider.invoke(config).await,
        }
    };
    let chars = [
        Some(config.prompt.as_str()),
        config.system_prompt.as_deref(),
        config.append_system_prompt.as_deref(),
        config.json_schema.as_deref(),
    ]
    .into_iter()
    .flatten()
    .map(|text| u64::try_from(text.chars().count()).unwrap_or(u64::MAX))
    .fold(0, u64::saturating_add);
    let in_flight = ModelCall::start(chars);
    let answer = match CallScope::execution_cutoff() {
        None => call.await,
        Some(cutoff) => {
            let limit = cutoff.saturating_duration_since(Instant::now());
            match timeout_at(cutoff, call).await {
                Ok(answer) => answer,
                Err(_) => {
                    drop(in_flight);
                    return Err(AgentError::Timeout { limit });
                }
            }
        }
    };
    in_flight.answered();
    answer
}

impl AgentProvider for AnthropicSecretProvider {
    fn invoke<'a>(&'a self, config: &'a AgentConfig) -> InvokeFuture<'a> {
        Box::pin(self.run(config, None))
    }

    fn invoke_with_logs<'a>(
        &'a self,
        config: &'a AgentConfig,
        log_sink: Arc<dyn LogSink>,
    ) -> InvokeFuture<'a> {
        Box::pin(self.run(config, Some(log_sink)))
    }
}
