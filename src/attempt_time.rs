//! How long a run's current attempt has executed, read from its steps as the API records them:
//! what the run timeout counts ([`executed`]). Each invocation is a new process, so nothing of
//! an earlier invocation's memory is used; the definition is stated once, in `docs/design.md`
//! ("The run timeout across invocations").
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_store::entities::{Step, StepKind, StepStatus};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use uuid::Uuid;

/// The error ironflow-engine gives an agent step parked on a capacity wait (its
/// `CAPACITY_WAIT_STEP_ERROR`, not exported): the run sleeps from that step's end until it
/// wakes.
const CAPACITY_WAIT_STEP_ERROR: &str = "waiting for provider capacity";

/// How long the attempt `attempt` of a run executed until `now`, from its `steps` (every
/// attempt's; the others are ignored): the time from the attempt's first step to `now`, less
/// every stretch in which the run waited instead of executing. A stretch between two
/// consecutive instants the steps record (a step's creation, start or end, a handback's mark,
/// and `now`) is a wait when no step that executes (any kind but a waiting one or a
/// sub-workflow) runs across it, nor an invocation that a handback's mark says executed the run
/// across it (from when it took the run up to its handback), and at its start either
/// - a waiting step was open (from its start until it was answered, or `now`): its own
///   interval and the run's sleep after it. A waiting step is a signal, an approval, a human
///   input, or a decision escalated to a human (from the end of its model call, `duration_ms`
///   after its start, until its replay after the answer completes it), or
/// - a step that suspends the run had just ended: a `ctx.delay` that set a wake-up, an agent
///   step parked on a capacity wait, a step interrupted by a handback, an operator's pause or
///   the API's reaper (the run was Pending or Paused between two invocations), or
/// - a handback, or an execution stopped by an operator's pause, that interrupted no step
///   recorded it as the instant the run began to wait ([`handback_mark`]).
///
/// The steps of the sub-workflow runs the attempt entered (`children`, [`children_of`]) count
/// as the attempt's own while the `workflow` step that entered them is open: a child that
/// waits, waits for its parent.
///
/// A step left Pending (created, its start never written) executes nothing. Zero for an attempt
/// with no step. Instants are clamped to `now` (the API's clock may run ahead of ours). Linear
/// in the steps but for a sort and a binary search per stretch: it runs at every claim.
pub(crate) fn executed(
    steps: &[Step],
    attempt: u32,
    children: &Children,
    now: DateTime<Utc>,
) -> Duration {
    let mut parts: Vec<Part> = Vec::new();
    for s in steps.iter().filter(|s| s.attempt == attempt) {
        parts.push(Part::of(s, now));
        entered(
            s,
            children,
            now,
            (DateTime::<Utc>::MIN_UTC, now),
            0,
            &mut parts,
        );
    }
    let marks = marks_of(steps.iter().filter(|s| s.attempt == attempt), now);
    let instants = instants_of(&parts, &marks, now);
    if instants.is_empty() {
        return Duration::ZERO;
    }

    let executing = Cover::new(parts.iter().filter_map(|p| p.executing));
    let handed_over = Cover::new(marks.iter().map(|m| (m.taken_up, m.handed_back)));
    let waiting = Cover::new(parts.iter().filter_map(|p| p.waiting));
    let mut waits_begin: Vec<DateTime<Utc>> = marks.iter().map(|m| m.handed_back).collect();
    waits_begin.extend(parts.iter().filter_map(|p| p.suspends_at));
    waits_begin.sort_unstable();
    // The stretch from `from` to the next instant: every span is between two instants, so one
    // that holds `from` and ends after it runs across the whole stretch.
    let waited = |from: DateTime<Utc>| {
        !executing.holds(from)
            && !handed_over.holds(from)
            && (waiting.holds(from) || waits_begin.binary_search(&from).is_ok())
    };
    instants
        .windows(2)
        .filter(|w| !waited(w[0]))
        .map(|w| (w[1] - w[0]).to_std().unwrap_or_default())
        .fold(Duration::ZERO, Duration::saturating_add)
}

/// The steps of the sub-workflow runs an attempt entered, by run id, as read at the claim
/// ([`children_of`]). A run missing here (unread) adds nothing of its own: its `workflow`
/// step's interval counts as executed, unless a sibling read waited across it with nothing
/// executing (a wave of children waiting at once, more than the reads allow).
pub(crate) type Children = HashMap<Uuid, Vec<Step>>;

/// The most levels of sub-workflows below a run whose steps [`executed`] reads: 8.
pub(crate) const MAX_DEPTH: usize = 8;

