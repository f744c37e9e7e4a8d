//! [`Settings::validate`]: every row's check ([`super::row::Entry::check`]: bounds and rule), then
//! what no single value shows, one concern per check, each naming its row.

use std::time::Duration;

use super::table::{
    CAPACITY_SPREAD, CAPACITY_SPREAD_MAX, CONCURRENCY, CONCURRENT_INVOCATIONS, DEADLINE_MARGIN,
    EMULATED_INVOCATION, FUNCTION_TIMEOUT, LEASE_REFRESH_INTERVAL, LEASE_TTL, MIN_CLAIM_BUDGET,
    VARIABLES, Variable, WAKE_QUEUE_URL, WEBHOOK_SECRET,
};
use super::{
    DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY, FunctionRole, MAX_DURATION,
    MAX_RUNS_PER_PROCESS, Problem, Settings, position,
};

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, row: &Variable, reason: impl Into<String>) {
        self.0.push(Problem {
            variable: row.variable(),
            setter: row.setter(),
            reason: reason.into(),
        });
    }

    /// Whether a problem of `row` is known already (its value alone cannot work).
    fn has(&self, row: &Variable) -> bool {
        self.0.iter().any(|p| p.variable == row.variable())
    }
}

/// Every problem of `s`, in the order of [`VARIABLES`].
pub(super) fn problems(s: &Settings) -> Vec<Problem> {
    let mut p = Problems::default();
    for row in VARIABLES.iter().copied() {
        if let Err(expected) = row.check(s) {
            p.add(
                row,
                format!("expected {expected}, found {}", row.current(s)),
            );
        }
    }
    counts(s, &mut p);
    deadline(s, &mut p);
    lease(s, &mut p);
    spread(s, &mut p);
    wake(s, &mut p);
    receiver(s, &mut p);
    p.0.sort_by_key(|problem| position(problem.variable));
    p.0
}

/// M × C runs at once in one process, one thread each.
fn counts(s: &Settings, p: &mut Problems) {
    let per_process = s.concurrent_invocations.saturating_mul(s.concurrency);
    if per_process > MAX_RUNS_PER_PROCESS {
        // The variable to lower: M when several invocations share the process, else C.
        let row: &Variable = if s.concurrent_invocations > 1 {
            &CONCURRENT_INVOCATIONS
        } else {
            &CONCURRENCY
        };
        p.add(
            row,
            format!(
                "{per_process} runs at once in one process (AWS_LAMBDA_MAX_CONCURRENCY {} × \
                 IRONFLOW_CONCURRENCY {}), above {MAX_RUNS_PER_PROCESS} (one thread each): lower \
                 the function's PerExecutionEnvironmentMaxConcurrency or IRONFLOW_CONCURRENCY",
                s.concurrent_invocations, s.concurrency
            ),
        );
    }
}

