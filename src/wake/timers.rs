//! Timer wake-ups: a run a batch leaves waiting for a known time (a retry's backoff, a sleep's
//! wake time or a signal's deadline, [`Due`]) gets a wake-up delayed until it is due, so that it
//! starts about a second after, instead of at the next schedule tick.
//!
//! - A Retrying run is claimable once its `scheduled_at` has passed: its wake-up comes
//!   [`SLACK_SECS`] after it (clocks differ a little).
//! - A Sleeping run is made Pending by the API's own waker, which looks every
//!   [`API_WAKER_INTERVAL`] (publishing nothing): its wake-up also comes [`SLACK_SECS`] after
//!   the wake time, and watches the run ([`SleepWatch`](crate::report::SleepWatch), `super::watch`),
//!   looking again every [`RECHECK_SECS`] until the waker's interval (plus the slack) has
//!   passed. Why the worker does not make the run Pending itself: docs/push.md, "Timer
//!   wake-ups".
//! - SQS delays a message 15 minutes at most ([`MAX_DELAY_SECS`]): a run due later is left to
//!   the schedule.
//! - Runs due within [`SHARED_WITHIN_SECS`] of each other share wake-ups (the later time, one per
//!   N runs); an invocation books at most `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION` in all, the
//!   earliest first.

use chrono::{DateTime, Utc};
use ironflow_store::entities::RunStatus;
use uuid::Uuid;

use crate::report::Due;

/// How long after a run is due its wake-up comes: 1 s.
pub const SLACK_SECS: u64 = 1;
/// How often ironflow-api's waker makes due Sleeping runs Pending (its default,
/// `ironflow_api::waker::DEFAULT_WAKER_INTERVAL`): 10 s.
pub const API_WAKER_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// How long after a look that found a run still Sleeping the next one comes: 1 s (SQS delays
/// in whole seconds).
pub const RECHECK_SECS: u64 = 1;
/// The longest delay SQS gives a message: 900 s.
pub const MAX_DELAY_SECS: u64 = 900;
/// Wake-ups due this close together are shared: 2 s.
pub const SHARED_WITHIN_SECS: u64 = 2;
/// Most sleeping runs one wake-up watches (its body's `sleeping`): 100.
pub const MAX_WATCHED: usize = 100;

/// The delay, in whole seconds from `now`, of the wake-up for `due`; `None` past
/// [`MAX_DELAY_SECS`].
pub fn delay_secs(due: &Due, now: DateTime<Utc>) -> Option<u64> {
    let until_due = (due.at - now).num_milliseconds().max(0);
    let secs = u64::try_from(until_due)
        .unwrap_or(0)
        .div_ceil(1000)
        .saturating_add(SLACK_SECS);
    (secs <= MAX_DELAY_SECS).then_some(secs)
}

/// One run due later: the delay of its wake-up, and its id if it is Sleeping (its wake-up
/// watches it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    /// From [`delay_secs`].
    pub delay_secs: u64,
    /// The run, when Sleeping.
    pub sleeping: Option<Uuid>,
}

impl Timer {
    /// The timer of run `run_id`, due as `due` says, seen at `now`; `None` past
    /// [`MAX_DELAY_SECS`].
    pub fn new(run_id: Uuid, due: &Due, now: DateTime<Utc>) -> Option<Self> {
        Some(Self {
            delay_secs: delay_secs(due, now)?,
            sleeping: (due.status == RunStatus::Sleeping).then_some(run_id),
        })
    }
}

/// The wake-ups booked for runs due together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    /// Their `DelaySeconds`: the group's latest.
    pub delay_secs: u64,
    /// How many: one per N runs of the group.
    pub count: usize,
    /// The group's sleeping runs, N (at most [`MAX_WATCHED`]) to a wake-up, the first
    /// wake-ups watching them; more than `count` wake-ups can hold are left to the schedule.
    pub watched: Vec<Vec<Uuid>>,
}

/// The wake-ups to book for `timers`: earliest first, runs within [`SHARED_WITHIN_SECS`] of
/// the group's first sharing them, at most `max` wake-ups in all.
pub fn plan(mut timers: Vec<Timer>, runs_per_invocation: usize, max: usize) -> Vec<Booking> {
    timers.sort_unstable_by_key(|t| t.delay_secs);
    let per_wake_up = runs_per_invocation.clamp(1, MAX_WATCHED);
    let mut groups: Vec<(u64, Vec<Timer>)> = Vec::new();
    for timer in timers {
        match groups.last_mut() {
            Some((first, members)) if timer.delay_secs - *first <= SHARED_WITHIN_SECS => {
                members.push(timer);
            }
            _ => groups.push((timer.delay_secs, vec![timer])),
        }
    }
    let mut left = max;
    let mut out = Vec::new();
    for (_, members) in groups {
        let sleeping: Vec<Uuid> = members.iter().filter_map(|t| t.sleeping).collect();
        // One per N runs, and enough to watch every sleeping one (N may be above MAX_WATCHED).
        let count = members
            .len()
            .div_ceil(runs_per_invocation.max(1))
            .max(sleeping.len().div_ceil(per_wake_up))
            .min(left);
        if count == 0 {
            break;
        }
        left -= count;
        let mut watched: Vec<Vec<Uuid>> = sleeping.chunks(per_wake_up).map(<[_]>::to_vec).collect();
        watched.truncate(count);
        out.push(Booking {
            delay_secs: members.last().map_or(0, |t| t.delay_secs),
            count,
            watched,
        });
    }
    out
}

