//! The rows: one [`Setting`] per environment variable, and [`VARIABLES`], every one of them in
//! the README's order.
//!
//! A row is the one definition of its setting: [`super::Settings::new`] takes its default, the
//! environment is parsed and checked with it ([`super::Settings::from_lookup`]), a builder
//! method's value is checked with it ([`super::Settings::validate`]), and tests check that the
//! README's table and the builder method's documentation say what it says. Each row's
//! documentation is its `meaning`.
//!
//! A setting is one row of this table: a [`Setting`] naming its environment variable, the
//! [`LambdaWorkerBuilder`](crate::LambdaWorkerBuilder) method it mirrors, its meaning, its
//! default as a typed value, its bounds and any rule beyond them. The rows drive everything
//! else:
//! - the parsing of the environment ([`super::Settings::from_lookup`]), and the check of every value,
//!   from the environment or a builder method alike ([`super::Settings::validate`]): out of bounds or
//!   against its rule, a value is refused, named with what was expected;
//! - the defaults of [`super::Settings::new`];
//! - the README's configuration table (a test checks it equals [`VARIABLES`], row for row);
//! - the line each builder method's documentation carries
//!   ([`Entry::doc_line`], e.g. ``Variable `IRONFLOW_CONCURRENCY`; default 2; ≥ 1.``;
//!   a test checks each method carries the lines of its rows).
//!
//! [`super::Settings::validate`] also checks what no single value can (a refresh interval below the
//! lease TTL, a margin below the function timeout...). Every error names the variable, what was
//! expected and (except for secrets) what was found; the worker token never appears in an
//! error, a log line or a `Debug` rendering. A variable set to something that is not UTF-8 is
//! refused ([`super::Settings::from_env`]), never read as unset.
//!
//! # Adding a setting
//!
//! 1. Add the field to [`super::Settings`] and its default to [`super::Settings::new`] as
//!    `ROW.default_value()`.
//! 2. Add its row to this file (or to `push.rs`, `steps.rs` for their groups), a
//!    `pub const` [`Setting`] (copy a row of the same type: `usize`/`u32` counts, [`Duration`] in seconds or milliseconds ([`Unit`]), `String`,
//!    `Option<String>`...), with `min`/`max` for its bounds and a `rule` (in `rules.rs` or
//!    `url.rs`) for anything else a single value must be; `shown: Shown::Hidden(..)` for a
//!    secret. Put it in [`VARIABLES`] where the README's table should show it.
//! 3. Add the builder method, its documentation ending with the row's [`Entry::doc_line`]
//!    (the failing test `every_setter_documents_its_rows` prints it).
//! 4. Paste the README row the failing test `the_readme_s_configuration_table_is_the_table_of_variables`
//!    prints.
//! 5. A check across settings goes to `validate.rs`, naming the row (`p.add(&ROW, reason)`).
//!
//! A new type of value implements [`Value`](super::value::Value) (`value.rs`). A row written in the former style
//! (`Variable { name, setter, meaning, default, apply }`) ports field by field: `name` is
//! `variable`; the `default` string becomes the typed `default` (or `default_doc` when it is not
//! a value, e.g. `none: receiver off`); what `apply` parsed is the [`Value`](super::value::Value) type and [`Unit`];
//! the checks `apply` and `validate.rs` made on one value become `min`/`max` or the `rule`; the
//! builder method's prose loses its default and bounds, which the row's doc line now states.

use std::time::Duration;

use super::row::{Access, Entry, Setting, Shown};
use super::rules::{self, above_zero};
use super::url::{self, without_userinfo};
use super::value::Unit;
use super::{LEASE_TTL_RANGE, MAX_DURATION, MIN_DEADLINE_MARGIN};
use crate::poison::{DEFAULT_COOLDOWN, DEFAULT_THRESHOLD, PoisonMode};

/// A row of [`VARIABLES`], whatever the type of its value.
pub type Variable = dyn Entry;

