//! Runs throttled together are woken spread out: a run put to sleep for provider capacity
//! (the engine's `Sleeping` write with a `capacity_wait_kind`, from `AgentError::CapacityWait`)
//! has its wake time moved later by an offset drawn from its run id over a window, so that runs
//! throttled in the same second do not all come back in the same second, to be throttled again
//! (`docs/agents.md`, "Throttled runs").
//!
//! The window is the wait's half, at least [`CapacitySpread::spread`] and at most
//! [`CapacitySpread::max`] (never below the spread): with the defaults, 30 s for Bedrock's 60 s
//! pause, 300 s for an hour's reset. 30 s is wider than the two things that group wake-ups: the
//! API's waker, which makes due Sleeping runs Pending every 10 s, and the timer wake-ups, which
//! share one message among runs due within 2 s (`crate::wake`). The offset is the run id's low 64
//! bits modulo the window in milliseconds: the same run always gets the same one, and the ids
//! being random, runs get offsets spread evenly over the window.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use ironflow_store::entities::{RunStatus, RunUpdate};
use tracing::info;
use uuid::Uuid;

/// How capacity wake-ups are spread ([`crate::LambdaWorkerBuilder::capacity_spread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacitySpread {
    /// The least window (`IRONFLOW_CAPACITY_SPREAD_SECS`; zero with a zero `max`: no spread).
    pub spread: Duration,
    /// The most window, for long waits (`IRONFLOW_CAPACITY_SPREAD_MAX_SECS`).
    pub max: Duration,
}

impl CapacitySpread {
    /// The window a wake-up `wait` away is spread over: half of `wait`, within the bounds.
    pub fn window(&self, wait: Duration) -> Duration {
        (wait / 2).max(self.spread).min(self.max.max(self.spread))
    }

    /// How much later run `run_id`, due `wait` away, is woken: from 0 up to the window.
    pub fn offset(&self, run_id: Uuid, wait: Duration) -> Duration {
        let window = u64::try_from(self.window(wait).as_millis()).unwrap_or(u64::MAX);
        if window == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(run_id.as_u64_pair().1 % window)
    }

    /// `update` of run `run_id` at `now`, its wake time moved later when it puts the run to sleep
    /// for capacity.
    pub(super) fn apply(
        &self,
        run_id: Uuid,
        mut update: RunUpdate,
        now: DateTime<Utc>,
    ) -> RunUpdate {
        let capacity_sleep =
            update.status == Some(RunStatus::Sleeping) && update.capacity_wait_kind.is_some();
        if let (true, Some(at)) = (capacity_sleep, update.scheduled_at) {
            let wait = (at - now).to_std().unwrap_or_default();
            let offset = self.offset(run_id, wait);
            let later = TimeDelta::from_std(offset).unwrap_or_default();
            update.scheduled_at = Some(at.checked_add_signed(later).unwrap_or(at));
            info!(
                offset_ms = u64::try_from(offset.as_millis()).unwrap_or(u64::MAX),
                window_ms = u64::try_from(self.window(wait).as_millis()).unwrap_or(u64::MAX),
                "capacity wake-up spread"
            );
        }
        update
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPREAD: CapacitySpread = CapacitySpread {
        spread: Duration::from_secs(30),
        max: Duration::from_secs(300),
    };

    #[test]
    fn the_window_is_half_the_wait_within_its_bounds() {
        assert_eq!(
            SPREAD.window(Duration::from_secs(1)),
            Duration::from_secs(30)
        );
        assert_eq!(
            SPREAD.window(Duration::from_secs(100)),
            Duration::from_secs(50)
        );
        assert_eq!(
            SPREAD.window(Duration::from_secs(3600)),
            Duration::from_secs(300)
        );
        let below = CapacitySpread {
            max: Duration::from_secs(5),
            ..SPREAD
        };
        assert_eq!(
            below.window(Duration::from_secs(3600)),
            Duration::from_secs(30)
        );
        let off = CapacitySpread {
            spread: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(
            off.offset(Uuid::new_v4(), Duration::from_secs(60)),
            Duration::ZERO
        );
    }

    #[test]
    fn only_a_capacity_sleep_is_moved_and_by_its_run_s_own_offset() {
        let (run, now) = (Uuid::new_v4(), Utc::now());
        let at = now + TimeDelta::seconds(60);
        let sleep = RunUpdate {
            status: Some(RunStatus::Sleeping),
            scheduled_at: Some(at),
            capacity_wait_kind: Some("bedrock".into()),
            ..RunUpdate::default()
        };
        let moved = SPREAD.apply(run, sleep.clone(), now).scheduled_at.unwrap();
        let offset = SPREAD.offset(run, Duration::from_secs(60));
        assert_eq!(moved, at + TimeDelta::from_std(offset).unwrap());
        assert!(offset < Duration::from_secs(30));
        let timer = RunUpdate {
            capacity_wait_kind: None,
            ..sleep
        };
        assert_eq!(SPREAD.apply(run, timer, now).scheduled_at, Some(at));
    }
}
