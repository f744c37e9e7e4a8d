//! Every tunable of the worker, each defined once.
//!
//! [`VARIABLES`] (the environment variable, the builder method it mirrors, its meaning, its
//! default and its parser) drives the parsing of the environment ([`Settings::from_lookup`]) and
//! the README's configuration table (a test checks that they agree, row for row).
//! [`Settings::validate`] checks what no single value can (a refresh interval below the lease
//! TTL, a margin below the function timeout...), for the environment and the builder alike.
//! Every error names the variable, what was expected and (except for secrets) what was found;
//! the worker token never appears in an error, a log line or a `Debug` rendering.

mod role;
mod table;
mod url;
mod validate;
mod wake;

use std::fmt;
use std::time::Duration;

pub use role::{FUNCTION_ROLE_VAR, FunctionRole, ParseFunctionRoleError};
pub use table::{VARIABLES, Variable, is_namespace, is_table_name_or_arn};
pub use url::api_url_problem;
use url::without_userinfo;
pub use wake::{
    DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY, MAX_WAKE_DELAY,
    MAX_WAKEUPS_PER_INVOCATION_LIMIT, WakeSettings,
};

use crate::poison::{DEFAULT_COOLDOWN, DEFAULT_THRESHOLD, PoisonMode, PoisonPolicy};

/// Default runs claimed per invocation (N).
pub const DEFAULT_MAX_RUNS_PER_INVOCATION: usize = 8;
/// Default number of runs executing at once, as the reference worker.
pub const DEFAULT_CONCURRENCY: usize = 2;
/// Most runs one process may execute at once, M × C: 4096 (each has an execution thread).
pub const MAX_RUNS_PER_PROCESS: usize = 4096;
/// Default run timeout, as the reference worker: 30 minutes.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default margin before the invocation deadline: 10 s, time to hand runs back with retries
/// when the API fails.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// Default minimum time before the cutoff for a claim: 2 s.
pub const DEFAULT_MIN_CLAIM_BUDGET: Duration = Duration::from_secs(2);
/// Default threshold of claim-ahead: a claim's round trip at least 20 % of a run's execution
/// time.
pub const DEFAULT_CLAIM_AHEAD_PERCENT: u32 = 20;
/// Default function timeout assumed when none is configured: Lambda's maximum, 900 s.
pub const DEFAULT_FUNCTION_TIMEOUT: Duration = Duration::from_secs(900);
/// Default lease TTL, as the reference worker: 90 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(90);
/// Default lease refresh interval, as the reference worker: 30 s.
pub const DEFAULT_LEASE_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// Default prefix of worker ids.
pub const DEFAULT_WORKER_ID_PREFIX: &str = "lambda";
/// Default namespace of the poison-pill table's keys when `AWS_LAMBDA_FUNCTION_NAME` is unset.
pub const DEFAULT_POISON_NAMESPACE: &str = "ironflow";
/// Longest accepted poison-pill namespace, in bytes.
pub const MAX_POISON_NAMESPACE_LEN: usize = 200;
/// Default number of handbacks in a row without a completed step before a run is failed.
pub const DEFAULT_MAX_HANDBACKS_WITHOUT_PROGRESS: u32 = 3;
/// Default CloudWatch namespace of the EMF metrics.
pub const DEFAULT_METRICS_NAMESPACE: &str = "ironflow-lambda";

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
pub const WORKER_TOKEN_SECRET_ARN_VAR: &str = "IRONFLOW_WORKER_TOKEN_SECRET_ARN";
/// The environment variable holding the worker token itself.
pub const WORKER_TOKEN_VAR: &str = "IRONFLOW_WORKER_TOKEN";

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

/// The variable holding the webhook receiver's secret itself.
pub const WEBHOOK_SECRET_VAR: &str = "IRONFLOW_WEBHOOK_SECRET";
/// The variable naming the Secrets Manager secret that holds it.
pub const WEBHOOK_SECRET_ARN_VAR: &str = "IRONFLOW_WEBHOOK_SECRET_ARN";
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
    /// A variable is set to something this crate cannot parse.
    #[error("environment variable {variable} is invalid: expected {expected}, found {found:?}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// The expected form.
        expected: &'static str,
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
/// fields are described by [`VARIABLES`] (one variable each, the builder method named there).
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
    pub max_capacity_wait: Duration,
    /// Never logged: it usually embeds a secret.
    pub heartbeat_url: Option<String>,
    pub emulated_invocation: Option<Duration>,
    pub wake_queue_url: Option<String>,
    pub max_wakeups_per_invocation: usize,
    pub wake_delay: Duration,
    pub metrics_namespace: String,
    /// The webhook receiver's secret; `None`: the receiver is off. Never logged.
    pub webhook_secret: Option<WebhookSecret>,
    /// What the function serves (`IRONFLOW_FUNCTION_ROLE`): default [`FunctionRole::Worker`].
    pub function_role: FunctionRole,
}

