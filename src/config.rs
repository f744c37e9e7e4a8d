//! Environment variables → typed settings.
//!
//! Read once per cold start by [`Settings::from_env`]. Every error names the variable, what
//! was expected and (except for secrets) what was found; the worker token never appears in an
//! error, a log line or a `Debug` rendering.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `IRONFLOW_API_URL` | base URL of the ironflow API (`https://host[:port]`, without credentials; `http://` only to a loopback host, or with the next variable) | required |
//! | `IRONFLOW_ALLOW_INSECURE_HTTP` | `true`: accept a plain `http://` URL to a host that is not loopback (an API inside the VPC): the worker token then crosses the network in clear text | `false` |
//! | `IRONFLOW_WORKER_TOKEN` | the API's worker token | required, unless the next one is set |
//! | `IRONFLOW_WORKER_TOKEN_SECRET_ARN` | Secrets Manager secret holding the token ([`crate::secrets`]) | none |
//! | `IRONFLOW_MAX_RUNS_PER_INVOCATION` | runs one invocation claims at most (N) | 8 |
//! | `IRONFLOW_CONCURRENCY` | runs executing at once | 2 |
//! | `IRONFLOW_RUN_TIMEOUT_SECS` | a run attempt's limit, counted from its first start | 1800 |
//! | `IRONFLOW_DEADLINE_MARGIN_MS` | time kept free before the invocation deadline | 10000 |
//! | `IRONFLOW_MIN_CLAIM_BUDGET_MS` | no claim with less time than this before the cutoff | 2000 |
//! | `IRONFLOW_CLAIM_AHEAD_PERCENT` | claim one run ahead of a free slot while a claim's round trip is at least this % of a run's execution time ([`crate::claim_ahead`]); `0`: one claim at a time, into a free slot | 20 |
//! | `IRONFLOW_FUNCTION_TIMEOUT_SECS` | the function's configured timeout | 900 |
//! | `IRONFLOW_LEASE_TTL_SECS` | lease TTL requested on claim and refresh | 90 |
//! | `IRONFLOW_LEASE_REFRESH_INTERVAL_SECS` | lease refresh interval | 30 |
//! | `IRONFLOW_WORKER_TAGS` | comma-separated worker tags | none |
//! | `IRONFLOW_WORKER_ID_PREFIX` | prefix of the per-invocation worker id | `lambda` |
//! | `IRONFLOW_POISON_THRESHOLD` | consecutive failures that block a workflow | 3 |
//! | `IRONFLOW_POISON_COOLDOWN_SECS` | how long a blocked workflow stays blocked | 300 |
//! | `IRONFLOW_POISON_TABLE` | DynamoDB table of the poison-pill counters | none: in-memory table |
//! | `IRONFLOW_POISON_NAMESPACE` | key prefix in that table (no `#`) | `AWS_LAMBDA_FUNCTION_NAME`, else `ironflow` |
//! | `IRONFLOW_POISON_MODE` | `fail` or `defer`: what happens to runs of a blocked workflow | `fail` |
//! | `IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS` | handbacks in a row without a completed step before the run is failed | 3 |
//! | `IRONFLOW_MAX_CAPACITY_WAIT_SECS` | how long an agent step may wait for provider capacity | 21600 |
//! | `IRONFLOW_HEARTBEAT_URL` | dead man's switch pinged (HEAD) after each completed batch | none |
//! | `IRONFLOW_EMULATED_INVOCATION_SECS` | invocation length when `Context.deadline` has already passed, as under `cargo lambda watch`; never needed on Lambda | none |

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::poison::{DEFAULT_COOLDOWN, DEFAULT_THRESHOLD, PoisonMode, PoisonPolicy};
pub use crate::secrets::{WORKER_TOKEN_SECRET_ARN_VAR, WORKER_TOKEN_VAR};

/// Default runs claimed per invocation (N).
pub const DEFAULT_MAX_RUNS_PER_INVOCATION: usize = 8;
/// Default number of runs executing at once, as the reference worker.
pub const DEFAULT_CONCURRENCY: usize = 2;
/// Default run timeout, as the reference worker: 30 minutes.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default margin before the invocation deadline: 10 s. It leaves room for a handback whose
/// status write meets `ApiRunStore`'s retry backoff (1 + 2 + 4 s on a 5xx or a cut connection).
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// Default minimum time before the cutoff for a claim: 2 s.
pub const DEFAULT_MIN_CLAIM_BUDGET: Duration = Duration::from_secs(2);
/// Default threshold of claim-ahead ([`crate::claim_ahead`]): a claim's round trip at least
/// 20 % of a run's execution time.
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