/// The child run a `workflow` step entered: `child_run_id` in its output while the child runs
/// or waits, `run_id` once it finished (ironflow-engine's `SubWorkflowOutput`).
fn child_of(step: &Step) -> Option<Uuid> {
    if step.kind != StepKind::Workflow {
        return None;
    }
    let output = step.output.as_ref()?;
    let id = output
        .get("child_run_id")
        .or_else(|| output.get("run_id"))?;
    id.as_str()?.parse().ok()
}

/// The sub-workflow runs that the steps among `steps` of attempt `attempt` (every attempt's,
/// for `None`: a child's) entered: the runs whose steps [`executed`] needs in `children`, each
/// once, those whose `workflow` step lasted longest first (still open, then the longest
/// finished: those that could have waited longest, for a reader that cannot read them all).
pub(crate) fn children_of(steps: &[Step], attempt: Option<u32>) -> Vec<Uuid> {
    let mut found: Vec<(Option<chrono::TimeDelta>, Uuid)> = steps
        .iter()
        .filter(|s| attempt.is_none_or(|a| s.attempt == a))
        .filter_map(|s| {
            let start = s.started_at.unwrap_or(s.created_at);
            Some((s.completed_at.map(|end| end - start), child_of(s)?))
        })
        .collect();
    // Open (`None`) first, then the longest.
    found.sort_by(|a, b| match (a.0, b.0) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x),
    });
    let mut seen = std::collections::HashSet::new();
    found
        .into_iter()
        .filter_map(|(_, id)| seen.insert(id).then_some(id))
        .collect()
}

/// Add to `parts` the steps of the child run `step` entered (and of its own children, down to
/// [`MAX_DEPTH`] levels), each cut to the part of `within` and of `step`'s interval it shares:
/// the child's steps execute and wait for the run that entered it while that step is open,
/// whichever of the child's attempts they belong to. A child interrupted with its parent's
/// step and entered again later is read once per entry.
fn entered(
    step: &Step,
    children: &Children,
    now: DateTime<Utc>,
    within: (DateTime<Utc>, DateTime<Utc>),
    depth: usize,
    parts: &mut Vec<Part>,
) {
    let Some(child) = child_of(step).and_then(|id| children.get(&id)) else {
        return;
    };
    if depth >= MAX_DEPTH {
        return;
    }
    let start = step.started_at.unwrap_or(step.created_at).min(now);
    let end = step.completed_at.map_or(now, |at| at.min(now));
    let within = (within.0.max(start), within.1.min(end));
    if within.0 >= within.1 {
        return;
    }
    for s in child {
        parts.push(Part::of(s, now).cut_to(within));
        entered(s, children, now, within, depth + 1, parts);
    }
}

/// The marks handbacks recorded on `steps`, their instants clamped to `now`.
fn marks_of<'a>(steps: impl Iterator<Item = &'a Step>, now: DateTime<Utc>) -> Vec<Mark> {
    steps
        .flat_map(marks_on)
        .map(|m| Mark {
            taken_up: m.taken_up.min(now),
            handed_back: m.handed_back.min(now),
        })
        .collect()
}

/// The instants [`executed`] reads stretches between, in order, each once: those `parts`
/// record, the `marks`' and `now`. Empty when the parts record none (no step).
fn instants_of(parts: &[Part], marks: &[Mark], now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut instants: Vec<DateTime<Utc>> =
        parts.iter().flat_map(|p| p.instants).flatten().collect();
    if instants.is_empty() {
        return instants;
    }
    instants.extend(marks.iter().flat_map(|m| [m.taken_up, m.handed_back]));
    instants.push(now);
    instants.sort_unstable();
    instants.dedup();
    instants
}

/// What one step of the attempt adds to [`executed`]'s reading, its instants clamped to `now`.
struct Part {
    /// The instants it records: its creation, its start, and the end of what it executed
    /// (none for a waiting step, whose end is its answer's, not the run's doing).
    instants: [Option<DateTime<Utc>>; 3],
    /// When it executed (`None` for a waiting step, a sub-workflow, a step left Pending).
    executing: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// When it waited for something outside the run.
    waiting: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Its end, when the run was suspended after it ([`suspends`]).
    suspends_at: Option<DateTime<Utc>>,
}

impl Part {
    fn of(s: &Step, now: DateTime<Utc>) -> Self {
        let start = s.started_at.unwrap_or(s.created_at).min(now);
        let end = s.completed_at.map_or(now, |at| at.min(now)).max(start);
        let (executing, waiting, last) = if is_waiting(s) {
            (None, Some((start, end)), None)
        } else if is_escalated(s) {
            // Its model call, then the human's answer.
            let call = Duration::from_millis(s.duration_ms);
            let turn = later(start, call).min(end);
            (Some((start, turn)), Some((turn, end)), Some(turn))
        } else if s.kind == StepKind::Workflow || s.status.state == StepStatus::Pending {
            // A sub-workflow's time is its child's; a step still Pending never started (its
            // start was never written: the engine creates a new one at its replay).
            (None, None, s.completed_at.map(|at| at.min(now)))
        } else {
            (
                Some((start, end)),
                None,
                s.completed_at.map(|at| at.min(now)),
            )
        };
        Part {
            instants: [
                Some(s.created_at.min(now)),
                s.started_at.map(|at| at.min(now)),
                last,
            ],
            executing,
            waiting,
            suspends_at: suspends(s)
                .then_some(s.completed_at)
                .flatten()
                .map(|at| at.min(now)),
        }
    }
}

