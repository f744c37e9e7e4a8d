//! Wake-ups: SQS messages that start queue-triggered invocations, so that a backlog keeps
//! draining without waiting for the next schedule tick.
//!
//! After a batch that handed runs back (released runs claimed ahead count as handed back), or
//! that took all the runs it was asked for (its N) while the API still reports pending runs,
//! the invocation sends wake-ups to
//! `IRONFLOW_WAKE_QUEUE_URL`:
//!
//! ```text
//! pending  = GET /api/v1/internal/runs/pending-count (this batch's claim capabilities)
//! queued   = wake-ups already waiting on the queue (ApproximateNumberOfMessages + ...Delayed)
//! messages = min(ceil(pending / N) − queued, IRONFLOW_MAX_WAKEUPS_PER_INVOCATION)
//! ```
//!
//! Unknown backlog (the count failed): one wake-up, unless one is already queued. Wake-ups after
//! a handback carry `DelaySeconds` (`IRONFLOW_WAKE_DELAY_SECS`): the instance that sent them is
//! about to return, and a wake-up delivered a few seconds later finds it warm instead of cold
//! starting a second one. A duplicate or surplus wake-up is harmless: it claims what is there,
//! or finds nothing and sends nothing. A failure is logged and reported in the summary's
//! `wake_ups.errors`; it never fails the batch. The whole phase ends before the invocation
//! deadline (at most [`WAKE_PHASE_TIMEOUT`], keeping [`WAKE_DEADLINE_RESERVE`] free): nothing is
//! left running when the handler returns.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `IRONFLOW_WAKE_QUEUE_URL` | the SQS queue that triggers the function; unset: no wake-ups | none |
//! | `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION` | wake-up messages one invocation sends at most (1 to 10) | 3 |
//! | `IRONFLOW_WAKE_DELAY_SECS` | `DelaySeconds` of wake-ups sent after a handback (0 to 900) | 5 |

use std::time::Duration;

use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use ironflow_store::entities::WorkerCapabilities;
use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};

use crate::api::ApiClient;
use crate::config::ConfigError;
use crate::deadline::Budget;
use crate::report::{WakeReport, WakeTrigger};

/// Default of `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`: 3. Each wake-up starts a batch of up to N
/// runs, so a backlog's draining can triple from one hop to the next, and never grows beyond
/// what the backlog needs.
pub const DEFAULT_MAX_WAKEUPS_PER_INVOCATION: usize = 3;
/// Upper bound of `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`: 10, what one `SendMessageBatch` holds.
pub const MAX_WAKEUPS_PER_INVOCATION_LIMIT: usize = 10;
/// The wake-up settings that apply only with `IRONFLOW_WAKE_QUEUE_URL`.
const WAKE_OPTIONS: [&str; 2] = [
    "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION",
    "IRONFLOW_WAKE_DELAY_SECS",
];

/// Default of `IRONFLOW_WAKE_DELAY_SECS`: 5 s.
pub const DEFAULT_WAKE_DELAY: Duration = Duration::from_secs(5);
/// SQS's largest `DelaySeconds`: 900 s.
pub const MAX_WAKE_DELAY: Duration = Duration::from_secs(900);
/// Time kept free before the invocation deadline by the wake-up phase: 500 ms.
pub const WAKE_DEADLINE_RESERVE: Duration = Duration::from_millis(500);
/// Longest the wake-up phase takes (pending count, queue attributes, send): 5 s.
pub const WAKE_PHASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how many wake-ups to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeSettings {
    /// The queue's URL (`IRONFLOW_WAKE_QUEUE_URL`).
    pub queue_url: String,
    /// Messages one invocation sends at most (`IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, 1 to 10).
    pub max_per_invocation: usize,
    /// `DelaySeconds` of wake-ups sent after a handback (`IRONFLOW_WAKE_DELAY_SECS`, ≤ 900 s).
    pub handback_delay: Duration,
}

