//! Every tunable of the worker, each defined once.
//!
//! A setting is one row of [`table`]: a [`Setting`] naming its environment variable, the
//! [`LambdaWorkerBuilder`](crate::LambdaWorkerBuilder) method it mirrors, its meaning, its
//! default as a typed value, its bounds and any rule beyond them. The rows drive everything
//! else:
//! - the parsing of the environment ([`Settings::from_lookup`]), and the check of every value,
//!   from the environment or a builder method alike ([`Settings::validate`]): out of bounds or
//!   against its rule, a value is refused, named with what was expected;
//! - the defaults of [`Settings::new`] (and the `DEFAULT_*` constants);
//! - the README's configuration table (a test checks it equals [`VARIABLES`], row for row);
//! - the line each builder method's documentation carries
//!   ([`Entry::doc_line`], e.g. ``Variable `IRONFLOW_CONCURRENCY`; default 2; ≥ 1.``;
//!   a test checks each method carries the lines of its rows).
//!
//! [`Settings::validate`] also checks what no single value can (a refresh interval below the
//! lease TTL, a margin below the function timeout...). Every error names the variable, what was
//! expected and (except for secrets) what was found; the worker token never appears in an
//! error, a log line or a `Debug` rendering. A variable set to something that is not UTF-8 is
//! refused ([`Settings::from_env`]), never read as unset.
//!
//! # Adding a setting
//!
//! 1. Add the field to [`Settings`] and its default to [`Settings::new`] as
//!    `ROW.default_value()`.
//! 2. Add its row to `table.rs`, a `pub const` [`Setting`] (copy a row of the same type:
//!    `usize`/`u32` counts, [`Duration`] in seconds or milliseconds ([`Unit`]), `String`,
//!    `Option<String>`...), with `min`/`max` for its bounds and a `rule` (in `rules.rs` or
//!    `url.rs`) for anything else a single value must be; `shown: Shown::Hidden(..)` for a
//!    secret. Put it in [`VARIABLES`] where the README's table should show it.
//! 3. Add the builder method, its documentation ending with the row's [`Entry::doc_line`]
//!    (the failing test `every_setter_documents_its_rows` prints it).
//! 4. Paste the README row the failing test `the_readme_s_configuration_table_is_the_table_of_variables`
//!    prints.
//! 5. A check across settings goes to `validate.rs`, naming the row (`p.add(&ROW, reason)`).
//!
//! A new type of value implements [`Value`] (`value.rs`). A row written in the former style
//! (`Variable { name, setter, meaning, default, apply }`) ports field by field: `name` is
//! `variable`; the `default` string becomes the typed `default` (or `default_doc` when it is not
//! a value, e.g. `none: receiver off`); what `apply` parsed is the [`Value`] type and [`Unit`];
//! the checks `apply` and `validate.rs` made on one value become `min`/`max` or the `rule`; the
//! builder method's prose loses its default and bounds, which the row's doc line now states.

mod role;
mod row;
mod rules;
pub(crate) mod table;
mod url;
mod validate;
mod value;
mod wake;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

pub use role::{FUNCTION_ROLE_VAR, FunctionRole, ParseFunctionRoleError};
pub(crate) use rules::{SECRET_ARN_EXPECTED, is_namespace, is_secret_arn, is_token};
pub(crate) use table::{VARIABLES, Variable};
#[cfg(feature = "test-support")]
pub use table::DEFAULT_STEP_SECS;
pub use wake::WakeSettings;
pub(crate) use wake::{
    DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY, MAX_WAKE_DELAY,
    MAX_WAKEUPS_PER_INVOCATION_LIMIT,
};

use crate::poison::{PoisonMode, PoisonPolicy};

/// Default runs claimed per invocation (N), of [`table::MAX_RUNS_PER_INVOCATION`].
pub const DEFAULT_MAX_RUNS_PER_INVOCATION: usize = table::MAX_RUNS_PER_INVOCATION.default;
/// Default number of runs executing at once, as the reference worker ([`table::CONCURRENCY`]).
pub const DEFAULT_CONCURRENCY: usize = table::CONCURRENCY.default;
/// Most runs one process may execute at once, M × C: 4096 (each has an execution thread).
pub const MAX_RUNS_PER_PROCESS: usize = 4096;
/// Default run timeout, as the reference worker's ([`table::RUN_TIMEOUT`]).
pub const DEFAULT_RUN_TIMEOUT: Duration = table::RUN_TIMEOUT.default;
/// Default margin before the invocation deadline, time to hand runs back with retries when
/// the API fails ([`table::DEADLINE_MARGIN`]).
pub const DEFAULT_DEADLINE_MARGIN: Duration = table::DEADLINE_MARGIN.default;
/// Default minimum time before the cutoff for a claim ([`table::MIN_CLAIM_BUDGET`]).
pub const DEFAULT_MIN_CLAIM_BUDGET: Duration = table::MIN_CLAIM_BUDGET.default;
/// Default threshold of claim-ahead, in % of a run's execution time
/// ([`table::CLAIM_AHEAD_PERCENT`]).
pub const DEFAULT_CLAIM_AHEAD_PERCENT: u32 = table::CLAIM_AHEAD_PERCENT.default;
/// Default function timeout assumed when none is configured: Lambda's maximum
/// ([`table::FUNCTION_TIMEOUT`]).
pub const DEFAULT_FUNCTION_TIMEOUT: Duration = table::FUNCTION_TIMEOUT.default;
/// Default lease TTL, as the reference worker's ([`table::LEASE_TTL`]).
pub const DEFAULT_LEASE_TTL: Duration = table::LEASE_TTL.default;
/// Default lease refresh interval, as the reference worker's
/// ([`table::LEASE_REFRESH_INTERVAL`]).
pub const DEFAULT_LEASE_REFRESH_INTERVAL: Duration = table::LEASE_REFRESH_INTERVAL.default;
/// Default prefix of worker ids ([`table::WORKER_ID_PREFIX`]).
pub const DEFAULT_WORKER_ID_PREFIX: &str = table::WORKER_ID_PREFIX.default;
/// Default namespace of the poison-pill table's keys when `AWS_LAMBDA_FUNCTION_NAME` is unset
/// ([`table::POISON_NAMESPACE`]).
pub const DEFAULT_POISON_NAMESPACE: &str = table::POISON_NAMESPACE.default;
/// Longest accepted poison-pill namespace, in bytes.
pub const MAX_POISON_NAMESPACE_LEN: usize = 200;
/// Default number of handbacks in a row without a completed step before a run is failed
/// ([`table::MAX_HANDBACKS_WITHOUT_PROGRESS`]).
pub const DEFAULT_MAX_HANDBACKS_WITHOUT_PROGRESS: u32 =
    table::MAX_HANDBACKS_WITHOUT_PROGRESS.default;