/// The [`Access`] of a field of [`super::Settings`]: `field!(poison.threshold)`.
macro_rules! field {
    ($($f:ident).+) => {
        Access {
            get: |s| &s.$($f).+,
            set: |s| &mut s.$($f).+,
        }
    };
}

mod push;
mod steps;

pub use push::*;
pub use steps::*;

/// What an error shows instead of a secret's value.
const SECRET: Shown = Shown::Hidden("(not shown: it is a secret)");

pub const API_URL: Setting<String> = Setting {
    variable: "IRONFLOW_API_URL",
    setter: "new",
    meaning: "base URL of the ironflow API (`https://host[:port]`, no `user:password@`: the \
              token authenticates; `http://` only to a loopback host or with the next variable)",
    unit: Unit::None,
    default: "",
    default_doc: Some("required"),
    min: None,
    max: None,
    rule: Some(url::api_url),
    shown: Shown::Masked(without_userinfo),
    access: field!(api_url),
};

pub const ALLOW_INSECURE_HTTP: Setting<bool> = Setting {
    variable: "IRONFLOW_ALLOW_INSECURE_HTTP",
    setter: "allow_insecure_http",
    meaning: "`true`: accept a plain `http://` URL to a host that is not loopback (an API inside \
              the VPC); the token then crosses the network in clear text",
    unit: Unit::None,
    default: false,
    default_doc: None,
    min: None,
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(allow_insecure_http),
};

pub const WORKER_TOKEN: Setting<super::WorkerToken> = Setting {
    variable: "IRONFLOW_WORKER_TOKEN",
    setter: "new",
    meaning: "the API's worker token",
    unit: Unit::None,
    default: "",
    default_doc: Some("required, or its `_SECRET_ARN`"),
    min: None,
    max: None,
    rule: Some(rules::token),
    shown: SECRET,
    access: field!(worker_token),
};

pub const WORKER_TOKEN_SECRET_ARN: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_WORKER_TOKEN_SECRET_ARN",
    setter: "from_env_and_secrets",
    meaning: "ARN of a Secrets Manager secret whose SecretString is the worker token, read once \
              per cold start (and again when the API refuses the token) when \
              `IRONFLOW_WORKER_TOKEN` is unset (what the SAM template sets)",
    unit: Unit::None,
    default: None,
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::secret_arn),
    shown: Shown::Hidden("(not shown: it may be a secret pasted by mistake)"),
    access: field!(worker_token_secret_arn),
};

pub const MAX_RUNS_PER_INVOCATION: Setting<usize> = Setting {
    variable: "IRONFLOW_MAX_RUNS_PER_INVOCATION",
    setter: "max_runs_per_invocation",
    meaning: "N: runs one invocation claims at most ([choosing N](docs/design.md#claim-ahead))",
    unit: Unit::None,
    default: 8,
    default_doc: None,
    min: Some(1),
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(max_runs_per_invocation),
};

pub const CONCURRENCY: Setting<usize> = Setting {
    variable: "IRONFLOW_CONCURRENCY",
    setter: "concurrency",
    meaning: "runs executing at once",
    unit: Unit::None,
    default: 2,
    default_doc: None,
    min: Some(1),
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(concurrency),
};

pub const CONCURRENT_INVOCATIONS: Setting<usize> = Setting {
    variable: "AWS_LAMBDA_MAX_CONCURRENCY",
    setter: "concurrent_invocations",
    meaning: "invocations one process serves at once, M: Lambda sets it on [managed \
              instances](#managed-instances), each invocation with its own C runs; M × C at \
              most 4096",
    unit: Unit::None,
    default: 1,
    default_doc: None,
    min: Some(1),
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(concurrent_invocations),
};

pub const RUN_TIMEOUT: Setting<Duration> = Setting {
    variable: "IRONFLOW_RUN_TIMEOUT_SECS",
    setter: "run_timeout",
    meaning: "a run attempt's limit on executed time, waits excluded",
    unit: Unit::Secs,
    default: Duration::from_secs(30 * 60),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: Some(above_zero),
    shown: Shown::Raw,
    access: field!(run_timeout),
};

