//! The wake-up settings ([`crate::wake`] sends the wake-ups), with their defaults and bounds.

use std::time::Duration;

use super::table::{MAX_WAKEUPS_PER_INVOCATION, WAKE_DELAY};

/// Default of `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`. Each wake-up starts a batch of up to N
/// runs, so a backlog's draining can triple from one hop to the next, and never grows beyond
/// what the backlog needs.
pub const DEFAULT_MAX_WAKEUPS_PER_INVOCATION: usize = MAX_WAKEUPS_PER_INVOCATION.default;
/// Upper bound of `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`: 10, what one `SendMessageBatch` holds.
pub const MAX_WAKEUPS_PER_INVOCATION_LIMIT: usize = 10;
/// Default of `IRONFLOW_WAKE_DELAY_SECS`.
pub const DEFAULT_WAKE_DELAY: Duration = WAKE_DELAY.default;
/// SQS's largest `DelaySeconds`: 900 s.
pub const MAX_WAKE_DELAY: Duration = Duration::from_secs(900);
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
    /// Settings for `queue_url`, every other value at its variable's default
    /// (`IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, `IRONFLOW_WAKE_DELAY_SECS`: the README's
    /// configuration table).
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self {
            queue_url: queue_url.into(),
            max_per_invocation: DEFAULT_MAX_WAKEUPS_PER_INVOCATION,
            handback_delay: DEFAULT_WAKE_DELAY,
        }
    }
}