/// Default CloudWatch namespace of the EMF metrics ([`table::METRICS_NAMESPACE`]).
pub const DEFAULT_METRICS_NAMESPACE: &str = table::METRICS_NAMESPACE.default;
/// How far an event's `at` may be from now, either way, for the webhook receiver to take it
/// (`IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS`): 5 minutes (docs/push.md, "Replays").
pub const DEFAULT_WEBHOOK_REPLAY_WINDOW: Duration = table::WEBHOOK_REPLAY_WINDOW.default;

/// The longest duration any setting takes: 100 years, so that
/// every deadline computed from a setting is an instant this crate can hold.
pub const MAX_DURATION: Duration = crate::deadline::HORIZON;
/// The lease TTLs the API accepts: 1 to 3600 s (its `validate_lease_ttl`).
pub const LEASE_TTL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);
/// The smallest deadline margin: 500 ms. A handback needs a few requests (the lease, the steps,
/// the status) and the response its reserve (250 ms) before the deadline.
pub const MIN_DEADLINE_MARGIN: Duration = Duration::from_millis(500);
/// The smallest minimum claim budget: 100 ms.
pub const MIN_CLAIM_BUDGET: Duration = Duration::from_millis(100);

/// The environment variable naming the secret that holds the worker token: the secret's ARN
/// (`arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-SUFFIX`). Its `SecretString` is the token.
pub const WORKER_TOKEN_SECRET_ARN_VAR: &str = table::WORKER_TOKEN_SECRET_ARN.variable;
/// The environment variable holding the worker token itself.
pub const WORKER_TOKEN_VAR: &str = table::WORKER_TOKEN.variable;
/// The API's worker token. Its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerToken(String);

impl WorkerToken {
    /// Wrap a token; from now on it is redacted from every log line ([`crate::logging::redact`]).
    pub fn new(token: impl Into<String>) -> Self {
        let token = token.into();
        crate::logging::redact(&token);
        Self(token)
    }

    /// The token itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for WorkerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerToken(***)")
    }
}

impl fmt::Display for WorkerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The variable naming the Secrets Manager secret that holds the Anthropic API key
/// ([`crate::AnthropicSecretProvider`]).
pub const ANTHROPIC_API_KEY_SECRET_ARN_VAR: &str = table::ANTHROPIC_API_KEY_SECRET_ARN.variable;

/// The variable holding the webhook receiver's secret itself.
pub const WEBHOOK_SECRET_VAR: &str = table::WEBHOOK_SECRET.variable;
/// The variable naming the Secrets Manager secret that holds it.
pub const WEBHOOK_SECRET_ARN_VAR: &str = table::WEBHOOK_SECRET_ARN.variable;
/// The shortest webhook secret accepted: 32 characters (it may travel in the URL).
pub const MIN_WEBHOOK_SECRET_LEN: usize = 32;

/// The secret the ironflow API's webhook proves itself with ([`crate::webhook`]): the key of
/// its `X-Signature-256` HMAC, or the token in the URL it is configured with. Its `Debug` and
/// `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(String);

impl WebhookSecret {
    /// Wrap a secret; from now on it is redacted from every log line
    /// ([`crate::logging::redact`]).
    pub fn new(secret: impl Into<String>) -> Self {
        let secret = secret.into();
        crate::logging::redact(&secret);
        Self(secret)
    }

    /// The secret itself, for the receiver's checks only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it can serve: at least [`MIN_WEBHOOK_SECRET_LEN`] visible ASCII characters
    /// (no spaces: it may travel in a URL).
    pub fn is_usable(&self) -> bool {
        self.0.len() >= MIN_WEBHOOK_SECRET_LEN && self.0.chars().all(|c| c.is_ascii_graphic())
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl fmt::Display for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A missing, malformed or unusable environment variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required variable is not set (or is empty).
    #[error("environment variable {variable} is not set: expected {expected}")]
    Missing {
        /// The variable's name.
        variable: &'static str,
        /// The expected form.
        expected: &'static str,
    },
    /// A variable is set to something this crate cannot parse, or to a value that cannot
    /// work (out of its bounds, against its rule).
    #[error("environment variable {variable} is invalid: expected {expected}, found {found:?}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// What was expected: the form, the bounds.
        expected: Cow<'static, str>,
        /// The value found (never the value of a secret).
        found: String,
    },
    /// A variable's value cannot work with the others ([`Settings::validate`]).
    #[error("environment variable {variable} cannot work: {reason}")]
    Unusable {
        /// The variable's name.
        variable: &'static str,
        /// Why, with the values involved.
        reason: String,
    },
    /// More than one variable is wrong: each of them, in the order of [`VARIABLES`].
    #[error("{} environment variables are wrong: {}", .0.len(), list(.0))]
    Several(Vec<ConfigError>),
}

impl ConfigError {
    /// The variable it names (`""` for [`ConfigError::Several`]).
    fn variable(&self) -> &'static str {
        match self {
            Self::Missing { variable, .. }
            | Self::Invalid { variable, .. }
            | Self::Unusable { variable, .. } => variable,
            Self::Several(_) => "",
        }
    }

    /// Each error it holds: itself, or the errors of [`ConfigError::Several`].
    fn into_list(self) -> Vec<ConfigError> {
        match self {
            Self::Several(errors) => errors,
            one => vec![one],
        }
    }
}

/// `1) <error>; 2) <error>...`
fn list(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}) {e}", i + 1))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A setting that cannot work, found by [`Settings::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The environment variable of the setting.
    pub variable: &'static str,
    /// The builder method of the setting.
    pub setter: &'static str,
    /// Why it cannot work, with the values involved.
    pub reason: String,
}

