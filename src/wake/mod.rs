//! Wake-ups: SQS messages that start queue-triggered invocations, so that a backlog keeps
//! draining without waiting for the next schedule tick (when and how many:
//! `docs/design.md#wake-ups`; the settings: [`WakeSettings`]).
//!
//! ```text
//! pending  = GET /api/v1/internal/runs/pending-count (this batch's claim capabilities)
//! queued   = wake-ups already waiting and visible on the queue (ApproximateNumberOfMessages)
//! messages = min(ceil(pending / N) − queued, IRONFLOW_MAX_WAKEUPS_PER_INVOCATION)
//! ```
//!
//! After its batch an invocation (1) looks at the sleeping runs its wake-ups watch
//! ([`watch`]), (2) sends what the backlog needs, (3) books the next looks at the runs still
//! asleep, and (4) books the timers of the runs it left due later ([`timers`]).
//!
//! Invariants: a failure is logged and reported in the summary's `wake_ups.errors`, never a
//! failed batch; the whole phase ends before the invocation deadline
//! ([`Budget::wake_phase_end`]): nothing is left running when the handler returns.

pub mod fleet;
mod local;
mod sqs;
pub mod timers;
mod watch;

use std::sync::Arc;

use async_trait::async_trait;
use ironflow_store::entities::WorkerCapabilities;
use tokio::time::{Instant, timeout_at};
use tracing::{error, info, warn};
use uuid::Uuid;

use crate::api::ApiClient;
use crate::calls::Calls;
use crate::deadline::Budget;
use crate::report::{Due, SleepWatch, TimerWake, WakeReport, WakeTrigger};
use crate::settings::WakeSettings;

use self::fleet::{FleetMark, Share};
pub use self::local::LocalWakeQueue;
pub use self::sqs::SqsWakeQueue;
use crate::deadline::now_ms;

/// Where wake-ups go: the SQS wake queue ([`SqsWakeQueue`]), or, for local runs, a queue in this
/// process ([`LocalWakeQueue`]), which the local runner serves as Lambda's event source mapping
/// serves the SQS queue.
#[async_trait]
pub trait WakeQueue: Send + Sync + std::fmt::Debug {
    /// Messages waiting on the queue and visible now. Delayed ones (timer wake-ups, a
    /// handback's) are not counted: they may come too late for the runs at hand, and a wake-up
    /// they hold back would leave a Pending run waiting for a timer. In-flight ones are being
    /// served.
    ///
    /// # Errors
    ///
    /// What went wrong reading the depth, as text for the report.
    async fn depth(&self) -> Result<u64, String>;

    /// Send `count` (≤ 10) messages with `body`, each delayed `delay_secs`, with `trace_id` as
    /// the request's X-Ray trace header when given. Returns how many were accepted and the
    /// errors.
    async fn send(
        &self,
        count: usize,
        body: &str,
        delay_secs: u64,
        trace_id: Option<&str>,
    ) -> (usize, Vec<String>);
}

/// Sends wake-ups to the queue. Build it once per cold start and hand it to
/// [`LambdaWorkerBuilder::wake_ups`](crate::builder::LambdaWorkerBuilder::wake_ups).
#[derive(Debug, Clone)]
pub struct Waker {
    queue: Arc<dyn WakeQueue>,
    settings: WakeSettings,
}

impl Waker {
    /// A waker sending through `sqs` to the queue `settings` name.
    pub fn new(sqs: aws_sdk_sqs::Client, settings: WakeSettings) -> Self {
        let queue = SqsWakeQueue::new(sqs, &settings.queue_url);
        Self {
            queue: Arc::new(queue),
            settings,
        }
    }

    /// A waker sending to `queue` (the local runner's [`LocalWakeQueue`]).
    pub fn to_queue(queue: Arc<dyn WakeQueue>, settings: WakeSettings) -> Self {
        Self { queue, settings }
    }

    /// The settings it sends with.
    pub fn settings(&self) -> &WakeSettings {
        &self.settings
    }
}