/// The longest duration any setting takes: 100 years ([`crate::deadline::HORIZON`]), so that
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

/// What `IRONFLOW_API_URL` (or the builder's URL) must be, when it is not: `None` when it is a
/// usable base URL. Plain `http://` carries the worker token in clear text, so it is accepted
/// only to a loopback host (`127.0.0.0/8`, `::1`, `localhost`) or with `allow_insecure_http`
/// (`IRONFLOW_ALLOW_INSECURE_HTTP=true`).
pub fn api_url_problem(url: &str, allow_insecure_http: bool) -> Option<&'static str> {
    let parsed = reqwest::Url::parse(url).ok();
    let Some(parsed) = parsed.filter(|u| {
        !url.contains(char::is_whitespace) && matches!(u.scheme(), "http" | "https") && u.has_host()
    }) else {
        return Some(
            "an http:// or https:// URL with a host and, if any, a port from 1 to 65535, e.g. \
             https://ironflow.example.com",
        );
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some(
            "a URL without credentials (user:password@): the API authenticates workers by the \
             token in IRONFLOW_WORKER_TOKEN",
        );
    }
    let host = parsed.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if parsed.scheme() == "http" && !loopback && !allow_insecure_http {
        return Some(
            "an https:// URL: plain http:// would send the worker token in clear text; it is \
             accepted only to a loopback host, or with IRONFLOW_ALLOW_INSECURE_HTTP=true (an \
             API inside the VPC)",
        );
    }
    None
}

/// The API's worker token. Its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerToken(String);

impl WorkerToken {
    /// Wrap a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
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

/// A missing or malformed environment variable.
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
    /// A variable is set to something this crate cannot use.
    #[error("environment variable {variable} is invalid: expected {expected}, found {found:?}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// The expected form.
        expected: &'static str,
        /// The value found (never the value of a secret).
        found: String,
    },
    /// More than one of the variables [`Settings`] reads is missing or malformed: each of them,
    /// in the order of the module table. (The wake-up queue's variables, `crate::wake`, and the
    /// secret's ARN, `crate::secrets`, are checked apart, and so are the builder's checks
    /// across settings.)
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