impl WakeSettings {
    /// Settings for `queue_url`, every other value at its default.
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self {
            queue_url: queue_url.into(),
            max_per_invocation: DEFAULT_MAX_WAKEUPS_PER_INVOCATION,
            handback_delay: DEFAULT_WAKE_DELAY,
        }
    }

    /// Settings from the environment; `None` when `IRONFLOW_WAKE_QUEUE_URL` is unset or empty.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the malformed variable; [`ConfigError::Missing`] for
    /// `IRONFLOW_WAKE_QUEUE_URL` when another wake-up variable is set without it.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`WakeSettings::from_env`] over any lookup (the environment, a map in tests).
    ///
    /// # Errors
    ///
    /// As [`WakeSettings::from_env`].
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let Some(queue_url) = get("IRONFLOW_WAKE_QUEUE_URL") else {
            // A wake-up setting without a queue would be ignored without a word.
            if WAKE_OPTIONS.iter().any(|name| get(name).is_some()) {
                return Err(ConfigError::Missing {
                    variable: "IRONFLOW_WAKE_QUEUE_URL",
                    expected: "the wake queue's URL, since IRONFLOW_MAX_WAKEUPS_PER_INVOCATION or \
                               IRONFLOW_WAKE_DELAY_SECS is set (they apply only to a wake queue: \
                               unset them to send no wake-ups)",
                });
            }
            return Ok(None);
        };
        if !(queue_url.starts_with("https://") || queue_url.starts_with("http://")) {
            return Err(ConfigError::Invalid {
                variable: "IRONFLOW_WAKE_QUEUE_URL",
                expected: "the queue's URL, e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/ironflow-wake",
                found: queue_url,
            });
        }
        let mut settings = Self::new(queue_url);
        if let Some(raw) = get("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION") {
            settings.max_per_invocation = raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_WAKEUPS_PER_INVOCATION_LIMIT).contains(n))
                .ok_or(ConfigError::Invalid {
                    variable: "IRONFLOW_MAX_WAKEUPS_PER_INVOCATION",
                    expected: "a whole number from 1 to 10",
                    found: raw,
                })?;
        }
        if let Some(raw) = get("IRONFLOW_WAKE_DELAY_SECS") {
            settings.handback_delay = raw
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs)
                .filter(|d| *d <= MAX_WAKE_DELAY)
                .ok_or(ConfigError::Invalid {
                    variable: "IRONFLOW_WAKE_DELAY_SECS",
                    expected: "a whole number of seconds from 0 to 900",
                    found: raw,
                })?;
        }
        Ok(Some(settings))
    }
}

/// Sends wake-ups to the queue. Build it once per cold start and hand it to
/// [`LambdaWorkerBuilder::wake_ups`](crate::builder::LambdaWorkerBuilder::wake_ups).
#[derive(Debug, Clone)]
pub struct Waker {
    sqs: aws_sdk_sqs::Client,
    settings: WakeSettings,
}

impl Waker {
    /// A waker sending through `sqs` as `settings` say.
    pub fn new(sqs: aws_sdk_sqs::Client, settings: WakeSettings) -> Self {
        Self { sqs, settings }
    }

    /// A waker from the environment: [`WakeSettings::from_env`], and an SQS client over `aws`,
    /// the AWS configuration loaded once at cold start (`aws_config::load_defaults`: region,
    /// credentials, and `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_SQS` for an endpoint override).
    /// `None` without a wake queue.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the malformed variable.
    pub fn from_env(aws: &aws_config::SdkConfig) -> Result<Option<Self>, ConfigError> {
        let Some(settings) = WakeSettings::from_env()? else {
            return Ok(None);
        };
        Ok(Some(Self::new(aws_sdk_sqs::Client::new(aws), settings)))
    }

    /// The settings it sends with.
    pub fn settings(&self) -> &WakeSettings {
        &self.settings
    }
}

/// Wake-up messages a batch sends: `ceil(pending_runs / runs_per_invocation) − queued`, at
/// most `max`. An unknown backlog (`None`) counts as one invocation's worth.
///
/// # Examples
///
/// ```
/// use ironflow_lambda::wake::wake_ups_needed;
/// assert_eq!(wake_ups_needed(Some(17), 0, 8, 10), 3);
/// assert_eq!(wake_ups_needed(Some(17), 2, 8, 10), 1);
/// assert_eq!(wake_ups_needed(Some(100), 0, 8, 3), 3);
/// assert_eq!(wake_ups_needed(Some(0), 0, 8, 3), 0);
/// assert_eq!(wake_ups_needed(None, 0, 8, 3), 1);
/// ```
pub fn wake_ups_needed(
    pending_runs: Option<u64>,
    queued: u64,
    runs_per_invocation: usize,
    max: usize,
) -> usize {
    let per_invocation = u64::try_from(runs_per_invocation.max(1)).unwrap_or(u64::MAX);
    let needed = pending_runs.map_or(1, |p| p.div_ceil(per_invocation));
    usize::try_from(needed.saturating_sub(queued))
        .unwrap_or(usize::MAX)
        .min(max)
}

