//! The rules of the settings whose values are not numbers within bounds: each says what was
//! expected when a value cannot work ([`super::row::Rule`]).
// A rule takes the row's own type (`&String`, `&Vec<String>`): `Rule<T>` is `fn(&T, ..)`.
#![allow(clippy::ptr_arg)]

use std::borrow::Cow;
use std::time::Duration;

use super::{MAX_POISON_NAMESPACE_LEN, Settings, WebhookSecret, WorkerToken};

/// The result of a rule.
pub(super) type Checked = Result<(), Cow<'static, str>>;

/// Refused with `expected` unless `ok`.
fn require(ok: bool, expected: &'static str) -> Checked {
    if ok { Ok(()) } else { Err(expected.into()) }
}

pub(super) fn above_zero(d: &Duration, _: &Settings) -> Checked {
    require(!d.is_zero(), "more than zero")
}

pub(super) fn none_or_above_zero(d: &Option<Duration>, _: &Settings) -> Checked {
    require(d.is_none_or(|d| !d.is_zero()), "more than zero")
}

/// What the API's `validate_lease_ttl` takes: whole seconds (it would drop a fraction, and the
/// worker would trust its lease longer than the API keeps it).
pub(super) fn whole_seconds(d: &Duration, _: &Settings) -> Checked {
    require(
        d.subsec_nanos() == 0,
        "a whole number of seconds: the API takes the lease TTL in whole seconds (a fraction is \
         dropped), and the worker would trust its lease longer than the API keeps it",
    )
}

/// Visible ASCII only, and not empty: the token travels in an `Authorization` header, and
/// anything else would fail every request later with an error that does not point here.
pub(super) fn token(t: &WorkerToken, _: &Settings) -> Checked {
    require(
        is_token(t.expose()),
        "a non-empty token of visible ASCII without spaces or line breaks (it is sent as a \
         bearer token)",
    )
}

/// Whether `value` can serve as the worker token: non-empty visible ASCII without spaces or
/// line breaks.
pub fn is_token(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic())
}

/// `arn:<partition>:secretsmanager:<region>:<account>:secret:<name>`.
pub fn is_secret_arn(value: &str) -> bool {
    let parts: Vec<&str> = value.splitn(7, ':').collect();
    matches!(
        parts.as_slice(),
        ["arn", partition, "secretsmanager", region, account, "secret", name]
            if partition.starts_with("aws")
                && !region.is_empty()
                && account.len() == 12
                && account.bytes().all(|b| b.is_ascii_digit())
                && !name.is_empty()
    )
}

/// What a `*_SECRET_ARN` variable must hold (the error never shows what it holds: a secret
/// pasted there by mistake would be in the log).
pub const SECRET_ARN_EXPECTED: &str = "a Secrets Manager secret ARN \
    (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-SUFFIX); what is set does not look like \
    one";

pub(super) fn secret_arn(v: &Option<String>, _: &Settings) -> Checked {
    require(v.as_deref().is_none_or(is_secret_arn), SECRET_ARN_EXPECTED)
}

pub(super) fn tags(tags: &Vec<String>, _: &Settings) -> Checked {
    require(
        ironflow_store::entities::validate_worker_tags(tags).is_ok(),
        "comma-separated tags of 1 to 64 ASCII letters, digits or - _ . : / =, at most 32",
    )
}

/// The API trims the worker id it records: a prefix starting with a space would make every
/// lease look held by another worker.
pub(super) fn worker_id_prefix(p: &String, _: &Settings) -> Checked {
    require(
        !p.starts_with(char::is_whitespace)
            && !p.chars().any(char::is_control)
            && p.len() <= MAX_WORKER_ID_PREFIX,
        "a prefix of at most 128 bytes without leading spaces or control characters (the API \
         trims worker ids, and every claim and lease renewal carries it)",
    )
}

/// The longest worker id prefix, in bytes: the worker id (`<prefix>-<request id>-<8 hex>`)
/// travels in every claim's URL.
const MAX_WORKER_ID_PREFIX: usize = 128;

/// The shortest lease refresh interval the builder takes (50 ms; the variable counts whole
/// seconds): shorter, a run's refresher would flood the API with renewals.
pub(super) fn refresh_interval(d: &Duration, _: &Settings) -> Checked {
    require(
        *d >= Duration::from_millis(50),
        "at least 50 ms (1 s from the variable): each refresh is a request to the API",
    )
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

pub(super) fn table(v: &Option<String>, _: &Settings) -> Checked {
    require(
        v.as_deref().is_none_or(is_table_name_or_arn),
        "a DynamoDB table name (3 to 255 of A-Z a-z 0-9 _ - .) or table ARN",
    )
}

/// A poison-pill namespace: 1 to [`MAX_POISON_NAMESPACE_LEN`] bytes, no `#` (the key
/// separator) and no control character.
pub fn is_namespace(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_POISON_NAMESPACE_LEN
        && !v.chars().any(|c| c == '#' || c.is_control())
}

/// What a poison-pill namespace must be.
pub(super) const NAMESPACE_EXPECTED: &str = "1 to 200 bytes without '#' or control characters";

pub(super) fn namespace(v: &String, _: &Settings) -> Checked {
    require(is_namespace(v), NAMESPACE_EXPECTED)
}

pub(super) fn webhook_secret(v: &Option<WebhookSecret>, _: &Settings) -> Checked {
    require(
        v.as_ref().is_none_or(WebhookSecret::is_usable),
        "at least 32 visible ASCII characters without spaces",
    )
}

/// A namespace CloudWatch keeps the metrics of: 1 to 255 of ASCII letters, digits and
/// `. - _ / # :` and space, at least one of them not a space, not starting with `:` (the API's
/// pattern `[^:].*`) nor with `AWS/` (reserved). CloudWatch drops EMF records in any other
/// namespace: every metric and alarm would be silently gone.
pub fn is_metrics_namespace(v: &str) -> bool {
    (1..=255).contains(&v.len())
        && v.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/' | b'#' | b':' | b' ')
        })
        && v.bytes().any(|b| b != b' ')
        && !v.starts_with(':')
        && !v.starts_with("AWS/")
}

pub(super) fn metrics_namespace(v: &String, _: &Settings) -> Checked {
    require(
        is_metrics_namespace(v),
        "a CloudWatch namespace: 1 to 255 of ASCII letters, digits, . - _ / # : and space, not \
         all spaces, not starting with ':' or AWS/",
    )
}