impl Part {
    /// This part as seen from the run whose step entered its sub-workflow: what falls within
    /// `[from, to]`.
    fn cut_to(self, (from, to): (DateTime<Utc>, DateTime<Utc>)) -> Self {
        let inside = |at: &DateTime<Utc>| from <= *at && *at <= to;
        let cut = |(s, e): (DateTime<Utc>, DateTime<Utc>)| {
            let (s, e) = (s.max(from), e.min(to));
            (s < e).then_some((s, e))
        };
        Part {
            instants: self.instants.map(|at| at.filter(inside)),
            executing: self.executing.and_then(cut),
            waiting: self.waiting.and_then(cut),
            suspends_at: self.suspends_at.filter(|at| from <= *at && *at < to),
        }
    }
}

/// `at` plus `d`, saturating at the latest instant chrono represents.
fn later(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A set of spans `[start, end)`, asked which instants they hold in `O(log n)`.
struct Cover {
    starts: Vec<DateTime<Utc>>,
    ends: Vec<DateTime<Utc>>,
}

impl Cover {
    fn new(spans: impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)>) -> Self {
        let (mut starts, mut ends): (Vec<_>, Vec<_>) = spans.filter(|(s, e)| s < e).unzip();
        starts.sort_unstable();
        ends.sort_unstable();
        Cover { starts, ends }
    }

    /// Whether a span holds `at` (starts at or before it, ends after it): every span that
    /// ended by `at` had also started by then.
    fn holds(&self, at: DateTime<Utc>) -> bool {
        self.starts.partition_point(|s| *s <= at) > self.ends.partition_point(|e| *e <= at)
    }
}

/// The key of the debug message in which a handback that interrupted no step records when the
/// run began to wait, beside [`TAKEN_UP_KEY`]: `{"ironflow_lambda_handed_back_at": "<RFC 3339
/// instant>", "ironflow_lambda_taken_up_at": "<RFC 3339 instant>"}`.
pub(crate) const HANDED_BACK_KEY: &str = "ironflow_lambda_handed_back_at";

/// The key of the instant the invocation that handed the run back took it up, in the same
/// debug message: the run executed from then to the handback, steps or not.
pub(crate) const TAKEN_UP_KEY: &str = "ironflow_lambda_taken_up_at";

/// What one handback that interrupted no step recorded ([`handback_mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// When its invocation took the run up: the run executed from then…
    taken_up: DateTime<Utc>,
    /// …to then, when it began to wait.
    handed_back: DateTime<Utc>,
}

/// The most a step's debug messages may weigh, serialized, for a handback to add its mark to
/// them: 64 KiB (the write sends them whole).
pub(crate) const MAX_MARKED_BYTES: usize = 64 * 1024;

/// Where a handback at `at` that interrupted no step records that the run executed from
/// `taken_up` (when its invocation took it up) and begins to wait (read back by [`executed`]):
/// one step of the attempt `attempt` among `steps`, the one whose debug messages weigh least,
/// its debug messages with the mark added (those it had kept, in order), and the mark's
/// instant: `at`, or the latest instant the steps record if that is later (the API's clock,
/// which stamps `created_at`, may run ahead of ours; a mark before an instant would not begin
/// the last stretch). Which step carries it does not matter: the mark is a stretch of the
/// attempt.
///
/// `None` when a step of the attempt is still Running (its interruption marks the wait), when
/// the attempt has no step (nothing before its first step counts), or when every step's debug
/// messages weigh more than [`MAX_MARKED_BYTES`]; the Pending time then counts until the next
/// step, as docs/design.md says.
pub(crate) fn handback_mark(
    steps: &[Step],
    attempt: u32,
    taken_up: DateTime<Utc>,
    at: DateTime<Utc>,
) -> Option<(uuid::Uuid, serde_json::Value, DateTime<Utc>)> {
    let steps: Vec<&Step> = steps.iter().filter(|s| s.attempt == attempt).collect();
    if steps.iter().any(|s| s.status.state == StepStatus::Running) {
        return None;
    }
    let at = not_before_recorded(steps.iter().copied(), at);
    let (step, weight) = steps
        .iter()
        .map(|s| {
            (
                *s,
                s.debug_messages.as_ref().map_or(0, |m| m.to_string().len()),
            )
        })
        .min_by_key(|(_, weight)| *weight)?;
    if weight > MAX_MARKED_BYTES {
        return None;
    }
    let mut messages = match step.debug_messages.clone() {
        Some(serde_json::Value::Array(messages)) => messages,
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(other) => vec![other],
    };
    messages.push(serde_json::json!({ HANDED_BACK_KEY: at, TAKEN_UP_KEY: taken_up.min(at) }));
    Some((step.id, serde_json::Value::Array(messages), at))
}