/// Wake-up messages a batch sends: `ceil(pending_runs / runs_per_invocation) − queued`, at
/// most `max`. An unknown backlog (`None`) counts as one invocation's worth.
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
    /// The invocation's X-Ray trace header (`Context.xray_trace_id`), sent with the wake-ups
    /// as `X-Amzn-Trace-Id`: Lambda's recursive-loop detection follows it from the wake-up's
    /// invocation back to this one. Without it the SDK sends `_X_AMZN_TRACE_ID`, which
    /// lambda_runtime sets per invocation only when it serves one at a time.
    pub trace_id: Option<&'a str>,
    /// Runs handed back by the batch, and runs claimed ahead that it released unexecuted.
    pub handed_back: usize,
    /// Whether the batch took every run it was asked for (`stop_reason` `max_runs`).
    pub filled: bool,
    /// The capabilities the batch claimed with (the poison-pill gate may have narrowed them).
    pub capabilities: &'a WorkerCapabilities,
    /// The invocation's budget: the phase ends before its deadline.
    pub budget: Budget,
    /// The runs the batch left waiting for a known time, and when they are due.
    pub due: Vec<(Uuid, Due)>,
    /// The sleeping runs the invocation's timer wake-ups asked it to look at.
    pub watch: &'a [SleepWatch],
    /// The invocation's calls, to read the watched runs.
    pub calls: &'a Calls,
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
    if trigger.is_none() && end.due.is_empty() && end.watch.is_empty() {
        return Some(report);
    }
    let Some(until) = end.budget.wake_phase_end() else {
        let error = "no time left before the invocation deadline: wake-ups skipped".to_string();
        warn!(error = %error, "wake-ups skipped");
        report.errors.push(error);
        return Some(report);
    };
    let sender = Sender {
        request_id: end.request_id,
        trace_id: end.trace_id,
    };
    // 1. The sleeping runs this invocation's wake-ups watch.
    let (woken, still_asleep) = watch::look(end.calls, end.watch, until, &mut report).await;
    // 2. The backlog's wake-ups; a watched run the API's waker made Pending after this batch's
    // claims needs one.
    let trigger = trigger.or((woken > 0).then_some(WakeTrigger::Due));
    report.trigger = trigger;
    if let Some(trigger) = trigger {
        let need = Need {
            trigger,
            capabilities: end.capabilities,
            runs_per_invocation,
            fleet: None,
        };
        wake_for(waker, api, need, sender, until, &mut report).await;
    }
    // 3. The next looks at the runs still asleep: they and then the timers get what the
    // backlog's wake-ups left under the one cap of the invocation (`left`).
    watch::book_looks(waker, still_asleep, sender, until, &mut report).await;
    // 4. The timers of the runs this batch left due later.
    let due = (&end.due[..], runs_per_invocation, left(waker, &report));
    book_timers(waker, due, sender, until, &mut report).await;
    Some(report)
}

/// What a wake-up is sent for.
#[derive(Clone, Copy)]
pub(crate) struct Need<'a> {
    pub trigger: WakeTrigger,
    /// What claims ask for: the backlog is counted with it.
    pub capabilities: &'a WorkerCapabilities,
    /// N: runs one woken invocation claims at most.
    pub runs_per_invocation: usize,
    /// The mark the decisions of every environment share ([`fleet`]), for pushes when the
    /// poison-pill table is in DynamoDB.
    pub fleet: Option<&'a FleetMark>,
}

/// Send what the backlog needs beyond what is queued ([`wake_ups_needed`]), before `until`,
/// into `report`.
async fn wake_for(
    waker: &Waker,
    api: &ApiClient,
    need: Need<'_>,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) -> Delivery {
    let trigger = need.trigger;
    let mut delivery = Delivery::default();
    if !measure_backlog(waker, api, need.capabilities, until, report).await {
        info!(
            trigger = trigger.as_str(),
            "no pending run left: no wake-up needed"
        );
        return delivery;
    }
    let count = wake_ups_needed(
        report.pending_runs,
        report.queued.unwrap_or(0),
        need.runs_per_invocation,
        waker.settings.max_per_invocation,
    );
    if count == 0 {
        info!(
            trigger = trigger.as_str(),
            pending_runs = report.pending_runs,
            queued = report.queued,
            "enough wake-ups already queued"
        );
        return delivery;
    }
    let share = match need.fleet {
        Some(fleet) => fleet_share(fleet, count, until, report)
            .await
            .map(|share| (fleet, share)),
        None => None,
    };
    let count = match share {
        Some((fleet, Share::Covered { covered, until_ms })) => {
            info!(
                trigger = trigger.as_str(),
                pending_runs = report.pending_runs,
                covered,
                "wake-ups sent by another environment cover the backlog"
            );
            let window = (fleet, until_ms);
            match cover_tail(waker, window, trigger, sender, until, report).await {
                Some(delivery) => return delivery,
                None => count,
            }
        }
        Some((_, Share::Send { count, .. })) => count,
        None => count,
    };
    delivery.needed = count;
    report.delay_secs = match trigger {
        WakeTrigger::HandedBack => waker.settings.handback_delay.as_secs(),
        WakeTrigger::Backlog | WakeTrigger::Pushed | WakeTrigger::Due => 0,
    };
    delivery.unknown = !send_wake_ups(waker, count, trigger, sender, until, report).await;
    if let Some((fleet, share)) = share
        && !delivery.unknown
        && report.sent < count
    {
        give_back(fleet, share, count - report.sent, until, report).await;
    }
    info!(
        trigger = trigger.as_str(),
        sent = report.sent,
        pending_runs = report.pending_runs,
        queued = report.queued,
        delay_secs = report.delay_secs,
        "wake-ups sent"
    );
    delivery
}

