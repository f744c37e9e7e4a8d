//! The data an invocation reports, shared by the modules that produce and read it: how each
//! run ended ([`Outcome`], [`RunReport`]), why the claim loop stopped ([`StopReason`]), the
//! API faults met ([`FaultKind`], [`ApiErrorCount`]), the step logs forwarded ([`FlushReport`]),
//! the wake-ups sent ([`WakeReport`]), what the runs' model calls used and cost ([`Spend`]), the
//! invocation's JSON summary ([`InvocationSummary`]), and what a trigger asks for
//! ([`BatchRequest`]). The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ironflow_store::entities::{Run, RunStatus};
use serde::Serialize;
use uuid::Uuid;

/// How one run ended in this invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The handler finished; the engine recorded the run's final status (`completed`, or
    /// `warning`, `cancelled`... as the run ended).
    Completed,
    /// The handler stopped before the end of the workflow, which now waits: for a timer or a
    /// signal (status `sleeping`), an approval (`awaiting_approval`) or an operator
    /// (`paused`; `pending` or `running` if already resumed). The API wakes it back to
    /// Pending, and a later invocation (schedule tick, wake-up or direct call) claims it.
    /// Also a run an operator paused while it executed: abandoned at once (or found paused
    /// when its handback or its failure was to be written: nothing written), the resume
    /// replays it; and a claimed run found paused as it was written back unexecuted (claimed
    /// ahead, or of a blocked workflow). These carry the pause in `error`: the poison pill
    /// neither counts nor resets them.
    Suspended,
    /// The handler returned an error; the engine already recorded the failure or armed a retry.
    Failed,
    /// The run attempt executed past its run timeout (waits not counted: `docs/design.md`);
    /// failed or scheduled for retry.
    TimedOut,
    /// The handler panicked; failed or scheduled for retry.
    Panicked,
    /// The run was cancelled through the API while this invocation held it: abandoned, nothing
    /// written.
    Cancelled,
    /// The lease went to someone else, or expired and could not be confirmed again; nothing
    /// was written.
    LeaseLost,
    /// Written back to Pending for the next invocation, which resumes it by replay: it was
    /// still running at the cutoff, or its attempt ended on an API fault (not a workflow
    /// failure: `error` says which), or its lease expired and was confirmed again. Also a run
    /// the same invocation claimed again while this execution of it still went on (`error`
    /// says so): the later claim's report follows.
    HandedBack,
    /// Claimed ahead of a free slot, or among an invocation's first claims sent together
    /// (claim-ahead, `docs/design.md#claim-ahead`), but not started before the claim window closed, or claimed
    /// by a claim answered only after the window closed: written back to Pending without
    /// executing, for the next invocation.
    Released,
    /// Claimed while its workflow was blocked as a poison pill: failed without executing
    /// (fail mode), or written back to Pending without executing (defer mode).
    PoisonBlocked,
}

impl Outcome {
    /// Whether the outcome counts as a failure of the workflow for the poison-pill table.
    pub fn is_workflow_failure(self) -> bool {
        matches!(self, Self::Failed | Self::TimedOut | Self::Panicked)
    }
}

/// What became of one claimed run, as listed in the invocation summary.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The run's id.
    pub run_id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// How it ended in this invocation.
    pub outcome: Outcome,
    /// Time it executed in this invocation (zero when it never started). In the summary as
    /// `duration_ms`, whole milliseconds.
    #[serde(rename = "duration_ms", serialize_with = "whole_millis")]
    pub executed: Duration,
    /// The error, for every outcome but Completed and a clean HandedBack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run was left to the API's reaper: still Running under a lease nobody refreshes,
    /// because its handback or release could not be written (the API kept failing, or the
    /// time ran out). The reaper requeues it after the lease TTL, and fails it instead once
    /// its lease expired more times than its `max_retries`. In the summary only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub left_to_reaper: bool,
    /// Its execution did not stop when told to: workflow code blocks its thread. Its fate was
    /// written all the same, and nothing it sends later reaches the API. In the summary only
    /// when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stuck: bool,
    /// When it becomes claimable again, if this invocation left it waiting for a known time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<Due>,
    /// What its steps' model calls used and cost in this invocation, in the summary as its
    /// fields (`input_tokens`, `output_tokens`, `cost_usd`, `steps_cut`, `calls_cut`,
    /// `estimated_input_tokens`).
    #[serde(flatten)]
    pub spend: Spend,
    /// The run's attempt counter when claimed (`retry_count`), part of the failure id.
    #[serde(skip)]
    pub retry_count: u32,
    /// The run's `lease_recoveries` when claimed.
    #[serde(skip)]
    pub lease_recoveries: u32,
}

