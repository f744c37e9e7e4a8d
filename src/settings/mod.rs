//! Every tunable of the worker, each defined once: the [`Settings`], read from the environment
//! ([`Settings::from_env`]) or set by the builder's methods, and checked either way
//! ([`Settings::validate`]); an error names the variable, what was expected and (except for
//! secrets) what was found ([`ConfigError`]).
//!
//! What an operator handles here: the secret newtypes ([`WorkerToken`], [`WebhookSecret`]),
//! which never print themselves; the variables that name a secret or the function's role
//! (`*_VAR`); the function's role ([`FunctionRole`]); the wake-up settings ([`WakeSettings`]).
//! Each variable, its default and its bounds: the README's configuration table. How a setting
//! is added (a row of `table/`):
//! [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod defaults;
mod env;
mod error;
mod role;
mod row;
mod rules;
mod secret;
pub(crate) mod table;
mod url;
mod validate;
mod value;
mod wake;

use std::time::Duration;

pub(crate) use defaults::*;
#[cfg(feature = "test-support")]
pub use defaults::{
    DEFAULT_CLAIM_AHEAD_PERCENT, DEFAULT_DEADLINE_MARGIN, DEFAULT_MIN_CLAIM_BUDGET,
    DEFAULT_STEP_DURATION,
};
use env::position;
pub(crate) use env::{environment, is_set};
pub use error::{ConfigError, Problem};
pub use role::{FUNCTION_ROLE_VAR, FunctionRole, ParseFunctionRoleError};
pub(crate) use rules::{SECRET_ARN_EXPECTED, is_namespace, is_secret_arn, is_token};
pub use secret::{
    ANTHROPIC_API_KEY_SECRET_ARN_VAR, MIN_WEBHOOK_SECRET_LEN, WEBHOOK_SECRET_ARN_VAR,
    WEBHOOK_SECRET_VAR, WORKER_TOKEN_SECRET_ARN_VAR, WORKER_TOKEN_VAR, WebhookSecret, WorkerToken,
};
pub(crate) use table::{VARIABLES, Variable};
pub use wake::WakeSettings;
pub(crate) use wake::{
    DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY, MAX_WAKE_DELAY,
    MAX_WAKEUPS_PER_INVOCATION_LIMIT,
};

use crate::poison::{PoisonMode, PoisonPolicy};