/// Every tunable of the worker, with the reference worker's defaults where it has one. The
/// fields are described by [`VARIABLES`] (one row each: its variable, the builder method named
/// there, its default and bounds).
///
/// Built by [`Settings::from_env`] or [`Settings::new`]; handed to
/// [`LambdaWorkerBuilder::from_settings`](crate::LambdaWorkerBuilder::from_settings).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Settings {
    pub api_url: String,
    pub allow_insecure_http: bool,
    pub worker_token: WorkerToken,
    pub max_runs_per_invocation: usize,
    pub concurrency: usize,
    /// Invocations one process serves at once, M (`AWS_LAMBDA_MAX_CONCURRENCY`, set by Lambda
    /// Managed Instances): default 1.
    pub concurrent_invocations: usize,
    pub run_timeout: Duration,
    pub deadline_margin: Duration,
    pub min_claim_budget: Duration,
    pub claim_ahead_percent: u32,
    pub function_timeout: Duration,
    pub lease_ttl: Duration,
    pub lease_refresh_interval: Duration,
    pub tags: Vec<String>,
    pub worker_id_prefix: String,
    /// Threshold and cooldown (`IRONFLOW_POISON_THRESHOLD`, `IRONFLOW_POISON_COOLDOWN_SECS`).
    pub poison: PoisonPolicy,
    pub poison_table: Option<String>,
    pub poison_namespace: String,
    pub poison_mode: PoisonMode,
    pub max_handbacks_without_progress: u32,
    /// Whether a step that would not fit before the cutoff is deferred to the next invocation
    /// (`IRONFLOW_CUTOFF_AWARE_STARTS`).
    pub cutoff_aware_starts: bool,
    /// The expected duration of a step never seen (`IRONFLOW_DEFAULT_STEP_SECS`).
    pub default_step_duration: Duration,
    pub max_capacity_wait: Duration,
    /// The least window capacity wake-ups are spread over ([`crate::CapacitySpread`]).
    pub capacity_spread: Duration,
    /// The most.
    pub capacity_spread_max: Duration,
    /// Never logged: it usually embeds a secret.
    pub heartbeat_url: Option<String>,
    pub emulated_invocation: Option<Duration>,
    pub wake_queue_url: Option<String>,
    pub max_wakeups_per_invocation: usize,
    pub wake_delay: Duration,
    pub metrics_namespace: String,
    /// The webhook receiver's secret; `None`: the receiver is off. Never logged.
    pub webhook_secret: Option<WebhookSecret>,
    /// The ARN the worker token was read from (`IRONFLOW_WORKER_TOKEN_SECRET_ARN`), if any.
    pub worker_token_secret_arn: Option<String>,
    /// The ARN the webhook secret was read from (`IRONFLOW_WEBHOOK_SECRET_ARN`), if any.
    pub webhook_secret_arn: Option<String>,
    /// The ARN the Anthropic API key is read from (`IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`), if
    /// any ([`crate::AnthropicSecretProvider`]).
    pub anthropic_api_key_secret_arn: Option<String>,
    /// How far an event's `at` may be from now, either way (`IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS`).
    pub webhook_replay_window: Duration,
    /// What the function serves (`IRONFLOW_FUNCTION_ROLE`): default [`FunctionRole::Worker`].
    pub function_role: FunctionRole,
}

impl Settings {
    /// Settings with every default (each row's [`Setting::default_value`]), for `api_url` and
    /// `worker_token`.
    pub fn new(api_url: &str, worker_token: WorkerToken) -> Self {
        use table::*;
        Self {
            api_url: api_url.to_string(),
            allow_insecure_http: ALLOW_INSECURE_HTTP.default_value(),
            worker_token,
            max_runs_per_invocation: MAX_RUNS_PER_INVOCATION.default_value(),
            concurrency: CONCURRENCY.default_value(),
            concurrent_invocations: CONCURRENT_INVOCATIONS.default_value(),
            run_timeout: RUN_TIMEOUT.default_value(),
            deadline_margin: DEADLINE_MARGIN.default_value(),
            min_claim_budget: table::MIN_CLAIM_BUDGET.default_value(),
            claim_ahead_percent: CLAIM_AHEAD_PERCENT.default_value(),
            function_timeout: FUNCTION_TIMEOUT.default_value(),
            lease_ttl: LEASE_TTL.default_value(),
            lease_refresh_interval: LEASE_REFRESH_INTERVAL.default_value(),
            tags: TAGS.default_value(),
            worker_id_prefix: WORKER_ID_PREFIX.default_value(),
            poison: PoisonPolicy {
                threshold: POISON_THRESHOLD.default_value(),
                cooldown: POISON_COOLDOWN.default_value(),
            },
            poison_table: POISON_TABLE.default_value(),
            poison_namespace: POISON_NAMESPACE.default_value(),
            poison_mode: POISON_MODE.default_value(),
            max_handbacks_without_progress: MAX_HANDBACKS_WITHOUT_PROGRESS.default_value(),
            cutoff_aware_starts: CUTOFF_AWARE_STARTS.default_value(),
            default_step_duration: DEFAULT_STEP_SECS.default_value(),
            max_capacity_wait: MAX_CAPACITY_WAIT.default_value(),
            capacity_spread: CAPACITY_SPREAD.default_value(),
            capacity_spread_max: CAPACITY_SPREAD_MAX.default_value(),
            heartbeat_url: HEARTBEAT_URL.default_value(),
            emulated_invocation: EMULATED_INVOCATION.default_value(),
            wake_queue_url: WAKE_QUEUE_URL.default_value(),
            max_wakeups_per_invocation: MAX_WAKEUPS_PER_INVOCATION.default_value(),
            wake_delay: WAKE_DELAY.default_value(),
            metrics_namespace: METRICS_NAMESPACE.default_value(),
            webhook_secret: WEBHOOK_SECRET.default_value(),
            worker_token_secret_arn: WORKER_TOKEN_SECRET_ARN.default_value(),
            webhook_secret_arn: WEBHOOK_SECRET_ARN.default_value(),
            anthropic_api_key_secret_arn: ANTHROPIC_API_KEY_SECRET_ARN.default_value(),
            webhook_replay_window: WEBHOOK_REPLAY_WINDOW.default_value(),
            function_role: FUNCTION_ROLE.default_value(),
        }
    }

    /// The wake-up settings, when a wake queue is configured.
    pub fn wake_settings(&self) -> Option<WakeSettings> {
        let queue_url = self.wake_queue_url.clone()?;
        Some(WakeSettings {
            queue_url,
            max_per_invocation: self.max_wakeups_per_invocation,
            handback_delay: self.wake_delay,
        })
    }

    /// Settings from the process environment (see [`VARIABLES`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable that is missing, malformed, not UTF-8 or cannot
    /// work ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(environment()?)
    }

    /// Settings from any variable lookup (the environment, a map in tests).
    ///
    /// # Errors
    ///
    /// As [`Settings::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup_with_token(lookup, None)
    }

    /// [`Settings::from_lookup`] with the worker token already known (read from Secrets
    /// Manager at cold start); `None` reads `IRONFLOW_WORKER_TOKEN`.
    ///
    /// # Errors
    ///
    /// As [`Settings::from_env`].
    pub fn from_lookup_with_token(
        lookup: impl Fn(&str) -> Option<String>,
        worker_token: Option<WorkerToken>,
    ) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut s = Self::new("", WorkerToken::new(""));
        let namespace_set = get(table::POISON_NAMESPACE.variable).is_some();
        if let Some(function) = get(FUNCTION_NAME_VAR).filter(|_| !namespace_set) {
            s.poison_namespace = function;
        }
        // Every variable is checked, and every problem reported at once: a cold start that fails
        // on a bad environment names all of them in one log line. First each value is parsed,
        // then checked (a rule may depend on a variable further down the table).
        let mut errors = Vec::new();
        let mut parsed = Vec::new();
        for v in VARIABLES.iter().copied() {
            let Some(raw) = get(v.variable()) else {
                continue;
            };
            match v.parse_into(&mut s, &raw) {
                Ok(()) => parsed.push((v, raw)),
                Err(expected) => errors.push(invalid(v, expected, &raw)),
            }
        }
        if let Some(token) = worker_token {
            s.worker_token = token;
        }
        let set: Vec<&'static str> = parsed.iter().map(|(v, _)| v.variable()).collect();
        for (v, raw) in parsed {
            if let Err(expected) = v.check(&s) {
                errors.push(invalid(v, expected, &raw));
            }
        }
        missing(&s, &mut errors);
        without_queue(&s, &set, &mut errors);
        if !namespace_set && !is_namespace(&s.poison_namespace) {
            errors.push(ConfigError::Invalid {
                variable: "AWS_LAMBDA_FUNCTION_NAME (default of IRONFLOW_POISON_NAMESPACE)",
                expected: rules::NAMESPACE_EXPECTED.into(),
                found: s.poison_namespace.clone(),
            });
        }
        // What no single value shows, for the variables that parsed.
        for p in s.validate() {
            if !errors_name(&errors, p.variable) {
                errors.push(ConfigError::Unusable {
                    variable: p.variable,
                    reason: p.reason,
                });
            }
        }
        order(&mut errors);
        match errors.len() {
            0 => Ok(s),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }

    /// What cannot work in these settings (each named by its variable and builder method), in
    /// the order of [`VARIABLES`]; empty when they can. The builder refuses settings with a
    /// problem, and so does [`Settings::from_lookup`].
    pub fn validate(&self) -> Vec<Problem> {
        validate::problems(self)
    }
}