fn whole_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a run's time in this invocation ended: its outcome, the error, and whether it was left
/// to the API's reaper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fate {
    pub outcome: Outcome,
    pub error: Option<String>,
    pub left_to_reaper: bool,
    /// When the run is due again, as the write of this fate left it (a retry armed for a
    /// timeout or a panic).
    pub due: Option<Due>,
    /// The write of this fate found the run paused by an operator and wrote nothing
    /// ([`Fate::paused`]).
    pub paused: bool,
}

impl Fate {
    /// `outcome`, with `error` when there is one, not left to the reaper.
    pub fn new(outcome: Outcome, error: Option<String>) -> Self {
        Self {
            outcome,
            error,
            left_to_reaper: false,
            due: None,
            paused: false,
        }
    }

    /// A run found paused by an operator when this fate was to be written (`what`: the write
    /// that was not made): Suspended, nothing written; the resume replays it.
    pub fn paused(what: &str) -> Self {
        Self {
            paused: true,
            ..Self::new(
                Outcome::Suspended,
                Some(format!(
                    "the run was paused by an operator: {what} not written; the resume replays it"
                )),
            )
        }
    }

    /// This fate, the run due again as `due` says.
    pub fn due(mut self, due: Option<Due>) -> Self {
        self.due = due;
        self
    }

    /// `outcome`, left to the API's reaper for `why`.
    pub fn left_to_reaper(outcome: Outcome, why: String) -> Self {
        Self {
            outcome,
            error: Some(why),
            left_to_reaper: true,
            due: None,
            paused: false,
        }
    }
}

impl RunReport {
    /// The report of `run` for `fate`, after it executed for `executed`.
    pub(crate) fn new(run: &Run, fate: Fate, executed: Duration) -> Self {
        Self {
            run_id: run.id,
            workflow: run.workflow_name.clone(),
            outcome: fate.outcome,
            executed,
            error: fate.error,
            left_to_reaper: fate.left_to_reaper,
            stuck: false,
            due: fate.due,
            spend: Spend::default(),
            retry_count: run.retry_count,
            lease_recoveries: run.lease_recoveries,
        }
    }

    /// The report of a claimed run that never executed: its workflow was blocked
    /// (PoisonBlocked), it was claimed ahead and got no slot (Released), its lease was lost
    /// while it waited for one (LeaseLost), or an operator paused it meanwhile (Suspended,
    /// nothing written).
    pub(crate) fn not_executed(run: &Run, fate: Fate) -> Self {
        Self::new(run, fate, Duration::ZERO)
    }
}

/// What a run's model calls used and cost in one invocation (per run in [`RunReport`], summed
/// over the runs in [`InvocationSummary`]; `docs/agents.md`, "What a run costs").
///
/// **Recorded** figures come from the engine's step records as this worker wrote them to the
/// API (`PUT /steps/{id}`: the usage and cost the provider returned for a step that ended):
/// exact as far as the provider's answer and its price table are. **Estimated** figures are for
/// model calls cut at the cutoff, which return no usage and which the engine charges to no step:
/// their input tokens are estimated from the request this worker sent, at
/// [`CHARS_PER_TOKEN`] characters a token (rounded up); their output tokens are unknown (at
/// most the model's output limit) and not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spend {
    /// Input tokens the provider reported for the steps that ended (prompt cache reads and
    /// writes not included).
    pub input_tokens: u64,
    /// Output tokens the provider reported for the steps that ended.
    pub output_tokens: u64,
    /// What those steps cost, in US dollars, as the provider priced them (a model without a
    /// price counts 0).
    pub cost_usd: f64,
    /// Steps still running when the run was handed back at the cutoff (their work is done
    /// again by the next invocation).
    pub steps_cut: u32,
    /// Model calls in flight when the run's execution stopped (cut at the cutoff, or by a
    /// handback): sent, maybe billed, never answered here.
    pub calls_cut: u32,
    /// Their input tokens, **estimated** from the request size (see above): not part of
    /// `input_tokens`, nor of the run's cost cap.
    pub estimated_input_tokens: u64,
}

