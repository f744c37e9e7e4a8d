//! One Converse call of a step, bounded and retried: what the call may wait for, and what a
//! failure becomes.
//!
//! 1. Each attempt is bounded by the per-call limit and by the invocation's cutoff (the time
//!    left: [`crate::store::scope::CallScope::execution_cutoff`]), whichever comes first. Past
//!    either, the call is dropped and the step gets [`AgentError::Timeout`]; at the cutoff the
//!    run's supervisor hands the run back anyway.
//! 2. Throttling, 5xx and a model not ready are retried with jittered exponential backoff
//!    (0.2 s doubling to 5 s) while the next attempt starts within the retry window and before
//!    the cutoff. After that the step asks for a capacity wait ([`capacity_wait`]): the run sleeps
//!    and a timer wakes it; it is no failure and nothing counts it.
//!    An error the SDK does not model is judged by the answer's HTTP status: a 429 or a 5xx
//!    (a proxy's 502 page, AWS's `InternalFailure`) is capacity as well.
//! 3. A connection that fails or is cut, and an answer with a success status that cannot be
//!    read, are retried the same way, then fail the step with
//!    [`AgentError::HttpProvider`] (status 0): an unreachable endpoint (no NAT or VPC endpoint)
//!    is a configuration fault, not a lack of capacity.
//!    A call that could not be signed (no credentials) fails the step at once
//!    ([`AgentError::Api`], code `NoCredentials`, status 401: not retried); a credential
//!    provider that timed out or failed is a network fault.
//! 4. Anything else Bedrock refuses (an unknown model id, a permission the role lacks, a request
//!    or schema it finds invalid) fails the step at once with [`AgentError::Api`] naming the
//!    model, Bedrock's error code and message: retrying it cannot succeed.

use std::time::Duration;

use aws_sdk_bedrockruntime::config::http::HttpResponse;
use aws_sdk_bedrockruntime::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::operation::converse::builders::ConverseFluentBuilder;
use aws_sdk_bedrockruntime::operation::converse::{ConverseError, ConverseOutput};
use chrono::{DateTime, TimeDelta, Utc};
use ironflow_core::error::AgentError;
use ironflow_core::provider::AgentConfig;
use tokio::time::{Instant, sleep, timeout_at};
use tracing::{info, warn};

use crate::aws_faults::no_credentials;
use crate::deadline::later;
use crate::store::scope::{CallScope, ModelCall};

/// The provider kind of a capacity wait (what the run's `capacity_wait_kind` names).
pub(crate) const KIND: &str = "bedrock";

/// First and longest backoff between two attempts (before jitter).
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The bounds of a step's calls (the provider's setters).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Longest one attempt may take.
    pub call_limit: Duration,
    /// How long throttling, 5xx and cut connections are retried from the first failure.
    pub retry_window: Duration,
    /// How long the run sleeps before the step is tried again (plus up to a quarter of jitter).
    pub capacity_pause: Duration,
    /// The capacity-wait budget of a step that sets none.
    pub max_capacity_wait: Duration,
}

/// A refusal that no retry can overcome: [`AgentError::Api`] with `status` and Bedrock's `code`.
pub(crate) fn refused(status: u16, code: &str, message: String) -> AgentError {
    AgentError::Api {
        status: Some(status),
        code: Some(code.to_string()),
        message,
    }
}

/// What a failed attempt was.
enum Failure {
    /// Throttled, 5xx, the model not ready or timed out on Bedrock's side.
    Capacity(String),
    /// The connection failed, was cut, or the answer could not be read.
    Network(String),
    /// Refused for good.
    Refused(AgentError),
}

/// Send the request `request` builds (once per attempt, `request_chars` characters of text) to
/// `model`, bounded and retried as the module docs say, for the step `config`. An attempt dropped
/// before its answer counts as a cut call ([`ModelCall`]).
pub(crate) async fn converse(
    request: impl Fn() -> ConverseFluentBuilder,
    request_chars: u64,
    model: &str,
    config: &AgentConfig,
    limits: &Limits,
) -> Result<ConverseOutput, AgentError> {
    let cutoff = CallScope::execution_cutoff();
    let mut retry_end: Option<Instant> = None;
    let mut attempt: u32 = 0;
    loop {
        let now = Instant::now();
        let own_limit = later(now, limits.call_limit);
        let bound = cutoff.map_or(own_limit, |c| own_limit.min(c));
        let call = ModelCall::start(request_chars);
        let answer = timeout_at(bound, request().send()).await;
        if answer.is_ok() {
            call.answered();
        } else {
            drop(call);
        }
        let failure = match answer {
            Ok(Ok(output)) => return Ok(output),
            Ok(Err(err)) => classify(&err, model),
            Err(_) => {
                let limit = bound.saturating_duration_since(now);
                warn!(
                    model,
                    limit_ms = limit.as_millis() as u64,
                    cut_by_cutoff = bound < own_limit,
                    "Bedrock call dropped at its bound"
                );
                return Err(AgentError::Timeout { limit });
            }
        };
        let (why, network) = match failure {
            Failure::Refused(err) => return Err(err),
            Failure::Capacity(why) => (why, false),
            Failure::Network(why) => (why, true),
        };
        let window_end = *retry_end.get_or_insert_with(|| later(now, limits.retry_window));
        let delay = backoff(attempt);
        let next = later(Instant::now(), delay);
        if next < window_end && cutoff.is_none_or(|c| next < c) {
            info!(model, attempt = attempt + 1, delay_ms = delay.as_millis() as u64, error = %why, "Bedrock call failed, retrying");
            sleep(delay).await;
            attempt = attempt.saturating_add(1);
            continue;
        }
        return Err(if network {
            AgentError::HttpProvider {
                provider: KIND.to_string(),
                status_code: 0,
                message: format!("Bedrock model '{model}' could not be reached: {why}"),
            }
        } else {
            capacity_wait(
                config,
                &Sleep {
                    kind: KIND,
                    pause: limits.capacity_pause,
                    default_budget: limits.max_capacity_wait,
                    model,
                },
                &why,
            )
        });
    }
}