/// Every tunable of the worker, with the reference worker's defaults where it has one.
///
/// Built by [`Settings::from_env`] or [`Settings::new`]; handed to
/// [`LambdaWorkerBuilder::from_settings`](crate::builder::LambdaWorkerBuilder::from_settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Base URL of the ironflow API (`IRONFLOW_API_URL`).
    pub api_url: String,
    /// Accept a plain `http://` API URL to a host that is not loopback
    /// (`IRONFLOW_ALLOW_INSECURE_HTTP`, default `false`).
    pub allow_insecure_http: bool,
    /// The worker token (`IRONFLOW_WORKER_TOKEN`, or the secret named by
    /// `IRONFLOW_WORKER_TOKEN_SECRET_ARN`).
    pub worker_token: WorkerToken,
    /// Runs one invocation claims at most (N).
    pub max_runs_per_invocation: usize,
    /// Runs executing at once.
    pub concurrency: usize,
    /// A run attempt's limit, counted from its first start, across invocations.
    pub run_timeout: Duration,
    /// Time kept free before the invocation deadline; the cutoff is `deadline − margin`.
    pub deadline_margin: Duration,
    /// No run is claimed with less than this left before the cutoff.
    pub min_claim_budget: Duration,
    /// One run is claimed ahead of a free slot while, on this instance, a claim's round trip
    /// is at least this percentage of a run's execution time (`IRONFLOW_CLAIM_AHEAD_PERCENT`);
    /// 0 claims one at a time, each into a free slot (no first claims sent together either).
    pub claim_ahead_percent: u32,
    /// The function's configured timeout; the margin must be below it.
    pub function_timeout: Duration,
    /// Lease TTL requested on claim and on every refresh.
    pub lease_ttl: Duration,
    /// How often a running run's lease is refreshed; below `lease_ttl`.
    pub lease_refresh_interval: Duration,
    /// Worker tags, validated and normalised at build time.
    pub tags: Vec<String>,
    /// Prefix of the worker id; each invocation claims as `<prefix>-<request id>-<random>`.
    pub worker_id_prefix: String,
    /// Poison-pill threshold and cooldown.
    pub poison: PoisonPolicy,
    /// The DynamoDB table of the poison-pill counters (`IRONFLOW_POISON_TABLE`, a table name
    /// or ARN); `None` uses the in-memory table (per Lambda instance).
    pub poison_table: Option<String>,
    /// Prefix of every key in the poison-pill table, so several functions can share one table
    /// (`IRONFLOW_POISON_NAMESPACE`; default the function's name, `AWS_LAMBDA_FUNCTION_NAME`,
    /// else `ironflow`). Non-empty, at most 200 bytes, no `#`.
    pub poison_namespace: String,
    /// What happens to runs of a blocked workflow (`IRONFLOW_POISON_MODE`, default `fail`).
    pub poison_mode: PoisonMode,
    /// Handbacks in a row without a completed step before the run is failed.
    pub max_handbacks_without_progress: u32,
    /// How long an agent step may wait for provider-account capacity.
    pub max_capacity_wait: Duration,
    /// Dead man's switch URL pinged with `HEAD` after each completed batch
    /// (`IRONFLOW_HEARTBEAT_URL`). Never logged: it usually embeds a secret.
    pub heartbeat_url: Option<String>,
    /// Invocation length used when `Context.deadline` has already passed
    /// (`IRONFLOW_EMULATED_INVOCATION_SECS`): `cargo lambda watch` sends a deadline in 1970.
    /// `None` (the default): a past deadline claims nothing. Lambda always sends a future
    /// deadline, so this never applies there.
    pub emulated_invocation: Option<Duration>,
    /// CloudWatch namespace of the EMF metrics (`IRONFLOW_METRICS_NAMESPACE`, default
    /// `ironflow-lambda`).
    pub metrics_namespace: String,
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
            metrics_namespace: "ironflow-lambda".to_string(),
        }
    }

    /// Settings from the process environment (see the module table).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable that is missing or malformed
    /// ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Settings from any variable lookup (the environment, a map in tests).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable that is missing or malformed
    /// ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup_with_token(lookup, None)
    }

    /// [`Settings::from_lookup`] with the worker token already known (read from Secrets
    /// Manager by [`crate::secrets::worker_token_from_lookup`]); `None` reads
    /// `IRONFLOW_WORKER_TOKEN`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable that is missing or malformed
    /// ([`ConfigError::Several`] listing each of them when there are more).
    pub fn from_lookup_with_token(
        lookup: impl Fn(&str) -> Option<String>,
        worker_token: Option<WorkerToken>,
    ) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };

        // Every variable is checked, and every problem reported at once: a cold start that
        // fails on a bad environment names all of them in one log line.
        let mut errors = Vec::new();
        let allow_insecure_http = match get("IRONFLOW_ALLOW_INSECURE_HTTP").as_deref() {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => true,
            Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => false,
            Some(v) => {
                errors.push(ConfigError::Invalid {
                    variable: "IRONFLOW_ALLOW_INSECURE_HTTP",
                    expected: "true or false",
                    found: v.to_string(),
                });
                false
            }
        };
        let api_url = get("IRONFLOW_API_URL").unwrap_or_default();
        if api_url.is_empty() {
            errors.push(ConfigError::Missing {
                variable: "IRONFLOW_API_URL",
                expected: "the ironflow API's base URL, e.g. https://ironflow.example.com",
            });
        } else if let Some(expected) = api_url_problem(&api_url, allow_insecure_http) {
            errors.push(ConfigError::Invalid {
                variable: "IRONFLOW_API_URL",
                expected,
                found: without_userinfo(&api_url),
            });
        }
        let token = worker_token
            .or_else(|| get("IRONFLOW_WORKER_TOKEN").map(WorkerToken::new))
            .unwrap_or_else(|| {
                errors.push(ConfigError::Missing {
                    variable: "IRONFLOW_WORKER_TOKEN",
                    expected: "the ironflow API's worker token (WORKER_TOKEN on the API), or \
                               IRONFLOW_WORKER_TOKEN_SECRET_ARN naming a Secrets Manager secret \
                               that holds it",
                });
                WorkerToken::new("")
            });

        // The token travels in an `Authorization` header: anything but visible ASCII would
        // fail every request later with an error that does not point here.
        if !token.expose().bytes().all(|b| b.is_ascii_graphic()) {
            errors.push(ConfigError::Invalid {
                variable: "IRONFLOW_WORKER_TOKEN",
                expected: "visible ASCII without spaces or line breaks (it is sent as a bearer token)",
                found: "(not shown: it is a secret)".to_string(),
            });
        }
        let mut s = Self::new(&api_url, token);
        s.allow_insecure_http = allow_insecure_http;
        let positive = "a whole number greater than 0";
        let whole = "a whole number (0 or more)";

        if let Some(v) = keep(
            &mut errors,
            parse::<usize>(&get, "IRONFLOW_MAX_RUNS_PER_INVOCATION", positive, 1),
        ) {
            s.max_runs_per_invocation = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<usize>(&get, "IRONFLOW_CONCURRENCY", positive, 1),
        ) {
            s.concurrency = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_RUN_TIMEOUT_SECS", positive, 1),
        ) {
            s.run_timeout = Duration::from_secs(v);
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_DEADLINE_MARGIN_MS", whole, 0),
        ) {
            s.deadline_margin = Duration::from_millis(v);
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_MIN_CLAIM_BUDGET_MS", whole, 0),
        ) {
            s.min_claim_budget = Duration::from_millis(v);
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u32>(&get, "IRONFLOW_CLAIM_AHEAD_PERCENT", whole, 0),
        ) {
            s.claim_ahead_percent = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_FUNCTION_TIMEOUT_SECS", positive, 1),
        ) {
            s.function_timeout = Duration::from_secs(v);
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_LEASE_TTL_SECS", positive, 1),
        ) {
            s.lease_ttl = Duration::from_secs(v);
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", positive, 1),
        ) {
            s.lease_refresh_interval = Duration::from_secs(v);
        }
        if let Some(v) = get("IRONFLOW_WORKER_TAGS") {
            s.tags = v.split(',').map(str::to_string).collect();
            if let Err(e) = ironflow_store::entities::validate_worker_tags(&s.tags) {
                errors.push(ConfigError::Invalid {
                    variable: "IRONFLOW_WORKER_TAGS",
                    expected: "comma-separated tags of 1 to 64 ASCII letters, digits or - _ . : / =, at most 32",
                    found: format!("{v} ({e})"),
                });
            }
        }
        if let Some(v) = get("IRONFLOW_WORKER_ID_PREFIX") {
            s.worker_id_prefix = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u32>(&get, "IRONFLOW_POISON_THRESHOLD", positive, 1),
        ) {
            s.poison.threshold = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_POISON_COOLDOWN_SECS", whole, 0),
        ) {
            s.poison.cooldown = Duration::from_secs(v);
        }
        if let Some(v) = get("IRONFLOW_POISON_TABLE") {
            if is_table_name_or_arn(&v) {
                s.poison_table = Some(v);
            } else {
                errors.push(ConfigError::Invalid {
                    variable: "IRONFLOW_POISON_TABLE",
                    expected: "a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ - .) or table ARN",
                    found: v,
                });
            }
        }
        let namespace = get("IRONFLOW_POISON_NAMESPACE");
        let explicit = namespace.is_some();
        if let Some(v) = namespace.or_else(|| get("AWS_LAMBDA_FUNCTION_NAME")) {
            if is_namespace(&v) {
                s.poison_namespace = v;
            } else {
                errors.push(ConfigError::Invalid {
                    variable: if explicit {
                        "IRONFLOW_POISON_NAMESPACE"
                    } else {
                        "AWS_LAMBDA_FUNCTION_NAME (default of IRONFLOW_POISON_NAMESPACE)"
                    },
                    expected: "1 to 200 bytes without '#' or control characters",
                    found: v,
                });
            }
        }
        if let Some(v) = get("IRONFLOW_POISON_MODE") {
            match v.parse() {
                Ok(mode) => s.poison_mode = mode,
                Err(_) => errors.push(ConfigError::Invalid {
                    variable: "IRONFLOW_POISON_MODE",
                    expected: "fail or defer",
                    found: v,
                }),
            }
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u32>(&get, "IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS", positive, 1),
        ) {
            s.max_handbacks_without_progress = v;
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_MAX_CAPACITY_WAIT_SECS", whole, 0),
        ) {
            s.max_capacity_wait = Duration::from_secs(v);
        }
        if let Some(v) = get("IRONFLOW_HEARTBEAT_URL") {
            if v.starts_with("http://") || v.starts_with("https://") {
                s.heartbeat_url = Some(v);
            } else {
                errors.push(ConfigError::Invalid {
                    variable: "IRONFLOW_HEARTBEAT_URL",
                    expected: "an http:// or https:// URL",
                    found: "(not shown: heartbeat URLs usually embed a secret)".to_string(),
                });
            }
        }
        if let Some(v) = keep(
            &mut errors,
            parse::<u64>(&get, "IRONFLOW_EMULATED_INVOCATION_SECS", positive, 1),
        ) {
            s.emulated_invocation = Some(Duration::from_secs(v));
        }
        if let Some(v) = get("IRONFLOW_METRICS_NAMESPACE") {
            s.metrics_namespace = v;
        }
        match errors.len() {
            0 => Ok(s),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }
}