/// `d` as an operator writes it: whole seconds as `30 s`, anything finer in milliseconds.
fn shown(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The margin, the minimum claim budget and an emulated invocation against the timeout. Each
/// check is made only when the values it compares have no problem of their own: one bad value
/// is reported once, against its own variable.
fn deadline(s: &Settings, p: &mut Problems) {
    let (margin, timeout) = (s.deadline_margin, s.function_timeout);
    let timeout_ok = !p.has(&FUNCTION_TIMEOUT);
    if timeout_ok && !p.has(&DEADLINE_MARGIN) && margin >= timeout {
        p.add(
            &DEADLINE_MARGIN,
            format!(
                "{} is not below the function timeout {}: no invocation would have time to run",
                shown(margin),
                shown(timeout)
            ),
        );
    }
    let budget = s.min_claim_budget;
    if timeout_ok
        && !p.has(&MIN_CLAIM_BUDGET)
        && !p.has(&DEADLINE_MARGIN)
        && budget
            .checked_add(margin)
            .is_none_or(|both| both >= timeout)
    {
        p.add(
            &MIN_CLAIM_BUDGET,
            format!(
                "{} plus the margin {} is not below the function timeout {}: no run would ever \
                 be claimed",
                shown(budget),
                shown(margin),
                shown(timeout)
            ),
        );
    }
    if let Some(length) = s.emulated_invocation
        && !p.has(&EMULATED_INVOCATION)
        && !p.has(&DEADLINE_MARGIN)
        && length <= margin
        && length <= MAX_DURATION
    {
        p.add(
            &EMULATED_INVOCATION,
            format!(
                "{} is not above the deadline margin {}: no emulated invocation would have time \
                 to run",
                shown(length),
                shown(margin)
            ),
        );
    }
}

/// The lease must be refreshed before it expires.
fn lease(s: &Settings, p: &mut Problems) {
    let (ttl, interval) = (s.lease_ttl, s.lease_refresh_interval);
    if !p.has(&LEASE_REFRESH_INTERVAL) && !p.has(&LEASE_TTL) && interval >= ttl {
        p.add(
            &LEASE_REFRESH_INTERVAL,
            format!(
                "{} is not below the lease TTL {}: the lease would expire between refreshes",
                shown(interval),
                shown(ttl)
            ),
        );
    }
}

/// The most a capacity wake-up is spread over, when set, cannot be below the least: it would be
/// ignored. Left at its default, it rises to the least (`store/spread.rs`), as it always has.
fn spread(s: &Settings, p: &mut Problems) {
    let (least, most) = (s.capacity_spread, s.capacity_spread_max);
    let most_set = most != CAPACITY_SPREAD_MAX.default;
    if most_set && !p.has(&CAPACITY_SPREAD) && !p.has(&CAPACITY_SPREAD_MAX) && most < least {
        p.add(
            &CAPACITY_SPREAD_MAX,
            format!(
                "{} is below IRONFLOW_CAPACITY_SPREAD_SECS {}: the most a wake-up is spread \
                 over cannot be below the least; raise it, or lower the other",
                shown(most),
                shown(least)
            ),
        );
    }
}

/// A wake-up setting without a queue would be ignored without a word.
fn wake(s: &Settings, p: &mut Problems) {
    let defaults = (DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY);
    if s.wake_queue_url.is_none() && (s.max_wakeups_per_invocation, s.wake_delay) != defaults {
        p.add(
            &WAKE_QUEUE_URL,
            "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION or IRONFLOW_WAKE_DELAY_SECS is set, and they \
             apply only to a wake queue: set the queue's URL, or unset them to send no wake-ups",
        );
    }
}

/// The webhook receiver only answers pushes, and answers each without a secret 503: it needs
/// one (docs/push.md, "The webhook receiver").
fn receiver(s: &Settings, p: &mut Problems) {
    if s.function_role == FunctionRole::WebhookReceiver
        && s.webhook_secret.is_none()
        && s.webhook_secret_arn.is_none()
    {
        p.add(
            &WEBHOOK_SECRET,
            "IRONFLOW_FUNCTION_ROLE=webhook-receiver needs the webhook secret, and neither \
             IRONFLOW_WEBHOOK_SECRET nor IRONFLOW_WEBHOOK_SECRET_ARN is set: without it every \
             push is answered 503 and every other event refused; set one of them, or unset \
             IRONFLOW_FUNCTION_ROLE to run the worker",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::Settings;
    use crate::settings::tests::lookup;

    fn from(extra: &[(&str, &str)]) -> Result<Settings, String> {
        let mut vars = vec![
            ("IRONFLOW_API_URL", "http://127.0.0.1:3000"),
            ("IRONFLOW_WORKER_TOKEN", "s3cr3t-token"),
            (
                "IRONFLOW_WAKE_QUEUE_URL",
                "https://sqs.eu-west-1.amazonaws.com/123456789012/q",
            ),
        ];
        vars.extend_from_slice(extra);
        Settings::from_lookup(lookup(&vars)).map_err(|e| e.to_string())
    }

    #[test]
    fn one_bad_value_is_reported_once_against_its_own_variable() {
        for (variable, others) in [
            (
                "IRONFLOW_LEASE_TTL_SECS",
                ["IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", ""],
            ),
            (
                "IRONFLOW_FUNCTION_TIMEOUT_SECS",
                [
                    "IRONFLOW_DEADLINE_MARGIN_MS",
                    "IRONFLOW_MIN_CLAIM_BUDGET_MS",
                ],
            ),
        ] {
            let err = from(&[(variable, "0")]).unwrap_err();
            assert!(err.contains(variable), "{err}");
            for other in others.iter().filter(|o| !o.is_empty()) {
                assert!(!err.contains(other), "{other} blamed for {variable}: {err}");
            }
        }
        // A real conflict names the values in their variables' units.
        let err = from(&[
            ("IRONFLOW_LEASE_TTL_SECS", "10"),
            ("IRONFLOW_LEASE_REFRESH_INTERVAL_SECS", "30"),
        ])
        .unwrap_err();
        assert!(
            err.contains("30 s is not below the lease TTL 10 s"),
            "{err}"
        );
    }

    #[test]
    fn a_capacity_spread_whose_most_is_below_its_least_is_refused_naming_both() {
        let err = from(&[
            ("IRONFLOW_CAPACITY_SPREAD_SECS", "300"),
            ("IRONFLOW_CAPACITY_SPREAD_MAX_SECS", "30"),
        ])
        .unwrap_err();
        assert!(
            err.contains("IRONFLOW_CAPACITY_SPREAD_MAX_SECS")
                && err.contains("IRONFLOW_CAPACITY_SPREAD_SECS 300 s"),
            "{err}"
        );
        from(&[
            ("IRONFLOW_CAPACITY_SPREAD_SECS", "30"),
            ("IRONFLOW_CAPACITY_SPREAD_MAX_SECS", "30"),
        ])
        .unwrap();
        // The most left at its default (300 s) rises to a larger least, as before.
        from(&[("IRONFLOW_CAPACITY_SPREAD_SECS", "600")]).unwrap();
    }

    #[test]
    fn the_receiver_without_a_webhook_secret_is_refused_naming_both_variables() {
        let role = ("IRONFLOW_FUNCTION_ROLE", "webhook-receiver");
        let err = from(&[role]).unwrap_err();
        for named in [
            "IRONFLOW_WEBHOOK_SECRET ",
            "IRONFLOW_WEBHOOK_SECRET_ARN",
            "webhook-receiver",
        ] {
            assert!(err.contains(named), "{named}: {err}");
        }
        // Either secret, or the worker's role, is accepted.
        let secret = "a-receiver-secret-of-at-least-32-characters";
        from(&[role, ("IRONFLOW_WEBHOOK_SECRET", secret)]).unwrap();
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-AbCdEf";
        from(&[role, ("IRONFLOW_WEBHOOK_SECRET_ARN", arn)]).unwrap();
        from(&[("IRONFLOW_FUNCTION_ROLE", "worker")]).unwrap();
        from(&[]).unwrap();
        // A builder's settings are checked by the same rule.
        let mut s = from(&[]).unwrap();
        s.function_role = crate::settings::FunctionRole::WebhookReceiver;
        let problems = s.validate();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].variable, "IRONFLOW_WEBHOOK_SECRET");
    }
}
