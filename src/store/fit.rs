//! Cutoff-aware starts for one execution: whether the step the engine is about to create fits
//! in the time left before the cutoff, or the run is better handed back so that the next
//! invocation starts it with a full budget (docs/design.md, "Cutoff-aware starts").
//!
//! A step's **expected duration** is the longest of: what this process saw it take
//! ([`StepTimes`]), its earlier completions in the run's own step history (each carries its
//! `duration_ms`), and, as a lower bound, how long an interrupted attempt of it ran (from its
//! `started_at` to its interruption); the default (`IRONFLOW_DEFAULT_STEP_SECS`) when none of
//! those exists.
//!
//! The step is **deferred** when it does not fit in the time left, yet would in the next
//! invocation: `left < expected <= left + gain`, where `gain` is what a handback gives back
//! to the step, the time this invocation spent before the execution started (a late claim, a
//! wait for a slot) and in steps that completed in it (the next invocation replays them from
//! the store). What the execution spent otherwise (replaying earlier steps, workflow code
//! between steps) recurs in the next invocation, so it is no gain. A step that reaches its
//! start with no gain, as in a fresh invocation that completed nothing before it, is never
//! deferred: the next invocation could give it no more time; it starts, is cut at the cutoff
//! and the loop guard takes over (`crate::handback`).
//!
//! The gate never answers the engine with an error: `ironflow-engine` 4.1.1 propagates a store
//! error from `create_step` as the run's failure, for good. It stops the execution's scope
//! instead ([`super::scope::ScopeStop::Deferred`]), before any request, and the supervisor
//! hands the run back (`crate::execution`), as it does after an API fault.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironflow_store::entities::{Step, StepKind, StepStatus, StepUpdate};
use ironflow_store::store::STEP_INTERRUPTED_ERROR;
use tokio::time::Instant;
use uuid::Uuid;

use crate::step_times::StepTimes;

/// A step that would not fit before the cutoff: the run is handed back before it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    /// The step's name.
    pub step: String,
    /// Its expected duration.
    pub expected: Duration,
    /// The time that was left before the cutoff.
    pub left: Duration,
}

impl std::fmt::Display for Deferral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step '{}' deferred: expected to take {} ms, {} ms left before the cutoff",
            self.step,
            self.expected.as_millis(),
            self.left.as_millis()
        )
    }
}

/// Whether a step of `kind` works in the invocation, and so is judged and learned: a shell,
/// HTTP, agent, decision or custom operation step. Not a wait (a timer, a signal, an approval,
/// a human's input, a sub-workflow: the run sleeps, holding no invocation), a skip or a signal
/// sent (instant), nor an error handler (the failure it handles is recorded: deferring it
/// would replay the failed step).
pub fn works(kind: &StepKind, is_error_handler: bool) -> bool {
    let works = match kind {
        StepKind::Shell | StepKind::Http | StepKind::Agent | StepKind::Decision => true,
        StepKind::Custom(op) => op != "delay" && op != "skip",
        _ => false,
    };
    works && !is_error_handler
}

/// The least a handback must give back to a step for it to be deferred: 1 s. Less is the
/// jitter of a claim's round trip and an invocation's start, which the next invocation pays
/// again: a step deferred for it could be deferred by every invocation.
pub const MIN_GAIN: Duration = Duration::from_secs(1);

/// The rule (see the module docs): `Some` when a step `name` expected to take `expected`
/// does not fit in `left` but would with `gain` more, and `gain` is at least [`MIN_GAIN`].
pub fn deferral(
    name: &str,
    expected: Duration,
    left: Duration,
    gain: Duration,
) -> Option<Deferral> {
    let fits_later = expected <= left.saturating_add(gain) && gain >= MIN_GAIN;
    (left < expected && fits_later).then(|| Deferral {
        step: name.to_string(),
        expected,
        left,
    })
}

/// The cutoff-aware start rule of one execution (see the module docs).
#[derive(Debug)]
pub struct StartFit {
    workflow: String,
    times: Arc<StepTimes>,
    default: Duration,
    /// The time the invocation spent before this execution started.
    started_late: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Steps created by this execution: name, position, when created.
    created: HashMap<Uuid, (String, u32, Instant)>,
    /// Time spent in steps that completed in this execution (overlaps counted once).
    completed: Duration,
    /// Until when `completed` covers.
    covered_until: Option<Instant>,
    /// Per step name, from the run's step history: its longest completion, and its longest
    /// interrupted attempt.
    history: HashMap<String, (Option<Duration>, Duration)>,
}