/// The characters a token is estimated at for a cut model call's input (4, the usual rule of
/// thumb for English text with Claude and Nova tokenizers; code and other languages take more
/// tokens per character).
pub const CHARS_PER_TOKEN: u64 = 4;

impl std::ops::AddAssign for Spend {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_usd += other.cost_usd;
        self.steps_cut = self.steps_cut.saturating_add(other.steps_cut);
        self.calls_cut = self.calls_cut.saturating_add(other.calls_cut);
        self.estimated_input_tokens = self
            .estimated_input_tokens
            .saturating_add(other.estimated_input_tokens);
    }
}

/// What one invocation is asked to do (from the trigger event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchRequest {
    /// Claim at most this many runs instead of the configured N (never more than N).
    pub max_runs: Option<usize>,
    /// Sleeping runs a timer wake-up asked this invocation to look at after its batch
    /// ([`SleepWatch`]); empty for every other trigger.
    pub watch: Vec<SleepWatch>,
}

/// Sleeping runs a timer wake-up watches until the ironflow API's waker has made them Pending
/// (docs/push.md, "Timer wake-ups"), from the wake-up body's `sleeping` (at most 100 run ids)
/// and `watch_until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SleepWatch {
    /// The runs.
    pub runs: Vec<Uuid>,
    /// When to stop looking: the API's waker should have woken them by then; past it they are
    /// left to the schedule.
    pub until: DateTime<Utc>,
}

/// Why the claim loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// N runs were claimed.
    MaxRuns,
    /// The API had no pending run this worker can take.
    NoPendingRun,
    /// Less than the minimum claim budget was left before the cutoff.
    Cutoff,
    /// A claim failed (API unreachable, auth refused...): see `errors`.
    ClaimError,
    /// The process is retiring (an execution stuck in workflow code, see
    /// `crate::layers::ExitWhenStuck`) and ends once no invocation is in flight: nothing was
    /// claimed, or a claimed run was released because its stuck execution still holds it here.
    Retiring,
}

impl StopReason {
    /// Whether a batch that claimed nothing and stopped for this reason could not run (a claim
    /// failed, no time was left, the process is retiring): an SQS trigger's records go back to
    /// the queue for a retry, and the wake-ups they carried are not sent again.
    pub(crate) fn could_not_run(self) -> bool {
        matches!(self, Self::ClaimError | Self::Cutoff | Self::Retiring)
    }

    /// The name in the summary and in log lines: `max_runs`, `no_pending_run`, `cutoff`,
    /// `claim_error` or `retiring`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxRuns => "max_runs",
            Self::NoPendingRun => "no_pending_run",
            Self::Cutoff => "cutoff",
            Self::ClaimError => "claim_error",
            Self::Retiring => "retiring",
        }
    }
}

/// When a run this invocation left Retrying or Sleeping becomes claimable again (a retry's
/// backoff, a sleep's wake time or a signal's deadline), as its last write said; in the
/// summary as `due`, and what timer wake-ups are booked for (docs/push.md, "Timer wake-ups").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Due {
    /// Retrying (claimable once `at` has passed) or Sleeping (the API's own waker makes it
    /// Pending after `at`).
    pub status: RunStatus,
    /// The run's `scheduled_at`.
    pub at: DateTime<Utc>,
}

