//! Timer wake-ups: a run a batch leaves waiting for a known time (a retry's backoff, a sleep's
//! wake time or a signal's deadline, [`Due`]) gets a wake-up delayed until it is due, so that it
//! starts about a second after, instead of at the next schedule tick.
//!
//! - A Retrying run is claimable once its `scheduled_at` has passed: its wake-up comes
//!   [`RETRY_SLACK_SECS`] after it (clocks differ a little).
//! - A Sleeping run is made Pending by the API's own waker, which looks every
//!   [`API_WAKER_INTERVAL`]: its wake-up comes that long after the wake time (plus the slack).
//! - SQS delays a message 15 minutes at most ([`MAX_DELAY_SECS`]): a run due later is left to
//!   the schedule.
//! - Runs due within [`SHARED_WITHIN_SECS`] of each other share wake-ups (the later time, one per
//!   N runs); an invocation books at most `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION` in all, the
//!   earliest first.

use chrono::{DateTime, Utc};
use ironflow_store::entities::RunStatus;

use crate::report::Due;

/// How long after a retry is due its wake-up comes: 1 s.
pub const RETRY_SLACK_SECS: u64 = 1;
/// How often ironflow-api's waker makes due Sleeping runs Pending (its default,
/// `ironflow_api::waker::DEFAULT_WAKER_INTERVAL`): 10 s.
pub const API_WAKER_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// The longest delay SQS gives a message: 900 s.
pub const MAX_DELAY_SECS: u64 = 900;
/// Wake-ups due this close together are shared: 2 s.
pub const SHARED_WITHIN_SECS: u64 = 2;

/// The delay, in whole seconds from `now`, of the wake-up for `due`; `None` past
/// [`MAX_DELAY_SECS`].
pub fn delay_secs(due: &Due, now: DateTime<Utc>) -> Option<u64> {
    let after = match due.status {
        RunStatus::Sleeping => API_WAKER_INTERVAL.as_secs() + RETRY_SLACK_SECS,
        _ => RETRY_SLACK_SECS,
    };
    let until_due = (due.at - now).num_milliseconds().max(0);
    let secs = u64::try_from(until_due)
        .unwrap_or(0)
        .div_ceil(1000)
        .saturating_add(after);
    (secs <= MAX_DELAY_SECS).then_some(secs)
}

/// The wake-ups to book for runs due after `delays` seconds: `(delay, count)`, earliest first,
/// runs within [`SHARED_WITHIN_SECS`] of the group's first sharing it (at the group's latest
/// delay, one wake-up per `runs_per_invocation` runs), at most `max` wake-ups in all.
pub fn plan(mut delays: Vec<u64>, runs_per_invocation: usize, max: usize) -> Vec<(u64, usize)> {
    delays.sort_unstable();
    let mut groups: Vec<(u64, u64, usize)> = Vec::new();
    for delay in delays {
        match groups.last_mut() {
            Some((first, last, runs)) if delay - *first <= SHARED_WITHIN_SECS => {
                *last = delay;
                *runs += 1;
            }
            _ => groups.push((delay, delay, 1)),
        }
    }
    let mut left = max;
    let mut out = Vec::new();
    for (_, last, runs) in groups {
        let count = runs.div_ceil(runs_per_invocation.max(1)).min(left);
        if count == 0 {
            break;
        }
        left -= count;
        out.push((last, count));
    }
    out
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn a_retry_wakes_a_second_after_it_is_due_a_sleep_after_the_api_s_waker_and_later_is_left_alone()
     {
        let now = Utc::now();
        let retry = Due {
            status: RunStatus::Retrying,
            at: now + TimeDelta::milliseconds(4_500),
        };
        assert_eq!(delay_secs(&retry, now), Some(6));
        let sleep = Due {
            status: RunStatus::Sleeping,
            at: now + TimeDelta::seconds(30),
        };
        assert_eq!(delay_secs(&sleep, now), Some(41));
        let past = Due {
            status: RunStatus::Retrying,
            at: now - TimeDelta::seconds(5),
        };
        assert_eq!(delay_secs(&past, now), Some(1));
        let far = Due {
            status: RunStatus::Retrying,
            at: now + TimeDelta::seconds(1000),
        };
        assert_eq!(delay_secs(&far, now), None);
    }

    #[test]
    fn close_runs_share_wake_ups_one_per_n_and_the_total_is_capped() {
        assert_eq!(plan(vec![5, 6, 7, 30], 2, 10), [(7, 2), (30, 1)]);
        assert_eq!(plan(vec![5, 5, 5, 5, 5], 2, 10), [(5, 3)]);
        assert_eq!(
            plan(vec![40, 5, 20], 8, 2),
            [(5, 1), (20, 1)],
            "earliest first"
        );
        assert!(plan(Vec::new(), 8, 3).is_empty());
    }
}