impl StartFit {
    /// The rule for an execution of `workflow`, started `started_late` after its invocation,
    /// learning from and adding to `times`; `default`: the expectation of a step never seen.
    pub fn new(
        workflow: &str,
        times: Arc<StepTimes>,
        default: Duration,
        started_late: Duration,
    ) -> Self {
        Self {
            workflow: workflow.to_string(),
            times,
            default,
            started_late,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is a few inserts and additions: a panic cannot leave it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The run's steps as listed by the engine (its replay's history).
    pub fn read_history(&self, steps: &[Step]) {
        let mut state = self.state();
        for step in steps {
            let interrupted = step.status.state == StepStatus::Failed
                && step.error.as_deref() == Some(STEP_INTERRUPTED_ERROR);
            let entry = state.history.entry(step.name.clone()).or_default();
            if step.status.state == StepStatus::Completed && step.duration_ms > 0 {
                let took = Duration::from_millis(step.duration_ms);
                entry.0 = entry.0.max(Some(took));
            } else if interrupted
                && let (Some(start), Some(end)) = (step.started_at, step.completed_at)
            {
                let ran = (end - start).to_std().unwrap_or_default();
                entry.1 = entry.1.max(ran);
            }
        }
    }

    /// The expected duration of step `name` (see the module docs).
    pub fn expected(&self, name: &str) -> Duration {
        let (completed, interrupted) = self.state().history.get(name).copied().unwrap_or_default();
        let seen = self.times.expected(&self.workflow, name);
        let learned = seen.max(completed).unwrap_or(self.default);
        learned.max(interrupted)
    }

    /// `Some` when step `name` must not start with `left` before the cutoff.
    pub fn defer(&self, name: &str, left: Duration) -> Option<Deferral> {
        let gain = self.started_late.saturating_add(self.state().completed);
        deferral(name, self.expected(name), left, gain)
    }

    /// This execution created `step`.
    pub fn created(&self, step: &Step) {
        if !works(&step.kind, step.is_error_handler) {
            return;
        }
        let entry = (step.name.clone(), step.position, Instant::now());
        self.state().created.insert(step.id, entry);
    }

    /// A write of step `id` by this execution: a completion is learned and counted.
    pub fn updated(&self, id: Uuid, update: &StepUpdate) {
        if update.status != Some(StepStatus::Completed) {
            return;
        }
        let now = Instant::now();
        let mut state = self.state();
        let Some((name, position, created)) = state.created.remove(&id) else {
            return;
        };
        let took = update.duration_ms.map_or_else(
            || now.saturating_duration_since(created),
            Duration::from_millis,
        );
        let from = state.covered_until.map_or(created, |c| c.max(created));
        state.completed = state
            .completed
            .saturating_add(now.saturating_duration_since(from));
        state.covered_until = Some(now);
        drop(state);
        self.times.saw(&self.workflow, &name, position, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_step_is_deferred_only_when_a_handback_gives_it_the_time_it_lacks() {
        let times = Arc::new(StepTimes::default());
        let fit = StartFit::new("w", times.clone(), S(10), Duration::ZERO);
        assert_eq!(fit.expected("s"), S(10), "the default");
        assert_eq!(
            fit.defer("s", S(5)),
            None,
            "no gain: it could never fit better"
        );
        let late = StartFit::new("w", times.clone(), S(10), S(6));
        let d = late
            .defer("s", S(5))
            .expect("5 s left + 6 s gained fit 10 s");
        assert_eq!((d.expected, d.left), (S(10), S(5)));
        assert_eq!(late.defer("s", S(10)), None, "it fits");
        assert_eq!(late.defer("s", S(3)), None, "3 + 6 < 10: it can never fit");

        times.saw("w", "s", 1, S(2));
        assert_eq!(fit.expected("s"), S(2), "learned: no longer the default");
    }

    /// A step `name` in `status`, of `ms`, started at 0 s and ended at `end` s.
    fn step(name: &str, status: &str, ms: u64, end: i64) -> Step {
        let t = |s: i64| chrono::DateTime::from_timestamp(1_700_000_000 + s, 0);
        let mut step = serde_json::json!({
            "id": Uuid::new_v4(), "trace_id": Uuid::new_v4(), "run_id": Uuid::nil(),
            "name": name, "kind": "shell", "position": 0,
            "status": {"state": status, "state_machine_id": Uuid::nil()}, "attempt": 1,
            "duration_ms": ms, "cost_usd": "0", "created_at": t(0), "updated_at": t(0),
            "started_at": t(0), "completed_at": t(end), "is_error_handler": false,
        });
        if status == "failed" {
            step["error"] = serde_json::json!(STEP_INTERRUPTED_ERROR);
        }
        serde_json::from_value(step).unwrap_or_else(|e| panic!("a step: {e}"))
    }

    #[test]
    fn the_run_s_history_tells_earlier_completions_and_interrupted_attempts_as_lower_bounds() {
        let times = Arc::new(StepTimes::default());
        times.saw("w", "a", 0, S(1));
        let fit = StartFit::new("w", times, S(10), Duration::ZERO);
        fit.read_history(&[
            step("a", "completed", 3_000, 3),
            step("b", "failed", 0, 40),
            step("c", "completed", 2_000, 2),
        ]);
        assert_eq!(
            fit.expected("a"),
            S(3),
            "the longest of the process's and the run's"
        );
        assert_eq!(fit.expected("b"), S(40), "ran 40 s before its interruption");
        assert_eq!(
            fit.expected("c"),
            S(2),
            "the run's completion, not the default"
        );
        assert!(!works(&StepKind::Custom("delay".into()), false));
        assert!(!works(&StepKind::Shell, true), "an error handler");
        assert!(works(&StepKind::Custom("charge".into()), false));
    }
}
