//! The table of environment variables: each one's name, the builder method it mirrors, its
//! meaning and default as the README's configuration table shows them, and its parser.
//!
//! [`VARIABLES`] is the one definition: [`super::Settings::from_lookup`] parses the environment
//! with it, and a test checks that the README's table is this one, row for row.

use std::str::FromStr;
use std::time::Duration;

use super::{Settings, WorkerToken};
use crate::poison::PoisonMode;

/// One environment variable of the worker.
pub struct Variable {
    /// Its name, e.g. `IRONFLOW_CONCURRENCY`.
    pub name: &'static str,
    /// The [`LambdaWorkerBuilder`](crate::LambdaWorkerBuilder) method that sets the same
    /// setting (`new` for the URL and the token, which the builder takes as arguments).
    pub setter: &'static str,
    /// What it sets, as the README's configuration table says it (Markdown).
    pub meaning: &'static str,
    /// Its default, as the README's configuration table says it (Markdown).
    pub default: &'static str,
    /// Sets the value into the settings, or says what was expected.
    pub(super) apply: fn(&mut Settings, &str) -> Result<(), Invalid>,
}

/// A value a variable's parser refused.
pub(super) struct Invalid {
    /// The expected form.
    pub expected: &'static str,
    /// What the error may show of the value.
    pub found: Found,
}

