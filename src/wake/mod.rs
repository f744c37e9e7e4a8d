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
//! asleep, and (4) books the timers of the runs it left due later ([`timers`]). The sends
//! themselves are in `send.rs`; the share of a decision that the fleet's wake-up mark allows
//! when the poison-pill table is in DynamoDB, in `share.rs` ([`fleet`]).
//!
//! Invariants: a failure is logged and reported in the summary's `wake_ups.errors`, never a
//! failed batch; the whole phase ends before the invocation deadline
//! ([`Budget::wake_phase_end`]): nothing is left running when the handler returns.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

pub mod fleet;
mod local;
mod send;
mod share;
mod sqs;
pub mod timers;
mod watch;

use std::sync::Arc;

use async_trait::async_trait;
use ironflow_store::entities::WorkerCapabilities;
use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};
use uuid::Uuid;

use crate::api::ApiClient;
use crate::calls::Calls;
use crate::deadline::Budget;
use crate::report::{Due, SleepWatch, WakeReport, WakeTrigger};
use crate::settings::WakeSettings;

use self::fleet::{FleetMark, Share};
pub use self::local::LocalWakeQueue;
pub(crate) use self::send::reads_end;
use self::send::{Sender, book_timers, can_send, fail, left, send_wake_ups};
use self::share::{cover_tail, fleet_share, give_back};
pub use self::sqs::SqsWakeQueue;

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

    /// Send `count` messages with `body`, each delayed `delay_secs`, with `trace_id` as the
    /// request's X-Ray trace header when given. Returns how many were accepted and the errors
    /// (as text for the report); it never fails otherwise.
    ///
    /// The worker asks for at most 10 messages (what one `SendMessageBatch` holds) delayed at
    /// most 900 s (SQS's largest `DelaySeconds`). Beyond those: [`SqsWakeQueue`] sends the
    /// first 10 only, and a longer delay is SQS's error, returned with nothing accepted;
    /// [`LocalWakeQueue`] takes every message and caps the delay at 900 s.
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
        wake_for(
            waker,
            api,
            need,
            sender,
            (reads_end(until), until),
            &mut report,
        )
        .await;
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

/// Send what the backlog needs beyond what is queued ([`wake_ups_needed`]), into `report`: the
/// reads that decide it by `reads_until` ([`reads_end`]: a slow read must not leave a needed
/// send unstarted), the send by `until`.
async fn wake_for(
    waker: &Waker,
    api: &ApiClient,
    need: Need<'_>,
    sender: Sender<'_>,
    (reads_until, until): (Instant, Instant),
    report: &mut WakeReport,
) -> Delivery {
    let trigger = need.trigger;
    let mut delivery = Delivery::default();
    if !measure_backlog(waker, api, need.capabilities, reads_until, report).await {
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
    // Without time to send, the fleet's mark is not raised for wake-ups that will not leave
    // (the send records that none was sent).
    let share = match need.fleet.filter(|_| can_send(until)) {
        Some(fleet) => fleet_share(fleet, count, reads_until, report)
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
            let bounds = (reads_until, until);
            match cover_tail(waker, window, trigger, sender, bounds, report).await {
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
    (reads_until, until): (Instant, Instant),
) -> (WakeReport, Delivery) {
    let mut report = WakeReport {
        trigger: Some(need.trigger),
        ..WakeReport::default()
    };
    let sender = Sender {
        request_id,
        trace_id,
    };
    let bounds = (reads_until, until);
    let delivery = wake_for(waker, api, need, sender, bounds, &mut report).await;
    (report, delivery)
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