/// When the watch of sleeping runs whose first look comes `delay_secs` from `now` ends: once
/// the API's waker has had a full interval (and the slack) after that look.
pub fn watch_until(delay_secs: u64, now: DateTime<Utc>) -> DateTime<Utc> {
    let after = delay_secs
        .saturating_add(API_WAKER_INTERVAL.as_secs())
        .saturating_add(SLACK_SECS);
    i64::try_from(after)
        .ok()
        .and_then(chrono::TimeDelta::try_seconds)
        .and_then(|after| now.checked_add_signed(after))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// When a watch read at `now` ends: its `until`, but never later than a watch the worker books
/// at a first look now would end, whatever a wake-up body says.
pub fn watch_end(until: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    until.min(watch_until(0, now))
}

/// What a look at a watched run found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked {
    /// Pending: the waker woke it; a claim is needed (this batch may have missed it).
    Woken,
    /// Still Sleeping past its wake time: the waker has not ticked since.
    StillSleeping,
    /// Anything else (claimed, ended, sleeping again until later, gone): nothing to do.
    Done,
}

/// What the status and `scheduled_at` of a watched run, read at `now`, mean.
pub fn looked(
    status: RunStatus,
    scheduled_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Looked {
    match (status, scheduled_at) {
        (RunStatus::Pending, _) => Looked::Woken,
        (RunStatus::Sleeping, Some(at)) if at <= now => Looked::StillSleeping,
        _ => Looked::Done,
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn a_run_wakes_a_second_after_it_is_due_and_later_is_left_alone() {
        let now = Utc::now();
        let due = |status, ms| Due {
            status,
            at: now + TimeDelta::milliseconds(ms),
        };
        assert_eq!(delay_secs(&due(RunStatus::Retrying, 4_500), now), Some(6));
        assert_eq!(delay_secs(&due(RunStatus::Sleeping, 30_000), now), Some(31));
        assert_eq!(delay_secs(&due(RunStatus::Retrying, -5_000), now), Some(1));
        assert_eq!(delay_secs(&due(RunStatus::Retrying, 1_000_000), now), None);
        assert_eq!(
            delay_secs(&due(RunStatus::Sleeping, 899_000), now),
            Some(900)
        );
    }

    fn timer(delay_secs: u64) -> Timer {
        Timer {
            delay_secs,
            sleeping: None,
        }
    }

    #[test]
    fn close_runs_share_wake_ups_one_per_n_and_the_total_is_capped() {
        let shape = |b: Vec<Booking>| {
            b.iter()
                .map(|b| (b.delay_secs, b.count))
                .collect::<Vec<_>>()
        };
        let plan_of = |delays: &[u64], n, max| {
            shape(plan(delays.iter().map(|d| timer(*d)).collect(), n, max))
        };
        assert_eq!(plan_of(&[5, 6, 7, 30], 2, 10), [(7, 2), (30, 1)]);
        assert_eq!(plan_of(&[5, 5, 5, 5, 5], 2, 10), [(5, 3)]);
        assert_eq!(
            plan_of(&[40, 5, 20], 8, 2),
            [(5, 1), (20, 1)],
            "earliest first"
        );
        assert!(plan(Vec::new(), 8, 3).is_empty());
    }

    #[test]
    fn sleeping_runs_are_watched_n_to_a_wake_up_and_only_by_wake_ups_booked() {
        let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
        let mut timers: Vec<Timer> = ids
            .iter()
            .map(|id| Timer {
                delay_secs: 3,
                sleeping: Some(*id),
            })
            .collect();
        timers.push(timer(4));
        let booked = plan(timers.clone(), 2, 10);
        assert_eq!(booked.len(), 1);
        assert_eq!(booked[0].count, 3, "six runs, two to a wake-up");
        assert_eq!(
            booked[0].watched,
            [ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..].to_vec()]
        );
        let capped = plan(timers, 2, 1);
        assert_eq!(
            capped[0].watched,
            [ids[0..2].to_vec()],
            "one wake-up: two watched"
        );
        assert!(plan(vec![timer(3)], 2, 10)[0].watched.is_empty());
    }

    #[test]
    fn n_above_the_runs_one_wake_up_watches_gets_enough_wake_ups_to_watch_them_all() {
        let many: Vec<Timer> = (0..250)
            .map(|_| Timer {
                delay_secs: 3,
                sleeping: Some(Uuid::now_v7()),
            })
            .collect();
        let booked = plan(many, 500, 10);
        assert_eq!(booked[0].count, 3);
        let sizes: Vec<usize> = booked[0].watched.iter().map(Vec::len).collect();
        assert_eq!(sizes, [100, 100, 50]);
    }

    #[test]
    fn a_watch_lasts_the_api_waker_s_interval_after_its_first_look() {
        let now = Utc::now();
        let until = watch_until(5, now);
        assert_eq!(until, now + TimeDelta::seconds(16));
        assert_eq!(watch_until(u64::MAX, now), DateTime::<Utc>::MAX_UTC);
    }

    #[test]
    fn a_look_tells_woken_from_still_sleeping_from_done() {
        let now = Utc::now();
        let past = Some(now - TimeDelta::seconds(1));
        let later = Some(now + TimeDelta::seconds(60));
        assert_eq!(looked(RunStatus::Pending, None, now), Looked::Woken);
        assert_eq!(
            looked(RunStatus::Sleeping, past, now),
            Looked::StillSleeping
        );
        assert_eq!(
            looked(RunStatus::Sleeping, later, now),
            Looked::Done,
            "asleep again"
        );
        assert_eq!(
            looked(RunStatus::Sleeping, None, now),
            Looked::Done,
            "a signal, no deadline"
        );
        assert_eq!(looked(RunStatus::Running, past, now), Looked::Done);
        assert_eq!(looked(RunStatus::Completed, None, now), Looked::Done);
    }
}