/// What an error shows of a refused value.
pub(super) enum Found {
    /// The value as it is.
    Raw,
    /// Nothing: it is a secret.
    Hidden(&'static str),
}

fn invalid(expected: &'static str) -> Invalid {
    Invalid {
        expected,
        found: Found::Raw,
    }
}

const POSITIVE: &str = "a whole number greater than 0";
const WHOLE: &str = "a whole number (0 or more)";
const OUT_OF_RANGE: &str = "a smaller whole number (it is out of range)";

/// A whole number no smaller than `min`: `expected` names the form, and a number the type cannot
/// hold says so rather than "expected a whole number".
fn number<T: FromStr + PartialOrd + From<u8>>(
    raw: &str,
    min: u8,
    expected: &'static str,
) -> Result<T, Invalid> {
    match raw.parse::<T>() {
        Ok(v) if v >= T::from(min) => Ok(v),
        Err(_) if raw.trim().parse::<u128>().is_ok() => Err(invalid(OUT_OF_RANGE)),
        _ => Err(invalid(expected)),
    }
}

fn positive<T: FromStr + PartialOrd + From<u8>>(raw: &str) -> Result<T, Invalid> {
    number(raw, 1, POSITIVE)
}

fn whole<T: FromStr + PartialOrd + From<u8>>(raw: &str) -> Result<T, Invalid> {
    number(raw, 0, WHOLE)
}

fn seconds(raw: &str, min: u8) -> Result<Duration, Invalid> {
    number::<u64>(raw, min, if min == 0 { WHOLE } else { POSITIVE }).map(Duration::from_secs)
}

fn millis(raw: &str) -> Result<Duration, Invalid> {
    whole::<u64>(raw).map(Duration::from_millis)
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

/// A poison-pill namespace: 1 to [`super::MAX_POISON_NAMESPACE_LEN`] bytes, no `#` (the key
/// separator) and no control character.
pub fn is_namespace(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= super::MAX_POISON_NAMESPACE_LEN
        && !v.chars().any(|c| c == '#' || c.is_control())
}

/// Every environment variable of the worker, in the README's order.
pub static VARIABLES: &[Variable] = &[
    Variable {
        name: "IRONFLOW_API_URL",
        setter: "new",
        meaning: "base URL of the ironflow API (`https://host[:port]`, no `user:password@`: the \
                  token authenticates; `http://` only to a loopback host or with the next \
                  variable)",
        default: "required",
        // Checked once every variable is read (it depends on the next one).
        apply: |s, raw| {
            s.api_url = raw.to_string();
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_ALLOW_INSECURE_HTTP",
        setter: "allow_insecure_http",
        meaning: "`true`: accept a plain `http://` URL to a host that is not loopback (an API \
                  inside the VPC); the token then crosses the network in clear text",
        default: "`false`",
        apply: |s, raw| {
            s.allow_insecure_http = match raw.to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(invalid("true or false")),
            };
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WORKER_TOKEN",
        setter: "new",
        meaning: "the API's worker token",
        default: "required, unless the next one is set",
        apply: |s, raw| {
            // It travels in an `Authorization` header: anything but visible ASCII would fail
            // every request later with an error that does not point here.
            if !raw.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Invalid {
                    expected: "visible ASCII without spaces or line breaks (it is sent as a \
                               bearer token)",
                    found: Found::Hidden("(not shown: it is a secret)"),
                });
            }
            if s.worker_token.expose().is_empty() {
                s.worker_token = WorkerToken::new(raw);
            }
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WORKER_TOKEN_SECRET_ARN",
        setter: "from_env_and_secrets",
        meaning: "ARN of a Secrets Manager secret whose SecretString is the worker token, read \
                  once per cold start (and again when the API refuses the token) when \
                  `IRONFLOW_WORKER_TOKEN` is unset (what the SAM template sets)",
        default: "none",
        // Read before the other variables, by `crate::secrets`.
        apply: |_, _| Ok(()),
    },
    Variable {
        name: "IRONFLOW_MAX_RUNS_PER_INVOCATION",
        setter: "max_runs_per_invocation",
        meaning: "N: runs one invocation claims at most. An invocation returns when its last run \
                  ends, so one slot idles about half a run at its end: 1/(2N) of a drain at C = \
                  2. A larger N makes that and the boundaries rarer (short runs drain faster, \
                  see BENCHMARKS.md), but lets more runs meet the cutoff and be handed back \
                  (their interrupted step runs again)",
        default: "8",
        apply: |s, raw| {
            s.max_runs_per_invocation = positive(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_CONCURRENCY",
        setter: "concurrency",
        meaning: "runs executing at once",
        default: "2",
        apply: |s, raw| {
            s.concurrency = positive(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "AWS_LAMBDA_MAX_CONCURRENCY",
        setter: "concurrent_invocations",
        meaning: "invocations one process serves at once, M: Lambda sets it on [managed instances](#managed-instances), each invocation with its own C runs; M × C at most 4096",
        default: "1",
        apply: |s, raw| {
            s.concurrent_invocations = positive(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_RUN_TIMEOUT_SECS",
        setter: "run_timeout",
        meaning: "a run attempt's limit, from its first start",
        default: "1800",
        apply: |s, raw| {
            s.run_timeout = seconds(raw, 1)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_DEADLINE_MARGIN_MS",
        setter: "deadline_margin",
        meaning: "time kept free before the deadline to hand runs back, at least 500 (the \
                  handback's writes are retried within it when the API fails)",
        default: "10000",
        apply: |s, raw| {
            s.deadline_margin = millis(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_MIN_CLAIM_BUDGET_MS",
        setter: "min_claim_budget",
        meaning: "no claim with less than this before the cutoff, at least 100",
        default: "2000",
        apply: |s, raw| {
            s.min_claim_budget = millis(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_CLAIM_AHEAD_PERCENT",
        setter: "claim_ahead_percent",
        meaning: "claim one run ahead of a free slot while a claim's round trip is at least this \
                  % of a run's execution time on this instance ([claim-ahead](docs/design.md#claim-ahead)); \
                  `0`: never",
        default: "20",
        apply: |s, raw| {
            s.claim_ahead_percent = whole(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_FUNCTION_TIMEOUT_SECS",
        setter: "function_timeout",
        meaning: "the function's timeout (set it to the template's); the margin must be below it",
        default: "900",
        apply: |s, raw| {
            s.function_timeout = seconds(raw, 1)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_LEASE_TTL_SECS",
        setter: "lease_ttl",
        meaning: "lease TTL, 1 to 3600 s; an invocation that dies leaves its runs to the API's \
                  reaper after this",
        default: "90",
        apply: |s, raw| {
            s.lease_ttl = seconds(raw, 1)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
        setter: "lease_refresh_interval",
        meaning: "lease refresh interval, below the TTL (keep the TTL at least twice it: the rest \
                  is the time failed refreshes are retried in)",
        default: "30",
        apply: |s, raw| {
            s.lease_refresh_interval = seconds(raw, 1)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WORKER_TAGS",
        setter: "tags",
        meaning: "comma-separated worker tags (validated as the reference worker does)",
        default: "none",
        apply: |s, raw| {
            s.tags = raw.split(',').map(str::to_string).collect();
            ironflow_store::entities::validate_worker_tags(&s.tags).map_err(|_| {
                invalid(
                    "comma-separated tags of 1 to 64 ASCII letters, digits or - _ . : / =, at \
                     most 32",
                )
            })
        },
    },
    Variable {
        name: "IRONFLOW_WORKER_ID_PREFIX",
        setter: "worker_id_prefix",
        meaning: "each invocation claims as `<prefix>-<request id>-<8 hex>`",
        default: "`lambda`",
        apply: |s, raw| {
            s.worker_id_prefix = raw.to_string();
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_POISON_THRESHOLD",
        setter: "poison_threshold",
        meaning: "consecutive failures that block a workflow",
        default: "3",
        apply: |s, raw| {
            s.poison.threshold = positive(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_POISON_COOLDOWN_SECS",
        setter: "poison_cooldown",
        meaning: "how long it stays blocked after its last failure",
        default: "300",
        apply: |s, raw| {
            s.poison.cooldown = seconds(raw, 0)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_POISON_TABLE",
        setter: "connect_poison_table",
        meaning: "DynamoDB table of the poison-pill counters, shared by every instance (name or \
                  ARN)",
        default: "none: in-memory table",
        apply: |s, raw| {
            if !is_table_name_or_arn(raw) {
                return Err(invalid(
                    "a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ - .) or table ARN",
                ));
            }
            s.poison_table = Some(raw.to_string());
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_POISON_NAMESPACE",
        setter: "poison_namespace",
        meaning: "key prefix in that table, so several functions can share it (no `#`)",
        default: "`AWS_LAMBDA_FUNCTION_NAME`, else `ironflow`",
        apply: |s, raw| {
            if !is_namespace(raw) {
                return Err(invalid("1 to 200 bytes without '#' or control characters"));
            }
            s.poison_namespace = raw.to_string();
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_POISON_MODE",
        setter: "poison_mode",
        meaning: "`fail`: fail a claimed run of a blocked workflow; `defer`: leave its runs \
                  Pending",
        default: "`fail`",
        apply: |s, raw| {
            s.poison_mode = raw
                .parse::<PoisonMode>()
                .map_err(|_| invalid("fail or defer"))?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS",
        setter: "max_handbacks_without_progress",
        meaning: "handbacks in a row without a completed step before the run is failed",
        default: "3",
        apply: |s, raw| {
            s.max_handbacks_without_progress = positive(raw)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_MAX_CAPACITY_WAIT_SECS",
        setter: "max_capacity_wait",
        meaning: "how long an agent step may wait for provider capacity",
        default: "21600",
        apply: |s, raw| {
            s.max_capacity_wait = seconds(raw, 0)?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_HEARTBEAT_URL",
        setter: "heartbeat_url",
        meaning: "dead man's switch pinged (`HEAD`) after each completed batch; never logged",
        default: "none",
        apply: |s, raw| {
            if !(raw.starts_with("http://") || raw.starts_with("https://")) {
                return Err(Invalid {
                    expected: "an http:// or https:// URL",
                    found: Found::Hidden("(not shown: heartbeat URLs usually embed a secret)"),
                });
            }
            s.heartbeat_url = Some(raw.to_string());
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_EMULATED_INVOCATION_SECS",
        setter: "emulated_invocation",
        meaning: "invocation length when `Context.deadline` has already passed, as under `cargo \
                  lambda watch`; no effect on Lambda",
        default: "none",
        apply: |s, raw| {
            s.emulated_invocation = Some(seconds(raw, 1)?);
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WAKE_QUEUE_URL",
        setter: "wake_ups",
        meaning: "SQS queue that triggers the function, for [wake-ups](docs/design.md#wake-ups); \
                  unset: none sent (the two variables below are then refused)",
        default: "none",
        apply: |s, raw| {
            if !(raw.starts_with("https://") || raw.starts_with("http://")) {
                return Err(invalid(
                    "the queue's URL, e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/ironflow-wake",
                ));
            }
            s.wake_queue_url = Some(raw.to_string());
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION",
        setter: "wake_ups",
        meaning: "wake-up messages one invocation sends at most (1 to 10)",
        default: "3",
        apply: |s, raw| {
            s.max_wakeups_per_invocation = raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=super::MAX_WAKEUPS_PER_INVOCATION_LIMIT).contains(n))
                .ok_or_else(|| invalid("a whole number from 1 to 10"))?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WAKE_DELAY_SECS",
        setter: "wake_ups",
        meaning: "`DelaySeconds` of wake-ups sent after a handback (0 to 900)",
        default: "5",
        apply: |s, raw| {
            s.wake_delay = raw
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs)
                .filter(|d| *d <= super::MAX_WAKE_DELAY)
                .ok_or_else(|| invalid("a whole number of seconds from 0 to 900"))?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WEBHOOK_SECRET",
        setter: "webhook_secret",
        meaning: "secret of the [webhook receiver](docs/push.md), at least 32 characters; never logged",
        default: "none: receiver off",
        apply: |s, raw| {
            if !super::WebhookSecret::new(raw).is_usable() {
                return Err(Invalid {
                    expected: "at least 32 visible ASCII characters without spaces",
                    found: Found::Hidden("(not shown: it is a secret)"),
                });
            }
            s.webhook_secret = Some(super::WebhookSecret::new(raw));
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_WEBHOOK_SECRET_ARN",
        setter: "from_env_and_secrets",
        meaning: "Secrets Manager ARN of it, read at cold start when it is unset",
        default: "none",
        // Read before the other variables, by `crate::secrets`.
        apply: |_, _| Ok(()),
    },
    Variable {
        name: super::FUNCTION_ROLE_VAR,
        setter: "function_role",
        meaning: "`worker`, or `webhook-receiver`: Function URL requests only \
                  ([push.md](docs/push.md#denial-of-service))",
        default: "`worker`",
        apply: |s, raw| {
            s.function_role = raw
                .parse::<super::FunctionRole>()
                .map_err(|_| invalid("worker or webhook-receiver"))?;
            Ok(())
        },
    },
    Variable {
        name: "IRONFLOW_METRICS_NAMESPACE",
        setter: "metrics_namespace",
        meaning: "CloudWatch namespace of the function's EMF metrics",
        default: "`ironflow-lambda`",
        apply: |s, raw| {
            if raw.len() > 255 || raw.starts_with("AWS/") || raw.contains(':') {
                return Err(invalid(
                    "a CloudWatch namespace: at most 255 characters, no ':', not starting with AWS/",
                ));
            }
            s.metrics_namespace = raw.to_string();
            Ok(())
        },
    },
];

/// The variable named `name` (a name of [`VARIABLES`]).
pub(super) fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_setter_exists_on_the_builder() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len());
        let builder = include_str!("../builder.rs");
        for v in VARIABLES {
            assert!(
                ["pub fn", "pub async fn"].iter().any(|f| {
                    builder.contains(&format!("{f} {}(", v.setter))
                        || builder.contains(&format!("{f} {}<", v.setter))
                }),
                "{}: no builder method {}",
                v.name,
                v.setter
            );
        }
    }
}
