//! [`Settings::validate`]: what cannot work in a set of settings, one concern per check.

use super::table::{self, is_namespace};
use super::url::without_userinfo;
use super::{
    DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY, LEASE_TTL_RANGE, MAX_DURATION,
    MAX_RUNS_PER_PROCESS, MIN_CLAIM_BUDGET, MIN_DEADLINE_MARGIN, Problem, Settings,
    api_url_problem, position,
};

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, variable: &'static str, reason: impl Into<String>) {
        let setter = table::variable(variable).map_or("?", |v| v.setter);
        self.0.push(Problem {
            variable,
            setter,
            reason: reason.into(),
        });
    }
}

/// Every problem of `s`, in the order of [`VARIABLES`].
pub(super) fn problems(s: &Settings) -> Vec<Problem> {
    let mut p = Problems::default();
    url(s, &mut p);
    durations(s, &mut p);
    counts(s, &mut p);
    deadline(s, &mut p);
    lease(s, &mut p);
    poison(s, &mut p);
    wake(s, &mut p);
    p.0.sort_by_key(|problem| position(problem.variable));
    p.0
}

fn url(s: &Settings, p: &mut Problems) {
    if let Some(expected) = api_url_problem(&s.api_url, s.allow_insecure_http) {
        let found = without_userinfo(&s.api_url);
        p.add(
            "IRONFLOW_API_URL",
            format!("expected {expected}, found {found:?}"),
        );
    }
}

/// Every duration must be one a deadline can be computed from.
fn durations(s: &Settings, p: &mut Problems) {
    let durations = [
        ("IRONFLOW_RUN_TIMEOUT_SECS", s.run_timeout),
        ("IRONFLOW_DEADLINE_MARGIN_MS", s.deadline_margin),
        ("IRONFLOW_MIN_CLAIM_BUDGET_MS", s.min_claim_budget),
        ("IRONFLOW_FUNCTION_TIMEOUT_SECS", s.function_timeout),
        (
            "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
            s.lease_refresh_interval,
        ),
        ("IRONFLOW_POISON_COOLDOWN_SECS", s.poison.cooldown),
        ("IRONFLOW_MAX_CAPACITY_WAIT_SECS", s.max_capacity_wait),
        (
            "IRONFLOW_EMULATED_INVOCATION_SECS",
            s.emulated_invocation.unwrap_or_default(),
        ),
    ];
    for (variable, d) in durations.iter().filter(|(_, d)| *d > MAX_DURATION) {
        let (secs, max) = (d.as_secs(), MAX_DURATION.as_secs());
        p.add(
            variable,
            format!("{secs} s is too large: at most {max} s (100 years)"),
        );
    }
}

fn counts(s: &Settings, p: &mut Problems) {
    if s.max_runs_per_invocation == 0 {
        p.add("IRONFLOW_MAX_RUNS_PER_INVOCATION", "must be at least 1");
    }
    if s.concurrency == 0 {
        p.add("IRONFLOW_CONCURRENCY", "must be at least 1");
    }
    if s.concurrent_invocations == 0 {
        p.add("AWS_LAMBDA_MAX_CONCURRENCY", "must be at least 1");
    }
    let per_process = s.concurrent_invocations.saturating_mul(s.concurrency);
    if per_process > MAX_RUNS_PER_PROCESS {
        // The variable to lower: M when several invocations share the process, else C.
        let variable = if s.concurrent_invocations > 1 {
            "AWS_LAMBDA_MAX_CONCURRENCY"
        } else {
            "IRONFLOW_CONCURRENCY"
        };
        p.add(
            variable,
            format!(
                "{per_process} runs at once in one process (AWS_LAMBDA_MAX_CONCURRENCY {} × \
                 IRONFLOW_CONCURRENCY {}), above {MAX_RUNS_PER_PROCESS} (one thread each): lower \
                 the function's PerExecutionEnvironmentMaxConcurrency or IRONFLOW_CONCURRENCY",
                s.concurrent_invocations, s.concurrency
            ),
        );
    }
    if s.run_timeout.is_zero() {
        p.add("IRONFLOW_RUN_TIMEOUT_SECS", "must be above zero");
    }
    if s.max_handbacks_without_progress == 0 {
        p.add(
            "IRONFLOW_MAX_HANDBACKS_WITHOUT_PROGRESS",
            "must be at least 1",
        );
    }
}

