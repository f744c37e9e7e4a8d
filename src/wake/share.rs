//! The fleet's share of a wake-up decision: what the wake-up mark shared by every environment
//! ([`FleetMark`], in the DynamoDB poison-pill table) lets a push send, the tail wake-up booked
//! for a backlog the fleet's wake-ups in flight cover, and the wake-ups given back when SQS
//! refused them.
//!
//! Invariant: the mark only ever narrows a decision; when its table fails or does not answer
//! before the phase's bound, the error is recorded and the decision stays this process's own.

use tokio::time::{Instant, timeout_at};
use tracing::{error, info};

use super::fleet::{FleetMark, Share};
use super::send::{Sender, fail, send_wake_ups};
use super::{Delivery, Waker};
use crate::deadline::now_ms;
use crate::report::{WakeReport, WakeTrigger};

/// What the fleet's mark lets this decision send of `count` (one conditional write before
/// `until`), `None` when the table failed or did not answer in time: the error is logged and
/// recorded, and the decision stays this process's own.
pub(super) async fn fleet_share(
    fleet: &FleetMark,
    count: usize,
    until: Instant,
    report: &mut WakeReport,
) -> Option<Share> {
    let queued = report.queued.unwrap_or(0);
    let target = queued.saturating_add(u64::try_from(count).unwrap_or(u64::MAX));
    let error = match timeout_at(until, fleet.claim(target, count, now_ms())).await {
        Ok(Ok(share)) => return Some(share),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "wake-up mark: no answer before the request's deadline ({})",
            fleet.table()
        ),
    };
    fleet_failed(fleet, error, report);
    None
}

/// Log and record a failed write of the fleet's mark: the decision stays this process's own.
pub(super) fn fleet_failed(fleet: &FleetMark, error: String, report: &mut WakeReport) {
    let errors = fleet.count_error();
    error!(error = %error, fleet_errors = errors,
        "the shared wake-up mark failed: deciding in this environment alone");
    report.errors.push(error);
}

/// For a decision whose backlog the fleet's wake-ups in flight cover, until `window.1` (ms
/// since the Unix epoch): book a tail wake-up unless one not yet due is booked
/// ([`FleetMark::book_tail`]) and, when this decision booked it, send it delayed to the
/// window's end, so that a run those wake-ups' invocations miss (created after they claimed)
/// is claimed then, not at the next schedule tick. A tail SQS refused is given back. The
/// booking ends by `reads_until`, the send and the give-back by `until`. `None` when the table
/// failed or did not answer in time (recorded): the decision falls back to this process's own.
pub(super) async fn cover_tail(
    waker: &Waker,
    (fleet, window_end_ms): (&FleetMark, u64),
    trigger: WakeTrigger,
    sender: Sender<'_>,
    (reads_until, until): (Instant, Instant),
    report: &mut WakeReport,
) -> Option<Delivery> {
    let booking = timeout_at(reads_until, fleet.book_tail(window_end_ms, now_ms())).await;
    let tail = match booking {
        Ok(Ok(Some(tail))) => tail,
        Ok(Ok(None)) => {
            info!(
                trigger = trigger.as_str(),
                window_end_ms, "a tail wake-up not yet due is booked already"
            );
            return Some(Delivery::default());
        }
        Ok(Err(e)) => {
            fleet_failed(fleet, format!("{e}: booking the tail wake-up"), report);
            return None;
        }
        Err(_) => {
            let error = format!(
                "wake-up mark: no answer before the request's deadline booking the tail ({})",
                fleet.table()
            );
            fleet_failed(fleet, error, report);
            return None;
        }
    };
    report.tail = true;
    report.delay_secs = tail.delay_secs;
    let unknown = !send_wake_ups(waker, 1, trigger, sender, until, report).await;
    if !unknown && report.sent == 0 {
        match timeout_at(until, fleet.give_back_tail(tail)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                fail::<()>(report, format!("{e}: giving back the unsent tail failed"));
            }
            Err(_) => {
                fail::<()>(
                    report,
                    "giving back the unsent tail ran into the deadline".into(),
                );
            }
        }
    }
    info!(
        trigger = trigger.as_str(),
        sent = report.sent,
        delay_secs = tail.delay_secs,
        window_end_ms,
        "tail wake-up booked for the window"
    );
    Some(Delivery { needed: 1, unknown })
}

/// Lower the fleet's mark by the `unsent` wake-ups SQS refused of those `share` allowed,
/// before `until` (a failure recorded in `report`): the next push sends them.
pub(super) async fn give_back(
    fleet: &FleetMark,
    share: Share,
    unsent: usize,
    until: Instant,
    report: &mut WakeReport,
) {
    let Share::Send {
        target, until_ms, ..
    } = share
    else {
        return;
    };
    let unsent = u64::try_from(unsent).unwrap_or(u64::MAX);
    match timeout_at(until, fleet.give_back(target, until_ms, unsent)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            fail::<()>(report, format!("{e}: giving back unsent wake-ups failed"));
        }
        Err(_) => {
            fail::<()>(
                report,
                "giving back unsent wake-ups ran into the deadline".into(),
            );
        }
    }
}