/// What the failure `err` of a call to `model` was. The answer's HTTP status decides what the
/// SDK does not model: a 429 or a 5xx from anything on the way (a proxy's 502 page, a 429
/// without an error type, AWS's `InternalFailure`) is capacity, and a success status whose body
/// could not be read is a network fault; both are retried, never a refusal.
fn classify(err: &SdkError<ConverseError, HttpResponse>, model: &str) -> Failure {
    match err {
        SdkError::ServiceError(service) => {
            let e = service.err();
            let code = e.code().unwrap_or("UnknownError");
            let message = e.message().unwrap_or("no message");
            let http = service.raw().status().as_u16();
            let status = status_of(e).unwrap_or(http);
            let transient = e.is_throttling_exception()
                || e.is_service_unavailable_exception()
                || e.is_internal_server_exception()
                || e.is_model_not_ready_exception()
                || e.is_model_timeout_exception()
                || http == 429
                || http >= 500;
            if transient {
                Failure::Capacity(format!("HTTP {http}, {code}: {message}"))
            } else if http < 400 {
                Failure::Network(format!(
                    "Bedrock's answer (HTTP {http}) could not be read: {}",
                    DisplayErrorContext(err)
                ))
            } else {
                Failure::Refused(refused(
                    status,
                    code,
                    format!("Bedrock refused the call to model '{model}': {code}: {message}"),
                ))
            }
        }
        // 401: not retried, by ironflow either (a status of None would be).
        SdkError::DispatchFailure(_) if no_credentials(err) => Failure::Refused(AgentError::Api {
            status: Some(401),
            code: Some("NoCredentials".to_string()),
            message: format!(
                "no AWS credentials to sign the call to Bedrock model '{model}' (the function's \
                 role, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY): {}",
                DisplayErrorContext(err)
            ),
        }),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Failure::Network(DisplayErrorContext(err).to_string())
        }
        other => Failure::Refused(refused(
            400,
            "RequestNotBuilt",
            format!(
                "the request to Bedrock model '{model}' could not be built: {}",
                DisplayErrorContext(other)
            ),
        )),
    }
}

/// The HTTP status a modelled Bedrock error stands for; `None` for one the SDK does not model
/// (the answer's own status then stands).
fn status_of(e: &ConverseError) -> Option<u16> {
    Some(if e.is_access_denied_exception() {
        403
    } else if e.is_resource_not_found_exception() {
        404
    } else if e.is_model_error_exception() {
        424
    } else if e.is_throttling_exception() || e.is_model_not_ready_exception() {
        429
    } else if e.is_model_timeout_exception() {
        408
    } else if e.is_internal_server_exception() {
        500
    } else if e.is_service_unavailable_exception() {
        503
    } else if e.is_validation_exception() {
        400
    } else {
        return None;
    })
}

/// The backoff before attempt `attempt + 1`: 0.2 s doubling up to 5 s, each drawn between half
/// and all of it.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(MAX_BACKOFF);
    let ms = u64::try_from(full.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::random_range(ms / 2..=ms))
}

/// The longest one capacity pause lasts, whatever asks for more (a `retry-after` of years, a
/// provider's pause): the run wakes then, within its budget, and the step is tried again.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(24 * 3600);

/// What a capacity wait is about: the provider `kind` (the run's `capacity_wait_kind`), how long
/// the run sleeps (`pause`, plus up to a quarter of jitter), the budget of a step that sets none,
/// and the model (for the log line).
pub(crate) struct Sleep<'a> {
    pub kind: &'static str,
    pub pause: Duration,
    pub default_budget: Duration,
    pub model: &'a str,
}

