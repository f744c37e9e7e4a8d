//! The sends of the wake-up phase: the backlog's wake-ups ([`send_wake_ups`]), the timer
//! wake-ups booked for the runs left due later ([`book_timers`]), and what is left of the
//! invocation's one cap (`IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, [`left`]).
//!
//! Invariants: every send is bounded by the phase's `until`; one that runs into it is recorded
//! in the report (what SQS took is then unknown), never a failed batch. The reads that decide a
//! send end [`SEND_RESERVE`] before it ([`reads_end`]), and a send is not started with less
//! than [`MIN_SEND_TIME`] left: what was not sent is then known, not unknown.

use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};
use uuid::Uuid;

use super::{Waker, timers};
use crate::report::{Due, TimerWake, WakeReport, WakeTrigger};

/// The time a send keeps for itself before `until`: the reads that decide it (the backlog, the
/// queue's depth, the fleet's wake-up mark) end this long before, or halfway to `until` when
/// less than twice this is left ([`reads_end`]). An SQS send takes tens of milliseconds.
const SEND_RESERVE: Duration = Duration::from_secs(1);

/// A send is not started with less than this left before `until`: its request could leave and
/// its answer not come back, and a pushed event would be answered as perhaps delivered (202)
/// when it may not have been. Not started, it surely was not: the webhook answers 503 and the
/// API sends the event again.
const MIN_SEND_TIME: Duration = Duration::from_millis(100);

/// Whether a send bounded by `until` may start now ([`MIN_SEND_TIME`] left).
pub(super) fn can_send(until: Instant) -> bool {
    until.saturating_duration_since(Instant::now()) >= MIN_SEND_TIME
}

/// When the reads that decide a send must end, for a send bounded by `until`: [`SEND_RESERVE`]
/// before it, or halfway there when less than twice that is left (never before now).
pub(crate) fn reads_end(until: Instant) -> Instant {
    let left = until.saturating_duration_since(Instant::now());
    until
        .checked_sub(SEND_RESERVE.min(left / 2))
        .unwrap_or(until)
}

/// Wake-ups the invocation may still send under `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, after
/// the backlog's and the timers (looks included) in `report`.
pub(super) fn left(waker: &Waker, report: &WakeReport) -> usize {
    let booked: usize = report.timers.iter().map(|t| t.sent).sum();
    waker
        .settings
        .max_per_invocation
        .saturating_sub(report.sent + booked)
}

/// Book the timer wake-ups of the runs `due` later ([`timers`]; one per N runs due together,
/// at most `max`, sleeping runs watched), before `until`, into `report`.
pub(super) async fn book_timers(
    waker: &Waker,
    (due, runs_per_invocation, max): (&[(Uuid, Due)], usize, usize),
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) {
    let now = chrono::Utc::now();
    let due = due
        .iter()
        .filter_map(|(id, d)| timers::Timer::new(*id, d, now))
        .collect();
    for booking in timers::plan(due, runs_per_invocation, max) {
        let watch_until = timers::watch_until(booking.delay_secs, now);
        book(waker, &booking, Some(watch_until), sender, until, report).await;
    }
}

/// Send the wake-ups of `booking` before `until`, into `report`: the first ones watching its
/// sleeping runs until `watch_until`, the others plain.
pub(super) async fn book(
    waker: &Waker,
    booking: &timers::Booking,
    watch_until: Option<chrono::DateTime<chrono::Utc>>,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) {
    let body = |sleeping: Option<&Vec<Uuid>>| {
        let mut body = serde_json::json!({
            "reason": WakeTrigger::Due,
            "sent_by": sender.request_id,
        });
        if let (Some(runs), Some(at)) = (sleeping, watch_until) {
            body["sleeping"] = serde_json::json!(runs);
            body["watch_until"] = serde_json::json!(at.to_rfc3339());
        }
        body.to_string()
    };
    let watching = booking.watched.len().min(booking.count);
    let mut messages: Vec<(usize, String)> = booking.watched[..watching]
        .iter()
        .map(|runs| (1, body(Some(runs))))
        .collect();
    if booking.count > watching {
        messages.push((booking.count - watching, body(None)));
    }
    let mut sent = 0;
    for (count, body) in messages {
        let sending = waker
            .queue
            .send(count, &body, booking.delay_secs, sender.trace_id);
        sent += match timeout_at(until, sending).await {
            Ok((sent, errors)) => {
                for e in errors {
                    fail::<()>(report, e);
                }
                sent
            }
            Err(_) => {
                fail::<()>(
                    report,
                    "booking timer wake-ups ran into the deadline".into(),
                );
                0
            }
        };
    }
    let delay_secs = booking.delay_secs;
    info!(
        delay_secs,
        sent,
        watched = watching,
        "timer wake-ups booked"
    );
    report.timers.push(TimerWake { delay_secs, sent });
}

/// The invocation that sends wake-ups.
#[derive(Clone, Copy)]
pub(super) struct Sender<'a> {
    pub request_id: &'a str,
    pub trace_id: Option<&'a str>,
}

/// Send `count` wake-ups for `trigger` before `until`, with the report's delay; `false` when
/// the deadline came first (what SQS took is unknown). With less than [`MIN_SEND_TIME`] left
/// nothing is sent (`true`, `report.sent` 0, the error recorded).
pub(super) async fn send_wake_ups(
    waker: &Waker,
    count: usize,
    trigger: WakeTrigger,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) -> bool {
    if !can_send(until) {
        fail::<()>(
            report,
            format!(
                "no time left to send wake-ups (less than {} ms before the deadline): none sent",
                MIN_SEND_TIME.as_millis()
            ),
        );
        return true;
    }
    let body = serde_json::json!({
        "reason": trigger,
        "pending_runs": report.pending_runs,
        "sent_by": sender.request_id,
    })
    .to_string();
    let sending = waker
        .queue
        .send(count, &body, report.delay_secs, sender.trace_id);
    match timeout_at(until, sending).await {
        Ok((sent, errors)) => {
            report.sent = sent;
            for e in errors {
                fail::<()>(report, e);
            }
            true
        }
        Err(_) => {
            fail::<()>(
                report,
                "sending wake-ups ran into the deadline (the queue may have taken them)".into(),
            );
            false
        }
    }
}

/// Record and log a wake-up error; the value it returns stands for "unknown".
pub(super) fn fail<T>(report: &mut WakeReport, error: String) -> Option<T> {
    warn!(error = %error, "wake-up phase");
    report.errors.push(error);
    None
}
