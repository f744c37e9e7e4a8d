//! The watch of sleeping runs ([`SleepWatch`], docs/push.md "Timer wake-ups"): after its batch,
//! an invocation woken for sleeping runs reads each one, asks for a claim for those the API's
//! waker has made Pending since, and books the next look at those still asleep.
//!
//! Invariants: each run is read once per look, the reads end halfway through the wake-up phase
//! (the sends after them keep their time); a run that could not be read is looked at again; no
//! watch outlasts [`timers::watch_end`]; a run left out for want of a wake-up under the cap is
//! counted (`unbooked`) and logged.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, stream};
use ironflow_store::error::StoreError;
use ironflow_store::models::Run;
use ironflow_store::store::RunStore;
use tokio::time::Instant;
use tracing::{info, warn};
use uuid::Uuid;

use super::Waker;
use super::send::{Sender, book, fail, left};
use super::timers::{self, Looked};
use crate::calls::Calls;
use crate::report::{SleepWatch, WakeReport, WatchReport};

/// Runs read at once.
const READS_AT_ONCE: usize = 8;

/// Read the runs of `watches` before `until` (into `report.watched`): how many the API's waker
/// has made Pending, and the watches of those still Sleeping whose watch is not over,
/// [`timers::MAX_WATCHED`] runs to a watch (those past its end are left to the schedule,
/// `gave_up`).
pub(super) async fn look(
    calls: &Calls,
    watches: &[SleepWatch],
    until: Instant,
    report: &mut WakeReport,
) -> (usize, Vec<SleepWatch>) {
    if watches.is_empty() {
        return (0, Vec::new());
    }
    let ends = watch_ends(watches);
    let now = Instant::now();
    let reads_until = now + until.saturating_duration_since(now) / 2;
    let (mut seen, sleeping) = read_all(calls, &ends, reads_until, report).await;
    let now = Utc::now();
    // Still asleep: looked at again until their watch ends, the earliest ends together.
    let mut again: Vec<(DateTime<Utc>, Uuid)> = Vec::new();
    for id in sleeping {
        let end = timers::watch_end(ends[&id], now);
        if now >= end {
            seen.gave_up += 1;
        } else {
            again.push((end, id));
        }
    }
    if seen.gave_up > 0 {
        warn!(
            runs = seen.gave_up,
            "sleeping runs still not woken by the API's waker at their watch's end: left to the \
             schedule"
        );
    }
    again.sort_unstable();
    let again = again
        .chunks(timers::MAX_WATCHED)
        .map(|chunk| SleepWatch {
            runs: chunk.iter().map(|(_, id)| *id).collect(),
            until: chunk.iter().map(|(end, _)| *end).max().unwrap_or(now),
        })
        .collect();
    info!(
        runs = seen.runs,
        woken = seen.woken,
        still_sleeping = seen.still_sleeping,
        "watched sleeping runs"
    );
    report.watched = Some(seen);
    (seen.woken, again)
}

/// Each watched run once, with the latest end any of its watches gives.
fn watch_ends(watches: &[SleepWatch]) -> HashMap<Uuid, DateTime<Utc>> {
    let mut ends: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
    for watch in watches {
        for id in &watch.runs {
            let end = ends.entry(*id).or_insert(watch.until);
            *end = (*end).max(watch.until);
        }
    }
    ends
}

/// Read the runs of `ends`, [`READS_AT_ONCE`] at a time, each giving up at `until`: what was
/// seen, and the runs still Sleeping past their wake time or not read (their failures one
/// error in `report`).
async fn read_all(
    calls: &Calls,
    ends: &HashMap<Uuid, DateTime<Utc>>,
    until: Instant,
    report: &mut WakeReport,
) -> (WatchReport, Vec<Uuid>) {
    // Boxed as `Send` futures, so that the handler's future stays `Send` for every lifetime
    // (the compiler cannot see it through the iterator's closures).
    let reads: Vec<BoxFuture<'_, _>> = ends.keys().map(|id| read(calls, *id, until)).collect();
    let reads: Vec<_> = stream::iter(reads)
        .buffer_unordered(READS_AT_ONCE)
        .collect()
        .await;
    let now = Utc::now();
    let mut seen = WatchReport::default();
    let mut sleeping = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    for (id, read) in reads {
        seen.runs += 1;
        match read {
            Ok(Some(run)) => match timers::looked(run.status.state, run.scheduled_at, now) {
                Looked::Woken => seen.woken += 1,
                Looked::StillSleeping => sleeping.push(id),
                Looked::Done => {}
            },
            Ok(None) => {}
            Err(e) => {
                failed.push(e.to_string());
                sleeping.push(id);
            }
        }
    }
    if let Some(first) = failed.first() {
        fail::<()>(
            report,
            format!(
                "reading {} watched run(s) failed (looked at again); the first: {first}",
                failed.len()
            ),
        );
    }
    seen.still_sleeping = sleeping.len();
    (seen, sleeping)
}

/// Read run `id`, giving up at `until`.
fn read(
    calls: &Calls,
    id: Uuid,
    until: Instant,
) -> BoxFuture<'_, (Uuid, Result<Option<Run>, StoreError>)> {
    Box::pin(async move { (id, calls.within(until, None, calls.store.get_run(id)).await) })
}

/// Book the next look, [`timers::RECHECK_SECS`] from now, at each of `watches` while the cap
/// leaves wake-ups, before `until`, into `report`; the runs of the others are counted in
/// `watched.unbooked` and logged.
pub(super) async fn book_looks(
    waker: &Waker,
    watches: Vec<SleepWatch>,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) {
    let mut unbooked = 0;
    for watch in watches {
        if left(waker, report) == 0 {
            unbooked += watch.runs.len();
            continue;
        }
        let booking = timers::Booking {
            delay_secs: timers::RECHECK_SECS,
            count: 1,
            watched: vec![watch.runs],
        };
        book(waker, &booking, Some(watch.until), sender, until, report).await;
    }
    if unbooked > 0 {
        warn!(
            runs = unbooked,
            "no wake-up left under IRONFLOW_MAX_WAKEUPS_PER_INVOCATION to look at sleeping runs \
             again: left to the schedule"
        );
        if let Some(watched) = report.watched.as_mut() {
            watched.unbooked = unbooked;
        }
    }
}