/// Every tunable of the worker, with the reference worker's defaults where it has one.
///
/// Each field is one environment variable (named in its documentation) and one builder
/// method, whose documentation ends with the variable's default and bounds; the README's
/// configuration table lists them all, and the table of the code (`src/settings/table/`)
/// defines each once. Durations are [`Duration`]s; the variable's unit is named.
///
/// Built by [`Settings::from_env`] or [`Settings::new`]; handed to
/// [`LambdaWorkerBuilder::from_settings`](crate::LambdaWorkerBuilder::from_settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The ironflow API's base URL, e.g. `https://ironflow.example.com` (`IRONFLOW_API_URL`, required;
    /// [`LambdaWorkerBuilder::new`](crate::LambdaWorkerBuilder::new)).
    pub api_url: String,
    /// Whether an `http://` API URL other than loopback is accepted (`IRONFLOW_ALLOW_INSECURE_HTTP`;
    /// [`LambdaWorkerBuilder::allow_insecure_http`](crate::LambdaWorkerBuilder::allow_insecure_http)).
    pub allow_insecure_http: bool,
    /// The API's worker token (`IRONFLOW_WORKER_TOKEN`, or the secret `IRONFLOW_WORKER_TOKEN_SECRET_ARN`
    /// names; required). Never logged.
    pub worker_token: WorkerToken,
    /// Runs claimed per invocation, N (`IRONFLOW_MAX_RUNS_PER_INVOCATION`;
    /// [`LambdaWorkerBuilder::max_runs_per_invocation`](crate::LambdaWorkerBuilder::max_runs_per_invocation)).
    pub max_runs_per_invocation: usize,
    /// Runs one invocation executes at once, C (`IRONFLOW_CONCURRENCY`;
    /// [`LambdaWorkerBuilder::concurrency`](crate::LambdaWorkerBuilder::concurrency)).
    pub concurrency: usize,
    /// Invocations one process serves at once, M (`AWS_LAMBDA_MAX_CONCURRENCY`, set by Lambda
    /// Managed Instances; [`LambdaWorkerBuilder::concurrent_invocations`](crate::LambdaWorkerBuilder::concurrent_invocations)).
    pub concurrent_invocations: usize,
    /// A run's execution time before it times out, whole seconds (`IRONFLOW_RUN_TIMEOUT_SECS`;
    /// [`LambdaWorkerBuilder::run_timeout`](crate::LambdaWorkerBuilder::run_timeout)).
    pub run_timeout: Duration,
    /// Time kept before the invocation's deadline to hand runs back, milliseconds
    /// (`IRONFLOW_DEADLINE_MARGIN_MS`; [`LambdaWorkerBuilder::deadline_margin`](crate::LambdaWorkerBuilder::deadline_margin)).
    pub deadline_margin: Duration,
    /// The least time before the cutoff a claim needs, milliseconds (`IRONFLOW_MIN_CLAIM_BUDGET_MS`;
    /// [`LambdaWorkerBuilder::min_claim_budget`](crate::LambdaWorkerBuilder::min_claim_budget)).
    pub min_claim_budget: Duration,
    /// Claim-ahead's threshold, in % of a run's execution time (`IRONFLOW_CLAIM_AHEAD_PERCENT`;
    /// [`LambdaWorkerBuilder::claim_ahead_percent`](crate::LambdaWorkerBuilder::claim_ahead_percent)).
    pub claim_ahead_percent: u32,
    /// The function's configured timeout, whole seconds (`IRONFLOW_FUNCTION_TIMEOUT_SECS`;
    /// [`LambdaWorkerBuilder::function_timeout`](crate::LambdaWorkerBuilder::function_timeout)).
    pub function_timeout: Duration,
    /// The lease TTL asked of the API, whole seconds (`IRONFLOW_LEASE_TTL_SECS`;
    /// [`LambdaWorkerBuilder::lease_ttl`](crate::LambdaWorkerBuilder::lease_ttl)).
    pub lease_ttl: Duration,
    /// How often the lease is refreshed, whole seconds (`IRONFLOW_LEASE_REFRESH_INTERVAL_SECS`;
    /// [`LambdaWorkerBuilder::lease_refresh_interval`](crate::LambdaWorkerBuilder::lease_refresh_interval)).
    pub lease_refresh_interval: Duration,
    /// The worker's tags, which select the runs it claims (`IRONFLOW_WORKER_TAGS`, comma-separated;
    /// [`LambdaWorkerBuilder::tags`](crate::LambdaWorkerBuilder::tags)).
    pub tags: Vec<String>,
    /// The prefix of the worker id each invocation claims under (`IRONFLOW_WORKER_ID_PREFIX`;
    /// [`LambdaWorkerBuilder::worker_id_prefix`](crate::LambdaWorkerBuilder::worker_id_prefix)).
    pub worker_id_prefix: String,
    /// The poison pill's threshold and cooldown (`IRONFLOW_POISON_THRESHOLD`,
    /// `IRONFLOW_POISON_COOLDOWN_SECS`; [`LambdaWorkerBuilder::poison_threshold`](crate::LambdaWorkerBuilder::poison_threshold),
    /// [`LambdaWorkerBuilder::poison_cooldown`](crate::LambdaWorkerBuilder::poison_cooldown)).
    pub poison: PoisonPolicy,
    /// The DynamoDB table of the poison-pill counters, a name or an ARN; `None`: the in-memory table
    /// (`IRONFLOW_POISON_TABLE`; [`LambdaWorkerBuilder::connect_poison_table`](crate::LambdaWorkerBuilder::connect_poison_table)).
    pub poison_table: Option<String>,
    /// The namespace of this function's keys in the poison-pill table (`IRONFLOW_POISON_NAMESPACE`,
    /// else `AWS_LAMBDA_FUNCTION_NAME`; [`LambdaWorkerBuilder::poison_namespace`](crate::LambdaWorkerBuilder::poison_namespace)).
    pub poison_namespace: String,
    /// What a blocked workflow's runs get (`IRONFLOW_POISON_MODE`;
    /// [`LambdaWorkerBuilder::poison_mode`](crate::LambdaWorkerBuilder::poison_mode)).
    pub poison_mode: PoisonMode,
    /// Handbacks in a row without a completed step before a run is failed
    /// (`IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS`;
    /// [`LambdaWorkerBuilder::max_handbacks_without_progress`](crate::LambdaWorkerBuilder::max_handbacks_without_progress)).
    pub max_handbacks_without_progress: u32,
    /// Whether a step that would not fit before the cutoff is deferred to the next invocation
    /// (`IRONFLOW_CUTOFF_AWARE_STARTS`;
    /// [`LambdaWorkerBuilder::cutoff_aware_starts`](crate::LambdaWorkerBuilder::cutoff_aware_starts)).
    pub cutoff_aware_starts: bool,
    /// The expected duration of a step never seen, seconds (`IRONFLOW_DEFAULT_STEP_SECS`;
    /// [`LambdaWorkerBuilder::default_step_duration`](crate::LambdaWorkerBuilder::default_step_duration)).
    pub default_step_duration: Duration,
    /// The longest wait for provider capacity a run sleeps through, whole seconds
    /// (`IRONFLOW_MAX_CAPACITY_WAIT_SECS`;
    /// [`LambdaWorkerBuilder::max_capacity_wait`](crate::LambdaWorkerBuilder::max_capacity_wait)).
    pub max_capacity_wait: Duration,
    /// The least window capacity wake-ups are spread over, whole seconds
    /// (`IRONFLOW_CAPACITY_SPREAD_SECS`; [`LambdaWorkerBuilder::capacity_spread`](crate::LambdaWorkerBuilder::capacity_spread)).
    pub capacity_spread: Duration,
    /// The most window capacity wake-ups are spread over, whole seconds
    /// (`IRONFLOW_CAPACITY_SPREAD_MAX_SECS`; [`LambdaWorkerBuilder::capacity_spread`](crate::LambdaWorkerBuilder::capacity_spread)).
    pub capacity_spread_max: Duration,
    /// The URL pinged after each invocation, `None`: none (`IRONFLOW_HEARTBEAT_URL`;
    /// [`LambdaWorkerBuilder::heartbeat_url`](crate::LambdaWorkerBuilder::heartbeat_url)). Never logged: it usually embeds a
    /// secret.
    pub heartbeat_url: Option<String>,
    /// An invocation length to emulate instead of the event's deadline, whole seconds; `None`: the
    /// real one (`IRONFLOW_EMULATED_INVOCATION_SECS`;
    /// [`LambdaWorkerBuilder::emulated_invocation`](crate::LambdaWorkerBuilder::emulated_invocation)).
    pub emulated_invocation: Option<Duration>,
    /// The SQS queue wake-ups are sent to; `None`: none sent (`IRONFLOW_WAKE_QUEUE_URL`;
    /// [`LambdaWorkerBuilder::wake_ups`](crate::LambdaWorkerBuilder::wake_ups)).
    pub wake_queue_url: Option<String>,
    /// Most wake-up messages one invocation sends (`IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`;
    /// [`WakeSettings::max_per_invocation`]).
    pub max_wakeups_per_invocation: usize,
    /// The delay of a wake-up sent after a handback, whole seconds (`IRONFLOW_WAKE_DELAY_SECS`;
    /// [`WakeSettings::handback_delay`]).
    pub wake_delay: Duration,
    /// The CloudWatch namespace of the EMF metrics (`IRONFLOW_METRICS_NAMESPACE`;
    /// [`LambdaWorkerBuilder::metrics_namespace`](crate::LambdaWorkerBuilder::metrics_namespace)).
    pub metrics_namespace: String,
    /// The webhook receiver's secret; `None`: the receiver is off (`IRONFLOW_WEBHOOK_SECRET`, or the
    /// secret `IRONFLOW_WEBHOOK_SECRET_ARN` names;
    /// [`LambdaWorkerBuilder::webhook_secret`](crate::LambdaWorkerBuilder::webhook_secret)). Never logged.
    pub webhook_secret: Option<WebhookSecret>,
    /// The ARN the worker token was read from (`IRONFLOW_WORKER_TOKEN_SECRET_ARN`), if any
    /// ([`LambdaWorkerBuilder::from_env_and_secrets`](crate::LambdaWorkerBuilder::from_env_and_secrets)).
    pub worker_token_secret_arn: Option<String>,
    /// The ARN the webhook secret was read from (`IRONFLOW_WEBHOOK_SECRET_ARN`), if any
    /// ([`LambdaWorkerBuilder::from_env_and_secrets`](crate::LambdaWorkerBuilder::from_env_and_secrets)).
    pub webhook_secret_arn: Option<String>,
    /// The ARN the Anthropic API key is read from (`IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN`), if
    /// any ([`crate::AnthropicSecretProvider`]).
    pub anthropic_api_key_secret_arn: Option<String>,
    /// How far an event's `at` may be from now, either way, for the webhook receiver to take it,
    /// whole seconds (`IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS`;
    /// [`LambdaWorkerBuilder::webhook_replay_window`](crate::LambdaWorkerBuilder::webhook_replay_window)).
    pub webhook_replay_window: Duration,
    /// What the function serves (`IRONFLOW_FUNCTION_ROLE`;
    /// [`LambdaWorkerBuilder::function_role`](crate::LambdaWorkerBuilder::function_role)).
    pub function_role: FunctionRole,
}