/// `at`, or the latest instant `steps` record (a creation, a start, an end) if that is later:
/// the API's clock, which stamps `created_at`, may run ahead of ours, and an instant a worker
/// writes (a mark, an interruption's end) before one the API stamped would not begin the wait
/// that follows.
pub(crate) fn not_before_recorded<'a>(
    steps: impl IntoIterator<Item = &'a Step>,
    at: DateTime<Utc>,
) -> DateTime<Utc> {
    steps
        .into_iter()
        .flat_map(|s| [Some(s.created_at), s.started_at, s.completed_at])
        .flatten()
        .fold(at, DateTime::max)
}

/// Whether a step of the attempt `attempt` carries the mark of a handback at `at`: its write
/// landed (read back after a lost answer).
pub(crate) fn is_marked(steps: &[Step], attempt: u32, at: DateTime<Utc>) -> bool {
    steps
        .iter()
        .filter(|s| s.attempt == attempt)
        .any(|s| marks_on(s).any(|m| m.handed_back == at))
}

/// The marks handbacks recorded on `step` ([`handback_mark`]); one without its taken-up
/// instant executed nothing before its handback.
fn marks_on(step: &Step) -> impl Iterator<Item = Mark> + '_ {
    let instant = |m: &serde_json::Value, key| m.get(key)?.as_str()?.parse().ok();
    step.debug_messages
        .as_ref()
        .and_then(|m| m.as_array())
        .into_iter()
        .flatten()
        .filter_map(move |m| {
            let handed_back: DateTime<Utc> = instant(m, HANDED_BACK_KEY)?;
            let taken_up = instant(m, TAKEN_UP_KEY).unwrap_or(handed_back);
            Some(Mark {
                taken_up: taken_up.min(handed_back),
                handed_back,
            })
        })
}

/// A step that waits for something outside the run: a signal, an approval, a human input.
fn is_waiting(step: &Step) -> bool {
    matches!(
        step.kind,
        StepKind::Signal | StepKind::Approval | StepKind::HumanInput
    )
}

/// A decision escalated to a human (`escalate_below`): the engine leaves it AwaitingApproval
/// and the replay after the answer completes it; the answer is a vote on it.
fn is_escalated(step: &Step) -> bool {
    step.kind == StepKind::Decision
        && (step.status.state == StepStatus::AwaitingApproval || !step.approvals.is_empty())
}