/// What the wake-up phase needs to know about the batch that just ended.
pub(crate) struct BatchEnd<'a> {
    /// Lambda's request id, written into the wake-ups (`sent_by`).
    pub request_id: &'a str,
    /// Runs handed back by the batch, and runs claimed ahead that it released unexecuted.
    pub handed_back: usize,
    /// Whether the batch took every run it was asked for (`stop_reason` `max_runs`).
    pub filled: bool,
    /// The capabilities the batch claimed with (the poison-pill gate may have narrowed them).
    pub capabilities: &'a WorkerCapabilities,
    /// The invocation's budget: the phase ends before its deadline.
    pub budget: Budget,
}

/// Send the wake-ups the batch calls for. `None` when the worker has no wake queue.
pub(crate) async fn after_batch(
    waker: &Waker,
    api: &ApiClient,
    runs_per_invocation: usize,
    end: BatchEnd<'_>,
) -> Option<WakeReport> {
    let trigger = if end.handed_back > 0 {
        Some(WakeTrigger::HandedBack)
    } else if end.filled {
        Some(WakeTrigger::Backlog)
    } else {
        None
    };
    let mut report = WakeReport {
        trigger,
        ..WakeReport::default()
    };
    let Some(trigger) = report.trigger else {
        return Some(report);
    };
    let Some(until) = end
        .budget
        .deadline()
        .checked_sub(WAKE_DEADLINE_RESERVE)
        .map(|d| d.min(Instant::now() + WAKE_PHASE_TIMEOUT))
        .filter(|until| *until > Instant::now())
    else {
        let error = "no time left before the invocation deadline: wake-ups skipped".to_string();
        warn!(error = %error, "wake-ups skipped");
        report.errors.push(error);
        return Some(report);
    };
    let settings = &waker.settings;

    report.pending_runs = match timeout_at(until, api.pending_runs(end.capabilities)).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => fail(&mut report, format!("pending count failed: {e}")),
        Err(_) => fail(&mut report, "pending count ran into the deadline".into()),
    };
    if report.pending_runs == Some(0) {
        info!(?trigger, "no pending run left: no wake-up needed");
        return Some(report);
    }
    // The SDK's futures are deep: boxed, they keep the handler's future within the compiler's
    // layout depth.
    report.queued = match timeout_at(until, Box::pin(queued_wake_ups(waker))).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => fail(
            &mut report,
            format!("reading the wake queue's depth failed: {e}"),
        ),
        Err(_) => fail(
            &mut report,
            "reading the wake queue's depth ran into the deadline".into(),
        ),
    };
    let count = wake_ups_needed(
        report.pending_runs,
        report.queued.unwrap_or(0),
        runs_per_invocation,
        settings.max_per_invocation,
    );
    if count == 0 {
        info!(
            trigger = trigger.as_str(),
            pending_runs = report.pending_runs,
            queued = report.queued,
            "enough wake-ups already queued"
        );
        return Some(report);
    }
    report.delay_secs = match trigger {
        WakeTrigger::HandedBack => settings.handback_delay.as_secs(),
        WakeTrigger::Backlog => 0,
    };
    let body = serde_json::json!({
        "reason": trigger,
        "pending_runs": report.pending_runs,
        "sent_by": end.request_id,
    })
    .to_string();
    match timeout_at(
        until,
        Box::pin(send(waker, count, &body, report.delay_secs)),
    )
    .await
    {
        Ok((sent, errors)) => {
            report.sent = sent;
            for e in errors {
                fail::<()>(&mut report, e);
            }
        }
        Err(_) => {
            fail::<()>(&mut report, "sending wake-ups ran into the deadline".into());
        }
    }
    info!(
        trigger = trigger.as_str(),
        sent = report.sent,
        pending_runs = report.pending_runs,
        queued = report.queued,
        delay_secs = report.delay_secs,
        "wake-ups sent"
    );
    Some(report)
}

/// Record and log a wake-up error; the value it returns stands for "unknown".
fn fail<T>(report: &mut WakeReport, error: String) -> Option<T> {
    warn!(error = %error, "wake-up phase");
    report.errors.push(error);
    None
}