/// The invocation's JSON summary, returned to direct and scheduled invocations and logged.
#[derive(Debug, Clone, Serialize)]
pub struct InvocationSummary {
    /// Lambda's request id (`Context.request_id`).
    pub request_id: String,
    /// The worker id this invocation claimed under.
    pub worker_id: String,
    /// Claims that brought a run (a run handed back and claimed again by the same invocation
    /// counts twice).
    pub claimed: usize,
    /// Reports per outcome.
    pub outcomes: BTreeMap<Outcome, usize>,
    /// One report per claim, in claim order; a run claimed twice has two, in the order the two
    /// ended.
    pub runs: Vec<RunReport>,
    /// Why the claim loop stopped.
    pub stop_reason: StopReason,
    /// Errors that concern the batch rather than one run (claim failures).
    pub errors: Vec<String>,
    /// What the runs' model calls used and cost in this invocation, summed over `runs` (each
    /// run's own in its entry), as its fields: `input_tokens`, `output_tokens`, `cost_usd`,
    /// `steps_cut`, `calls_cut`, `estimated_input_tokens`.
    #[serde(flatten)]
    pub spend: Spend,
    /// Infrastructure faults the invocation's calls met, the executions' included, per route
    /// and kind (each attempt that met one counts; most were retried and overcome). Never a
    /// workflow failure: see `docs/faults.md`.
    pub api_errors: Vec<ApiErrorCount>,
    /// Claimed runs whose `lease_recoveries` showed the API's reaper had taken them back from
    /// an invocation since this function last saw them (an invocation that died, or an outage
    /// longer than the lease TTL); each counts as a failure of its workflow.
    pub lease_recoveries: u32,
    /// Time left before the invocation deadline at exit, in milliseconds.
    pub time_left_ms: u64,
    /// Processes left behind by runs and killed, at each run's end (those its steps started,
    /// detached ones included) or by the invocation's last sweep.
    pub orphans_killed: usize,
    /// Step log lines forwarded to the API (and lost).
    pub logs: FlushReport,
    /// Whether the heartbeat ping succeeded; absent without `IRONFLOW_HEARTBEAT_URL` or when
    /// the batch did not complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<bool>,
    /// Poison-pill table calls that failed in this invocation; each failed open (the run
    /// executed, the failure was not counted).
    pub poison_table_errors: u32,
    /// The wake-ups sent after the batch; absent without a wake queue (`IRONFLOW_WAKE_QUEUE_URL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_ups: Option<WakeReport>,
}

impl InvocationSummary {
    /// Runs that ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(&outcome).copied().unwrap_or(0)
    }
}

/// An API route as the store reaches it, relative to `/api/v1/internal` (`"GET /runs/{id}"`):
/// the name faults are counted under in the summary and the `ApiErrors` metric.
pub type Route = &'static str;

/// What kind of infrastructure fault a call met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// No connection could be made (refused, unresolvable, TLS handshake failed): the request
    /// was never sent, so any call may be sent again.
    Connect,
    /// The request went out, but the connection failed before a complete answer came back
    /// (reset, closed, a truncated body): the API may have applied it.
    Transport,
    /// No answer within our own bound (the time left, the lease's validity or the per-attempt
    /// limit): the API accepts connections but does not answer in time.
    Timeout,
    /// The API, or a proxy in front of it, answered with a server error (a 5xx, or a body that
    /// is not the API's error envelope).
    Server,
    /// The API refused the worker token (401 or 403).
    Unauthorized,
    /// The API asked the worker to slow down (429 `RATE_LIMIT_EXCEEDED`).
    Throttled,
}

impl FaultKind {
    /// The name in the summary and the metric's `kind` dimension: `connect`, `transport`,
    /// `timeout`, `server`, `unauthorized` or `throttled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Transport => "transport",
            Self::Timeout => "timeout",
            Self::Server => "server",
            Self::Unauthorized => "unauthorized",
            Self::Throttled => "throttled",
        }
    }
}

/// How many faults of one kind one route met in an invocation (an entry of the summary's
/// `api_errors`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiErrorCount {
    /// The route, relative to `/api/v1/internal` (`"PUT /runs/{id}"`).
    pub route: Route,
    /// The kind of fault.
    pub kind: FaultKind,
    /// How many calls (attempts) met it.
    pub count: u32,
}

impl fmt::Display for ApiErrorCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} × {}", self.route, self.kind.as_str(), self.count)
    }
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FlushReport {
    /// Lines the API accepted.
    pub sent: usize,
    /// Lines lost: the API refused them or could not be reached before the deadline.
    pub dropped: usize,
    /// Calls that failed.
    pub failed_calls: usize,
}

impl std::ops::AddAssign for FlushReport {
    fn add_assign(&mut self, other: Self) {
        self.sent += other.sent;
        self.dropped += other.dropped;
        self.failed_calls += other.failed_calls;
    }
}

