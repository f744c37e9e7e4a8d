//! The rows of what the function exchanges with the outside beyond the API: the heartbeat, an
//! emulated invocation's length, the wake-up queue, the webhook receiver, the function's role,
//! the metrics' namespace.

use std::time::Duration;

use super::SECRET;
use crate::settings::MAX_DURATION;
use crate::settings::row::{Access, Setting, Shown};
use crate::settings::rules;
use crate::settings::url;
use crate::settings::value::Unit;

pub const HEARTBEAT_URL: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_HEARTBEAT_URL",
    setter: "heartbeat_url",
    meaning: "dead man's switch pinged (`HEAD`) after each completed batch, `http://` as for \
              the API; never logged",
    unit: Unit::None,
    default: None,
    default_doc: None,
    min: None,
    max: None,
    rule: Some(url::heartbeat_url),
    shown: Shown::Hidden("(not shown: heartbeat URLs usually embed a secret)"),
    access: field!(heartbeat_url),
};

pub const EMULATED_INVOCATION: Setting<Option<Duration>> = Setting {
    variable: "IRONFLOW_EMULATED_INVOCATION_SECS",
    setter: "emulated_invocation",
    meaning: "invocation length when `Context.deadline` has already passed, as under `cargo \
              lambda watch`; no effect on Lambda",
    unit: Unit::Secs,
    default: None,
    default_doc: None,
    min: None,
    max: Some(MAX_DURATION),
    rule: Some(rules::none_or_above_zero),
    shown: Shown::Raw,
    access: field!(emulated_invocation),
};

pub const WAKE_QUEUE_URL: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_WAKE_QUEUE_URL",
    setter: "wake_ups",
    meaning: "standard SQS queue that triggers the function, for \
              [wake-ups](docs/design.md#wake-ups); unset: none sent (the two variables below are \
              then refused)",
    unit: Unit::None,
    default: None,
    default_doc: None,
    min: None,
    max: None,
    rule: Some(url::queue_url),
    shown: Shown::Masked(url::without_userinfo),
    access: field!(wake_queue_url),
};

pub const MAX_WAKEUPS_PER_INVOCATION: Setting<usize> = Setting {
    variable: "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION",
    setter: "wake_ups",
    meaning: "wake-up messages one invocation sends at most",
    unit: Unit::None,
    default: 3,
    default_doc: None,
    min: Some(1),
    max: Some(crate::settings::MAX_WAKEUPS_PER_INVOCATION_LIMIT),
    rule: None,
    shown: Shown::Raw,
    access: field!(max_wakeups_per_invocation),
};

pub const WAKE_DELAY: Setting<Duration> = Setting {
    variable: "IRONFLOW_WAKE_DELAY_SECS",
    setter: "wake_ups",
    meaning: "`DelaySeconds` of wake-ups sent after a handback",
    unit: Unit::Secs,
    default: Duration::from_secs(5),
    default_doc: None,
    min: Some(Duration::ZERO),
    max: Some(crate::settings::MAX_WAKE_DELAY),
    rule: None,
    shown: Shown::Raw,
    access: field!(wake_delay),
};

pub const WEBHOOK_SECRET: Setting<Option<crate::settings::WebhookSecret>> = Setting {
    variable: "IRONFLOW_WEBHOOK_SECRET",
    setter: "webhook_secret",
    meaning: "secret of the [webhook receiver](docs/push.md), at least 32 visible ASCII \
              characters; never logged",
    unit: Unit::None,
    default: None,
    default_doc: Some("none: receiver off"),
    min: None,
    max: None,
    rule: Some(rules::webhook_secret),
    shown: SECRET,
    access: field!(webhook_secret),
};

pub const WEBHOOK_SECRET_ARN: Setting<Option<String>> = Setting {
    variable: "IRONFLOW_WEBHOOK_SECRET_ARN",
    setter: "from_env_and_secrets",
    meaning: "Secrets Manager ARN of it, read at cold start when it is unset",
    unit: Unit::None,
    default: None,
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::secret_arn),
    shown: Shown::Hidden("(not shown: it may be a secret pasted by mistake)"),
    access: field!(webhook_secret_arn),
};

pub const WEBHOOK_REPLAY_WINDOW: Setting<Duration> = Setting {
    variable: "IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS",
    setter: "webhook_replay_window",
    meaning: "[webhook](docs/push.md#replays) events' replay window: how far an event's `at` may \
              be from now, either way",
    unit: Unit::Secs,
    default: Duration::from_secs(300),
    default_doc: None,
    min: Some(Duration::from_secs(1)),
    max: Some(Duration::from_secs(3600)),
    rule: Some(rules::whole_seconds),
    shown: Shown::Raw,
    access: field!(webhook_replay_window),
};

pub const FUNCTION_ROLE: Setting<crate::settings::FunctionRole> = Setting {
    variable: crate::settings::FUNCTION_ROLE_VAR,
    setter: "function_role",
    meaning: "`worker`, or `webhook-receiver`: Function URL requests only \
              ([push.md](docs/push.md#denial-of-service))",
    unit: Unit::None,
    default: crate::settings::FunctionRole::Worker,
    default_doc: None,
    min: None,
    max: None,
    rule: None,
    shown: Shown::Raw,
    access: field!(function_role),
};

pub const METRICS_NAMESPACE: Setting<String> = Setting {
    variable: "IRONFLOW_METRICS_NAMESPACE",
    setter: "metrics_namespace",
    meaning: "CloudWatch namespace of the EMF metrics: ASCII letters, digits, `._-/#:` and \
              space, not starting with `:` or `AWS/`",
    unit: Unit::None,
    default: "ironflow-lambda",
    default_doc: None,
    min: None,
    max: None,
    rule: Some(rules::metrics_namespace),
    shown: Shown::Raw,
    access: field!(metrics_namespace),
};