/// Messages waiting on the wake queue, visible or delayed (in-flight ones are being served).
async fn queued_wake_ups(waker: &Waker) -> Result<u64, String> {
    let output = waker
        .sqs
        .get_queue_attributes()
        .queue_url(&waker.settings.queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
    let attributes = output.attributes();
    let count = |name: QueueAttributeName| {
        attributes
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(count(QueueAttributeName::ApproximateNumberOfMessages)
        + count(QueueAttributeName::ApproximateNumberOfMessagesDelayed))
}

/// Send `count` (≤ 10) wake-ups in one `SendMessageBatch`. Returns how many SQS accepted and
/// the errors.
async fn send(waker: &Waker, count: usize, body: &str, delay_secs: u64) -> (usize, Vec<String>) {
    let delay = i32::try_from(delay_secs).unwrap_or(0);
    let mut entries = Vec::with_capacity(count);
    for i in 0..count.min(MAX_WAKEUPS_PER_INVOCATION_LIMIT) {
        match SendMessageBatchRequestEntry::builder()
            .id(format!("wake-{i}"))
            .message_body(body)
            .delay_seconds(delay)
            .build()
        {
            Ok(entry) => entries.push(entry),
            Err(e) => return (0, vec![format!("building a wake-up failed: {e}")]),
        }
    }
    let output = match waker
        .sqs
        .send_message_batch()
        .queue_url(&waker.settings.queue_url)
        .set_entries(Some(entries))
        .send()
        .await
    {
        Ok(output) => output,
        Err(e) => {
            return (
                0,
                vec![format!(
                    "sending wake-ups failed: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                )],
            );
        }
    };
    let errors = output
        .failed()
        .iter()
        .map(|f| {
            format!(
                "wake-up {} refused: {} {}",
                f.id(),
                f.code(),
                f.message().unwrap_or("")
            )
        })
        .collect();
    (output.successful().len(), errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::lookup;

    #[test]
    fn trigger_names_in_log_lines_match_the_summary_json() {
        for trigger in [WakeTrigger::HandedBack, WakeTrigger::Backlog] {
            assert_eq!(serde_json::to_value(trigger).unwrap(), trigger.as_str());
        }
    }

    const URL: (&str, &str) = (
        "IRONFLOW_WAKE_QUEUE_URL",
        "https://sqs.eu-west-1.amazonaws.com/1/wake",
    );

    #[test]
    fn no_queue_no_wake_ups() {
        assert_eq!(WakeSettings::from_lookup(lookup(&[])).unwrap(), None);
        assert_eq!(
            WakeSettings::from_lookup(lookup(&[("IRONFLOW_WAKE_QUEUE_URL", " ")])).unwrap(),
            None
        );
    }

    #[test]
    fn a_wake_up_setting_without_a_queue_is_refused() {
        for var in WAKE_OPTIONS {
            let err = WakeSettings::from_lookup(lookup(&[(var, "3")])).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(
                    err,
                    ConfigError::Missing {
                        variable: "IRONFLOW_WAKE_QUEUE_URL",
                        ..
                    }
                ),
                "{text}"
            );
            assert!(text.contains(var), "{text}");
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let s = WakeSettings::from_lookup(lookup(&[URL])).unwrap().unwrap();
        assert_eq!(s.max_per_invocation, DEFAULT_MAX_WAKEUPS_PER_INVOCATION);
        assert_eq!(s.handback_delay, DEFAULT_WAKE_DELAY);
        let s = WakeSettings::from_lookup(lookup(&[
            URL,
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "10"),
            ("IRONFLOW_WAKE_DELAY_SECS", "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(s.max_per_invocation, 10);
        assert_eq!(s.handback_delay, Duration::ZERO);
    }

    #[test]
    fn malformed_values_name_the_variable() {
        for (var, value) in [
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "0"),
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "11"),
            ("IRONFLOW_MAX_WAKEUPS_PER_INVOCATION", "many"),
            ("IRONFLOW_WAKE_DELAY_SECS", "901"),
            ("IRONFLOW_WAKE_DELAY_SECS", "-1"),
            ("IRONFLOW_WAKE_QUEUE_URL", "wake-queue"),
        ] {
            let vars = if var == URL.0 {
                vec![(var, value)]
            } else {
                vec![URL, (var, value)]
            };
            let err = WakeSettings::from_lookup(lookup(&vars)).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn needed_is_bounded_by_backlog_queue_and_cap() {
        assert_eq!(wake_ups_needed(Some(1), 0, 8, 3), 1);
        assert_eq!(wake_ups_needed(Some(8), 0, 8, 3), 1);
        assert_eq!(wake_ups_needed(Some(9), 0, 8, 3), 2);
        assert_eq!(wake_ups_needed(Some(9), 5, 8, 3), 0);
        assert_eq!(wake_ups_needed(Some(u64::MAX), 0, 1, 10), 10);
        assert_eq!(wake_ups_needed(None, 1, 8, 3), 0);
        assert_eq!(wake_ups_needed(Some(5), 0, 0, 3), 3);
    }

    #[test]
    fn report_serialises_with_snake_case_trigger() {
        let report = WakeReport {
            trigger: Some(WakeTrigger::HandedBack),
            ..WakeReport::default()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["trigger"], "handed_back");
    }
}
