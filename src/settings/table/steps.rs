//! The rows of a run's steps: the cutoff-aware starts, a step's expected duration, the waits
//! for provider capacity and how their wake-ups are spread, the Anthropic key's secret.

use std::time::Duration;

use crate::settings::MAX_DURATION;
use crate::settings::row::{Access, Setting, Shown};
use crate::settings::rules::{self, above_zero};
use crate::settings::value::Unit;

pub const CUTOFF_AWARE_STARTS: Setting<bool> = Setting {
    variable: "IRONFLOW_CUTOFF_AWARE_STARTS",
    setter: "cutoff_aware_starts",
    meaning: "[defer a step](docs/design.md#cutoff-aware-starts) that would outlast the cutoff",
    unit: Unit::None,
    default: true,
    default_doc: None,
    min: None,
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(cutoff_aware_starts),
};

pub const DEFAULT_STEP_SECS: Setting<Duration> = Setting {
    variable: "IRONFLOW_DEFAULT_STEP_SECS",
    setter: "default_step_duration",
    meaning: "expected time of an unseen step",
    unit: Unit::Secs,
    default: Duration::from_secs(10),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: Some(above_zero),
    shown: Shown::Raw,
    access: field!(default_step_duration),
};

pub const MAX_CAPACITY_WAIT: Setting<Duration> = Setting {
    variable: "IRONFLOW_MAX_CAPACITY_WAIT_SECS",
    setter: "max_capacity_wait",
    meaning: "how long an agent step may wait for provider capacity",
    unit: Unit::Secs,
    default: ironflow_engine::accounts::DEFAULT_MAX_CAPACITY_WAIT,
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(max_capacity_wait),
};

pub const CAPACITY_SPREAD: Setting<Duration> = Setting {
    variable: "IRONFLOW_CAPACITY_SPREAD_SECS",
    setter: "capacity_spread",
    meaning: "least window [throttled runs' wake-ups](docs/agents.md#throttled-runs) spread over",
    unit: Unit::Secs,
    default: Duration::from_secs(30),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(capacity_spread),
};

pub const CAPACITY_SPREAD_MAX: Setting<Duration> = Setting {
    variable: "IRONFLOW_CAPACITY_SPREAD_MAX_SECS",
    setter: "capacity_spread",
    meaning: "its bound for long waits",
    unit: Unit::Secs,
    default: Duration::from_secs(300),
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: None,
    shown: Shown::Raw,
    access: field!(capacity_spread_max),
};

pub const ANTHROPIC_API_KEY_SECRET_ARN: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_ANTHROPIC_API_KEY_SECRET_ARN",
    setter: "from_env_and_secrets",
    meaning: "Secrets Manager ARN of the [Anthropic API key](docs/providers.md#anthropic), never \
              logged",
    unit: Unit::None,
    default: None,
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::secret_arn),
    shown: Shown::Hidden("(not shown: it may be a secret pasted by mistake)"),
    access: field!(anthropic_api_key_secret_arn),
};