/// Why wake-ups were considered after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WakeTrigger {
    /// The batch handed runs back: they wait for the next invocation.
    HandedBack,
    /// The batch took all the runs it was asked for: more may be waiting.
    Backlog,
    /// The ironflow API's webhook said runs are or will be Pending (`docs/push.md`).
    Pushed,
    /// A run the batch left waiting is due ([`RunReport::due`]), or a sleeping run a timer
    /// wake-up watched was found Pending ([`SleepWatch`]).
    Due,
}

impl WakeTrigger {
    /// The name in the summary and in log lines: `handed_back`, `backlog`, `pushed` or `due`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HandedBack => "handed_back",
            Self::Backlog => "backlog",
            Self::Pushed => "pushed",
            Self::Due => "due",
        }
    }
}

/// What the wake-up phase did, in the invocation summary (`wake_ups`, present when
/// `IRONFLOW_WAKE_QUEUE_URL` is set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WakeReport {
    /// Why wake-ups were considered; `null` when the batch neither handed back nor filled and
    /// found no watched run Pending.
    pub trigger: Option<WakeTrigger>,
    /// Pending runs this worker can take, counted by the API after the batch; `null` when not
    /// asked or the count failed.
    pub pending_runs: Option<u64>,
    /// Wake-ups already waiting and visible on the queue (delayed ones are not counted); `null`
    /// when not asked or the queue attributes could not be read.
    pub queued: Option<u64>,
    /// Wake-up messages SQS accepted.
    pub sent: usize,
    /// Their `DelaySeconds`.
    pub delay_secs: u64,
    /// A webhook decision's tail wake-up: the shared mark's wake-ups covered the backlog, and
    /// this decision booked the one tail on its way fleet-wide, delayed (`delay_secs`) to
    /// their window's end (`docs/push.md#coalescing`); `sent` counts it. Present only when
    /// `true`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tail: bool,
    /// What went wrong (logged too); never fails the batch.
    pub errors: Vec<String>,
    /// Timer wake-ups booked for runs the batch left due later ([`RunReport::due`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timers: Vec<TimerWake>,
    /// What the look at the sleeping runs of a timer wake-up found ([`SleepWatch`]); absent
    /// for other triggers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watched: Option<WatchReport>,
}

/// The sleeping runs a timer wake-up watched, as read after the batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WatchReport {
    /// Runs read.
    pub runs: usize,
    /// Found Pending (woken by the API's waker since): a claim was asked for them.
    pub woken: usize,
    /// Still Sleeping past their wake time (or not read in time): looked at again a second
    /// later, unless counted in `gave_up` or `unbooked`.
    pub still_sleeping: usize,
    /// Of those, the runs past their watch's end, left to the schedule: the API's waker is late
    /// or not running. In the summary only when not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub gave_up: usize,
    /// Of those, the runs whose next look found no wake-up left under
    /// `IRONFLOW_MAX_WAKEUPS_PER_INVOCATION`, left to the schedule. In the summary only when
    /// not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub unbooked: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Wake-ups booked for runs due at about the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TimerWake {
    /// Their `DelaySeconds`.
    pub delay_secs: u64,
    /// Messages the queue accepted.
    pub sent: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shows_the_execution_time_as_whole_milliseconds_and_flags_only_when_set() {
        let mut report = RunReport {
            run_id: Uuid::nil(),
            workflow: "wf".into(),
            outcome: Outcome::Completed,
            executed: Duration::from_micros(1_999),
            error: None,
            left_to_reaper: false,
            stuck: false,
            due: None,
            spend: Spend::default(),
            retry_count: 0,
            lease_recoveries: 0,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["duration_ms"], 1);
        assert!(json.get("executed").is_none() && json.get("retry_count").is_none());
        assert!(json.get("stuck").is_none() && json.get("left_to_reaper").is_none());
        report.stuck = true;
        report.left_to_reaper = true;
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["stuck"], true);
        assert_eq!(json["left_to_reaper"], true);
    }

    #[test]
    fn stop_reason_names_in_log_lines_match_the_summary_json() {
        for reason in [
            StopReason::MaxRuns,
            StopReason::NoPendingRun,
            StopReason::Cutoff,
            StopReason::ClaimError,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
    }
}