/// What the fleet's mark lets this decision send of `count` (one conditional write before
/// `until`), `None` when the table failed or did not answer in time: the error is logged and
/// recorded, and the decision stays this process's own.
async fn fleet_share(
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
fn fleet_failed(fleet: &FleetMark, error: String, report: &mut WakeReport) {
    let errors = fleet.count_error();
    error!(error = %error, fleet_errors = errors,
        "the shared wake-up mark failed: deciding in this environment alone");
    report.errors.push(error);
}

/// For a decision whose backlog the fleet's wake-ups in flight cover, until `window.1` (ms
/// since the Unix epoch): book a tail wake-up unless one not yet due is booked
/// ([`FleetMark::book_tail`]) and, when this decision booked it, send it delayed to the
/// window's end, so that a run those wake-ups' invocations miss (created after they claimed)
/// is claimed then, not at the next schedule tick. A tail SQS refused is given back. `None`
/// when the table failed or did not answer before `until` (recorded): the decision falls back
/// to this process's own.
async fn cover_tail(
    waker: &Waker,
    (fleet, window_end_ms): (&FleetMark, u64),
    trigger: WakeTrigger,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) -> Option<Delivery> {
    let booking = timeout_at(until, fleet.book_tail(window_end_ms, now_ms())).await;
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
async fn give_back(
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

/// What became of the wake-ups a backlog needed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// Wake-ups the backlog needed beyond those queued (0: none to send).
    pub needed: usize,
    /// The send ran into the deadline: SQS may have taken them all the same.
    pub unknown: bool,
}

/// Wake the fleet for a pushed notice that runs are or will be Pending (the webhook receiver,
/// [`crate::webhook`]): what the backlog needs beyond what is queued, before `until`, sent
/// with the request's invocation's `trace_id` as a batch's wake-ups are ([`BatchEnd::trace_id`]).
pub(crate) async fn for_push(
    waker: &Waker,
    api: &ApiClient,
    need: Need<'_>,
    request_id: &str,
    trace_id: Option<&str>,
    until: Instant,
) -> (WakeReport, Delivery) {
    let mut report = WakeReport {
        trigger: Some(need.trigger),
        ..WakeReport::default()
    };
    let sender = Sender {
        request_id,
        trace_id,
    };
    let delivery = wake_for(waker, api, need, sender, until, &mut report).await;
    (report, delivery)
}

/// Wake-ups the invocation may still send under `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, after
/// the backlog's and the timers (looks included) in `report`.
fn left(waker: &Waker, report: &WakeReport) -> usize {
    let booked: usize = report.timers.iter().map(|t| t.sent).sum();
    waker
        .settings
        .max_per_invocation
        .saturating_sub(report.sent + booked)
}

/// Book the timer wake-ups of the runs `due` later ([`timers`]; one per N runs due together,
/// at most `max`, sleeping runs watched), before `until`, into `report`.
async fn book_timers(
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
async fn book(
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

/// The backlog (`pending_runs`) and the wake-ups already queued (`queued`), each `None` when
/// it could not be read before `until` (the error recorded); `false` when nothing is pending.
async fn measure_backlog(
    waker: &Waker,
    api: &ApiClient,
    capabilities: &WorkerCapabilities,
    until: Instant,
    report: &mut WakeReport,
) -> bool {
    // Every registered workflow blocked (poison-pill defer mode): nothing a claim could take.
    // Not asked: an empty `workflows=` is no filter to every route.
    if capabilities.workflows.as_ref().is_some_and(Vec::is_empty) {
        report.pending_runs = Some(0);
        return false;
    }
    report.pending_runs = match timeout_at(until, api.pending_runs(capabilities)).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => fail(report, format!("pending count failed: {e}")),
        Err(_) => fail(report, "pending count ran into the deadline".into()),
    };
    if report.pending_runs == Some(0) {
        return false;
    }
    // The SDK's futures are deep: boxed, they keep the handler's future within the compiler's
    // layout depth.
    report.queued = match timeout_at(until, waker.queue.depth()).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => fail(
            report,
            format!("reading the wake queue's depth failed: {e}"),
        ),
        Err(_) => fail(
            report,
            "reading the wake queue's depth ran into the deadline".into(),
        ),
    };
    true
}

/// The invocation that sends wake-ups.
#[derive(Clone, Copy)]
struct Sender<'a> {
    request_id: &'a str,
    trace_id: Option<&'a str>,
}

/// Send `count` wake-ups for `trigger` before `until`, with the report's delay; `false` when
/// the deadline came first (what SQS took is unknown).
async fn send_wake_ups(
    waker: &Waker,
    count: usize,
    trigger: WakeTrigger,
    sender: Sender<'_>,
    until: Instant,
    report: &mut WakeReport,
) -> bool {
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
fn fail<T>(report: &mut WakeReport, error: String) -> Option<T> {
    warn!(error = %error, "wake-up phase");
    report.errors.push(error);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_names_in_log_lines_match_the_summary_json() {
        for trigger in [WakeTrigger::HandedBack, WakeTrigger::Backlog] {
            assert_eq!(serde_json::to_value(trigger).unwrap(), trigger.as_str());
        }
    }

    #[test]
    fn needed_is_bounded_by_backlog_queue_and_cap() {
        assert_eq!(wake_ups_needed(Some(17), 0, 8, 10), 3);
        assert_eq!(wake_ups_needed(Some(17), 2, 8, 10), 1);
        assert_eq!(wake_ups_needed(Some(100), 0, 8, 3), 3);
        assert_eq!(wake_ups_needed(Some(0), 0, 8, 3), 0);
        assert_eq!(wake_ups_needed(None, 0, 8, 3), 1);
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