/// A DynamoDB table name (3 to 255 of `A-Z a-z 0-9 _ - .`) or a table ARN
/// (`arn:<partition>:dynamodb:<region>:<account>:table/<name>`).
pub fn is_table_name_or_arn(v: &str) -> bool {
    let is_name = |n: &str| {
        (3..=255).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    if let Some(rest) = v.strip_prefix("arn:") {
        let parts: Vec<&str> = rest.splitn(5, ':').collect();
        return parts.len() == 5
            && parts[1] == "dynamodb"
            && parts[4].strip_prefix("table/").is_some_and(is_name);
    }
    is_name(v)
}

/// A poison-pill namespace: 1 to [`MAX_POISON_NAMESPACE_LEN`] bytes, no `#` (the key
/// separator) and no control character.
pub fn is_namespace(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_POISON_NAMESPACE_LEN
        && !v.chars().any(|c| c == '#' || c.is_control())
}

/// The value of a checked variable, or `None` with its error added to `errors`.
fn keep<T>(errors: &mut Vec<ConfigError>, checked: Result<Option<T>, ConfigError>) -> Option<T> {
    checked.unwrap_or_else(|e| {
        errors.push(e);
        None
    })
}

/// Parse an optional numeric variable no smaller than `min`.
fn parse<T: FromStr + PartialOrd + From<u8>>(
    get: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    expected: &'static str,
    min: u8,
) -> Result<Option<T>, ConfigError> {
    let Some(raw) = get(variable) else {
        return Ok(None);
    };
    match raw.parse::<T>() {
        Ok(v) if v >= T::from(min) => Ok(Some(v)),
        // A whole number the type cannot hold: say so rather than "expected a whole number".
        Err(_) if raw.trim().parse::<u128>().is_ok() => Err(ConfigError::Invalid {
            variable,
            expected: "a smaller whole number (it is out of range)",
            found: raw,
        }),
        _ => Err(ConfigError::Invalid {
            variable,
            expected,
            found: raw,
        }),
    }
}

/// `url` with everything before its last `@` masked as `***`, after its scheme when it has one
/// (`https://u:pw@host` → `https://***@host`, `u:pw@host` → `***@host`), for error messages:
/// a malformed URL may still hold a password.
fn without_userinfo(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    let start = url
        .find("://")
        .map(|i| i + 3)
        .filter(|start| *start <= at)
        .unwrap_or(0);
    format!("{}***{}", &url[..start], &url[at..])
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

    #[test]
    fn defaults_apply() {
        let s = Settings::from_lookup(lookup(&BASE)).unwrap();
        assert_eq!(s.max_runs_per_invocation, DEFAULT_MAX_RUNS_PER_INVOCATION);
        assert_eq!(s.deadline_margin, DEFAULT_DEADLINE_MARGIN);
        assert_eq!(s.worker_token.expose(), "s3cr3t-token");
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
    fn zero_concurrency_is_refused() {
        let mut vars = BASE.to_vec();
        vars.push(("IRONFLOW_CONCURRENCY", "0"));
        let err = Settings::from_lookup(lookup(&vars)).unwrap_err();
        assert!(err.to_string().contains("IRONFLOW_CONCURRENCY"), "{err}");
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
                ConfigError::Missing { variable, .. } | ConfigError::Invalid { variable, .. } => {
                    *variable
                }
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