impl Settings {
    /// Settings with every default (each variable's default: the README's configuration table), for `api_url` and
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

    /// What cannot work in these settings (each named by its variable and builder method), in
    /// the order of the README's configuration table; empty when they can. The builder refuses settings with a
    /// problem, and so does [`Settings::from_lookup`].
    pub fn validate(&self) -> Vec<Problem> {
        validate::problems(self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;

    use super::env::{edits, misspelt, os_lookup};
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
                expected: "a whole number: this value is too large to be read".into(),
                found: "99999999999".into()
            }
        );
        // Any number of digits is too large, not malformed; the row's bounds are named.
        for (variable, raw, bounds) in [
            ("IRONFLOW_CONCURRENCY", "9".repeat(41), "greater than 0"),
            (
                "IRONFLOW_RUN_TIMEOUT_SECS",
                "18446744073709551616".to_string(),
                "at most 3153600000",
            ),
        ] {
            let mut vars = BASE.to_vec();
            vars.push((variable, raw.as_str()));
            let err = Settings::from_lookup(lookup(&vars))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(variable) && err.contains(bounds) && err.contains("too large"),
                "{err}"
            );
        }
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

    /// The error of `IRONFLOW_API_URL=url` (checked to be that variable's alone), as text.
    fn refused_api_url(url: &str) -> String {
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
        text
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
            let text = refused_api_url(url);
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
    fn an_api_url_with_a_query_or_a_fragment_is_refused() {
        for url in [
            "http://127.0.0.1:3711/?x=1",
            "https://api.example.com/?",
            "https://api.example.com#top",
            "https://api.example.com/base?token=abc#x",
        ] {
            let text = refused_api_url(url);
            assert!(text.contains("without a query"), "{url}: {text}");
        }
        let base = [
            ("IRONFLOW_API_URL", "https://api.example.com/ironflow/"),
            ("IRONFLOW_WORKER_TOKEN", "t"),
        ];
        assert!(Settings::from_lookup(lookup(&base)).is_ok());
    }

    #[test]
    fn an_api_url_without_a_host_is_refused() {
        for url in ["http://", "http://:8080"] {
            refused_api_url(url);
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
        let builder = concat!(
            include_str!("../builder/mod.rs"),
            include_str!("../builder/setters.rs"),
            include_str!("../builder/poison_table.rs"),
        );
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
        let with_credentials = "https://user:s3cret@sqs.eu-west-1.amazonaws.com/123456789012/q";
        let err = with(&[("IRONFLOW_WAKE_QUEUE_URL", with_credentials)]).unwrap_err();
        assert!(
            err.contains("IRONFLOW_WAKE_QUEUE_URL") && err.contains("without credentials"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("***@sqs.eu-west-1"), "{err}");
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
        let queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/q";
        let s = with(&[
            ("IRONFLOW_WEBHOOK_SECRET_ARN", arn),
            ("IRONFLOW_WAKE_QUEUE_URL", queue),
        ])
        .unwrap();
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

    #[test]
    fn a_webhook_variable_without_its_other_half_is_left_to_the_builder() {
        // A library's own waker (`.wake_ups`) or secret (`.webhook_secret`) may supply the
        // other half: only the builder knows (`BuildError::WebhookWithoutWakeQueue`).
        let secret = "a-receiver-secret-of-at-least-32-characters";
        with(&[("IRONFLOW_WEBHOOK_SECRET", secret)]).unwrap();
        with(&[("IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS", "60")]).unwrap();
    }

    #[test]
    fn every_message_reads_as_one_sentence() {
        // An empty token: its message once carried the indentation of a wrapped literal.
        let err = Settings::from_lookup(lookup(&[
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            ("IRONFLOW_WORKER_TOKEN", " "),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("IRONFLOW_WORKER_TOKEN_SECRET_ARN naming"),
            "{err}"
        );
        assert!(!err.contains("  "), "no run of spaces: {err}");
    }
}