/// A step after whose end the run did not execute until it was taken up again: a delay that
/// set a wake-up (a zero delay completes at once and does not suspend), an agent step parked
/// on a capacity wait, a step interrupted by a handback or the reaper.
fn suspends(step: &Step) -> bool {
    let delay = matches!(&step.kind, StepKind::Custom(kind) if kind == "delay")
        && step.status.state == StepStatus::Completed
        && step
            .output
            .as_ref()
            .is_some_and(|o| o.get("wake_at").is_some());
    let parked_or_interrupted = step.status.state == StepStatus::Failed
        && matches!(
            step.error.as_deref(),
            Some(CAPACITY_WAIT_STEP_ERROR | STEP_INTERRUPTED_ERROR)
        );
    delay || parked_or_interrupted
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use serde_json::json;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    /// A step of attempt 1 from its JSON shape, created and started at `start`.
    fn step(kind: &str, status: &str, start: i64, end: Option<i64>) -> serde_json::Value {
        json!({
            "id": uuid::Uuid::new_v4(), "trace_id": uuid::Uuid::new_v4(),
            "run_id": uuid::Uuid::nil(), "name": kind, "kind": kind, "position": 0,
            "status": {"state": status, "state_machine_id": uuid::Uuid::nil()}, "attempt": 1, "duration_ms": 0, "cost_usd": "0",
            "created_at": t(start), "updated_at": t(start), "started_at": t(start),
            "completed_at": end.map(t), "is_error_handler": false,
        })
    }

    fn steps(values: Vec<serde_json::Value>) -> Vec<Step> {
        values
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("a step"))
            .collect()
    }

    /// [`executed`] of an attempt that entered no sub-workflow.
    fn executed_alone(steps: &[Step], attempt: u32, now: DateTime<Utc>) -> Duration {
        executed(steps, attempt, &Children::new(), now)
    }

    fn secs(d: Duration) -> u64 {
        d.as_secs()
    }

    #[test]
    fn a_signal_wait_and_the_sleep_after_it_are_not_executed_time() {
        // 2 s of shell, a signal answered at 100 s, claimed again at 300 s, 5 s more.
        let mut after = step("shell", "running", 301, None);
        after["created_at"] = json!(t(300));
        let s = steps(vec![
            step("shell", "completed", 0, Some(2)),
            step("signal", "completed", 2, Some(100)),
            after,
        ]);
        assert_eq!(secs(executed_alone(&s, 1, t(305))), 2 + 5);
        // Still waiting at the claim: nothing after the wait's start counts.
        let s = steps(vec![
            step("shell", "completed", 0, Some(2)),
            step("human_input", "awaiting_approval", 2, None),
        ]);
        assert_eq!(secs(executed_alone(&s, 1, t(5000))), 2);
    }

    #[test]
    fn a_delay_and_a_handback_suspend_the_run_until_it_is_taken_up_again() {
        let mut delay = step("delay", "completed", 3, Some(3));
        delay["output"] = json!({"wake_at": t(600)});
        let mut interrupted = step("shell", "failed", 700, Some(710));
        interrupted["error"] = json!(STEP_INTERRUPTED_ERROR);
        let s = steps(vec![
            step("shell", "completed", 0, Some(3)),
            delay,
            // Taken up at 700, handed back at 710 (its step interrupted), again at 900.
            interrupted,
        ]);
        assert_eq!(secs(executed_alone(&s, 1, t(900))), 3 + 10);
        // An agent step parked on a capacity wait: the run sleeps from its end.
        let mut parked = step("agent", "failed", 0, Some(4));
        parked["error"] = json!(CAPACITY_WAIT_STEP_ERROR);
        assert_eq!(secs(executed_alone(&steps(vec![parked]), 1, t(500))), 4);
        // A zero delay (no wake-up) does not suspend: what follows it executes.
        let s = steps(vec![step("delay", "completed", 0, Some(0))]);
        assert_eq!(secs(executed_alone(&s, 1, t(40))), 40);
    }

    /// `steps` with the mark of a handback at `at`, by an invocation that took the run up at
    /// `taken_up`, written where [`handback_mark`] puts it.
    fn marked(mut steps: Vec<Step>, taken_up: i64, at: i64) -> Vec<Step> {
        let (id, messages, _) =
            handback_mark(&steps, 1, t(taken_up), t(at)).expect("a step to mark");
        let step = steps.iter_mut().find(|s| s.id == id).expect("one of them");
        step.debug_messages = Some(messages);
        steps
    }

    #[test]
    fn the_pending_time_after_a_handback_that_interrupted_no_step_is_a_wait() {
        // Taken up at 0, 3 s of shell, its next step deferred (never created): handed back at
        // 4, Pending until the claim at 100.
        let s = steps(vec![step("shell", "completed", 0, Some(3))]);
        assert_eq!(
            secs(executed_alone(&s, 1, t(100))),
            100,
            "unmarked, the wait counts"
        );
        let s = marked(s, 0, 4);
        assert_eq!(secs(executed_alone(&s, 1, t(100))), 4);
        // Taken up at 100 and deferred again at 101 before any step: that second counts, the
        // waits before and after it do not.
        let s = marked(s, 100, 101);
        assert_eq!(secs(executed_alone(&s, 1, t(300))), 4 + 1);
        // Then 10 s of a step, handed back after it at 311 and claimed at 500: every wait of
        // the attempt is still one.
        let mut s = s;
        s.extend(steps(vec![step("shell", "completed", 300, Some(310))]));
        let s = marked(s, 300, 311);
        assert_eq!(secs(executed_alone(&s, 1, t(500))), 3 + 1 + 1 + 10 + 1);
        // Workflow code that runs outside any step until each cutoff: every invocation's time
        // counts, so the run timeout still ends it.
        let s = steps(vec![step("shell", "completed", 0, Some(1))]);
        let s = marked(marked(marked(s, 0, 60), 100, 160), 200, 260);
        assert_eq!(secs(executed_alone(&s, 1, t(300))), 60 * 3);
        // A step executing across a mark: that stretch counts all the same.
        let mut running = steps(vec![step("shell", "running", 0, None)]);
        running[0].debug_messages =
            Some(json!([{ HANDED_BACK_KEY: t(10) }, {"role": "assistant"}]));
        assert_eq!(secs(executed_alone(&running, 1, t(30))), 30);
    }

    #[test]
    fn a_step_left_pending_executes_nothing_and_an_api_clock_ahead_does_not_undo_a_mark() {
        // Created at 4, its start never written: the handback at 5 marks the wait, claimed at
        // 1000; then 2 s of a step and a signal answered a day later, claimed at 90 000.
        let s = steps(vec![
            step("shell", "completed", 0, Some(3)),
            step("shell", "pending", 4, None),
        ]);
        let mut s = marked(s, 0, 5);
        assert_eq!(secs(executed_alone(&s, 1, t(1000))), 5);
        s.extend(steps(vec![
            step("shell", "completed", 1000, Some(1002)),
            step("signal", "completed", 1002, Some(86_400)),
        ]));
        assert_eq!(secs(executed_alone(&s, 1, t(90_000))), 5 + 2);
        // An instant step the API stamped 2 s ahead of our clock, after our handback's "now":
        // the mark goes after it, and the Pending time is a wait.
        let mut skip = step("skip", "completed", 3, Some(3));
        skip["created_at"] = json!(t(6));
        let s = steps(vec![step("shell", "completed", 0, Some(3)), skip]);
        let (_, _, at) = handback_mark(&s, 1, t(0), t(4)).unwrap();
        assert_eq!(at, t(6));
        assert_eq!(secs(executed_alone(&marked(s, 0, 4), 1, t(100))), 6);
    }

    #[test]
    fn a_handback_marks_the_lightest_step_and_keeps_its_messages() {
        let mut s = steps(vec![
            step("agent", "completed", 0, Some(3)),
            step("shell", "completed", 3, Some(4)),
        ]);
        s[0].debug_messages = Some(json!([{"role": "user", "content": "long"}]));
        s[1].debug_messages = Some(json!([{"note": 1}]));
        let (id, messages, at) = handback_mark(&s, 1, t(0), t(5)).unwrap();
        assert_eq!(at, t(5));
        assert_eq!(id, s[1].id);
        let mark = json!({ HANDED_BACK_KEY: t(5), TAKEN_UP_KEY: t(0) });
        assert_eq!(messages, json!([{"note": 1}, mark]));
        // A step still running is marked by its interruption instead; no step, no mark.
        let running = steps(vec![step("shell", "running", 0, None)]);
        assert_eq!(handback_mark(&running, 1, t(0), t(5)), None);
        assert_eq!(handback_mark(&[], 1, t(0), t(5)), None);
        // Nor on messages too heavy to send again.
        let mut heavy = steps(vec![step("agent", "completed", 0, Some(3))]);
        heavy[0].debug_messages = Some(json!(["x".repeat(MAX_MARKED_BYTES)]));
        assert_eq!(handback_mark(&heavy, 1, t(0), t(5)), None);
        // Messages that are not a list are kept as its first element.
        let mut odd = steps(vec![step("shell", "completed", 0, Some(3))]);
        odd[0].debug_messages = Some(json!({"k": "v"}));
        let (_, messages, _) = handback_mark(&odd, 1, t(0), t(5)).unwrap();
        assert_eq!(messages, json!([{"k": "v"}, mark]));
    }

    /// An escalated decision of attempt 1 at `start`: its model call took `call_ms`, its
    /// answer (a vote) came, and its replay completed it at `end`, if it did.
    fn escalated(start: i64, call_ms: u64, end: Option<i64>) -> serde_json::Value {
        let status = match end {
            Some(_) => "completed",
            None => "awaiting_approval",
        };
        let mut d = step("decision", status, start, end);
        d["duration_ms"] = json!(call_ms);
        if end.is_some() {
            d["approvals"] = json!([{"user_id": uuid::Uuid::nil(), "approved_by": "ops", "at": t(start + 4000)}]);
        }
        d
    }

    #[test]
    fn a_decision_escalated_to_a_human_waits_from_the_end_of_its_model_call() {
        // 2 s of shell, a decision whose model call took 3 s, escalated: at the claim after
        // the answer, 5000 s later, only the 5 s executed count.
        let open = steps(vec![
            step("shell", "completed", 0, Some(2)),
            escalated(2, 3000, None),
        ]);
        assert_eq!(secs(executed_alone(&open, 1, t(5000))), 2 + 3);
        // Its replay completed it at 5001; 4 s of a step after it, a claim at 5010.
        let s = steps(vec![
            step("shell", "completed", 0, Some(2)),
            escalated(2, 3000, Some(5001)),
            step("shell", "completed", 5001, Some(5005)),
        ]);
        assert_eq!(secs(executed_alone(&s, 1, t(5010))), 2 + 3 + 4 + 5);
        // A decision that was not escalated executes from its start to its end, as any step.
        let mut plain = step("decision", "completed", 0, Some(7));
        plain["duration_ms"] = json!(3000);
        assert_eq!(secs(executed_alone(&steps(vec![plain]), 1, t(7))), 7);
    }

    /// [`executed`]'s definition read stretch by stretch over every step, without its spans'
    /// binary search: what the fast reading must agree with.
    fn executed_by_scan(steps: &[Step], now: DateTime<Utc>) -> Duration {
        let parts: Vec<Part> = steps.iter().map(|s| Part::of(s, now)).collect();
        let marks = marks_of(steps.iter(), now);
        let instants = instants_of(&parts, &marks, now);
        let within = |span: Option<(DateTime<Utc>, DateTime<Utc>)>, from, to| {
            span.is_some_and(|(s, e)| s <= from && e >= to && s < e)
        };
        instants
            .windows(2)
            .filter(|w| {
                let (from, to) = (w[0], w[1]);
                let waited = !parts.iter().any(|p| within(p.executing, from, to))
                    && !marks
                        .iter()
                        .any(|m| within(Some((m.taken_up, m.handed_back)), from, to))
                    // A wait goes on past its end to the next instant: the run's sleep after it.
                    && (parts
                        .iter()
                        .any(|p| p.waiting.is_some_and(|(s, e)| s <= from && e > from))
                        || marks.iter().any(|m| m.handed_back == from)
                        || parts.iter().any(|p| p.suspends_at == Some(from)));
                !waited
            })
            .map(|w| (w[1] - w[0]).to_std().unwrap_or_default())
            .sum()
    }

    #[test]
    fn the_spans_binary_search_reads_as_a_scan_of_every_step() {
        use rand::{Rng, SeedableRng};
        // A fixed seed: the same cases at every run.
        let seed = 0x5eed_a77e;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for case in 0..2000 {
            let mut values = Vec::new();
            for _ in 0..rng.random_range(0..12) {
                let start = rng.random_range(0..100);
                let end = rng
                    .random_bool(0.8)
                    .then(|| start + rng.random_range(0..30));
                let (kind, status) = match rng.random_range(0..7) {
                    0 => (
                        "signal",
                        if end.is_some() {
                            "completed"
                        } else {
                            "awaiting_approval"
                        },
                    ),
                    1 => (
                        "workflow",
                        if end.is_some() {
                            "completed"
                        } else {
                            "running"
                        },
                    ),
                    2 => ("shell", "pending"),
                    3 => ("delay", "completed"),
                    _ => ("shell", if end.is_some() { "failed" } else { "running" }),
                };
                let mut v = match rng.random_range(0..6) {
                    0 => escalated(start, rng.random_range(0..20_000), end),
                    _ => step(kind, status, start, end),
                };
                if kind == "delay" {
                    v["completed_at"] = json!(t(start));
                    v["output"] = json!({"wake_at": t(start + 50)});
                }
                if status == "failed" && rng.random_bool(0.5) {
                    v["error"] = json!(STEP_INTERRUPTED_ERROR);
                }
                values.push(v);
            }
            let mut s = steps(values);
            for _ in 0..rng.random_range(0..3) {
                if let Some((id, messages, _)) = handback_mark(
                    &s,
                    1,
                    t(rng.random_range(0..100)),
                    t(rng.random_range(0..140)),
                ) {
                    s.iter_mut().find(|x| x.id == id).unwrap().debug_messages = Some(messages);
                }
            }
            let now = t(rng.random_range(0..150));
            assert_eq!(
                executed_alone(&s, 1, now),
                executed_by_scan(&s, now),
                "seed {seed}, case {case}: {s:#?}"
            );
        }
    }

    /// A `workflow` step of attempt 1 from `start` to `end` that entered run `child`.
    fn workflow(child: uuid::Uuid, start: i64, end: Option<i64>) -> serde_json::Value {
        let status = if end.is_some() {
            "completed"
        } else {
            "running"
        };
        let mut w = step("workflow", status, start, end);
        w["output"] = match end {
            Some(_) => json!({"run_id": child, "workflow_name": "child", "status": "completed"}),
            None => json!({"child_run_id": child}),
        };
        w
    }

    #[test]
    fn a_sub_workflow_s_waits_are_its_parent_s_and_its_steps_count_within_its_step() {
        let (child, grandchild) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        // 1 s of `a`; the child: 2 s of `x`, a human input answered 1000 s later, 3 s of `y`;
        // then `c`, handed back at 1010 (interrupted), claimed at 2000.
        let mut c = step("shell", "failed", 1006, Some(1010));
        c["error"] = json!(STEP_INTERRUPTED_ERROR);
        let parent = steps(vec![
            step("shell", "completed", 0, Some(1)),
            workflow(child, 1, Some(1006)),
            c,
        ]);
        let mut kids = Children::new();
        let alone = executed(&parent, 1, &kids, t(2000));
        assert_eq!(secs(alone), 1010, "unread, the child's wait counts");
        kids.insert(
            child,
            steps(vec![
                step("shell", "completed", 1, Some(3)),
                step("human_input", "completed", 3, Some(1003)),
                step("shell", "completed", 1003, Some(1006)),
            ]),
        );
        assert_eq!(secs(executed(&parent, 1, &kids, t(2000))), 1 + 2 + 3 + 4);

        // A grandchild that sleeps (`ctx.delay`) 500 s inside the child's step, read too.
        let mut delay = step("delay", "completed", 5, Some(5));
        delay["output"] = json!({"wake_at": t(505)});
        kids.insert(
            child,
            steps(vec![
                step("shell", "completed", 1, Some(3)),
                workflow(grandchild, 3, Some(506)),
            ]),
        );
        kids.insert(
            grandchild,
            steps(vec![
                step("shell", "completed", 3, Some(5)),
                delay,
                step("shell", "completed", 505, Some(506)),
            ]),
        );
        let parent = steps(vec![
            step("shell", "completed", 0, Some(1)),
            workflow(child, 1, Some(506)),
        ]);
        assert_eq!(secs(executed(&parent, 1, &kids, t(506))), 1 + 2 + 2 + 1);

        // The child's steps count only within its parent's step: a step left Running in the
        // child when the parent's step was interrupted at 10 (a handback) does not run on
        // through the Pending time after it.
        let mut cut = workflow(child, 1, Some(10));
        cut["status"]["state"] = json!("failed");
        cut["error"] = json!(STEP_INTERRUPTED_ERROR);
        let parent = steps(vec![step("shell", "completed", 0, Some(1)), cut]);
        kids.insert(child, steps(vec![step("shell", "running", 2, None)]));
        assert_eq!(secs(executed(&parent, 1, &kids, t(900))), 10);
    }

    #[test]
    fn an_unread_child_is_covered_by_a_sibling_s_wait_and_the_longest_are_read_first() {
        // A wave: two children entered at once, `waits` waited 599 s for a signal, `unread`
        // could not be read (beyond the reads' bounds). Only `waits`' 1 s step executed.
        let (waits, unread) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let parent = steps(vec![
            workflow(waits, 0, Some(600)),
            workflow(unread, 0, Some(600)),
        ]);
        let mut kids = Children::new();
        kids.insert(
            waits,
            steps(vec![
                step("shell", "completed", 0, Some(1)),
                step("signal", "completed", 1, Some(600)),
            ]),
        );
        assert_eq!(secs(executed(&parent, 1, &kids, t(600))), 1);
        // Alone, the unread child's interval counts.
        let alone = steps(vec![workflow(unread, 0, Some(600))]);
        assert_eq!(secs(executed(&alone, 1, &kids, t(600))), 600);
        // Still open first, then the longest finished; each child once.
        let (short, long, open) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let entered = steps(vec![
            workflow(short, 0, Some(1)),
            workflow(long, 1, Some(500)),
            workflow(short, 500, Some(502)),
            workflow(open, 502, None),
        ]);
        assert_eq!(children_of(&entered, Some(1)), [open, long, short]);
    }

    #[test]
    fn an_interruption_ends_no_earlier_than_an_instant_the_api_stamped() {
        // `b` created at 10 by an API clock 2 s ahead of ours, interrupted at our 9: its end
        // must not come before its start, or the Pending time after it counts (claim at 1000).
        let mut b = step("shell", "failed", 10, None);
        b["error"] = json!(STEP_INTERRUPTED_ERROR);
        let mut s = steps(vec![step("shell", "completed", 0, Some(3)), b]);
        s[1].completed_at = Some(t(9));
        assert_eq!(
            secs(executed_alone(&s, 1, t(1000))),
            999,
            "ended before it began: only the second between its end and its start is a wait"
        );
        s[1].completed_at = Some(not_before_recorded(&s, t(9)));
        assert_eq!(s[1].completed_at, Some(t(10)));
        assert_eq!(secs(executed_alone(&s, 1, t(1000))), 10);
    }

    #[test]
    fn execution_beside_an_open_wait_counts_and_other_attempts_do_not() {
        // A parallel branch executes for 50 s while another waits for an approval.
        let mut other_attempt = step("shell", "completed", -1000, Some(-10));
        other_attempt["attempt"] = json!(2);
        let s = steps(vec![
            step("approval", "awaiting_approval", 0, None),
            step("shell", "completed", 0, Some(50)),
            other_attempt,
        ]);
        assert_eq!(secs(executed_alone(&s, 1, t(400))), 50);
        assert_eq!(executed_alone(&[], 1, t(1)), Duration::ZERO);
        // Executing without a wait: all of it, clamped to now.
        let s = steps(vec![step("shell", "running", 0, None)]);
        assert_eq!(secs(executed_alone(&s, 1, t(30))), 30);
        assert_eq!(
            executed_alone(&s, 1, t(30) - TimeDelta::seconds(60)),
            Duration::ZERO
        );
    }
}