pub const DEADLINE_MARGIN: Setting<Duration> = Setting {
    variable: "IRONFLOW_DEADLINE_MARGIN_MS",
    setter: "deadline_margin",
    meaning: "time kept free before the deadline to hand runs back (the handback's writes are \
              retried within it when the API fails)",
    unit: Unit::Millis,
    default: Duration::from_secs(10),
    default_doc: None,
    min: Some(MIN_DEADLINE_MARGIN),
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(deadline_margin),
};

pub const MIN_CLAIM_BUDGET: Setting<Duration> = Setting {
    variable: "IRONFLOW_MIN_CLAIM_BUDGET_MS",
    setter: "min_claim_budget",
    meaning: "no claim with less than this before the cutoff",
    unit: Unit::Millis,
    default: Duration::from_secs(2),
    default_doc: None,
    min: Some(super::MIN_CLAIM_BUDGET),
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(min_claim_budget),
};

pub const CLAIM_AHEAD_PERCENT: Setting<u32> = Setting {
    variable: "IRONFLOW_CLAIM_AHEAD_PERCENT",
    setter: "claim_ahead_percent",
    meaning: "claim one run ahead of a free slot while a claim's round trip is at least this % \
              of a run's execution time on this instance \
              ([claim-ahead](docs/design.md#claim-ahead)); `0`: never",
    unit: Unit::None,
    default: 20,
    default_doc: None,
    min: None,
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(claim_ahead_percent),
};

pub const FUNCTION_TIMEOUT: Setting<Duration> = Setting {
    variable: "IRONFLOW_FUNCTION_TIMEOUT_SECS",
    setter: "function_timeout",
    meaning: "the function's timeout (set it to the template's); the margin must be below it",
    unit: Unit::Secs,
    default: Duration::from_secs(900),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: Some(above_zero),
    shown: Shown::Raw,
    access: field!(function_timeout),
};

pub const LEASE_TTL: Setting<Duration> = Setting {
    variable: "IRONFLOW_LEASE_TTL_SECS",
    setter: "lease_ttl",
    meaning: "lease TTL; an invocation that dies leaves its runs to the API's reaper after this",
    unit: Unit::Secs,
    default: Duration::from_secs(90),
    default_doc: None,
    min: Some(*LEASE_TTL_RANGE.start()),
    max: Some(*LEASE_TTL_RANGE.end()),
    rule: Some(rules::whole_seconds),
    shown: Shown::Raw,
    access: field!(lease_ttl),
};

pub const LEASE_REFRESH_INTERVAL: Setting<Duration> = Setting {
    variable: "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
    setter: "lease_refresh_interval",
    meaning: "lease refresh interval, below the TTL (keep the TTL at least twice \
              it: the rest is the time failed refreshes are retried in)",
    unit: Unit::Secs,
    default: Duration::from_secs(30),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: Some(rules::refresh_interval),
    shown: Shown::Raw,
    access: field!(lease_refresh_interval),
};

pub const TAGS: Setting<Vec<String>> = Setting {
    variable: "IRONFLOW_WORKER_TAGS",
    setter: "tags",
    meaning: "comma-separated worker tags (validated as the reference worker does)",
    unit: Unit::None,
    default: &[],
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::tags),
    shown: Shown::Raw,
    access: field!(tags),
};

pub const WORKER_ID_PREFIX: Setting<String> = Setting {
    variable: "IRONFLOW_WORKER_ID_PREFIX",
    setter: "worker_id_prefix",
    meaning: "each invocation claims as `<prefix>-<request id>-<8 hex>`",
    unit: Unit::None,
    default: "lambda",
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::worker_id_prefix),
    shown: Shown::Raw,
    access: field!(worker_id_prefix),
};

pub const POISON_THRESHOLD: Setting<u32> = Setting {
    variable: "IRONFLOW_POISON_THRESHOLD",
    setter: "poison_threshold",
    meaning: "consecutive failures that block a workflow",
    unit: Unit::None,
    default: DEFAULT_THRESHOLD,
    default_doc: None,
    min: Some(1),
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(poison.threshold),
};