impl Settings {
    /// Settings with every default, for `api_url` and `worker_token`.
    pub fn new(api_url: &str, worker_token: WorkerToken) -> Self {
        Self {
            api_url: api_url.to_string(),
            allow_insecure_http: false,
            worker_token,
            max_runs_per_invocation: DEFAULT_MAX_RUNS_PER_INVOCATION,
            concurrency: DEFAULT_CONCURRENCY,
            concurrent_invocations: 1,
            run_timeout: DEFAULT_RUN_TIMEOUT,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
            min_claim_budget: DEFAULT_MIN_CLAIM_BUDGET,
            claim_ahead_percent: DEFAULT_CLAIM_AHEAD_PERCENT,
            function_timeout: DEFAULT_FUNCTION_TIMEOUT,
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_refresh_interval: DEFAULT_LEASE_REFRESH_INTERVAL,
            tags: Vec::new(),
            worker_id_prefix: DEFAULT_WORKER_ID_PREFIX.to_string(),
            poison: PoisonPolicy {
                threshold: DEFAULT_THRESHOLD,
                cooldown: DEFAULT_COOLDOWN,
            },
            poison_table: None,
            poison_namespace: DEFAULT_POISON_NAMESPACE.to_string(),
            poison_mode: PoisonMode::Fail,
            max_handbacks_without_progress: DEFAULT_MAX_HANDBACKS_WITHOUT_PROGRESS,
            max_capacity_wait: ironflow_engine::accounts::DEFAULT_MAX_CAPACITY_WAIT,
            heartbeat_url: None,
            emulated_invocation: None,
            wake_queue_url: None,
            max_wakeups_per_invocation: DEFAULT_MAX_WAKEUPS_PER_INVOCATION,
            wake_delay: DEFAULT_WAKE_DELAY,
            metrics_namespace: DEFAULT_METRICS_NAMESPACE.to_string(),
            webhook_secret: None,
            function_role: FunctionRole::Worker,
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
    /// [`ConfigError`] naming the variable that is missing, malformed or cannot work
    /// ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
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
        let mut s = Self::new("", worker_token.unwrap_or_else(|| WorkerToken::new("")));
        if let Some(function) = get("AWS_LAMBDA_FUNCTION_NAME")
            && get("IRONFLOW_POISON_NAMESPACE").is_none()
        {
            s.poison_namespace = function;
        }
        // Every variable is checked, and every problem reported at once: a cold start that fails
        // on a bad environment names all of them in one log line.
        let mut errors = Vec::new();
        for v in VARIABLES {
            let Some(raw) = get(v.name) else { continue };
            if let Err(bad) = (v.apply)(&mut s, &raw) {
                let found = match bad.found {
                    table::Found::Raw if v.name == "IRONFLOW_API_URL" => without_userinfo(&raw),
                    table::Found::Raw => raw,
                    table::Found::Hidden(note) => note.to_string(),
                };
                errors.push(ConfigError::Invalid {
                    variable: v.name,
                    expected: bad.expected,
                    found,
                });
            }
        }
        if s.api_url.is_empty() {
            errors.insert(
                0,
                ConfigError::Missing {
                    variable: "IRONFLOW_API_URL",
                    expected: "the ironflow API's base URL, e.g. https://ironflow.example.com",
                },
            );
        } else if let Some(expected) = api_url_problem(&s.api_url, s.allow_insecure_http) {
            errors.push(ConfigError::Invalid {
                variable: "IRONFLOW_API_URL",
                expected,
                found: without_userinfo(&s.api_url),
            });
        }
        if s.worker_token.expose().is_empty() && !errors_name(&errors, WORKER_TOKEN_VAR) {
            errors.push(ConfigError::Missing {
                variable: WORKER_TOKEN_VAR,
                expected: "the ironflow API's worker token (WORKER_TOKEN on the API), or \
                           IRONFLOW_WORKER_TOKEN_SECRET_ARN naming a Secrets Manager secret \
                           that holds it",
            });
        }
        if get("IRONFLOW_POISON_NAMESPACE").is_none() && !is_namespace(&s.poison_namespace) {
            errors.push(ConfigError::Invalid {
                variable: "AWS_LAMBDA_FUNCTION_NAME (default of IRONFLOW_POISON_NAMESPACE)",
                expected: "1 to 200 bytes without '#' or control characters",
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
        .position(|v| v.name == variable || variable.contains(v.name))
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
                let meaning = v.meaning.split_whitespace().collect::<Vec<_>>().join(" ");
                (v.name.to_string(), meaning, v.default.to_string())
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
                expected: "a whole number greater than 0",
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
                expected: "a smaller whole number (it is out of range)",
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
            "https://sqs.eu-west-1.amazonaws.com/1/q",
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

    #[test]
    fn token_never_rendered() {
        let s = Settings::from_lookup(lookup(&BASE)).unwrap();
        assert!(!format!("{s:?}").contains("s3cr3t"));
        let err = Settings::from_lookup(lookup(&[("IRONFLOW_API_URL", "ftp://x")])).unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"));
    }
}