/// Ask the engine to put the run to sleep and try the step again later, the model having been
/// throttled (or failing with 5xx) for the whole retry window (`why`: the last error).
///
/// The run wakes after `sleep.pause` (Bedrock gives no reset time; Anthropic's `retry-after`
/// when it sends one), plus up to a quarter of it (jitter, so that runs throttled together do
/// not come back together). The whole wait of the step, across wake-ups (from
/// `AgentConfig::capacity_wait_since`, which the engine sets), stays within the step's
/// `max_capacity_wait` (else `sleep.default_budget`): the last wake-up is at the end of that
/// budget, and past it the step fails with [`AgentError::NoCapacity`]. A budget of zero fails
/// at once.
pub(crate) fn capacity_wait(config: &AgentConfig, sleep: &Sleep<'_>, why: &str) -> AgentError {
    let (kind, model) = (sleep.kind, sleep.model);
    let budget = config.max_capacity_wait.unwrap_or(sleep.default_budget);
    let now = Utc::now();
    let no_capacity = AgentError::NoCapacity {
        kind: kind.to_string(),
        next_reset: None,
    };
    if budget.is_zero() {
        warn!(kind, model, error = %why, "the model throttled the step and it may not wait (max_capacity_wait 0): failing it");
        return no_capacity;
    }
    let since = config.capacity_wait_since.unwrap_or(now);
    // Saturating: a budget of centuries ends at the calendar's end, not in a panic.
    let last = TimeDelta::from_std(budget)
        .ok()
        .and_then(|budget| since.checked_add_signed(budget))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let pause_ms = u64::try_from(sleep.pause.min(MAX_PAUSE).as_millis()).unwrap_or(u64::MAX);
    let jittered = pause_ms.saturating_add(rand::random_range(0..=pause_ms / 4));
    let wake_at = TimeDelta::try_milliseconds(i64::try_from(jittered).unwrap_or(i64::MAX))
        .and_then(|pause| now.checked_add_signed(pause))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let wake_at = if wake_at <= last {
        wake_at
    } else if last > now {
        last
    } else {
        warn!(kind, model, error = %why, budget_secs = budget.as_secs(), "the model still throttles the step after its whole capacity-wait budget: failing it");
        return no_capacity;
    };
    warn!(kind, model, error = %why, wake_at = %wake_at, "the model throttled the step through its retries: the run sleeps until capacity returns");
    AgentError::CapacityWait {
        kind: kind.to_string(),
        wake_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pause: u64, budget: u64) -> Sleep<'static> {
        Sleep {
            kind: KIND,
            pause: Duration::from_secs(pause),
            default_budget: Duration::from_secs(budget),
            model: "m",
        }
    }

    #[test]
    fn a_capacity_wait_wakes_after_the_pause_within_the_budget() {
        let config = AgentConfig::new("p");
        let before = Utc::now();
        let AgentError::CapacityWait { kind, wake_at } =
            capacity_wait(&config, &limits(60, 3600), "x")
        else {
            panic!("expected a capacity wait");
        };
        assert_eq!(kind, KIND);
        assert!(
            wake_at >= before + TimeDelta::seconds(60)
                && wake_at <= Utc::now() + TimeDelta::seconds(75)
        );
        // Near the end of the budget: the last wake-up is at its end.
        let config = AgentConfig::new("p")
            .max_capacity_wait(Duration::from_secs(100))
            .capacity_wait_since(before - TimeDelta::seconds(70));
        let AgentError::CapacityWait { wake_at, .. } =
            capacity_wait(&config, &limits(60, 3600), "x")
        else {
            panic!("expected a capacity wait");
        };
        assert_eq!(wake_at, before + TimeDelta::seconds(30));
        // Past it, or with no budget: no capacity.
        let config = AgentConfig::new("p")
            .max_capacity_wait(Duration::from_secs(100))
            .capacity_wait_since(before - TimeDelta::seconds(101));
        assert!(matches!(
            capacity_wait(&config, &limits(60, 3600), "x"),
            AgentError::NoCapacity { .. }
        ));
        assert!(matches!(
            capacity_wait(&AgentConfig::new("p"), &limits(60, 0), "x"),
            AgentError::NoCapacity { .. }
        ));
    }

    #[test]
    fn a_capacity_wait_of_any_length_saturates_instead_of_overflowing() {
        let huge = Sleep {
            kind: KIND,
            pause: Duration::from_secs(u64::MAX),
            default_budget: Duration::from_secs(u64::MAX),
            model: "m",
        };
        let before = Utc::now();
        for config in [
            AgentConfig::new("p"),
            AgentConfig::new("p").max_capacity_wait(Duration::from_secs(u64::MAX)),
            AgentConfig::new("p")
                .max_capacity_wait(Duration::MAX)
                .capacity_wait_since(DateTime::<Utc>::MAX_UTC - TimeDelta::seconds(1)),
        ] {
            let AgentError::CapacityWait { wake_at, .. } = capacity_wait(&config, &huge, "x")
            else {
                panic!("expected a capacity wait");
            };
            let longest = TimeDelta::from_std(MAX_PAUSE + MAX_PAUSE / 4).unwrap();
            assert!(wake_at <= Utc::now() + longest, "{wake_at}");
            assert!(wake_at >= before + TimeDelta::from_std(MAX_PAUSE).unwrap());
        }
    }

    #[test]
    fn backoff_grows_jittered_and_capped() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            assert!(d <= MAX_BACKOFF, "{d:?}");
            assert!(d >= FIRST_BACKOFF / 2, "{d:?}");
        }
    }
}