pub const POISON_COOLDOWN: Setting<Duration> = Setting {
    variable: "IRONFLOW_POISON_COOLDOWN_SECS",
    setter: "poison_cooldown",
    meaning: "how long it stays blocked after its last failure",
    unit: Unit::Secs,
    default: DEFAULT_COOLDOWN,
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(poison.cooldown),
};

pub const POISON_TABLE: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_POISON_TABLE",
    setter: "connect_poison_table",
    meaning: "DynamoDB table of the poison-pill counters, shared by every instance (name or ARN)",
    unit: Unit::None,
    default: None,
    default_doc: Some("none: in-memory table"),
    min: None,
    max: None,
    rule: Some(rules::table),
    shown: Shown::Raw,
    access: field!(poison_table),
};

pub const POISON_NAMESPACE: Setting<String> = Setting {
    variable: "IRONFLOW_POISON_NAMESPACE",
    setter: "poison_namespace",
    meaning: "key prefix in that table, so several functions can share it (no `#`)",
    unit: Unit::None,
    default: "ironflow",
    default_doc: Some("`AWS_LAMBDA_FUNCTION_NAME`, else `ironflow`"),
    min: None,
    max: None,
    rule: Some(rules::namespace),
    shown: Shown::Raw,
    access: field!(poison_namespace),
};

pub const POISON_MODE: Setting<PoisonMode> = Setting {
    variable: "IRONFLOW_POISON_MODE",
    setter: "poison_mode",
    meaning: "`fail`: fail a claimed run of a blocked workflow; `defer`: leave its runs Pending",
    unit: Unit::None,
    default: PoisonMode::Fail,
    default_doc: None,
    min: None,
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(poison_mode),
};

pub const MAX_HANDBACKS_WITHOUT_PROGRESS: Setting<u32> = Setting {
    variable: "IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS",
    setter: "max_handbacks_without_progress",
    meaning: "handbacks in a row without a completed step before the run is failed",
    unit: Unit::None,
    default: 3,
    default_doc: None,
    min: Some(1),
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(max_handbacks_without_progress),
};

/// Every environment variable of the worker, in the README's order.
pub static VARIABLES: &[&Variable] = &[
    &API_URL,
    &ALLOW_INSECURE_HTTP,
    &WORKER_TOKEN,
    &WORKER_TOKEN_SECRET_ARN,
    &MAX_RUNS_PER_INVOCATION,
    &CONCURRENCY,
    &CONCURRENT_INVOCATIONS,
    &RUN_TIMEOUT,
    &DEADLINE_MARGIN,
    &MIN_CLAIM_BUDGET,
    &CLAIM_AHEAD_PERCENT,
    &FUNCTION_TIMEOUT,
    &LEASE_TTL,
    &LEASE_REFRESH_INTERVAL,
    &TAGS,
    &WORKER_ID_PREFIX,
    &POISON_THRESHOLD,
    &POISON_COOLDOWN,
    &POISON_TABLE,
    &POISON_NAMESPACE,
    &POISON_MODE,
    &MAX_HANDBACKS_WITHOUT_PROGRESS,
    &CUTOFF_AWARE_STARTS,
    &DEFAULT_STEP_SECS,
    &MAX_CAPACITY_WAIT,
    &CAPACITY_SPREAD,
    &CAPACITY_SPREAD_MAX,
    &ANTHROPIC_API_KEY_SECRET_ARN,
    &HEARTBEAT_URL,
    &EMULATED_INVOCATION,
    &WAKE_QUEUE_URL,
    &MAX_WAKEUPS_PER_INVOCATION,
    &WAKE_DELAY,
    &WEBHOOK_SECRET,
    &WEBHOOK_SECRET_ARN,
    &WEBHOOK_REPLAY_WINDOW,
    &FUNCTION_ROLE,
    &METRICS_NAMESPACE,
];