/// The variable Lambda names the function in (the default of `IRONFLOW_POISON_NAMESPACE`).
const FUNCTION_NAME_VAR: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// The error of `v` set to `raw`, which is not what `expected` says.
fn invalid(v: &Variable, expected: Cow<'static, str>, raw: &str) -> ConfigError {
    ConfigError::Invalid {
        variable: v.variable(),
        expected,
        found: v.found(raw),
    }
}

/// A wake-up variable set without a queue, even to its default: it would be ignored without a
/// word ([`Settings::validate`] sees only values that differ from the defaults, as the builder
/// cannot tell a default from a value set to it).
fn without_queue(s: &Settings, set: &[&str], errors: &mut Vec<ConfigError>) {
    let wake = [
        table::MAX_WAKEUPS_PER_INVOCATION.variable,
        table::WAKE_DELAY.variable,
    ];
    let given: Vec<&str> = wake.into_iter().filter(|v| set.contains(v)).collect();
    if s.wake_queue_url.is_none() && !given.is_empty() {
        errors.push(ConfigError::Unusable {
            variable: table::WAKE_QUEUE_URL.variable,
            reason: format!(
                "{} is set, and applies only to a wake queue: set the queue's URL, or unset it \
                 to send no wake-ups",
                given.join(" and ")
            ),
        });
    }
}

/// The errors of the required variables that are not set.
fn missing(s: &Settings, errors: &mut Vec<ConfigError>) {
    if s.api_url.is_empty() {
        errors.push(ConfigError::Missing {
            variable: table::API_URL.variable,
            expected: "the ironflow API's base URL, e.g. https://ironflow.example.com",
        });
    }
    if s.worker_token.expose().is_empty() && !errors_name(errors, WORKER_TOKEN_VAR) {
        errors.push(ConfigError::Missing {
            variable: WORKER_TOKEN_VAR,
            expected: "the ironflow API's worker token (WORKER_TOKEN on the API), or                        IRONFLOW_WORKER_TOKEN_SECRET_ARN naming a Secrets Manager secret that                        holds it",
        });
    }
}

/// The process environment's variables of this crate ([`VARIABLES`] and
/// `AWS_LAMBDA_FUNCTION_NAME`), as a lookup for [`Settings::from_lookup`] and the secrets.
///
/// # Errors
///
/// [`ConfigError`] naming each variable set to something that is not valid UTF-8 (read as
/// unset, it would silently become its default: a poison table name the in-memory table).
///
/// A variable whose name is a near miss of one of them (`IRONFLOW_POISON_TABEL`) is refused
/// too, naming the one it misspells: ignored, its setting would silently keep its default.
pub fn environment() -> Result<impl Fn(&str) -> Option<String> + Clone, ConfigError> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    let mut errors = misspelt(&names);
    let (values, unreadable) = os_values(|name| std::env::var_os(name));
    errors.extend(unreadable);
    let lookup = move |name: &str| values.get(name).cloned();
    if errors.is_empty() {
        return Ok(lookup);
    }
    // One error names every problem: the values that did read are checked too.
    // (A variable not read for want of UTF-8 is not reported again as missing.)
    if let Err(more) = Settings::from_lookup(lookup.clone()) {
        for e in more.into_list() {
            if !errors_name(&errors, e.variable()) {
                errors.push(e);
            }
        }
    }
    order(&mut errors);
    match errors.len() {
        1 => Err(errors.remove(0)),
        _ => Err(ConfigError::Several(errors)),
    }
}

/// Whether `lookup` holds a non-blank value for `variable` (what the settings read as set).
pub(crate) fn is_set(lookup: impl Fn(&str) -> Option<String>, variable: &str) -> bool {
    lookup(variable).is_some_and(|v| !v.trim().is_empty())
}