/// The margin, the minimum claim budget and an emulated invocation against the timeout.
fn deadline(s: &Settings, p: &mut Problems) {
    let (margin, timeout) = (s.deadline_margin, s.function_timeout);
    if margin < MIN_DEADLINE_MARGIN {
        p.add(
            "IRONFLOW_DEADLINE_MARGIN_MS",
            format!(
                "{margin:?} is below {MIN_DEADLINE_MARGIN:?}: the handback and the response need \
                 that much before the deadline"
            ),
        );
    } else if margin >= timeout {
        p.add(
            "IRONFLOW_DEADLINE_MARGIN_MS",
            format!(
                "{margin:?} is not below the function timeout {timeout:?}: no invocation would \
                 have time to run"
            ),
        );
    }
    let budget = s.min_claim_budget;
    if budget < MIN_CLAIM_BUDGET {
        p.add(
            "IRONFLOW_MIN_CLAIM_BUDGET_MS",
            format!(
                "{budget:?} is below {MIN_CLAIM_BUDGET:?}: a claim needs time to be answered \
                 before the cutoff"
            ),
        );
    } else if budget
        .checked_add(margin)
        .is_none_or(|both| both >= timeout)
    {
        p.add(
            "IRONFLOW_MIN_CLAIM_BUDGET_MS",
            format!(
                "{budget:?} plus the margin {margin:?} is not below the function timeout \
                 {timeout:?}: no run would ever be claimed"
            ),
        );
    }
    if let Some(length) = s.emulated_invocation
        && length <= margin
        && length <= MAX_DURATION
    {
        p.add(
            "IRONFLOW_EMULATED_INVOCATION_SECS",
            format!(
                "{length:?} is not above the deadline margin {margin:?}: no emulated invocation \
                 would have time to run"
            ),
        );
    }
}

fn lease(s: &Settings, p: &mut Problems) {
    let (ttl, interval) = (s.lease_ttl, s.lease_refresh_interval);
    if !LEASE_TTL_RANGE.contains(&ttl) {
        p.add(
            "IRONFLOW_LEASE_TTL_SECS",
            format!("{ttl:?} is outside 1 to 3600 s, the lease TTLs the API accepts"),
        );
    } else if ttl.subsec_nanos() != 0 {
        p.add(
            "IRONFLOW_LEASE_TTL_SECS",
            format!(
                "{ttl:?} is not a whole number of seconds: the API takes the lease TTL in whole \
                 seconds (a fraction is dropped), and the worker would trust its lease longer \
                 than the API keeps it"
            ),
        );
    }
    if interval.is_zero() || interval >= ttl {
        p.add(
            "IRONFLOW_LEASE_REFRESH_INTERVAL_SECS",
            format!(
                "{interval:?} is not above zero and below the lease TTL {ttl:?}: the lease would \
                 expire between refreshes"
            ),
        );
    }
}

fn poison(s: &Settings, p: &mut Problems) {
    if s.poison.threshold == 0 {
        p.add("IRONFLOW_POISON_THRESHOLD", "must be at least 1");
    }
    if !is_namespace(&s.poison_namespace) {
        p.add(
            "IRONFLOW_POISON_NAMESPACE",
            "must be 1 to 200 bytes without '#' or control characters",
        );
    }
}

/// A wake-up setting without a queue would be ignored without a word; a short webhook secret
/// is guessable.
fn wake(s: &Settings, p: &mut Problems) {
    if s.webhook_secret.as_ref().is_some_and(|w| !w.is_usable()) {
        p.add(
            "IRONFLOW_WEBHOOK_SECRET",
            "must be at least 32 visible ASCII characters without spaces (not shown: it is a \
             secret)",
        );
    }
    let window = s.webhook_replay_window;
    if window < std::time::Duration::from_secs(1) || window > super::MAX_WEBHOOK_REPLAY_WINDOW {
        p.add(
            "IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS",
            "must be from 1 s to 3600 s",
        );
    }
    let defaults = (DEFAULT_MAX_WAKEUPS_PER_INVOCATION, DEFAULT_WAKE_DELAY);
    if s.wake_queue_url.is_none() && (s.max_wakeups_per_invocation, s.wake_delay) != defaults {
        p.add(
            "IRONFLOW_WAKE_QUEUE_URL",
            "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION or IRONFLOW_WAKE_DELAY_SECS is set, and they \
             apply only to a wake queue: set the queue's URL, or unset them to send no wake-ups",
        );
    }
}