/// The errors of the `IRONFLOW_*` names in `names` that are no variable of [`VARIABLES`] but
/// within two edits of one (a misspelling): each names the variable it is closest to.
pub fn misspelt(names: &[String]) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for name in names.iter().filter(|n| n.starts_with("IRONFLOW_")) {
        if VARIABLES.iter().any(|v| v.variable() == name) {
            continue;
        }
        let closest = VARIABLES
            .iter()
            .map(|v| (edits(name, v.variable()), v.variable()))
            .min();
        if let Some((distance, variable)) = closest.filter(|(d, _)| *d <= 2) {
            errors.push(ConfigError::Unusable {
                variable,
                reason: format!(
                    "{name} is set, and this worker reads no such variable: a misspelling of \
                     {variable} ({distance} letter(s) apart)? Rename it, or {variable} keeps its \
                     default"
                ),
            });
        }
    }
    errors
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions of bytes).
fn edits(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// [`environment`] over any lookup of raw values.
///
/// # Errors
///
/// As [`environment`].
pub fn os_lookup(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Result<impl Fn(&str) -> Option<String> + Clone, ConfigError> {
    let (values, mut errors) = os_values(lookup);
    match errors.len() {
        0 => Ok(move |name: &str| values.get(name).cloned()),
        1 => Err(errors.remove(0)),
        _ => Err(ConfigError::Several(errors)),
    }
}

/// The variables of [`VARIABLES`] and `AWS_LAMBDA_FUNCTION_NAME` that `lookup` holds as UTF-8
/// text, and an error naming each one it holds as anything else.
fn os_values(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> (HashMap<&'static str, String>, Vec<ConfigError>) {
    let mut values = HashMap::new();
    let mut errors = Vec::new();
    let names = VARIABLES.iter().map(|v| (v.variable(), Some(*v)));
    for (name, row) in names.chain([(FUNCTION_NAME_VAR, None)]) {
        match lookup(name).map(OsString::into_string) {
            None => {}
            Some(Ok(value)) => {
                values.insert(name, value);
            }
            Some(Err(raw)) => {
                let lossy = raw.to_string_lossy();
                errors.push(ConfigError::Invalid {
                    variable: name,
                    expected: "valid UTF-8 text".into(),
                    found: row.map_or_else(|| lossy.to_string(), |v| v.found(&lossy)),
                });
            }
        }
    }
    (values, errors)
}

/// Whether an error in `errors` concerns `variable`.
fn errors_name(errors: &[ConfigError], variable: &str) -> bool {
    errors.iter().any(|e| match e {
        ConfigError::Missing { variable: v, .. }
        | ConfigError::Invalid { variable: v, .. }
        | ConfigError::Unusable { variable: v, .. } => *v == variable,
        ConfigError::Several(_) => false,
    })
}

/// The position of `variable` in [`VARIABLES`] (after them: anything else).
fn position(variable: &str) -> usize {
    VARIABLES
        .iter()
        .position(|v| v.variable() == variable || variable.contains(v.variable()))
        .unwrap_or(usize::MAX)
}

/// Sort `errors` in the order of [`VARIABLES`], the order they are documented in.
fn order(errors: &mut [ConfigError]) {
    errors.sort_by_key(|e| match e {
        ConfigError::Missing { variable, .. }
        | ConfigError::Invalid { variable, .. }
        | ConfigError::Unusable { variable, .. } => position(variable),
        ConfigError::Several(_) => usize::MAX,
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A variable lookup over `vars`, for tests of `from_lookup` parsers.
    pub(crate) fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const BASE: [(&str, &str); 2] = [
        ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
        ("IRONFLOW_WORKER_TOKEN", "s3cr3t-token"),
    ];

    /// The README's configuration table: `(variable, meaning, default)` per row.
    fn readme_table() -> Vec<(String, String, String)> {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("\n## ")
            .find(|s| s.starts_with("Configuration"))
            .expect("the README has a Configuration section");
        section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
                assert_eq!(cells.len(), 3, "a row of three cells: {l}");
                (
                    cells[0].trim().trim_matches('`').to_string(),
                    cells[1].trim().to_string(),
                    cells[2].trim().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn the_readme_s_configuration_table_is_the_table_of_variables() {
        let expected: Vec<(String, String, String)> = VARIABLES
            .iter()
            .map(|v| {
                (
                    v.variable().to_string(),
                    v.readme_meaning(),
                    v.default_text(),
                )
            })
            .collect();
        let rows = readme_table();
        let printed: String = expected
            .iter()
            .map(|(n, m, d)| format!("| `{n}` | {m} | {d} |\n"))
            .collect();
        assert_eq!(
            rows, expected,
            "the README's table differs from settings::VARIABLES; the table as it should be:\n{printed}"
        );
    }

    #[test]
    fn defaults_apply() {
        let s = Settings::from_lookup(lookup(&BASE)).unwrap();
        assert_eq!(s.max_runs_per_invocation, DEFAULT_MAX_RUNS_PER_INVOCATION);
        assert_eq!(s.deadline_margin, DEFAULT_DEADLINE_MARGIN);
        assert_eq!(s.worker_token.expose(), "s3cr3t-token");
        assert_eq!(s.metrics_namespace, DEFAULT_METRICS_NAMESPACE);
        assert!(s.validate().is_empty());
        assert!(s.wake_settings().is_none());
    }

    #[test]
    fn missing_url_names_the_variable() {
        let err = Settings::from_lookup(lookup(&[("IRONFLOW_WORKER_TOKEN", "x")])).unwrap_err();
        assert!(err.to_string().contains("IRONFLOW_API_URL"), "{err}");
    }

    #[test]
    fn malformed_number_names_variable_expected_and_found() {
        let mut vars = BASE.to_vec();
        vars.push(("IRONFLOW_MAX_RUNS_PER_INVOCATION", "eight"));
        let err = Settings::from_lookup(lookup(&vars)).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Invalid {
                variable: "IRONFLOW_MAX_RUNS_PER_INVOCATION",
                expected: "a whole number greater than 0".into(),
                found: "eight".into()
            }
        );
    }

    #[test]
    fn concurrent_invocations_come_from_lambda_s_variable_and_m_times_c_is_bounded() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut vars = BASE.to_vec();
            vars.extend_from_slice(pairs);
            Settings::from_lookup(lookup(&vars)).map_err(|e| e.to_string())
        };
        assert_eq!(with(&[]).unwrap().concurrent_invocations, 1);
        let s = with(&[("AWS_LAMBDA_MAX_CONCURRENCY", "4")]).unwrap();
        assert_eq!((s.concurrent_invocations, s.concurrency), (4, 2));
        for bad in ["0", "abc", "-1", "2.5"] {
            let err = with(&[("AWS_LAMBDA_MAX_CONCURRENCY", bad)]).unwrap_err();
            assert!(err.contains("AWS_LAMBDA_MAX_CONCURRENCY"), "{bad}: {err}");
        }
        let err = with(&[("AWS_LAMBDA_MAX_CONCURRENCY", "2049")]).unwrap_err();
        assert!(
            err.contains("AWS_LAMBDA_MAX_CONCURRENCY") && err.contains("4098"),
            "{err}"
        );
        assert!(with(&[("AWS_LAMBDA_MAX_CONCURRENCY", "2048")]).is_ok());
        let err = with(&[("IRONFLOW_CONCURRENCY", "5000")]).unwrap_err();
        assert!(
            err.contains("IRONFLOW_CONCURRENCY") && err.contains("5000 runs"),
            "{err}"
        );
    }

    #[test]
    fn a_number_out_of_range_says_so_and_claim_ahead_parses() {
        let mut vars = BASE.to_vec();
        vars.push(("IRONFLOW_CLAIM_AHEAD_PERCENT", "99999999999"));
        let err = Settings::from_lookup(lookup(&vars)).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Invalid {
                variable: "IRONFLOW_CLAIM_AHEAD_PERCENT",
                expected: "a smaller whole number (it is out of range)".into(),
                found: "99999999999".into()
            }
        );
        for (raw, percent) in [("0", 0), ("25", 25)] {
            let mut vars = BASE.to_vec();
            vars.push(("IRONFLOW_CLAIM_AHEAD_PERCENT", raw));
            let s = Settings::from_lookup(lookup(&vars)).unwrap();
            assert_eq!(s.claim_ahead_percent, percent);
        }
        for raw in ["-1", "10.5", "abc"] {
            let mut vars = BASE.to_vec();
            vars.push(("IRONFLOW_CLAIM_AHEAD_PERCENT", raw));
            let err = Settings::from_lookup(lookup(&vars))
                .unwrap_err()
                .to_string();
            assert!(err.contains("IRONFLOW_CLAIM_AHEAD_PERCENT") && err.contains("whole number"));
        }
    }

    #[test]
    fn values_that_cannot_work_together_are_refused_from_the_environment_too() {
        for (variable, value, named) in [
            ("IRONFLOW_CONCURRENCY", "0", "IRONFLOW_CONCURRENCY"),
            ("IRONFLOW_LEASE_TTL_SECS", "3601", "IRONFLOW_LEASE_TTL_SECS"),
            (
                "IRONFLOW_DEADLINE_MARGIN_MS",
                "0",
                "IRONFLOW_DEADLINE_MARGIN_MS",
            ),
            (
                "IRONFLOW_MIN_CLAIM_BUDGET_MS",
                "0",
                "IRONFLOW_MIN_CLAIM_BUDGET_MS",
            ),
            (
                "IRONFLOW_RUN_TIMEOUT_SECS",
                "18446744073709551615",
                "IRONFLOW_RUN_TIMEOUT_SECS",
            ),
            (
                "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
                "90",
                "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
            ),
            ("IRONFLOW_WAKE_DELAY_SECS", "10", "IRONFLOW_WAKE_QUEUE_URL"),
        ] {
            let mut vars = BASE.to_vec();
            vars.push((variable, value));
            let err = Settings::from_lookup(lookup(&vars))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{variable}={value}: {err}");
        }
    }

    #[test]
    fn poison_table_variables() {
        let s = Settings::from_lookup(lookup(&BASE)).unwrap();
        assert_eq!(s.poison_table, None);
        assert_eq!(s.poison_namespace, DEFAULT_POISON_NAMESPACE);
        assert_eq!(s.poison_mode, PoisonMode::Fail);

        let mut vars = BASE.to_vec();
        vars.push(("AWS_LAMBDA_FUNCTION_NAME", "my-fn"));
        vars.push(("IRONFLOW_POISON_TABLE", "ironflow-poison"));
        vars.push(("IRONFLOW_POISON_MODE", "defer"));
        let s = Settings::from_lookup(lookup(&vars)).unwrap();
        assert_eq!(s.poison_table.as_deref(), Some("ironflow-poison"));
        assert_eq!(s.poison_namespace, "my-fn");
        assert_eq!(s.poison_mode, PoisonMode::Defer);

        vars.push(("IRONFLOW_POISON_NAMESPACE", "shared-a"));
        let s = Settings::from_lookup(lookup(&vars)).unwrap();
        assert_eq!(s.poison_namespace, "shared-a");

        let arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/ironflow-poison";
        let mut vars = BASE.to_vec();
        vars.push(("IRONFLOW_POISON_TABLE", arn));
        let s = Settings::from_lookup(lookup(&vars)).unwrap();
        assert_eq!(s.poison_table.as_deref(), Some(arn));
    }

    #[test]
    fn malformed_poison_variables_name_the_variable() {
        for (variable, value, expected) in [
            ("IRONFLOW_POISON_MODE", "skip", "fail or defer"),
            ("IRONFLOW_POISON_TABLE", "no spaces", "DynamoDB table name"),
            ("IRONFLOW_POISON_TABLE", "ab", "DynamoDB table name"),
            (
                "IRONFLOW_POISON_TABLE",
                "arn:aws:s3:::bucket",
                "DynamoDB table name",
            ),
            ("IRONFLOW_POISON_NAMESPACE", "a#b", "without '#'"),
        ] {
            let mut vars = BASE.to_vec();
            vars.push((variable, value));
            let err = Settings::from_lookup(lookup(&vars)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(variable) && text.contains(expected) && text.contains(value),
                "{text}"
            );
        }
    }

    #[test]
    fn wake_variables() {
        let mut vars = BASE.to_vec();
        vars.push((
            "IRONFLOW_WAKE_QUEUE_URL",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/q",
        ));
        vars.push(("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "7"));
        vars.push(("IRONFLOW_WAKE_DELAY_SECS", "0"));
        let wake = Settings::from_lookup(lookup(&vars))
            .unwrap()
            .wake_settings()
            .unwrap();
        assert_eq!(wake.max_per_invocation, 7);
        assert_eq!(wake.handback_delay, Duration::ZERO);
        for (variable, value) in [
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "11"),
            ("IRONFLOW_WAKE_DELAY_SECS", "901"),
            ("IRONFLOW_WAKE_QUEUE_URL", "sqs-queue"),
        ] {
            let mut bad = vars.clone();
            bad.push((variable, value));
            let err = Settings::from_lookup(lookup(&bad)).unwrap_err().to_string();
            assert!(err.contains(variable), "{err}");
        }
    }

    #[test]
    fn a_wake_variable_set_without_a_queue_is_refused_even_at_its_default() {
        for (variable, value) in [
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "3"),
            ("IRONFLOW_WAKE_DELAY_SECS", "5"),
            ("IRONFLOW_WAKE_DELAY_SECS", "60"),
        ] {
            let mut vars = BASE.to_vec();
            vars.push((variable, value));
            let err = Settings::from_lookup(lookup(&vars))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("IRONFLOW_WAKE_QUEUE_URL") && err.contains(variable),
                "{variable}={value}: {err}"
            );
            assert_eq!(err.matches("IRONFLOW_WAKE_QUEUE_URL").count(), 1, "{err}");
        }
        // Unset, they are nothing to refuse.
        assert!(Settings::from_lookup(lookup(&BASE)).is_ok());
    }

    #[test]
    fn an_api_url_with_credentials_is_refused_and_they_are_not_shown() {
        for url in [
            "https://worker:s3cret@api.example.com",
            "https://s3cret@api.example.com/",
            "ftp://worker:s3cret@api.example.com",
            "worker:s3cret@api.example.com",
            "//worker:s3cret@api.example.com",
            "https//worker:s3cret@api.example.com",
            "https:/worker:s3cret@api.example.com",
        ] {
            let err = Settings::from_lookup(lookup(&[
                ("IRONFLOW_API_URL", url),
                ("IRONFLOW_WORKER_TOKEN", "t"),
            ]))
            .unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(
                    err,
                    ConfigError::Invalid {
                        variable: "IRONFLOW_API_URL",
                        ..
                    }
                ),
                "{url}: {text}"
            );
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("***@api.example.com"), "{text}");
        }
    }

    #[test]
    fn plain_http_to_a_remote_host_is_refused_unless_opted_in() {
        let remote = [
            ("IRONFLOW_API_URL", "http://10.0.3.7:8080"),
            ("IRONFLOW_WORKER_TOKEN", "t"),
        ];
        let err = Settings::from_lookup(lookup(&remote)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("IRONFLOW_API_URL"), "{text}");
        assert!(text.contains("IRONFLOW_ALLOW_INSECURE_HTTP=true"), "{text}");
        let mut opted = remote.to_vec();
        opted.push(("IRONFLOW_ALLOW_INSECURE_HTTP", "true"));
        let s = Settings::from_lookup(lookup(&opted)).unwrap();
        assert!(s.allow_insecure_http);
        let mut bad = remote.to_vec();
        bad.push(("IRONFLOW_ALLOW_INSECURE_HTTP", "yes"));
        let err = Settings::from_lookup(lookup(&bad)).unwrap_err().to_string();
        assert!(
            err.contains("IRONFLOW_ALLOW_INSECURE_HTTP") && err.contains("true or false"),
            "{err}"
        );
        for loopback in [
            "http://127.0.0.1:3000",
            "http://localhost",
            "http://[::1]:1",
        ] {
            let ok = [
                ("IRONFLOW_API_URL", loopback),
                ("IRONFLOW_WORKER_TOKEN", "t"),
            ];
            assert!(Settings::from_lookup(lookup(&ok)).is_ok(), "{loopback}");
        }
    }

    #[test]
    fn an_api_url_without_a_host_is_refused() {
        for url in ["http://", "http://:8080"] {
            let err = Settings::from_lookup(lookup(&[
                ("IRONFLOW_API_URL", url),
                ("IRONFLOW_WORKER_TOKEN", "t"),
            ]))
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    ConfigError::Invalid {
                        variable: "IRONFLOW_API_URL",
                        ..
                    }
                ),
                "{url}: {err:?}"
            );
        }
    }

    #[test]
    fn every_bad_variable_is_reported_at_once() {
        let err = Settings::from_lookup(lookup(&[
            ("IRONFLOW_API_URL", "ftp://x"),
            ("IRONFLOW_WORKER_TOKEN", "has space"),
            ("IRONFLOW_MAX_RUNS_PER_INVOCATION", "0"),
            ("IRONFLOW_POISON_TABLE", "x"),
        ]))
        .unwrap_err();
        let ConfigError::Several(errors) = &err else {
            panic!("expected several errors, got {err:?}");
        };
        let variables: Vec<&str> = errors
            .iter()
            .map(|e| match e {
                ConfigError::Missing { variable, .. }
                | ConfigError::Invalid { variable, .. }
                | ConfigError::Unusable { variable, .. } => *variable,
                ConfigError::Several(_) => "nested",
            })
            .collect();
        assert_eq!(
            variables,
            [
                "IRONFLOW_API_URL",
                "IRONFLOW_WORKER_TOKEN",
                "IRONFLOW_MAX_RUNS_PER_INVOCATION",
                "IRONFLOW_POISON_TABLE"
            ]
        );
        let text = err.to_string();
        assert!(text.starts_with("4 environment variables are wrong: 1) environment variable IRONFLOW_API_URL is invalid"), "{text}");
        assert!(
            text.contains("; 4) environment variable IRONFLOW_POISON_TABLE"),
            "{text}"
        );
        assert!(!text.contains("has space"), "the token leaked: {text}");
        // One bad variable is reported alone, as before.
        assert!(matches!(
            Settings::from_lookup(lookup(&[("IRONFLOW_WORKER_TOKEN", "t")])),
            Err(ConfigError::Missing {
                variable: "IRONFLOW_API_URL",
                ..
            })
        ));
    }

    /// The settings of `BASE` and `pairs`, or the error's text.
    fn with(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        let mut vars = BASE.to_vec();
        vars.extend_from_slice(pairs);
        Settings::from_lookup(lookup(&vars)).map_err(|e| e.to_string())
    }

    #[test]
    fn names_are_unique_and_every_row_s_default_is_settings_new_s_and_accepted() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.variable()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len());
        let s = Settings::new("https://api.example.com", WorkerToken::new("t"));
        for v in VARIABLES {
            assert!(
                v.check(&s).is_ok(),
                "{}: its default is refused",
                v.variable()
            );
        }
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(
            s.max_runs_per_invocation,
            table::MAX_RUNS_PER_INVOCATION.default
        );
        assert_eq!(s.lease_ttl, DEFAULT_LEASE_TTL);
    }

    /// The documentation of each public method of the builder, its `///` lines joined.
    fn setter_docs() -> HashMap<String, String> {
        let builder = include_str!("../builder.rs");
        let mut docs = HashMap::new();
        let mut doc = Vec::new();
        for line in builder.lines().map(str::trim) {
            if let Some(text) = line.strip_prefix("///") {
                doc.push(text.trim());
                continue;
            }
            let name = ["pub fn ", "pub async fn "]
                .iter()
                .find_map(|f| line.strip_prefix(f))
                .and_then(|rest| rest.split(['(', '<']).next());
            if let Some(name) = name {
                docs.insert(name.to_string(), doc.join(" "));
            }
            if !line.starts_with("#[") {
                doc.clear();
            }
        }
        docs
    }

    #[test]
    fn every_setter_documents_its_rows() {
        let docs = setter_docs();
        let mut wrong = Vec::new();
        for v in VARIABLES {
            let line = v.doc_line();
            match docs.get(v.setter()) {
                None => wrong.push(format!(
                    "{}: no builder method {}",
                    v.variable(),
                    v.setter()
                )),
                Some(doc) if !doc.contains(&line) => {
                    wrong.push(format!(
                        "{}: end its documentation with: {line}",
                        v.setter()
                    ));
                }
                Some(_) => {}
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_variable_that_is_not_utf8_is_refused_and_named_never_read_as_unset() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(b"ironflow-\xff-poison".to_vec());
        let token = || OsString::from_vec(b"s3cr3t-\xfe".to_vec());
        let err = os_lookup(|name| match name {
            "IRONFLOW_POISON_TABLE" => Some(bad()),
            "IRONFLOW_WORKER_TOKEN" => Some(token()),
            "IRONFLOW_API_URL" => Some("https://api.example.com".into()),
            _ => None,
        })
        .err()
        .expect("refused");
        let text = err.to_string();
        assert!(text.contains("IRONFLOW_POISON_TABLE"), "{text}");
        assert!(text.contains("IRONFLOW_WORKER_TOKEN"), "{text}");
        assert!(text.contains("UTF-8"), "{text}");
        assert!(!text.contains("s3cr3t"), "the token leaked: {text}");
        let ok = os_lookup(|name| (name == "IRONFLOW_CONCURRENCY").then(|| "3".into())).unwrap();
        assert_eq!(ok("IRONFLOW_CONCURRENCY").as_deref(), Some("3"));
    }

    #[test]
    fn port_0_is_refused_in_every_url() {
        for (variable, value) in [
            ("IRONFLOW_API_URL", "https://api.example.com:0"),
            ("IRONFLOW_HEARTBEAT_URL", "https://hc-ping.com:0/abc"),
            (
                "IRONFLOW_WAKE_QUEUE_URL",
                "https://sqs.eu-west-1.amazonaws.com:0/123456789012/q",
            ),
        ] {
            let err = with(&[(variable, value)]).expect_err(value);
            assert!(err.contains(variable) && err.contains("port"), "{err}");
        }
        assert!(with(&[("IRONFLOW_API_URL", "https://api.example.com:8443")]).is_ok());
    }

    #[test]
    fn a_queue_url_must_be_one() {
        for good in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/ironflow-wake",
            "http://127.0.0.1:5055/123456789012/wake-0a1b",
            "https://localhost:4566/000000000000/q_1",
        ] {
            assert!(with(&[("IRONFLOW_WAKE_QUEUE_URL", good)]).is_ok(), "{good}");
        }
        for bad in [
            "https://sqs.eu-west-1.amazonaws.com/",
            "https://sqs.eu-west-1.amazonaws.com/ironflow-wake",
            "https://sqs.eu-west-1.amazonaws.com/1234/q",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/q/extra",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/bad%20name",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/q?x=1",
            "arn:aws:sqs:eu-west-1:123456789012:q",
            "ftp://sqs.eu-west-1.amazonaws.com/123456789012/q",
        ] {
            let err = with(&[("IRONFLOW_WAKE_QUEUE_URL", bad)]).expect_err(bad);
            assert!(
                err.contains("IRONFLOW_WAKE_QUEUE_URL") && err.contains("SQS queue URL"),
                "{err}"
            );
        }
        let fifo = "https://sqs.eu-west-1.amazonaws.com/123456789012/wake.fifo";
        let err = with(&[("IRONFLOW_WAKE_QUEUE_URL", fifo)]).unwrap_err();
        assert!(
            err.contains("FIFO") && err.contains("DelaySeconds"),
            "{err}"
        );
    }

    #[test]
    fn a_metrics_namespace_cloudwatch_would_drop_is_refused() {
        for good in ["ironflow-lambda", "Team/App #1", "a:b", "x.y_z"] {
            let s = with(&[("IRONFLOW_METRICS_NAMESPACE", good)]).unwrap();
            assert_eq!(s.metrics_namespace, good);
        }
        let long = "n".repeat(256);
        for bad in [
            "ironflow-météo",
            "AWS/Lambda",
            ":x",
            "a\tb",
            "a,b",
            long.as_str(),
        ] {
            let err = with(&[("IRONFLOW_METRICS_NAMESPACE", bad)]).expect_err(bad);
            assert!(
                err.contains("IRONFLOW_METRICS_NAMESPACE") && err.contains("CloudWatch"),
                "{err}"
            );
        }
        // The builder's value is checked by the same row.
        let mut s = Settings::new("https://api.example.com", WorkerToken::new("t"));
        s.metrics_namespace = "ironflow-météo".into();
        let problems = s.validate();
        assert_eq!(
            problems.first().map(|p| p.setter),
            Some("metrics_namespace")
        );
    }

    #[test]
    fn a_heartbeat_url_follows_the_api_url_s_rule_on_plain_http_and_is_never_shown() {
        let remote = "http://hc.example.com/ping/hb-s3cret";
        let err = with(&[("IRONFLOW_HEARTBEAT_URL", remote)]).unwrap_err();
        assert!(
            err.contains("IRONFLOW_HEARTBEAT_URL") && err.contains("https://"),
            "{err}"
        );
        assert!(
            !err.contains("hb-s3cret"),
            "the heartbeat URL leaked: {err}"
        );
        let opted = with(&[
            ("IRONFLOW_HEARTBEAT_URL", remote),
            ("IRONFLOW_ALLOW_INSECURE_HTTP", "true"),
        ]);
        assert_eq!(opted.unwrap().heartbeat_url.as_deref(), Some(remote));
        for ok in ["http://127.0.0.1:9/x", "https://hc-ping.com/abc"] {
            assert!(with(&[("IRONFLOW_HEARTBEAT_URL", ok)]).is_ok(), "{ok}");
        }
        let err = with(&[("IRONFLOW_HEARTBEAT_URL", "https:// hc-s3cret")]).unwrap_err();
        assert!(!err.contains("hc-s3cret"), "{err}");
    }

    #[test]
    fn a_secret_pasted_into_an_arn_variable_is_never_shown() {
        for variable in [
            "IRONFLOW_WORKER_TOKEN_SECRET_ARN",
            "IRONFLOW_WEBHOOK_SECRET_ARN",
            "IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN",
        ] {
            let err = with(&[(variable, "pasted-s3cret-value")]).unwrap_err();
            assert!(err.contains(variable) && err.contains("ARN"), "{err}");
            assert!(!err.contains("pasted-s3cret"), "the value leaked: {err}");
        }
        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:t-AbC123";
        let s = with(&[("IRONFLOW_WEBHOOK_SECRET_ARN", arn)]).unwrap();
        assert_eq!(s.webhook_secret_arn.as_deref(), Some(arn));
        let s = with(&[("IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN", arn)]).unwrap();
        assert_eq!(s.anthropic_api_key_secret_arn.as_deref(), Some(arn));
    }

    #[test]
    fn a_worker_id_prefix_the_api_would_trim_is_refused() {
        let mut s = Settings::new("https://api.example.com", WorkerToken::new("t"));
        s.worker_id_prefix = " lambda".into();
        let problems = s.validate();
        assert_eq!(problems.first().map(|p| p.setter), Some("worker_id_prefix"));
        s.worker_id_prefix = "lam\nbda".into();
        assert_eq!(
            s.validate().first().map(|p| p.setter),
            Some("worker_id_prefix")
        );
    }

    #[test]
    fn a_misspelt_variable_is_refused_naming_the_one_it_misspells() {
        let names = [
            "IRONFLOW_POISON_TABEL",
            "IRONFLOW_CONCURENCY",
            "IRONFLOW_POISON_TABLE",
            "IRONFLOW_TEST_MOTO_ENDPOINT",
            "IRONFLOW_CHAOS_RUNS",
            "PATH",
        ]
        .map(String::from);
        let errors = misspelt(&names);
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{text:?}");
        assert!(
            text[0].contains("IRONFLOW_POISON_TABEL") && text[0].contains("IRONFLOW_POISON_TABLE"),
            "{text:?}"
        );
        assert!(
            text[1].contains("IRONFLOW_CONCURENCY") && text[1].contains("IRONFLOW_CONCURRENCY"),
            "{text:?}"
        );
        assert_eq!(edits("kitten", "sitting"), 3);
        assert_eq!(edits("", "ab"), 2);
    }

    #[test]
    fn token_never_rendered() {
        let s = Settings::from_lookup(lookup(&BASE)).unwrap();
        assert!(!format!("{s:?}").contains("s3cr3t"));
        let err = Settings::from_lookup(lookup(&[("IRONFLOW_API_URL", "ftp://x")])).unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"));
    }
}
